// How a recovery finds out which members of the failed epoch are still
// there and waits for seats (docs/fault-tolerance.md, "Automatic recovery",
// steps 2 and 3): each member is asked GetStatus, in parallel, waiting for a
// draining one's verdict (drain_wait.h); one that did not answer and
// heartbeats again before the recovery has chosen its seats is asked once
// more.
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

#include "coordinator/drain_wait.h"
#include "coordinator/recovery_plan.h"
#include "coordinator/training_job.h"
#include "coordinator/worker_fan_out.h"
#include "core/status_macros.h"

namespace flatshard {

std::vector<int> TrainingJob::ProbeMembers(
    std::vector<WorkerRecord>* alive,
    std::map<std::string, std::vector<v1::PeerSnapshotHeld>>* held) {
  std::vector<std::shared_ptr<WorkerClient>> owned;  // by rank
  std::vector<WorkerClient*> clients;
  std::vector<WorkerRecord> members;
  {
    std::lock_guard<std::mutex> lock(mu_);
    owned = clients_;
    members = members_;
  }
  clients.reserve(owned.size());
  for (const auto& client : owned) clients.push_back(client.get());
  // A member that did not answer is given up: its client is disconnected,
  // for its channel would redial the address until it idles (up to a minute
  // at scale) while the re-formation's Gloo pairs bind their listeners, and
  // the kernel of the dead worker's host may hand one of them its port
  // (grpc_worker_client.h). A new client, which dials nothing before its
  // first call, takes its place: a later try of this recovery probes the
  // member again (one lost only to a slow probe may answer then).
  std::vector<bool> given_up(clients.size(), false);
  const auto give_up = [&](size_t r) {
    if (given_up[r]) return;
    given_up[r] = true;
    owned[r]->Disconnect();
    if (!options_.connect || r >= members.size()) return;
    std::shared_ptr<WorkerClient> fresh = options_.connect(members[r], clients.size());
    std::lock_guard<std::mutex> lock(mu_);
    if (r < clients_.size() && clients_[r] == owned[r]) clients_[r].swap(fresh);
  };  // `fresh` (the old client, when swapped) goes outside the lock
  // All at once (worker_fan_out.h): a stopped (SIGSTOP) worker costs one
  // probe timeout, not one per rank.
  std::vector<absl::StatusOr<v1::GetStatusResponse>> answers =
      GetStatusAll(clients, absl::Now() + FanOutTimeout(options_.probe_timeout, clients.size()));
  // Before the drain waits below, which may last a worker's abort grace.
  for (size_t r = 0; r < clients.size(); ++r) {
    if (!answers[r].ok()) give_up(r);
  }
  // A member whose aborted work has not let go yet (a write into a hung
  // mount) is not a survivor until it does: if it never does, it ends itself
  // at its abort grace, and a try that seated it would fail then and spend
  // a restart. So the probe waits for the verdict, bounded by that grace;
  // only such members get a thread, to poll their own.
  std::vector<std::thread> drains;
  for (size_t r = 0; r < clients.size(); ++r) {
    if (!WaitsForDrain(answers[r])) continue;
    drains.emplace_back([&, r] {
      WorkerClient& client = *clients[r];
      answers[r] = AwaitDrained(
          std::move(answers[r]),
          [&] { return client.GetStatus(absl::Now() + options_.probe_timeout); },
          [this] {
            std::lock_guard<std::mutex> lock(mu_);
            return stopping_;
          },
          absl::StrCat("job ", config_.name, ": rank ", r, " (", client.address(), ")"));
    });
  }
  for (std::thread& t : drains) t.join();
  std::vector<int> failed;
  for (size_t r = 0; r < clients.size() && r < members.size(); ++r) {
    if (answers[r].ok()) {
      alive->push_back(members[r]);
      if (held != nullptr) {
        (*held)[members[r].worker_id].assign(answers[r]->peer_snapshots().begin(),
                                             answers[r]->peer_snapshots().end());
      }
    } else {
      failed.push_back(static_cast<int>(r));
      if (options_.mark_unreachable) options_.mark_unreachable(members[r]);
      give_up(r);  // one whose drain ended in its exit
    }
  }
  return failed;
}

std::vector<std::string> TrainingJob::ReadmitReturning(
    const std::vector<WorkerRecord>& live, absl::Time until, std::map<int, WorkerRecord>* lost,
    RecoveryCandidates* candidates,
    std::map<std::string, std::vector<v1::PeerSnapshotHeld>>* held) {
  const auto stopping = [this] {
    std::lock_guard<std::mutex> lock(mu_);
    return stopping_;
  };
  if (!options_.connect || absl::Now() >= until || stopping()) return {};
  struct Returning {
    int rank;
    WorkerRecord worker;  // as it heartbeats now
    std::unique_ptr<WorkerClient> client;
    absl::StatusOr<v1::GetStatusResponse> answer = absl::UnknownError("not asked");
  };
  std::vector<Returning> returning;
  const std::string device = SeatDevice(*candidates);
  for (const auto& [rank, member] : *lost) {
    const std::string& id = member.worker_id;  // clang 14 captures no binding
    const auto back = std::find_if(live.begin(), live.end(),
                                   [&id](const WorkerRecord& w) { return w.worker_id == id; });
    if (back == live.end() || RefusedToJoin(*back)) continue;
    // Restarted under its id with another device: not of this job's kind.
    if (!device.empty() && back->device != device) continue;
    // At the address it heartbeats from: a restarted daemon listens anew.
    returning.push_back(
        {rank, *back, options_.connect(*back, static_cast<size_t>(config_.world_size))});
  }
  if (returning.empty()) return {};
  // All at once, as ProbeMembers: the spare wait overruns `until` by one
  // probe at most, and a draining member's verdict is not awaited past it.
  std::vector<WorkerClient*> clients;
  clients.reserve(returning.size());
  for (const Returning& r : returning) clients.push_back(r.client.get());
  // Each returning worker's channel is new and connects first.
  std::vector<absl::StatusOr<v1::GetStatusResponse>> answers =
      GetStatusAll(clients, absl::Now() + FanOutTimeout(options_.probe_timeout, clients.size(),
                                                        FanOutChannels::kConnecting));
  DrainWaitOptions drain;  // what is left of the wait once every first answer is in
  drain.cap = std::clamp(until - absl::Now(), absl::ZeroDuration(), drain.cap);
  std::vector<std::thread> drains;
  for (size_t i = 0; i < returning.size(); ++i) {
    Returning& r = returning[i];
    r.answer = std::move(answers[i]);
    if (!WaitsForDrain(r.answer)) continue;
    drains.emplace_back([&, p = &r] {
      WorkerClient& client = *p->client;
      p->answer = AwaitDrained(
          std::move(p->answer),
          [&] { return client.GetStatus(absl::Now() + options_.probe_timeout); }, stopping,
          absl::StrCat("job ", config_.name, ": rank ", p->rank, " (", p->worker.address,
                       "), heartbeating again"),
          drain);
    });
  }
  for (std::thread& t : drains) t.join();
  std::vector<std::string> readmitted;
  for (Returning& r : returning) {
    if (!r.answer.ok()) {
      // Asked again only after its next heartbeat, not at every poll.
      if (options_.mark_unreachable) options_.mark_unreachable(r.worker);
      continue;
    }
    spdlog::info("job {}: rank {} ({}) heartbeats again and answers: it survives after all",
                 config_.name, r.rank, r.worker.address);
    if (held != nullptr) {
      (*held)[r.worker.worker_id].assign(r.answer->peer_snapshots().begin(),
                                         r.answer->peer_snapshots().end());
    }
    candidates->survivors.push_back(r.worker);
    readmitted.push_back(r.worker.worker_id);
    lost->erase(r.rank);
  }
  if (readmitted.empty()) return readmitted;
  // Survivors keep the failed epoch's order (recovery_plan.h).
  std::vector<std::string> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ids = worker_ids_;
  }
  const auto rank_of = [&ids](const WorkerRecord& w) {
    return std::find(ids.begin(), ids.end(), w.worker_id) - ids.begin();
  };
  std::stable_sort(
      candidates->survivors.begin(), candidates->survivors.end(),
      [&](const WorkerRecord& a, const WorkerRecord& b) { return rank_of(a) < rank_of(b); });
  return readmitted;
}

void TrainingJob::ForgetGoneSurvivors(const std::vector<WorkerRecord>& live,
                                      std::map<int, WorkerRecord>* lost,
                                      RecoveryCandidates* candidates) {
  std::vector<std::string> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ids = worker_ids_;
  }
  std::erase_if(candidates->survivors, [&](const WorkerRecord& s) {
    const std::string& id = s.worker_id;
    const auto now = std::find_if(live.begin(), live.end(),
                                  [&id](const WorkerRecord& w) { return w.worker_id == id; });
    // Records restored from the state dir carry no incarnation.
    const bool same_process =
        now != live.end() && now->address == s.address &&
        (now->incarnation.empty() || s.incarnation.empty() || now->incarnation == s.incarnation);
    if (same_process) return false;
    const auto rank = std::find(ids.begin(), ids.end(), id);
    if (rank == ids.end()) return false;  // not of the failed epoch: cannot be
    spdlog::warn("job {}: rank {} ({}) is gone since the probe", config_.name, rank - ids.begin(),
                 s.address);
    (*lost)[static_cast<int>(rank - ids.begin())] = s;
    return true;
  });
}

absl::Status TrainingJob::AwaitSeats(absl::Time began, const std::set<std::string>& old_ids,
                                     std::map<int, WorkerRecord>* lost,
                                     RecoveryCandidates* candidates,
                                     std::map<std::string, std::vector<v1::PeerSnapshotHeld>>* held,
                                     std::set<std::string>* readmitted) {
  const RecoverySettings& policy = config_.recovery;
  const absl::Duration spare_wait = absl::Seconds(policy.spare_wait_s);
  const absl::Time spare_deadline = began + spare_wait;
  // Too few to re-form at all is rarely for good: a whole node reboots, the
  // coordinator's own link flaps. Failing then would throw away a job that
  // every member could take up again minutes later, as torchelastic's
  // rendezvous waits for its minimum.
  const absl::Time quorum_deadline =
      began + std::max(spare_wait, absl::Seconds(policy.min_world_wait_s));
  v1::JobSpec spec;
  {
    std::lock_guard<std::mutex> lock(mu_);
    spec = spec_;
  }
  const auto stopping = [this] {
    std::lock_guard<std::mutex> lock(mu_);
    return stopping_;
  };
  // Whether ChooseRecovery finds a world size depends on the count alone
  // (spares of another device are not counted, by its rule: SeatDevice), so
  // it is asked once a count.
  std::optional<std::pair<size_t, bool>> can_form;
  bool announced = false;  // waiting for the minimum, and said so
  // Once enough to re-form are back after a wait for the minimum, the rest
  // (a rebooted node's other daemons, seconds behind) get a spare wait too,
  // as in torchelastic's last call, rather than a shrink and a grow-back.
  std::optional<absl::Time> last_call;
  while (true) {
    // The end of the phase the wait is in: no probe starts past it.
    const absl::Time until =
        last_call.has_value() ? *last_call : (announced ? quorum_deadline : spare_deadline);
    candidates->spares.clear();
    if (options_.live_workers) {
      const std::vector<WorkerRecord> live = options_.live_workers();
      // A survivor gone since the probe (died, or restarted under its id at
      // a new address) would fail the new epoch's Configure and spend a
      // restart: lost again, readmitted only if it answers a probe of its own.
      if (announced) ForgetGoneSurvivors(live, lost, candidates);
      for (std::string& id : ReadmitReturning(live, until, lost, candidates, held)) {
        readmitted->insert(std::move(id));
      }
      const std::string device = SeatDevice(*candidates);
      for (const WorkerRecord& w : live) {
        const bool same_kind = device.empty() || w.device == device;
        if (!old_ids.contains(w.worker_id) && !RefusedToJoin(w) && same_kind) {
          candidates->spares.push_back(w);
        }
      }
    }
    if (stopping()) return absl::CancelledError("the job is being stopped");
    const size_t have = candidates->survivors.size() + candidates->spares.size();
    if (have >= static_cast<size_t>(config_.world_size)) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (now >= spare_deadline) {
      if (!can_form.has_value() || can_form->first != have) {
        can_form = {have, ChooseRecovery(spec, policy, *candidates).ok()};
      }
      if (!can_form->second) {
        last_call.reset();                                    // some left again
        if (now >= quorum_deadline) return absl::OkStatus();  // ChooseRecovery says why not
        if (!announced) {
          announced = true;
          const std::string waiting = absl::StrCat(
              "cannot re-form on the ", have, " live worker(s) (world size ", config_.world_size,
              ", recovery.min_world_size ", policy.min_world_size, "): waiting up to ",
              absl::FormatDuration(absl::Trunc(quorum_deadline - now, absl::Seconds(1))),
              " more for workers to come back (recovery.min_world_wait_s)");
          spdlog::warn("job {}: {}", config_.name, waiting);
          RETURN_IF_ERROR(states_.Transition(v1::RECOVERING, waiting));
        }
      } else if (!announced) {
        return absl::OkStatus();  // enough when the spare wait ended: it shrinks
      } else {
        if (!last_call.has_value()) {
          last_call = now + spare_wait;
          spdlog::info(
              "job {}: {} worker(s) back, enough to re-form; waiting up to {} for the rest",
              config_.name, have, absl::FormatDuration(spare_wait));
        }
        if (now >= *last_call) return absl::OkStatus();
      }
    }
    // Polls the membership: 50 ms against a heartbeat interval of a second.
    absl::SleepFor(absl::Milliseconds(50));
  }
}

}  // namespace flatshard

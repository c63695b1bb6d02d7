// How a recovery finds out which members of the failed epoch are still
// there (docs/fault-tolerance.md, "Automatic recovery", steps 2 and 3): each
// is asked GetStatus, in parallel, waiting for a draining one's verdict
// (drain_wait.h); one that did not answer and heartbeats again before the
// recovery has chosen its seats is asked once more.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

#include "coordinator/drain_wait.h"
#include "coordinator/recovery_plan.h"
#include "coordinator/training_job.h"

namespace flatshard {

std::vector<int> TrainingJob::ProbeMembers(
    std::vector<WorkerRecord>* alive,
    std::map<std::string, std::vector<v1::PeerSnapshotHeld>>* held) {
  std::vector<WorkerClient*> clients;
  std::vector<WorkerRecord> members;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& client : clients_) clients.push_back(client.get());
    members = members_;
  }
  // In parallel: a stopped (SIGSTOP) worker costs one probe timeout, not one per rank.
  std::vector<absl::StatusOr<v1::GetStatusResponse>> answers(clients.size());
  std::vector<std::thread> probes;
  probes.reserve(clients.size());
  const absl::Time deadline = absl::Now() + options_.probe_timeout;
  // A member whose aborted work has not let go yet (a write into a hung
  // mount) is not a survivor until it does: if it never does, it ends itself
  // at its abort grace, and a try that seated it would fail then and spend
  // a restart. So the probe waits for the verdict, bounded by that grace.
  for (size_t r = 0; r < clients.size(); ++r) {
    probes.emplace_back([&, r] {
      WorkerClient& client = *clients[r];
      answers[r] = AwaitDrained(
          client.GetStatus(deadline),
          [&] { return client.GetStatus(absl::Now() + options_.probe_timeout); },
          [this] {
            std::lock_guard<std::mutex> lock(mu_);
            return stopping_;
          },
          absl::StrCat("job ", config_.name, ": rank ", r, " (", client.address(), ")"));
    });
  }
  for (std::thread& t : probes) t.join();
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
  for (const auto& [rank, member] : *lost) {
    const std::string& id = member.worker_id;  // clang 14 captures no binding
    const auto back = std::find_if(live.begin(), live.end(),
                                   [&id](const WorkerRecord& w) { return w.worker_id == id; });
    if (back == live.end() || RefusedToJoin(*back)) continue;
    // Restarted under its id with another device: not of this job's kind.
    if (!candidates->device.empty() && back->device != candidates->device) continue;
    // At the address it heartbeats from: a restarted daemon listens anew.
    returning.push_back({rank, *back, options_.connect(*back)});
  }
  if (returning.empty()) return {};
  // In parallel, as ProbeMembers: the spare wait overruns `until` by one
  // probe at most, and a draining member's verdict is not awaited past it.
  DrainWaitOptions drain;
  drain.cap = std::max(until - absl::Now(), absl::ZeroDuration());
  std::vector<std::thread> probes;
  probes.reserve(returning.size());
  for (Returning& r : returning) {
    probes.emplace_back([&] {
      WorkerClient& client = *r.client;
      r.answer = AwaitDrained(
          client.GetStatus(absl::Now() + options_.probe_timeout),
          [&] { return client.GetStatus(absl::Now() + options_.probe_timeout); }, stopping,
          absl::StrCat("job ", config_.name, ": rank ", r.rank, " (", r.worker.address,
                       "), heartbeating again"),
          drain);
    });
  }
  for (std::thread& t : probes) t.join();
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

}  // namespace flatshard

// TrainingJob's formation (docs/architecture.md): an epoch of its members,
// each one configured with the job, its rank and the epoch's rendezvous, and
// the sequencer the epoch's batches go through. A worker that stops
// heartbeating while the job forms fails the formation at once rather than
// at its Configure deadline.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

#include "coordinator/training_job.h"
#include "coordinator/worker_fan_out.h"
#include "core/status_macros.h"
#include "core/status_payloads.h"

namespace flatshard {

absl::Status CheckOneDeviceKind(const std::vector<WorkerRecord>& members) {
  std::map<std::string, std::vector<std::string>> by_kind;
  for (const WorkerRecord& m : members) by_kind[m.device].push_back(m.worker_id);
  if (by_kind.size() <= 1) return absl::OkStatus();
  std::vector<std::string> parts;
  parts.reserve(by_kind.size());
  for (const auto& [kind, ids] : by_kind) {
    parts.push_back(absl::StrCat(kind, ": ", absl::StrJoin(ids, ", ")));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("the job's workers mix device kinds (", absl::StrJoin(parts, "; "),
                   "); a job runs on one kind of device: stop the others or start workers with "
                   "the same --device"));
}

absl::Status TrainingJob::Form(const std::vector<WorkerRecord>& members) {
  OperationLock op(op_mu_);
  v1::JobSpec spec;
  {
    std::lock_guard<std::mutex> lock(mu_);
    NoteOperationLocked("form the job");
    spec = spec_;
  }
  if (absl::Status formed = FormLocked(members, spec, std::make_shared<const JobConfig>(config_));
      !formed.ok()) {
    if (formed.code() != absl::StatusCode::kCancelled) FailWith(formed);
    return formed;
  }
  // The slot is free before anyone can see READY: a client that waited for
  // READY and sends its first operation at once must not find the job busy.
  op.unlock();
  return states_.Transition(v1::READY, absl::StrCat("epoch ", ToProto().epoch(), ": ",
                                                    members.size(), " workers configured"));
}

absl::Status TrainingJob::FormLocked(const std::vector<WorkerRecord>& members,
                                     const v1::JobSpec& spec,
                                     std::shared_ptr<const JobConfig> config,
                                     std::vector<std::string>* blamed) {
  if (static_cast<int>(members.size()) != config->world_size) {
    return absl::InternalError(
        absl::StrCat("forming with ", members.size(), " workers, need ", config->world_size));
  }
  {
    // Configure initializes the ranks' parameters from the seed. Before the
    // transition, whose record is written with it.
    std::lock_guard<std::mutex> lock(mu_);
    ++state_generation_;
    state_checkpoint_.clear();
  }
  RETURN_IF_ERROR(
      states_.Transition(v1::FORMING, absl::StrCat("configuring ", members.size(), " workers")));
  // One job, one kind of device: the ranks' collectives, kernels and
  // checkpoints assume the same memory and arithmetic everywhere.
  if (absl::Status kinds = CheckOneDeviceKind(members); !kinds.ok()) {
    (void)states_.Transition(v1::FAILED, std::string(kinds.message()));
    return kinds;
  }
  std::vector<std::shared_ptr<WorkerClient>> clients;
  std::vector<std::string> ids;
  for (const WorkerRecord& member : members) {
    clients.push_back(options_.connect(member, members.size()));
    ids.push_back(member.worker_id);
  }
  uint64_t epoch = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    epoch = ++epoch_;
  }
  v1::ConfigureRequest request;
  request.set_job(config_.name);
  request.set_job_epoch(epoch);
  request.set_world_size(config->world_size);
  *request.mutable_spec() = spec;
  for (const Unit& unit : units_) *request.add_units() = UnitToProto(unit);
  const std::string prefix = absl::StrCat("job/", config_.name, "/epoch/", epoch);
  request.set_store_prefix(prefix + "/");
  // Configure is a collective (the ranks rendezvous), so all at once.
  {
    // Stop (SIGTERM, delete) and the heartbeat monitor cancel these calls
    // rather than wait for the configure timeout.
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::CancelledError("the job was stopped before it was formed");
    forming_ = Formation{prefix, ids, clients, absl::Now(), absl::OkStatus(), -1};
  }
  std::vector<WorkerClient*> configured;
  std::vector<v1::ConfigureRequest> requests;
  configured.reserve(members.size());
  requests.reserve(members.size());
  for (size_t r = 0; r < members.size(); ++r) {
    configured.push_back(clients[r].get());
    requests.push_back(request);
    requests.back().set_rank(static_cast<int>(r));
  }
  // The others would wait for a failed rank until their rendezvous timeout:
  // its failure abandons the formation as it comes in. A call cancelled by
  // Stop or by another rank's failure comes after that cause and is ignored;
  // one cancelled first was cancelled by the worker (its server shutting
  // down), which is this rank's failure.
  (void)ConfigureAll(
      configured, std::move(requests), absl::Now() + options_.configure_timeout,
      [&](size_t r, const absl::Status& status) {
        // A peer it could not connect to is named for people too (the
        // payload, UnreachablePeer, is for the code).
        std::string peer_named;
        if (const std::optional<int> peer = UnreachablePeer(status);
            peer.has_value() && static_cast<size_t>(*peer) < members.size()) {
          const WorkerRecord& other = members[static_cast<size_t>(*peer)];
          peer_named = absl::StrCat(" (its peer rank ", *peer, " is worker ", other.worker_id,
                                    " at ", other.address, ")");
        }
        const std::string failed_prefix =
            absl::StrCat("rank ", r, " (worker ", members[r].worker_id, " at ", members[r].address,
                         ") could not be configured", peer_named, ": ");
        const absl::Status failure =
            status.code() == absl::StatusCode::kCancelled
                ? absl::UnavailableError(absl::StrCat(failed_prefix, status.message()))
                : PrefixStatus(failed_prefix, status);
        std::vector<std::shared_ptr<WorkerClient>> forming;
        {
          std::lock_guard<std::mutex> lock(mu_);
          forming = AbandonFormationLocked(static_cast<int>(r), failure);
        }
        CancelFormation(forming);
      },
      // Stop or a silent worker (FailFormingWorker) ended it meanwhile.
      [this] {
        std::lock_guard<std::mutex> lock(mu_);
        return !forming_.failure.ok();
      });
  Formation formed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    formed = std::exchange(forming_, Formation{});
    if (stopping_) return absl::CancelledError("the job was stopped while it was being formed");
  }
  if (!formed.failure.ok()) {
    if (formed.failed_rank < 0) return formed.failure;
    const WorkerRecord& failed = members[static_cast<size_t>(formed.failed_rank)];
    // A link that did not connect: the reporting rank answered, and whom
    // it blames is LinkFailures' to say.
    if (const std::optional<int> peer = UnreachablePeer(formed.failure);
        peer.has_value() && static_cast<size_t>(*peer) < members.size() &&
        *peer != formed.failed_rank) {
      std::vector<std::string> ends;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ends =
            link_failures_.Record(failed.worker_id, members[static_cast<size_t>(*peer)].worker_id);
      }
      if (blamed != nullptr) *blamed = std::move(ends);
      return formed.failure;
    }
    // Not a candidate for the next try (a recovery retries; Form fails the job).
    const absl::StatusCode code = formed.failure.code();
    if (options_.mark_unreachable &&
        (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded)) {
      options_.mark_unreachable(failed);
    }
    if (blamed != nullptr) *blamed = {failed.worker_id};
    return formed.failure;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The old sequencer goes before the old clients it points at.
    std::vector<std::shared_ptr<WorkerClient>> old_clients =
        std::exchange(clients_, std::move(clients));
    sequencer_ = MakeSequencerLocked(epoch);
    link_failures_.Formed();
    worker_ids_ = std::move(ids);
    members_ = members;
    epoch_config_ = std::move(config);
    unsharded_.clear();
  }
  // Every rank is past the new epoch's rendezvous; the keys of the epochs
  // before it (the last formed one, and any whose formation failed) are garbage.
  uint64_t oldest = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    oldest = std::exchange(oldest_rendezvous_epoch_, epoch);
  }
  if (options_.rendezvous != nullptr) {
    for (uint64_t e = oldest; e < epoch; ++e) {
      options_.rendezvous->DeletePrefix(absl::StrCat("job/", config_.name, "/epoch/", e));
    }
  }
  return absl::OkStatus();
}

std::vector<std::shared_ptr<WorkerClient>> TrainingJob::AbandonFormationLocked(
    int rank, const absl::Status& why) {
  if (forming_.prefix.empty() || !forming_.failure.ok()) return {};  // the first cause stands
  forming_.failure = why;
  forming_.failed_rank = rank;
  if (options_.rendezvous != nullptr) {
    options_.rendezvous->Abandon(forming_.prefix, std::string(why.message()));
  }
  return forming_.clients;
}

// The shared references keep each client alive for its CancelAll even if the
// formation has returned meanwhile. They are never a client's last on a gRPC
// thread: FormLocked holds its clients until every answer is in.
void TrainingJob::CancelFormation(const std::vector<std::shared_ptr<WorkerClient>>& clients) {
  for (const std::shared_ptr<WorkerClient>& client : clients) client->CancelAll();
}

bool TrainingJob::FailFormingWorker(const std::string& worker_id, absl::Time silent_since,
                                    absl::Duration timeout, absl::Time now,
                                    const absl::Status& reason) {
  std::vector<std::shared_ptr<WorkerClient>> forming;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = std::find(forming_.ids.begin(), forming_.ids.end(), worker_id);
    if (it == forming_.ids.end() || !forming_.failure.ok()) return false;
    // Silent for a whole timeout within this formation: a worker marked
    // unreachable by the try before (it counts as stale until it heartbeats
    // again) that answered the probe and was seated again is given its chance.
    if (now - std::max(silent_since, forming_.started) <= timeout) return false;
    const int rank = static_cast<int>(it - forming_.ids.begin());
    forming = AbandonFormationLocked(
        rank,
        absl::Status(reason.code(), absl::StrCat("rank ", rank, " (worker ", worker_id,
                                                 ") could not be configured: ", reason.message())));
  }
  CancelFormation(forming);
  return true;
}

std::unique_ptr<CommandSequencer> TrainingJob::MakeSequencerLocked(uint64_t epoch) {
  CommandSequencer::BatchObserver on_batch;
  if (JobObserver* observer = options_.observer; observer != nullptr) {
    on_batch = [observer, job = config_.name](const v1::CommandBatch& batch,
                                              absl::Duration round_trip) {
      observer->OnBatch(job, batch, round_trip);
    };
  }
  auto sequencer =
      std::make_unique<CommandSequencer>(clients_, epoch, options_.batch, std::move(on_batch));
  // The state store's write-ahead record of every batch (training_job_state.cc).
  sequencer->set_journal([this](const v1::CommandBatch& batch) { JournalBatch(batch); });
  return sequencer;
}

}  // namespace flatshard

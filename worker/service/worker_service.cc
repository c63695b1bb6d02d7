#include "worker/service/worker_service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "rpc/command_batch.h"
#include "rpc/status_proto.h"

#include "core/job_config.h"
#include "core/status_macros.h"
#include "proto/grpc_status.h"
#include "worker/compute/data_source.h"
#include "worker/runtime/batch_executor.h"
#include "worker/runtime/fsdp_runtime.h"
#include "worker/runtime/peer_snapshot.h"
#include "worker/service/active_job.h"
#include "worker/service/job_options.h"

namespace flatshard {

namespace {

absl::Status CheckUnitsAgree(const std::vector<Unit>& mine,
                             const google::protobuf::RepeatedPtrField<v1::Unit>& theirs) {
  if (static_cast<int>(mine.size()) != theirs.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the coordinator cut the model into ", theirs.size(), " units, this worker into ",
        mine.size(), "; coordinator and worker run different flatshard versions"));
  }
  for (size_t u = 0; u < mine.size(); ++u) {
    const v1::Unit expected = UnitToProto(mine[u]);
    const v1::Unit& got = theirs[static_cast<int>(u)];
    if (expected.SerializeAsString() != got.SerializeAsString()) {
      return absl::FailedPreconditionError(
          absl::StrCat("unit ", u, " differs between coordinator ('", got.module_fqn(), "', ",
                       got.numel(), " elements) and worker ('", expected.module_fqn(), "', ",
                       expected.numel(), " elements)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

WorkerServiceImpl::WorkerServiceImpl(WorkerServiceOptions options)
    : options_(std::move(options)),
      watchdog_(options_.abort_grace, options_.on_wedged),
      batch_(&watchdog_) {
  status_.state = "idle";
}

WorkerServiceImpl::~WorkerServiceImpl() { Shutdown("worker shutting down"); }

std::shared_ptr<WorkerServiceImpl::ActiveJob> WorkerServiceImpl::CurrentJob() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  return job_;
}

absl::Status WorkerServiceImpl::BeginBatch(const v1::CommandBatch& batch, uint64_t epoch) {
  std::lock_guard<std::mutex> lock(state_mu_);
  if (status_.state == "aborted") {
    return absl::AbortedError(absl::StrCat("rank ", status_.rank, " was aborted (",
                                           status_.abort_reason, "); re-form the job"));
  }
  status_.state = "running";
  batch_.Begin(absl::StrCat("batch seq ", batch.seq(), " (", BatchKindName(batch.kind_case()),
                            ") of epoch ", epoch, " on rank ", status_.rank),
               epoch);
  return absl::OkStatus();
}

void WorkerServiceImpl::EndBatch(const absl::Status& status) {
  std::function<void()> observer;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    batch_.End();
    observer = batch_end_observer_;
    if (job_ != nullptr) status_.last_completed_seq = job_->executor->last_completed_seq();
    if (status_.state != "aborted") {
      // A batch refused before it ran (its epoch, seq, digest or kind) leaves
      // the worker ready, or a hostile call would keep a restarted coordinator
      // from re-adopting it; only a batch that broke the executor fails it.
      const bool broken = job_ != nullptr && job_->executor->poisoned();
      status_.state = status.ok() || !broken ? "ready" : "failed";
    }
  }
  if (observer) observer();
}

void WorkerServiceImpl::set_batch_end_observer(std::function<void()> observer) {
  std::lock_guard<std::mutex> lock(state_mu_);
  batch_end_observer_ = std::move(observer);
}

WorkerStatus WorkerServiceImpl::Status() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  WorkerStatus status = status_;
  // Whatever an abort reached and still runs: the batch, or the background
  // writes of the job (or, while a Configure waits for them, of the job it
  // replaced).
  const ActiveJob* writing = retiring_ != nullptr ? retiring_.get() : job_.get();
  status.draining =
      std::max(batch_.Draining(),
               DrainingFor(writing != nullptr ? writing->saves.DrainingSince() : std::nullopt));
  if (job_ != nullptr && job_->runtime != nullptr) status.progress = job_->runtime->progress();
  if (job_ != nullptr) status.save_progress = job_->saves.progress();
  return status;
}

WorkerSnapshot WorkerServiceImpl::Snapshot() const {
  WorkerSnapshot snapshot;
  if (options_.device != nullptr) {
    snapshot.device_kind = std::string(DeviceKindName(options_.device->kind()));
    snapshot.device_memory = options_.device->MemoryStats();
  }
  std::shared_ptr<ActiveJob> job;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    snapshot.status = status_;
    job = job_;
  }
  snapshot.peer_snapshot_bytes = peer_snapshots_.bytes();
  if (job == nullptr) return snapshot;
  // The memory counters are atomics; the shared_ptr keeps the runtime alive.
  snapshot.job_name = job->config.name;
  const MemoryTracker& memory = job->runtime->memory();
  for (size_t k = 0; k < snapshot.memory.size(); ++k) {
    snapshot.memory[k] = {memory.current(static_cast<MemoryKind>(k)),
                          memory.peak(static_cast<MemoryKind>(k))};
  }
  return snapshot;
}

void WorkerServiceImpl::AbortJob(const std::string& reason, uint64_t epoch) {
  std::shared_ptr<ActiveJob> job;
  std::shared_ptr<AbortSignal> configuring;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    // The batch in flight must return now; if it does not (it is blocked
    // somewhere an abort cannot reach), the watchdog ends the worker.
    batch_.Aborted(reason, epoch);
    if (status_.state == "aborted") return;
    // While a Configure builds, job_ is empty and status_ names the epoch it
    // builds (as it names job_'s otherwise); the abort is recorded there, and
    // the Configure installs nothing.
    job = job_;
    configuring = configuring_;
    if (job == nullptr && configuring == nullptr) return;
    if (epoch != 0 && status_.job_epoch > epoch) return;
    status_.state = "aborted";
    status_.abort_reason = reason;
  }
  if (configuring != nullptr) configuring->Abort(reason);
  if (job != nullptr) {
    job->runtime->Abort(reason);
    job->saves.Abort(reason);
  }
}

void WorkerServiceImpl::Shutdown(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    shutting_down_ = true;
  }
  AbortJob(reason);
}

grpc::Status WorkerServiceImpl::Configure(grpc::ServerContext* context,
                                          const v1::ConfigureRequest* request,
                                          v1::ConfigureResponse* /*response*/) {
  const absl::Status status = [&]() -> absl::Status {
    if (request->job_epoch() == 0) {
      return absl::InvalidArgumentError("configure: job_epoch must be positive");
    }
    if (request->world_size() < 1 || request->rank() < 0 ||
        request->rank() >= request->world_size()) {
      return absl::InvalidArgumentError(absl::StrCat("configure: rank ", request->rank(),
                                                     " is outside a world of size ",
                                                     request->world_size()));
    }
    if (request->store_prefix().empty()) {
      return absl::InvalidArgumentError("configure: store_prefix must not be empty");
    }
    auto job = std::make_shared<ActiveJob>(&watchdog_);
    ASSIGN_OR_RETURN(job->config, JobConfigFromProto(request->spec()));
    if (job->config.world_size != request->world_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("configure: world_size ", request->world_size(),
                       " differs from the job spec's ", job->config.world_size));
    }
    ASSIGN_OR_RETURN(std::vector<Unit> units, JobUnits(job->config));
    RETURN_IF_ERROR(CheckUnitsAgree(units, request->units()));
    job->rank = request->rank();
    job->epoch = request->job_epoch();
    // A call its caller gave up on (a formation abandoned for a failed rank,
    // a configure timeout) must not tear down what runs now: it may be a
    // newer epoch, configured while this call was queued or in transit.
    const auto abandoned = [&]() -> absl::Status {
      if (context == nullptr || !context->IsCancelled()) return absl::OkStatus();
      return absl::CancelledError(absl::StrCat("configure for epoch ", job->epoch,
                                               ": the caller gave up on it before it began"));
    };
    RETURN_IF_ERROR(abandoned());
    const auto stopping = [&]() -> absl::Status {
      if (!shutting_down_) return absl::OkStatus();
      return absl::UnavailableError(
          absl::StrCat("configure for epoch ", job->epoch, ": this worker is shutting down"));
    };
    {
      // Before it aborts anything: a stopping daemon's job is aborted already.
      std::lock_guard<std::mutex> lock(state_mu_);
      RETURN_IF_ERROR(stopping());
    }

    // A previous epoch may be blocked in a collective: fail it so its batch
    // returns and releases run_mu_.
    AbortJob(absl::StrCat("re-configured for epoch ", job->epoch));
    std::lock_guard<std::mutex> run(run_mu_);
    RETURN_IF_ERROR(abandoned());  // gave up while this waited for the batch to let go
    // The old epoch's snapshot exchange (aborted with it) ends before its
    // runtime goes; the snapshots it holds stay, for a restore in this epoch.
    peer_snapshots_.Quiesce();
    peer_snapshots_.Configuring(job->config.name, job->epoch);
    std::shared_ptr<Store> store = options_.store_for_prefix(request->store_prefix());
    auto configuring = std::make_shared<AbortSignal>();
    const std::unique_ptr<AbortSignal::Registration> store_abort =
        configuring->OnAbort([store](const std::string& reason) { store->Abort(reason); });
    std::shared_ptr<ActiveJob> old;
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      // Checked again where an abort would find the configuration: a
      // shutdown after this point aborts its rendezvous.
      RETURN_IF_ERROR(stopping());
      old = std::move(job_);
      configuring_ = configuring;
      retiring_ = old;
      status_ = WorkerStatus{job->rank, job->epoch, 0, "configuring", "", absl::ZeroDuration()};
    }
    // Outside state_mu_, for heartbeats (Status) must not wait on it, or a
    // healthy survivor is declared dead while it re-forms: the old epoch's
    // background writes end (aborted, and watched, even if an abort that
    // raced this one has not reached them yet), then its runtime closes its
    // Gloo pairs. The writes are waited for here, not by whoever drops the
    // job last: an AwaitSave (or a metrics scrape) may still hold it for a
    // moment, and then frees the old runtime on its own thread.
    if (old != nullptr) {
      old->saves.Abort(absl::StrCat("re-configured for epoch ", job->epoch));
      old->saves.Wait();
    }
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      retiring_.reset();
    }
    old.reset();
    absl::Status built = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(compute::DataSourceOptions data_options,
                       DataOptionsFromJob(job->config, options_.data_dir));
      ASSIGN_OR_RETURN(job->data, compute::MakeDataSource(data_options));
      RuntimeOptions runtime = RuntimeOptionsFromJob(job->config);
      runtime.loss = job->data->loss();
      runtime.gloo = options_.gloo;
      runtime.gloo.abort = configuring;
      runtime.device = options_.device;
      runtime.comm = options_.comm;
      runtime.file_system = options_.file_system;
      if (options_.observer_for_job) {
        runtime.observer = options_.observer_for_job(job->config.name, job->rank);
      }
      ASSIGN_OR_RETURN(job->runtime,
                       FsdpRuntime::Create(job->config.model, job->config.wrap_policy, runtime,
                                           job->rank, job->config.world_size, store));
      job->executor = std::make_unique<BatchExecutor>(job->runtime.get(), job->epoch);
      return absl::OkStatus();
    }();
    absl::Status outcome;
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      configuring_.reset();
      if (status_.state == "aborted") {
        outcome = absl::AbortedError(absl::StrCat(
            "configure for epoch ", job->epoch, " was aborted while it built (",
            status_.abort_reason, ")", built.ok() ? "" : absl::StrCat(": ", built.message())));
      } else if (!built.ok()) {
        status_.state = "failed";
        outcome = built;
      } else {
        job_ = std::move(job);
        status_.state = "ready";
        return absl::OkStatus();
      }
    }
    // What was built for an epoch that is not installed goes here: under
    // run_mu_, so that it has closed its Gloo pairs and freed its (device)
    // memory before the next Configure builds, as a replaced job has; and
    // outside state_mu_, which heartbeats need meanwhile.
    job.reset();
    return outcome;
  }();
  return ToGrpcStatus(status);
}

grpc::Status WorkerServiceImpl::Execute(grpc::ServerContext* /*context*/,
                                        const v1::CommandBatch* request,
                                        v1::CommandResult* response) {
  return ToGrpcStatus(RunBatch(*request, response, nullptr));
}

grpc::Status WorkerServiceImpl::Summon(grpc::ServerContext* /*context*/,
                                       const v1::CommandBatch* request,
                                       grpc::ServerWriter<v1::TensorChunk>* writer) {
  return ToGrpcStatus(RunBatch(*request, nullptr, writer));
}

grpc::Status WorkerServiceImpl::AwaitSave(grpc::ServerContext* context,
                                          const v1::AwaitSaveRequest* request,
                                          v1::CommandResult* response) {
  // Not under run_mu_: the point is to wait while batches keep running.
  std::shared_ptr<ActiveJob> job = CurrentJob();
  if (job == nullptr) {
    return ToGrpcStatus(absl::FailedPreconditionError("this worker has no job"));
  }
  const absl::Time deadline = context->deadline() == std::chrono::system_clock::time_point::max()
                                  ? absl::InfiniteFuture()
                                  : absl::FromChrono(context->deadline());
  // A caller that gives up (a commit abandoned with its job) frees this
  // thread at once rather than at its deadline.
  absl::StatusOr<v1::CommandResult> result = job->saves.Await(
      request->directory(), deadline, [context] { return context->IsCancelled(); });
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::GetStatus(grpc::ServerContext* /*context*/,
                                          const v1::GetStatusRequest* /*request*/,
                                          v1::GetStatusResponse* response) {
  const WorkerStatus status = Status();
  response->set_rank(status.rank);
  response->set_job_epoch(status.job_epoch);
  response->set_last_completed_seq(status.last_completed_seq);
  response->set_state(status.state);
  response->set_draining_ms(absl::ToInt64Milliseconds(status.draining));
  response->set_abort_grace_ms(absl::ToInt64Milliseconds(watchdog_.grace()));
  response->set_progress(status.progress);
  response->set_save_progress(status.save_progress);
  for (v1::PeerSnapshotHeld& held : peer_snapshots_.Held()) {
    *response->add_peer_snapshots() = std::move(held);
  }
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::Abort(grpc::ServerContext* /*context*/,
                                      const v1::AbortRequest* request,
                                      v1::AbortResponse* /*response*/) {
  AbortJob(request->reason().empty() ? "aborted by the coordinator" : request->reason(),
           request->job_epoch());
  return grpc::Status::OK;
}

}  // namespace flatshard

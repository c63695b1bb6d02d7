// The batches a worker runs for its job (docs/architecture.md §4): each is
// checked against the job's epoch and sequence, then dispatched by kind to
// the executor, streaming a summon's tensors back to its reader.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rpc/command_batch.h"
#include "rpc/status_proto.h"

#include "core/status_macros.h"
#include "worker/runtime/peer_snapshot.h"
#include "worker/service/active_job.h"
#include "worker/service/worker_service.h"

namespace flatshard {
namespace {

constexpr int64_t kDefaultChunkBytes = int64_t{4} << 20;

}  // namespace

absl::Status WorkerServiceImpl::RunBatch(const v1::CommandBatch& batch, v1::CommandResult* result,
                                         grpc::ServerWriter<v1::TensorChunk>* writer) {
  std::lock_guard<std::mutex> run(run_mu_);
  std::shared_ptr<ActiveJob> job = CurrentJob();
  if (job == nullptr) {
    return absl::FailedPreconditionError(
        "this worker has no job: the coordinator must Configure it first");
  }
  RETURN_IF_ERROR(BeginBatch(batch, job->epoch));
  absl::Status status = Dispatch(*job, batch, result, writer);
  EndBatch(status);
  return status;
}

absl::Status WorkerServiceImpl::Dispatch(ActiveJob& job, const v1::CommandBatch& batch,
                                         v1::CommandResult* result,
                                         grpc::ServerWriter<v1::TensorChunk>* writer) {
  const auto wrong_rpc = [&](absl::string_view rpc) {
    return absl::InvalidArgumentError(absl::StrCat("a ", BatchKindName(batch.kind_case()),
                                                   " batch goes through WorkerService.", rpc));
  };
  switch (batch.kind_case()) {
    case v1::CommandBatch::kStep:
      if (result == nullptr) return wrong_rpc("Execute");
      return RunStep(job, batch, *result);
    case v1::CommandBatch::kControl:
      if (result == nullptr) return wrong_rpc("Execute");
      RETURN_IF_ERROR(job.executor->ExecuteControl(batch));
      result->set_seq(batch.seq());
      result->set_rank(job.rank);
      return absl::OkStatus();
    case v1::CommandBatch::kCheckpoint:
      if (result == nullptr) return wrong_rpc("Execute");
      return RunCheckpoint(job, batch, *result);
    case v1::CommandBatch::kSummon:
      if (writer == nullptr) return wrong_rpc("Summon");
      return RunSummon(job, batch, *writer);
    case v1::CommandBatch::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("worker rank ", job.rank, " refuses batch seq ", batch.seq(),
                   ": its kind is not set (a step, control, checkpoint or summon batch)"));
}

absl::Status WorkerServiceImpl::RunStep(ActiveJob& job, const v1::CommandBatch& batch,
                                        v1::CommandResult& result) {
  ASSIGN_OR_RETURN(compute::Batch data,
                   job.data->GetBatch(batch.step().step(), job.rank, job.config.world_size));
  ASSIGN_OR_RETURN(result, job.executor->Execute(batch, data));
  result.set_rank(job.rank);
  return absl::OkStatus();
}

absl::Status WorkerServiceImpl::RunCheckpoint(ActiveJob& job, const v1::CommandBatch& batch,
                                              v1::CommandResult& result) {
  if (batch.checkpoint().has_take_peer_snapshot() ||
      batch.checkpoint().has_restore_peer_snapshot()) {
    return RunPeerSnapshot(job, batch, result);
  }
  std::optional<ShardSnapshot> snapshot;
  ASSIGN_OR_RETURN(result,
                   job.executor->ExecuteCheckpoint(batch, options_.checkpoint_dir, &snapshot));
  if (snapshot.has_value()) {
    const std::string& directory = batch.checkpoint().save_shard().directory();
    job.saves.Start(directory, *std::move(snapshot),
                    absl::StrCat(options_.checkpoint_dir, "/", directory), job.rank, batch.seq());
  }
  return absl::OkStatus();
}

absl::Status WorkerServiceImpl::RunPeerSnapshot(ActiveJob& job, const v1::CommandBatch& batch,
                                                v1::CommandResult& result) {
  const v1::CheckpointBatch& command = batch.checkpoint();
  const std::string& name = job.config.name;
  ASSIGN_OR_RETURN(
      result, job.executor->ExecutePeerSnapshot(batch, [&](v1::CommandResult& r) -> absl::Status {
        if (command.has_take_peer_snapshot()) {
          const int64_t step = command.take_peer_snapshot().step();
          absl::StatusOr<std::string> taken = CapturePeerSnapshot(*job.runtime, job.epoch, step);
          if (!taken.ok()) {  // training goes on; only this snapshot is missing
            *r.mutable_checkpoint_status() = StatusToProto(taken.status());
            return absl::OkStatus();
          }
          const PeerSnapshotInfo info{job.epoch, step, job.rank, job.config.world_size,
                                      static_cast<int>(job.runtime->units().size())};
          peer_snapshots_.Take(name, info, std::make_shared<const std::string>(*std::move(taken)),
                               job.runtime->snapshot_comm());
          return absl::OkStatus();
        }
        const v1::CheckpointBatch::RestorePeerSnapshot& restore = command.restore_peer_snapshot();
        PeerRestoreRequest request;
        request.from_epoch = restore.from_epoch();
        request.step = restore.step();
        request.from_world_size = restore.from_world_size();
        request.holder.assign(restore.holder().begin(), restore.holder().end());
        ASSIGN_OR_RETURN(PeerRestoreOutcome outcome,
                         RestoreFromPeerSnapshots(*job.runtime, request, [&](int old_rank) {
                           return peer_snapshots_.Find(name, request.from_epoch, request.step,
                                                       old_rank);
                         }));
        if (!outcome.data_status.ok()) {
          *r.mutable_checkpoint_status() = StatusToProto(outcome.data_status);
        }
        return absl::OkStatus();
      }));
  return absl::OkStatus();
}

absl::Status WorkerServiceImpl::RunSummon(ActiveJob& job, const v1::CommandBatch& batch,
                                          grpc::ServerWriter<v1::TensorChunk>& writer) {
  if (batch.summon().chunk_bytes() < 0 || batch.summon().chunk_bytes() > kMaxSummonChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("summon.chunk_bytes must be between 0 and ",
                                                   kMaxSummonChunkBytes, ", got ",
                                                   batch.summon().chunk_bytes()));
  }
  const int64_t chunk_bytes =
      batch.summon().chunk_bytes() > 0 ? batch.summon().chunk_bytes() : kDefaultChunkBytes;
  const ModelIndex& index = job.runtime->index();
  return job.executor->ExecuteSummon(batch, [&](SummonedParams& summoned) -> absl::Status {
    // A reader that went away stops the stream, not the collective: the
    // other ranks are in it too, and the job must stay consistent.
    bool reading = true;
    auto emit = [&](const std::string& name, const std::string& fqn,
                    const std::vector<float>& values) {
      const IndexedParam& param = index.params[static_cast<size_t>(index.param_by_fqn.at(fqn))];
      const auto* bytes = reinterpret_cast<const char*>(values.data());
      const auto total = static_cast<int64_t>(values.size() * sizeof(float));
      int64_t offset = 0;
      do {
        const int64_t n = std::min(chunk_bytes, total - offset);
        v1::TensorChunk chunk;
        chunk.set_fqn(name);
        chunk.set_dtype(v1::DTYPE_FLOAT32);
        for (int64_t d : param.spec->shape) chunk.add_shape(d);
        chunk.set_offset_bytes(offset);
        chunk.set_total_bytes(total);
        chunk.set_data(bytes + offset, static_cast<size_t>(n));
        if (reading) reading = writer.Write(chunk);
        offset += n;
      } while (offset < total);
    };
    for (const auto& [fqn, values] : summoned.params) emit(fqn, fqn, values);
    for (const auto& [fqn, values] : summoned.grads) emit(fqn + ".grad", fqn, values);
    return absl::OkStatus();
  });
}

}  // namespace flatshard

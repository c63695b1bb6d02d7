"""Protobuf messages to the client's dataclasses."""
from __future__ import annotations

from typing import Optional

from flatshard import results
from flatshard.v1 import common_pb2, job_pb2


def recovery(message: job_pb2.Recovery, present: bool) -> Optional[results.Recovery]:
    if not present:
        return None
    return results.Recovery(
        cause=message.cause, failed_ranks=list(message.failed_ranks), seconds=message.seconds,
        failed_at_step=message.failed_at_step, resumed_step=message.resumed_step,
        steps_lost=message.steps_lost, world_size=message.world_size,
        checkpoint=message.checkpoint, from_peer_snapshot=message.from_peer_snapshot)


def step_result(message: job_pb2.StepResult) -> results.StepResult:
    return results.StepResult(
        step=message.step, loss=message.loss, grad_norm=message.grad_norm,
        step_seconds=message.step_seconds, samples_per_second=message.samples_per_second,
        compute_seconds=message.compute_seconds,
        exposed_comm_seconds=message.exposed_comm_seconds,
        rank_losses=list(message.rank_losses), target_step=message.target_step,
        recovery=recovery(message.recovery, message.HasField("recovery")))


def job_status(job: job_pb2.Job) -> results.JobStatus:
    training = None
    if job.HasField("training"):
        t = job.training
        training = results.TrainingOperation(
            target_step=t.target_step, started_by=t.started_by,
            started_at_unix=t.started_at_unix, running=t.running,
            stop_requested=t.stop_requested, outcome=t.outcome)
    return results.JobStatus(
        name=job.spec.name, state=job_pb2.JobState.Name(job.state), step=job.step,
        epoch=job.epoch, world_size=job.world_size or job.spec.world_size,
        restarts=job.restarts, failure=job.failure, units=len(job.units), training=training,
        last_recovery=recovery(job.last_recovery, job.HasField("last_recovery")))


def worker_info(w: job_pb2.WorkerInfo) -> results.WorkerInfo:
    return results.WorkerInfo(
        worker_id=w.worker_id, rank=w.rank, host=w.host, device=w.device,
        device_name=w.device_name, address=w.address, state=w.state,
        heartbeat_age_seconds=w.heartbeat_age_seconds,
        last_completed_seq=w.last_completed_seq, metrics_address=w.metrics_address)


def checkpoint_info(c: job_pb2.CheckpointInfo) -> results.CheckpointInfo:
    return results.CheckpointInfo(
        name=c.name, step=c.step, state_dict_type=common_pb2.StateDictType.Name(c.state_dict_type),
        world_size=c.world_size, bytes=c.bytes, latest=c.latest,
        created_unix_micros=c.created_unix_micros, recovery_target=c.recovery_target,
        converted_from=c.converted_from)


def job_event(e: job_pb2.JobEvent) -> results.JobEvent:
    return results.JobEvent(job=e.job, state=job_pb2.JobState.Name(e.state), message=e.message,
                            unix_micros=e.unix_micros)

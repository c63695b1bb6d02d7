"""The coordinator's JobService from Python: `Cluster` and `Job`.

Every call maps an error onto `FlatshardError` carrying the gRPC code and the
server's message; results are the dataclasses in `flatshard.results`.
"""
from __future__ import annotations

import getpass
import json
import os
import signal
import socket
import threading
import time
import warnings
from typing import Any, Dict, Iterator, List, Optional, Union

import grpc
import numpy as np

from flatshard import _convert
from flatshard._safetensors import bf16_bits_to_float32
from flatshard.errors import COORDINATOR_NAME, FlatshardError, JobFailed, from_rpc_error
from flatshard.job_document import JobSource, job_document
from flatshard.results import (CheckpointInfo, CheckpointResult, JobEvent, JobStatus, StepResult,
                               StopResult, TlsConfig, WorkerInfo)
from flatshard.v1 import common_pb2, job_pb2, job_pb2_grpc

_STATE_DICT_TYPES = {
    "full": common_pb2.FULL_STATE_DICT,
    "sharded": common_pb2.SHARDED_STATE_DICT,
    "local": common_pb2.LOCAL_STATE_DICT,
}
_WIRE_DTYPES = {
    common_pb2.DTYPE_FLOAT32: np.float32, common_pb2.DTYPE_FLOAT64: np.float64,
    common_pb2.DTYPE_FLOAT16: np.float16, common_pb2.DTYPE_BFLOAT16: np.uint16,
    common_pb2.DTYPE_INT32: np.int32, common_pb2.DTYPE_INT64: np.int64,
}
# Summons and checkpoints move whole models: no message-size ceiling below the
# server's own chunking. Keepalive as the C++ clients (rpc/keepalive.h): a
# stream notices a coordinator that vanished within about 40 s.
# Read-only calls are retried on UNAVAILABLE, so a client that outlived a
# coordinator restart does not fail its first read on the dead connection
# (rpc/read_retries.cc carries the same service config for the C++ client).
_READ_RETRY_SERVICE_CONFIG = json.dumps({
    "methodConfig": [{
        "name": [{"service": "flatshard.v1.JobService", "method": m}
                 for m in ("GetJob", "ListJobs", "ListWorkers", "ListCheckpoints", "Plan",
                           "WatchEvents")],
        "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
                        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]},
    }]})

_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 << 20),
                    ("grpc.keepalive_time_ms", 30000), ("grpc.keepalive_timeout_ms", 10000),
                    ("grpc.http2.max_pings_without_data", 0),
                    ("grpc.enable_retries", 1), ("grpc.service_config", _READ_RETRY_SERVICE_CONFIG)]

def _read(path: Optional[str]) -> Optional[bytes]:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def _started_by() -> str:
    """Who starts a training, as the client says it (user@host)."""
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 (no passwd entry for the uid, no $USER: containers)
        user = "unknown"
    return f"{user}@{socket.gethostname()} (python)"


# How long a Ctrl-C waits for the coordinator to take the stop.
_STOP_ON_INTERRUPT_TIMEOUT_S = 10.0


class _InterruptWatch:
    """While entered, on the main thread: notes a SIGINT (Ctrl-C, a Jupyter
    kernel's interrupt) before the handler that was there handles it (Python's
    own raises KeyboardInterrupt). Elsewhere, or with SIGINT ignored or left
    to the system, it changes nothing and notes nothing."""

    def __init__(self) -> None:
        self.seen = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: Any) -> None:
        self.seen = True
        self._previous(signum, frame)

    def __enter__(self) -> "_InterruptWatch":
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if callable(previous):
                self._previous = previous
                signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        # Only its own handler is put back: another set since stays. (A
        # generator dropped on another thread cannot: Python allows signal
        # handlers to be set on the main thread only; the watch then chains
        # to the handler before it, as it did.)
        if self._previous is not None and signal.getsignal(signal.SIGINT) == self._handle:
            try:
                signal.signal(signal.SIGINT, self._previous)
            except ValueError:
                pass


def _token_from_file(path: Optional[str]) -> Optional[str]:
    if not path:
        return None
    with open(path, encoding="utf-8") as f:
        return f.readline().strip() or None


class Cluster:
    """A connection to a flatshard coordinator.

    ``address`` is HOST:PORT (default ``$FLATSHARD_COORDINATOR`` or
    127.0.0.1:7070). ``token`` is a bearer token (``flatshard token create``;
    default ``$FLATSHARD_TOKEN``, else the first line of ``$FLATSHARD_TOKEN_FILE``,
    as the CLI reads them); ``tls`` a `TlsConfig` or a dict of its
    fields (default: from ``$FLATSHARD_TLS_CA/CERT/KEY`` when set, and
    ``$FLATSHARD_TLS_SERVER_NAME``, else plaintext). Use it as a context manager, or call ``close()``.
    """

    def __init__(self, address: Optional[str] = None, token: Optional[str] = None,
                 tls: Union[TlsConfig, Dict[str, str], None] = None,
                 timeout: float = 60.0) -> None:
        self.address = address or os.environ.get("FLATSHARD_COORDINATOR", "127.0.0.1:7070")
        if token is None:
            token = os.environ.get("FLATSHARD_TOKEN") or _token_from_file(
                os.environ.get("FLATSHARD_TOKEN_FILE"))
        self._metadata = [("authorization", f"Bearer {token}")] if token else []
        self.timeout = timeout
        if isinstance(tls, dict):
            tls = TlsConfig(**tls)
        # Any of the three turns TLS on, as in the CLI: a client certificate
        # without a CA is checked against the system's roots, never sent (with
        # the token) over plaintext.
        if tls is None and any(os.environ.get(f"FLATSHARD_TLS_{v}") for v in ("CA", "CERT", "KEY")):
            tls = TlsConfig(ca=os.environ.get("FLATSHARD_TLS_CA") or None,
                            cert=os.environ.get("FLATSHARD_TLS_CERT") or None,
                            key=os.environ.get("FLATSHARD_TLS_KEY") or None,
                            server_name=os.environ.get("FLATSHARD_TLS_SERVER_NAME") or None)
        self._role_checked = False
        if tls is None:
            self._channel = grpc.insecure_channel(self.address, options=_CHANNEL_OPTIONS)
        else:
            if (tls.cert is None) != (tls.key is None):
                raise ValueError("tls: cert and key go together (mutual TLS) or not at all")
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(tls.ca), private_key=_read(tls.key),
                certificate_chain=_read(tls.cert))
            options = list(_CHANNEL_OPTIONS)
            # With the cluster's CA, which signs the workers' certificates
            # too, the coordinator is known by its role's name (which `flatshard
            # certs init` puts in its certificate), not by its host: a
            # worker's key cannot serve as the coordinator's. grpcio cannot
            # check the common name as the C++ client does, so the name
            # dialed is the check. Against the system's roots, the host.
            server_name = tls.server_name or (COORDINATOR_NAME if tls.ca else None)
            if server_name:
                options.append(("grpc.ssl_target_name_override", server_name))
            self._role_checked = server_name == COORDINATOR_NAME
            self._channel = grpc.secure_channel(self.address, credentials, options=options)
        self._stub = job_pb2_grpc.JobServiceStub(self._channel)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    # -- calls ---------------------------------------------------------------
    def _unary(self, name: str, request: Any, timeout: Optional[float] = None) -> Any:
        try:
            return getattr(self._stub, name)(request, metadata=self._metadata,
                                             timeout=timeout or self.timeout)
        except grpc.RpcError as error:
            raise from_rpc_error(error, name, self._role_checked) from None

    def _stream(self, name: str, request: Any, timeout: Optional[float] = None) -> Iterator[Any]:
        """Starts the call now (not at the first ``next``) and iterates its responses."""
        call = getattr(self._stub, name)(request, metadata=self._metadata, timeout=timeout)
        return self._responses(name, call)

    def _responses(self, name: str, call: Any) -> Iterator[Any]:
        try:
            yield from call
        except grpc.RpcError as error:
            raise from_rpc_error(error, name, self._role_checked) from None
        finally:
            call.cancel()  # a consumer that stops early must not leave the stream open

    # -- jobs ----------------------------------------------------------------
    def create_job(self, source: JobSource, wait: bool = True,
                   timeout: float = 300.0) -> "Job":
        """Creates the job in a job file (a path) or a dict laid out like one.

        With ``wait`` it returns once the workers are configured (READY), and
        raises `JobFailed` if the job fails to form.
        """
        request = job_pb2.CreateJobRequest(document=job_document(source))
        created = self._unary("CreateJob", request).job
        job = Job(self, created.spec.name)
        if wait:
            job.wait_until({"READY", "IDLE", "TRAINING"}, timeout=timeout)
        return job

    def job(self, name: str) -> "Job":
        """The job named ``name`` (NOT_FOUND if there is none)."""
        self._unary("GetJob", job_pb2.GetJobRequest(name=name))
        return Job(self, name)

    def jobs(self) -> List[JobStatus]:
        return [_convert.job_status(j)
                for j in self._unary("ListJobs", job_pb2.ListJobsRequest()).jobs]

    def workers(self, job: str = "") -> List[WorkerInfo]:
        response = self._unary("ListWorkers", job_pb2.ListWorkersRequest(job=job))
        return [_convert.worker_info(w) for w in response.workers]

    def plan(self, source: JobSource) -> Dict[str, Any]:
        """The job's FSDP plan (units, flat layouts, shards: docs/plan-json.md)."""
        response = self._unary("Plan", job_pb2.PlanRequest(document=job_document(source)))
        return json.loads(response.plan_json)


class Job:
    """A job on the coordinator. Cheap: it holds only the cluster and the name."""

    def __init__(self, cluster: Cluster, name: str) -> None:
        self.cluster = cluster
        self.name = name

    def __repr__(self) -> str:
        return f"Job({self.name!r} on {self.cluster.address})"

    def _proto(self) -> job_pb2.Job:
        return self.cluster._unary("GetJob", job_pb2.GetJobRequest(name=self.name)).job

    def status(self) -> JobStatus:
        return _convert.job_status(self._proto())

    def model_spec(self) -> common_pb2.ModelSpec:
        """The job's model in the wire form, every parameter explicit
        (``flatshard.torch_modules.build`` makes a torch module of it)."""
        return self._proto().spec.model

    def plan(self) -> Dict[str, Any]:
        spec = self._proto().spec
        response = self.cluster._unary("Plan", job_pb2.PlanRequest(spec=spec))
        return json.loads(response.plan_json)

    def delete(self) -> None:
        self.cluster._unary("DeleteJob", job_pb2.DeleteJobRequest(name=self.name))

    def wait_until(self, states: set, timeout: float = 300.0) -> str:
        """Blocks on WatchEvents until the job has been in one of ``states``."""
        last_failure = ""
        give_up = time.monotonic() + timeout
        try:
            for event in self.watch(timeout=timeout):
                if event.state in states:
                    return event.state
                if event.state == "FAILED":
                    last_failure = event.message
                if event.state in ("FAILED", "STOPPED"):
                    raise JobFailed(grpc.StatusCode.FAILED_PRECONDITION,
                                    f"job '{self.name}' is {event.state}"
                                    + (f": {last_failure}" if last_failure else ""), "WatchEvents")
        except FlatshardError as error:
            # The coordinator may see the deadline first and end the stream
            # CANCELLED (as the C++ client's WaitForState reads it too).
            at_deadline = (error.code == grpc.StatusCode.CANCELLED
                           and time.monotonic() >= give_up)
            if error.code != grpc.StatusCode.DEADLINE_EXCEEDED and not at_deadline:
                raise
        else:
            # The coordinator ended the stream before the deadline: not a timeout.
            raise FlatshardError(grpc.StatusCode.UNAVAILABLE,
                                 f"the coordinator ended the watch of job '{self.name}' before "
                                 "it reached the state", "WatchEvents")
        raise FlatshardError(grpc.StatusCode.DEADLINE_EXCEEDED,
                             f"job '{self.name}' did not reach {sorted(states)} in {timeout} s",
                             "WatchEvents")

    def watch(self, timeout: Optional[float] = None) -> Iterator[JobEvent]:
        """The job's state changes, from its creation on, as they happen."""
        for event in self.cluster._stream("WatchEvents", job_pb2.WatchEventsRequest(job=self.name),
                                          timeout=timeout):
            yield _convert.job_event(event)

    # -- training ------------------------------------------------------------
    def train(self, steps: int, no_sync_micro_steps: int = 0,
              detach: bool = False) -> Iterator[StepResult]:
        """Starts ``steps`` training steps on the coordinator and yields each.

        The call starts the training at once; iterating yields its steps and
        raises its errors. The training runs on the coordinator: leaving the
        loop early, never iterating, or losing the connection leaves it running
        (`attach()` follows it again). With ``detach`` it returns once the
        training has started (an empty iterator), raising here if it could not
        start. KeyboardInterrupt asks it to stop after the current step, as
        Ctrl-C in `flatshard train` does, and is re-raised.
        """
        request = job_pb2.TrainRequest(job=self.name, steps=steps,
                                       no_sync_micro_steps=no_sync_micro_steps, detach=detach,
                                       started_by=_started_by())
        responses = self.cluster._stream("Train", request)
        if detach:
            for _ in responses:  # the coordinator ends the stream once it started
                pass
            return iter(())
        return self._follow(responses)

    def attach(self) -> Iterator[StepResult]:
        """Streams the running training from its current step."""
        return self._follow(self.cluster._stream("Train",
                                                 job_pb2.TrainRequest(job=self.name, attach=True)))

    def _follow(self, responses: Iterator[Any]) -> Iterator[StepResult]:
        # Ctrl-C most often lands in the loop's body, not in this generator:
        # the loop then drops it (GeneratorExit), which alone cannot be told
        # from a `break`. The watch notes the signal wherever it lands.
        watch = _InterruptWatch()
        try:
            with watch:
                for result in responses:
                    yield _convert.step_result(result)
                    # Asked for the next step: an interrupt in between was
                    # handled by the loop, which goes on.
                    watch.seen = False
        except KeyboardInterrupt:
            self._stop_after_interrupt()
            raise
        except GeneratorExit:
            if watch.seen:
                self._stop_after_interrupt()
            raise

    def _stop_after_interrupt(self) -> None:
        # The interrupt is what the caller gets, whatever the stop says (the
        # training ended meanwhile, the coordinator is gone): as in the CLI.
        try:
            self.stop(timeout=_STOP_ON_INTERRUPT_TIMEOUT_S)
        except FlatshardError as error:
            warnings.warn(f"flatshard: could not stop the training of job '{self.name}': "
                          f"{error}", RuntimeWarning, stacklevel=3)

    def stop(self, timeout: Optional[float] = None) -> StopResult:
        """Asks the running training to stop after the step in flight."""
        response = self.cluster._unary("StopTraining", job_pb2.StopTrainingRequest(job=self.name),
                                       timeout=timeout)
        return StopResult(was_running=response.was_running, step=response.step)

    def unshard(self, units: Optional[List[int]] = None) -> None:
        self.cluster._unary("Unshard", job_pb2.UnshardRequest(job=self.name,
                                                              unit_indices=units or []))

    def reshard(self, units: Optional[List[int]] = None) -> None:
        self.cluster._unary("Reshard", job_pb2.ReshardRequest(job=self.name,
                                                              unit_indices=units or []))

    # -- parameters and checkpoints ------------------------------------------
    def summon(self, as_torch: bool = False, with_grads: bool = False) -> Dict[str, Any]:
        """The full parameters by FQN (tied aliases included, as state_dict()).

        numpy arrays by default, with bfloat16 widened to float32 exactly;
        ``as_torch=True`` gives torch tensors (torch is then needed). The values
        come in the dtype the workers stream them in (float32 today, as the
        unsharded fp32 parameters FSDP summons), whatever the model's dtype.
        """
        buffers: Dict[str, bytearray] = {}
        meta: Dict[str, tuple] = {}
        received: Dict[str, int] = {}
        request = job_pb2.SummonFullParamsRequest(job=self.name, with_grads=with_grads)
        for chunk in self.cluster._stream("SummonFullParams", request):
            if chunk.fqn not in buffers:
                buffers[chunk.fqn] = bytearray(chunk.total_bytes)
                meta[chunk.fqn] = (chunk.dtype, tuple(chunk.shape))
                received[chunk.fqn] = 0
            end = chunk.offset_bytes + len(chunk.data)
            # The worker streams each tensor's chunks in order, back to back.
            if chunk.offset_bytes != received[chunk.fqn] or end > len(buffers[chunk.fqn]):
                raise FlatshardError(grpc.StatusCode.DATA_LOSS,
                                     f"summon: chunk of '{chunk.fqn}' at [{chunk.offset_bytes}, "
                                     f"{end}) does not follow the {received[chunk.fqn]} bytes "
                                     f"received of its {len(buffers[chunk.fqn])}",
                                     "SummonFullParams")
            buffers[chunk.fqn][chunk.offset_bytes:end] = chunk.data
            received[chunk.fqn] = end
        out: Dict[str, Any] = {}
        for fqn, data in buffers.items():
            if received[fqn] != len(data):
                raise FlatshardError(grpc.StatusCode.DATA_LOSS,
                                     f"summon: '{fqn}' ended after {received[fqn]} of its "
                                     f"{len(data)} bytes", "SummonFullParams")
            dtype, shape = meta[fqn]
            if dtype not in _WIRE_DTYPES:
                raise FlatshardError(grpc.StatusCode.DATA_LOSS,
                                     f"summon: '{fqn}' has dtype {dtype} this client cannot read",
                                     "SummonFullParams")
            array = np.frombuffer(bytes(data), dtype=_WIRE_DTYPES[dtype]).reshape(shape)
            out[fqn] = _as_output(array, dtype == common_pb2.DTYPE_BFLOAT16, as_torch)
        return out

    def save_checkpoint(self, name: str = "", type: Optional[str] = None,
                        async_save: bool = False) -> CheckpointResult:
        """Takes a checkpoint now (``type``: 'full', 'sharded', 'local'; default:
        the job's state-dict settings) and returns once it is committed."""
        request = job_pb2.SaveCheckpointRequest(job=self.name, name=name, async_save=async_save)
        if type is not None:
            if type.lower() not in _STATE_DICT_TYPES:
                raise ValueError(f"type: unknown state dict type '{type}'; expected one of "
                                 f"{', '.join(_STATE_DICT_TYPES)}")
            request.settings.state_dict_type = _STATE_DICT_TYPES[type.lower()]
        return self._checkpoint_stream("SaveCheckpoint", request)

    def load_checkpoint(self, name: str = "latest") -> CheckpointResult:
        """Loads a committed checkpoint; training resumes after its step.

        "latest" is the newest committed checkpoint, which after an earlier
        load of an older one may be of the history that load left; the one a
        recovery would restore is the checkpoint whose recovery_target is set
        in checkpoints()."""
        return self._checkpoint_stream("LoadCheckpoint",
                                       job_pb2.LoadCheckpointRequest(job=self.name, name=name))

    def _checkpoint_stream(self, call: str, request: Any) -> CheckpointResult:
        last = None
        for progress in self.cluster._stream(call, request):
            last = progress
        if last is None or not last.done:
            raise FlatshardError(grpc.StatusCode.UNKNOWN,
                                 f"{call} ended without reporting completion", call)
        return CheckpointResult(name=last.name, step=last.step, bytes_written=last.bytes_written,
                                manifest_path=last.manifest_path)

    def checkpoints(self) -> List[CheckpointInfo]:
        response = self.cluster._unary("ListCheckpoints",
                                       job_pb2.ListCheckpointsRequest(job=self.name))
        return [_convert.checkpoint_info(c) for c in response.checkpoints]

    def delete_checkpoint(self, name: str) -> None:
        self.cluster._unary("DeleteCheckpoint",
                            job_pb2.DeleteCheckpointRequest(job=self.name, name=name))


def _as_output(array: np.ndarray, bf16: bool, as_torch: bool) -> Any:
    if not as_torch:
        return bf16_bits_to_float32(array) if bf16 else array.copy()
    import torch  # optional: only as_torch needs it

    if bf16:
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(array.copy())

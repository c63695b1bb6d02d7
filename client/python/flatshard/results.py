"""What the client returns: plain dataclasses, not protobuf messages."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional


@dataclass(frozen=True)
class Recovery:
    """One automatic recovery (docs/fault-tolerance.md)."""
    cause: str
    failed_ranks: List[int]
    seconds: float
    failed_at_step: int
    resumed_step: int
    steps_lost: int
    world_size: int
    checkpoint: str
    from_peer_snapshot: bool


@dataclass(frozen=True)
class StepResult:
    """One training step as the coordinator streamed it."""
    step: int
    loss: float
    grad_norm: float
    step_seconds: float
    samples_per_second: float
    compute_seconds: float
    exposed_comm_seconds: float
    rank_losses: List[float]
    target_step: int
    recovery: Optional[Recovery] = None


@dataclass(frozen=True)
class TrainingOperation:
    target_step: int
    started_by: str
    started_at_unix: float
    running: bool
    stop_requested: bool
    outcome: str


@dataclass(frozen=True)
class JobStatus:
    """The job as `flatshard job status` shows it."""
    name: str
    state: str
    step: int
    epoch: int
    world_size: int
    restarts: int
    failure: str
    units: int
    training: Optional[TrainingOperation]
    last_recovery: Optional[Recovery]


@dataclass(frozen=True)
class WorkerInfo:
    worker_id: str
    rank: int
    host: str
    device: str
    device_name: str
    address: str
    state: str
    heartbeat_age_seconds: float
    last_completed_seq: int
    metrics_address: str


@dataclass(frozen=True)
class CheckpointInfo:
    name: str
    step: int
    state_dict_type: str
    world_size: int
    bytes: int
    latest: bool  # the newest committed (what "latest" names)
    created_unix_micros: int = 0  # when its save began (the catalog's order)
    # The one a recovery (or the job's next start) would restore now: the
    # newest of the job's history (its own saves; after a load, the loaded
    # one or a save since), which need not be the latest. None marked: a
    # recovery begins again at the job's initialization (say, the listed
    # ones are an earlier job's of this name).
    recovery_target: bool = False
    # A copy `flatshard ckpt consolidate` or `reshard` wrote: the checkpoint
    # it was converted from ("" for a save).
    converted_from: str = ""


@dataclass(frozen=True)
class CheckpointResult:
    """A committed save, or a finished load."""
    name: str
    step: int
    bytes_written: int
    manifest_path: str


@dataclass(frozen=True)
class JobEvent:
    job: str
    state: str
    message: str
    unix_micros: int


@dataclass(frozen=True)
class StopResult:
    was_running: bool
    step: int


@dataclass
class TlsConfig:
    """PEM files, as the daemons' --tls-ca/--tls-cert/--tls-key take them.

    ``ca`` alone: TLS, the coordinator checked against it. With ``cert`` and
    ``key`` too: mutual TLS (the client's certificate, e.g. the `admin` one
    `flatshard certs init` writes). ``server_name`` is the name the
    coordinator's certificate must carry. Its default with ``ca``:
    ``flatshard-coordinator.invalid``, the role's name, which `flatshard certs
    init` puts in the coordinator's certificate and not in the workers' (the
    same CA signs both); without ``ca``: the host of the address, checked
    against the system's roots.
    """
    ca: Optional[str] = None
    cert: Optional[str] = None
    key: Optional[str] = None
    server_name: Optional[str] = None

"""flatshard: drive a fully sharded data parallel training cluster from Python.

    import flatshard
    with flatshard.Cluster("127.0.0.1:7070", token=...) as cluster:
        job = cluster.create_job("examples/gpt-job.yaml")
        for step in job.train(100):
            print(step.step, step.loss)
        job.save_checkpoint("after-100")
        weights = job.summon()                 # numpy arrays by FQN

`flatshard.checkpoint` reads checkpoints offline; `flatshard.from_torch` turns
a torch.nn.Module into a model spec; `flatshard.torch_modules` holds the torch
modules that match flatshard's composite types. See docs/python.md.
"""
from flatshard.cluster import Cluster, Job
from flatshard.errors import FlatshardError, JobFailed
from flatshard.results import (CheckpointInfo, CheckpointResult, JobEvent, JobStatus, Recovery,
                               StepResult, StopResult, TlsConfig, WorkerInfo)

__all__ = [
    "Cluster", "Job", "FlatshardError", "JobFailed", "CheckpointInfo", "CheckpointResult",
    "JobEvent", "JobStatus", "Recovery", "StepResult", "StopResult", "TlsConfig", "WorkerInfo",
]
__version__ = "0.1.0"

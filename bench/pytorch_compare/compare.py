"""flatshard against PyTorch FSDP1 and FSDP2 on CPU with Gloo, side by side.

    run.sh [--models mlp,mlp35m,gpt] [--worlds 2,4] [--precisions fp32,bf16] [--rounds 3]

For every (model, world size, precision) the three systems train the same model
from the same initial weights (flatshard's, summoned and loaded into
`flatshard.torch_modules.build(...)`) on the same data (.npy files both read,
rank r of W taking samples (s*B + r*B/W + i) mod N at step s), with AdamW and
the same hyperparameters, interleaved in rounds (flatshard, FSDP1, FSDP2,
flatshard, ...) so the machine's drift hits all three alike. Reported: median
step time per system and the ratios, the step-1 losses (they must agree: same
weights, same batch), each rank's peak RSS, and the time of a SHARDED save
against torch.distributed.checkpoint's save of the FSDP2 state (interleaved,
median of --rounds saves each).

flatshard's CPU GEMMs are OpenBLAS's, whose kernels OPENBLAS_CORETYPE can name
(a machine may set it: this project's dev machines set Haswell, AVX2, on an
AVX-512 CPU); torch's are its own and ignore it. --blas-core says what the
flatshard workers get: `env` leaves the environment as it is, `auto` unsets
the variable so OpenBLAS picks by CPU, anything else is set as the core name.
The workers log the kernels they run; the JSON records the setting.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "python"))
from local_cluster import LocalCluster  # noqa: E402

import flatshard  # noqa: E402
from google.protobuf import json_format  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def mlp_spec(width: int, hidden: int) -> Dict[str, Any]:
    """examples/mlp.yaml's shape: 4 Residual blocks of Linear-GELU-Linear."""
    return {"name": f"mlp-{width}", "root": {"type": "Sequential", "children": [
        {"name": "input", "type": "Linear", "in_features": 64, "out_features": width},
        {"name": "blocks", "repeat": 4, "template": {"type": "Residual", "children": [
            {"name": "fc1", "type": "Linear", "in_features": width, "out_features": hidden},
            {"name": "act", "type": "GELU"},
            {"name": "fc2", "type": "Linear", "in_features": hidden, "out_features": width}]}},
        {"name": "norm", "type": "LayerNorm", "normalized_shape": width},
        {"name": "output", "type": "Linear", "in_features": width, "out_features": 16}]}}


MODELS = {
    # name: (model, wrap type, global batch, data set)
    "mlp": (mlp_spec(256, 512), "Residual", 32, "dense"),
    "mlp35m": (mlp_spec(1536, 2816), "Residual", 32, "dense"),
    "gpt": (os.path.join(ROOT, "examples", "gpt-small.yaml"), "TransformerBlock", 16, "text"),
}


def make_data(work: str, bin_dir: str) -> Dict[str, str]:
    dense = os.path.join(work, "data", "dense")
    os.makedirs(dense, exist_ok=True)
    rng = np.random.default_rng(0)
    np.save(os.path.join(dense, "inputs.npy"), rng.standard_normal((4096, 64), dtype=np.float32))
    np.save(os.path.join(dense, "targets.npy"), rng.standard_normal((4096, 16), dtype=np.float32))
    text = os.path.join(work, "data", "text")
    licenses = [os.path.join("/usr/share/common-licenses", f) for f in
                ("GPL-3", "GPL-2", "LGPL-2.1", "GFDL-1.3", "Apache-2.0", "MPL-2.0")]
    subprocess.run([os.path.join(bin_dir, "flatshard"), "data", "prepare-text", *licenses,
                    "-o", text, "--seq-len", "64", "--squeeze-spaces"], check=True,
                   capture_output=True)
    return {"dense": dense, "text": os.path.join(text, "train")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TorchGroup:
    """W rank processes of one FSDP variant, driven over pipes."""

    def __init__(self, variant: str, world: int, setup: Dict[str, Any]) -> None:
        from torch_ranks import rank_main
        ctx = mp.get_context("spawn")
        port = free_port()
        self.pipes, self.procs = [], []
        for rank in range(world):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=rank_main, args=(rank, world, port, variant, setup, child),
                               daemon=True)
            proc.start()
            self.pipes.append(parent)
            self.procs.append(proc)
        for pipe in self.pipes:
            tag, _ = pipe.recv()
            assert tag == "ready"

    def ask(self, *command: Any) -> List[Any]:
        for pipe in self.pipes:
            pipe.send(command)
        return [pipe.recv() for pipe in self.pipes]

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(("exit",))
        for proc in self.procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()


def worker_peak_rss(up_pid: int) -> List[int]:
    out = subprocess.run(["pgrep", "-P", str(up_pid), "-f", "flatshard-worker"],
                         capture_output=True, text=True).stdout.split()
    peaks = []
    for pid in out:
        with open(f"/proc/{pid}/status") as f:
            peaks += [int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:")]
    return peaks


def run_config(cluster: flatshard.Cluster, local: LocalCluster, work: str, data: Dict[str, str],
               model: str, world: int, precision: str, rounds: int, steps: int) -> Dict[str, Any]:
    spec, block, batch, data_kind = MODELS[model]
    tokens = data_kind == "text"
    bf16 = precision == "bf16"
    name = f"{model}-w{world}-{precision}"
    job_doc = {
        "name": name, "model": spec, "world_size": world, "seed": 0,
        "wrap_policy": f"module-type:{block}",
        "sharding": {"strategy": "FULL_SHARD", "backward_prefetch": "BACKWARD_PRE",
                     "limit_all_gathers": True},
        "optimizer": {"kind": "adamw", "lr": 0.001, "weight_decay": 0.01},
        "data": {"kind": "file", "path": os.path.relpath(data[data_kind], work),
                 "global_batch_size": batch, **({"sequence_length": 64} if tokens else {})},
        "state_dict": {"type": "SHARDED_STATE_DICT"},
    }
    if bf16:
        job_doc["sharding"]["mixed_precision"] = {"param_dtype": "bfloat16",
                                                  "reduce_dtype": "float32"}
    job = cluster.create_job(job_doc)
    init = os.path.join(work, f"{name}-init.pt")
    import torch
    torch.save(job.summon(as_torch=True), init)
    setup = {"model_spec": json_format.MessageToDict(job.model_spec()), "init_weights": init,
             "block_types": [block], "bf16": bf16, "lr": 0.001, "weight_decay": 0.01,
             "data": data[data_kind], "tokens": tokens, "global_batch": batch}
    groups = {v: TorchGroup(v, world, setup) for v in ("fsdp1", "fsdp2")}
    times: Dict[str, List[float]] = {"flatshard": [], "fsdp1": [], "fsdp2": []}
    first_loss: Dict[str, float] = {}
    last_loss: Dict[str, float] = {}  # after `steps` steps: the trajectories agree
    try:
        step = 0
        for r in range(rounds + 1):  # round 0 warms every system up
            start = time.perf_counter()
            results = list(job.train(steps))
            elapsed = time.perf_counter() - start
            if r == 0:
                first_loss["flatshard"] = results[0].loss
                last_loss["flatshard"] = results[-1].loss
            else:
                times["flatshard"].append(elapsed / steps)
            for variant, group in groups.items():
                answers = group.ask("steps", step, steps)
                if r == 0:
                    first_loss[variant] = float(np.mean([a[1][0] for a in answers]))
                    last_loss[variant] = float(np.mean([a[1][-1] for a in answers]))
                else:
                    times[variant].append(answers[0][0] / steps)
            step += steps
        # Saves interleaved too (flatshard, DCP, flatshard, ...), median of
        # `rounds`; each to a fresh name / directory, removed after.
        saves: Dict[str, List[float]] = {"flatshard": [], "dcp": []}
        for r in range(rounds):
            start = time.perf_counter()
            job.save_checkpoint(f"bench-{r}", type="sharded")
            saves["flatshard"].append(time.perf_counter() - start)
            job.delete_checkpoint(f"bench-{r}")
            dcp_dir = os.path.join(work, f"{name}-dcp-{r}")
            saves["dcp"].append(max(groups["fsdp2"].ask("save", dcp_dir)))
            shutil.rmtree(dcp_dir, ignore_errors=True)
        flatshard_save = statistics.median(saves["flatshard"])
        dcp_save = statistics.median(saves["dcp"])
        rss = {v: max(g.ask("rss")) for v, g in groups.items()}
        rss["flatshard"] = max(worker_peak_rss(local.process.pid))
    finally:
        for group in groups.values():
            group.close()
        job.delete()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"config": name, "model": model, "world": world, "precision": precision,
            "params": sum(int(np.prod(v.shape)) for v in torch.load(init).values()),
            "step_s": med, "speedup_vs_fsdp1": med["fsdp1"] / med["flatshard"],
            "speedup_vs_fsdp2": med["fsdp2"] / med["flatshard"], "first_loss": first_loss,
            "last_loss": last_loss, "steps_per_round": steps,
            "peak_rss": rss, "save_s": {"flatshard_sharded": flatshard_save, "dcp": dcp_save}}


def summary(r: Dict[str, Any], steps: int) -> str:
    s, first, last, rss, save = (r["step_s"], r["first_loss"], r["last_loss"], r["peak_rss"],
                                 r["save_s"])
    return (f"{r['config']:<16} step ms flatshard {s['flatshard']*1e3:7.1f} fsdp1 "
            f"{s['fsdp1']*1e3:7.1f} fsdp2 {s['fsdp2']*1e3:7.1f} (x{r['speedup_vs_fsdp1']:.2f}, "
            f"x{r['speedup_vs_fsdp2']:.2f})  loss@1 {first['flatshard']:.5f} {first['fsdp1']:.5f} "
            f"{first['fsdp2']:.5f}  loss@{steps} {last['flatshard']:.5f} {last['fsdp1']:.5f} "
            f"{last['fsdp2']:.5f}  peak RSS MB {rss['flatshard']/2**20:.0f} "
            f"{rss['fsdp1']/2**20:.0f} {rss['fsdp2']/2**20:.0f}  save s "
            f"{save['flatshard_sharded']:.3f} dcp {save['dcp']:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--work", default="/tmp/flatshard-pytorch-compare")
    parser.add_argument("--models", default="mlp,mlp35m,gpt")
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="steps per system per round")
    parser.add_argument("--json", default="", help="also write the results here")
    parser.add_argument("--blas-core", default="env",
                        help="OPENBLAS_CORETYPE for flatshard's workers: env (as set), auto "
                             "(unset: OpenBLAS picks by CPU) or a core name")
    args = parser.parse_args()
    if args.blas_core == "auto":
        os.environ.pop("OPENBLAS_CORETYPE", None)
    elif args.blas_core != "env":
        os.environ["OPENBLAS_CORETYPE"] = args.blas_core
    blas_core = os.environ.get("OPENBLAS_CORETYPE", "auto")
    print(f"flatshard workers: OPENBLAS_CORETYPE={blas_core}", flush=True)
    os.makedirs(args.work, exist_ok=True)
    data = make_data(args.work, args.bin)
    results = []
    for world in map(int, args.worlds.split(",")):
        for model in args.models.split(","):
            # A cluster per model: a worker's peak RSS (VmHWM) never goes down,
            # so a reused worker would report the largest model it ever held.
            local = LocalCluster(args.bin, os.path.join(args.work, f"cluster-w{world}-{model}"),
                                 workers=world, data_dir=args.work)
            try:
                with flatshard.Cluster(local.address) as cluster:
                    for precision in args.precisions.split(","):
                        r = run_config(cluster, local, args.work, data, model, world, precision,
                                       args.rounds, args.steps)
                        r["openblas_coretype"] = blas_core
                        results.append(r)
                        print(summary(r, args.steps), flush=True)
            finally:
                local.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

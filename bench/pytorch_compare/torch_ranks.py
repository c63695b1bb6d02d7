"""PyTorch FSDP ranks for compare.py: W processes (Gloo on CPU) that build the
same model from flatshard's model spec, load the same initial weights, read the
same data, and run steps when told, so the two systems can be interleaved.

Each rank serves commands from a pipe: ("steps", s0, k) runs global steps
s0..s0+k-1 and returns (wall seconds, losses); ("save", dir) saves the model
and optimizer with torch.distributed.checkpoint; ("rss",) the rank's peak RSS.
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict

import numpy as np
import torch
import torch.distributed as dist
from torch import nn


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _wrap(model: nn.Module, variant: str, block_types: tuple, bf16: bool) -> nn.Module:
    if variant == "fsdp1":
        from torch.distributed.fsdp import (BackwardPrefetch, FullyShardedDataParallel,
                                            MixedPrecision, ShardingStrategy)
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
        return FullyShardedDataParallel(model, sharding_strategy=ShardingStrategy.FULL_SHARD,
                                        auto_wrap_policy=ModuleWrapPolicy(set(block_types)),
                                        backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
                                        mixed_precision=mp, limit_all_gathers=True,
                                        use_orig_params=False, device_id=torch.device("cpu"))
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if bf16 else MixedPrecisionPolicy())
    for module in model.modules():
        if isinstance(module, block_types):
            fully_shard(module, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def rank_main(rank: int, world: int, port: int, variant: str, setup: Dict[str, Any], pipe) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # as flatshard's workers: one BLAS thread per rank
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from flatshard import torch_modules
    model = torch_modules.build(setup["model_spec"])
    model.load_state_dict(torch.load(setup["init_weights"]), strict=True)
    block_types = tuple(getattr(torch_modules, t) for t in setup["block_types"])
    model = _wrap(model, variant, block_types, setup["bf16"])
    opt = torch.optim.AdamW(model.parameters(), lr=setup["lr"], weight_decay=setup["weight_decay"])
    inputs = np.load(os.path.join(setup["data"], "inputs.npy"))
    targets_file = "labels.npy" if setup["tokens"] else "targets.npy"
    targets = np.load(os.path.join(setup["data"], targets_file))
    n, batch = len(inputs), setup["global_batch"]
    local = batch // world

    def step(s: int) -> float:
        rows = [(s * batch + rank * local + i) % n for i in range(local)]
        x = torch.from_numpy(inputs[rows])
        y = torch.from_numpy(targets[rows])
        opt.zero_grad(set_to_none=True)
        out = model(x.long() if setup["tokens"] else x)
        if setup["tokens"]:
            loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]).float(),
                                               y.long().reshape(-1))
        else:
            loss = nn.functional.mse_loss(out.float(), y)
        loss.backward()
        opt.step()
        return loss.item()

    pipe.send(("ready", _peak_rss_bytes()))
    while True:
        command = pipe.recv()
        if command[0] == "steps":
            _, first, count = command
            dist.barrier()
            start = time.perf_counter()
            losses = [step(first + k) for k in range(count)]
            dist.barrier()
            pipe.send((time.perf_counter() - start, losses))
        elif command[0] == "save":
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict
            dist.barrier()
            start = time.perf_counter()
            model_state, optim_state = get_state_dict(model, opt)
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=command[1])
            dist.barrier()
            pipe.send(time.perf_counter() - start)
        elif command[0] == "rss":
            pipe.send(_peak_rss_bytes())
        else:
            break
    dist.destroy_process_group()

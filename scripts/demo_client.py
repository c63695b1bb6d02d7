"""The demo's Python part (scripts/demo.sh): the same cluster through the Python
client, then the loss curve as a PNG.

    demo_client.py ADDRESS JOB TRAIN_LOG OUT_PNG [STEP:VAL_LOSS ...]

TLS and the token come from FLATSHARD_TLS_CA/CERT/KEY and FLATSHARD_TOKEN_FILE,
as the CLI takes them.
"""
import os
import sys

import flatshard
from flatshard.plot import plot_losses, read_train_log

address, job_name, train_log, png = sys.argv[1:5]
validation = [(int(s), float(v)) for s, v in (arg.split(":") for arg in sys.argv[5:])]
token = None
if os.environ.get("FLATSHARD_TOKEN_FILE"):
    with open(os.environ["FLATSHARD_TOKEN_FILE"]) as f:
        token = f.read().strip()

with flatshard.Cluster(address, token=token) as cluster:
    job = cluster.job(job_name)
    status = job.status()
    print(f"  cluster.job({job_name!r}).status(): {status.state} at step {status.step}, "
          f"world size {status.world_size}, {status.units} FSDP units")
    for ckpt in job.checkpoints():
        print(f"  checkpoint {ckpt.name:<14} step {ckpt.step:>5}  {ckpt.state_dict_type:<19}"
              f" {ckpt.bytes / 1e6:6.1f} MB{'  (latest)' if ckpt.latest else ''}")
    weights = job.summon()
    params = sum(v.size for v in weights.values()) - sum(
        weights[t.alias_fqn].size for t in job.model_spec().tied)
    print(f"  job.summon(): {len(weights)} numpy arrays, {params:,} parameters "
          f"(tied lm_head.weight == wte.weight: "
          f"{bool((weights['lm_head.weight'] == weights['wte.weight']).all())})")

plot_losses(read_train_log(train_log), png, f"{job_name}: byte-level GPT on Debian's licenses",
            validation, vocab_size=256)
print(f"  wrote {png}")

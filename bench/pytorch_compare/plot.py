"""Bar chart of compare.py's results: plot.py RESULTS.json OUT.png."""
import json
import sys

import matplotlib

matplotlib.use("Agg")
from matplotlib import pyplot as plt  # noqa: E402

results = json.load(open(sys.argv[1]))
labels = [r["config"] for r in results]
systems = [("flatshard", "#08519c"), ("fsdp1", "#fd8d3c"), ("fsdp2", "#e6550d")]
fig, ax = plt.subplots(figsize=(11, 4.5), dpi=100)
width = 0.27
for k, (system, color) in enumerate(systems):
    # Each config normalised to FSDP1's step time, so all sizes share an axis.
    values = [r["step_s"][system] / r["step_s"]["fsdp1"] for r in results]
    ax.bar([i + (k - 1) * width for i in range(len(results))], values, width, label=system,
           color=color)
ax.axhline(1.0, color="gray", linewidth=0.8)
ax.set_xticks(range(len(results)))
ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=8)
ax.set_ylabel("step time / FSDP1's (lower is faster)")
ax.set_title("flatshard vs PyTorch FSDP1 / FSDP2, CPU + Gloo, 2 cores (bench/pytorch_compare)")
ax.legend(ncol=3, loc="upper left")
ax.set_ylim(0, 1.75)
ax.grid(axis="y", alpha=0.3)
fig.tight_layout()
fig.savefig(sys.argv[2])
print(f"wrote {sys.argv[2]}")

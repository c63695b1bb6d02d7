"""Plots training losses: ``python -m flatshard.plot TRAIN_LOG -o loss.png``.

TRAIN_LOG is what ``flatshard train --log FILE`` appends (one StepResult per
line, as JSON) or a list of `flatshard.StepResult`. Validation losses (from
``flatshard eval``) are drawn as points. Needs matplotlib (``flatshard[plot]``).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Dict, Iterable, List, Optional, Sequence, Tuple


def read_train_log(path: str) -> List[Tuple[int, float]]:
    """(step, loss) per line of a ``flatshard train --log`` file, in step order."""
    points: Dict[int, float] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                points[int(record["step"])] = float(record["loss"])
            except (ValueError, KeyError) as error:
                raise ValueError(f"{path}:{number}: not a step result ({error})") from None
    return sorted(points.items())


def plot_losses(steps: Sequence[Tuple[int, float]], output: str, title: str = "",
                validation: Iterable[Tuple[int, float]] = (),
                vocab_size: Optional[int] = None) -> None:
    """Writes a PNG of the training loss (and its moving average) and validation points."""
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed
    from matplotlib import pyplot as plt

    if not steps:
        raise ValueError("no training steps to plot")
    xs = [s for s, _ in steps]
    ys = [loss for _, loss in steps]
    window = max(1, len(ys) // 40)
    smooth = [sum(ys[max(0, i - window + 1):i + 1]) / len(ys[max(0, i - window + 1):i + 1])
              for i in range(len(ys))]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.plot(xs, ys, color="#9ecae1", linewidth=0.8, label="training loss (per step)")
    ax.plot(xs, smooth, color="#08519c", linewidth=1.8, label=f"moving average ({window} steps)")
    validation = list(validation)
    if validation:
        ax.plot([s for s, _ in validation], [v for _, v in validation], "o", color="#d62728",
                label="validation loss")
    if vocab_size:
        ax.axhline(math.log(vocab_size), color="gray", linestyle="--", linewidth=0.8,
                   label=f"uniform guess ln({vocab_size})")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per token)")
    ax.set_title(title or "flatshard training")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(output)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flatshard.plot", description=__doc__.split("\n")[0])
    parser.add_argument("train_log", help="a `flatshard train --log` file")
    parser.add_argument("-o", "--output", required=True, help="the PNG to write")
    parser.add_argument("--validation", action="append", default=[], metavar="STEP:LOSS",
                        help="a validation loss to mark (repeatable)")
    parser.add_argument("--vocab-size", type=int, help="draw the uniform guess ln(V)")
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    try:
        validation = [(int(s), float(v)) for s, v in (p.split(":") for p in args.validation)]
    except ValueError:
        print(f"plot: --validation takes STEP:LOSS, got {args.validation}", file=sys.stderr)
        return 2
    try:
        plot_losses(read_train_log(args.train_log), args.output, args.title, validation,
                    args.vocab_size)
    except (OSError, ValueError) as error:
        print(f"plot: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

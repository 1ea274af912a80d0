"""Draw the reward and eval curves of a run from its metrics.jsonl into a PNG.

    python tools/plot_metrics.py --metrics runs/tiny-moe-cpu/metrics.jsonl --output runs/tiny-moe-cpu/curve.png

The x axis is the rollout id. `rollout/raw_reward` is the mean reward of the samples generated
in that rollout; `eval/<dataset>` is the mean eval reward of the same weights (logged on the
rollout they generated), so both curves measure one policy at each x.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

logger = logging.getLogger("plot_metrics")


def read_series(path: Path) -> dict[str, list[tuple[int, float]]]:
    """{metric: [(rollout_id, value), ...]} for the reward and eval metrics of a metrics.jsonl,
    sorted by rollout id; a rollout logged twice (a resumed run repeats rows) keeps its last value."""
    series: dict[str, dict[int, float]] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not JSON ({e.msg})") from e
        for key, value in row.items():
            wanted = key == "rollout/raw_reward" or (key.startswith("eval/") and key.count("/") == 1)
            if wanted and value is not None:
                series.setdefault(key, {})[row["rollout_id"]] = float(value)
    return {key: sorted(points.items()) for key, points in series.items()}


def plot(series: dict[str, list[tuple[int, float]]], output: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for key in sorted(series):
        xs, ys = zip(*series[key])
        ax.plot(xs, ys, marker="o" if key.startswith("eval/") else None, markersize=3, label=key)
    ax.set_xlabel("rollout id")
    ax.set_ylabel("mean reward")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics", type=Path, required=True, help="metrics.jsonl of a run")
    parser.add_argument("--output", type=Path, required=True, help="PNG to write")
    parser.add_argument("--title", default="GRPO: train reward and eval accuracy")
    args = parser.parse_args()
    series = read_series(args.metrics)
    if not series:
        raise SystemExit(f"{args.metrics}: no rollout/raw_reward or eval/<dataset> values to plot")
    plot(series, args.output, args.title)
    logger.info("wrote %s", args.output)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main()

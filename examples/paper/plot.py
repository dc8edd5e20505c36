"""Accuracy curves per algorithm (mean +- std over seeds) from the paper app's results files.

    python examples/paper/plot.py results/paper/fashion-mnist-quick   # writes accuracy.png there
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np


def load_runs(folder: Path) -> dict[str, list[dict]]:
    """Results files of ``folder`` grouped by algorithm."""
    runs: dict[str, list[dict]] = defaultdict(list)
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        runs[str(data["run_config"]["algorithm"])].append(data)
    return dict(runs)


def curve(run: dict, part: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    points = sorted((int(r), m[part][key]) for r, m in run["rounds"].items() if key in m.get(part, {}))
    return np.array([p[0] for p in points]), np.array([p[1] for p in points])


def plot_accuracy(folder: Path, out: Path | None = None) -> Path:
    """Draw client-mean test accuracy after (solid) and before (dashed) aggregation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = load_runs(folder)
    if not runs:
        raise FileNotFoundError(f"no results files in {folder}")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, group) in enumerate(sorted(runs.items())):
        color = f"C{i}"
        for part, key, style in (("evaluate", "acc-after", "-"), ("train", "acc-before", "--")):
            curves = [curve(run, part, key) for run in group]
            length = min(len(c[0]) for c in curves)
            if length == 0:
                continue
            rounds = curves[0][0][:length]
            acc = np.stack([c[1][:length] for c in curves])
            label = f"{name} ({'after' if part == 'evaluate' else 'before'} aggregation, n={len(group)})"
            ax.plot(rounds, acc.mean(0), style, color=color, label=label)
            if len(group) > 1:
                ax.fill_between(rounds, acc.mean(0) - acc.std(0), acc.mean(0) + acc.std(0),
                                color=color, alpha=0.15)
    ax.set_xlabel("round")
    ax.set_ylabel("client-mean test accuracy")
    ax.set_title(folder.name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    out = out or folder / "accuracy.png"
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    for folder in parser.parse_args().folders:
        print(plot_accuracy(folder))


if __name__ == "__main__":
    main()

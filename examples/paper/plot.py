"""Accuracy curves per algorithm (mean and 95% CI over seeds) and inertia heatmaps from result files.

Result files are read with :func:`lips_flwr.experiments.runner.store.read_result`
(the runner's files and those of earlier sessions); the paper app's own
record (``run_config``, ``rounds``, ``summary``) is what is plotted.

    python examples/paper/plot.py results/paper/fashion-mnist-quick             # accuracy.png
    python examples/paper/plot.py results/paper/fashion-mnist-quick --heatmaps  # + <run>-heatmap.png
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np

from lips_flwr.experiments.runner.store import read_result


def app_record(path: Path) -> dict:
    """The paper app's own record of a result file (``run_config``, ``rounds``, ``summary``)."""
    record = read_result(path).app
    if record is None:
        raise ValueError(f"{str(path)!r} holds no results of the paper app")
    return record


def load_runs(folder: Path, paths: list[Path] | None = None) -> dict[str, list[dict]]:
    """The result files ``paths`` (default: every ``*.json`` of ``folder``) grouped by algorithm."""
    runs: dict[str, list[dict]] = defaultdict(list)
    for path in sorted(folder.glob("*.json")) if paths is None else paths:
        data = app_record(path)
        runs[str(data["run_config"]["algorithm"])].append(data)
    return dict(runs)


def curve(run: dict, part: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    points = sorted((int(r), m[part][key]) for r, m in run["rounds"].items() if key in m.get(part, {}))
    return np.array([p[0] for p in points]), np.array([p[1] for p in points])


def mask_rounds(runs: dict[str, list[dict]]) -> list[int]:
    """The rounds in which any run masked (``lips-mask-round`` 1 in its train metrics)."""
    return sorted({int(r) for group in runs.values() for run in group
                   for r, m in run["rounds"].items() if m.get("train", {}).get("lips-mask-round")})


def setup_line(runs: dict[str, list[dict]]) -> str:
    """``20 clients x 100 samples, Dir(0.1), 30 rounds`` from the runs' settings (what is known of it)."""
    run = next(iter(runs.values()))[0]
    conf = run["run_config"]
    parts = []
    total = run["rounds"].get("1", {}).get("train", {}).get("num-examples")
    samples = conf.get("samples-per-client")
    if total and samples:  # round 1's clients train on their samples less the validation split
        trained = round(float(samples) * (1 - float(conf.get("val-fraction", 0.0))))
        clients = round(float(total) / trained / float(conf.get("fraction-train", 1.0)))
        parts.append(f"{clients} clients x {samples} samples")
    if "alpha" in conf:
        parts.append(f"Dir({conf['alpha']})")
    if "num-server-rounds" in conf:
        parts.append(f"{conf['num-server-rounds']} rounds")
    if "local-epochs" in conf:
        parts.append(f"{conf['local-epochs']} local epochs")
    return ", ".join(parts)


def mean_ci(values: np.ndarray, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray | None]:
    """Mean over seeds (axis 0) and the half-width of its t confidence interval (``None`` for one seed)."""
    mean = values.mean(0)
    if values.shape[0] < 2:
        return mean, None
    from scipy import stats

    n = values.shape[0]
    return mean, stats.t.ppf(0.5 + confidence / 2, n - 1) * values.std(0, ddof=1) / np.sqrt(n)


def plot_accuracy(folder: Path, out: Path | None = None, runs: list[Path] | None = None) -> Path:
    """Client-mean test accuracy after (solid) and before (dashed) aggregation, mean and 95% CI over seeds.

    The setup (clients, samples, alpha, rounds) is stated under the title, the
    rounds in which LIPS masked are marked (dotted), and the legend sits
    beside the axes, never over the data. ``runs``: the result files to plot
    (default: every one of ``folder``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_algorithm = load_runs(folder, runs)
    if not by_algorithm:
        raise FileNotFoundError(f"no results files in {folder}")
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    masked = mask_rounds(by_algorithm)
    for r in masked:
        ax.axvline(r, color="0.6", lw=0.6, ls=":", zorder=0)
    seeds = set()
    for i, (name, group) in enumerate(sorted(by_algorithm.items())):
        color = f"C{i}"
        seeds.add(len(group))
        for part, key, style in (("evaluate", "acc-after", "-"), ("train", "acc-before", "--")):
            curves = [curve(run, part, key) for run in group]
            length = min(len(c[0]) for c in curves)
            if length == 0:
                continue
            rounds = curves[0][0][:length]
            mean, half = mean_ci(np.stack([c[1][:length] for c in curves]))
            label = f"{name}, {'after' if part == 'evaluate' else 'before'} aggregation (n={len(group)})"
            ax.plot(rounds, mean, style, color=color, label=label)
            if half is not None:
                ax.fill_between(rounds, mean - half, mean + half, color=color, alpha=0.15)
    if masked:
        ax.plot([], [], color="0.6", lw=0.6, ls=":", label="LIPS mask rounds")
    ax.set_xlabel("round")
    ax.set_ylabel("client-mean test accuracy")
    spread = "mean and 95% CI over seeds" if max(seeds) > 1 else "one seed"
    ax.set_title(f"{folder.name}: {spread}\n{setup_line(by_algorithm)}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the data, not over it
    out = out or folder / "accuracy.png"
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_heatmap(results: Path, out: Path | None = None, key: str = "inertia-cos-t0") -> Path:
    """Layers x rounds heatmap of one run's cosine similarity to round t0 (the paper's Figure 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = app_record(results)
    rounds = sorted(data["rounds"], key=int)
    layers: list[str] = []
    for r in rounds:
        for name in data["rounds"][r].get("train", {}):
            if name.startswith(f"{key}/") and name[len(key) + 1:] not in layers:
                layers.append(name[len(key) + 1:])
    if not layers:
        raise ValueError(f"{results} has no {key}/* metrics (run with inertia-t0 > 0)")
    grid = np.full((len(layers), len(rounds)), np.nan)
    for j, r in enumerate(rounds):
        train = data["rounds"][r].get("train", {})
        for i, layer in enumerate(layers):
            grid[i, j] = train.get(f"{key}/{layer}", np.nan)
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(layers) + 1.8))
    image = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=np.nanmin(grid), vmax=1.0,
                      extent=(int(rounds[0]) - 0.5, int(rounds[-1]) + 0.5, len(layers) - 0.5, -0.5))
    ax.set_yticks(range(len(layers)), layers, fontsize=7)
    ax.set_xlabel("round")
    cfg = data["run_config"]
    ax.set_title(f"{cfg.get('algorithm')} seed {cfg.get('seed')}: {key} (t0={cfg.get('inertia-t0')})")
    fig.colorbar(image, ax=ax, label="cosine similarity")
    out = out or results.with_name(results.stem + "-heatmap.png")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--heatmaps", action="store_true", help="also one heatmap per results file")
    args = parser.parse_args()
    for folder in args.folders:
        print(plot_accuracy(folder))
        if args.heatmaps:
            for results in sorted(folder.glob("*.json")):
                print(plot_heatmap(results))


if __name__ == "__main__":
    main()

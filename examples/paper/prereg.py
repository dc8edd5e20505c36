"""The pre-registered study (PROTOCOL.md): run it, resumably, and report it.

    python examples/paper/prereg.py run --regime cpu --jobs 2     # runs what is missing; stop and re-run at will
    python examples/paper/prereg.py report                         # tables, tests, verdicts, figures
    python examples/paper/prereg.py run --regime gpu --jobs 16    # on one GPU machine (regime b: one run per core)

The runs go through the one experiment runner
(:func:`lips_flwr.experiments.runner.sweep.run_sweep`): each is
``<out>/<conf>/<method>-seed<k>.json``, written when it has finished, with
its identity and provenance. A finished run of the same identity is reused
(the committed runs predate identities: their run config is compared); a
file of other settings, such as a small trial's, stops ``run`` before
anything runs, naming the keys (``--recompute`` replaces them). A stopped run
continues from its last round on the next ``run`` (its LIPS checkpoint and
its clients' FedBN state wait in ``<out>/.staging/``). ``dataset-path`` is
where the data is, not what it is: it is left out of a run's identity, so a
run may continue on a machine that keeps the data elsewhere. Runs go seed by
seed, so that a study stopped early still has every method on the same
seeds. ``report`` uses every finished file and says how many seeds each
comparison has.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

import numpy as np

APP = Path(__file__).resolve().parent
sys.path.insert(0, str(APP))
from plot import mask_rounds  # noqa: E402

from lips_flwr.experiments import stats  # noqa: E402
from lips_flwr.experiments.runner.apps import num_supernodes, parse_overrides  # noqa: E402
from lips_flwr.experiments.runner.runs import RunSpec, run_name  # noqa: E402
from lips_flwr.experiments.stats import holm, paired, verdict  # noqa: E402
from lips_flwr.experiments.runner.store import read_result  # noqa: E402
from lips_flwr.experiments.runner.sweep import SweepFailed, run_sweep  # noqa: E402

ROOT = APP.parents[1]
OUT = ROOT / "docs" / "results" / "prereg"
SEEDS = tuple(range(1000, 1006))
PRIMARY = ("fedbn", "lips", "lips-random", "lips-inertia")
SECONDARY = ("lips-magnitude", "lips-all", "fedbn-dropout", "fedbn-wd", "freeze")
# (conf, methods) in the order they run; each stage seed by seed.
PLAN = {
    "cpu": [("prereg-fmnist-dir0.1", PRIMARY), ("prereg-fmnist-dir1.0", ("fedbn", "lips")),
            ("prereg-fmnist-dir0.1", SECONDARY)],
    "gpu": [("prereg-fmnist-gpu-dir0.1", PRIMARY)],
}
# Each run's process environment. Regime (b) runs one process per core: numpy's OpenBLAS would
# start a thread per core in each (16 x 16 on the GPU machine), and on a loaded machine its
# threaded sums cost more than they save (a ClientApp call ~1.5x slower at 2 runs on 2 cores,
# benchmarks/README.md section 8); its sums also depend on the thread count, so one thread
# makes a run's numbers those of any machine's core count. Regime (a) keeps the defaults
# its committed runs had.
RUN_ENV = {"cpu": {}, "gpu": {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}}
HYPOTHESES = {"H1": ("lips", "fedbn"), "H2": ("lips", "lips-random"), "H3": ("lips-inertia", "fedbn")}
SECONDARY_PAIRS = [("lips-inertia", "lips"), *((m, "fedbn") for m in SECONDARY)]
LAST = 10  # the endpoint's rounds


def load_conf(name: str) -> tuple[dict, int]:
    conf = tomllib.loads((APP / "conf" / f"{name}.toml").read_text())
    return conf, int(conf.pop("federation", {}).get("num-supernodes", 10))


def run_specs(regime: str, engine: str, seeds: tuple[int, ...], overrides: list[str] | None = None,
              num_nodes: int | None = None) -> list[RunSpec]:
    """The runs of ``regime``, stage by stage and seed by seed (``overrides``/``num_nodes``: a trial).

    Each run's process gets the regime's environment (:data:`RUN_ENV`) before its imports.
    """
    specs = []
    for conf_name, methods in PLAN[regime]:
        values, federation = parse_overrides([str(APP / "conf" / f"{conf_name}.toml"), *(overrides or [])])
        nodes = num_nodes or num_supernodes(federation)
        for seed in seeds:
            for method in methods:
                specs.append(RunSpec(APP, run_name(f"{conf_name}/{method}", seed), seed,
                                     {**values, "algorithm": method},
                                     num_nodes=nodes, engine=engine, env=RUN_ENV[regime],
                                     location_keys=("dataset-path",)))
    return specs


def run(regime: str, out: Path, jobs: int, engine: str, seeds: tuple[int, ...], overrides: list[str] | None = None,
        num_nodes: int | None = None, recompute: bool = False) -> list[Path]:
    """Every run of ``regime`` not finished yet into ``out`` (see the module docstring)."""
    specs = run_specs(regime, engine, seeds, overrides, num_nodes)
    print(f"{len(specs)} runs in regime {regime} ({jobs} at a time; finished ones are reused)", flush=True)
    return run_sweep(specs, out, jobs=jobs, recompute=recompute, progress=lambda line: print(line, flush=True))


# ----------------------------------------------------------------------------- report

def series(data: dict, part: str, key: str) -> dict[int, float]:
    return {int(r): m[part][key] for r, m in data["rounds"].items() if key in m.get(part, {})}


def endpoint(data: dict, part: str = "evaluate", key: str = "acc-after") -> float | None:
    """Mean of ``key`` over the last :data:`LAST` rounds; ``None`` when one of them is missing."""
    last = int(data["run_config"]["num-server-rounds"])
    values = series(data, part, key)
    wanted = range(last - LAST + 1, last + 1)
    return float(np.mean([values[r] for r in wanted])) if all(r in values for r in wanted) else None


def load_folder(folder: Path) -> dict[str, dict[int, dict]]:
    """The paper app's records of the folder's result files, by method and seed."""
    runs: dict[str, dict[int, dict]] = {}
    for path in sorted(folder.glob("*-seed*.json")):
        data = read_result(path).app or {}
        runs.setdefault(str(data["run_config"]["algorithm"]), {})[int(data["run_config"]["seed"])] = data
    return runs


def without_provenance(folder: Path) -> tuple[int, int]:
    """(result files of ``folder`` written before the runner recorded provenance, all result files)."""
    paths = sorted(folder.glob("*-seed*.json"))
    return sum(read_result(p).provenance is None for p in paths), len(paths)


def _mean_sd(values: list[float]) -> str:
    """``mean +- SD`` (ddof = 1) of per-seed endpoints; one seed's value as it is; ``-`` for none."""
    if len(values) > 1:
        return f"{np.mean(values):.4f} +- {np.std(values, ddof=1):.4f}"
    return f"{values[0]:.4f} (one seed)" if values else "-"


def compare(runs: dict, a: str, b: str, part: str = "evaluate", key: str = "acc-after") -> dict | None:
    pairs = [(s, endpoint(runs[a][s], part, key), endpoint(runs[b][s], part, key))
             for s in sorted(set(runs.get(a, {})) & set(runs.get(b, {})))]
    pairs = [(s, x, y) for s, x, y in pairs if x is not None and y is not None]  # a run too short has none
    seeds, diffs = [s for s, _, _ in pairs], [x - y for _, x, y in pairs]
    return {**paired(diffs), "seeds": seeds, "differences": diffs} if len(diffs) >= 2 else None


def inertia_rho(data: dict, middle: list[str], edges: list[str]) -> dict | None:
    """``rho_l`` = late / early mean relative step per layer of a run's record (:func:`stats.inertia_rho`)."""
    steps = {layer: series(data, "train", f"inertia-rel-step/{layer}") for layer in middle + edges}
    return stats.inertia_rho(steps, middle, edges, int(data["run_config"]["num-server-rounds"]))


def setbacks(data: dict) -> list[tuple[float, int | None]]:
    """(set-back, rounds to recover or None) for each mask round >= 6 that zeroed weights."""
    train, after = data["rounds"], series(data, "evaluate", "acc-after")
    every = int(data["run_config"]["every"])
    out = []
    for t in sorted(int(r) for r in train):
        metrics = train[str(t)].get("train", {})
        if t < 6 or not metrics.get("lips-mask-round") or not metrics.get("lips-zeros"):
            continue
        if t in after and t - 1 in after:
            recovered = next((k for k in range(1, every) if after.get(t + k, -1) >= after[t - 1]), None)
            out.append((after[t] - after[t - 1], 0 if after[t] >= after[t - 1] else recovered))
    return out


def layer_groups(conf_name: str) -> tuple[list[str], list[str]]:
    """(middle, first-and-last) weight layers of the regime's model, as LIPS selects them."""
    import torch  # noqa: F401 - the model is built to read its layer names only

    from lips_flwr.core.layers import select_layers
    from lips_flwr.experiments.task.data import DATASET_INFO
    from lips_flwr.experiments.task.models import build_model

    conf, _ = load_conf(conf_name)
    classes, channels = DATASET_INFO[conf["dataset"]]
    model = {k: v.numpy() for k, v in build_model(conf["model"], classes, channels).state_dict().items()}
    middle = select_layers(model, "middle")
    return middle, [n for n in select_layers(model, "all") if n not in middle]


def report_conf(conf_name: str, folder: Path, family: dict[str, tuple[str, str]],
                exploratory: tuple[tuple[str, str], ...] = ()) -> tuple[list[str], dict]:
    """Markdown lines and a JSON summary for one regime's folder.

    ``family``: the confirmatory hypotheses, tested with Holm's correction and
    given a verdict; ``exploratory``: pairs reported without correction or
    verdict, first among the secondary rows (PROTOCOL.md: Dir(1.0)'s FedBN vs LIPS).
    """
    runs = load_folder(folder)
    lines = [f"## {conf_name}", "", "| method | seeds | endpoint (after, last 10) | before, last 10 |",
             "| --- | --- | --- | --- |"]
    for method, by_seed in sorted(runs.items()):
        after = [e for e in (endpoint(d) for d in by_seed.values()) if e is not None]
        before = [e for e in (endpoint(d, "train", "acc-before") for d in by_seed.values()) if e is not None]
        lines.append(f"| {method} | {len(by_seed)} | {_mean_sd(after)} | {_mean_sd(before)} |")
    summary: dict = {"hypotheses": {}, "secondary": {}}
    tests = {h: compare(runs, a, b) for h, (a, b) in family.items()}
    tests = {h: t for h, t in tests.items() if t is not None}
    adjusted = holm({h: t["p_t"] for h, t in tests.items()})
    if family:
        lines += ["", "| hypothesis | difference | seeds | mean | 95% CI | p (t) | p (sign) | p Holm | verdict |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for h, t in tests.items():
        a, b = family[h]
        t["p_holm"], t["verdict"] = adjusted[h], verdict(t, adjusted[h])
        summary["hypotheses"][h] = t
        lines.append(f"| {h} | {a} - {b} | {t['n']} | {100 * t['mean']:+.2f} pt | "
                     f"[{100 * t['ci_low']:+.2f}, {100 * t['ci_high']:+.2f}] | {t['p_t']:.3f} | "
                     f"{t['p_sign']:.3f} | {t['p_holm']:.3f} | {t['verdict']} |")
    pairs = [*exploratory, *SECONDARY_PAIRS,
             *(((a, b), "train", "acc-before") for a, b in (*exploratory, *family.values()))]
    rows = []
    for pair in pairs:
        (a, b), part, key = (pair, "evaluate", "acc-after") if isinstance(pair[0], str) else pair
        t = compare(runs, a, b, part, key)
        if t is not None:
            summary["secondary"][f"{a} - {b} ({key})"] = t
            rows.append(f"| {a} - {b} | {key} | {t['n']} | {100 * t['mean']:+.2f} pt | "
                        f"[{100 * t['ci_low']:+.2f}, {100 * t['ci_high']:+.2f}] | {t['p_t']:.3f} | {t['p_sign']:.3f} |")
    if rows:
        lines += ["", "Secondary, exploratory (no correction):", "",
                  "| difference | accuracy | seeds | mean | 95% CI | p (t) | p (sign) |", "| --- | --- | --- | --- | --- | --- | --- |",
                  *rows]
    middle, edges = layer_groups(conf_name)
    rhos = [r for r in (inertia_rho(d, middle, edges) for d in runs.get("fedbn", {}).values()) if r is not None]
    if rhos:
        found = stats.inertia_verdict(rhos)
        summary["inertia"] = {"runs": found["runs"], "arises_in": found["arises_in"], "rho": rhos}
        lines += ["", f"Inertia (FedBN, late/early relative step): middle layers' median rho "
                      f"{found['middle']:.3f}, first/last layers' mean rho "
                      f"{found['edges']:.3f} (medians over seeds); "
                      f"inertia arises in {found['arises_in']} of {found['runs']} runs "
                      f"({found['verdict']} by the protocol's rule)."]
    for method in ("lips", "lips-random", "lips-inertia"):
        events = [e for d in runs.get(method, {}).values() for e in setbacks(d)]
        if events:
            drops = np.array([e[0] for e in events])
            recovered = [e[1] for e in events if e[1] is not None]
            summary.setdefault("setbacks", {})[method] = {"events": len(events), "median": float(np.median(drops)),
                                                          "worse_than_1pt": float(np.mean(drops < -0.01))}
            lines.append(f"- {method}: {len(events)} mask rounds; median set-back {100 * np.median(drops):+.2f} pt, "
                         f"{100 * np.mean(drops < -0.01):.0f}% worse than -1 pt; recovered within the cycle in "
                         f"{len(recovered)} of {len(events)}, median {np.median(recovered) if recovered else '-'} rounds")
    return lines, summary


def figures(conf_name: str, folder: Path, family: dict) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scipy import stats as st

    runs = load_folder(folder)
    first = next(iter(next(iter(runs.values())).values()))
    conf = first["run_config"]  # the runs' own settings (a trial's overrides included)
    nodes = int(first["rounds"]["1"]["train"]["num-examples"]) // int(conf["samples-per-client"])
    setup = (f"{nodes} clients x {conf['samples-per-client']} samples, Dir({conf['alpha']}), "
             f"{conf['num-server-rounds']} rounds, {conf['local-epochs']} local epochs")
    out = []
    masked = mask_rounds({"lips": list(runs.get("lips", {}).values())}) if runs.get("lips") else []
    primary = sorted({m for pair in family.values() for m in pair} & set(runs))
    secondary = sorted(set(runs) - set(primary))
    sets = [("accuracy.png", primary, "")]
    if secondary:  # the controls and variants apart, each beside the base
        sets.append(("secondary.png", [m for m in ("fedbn", *secondary) if m in runs],
                     "secondary methods (exploratory), "))
    for name, methods, kind in sets:
        fig, ax = plt.subplots(figsize=(8, 4.8))
        for r in masked:  # the schedule's mask rounds (every method that masks uses it)
            ax.axvline(r, color="0.6", lw=0.6, ls=":", zorder=0)
        if masked:
            ax.plot([], [], color="0.6", lw=0.6, ls=":", label="LIPS mask rounds")
        for i, method in enumerate(methods):
            curves = [series(d, "evaluate", "acc-after") for d in runs[method].values()]
            rounds = sorted(set.intersection(*(set(c) for c in curves)))
            acc = np.array([[c[r] for r in rounds] for c in curves])
            mean = acc.mean(0)
            # Dashed past the first two, so that curves that coincide (fedbn, lips-inertia) both show.
            ax.plot(rounds, mean, color=f"C{i}", ls="-" if i < 2 else "--",
                    label=f"{method} (n={len(curves)})")
            if len(curves) > 1:
                half = st.t.ppf(0.975, len(curves) - 1) * acc.std(0, ddof=1) / np.sqrt(len(curves))
                ax.fill_between(rounds, mean - half, mean + half, color=f"C{i}", alpha=0.15)
        ax.set(xlabel="round", ylabel="client-mean test accuracy, after aggregation", ylim=(0, 1))
        ax.set_title(f"{conf_name}: {kind}mean and 95% CI over seeds\n{setup}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the data, not over it
        fig.tight_layout()
        fig.savefig(folder / name, dpi=120)
        plt.close(fig)
        out.append(folder / name)
    tests = {h: compare(runs, a, b) for h, (a, b) in family.items()}
    tests = {h: t for h, t in tests.items() if t is not None}
    if tests:
        fig, ax = plt.subplots(figsize=(7, 3.8))
        for i, (h, t) in enumerate(tests.items()):
            ax.scatter([i] * t["n"], 100 * np.array(t["differences"]), color="0.5", s=14, zorder=2)
            ax.errorbar([i + 0.15], [100 * t["mean"]], yerr=[[100 * (t["mean"] - t["ci_low"])],
                        [100 * (t["ci_high"] - t["mean"])]], fmt="o", color="C3", capsize=4, zorder=3)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(range(len(tests)), [f"{h}: {' - '.join(family[h])}" for h in tests], fontsize=8)
        ax.set_ylabel("paired difference (points)")
        ax.set_title(f"{conf_name}: per-seed differences (grey), mean and 95% CI (red)\n{setup}", fontsize=9)
        fig.tight_layout()
        fig.savefig(folder / "differences.png", dpi=120)
        plt.close(fig)
        out.append(folder / "differences.png")
    middle, edges = layer_groups(conf_name)
    pair = [m for m in ("fedbn", "lips") if runs.get(m)]
    if pair:
        fig, axes = plt.subplots(1, len(pair), figsize=(6 * len(pair), 3.6), squeeze=False)
        layers = [edges[0], *middle, *edges[1:]]
        steps = {method: [series(runs[method][min(runs[method])], "train", f"inertia-rel-step/{n}")
                          for n in layers] for method in pair}  # each method's first seed
        rounds_all = range(1, int(conf["num-server-rounds"]) + 1)
        grids = {method: np.log10(np.maximum(np.array([[s.get(r, np.nan) for r in rounds_all] for s in rows]),
                                             1e-6)) for method, rows in steps.items()}
        found = [g[np.isfinite(g)] for g in grids.values()]
        found = [g for g in found if g.size] or [np.zeros(1)]  # (a run without the metrics: a blank panel)
        low, high = min(g.min() for g in found), max(g.max() for g in found)  # one scale for both
        for ax, method in zip(axes[0], pair):
            grid = grids[method]
            image = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=low, vmax=high,
                              extent=(0.5, grid.shape[1] + 0.5, len(layers) - 0.5, -0.5))
            ax.set_yticks(range(len(layers)), layers, fontsize=7)
            ax.set(xlabel="round", title=f"{method}, seed {min(runs[method])}: log10 relative step")
            fig.colorbar(image, ax=ax)
        fig.suptitle(setup, fontsize=9)
        fig.tight_layout()
        fig.savefig(folder / "relative-step.png", dpi=120)
        plt.close(fig)
        out.append(folder / "relative-step.png")
    return out


def report(out: Path) -> None:
    lines = ["# Pre-registered study: results", "", "Protocol: [examples/paper/PROTOCOL.md]"
             "(../../../examples/paper/PROTOCOL.md). Accuracies are fractions; differences in points.", ""]
    summary = {}
    old = total = 0
    for conf_name in sorted({c for stages in PLAN.values() for c, _ in stages}):
        folder = out / conf_name
        if not folder.is_dir() or not any(folder.glob("*-seed*.json")):
            continue
        missing, found = without_provenance(folder)
        old, total = old + missing, total + found
        # H1-H3 with Holm in regime (a) Dir(0.1) and in (b); Dir(1.0) is exploratory (PROTOCOL.md).
        confirmatory = conf_name.endswith("dir0.1")
        family = HYPOTHESES if confirmatory else {}
        exploratory = () if confirmatory else (HYPOTHESES["H1"],)
        conf_lines, summary[conf_name] = report_conf(conf_name, folder, family, exploratory)
        shown = {**family, **{"exploratory": pair for pair in exploratory}}
        names = ", ".join(f"`{p.name}`" for p in figures(conf_name, folder, shown))
        lines += conf_lines + ["", f"Figures in `{conf_name}/`: {names}.", ""]
    if old:  # (after the header paragraph)
        lines[4:4] = [f"{old} of the {total} result files predate provenance: they were written before the runner "
                      "recorded a run's identity (code version, engine) and environment (library versions, CPU, "
                      "threads), and are read as they are.", ""]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True, default=float) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("run", "report"))
    parser.add_argument("--regime", choices=tuple(PLAN), default="cpu")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--engine", choices=("auto", "sequential", "stacked"), default="auto")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="run-config overrides: a data location (dataset-path), or a small trial "
                             "into another --out (never the study's settings)")
    parser.add_argument("--num-supernodes", type=int, default=None, help="for a small trial")
    parser.add_argument("--recompute", action="store_true",
                        help="run again (and replace) result files computed with other settings")
    args = parser.parse_args()
    if args.what == "run":
        try:
            run(args.regime, args.out.resolve(), args.jobs, args.engine,
                tuple(int(s) for s in args.seeds.split(",")), args.set, args.num_supernodes, args.recompute)
        except (SweepFailed, ValueError) as err:
            raise SystemExit(str(err)) from None
    report(args.out.resolve())


if __name__ == "__main__":
    main()

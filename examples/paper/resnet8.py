"""The ResNet8 study (RESNET8.md): its runs and its report.

    python examples/paper/resnet8.py run --jobs 2 --seeds 3000,3001   # a batch: whole seeds, arm by arm
    python examples/paper/resnet8.py report                          # docs/results/resnet8/report.{md,json}, cosine.png

``run`` makes the study's runs through the project's experiment runner
(:func:`lips_flwr.experiments.runner.run_sweep`): one result file per run,
``docs/results/resnet8/<arm>-seed<k>.json``, with its identity and
provenance, each run in a process of one thread. A finished run is reused, a
stopped one continues from its last round, a file of other settings or code
is refused (RESNET8.md: every run from the protocol's commit, checked out
apart).

``report`` computes what RESNET8.md fixed before any run: H1 (LIPS - FedBN)
and H2 (LIPS - LIPS-random) on the endpoint with Holm over the two, the
secondary comparisons, the cosine inertia measure and its rule on each run,
the mechanism check, the set-backs (``setbacks.py``'s definition), and
``cosine.png``. Until every arm of every seed exists it names what is
missing and gives no verdict and no decision.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

APP = Path(__file__).resolve().parent
sys.path.insert(0, str(APP))
from pilot import layers_of  # noqa: E402
from prereg import LAST, compare, endpoint, inertia_rho, load_folder, series  # noqa: E402
from provenance import provenance  # noqa: E402
from setbacks import SECONDARY_THRESHOLD, THRESHOLD, count_regime, regime_lines  # noqa: E402

from lips_flwr.experiments.runner import RunSpec, run_sweep  # noqa: E402
from lips_flwr.experiments.runner.apps import num_supernodes, parse_overrides  # noqa: E402
from lips_flwr.experiments.runner.runs import run_name  # noqa: E402
from lips_flwr.experiments.runner.sweep import SweepFailed  # noqa: E402
from lips_flwr.experiments.stats import holm, paired, verdict  # noqa: E402

OUT = APP.parents[1] / "docs" / "results" / "resnet8"
CONF = APP / "conf" / "resnet8-n100.toml"
ARMS = ("fedbn", "lips", "lips-random")
SEEDS = tuple(range(3000, 3006))
HYPOTHESES = {"H1": ("lips", "fedbn"), "H2": ("lips", "lips-random")}
SECONDARY_PAIRS = (("lips-random", "fedbn"),)
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
COS = "inertia-cos-t0/"
MIDDLE_COSINE = 0.95  # the paper's Figure 1 signature: middle layers above ~0.95
FACTOR = 0.5  # D_mid < FACTOR * D_edge
CELL_MIN_RUNS = 5  # of the 6 FedBN runs
ALPHA = 0.05


# ----------------------------------------------------------------------------- runs

def run_specs(seeds: tuple[int, ...] = SEEDS, engine: str = "auto") -> list[RunSpec]:
    """The study's runs of ``seeds``, seed by seed and arm by arm, each in a process of one thread."""
    unknown = sorted(set(seeds) - set(SEEDS))
    if unknown:
        raise SystemExit(f"seeds {unknown} are not the study's; RESNET8.md fixes {list(SEEDS)}")
    values, federation = parse_overrides([str(CONF)])
    return [RunSpec(APP, run_name(arm, seed), seed, {**values, "algorithm": arm},
                    num_nodes=num_supernodes(federation), engine=engine, env=ONE_THREAD,
                    location_keys=("dataset-path",))
            for seed in seeds for arm in ARMS]


def run(results: Path, seeds: tuple[int, ...], jobs: int, recompute: bool = False) -> list[Path]:
    """Every run of ``seeds`` not finished yet into ``results`` (see the module docstring)."""
    specs = run_specs(seeds)
    print(f"{len(specs)} runs of the ResNet8 study ({jobs} at a time; finished ones are reused)", flush=True)
    return run_sweep(specs, results, jobs=jobs, recompute=recompute, progress=lambda line: print(line, flush=True))


# ----------------------------------------------------------------------------- the inertia measure

def cosines(data: dict, at: int | None = None) -> dict[str, float]:
    """Each weight layer's cosine to its round-``inertia-t0`` weights at round ``at`` (default: the last)."""
    last = int(data["run_config"]["num-server-rounds"]) if at is None else at
    train = data["rounds"].get(str(last), {}).get("train", {})
    names, _, _ = layers_of(data)
    return {n: float(train[COS + n]) for n in names if COS + n in train}


def cosine_inertia(data: dict) -> dict | None:
    """RESNET8.md's measure of one run: every layer's cosine at the last round, ``D_mid``, ``D_edge``, the rule.

    ``None`` when a layer has no cosine at the last round (a run too short).
    """
    names, middle, edges = layers_of(data)
    cos = cosines(data)
    if set(cos) != set(names):
        return None
    d_mid = float(np.median([1.0 - cos[n] for n in middle]))
    d_edge = float(np.mean([1.0 - cos[n] for n in edges]))
    arises = (1.0 - d_mid) >= MIDDLE_COSINE and d_mid < FACTOR * d_edge
    return {"cosine": cos, "middle_cosine": 1.0 - d_mid, "d_mid": d_mid, "d_edge": d_edge,
            "ratio": d_mid / d_edge if d_edge > 0 else None, "arises": bool(arises)}


def paired_on(runs: dict, a: str, b: str, value) -> dict | None:
    """Paired test of ``value(run)`` between arms ``a`` and ``b`` over their common seeds (>= 2)."""
    seeds = sorted(set(runs.get(a, {})) & set(runs.get(b, {})))
    pairs = [(s, value(runs[a][s]), value(runs[b][s])) for s in seeds]
    pairs = [(s, x, y) for s, x, y in pairs if x is not None and y is not None]
    diffs = [x - y for _, x, y in pairs]
    return {**paired(diffs), "seeds": [s for s, _, _ in pairs], "differences": diffs} if len(diffs) >= 2 else None


def d_mid(data: dict) -> float | None:
    measured = cosine_inertia(data)
    return None if measured is None else measured["d_mid"]


# ----------------------------------------------------------------------------- analysis

def missing_runs(runs: dict) -> list[str]:
    """The study's runs without a result file, as ``<arm>-seed<k>``."""
    return [run_name(arm, seed) for seed in SEEDS for arm in ARMS if seed not in runs.get(arm, {})]


def analyse(folder: Path) -> dict:
    """Every number RESNET8.md asks for, from the result files of ``folder``."""
    runs = load_folder(folder)
    missing = missing_runs(runs)
    complete = not missing
    endpoints = {arm: {s: {"after": endpoint(d), "before": endpoint(d, "train", "acc-before")}
                       for s, d in sorted(runs.get(arm, {}).items())} for arm in ARMS}
    tests = {h: compare(runs, a, b) for h, (a, b) in HYPOTHESES.items()}
    tests = {h: t for h, t in tests.items() if t is not None}
    adjusted = holm({h: t["p_t"] for h, t in tests.items()}) if len(tests) == len(HYPOTHESES) else {}
    for h, t in tests.items():
        t["pair"] = list(HYPOTHESES[h])
        if complete:  # no verdict over runs not made
            t["p_holm"], t["verdict"] = adjusted[h], verdict(t, adjusted[h], ALPHA)
    secondary = {}
    for a, b in SECONDARY_PAIRS:
        if (t := compare(runs, a, b)) is not None:
            secondary[f"{a} - {b} (acc-after)"] = t
    for a, b in HYPOTHESES.values():
        if (t := compare(runs, a, b, "train", "acc-before")) is not None:
            secondary[f"{a} - {b} (acc-before)"] = t
    inertia = {arm: {s: cosine_inertia(d) for s, d in sorted(runs.get(arm, {}).items())} for arm in ARMS}
    base = [v for v in inertia["fedbn"].values() if v is not None]
    premise = {"runs": len(base), "arises_in": sum(v["arises"] for v in base),
               "holds": len(base) == len(SEEDS) and sum(v["arises"] for v in base) >= CELL_MIN_RUNS}
    pace = {}
    for s, data in sorted(runs.get("fedbn", {}).items()):
        _, middle, edges = layers_of(data)
        pace[s] = inertia_rho(data, middle, edges)
    mechanism = {f"{arm} - fedbn": t for arm in ("lips", "lips-random")
                 if (t := paired_on(runs, arm, "fedbn", d_mid)) is not None}
    moves = mechanism.get("lips - fedbn")
    mechanism_verdict = None  # True: LIPS moves the middle layers; False: it does not; "no test": zero variance
    if moves is not None and complete:
        mechanism_verdict = ("no test" if np.isnan(moves["p_t"])
                             else bool(moves["p_t"] < ALPHA and moves["ci_low"] > 0))
    return {"runs": {arm: sorted(runs.get(arm, {})) for arm in ARMS}, "missing": missing, "complete": complete,
            "endpoints": endpoints, "hypotheses": tests, "secondary": secondary,
            "inertia": {"per_run": inertia, "premise": premise, "pace_rule": pace},
            "mechanism": {"tests": mechanism, "lips_moves_middle_layers": mechanism_verdict},
            "setbacks": {"primary": count_regime(folder, THRESHOLD) if runs else {},
                         "secondary": count_regime(folder, SECONDARY_THRESHOLD) if runs else {}}}


def decision_lines(result: dict) -> list[str]:
    """RESNET8.md's decision, in its order; nothing but the missing runs until the study is complete."""
    lines = ["## Decision (RESNET8.md)", ""]
    if not result["complete"]:
        return lines + [f"Not run yet: {', '.join(result['missing'])}. No verdict and no decision are drawn "
                        "until every arm of every seed exists; the numbers below are of the finished seeds "
                        "only.", ""]
    premise, tests = result["inertia"]["premise"], result["hypotheses"]
    if premise["holds"]:
        lines.append(f"1. Premise: cosine inertia arises in {premise['arises_in']} of {premise['runs']} FedBN "
                     "runs: LIPS is tested where its premise holds.")
    else:
        lines.append(f"1. Premise: cosine inertia arises in {premise['arises_in']} of {premise['runs']} FedBN "
                     "runs only: the pilot's observation did not hold in this study's own runs, and H1 and H2 "
                     "test LIPS where its premise does not hold.")
    h1, h2 = tests["H1"], tests["H2"]
    ci = f"{100 * h1['mean']:+.2f} points, 95% CI [{100 * h1['ci_low']:+.2f}, {100 * h1['ci_high']:+.2f}]"
    where = "where its premise holds" if premise["holds"] else "in this cell"
    lines.append({"supported": f"2. H1 supported ({ci}): LIPS helps over FedBN {where}; one cell, so a "
                               "replication comes before any wider claim.",
                  "contradicted": f"2. H1 contradicted ({ci}): LIPS makes FedBN worse {where}.",
                  }.get(h1["verdict"], f"2. H1: {h1['verdict']} ({ci}): LIPS did not help {where}; the CI is the "
                                       "range of effects the six seeds cannot rule out."))
    lines.append({"supported": "3. H2 supported: the sensitivity score matters (random masks do worse).",
                  "contradicted": "3. H2 contradicted: random masks do better than the sensitivity score.",
                  }.get(h2["verdict"], f"3. H2: {h2['verdict']}: the study cannot tell the score from any "
                                       "sparsity."))
    moves = result["mechanism"]["lips_moves_middle_layers"]
    if moves == "no test":
        lines.append("4. Mechanism: every seed gave the same difference of D_mid: no test (zero variance).")
    elif not moves:
        lines.append("4. Mechanism: LIPS did not move the middle layers' cosine away from FedBN's: the paper's "
                     "mechanism (breaking the inertia) did not act here, whatever H1 says.")
    elif h1["verdict"] != "supported":
        lines.append("4. Mechanism: LIPS moved the middle layers, yet H1 found no gain: breaking the inertia "
                     "did not translate into accuracy here.")
    else:
        lines.append("4. Mechanism: LIPS moved the middle layers, and H1 found a gain.")
    return lines + [""]


# ----------------------------------------------------------------------------- report

def _pt(t: dict) -> str:
    return (f"{100 * t['mean']:+.2f} pt | [{100 * t['ci_low']:+.2f}, {100 * t['ci_high']:+.2f}] | "
            f"{t['p_t']:.3f} | {t['p_sign']:.3f}")


def report_lines(result: dict) -> list[str]:
    lines = ["# The ResNet8 study: results", "",
             "Protocol: [examples/paper/RESNET8.md](../../../examples/paper/RESNET8.md). Generated by "
             "`examples/paper/resnet8.py report`; every number and its provenance are in `report.json`. "
             f"Endpoint: per run, the mean of the client-mean accuracy after aggregation over the last {LAST} "
             "rounds; differences in points, paired by seed.", "", *decision_lines(result),
             "## Endpoints", "", "| arm | seeds | after aggregation, per seed | before aggregation, per seed |",
             "| --- | --- | --- | --- |"]
    for arm, by_seed in result["endpoints"].items():
        after = ", ".join(f"{s}: {v['after']:.4f}" for s, v in by_seed.items() if v["after"] is not None)
        before = ", ".join(f"{s}: {v['before']:.4f}" for s, v in by_seed.items() if v["before"] is not None)
        lines.append(f"| {arm} | {len(by_seed)} | {after or '-'} | {before or '-'} |")
    lines += ["", "## Hypotheses (Holm over H1 and H2)", "",
              "| hypothesis | difference | seeds | mean | 95% CI | p (t) | p (sign) | p Holm | verdict |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for h, t in result["hypotheses"].items():
        holm_p = f"{t['p_holm']:.3f}" if "p_holm" in t else "-"
        lines.append(f"| {h} | {' - '.join(t['pair'])} | {t['n']} | {_pt(t)} | {holm_p} | "
                     f"{t.get('verdict', 'not yet (runs missing)')} |")
    if result["secondary"]:
        lines += ["", "Secondary, exploratory (no correction, no verdict):", "",
                  "| difference | seeds | mean | 95% CI | p (t) | p (sign) |", "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {name} | {t['n']} | {_pt(t)} |" for name, t in result["secondary"].items()]
    premise = result["inertia"]["premise"]
    lines += ["", "## Inertia: cosine to round 2 at the last round", "",
              "`D` = 1 - cosine; cosine inertia arises in a run when the middle layers' median cosine is >= "
              f"{MIDDLE_COSINE} and `D_mid` < {FACTOR} `D_edge` (RESNET8.md: chosen after the pilot). FedBN: "
              f"it arises in {premise['arises_in']} of {premise['runs']} runs (the cell needs "
              f"{CELL_MIN_RUNS} of 6). The pace rule of PILOT.md (`rho`, middle median / first-last mean) is "
              "beside it.", "",
              "| arm | seed | first layer | middle median | last layer | D_mid / D_edge | arises | rho middle / edges |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm, by_seed in result["inertia"]["per_run"].items():
        for seed, m in by_seed.items():
            if m is None:
                lines.append(f"| {arm} | {seed} | - | - | - | - | - | - |")
                continue
            cos = list(m["cosine"].values())
            rho = result["inertia"]["pace_rule"].get(seed) if arm == "fedbn" else None
            rho_text = f"{rho['middle']:.4f} / {rho['edges']:.4f}" if rho else "-"
            ratio = "-" if m["ratio"] is None else f"{m['ratio']:.3f}"
            lines.append(f"| {arm} | {seed} | {cos[0]:.4f} | {m['middle_cosine']:.4f} | {cos[-1]:.4f} | "
                         f"{ratio} | {'yes' if m['arises'] else 'no'} | {rho_text} |")
    lines += ["", "## Mechanism: does LIPS move the middle layers? (`D_mid` paired with FedBN)", "",
              "| difference of D_mid | seeds | mean | 95% CI | p (t) | p (sign) |", "| --- | --- | --- | --- | --- | --- |"]
    for name, t in result["mechanism"]["tests"].items():
        lines.append(f"| {name} | {t['n']} | {t['mean']:+.4f} | [{t['ci_low']:+.4f}, {t['ci_high']:+.4f}] | "
                     f"{t['p_t']:.3f} | {t['p_sign']:.3f} |")
    lines += ["", "![Cosine to round 2 per layer group and arm](cosine.png)", "",
              "## Set-backs (exploratory; the study's addendum's definition)", ""]
    for level, label in (("primary", "a fall of >= 10 points"), ("secondary", "a fall of >= 5 points")):
        if result["setbacks"][level]:
            lines += regime_lines("resnet8-n100", result["setbacks"][level], label)
    return lines


def cosine_figure(folder: Path, out: Path) -> Path | None:
    """Per arm, the mean over seeds of the first layer's, the middle median's and the last layer's cosine."""
    runs = load_folder(folder)
    if not runs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8), sharey=True)
    for ax, group in zip(axes, ("first layer", "middle layers (median)", "last layer")):
        for i, arm in enumerate(a for a in ARMS if runs.get(a)):
            curves = []
            for data in runs[arm].values():
                names, middle, _ = layers_of(data)
                pick = {"first layer": [names[0]], "last layer": [names[-1]]}.get(group, middle)
                rows = [series(data, "train", COS + n) for n in pick]
                rounds = sorted(set.intersection(*(set(r) for r in rows)))
                curves.append({t: float(np.median([r[t] for r in rows])) for t in rounds})
            rounds = sorted(set.intersection(*(set(c) for c in curves)))
            ax.plot(rounds, [np.mean([c[t] for c in curves]) for t in rounds], color=f"C{i}",
                    label=f"{arm} (n={len(curves)})")
        ax.set(title=group, xlabel="round")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("cosine to round 2 (mean over seeds)")
    axes[-1].legend(fontsize=8, loc="lower left")
    fig.suptitle("ResNet8, 20 clients x 100 samples, Dir(0.1), 100 rounds: cosine to round-2 weights", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def report(results: Path, out: Path) -> dict:
    """``report.md``, ``report.json`` and ``cosine.png`` into ``out`` from the result files of ``results``."""
    inputs = sorted(results.glob("*-seed*.json"))
    if not inputs:
        raise SystemExit(f"no result files (<arm>-seed<k>.json) in {results}")
    result = analyse(results)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "report.md", out / "report.json", out / "cosine.png"]
    cosine_figure(results, paths[2])
    paths[0].write_text("\n".join(report_lines(result)) + "\n")
    record = {**result, "provenance": provenance(inputs, paths, Path(__file__)),
              "protocol": "examples/paper/RESNET8.md",
              "rule": {"middle_cosine": MIDDLE_COSINE, "factor": FACTOR, "cell_min_runs": CELL_MIN_RUNS,
                       "alpha": ALPHA, "endpoint_rounds": LAST}}
    paths[1].write_text(json.dumps(record, indent=1, sort_keys=True, default=float) + "\n")
    print(paths[0].read_text())
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("run", "report"))
    parser.add_argument("--results", type=Path, default=OUT, help="the study's result files")
    parser.add_argument("--out", type=Path, default=None, help="where the report goes (default: --results)")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="run: the seeds of this batch")
    parser.add_argument("--jobs", type=int, default=1, help="run: runs at once")
    parser.add_argument("--recompute", action="store_true", help="run: replace result files of other settings")
    args = parser.parse_args()
    if args.what == "run":
        try:
            run(args.results.resolve(), tuple(int(s) for s in args.seeds.split(",")), args.jobs, args.recompute)
        except (SweepFailed, ValueError) as err:
            raise SystemExit(str(err)) from None
    report(args.results.resolve(), (args.out or args.results).resolve())


if __name__ == "__main__":
    main()

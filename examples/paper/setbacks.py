"""Set-backs of the accuracy in every committed run of the pre-registered study.

    python examples/paper/setbacks.py            # docs/results/prereg/setbacks.{md,json,png}

The definition, the strata and the intervals are PROTOCOL.md's addendum of
2026-12-03, written before this was computed. A set-back is a round ``t`` whose
``acc-after`` falls by at least 10 points from round ``t - 1``; its recovery is
the rounds until ``acc-after`` is back within 1 point of ``a(t-1)`` (censored
at the run's end), its depth how far below ``a(t-1)`` the run went meanwhile.
Counted per run and stratum (mask rounds, the rounds after a mask, the other
rounds; rounds 2-50 and 51-100), summed per method with a percentile
bootstrap over runs, and compared per seed with FedBN's run of the same seed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

APP = Path(__file__).resolve().parent
sys.path.insert(0, str(APP))
from prereg import OUT, load_folder, series  # noqa: E402
from provenance import provenance  # noqa: E402

from lips_flwr.core.schedule import MaskSchedule  # noqa: E402
from lips_flwr.experiments.stats import paired  # noqa: E402

THRESHOLD = 0.10  # the primary set-back: a fall of at least 10 points
SECONDARY_THRESHOLD = 0.05
TOLERANCE = 0.01  # recovered: back within 1 point of the level before the fall
EARLY_LAST = 50  # early rounds 2-50, late rounds 51-100
RESAMPLES = 10_000
EPS = 1e-9  # accuracies are sums of fractions: a fall of exactly 10 points may come out 1e-16 short
STRATA = ("all", "mask", "after-mask", "other", "early", "late")
CONTROL = "fedbn"


@dataclass(frozen=True)
class SetBack:
    """One set-back: the round, its fall and depth (fractions), and the rounds until it was regained."""

    round: int
    fall: float
    depth: float
    recovery: int  # rounds until regained; when censored, the rounds observed after it (it took longer)
    censored: bool


def find_setbacks(acc: dict[int, float], last: int, threshold: float = THRESHOLD,
                  tolerance: float = TOLERANCE) -> list[SetBack]:
    """Every round ``t`` in ``2..last`` with ``acc[t] <= acc[t-1] - threshold``, with its recovery and depth.

    ``acc`` maps rounds to ``acc-after``; a round missing from it is not
    judged, nor is the round after it, and a missing round cannot end a
    recovery. The recovery is the smallest ``k >= 1`` with
    ``acc[t+k] >= acc[t-1] - tolerance``; censored when no round up to ``last``
    gets there (``recovery`` is then ``last - t``, the rounds seen without it).
    The depth is ``acc[t-1]`` minus the lowest accuracy from ``t`` until the
    recovery (to ``last`` when censored).
    """
    out = []
    for t in range(2, last + 1):
        if t not in acc or t - 1 not in acc or acc[t - 1] - acc[t] < threshold - EPS:
            continue
        level = acc[t - 1]
        regained = (u for u in range(t + 1, last + 1) if u in acc and acc[u] >= level - tolerance - EPS)
        back = next(regained, None)
        window = [acc[u] for u in range(t, (back if back is not None else last + 1)) if u in acc]
        out.append(SetBack(round=t, fall=level - acc[t], depth=level - min(window),
                           recovery=(back - t) if back is not None else last - t, censored=back is None))
    return out


def masked_rounds(data: dict) -> set[int]:
    """The rounds whose aggregate was masked: train metric ``lips-zeros`` above 0."""
    return {int(r) for r, m in data["rounds"].items() if m.get("train", {}).get("lips-zeros", 0) > 0}


def schedule_rounds(last: int, every: int) -> set[int]:
    """The schedule's rounds ``t`` with ``(t - 1) % every == 0``: a placebo for a method that never masks."""
    return {t for t in range(1, last + 1) if (t - 1) % every == 0}


def method_masks(method: str) -> bool:
    """Whether ``method`` masks at all (has a LIPS score): its mask rounds are then the recorded ones."""
    from lips_paper.algorithms import algorithm

    return algorithm(method).score is not None


def round_strata(t: int, masks: set[int]) -> tuple[str, ...]:
    """The strata round ``t`` belongs to, given the (recorded or placebo) mask rounds."""
    place = "mask" if t in masks else "after-mask" if t - 1 in masks else "other"
    return ("all", place, "early" if t <= EARLY_LAST else "late")


def count_run(data: dict, masks: set[int], threshold: float = THRESHOLD, placebo: bool = False) -> dict:
    """One run's rounds judged and set-backs per stratum, and its set-backs.

    Each set-back also records its place (``mask``, ``after-mask``, ``other``)
    and, unless ``masks`` are a placebo, the last mask at or before it: its
    round and ``tau(t)`` (the run's ``tau0``, ``every`` and rounds).
    """
    conf = data["run_config"]
    last = int(conf["num-server-rounds"])
    acc = series(data, "evaluate", "acc-after")
    judged = [t for t in range(2, last + 1) if t in acc and t - 1 in acc]
    counts = {s: {"rounds": 0, "setbacks": 0} for s in STRATA}
    for t in judged:
        for s in round_strata(t, masks):
            counts[s]["rounds"] += 1
    events = []
    for event in find_setbacks(acc, last, threshold):
        for s in round_strata(event.round, masks):
            counts[s]["setbacks"] += 1
        before = [m for m in masks if m <= event.round]
        last_mask = None
        if before and not placebo:
            schedule = MaskSchedule(last, float(conf["tau0"]), int(conf["every"]))
            last_mask = {"round": max(before), "tau": schedule.tau(max(before))}
        events.append({**asdict(event), "place": round_strata(event.round, masks)[1], "last_mask": last_mask})
    return {"seed": int(conf["seed"]), "counts": counts, "events": events}


def bootstrap_frequency(setbacks: list[int], rounds: list[int], resamples: int = RESAMPLES) -> dict:
    """Total set-backs / total rounds of the runs; 95% percentile bootstrap over runs (``default_rng(0)``)."""
    k, n = np.asarray(setbacks, dtype=float), np.asarray(rounds, dtype=float)
    out = {"setbacks": int(k.sum()), "rounds": int(n.sum()), "runs": int(k.size),
           "frequency": float(k.sum() / n.sum()) if n.sum() else float("nan")}
    if k.sum() == 0 or k.size < 2:  # [0, 0] would say nothing: no interval
        return {**out, "ci_low": None, "ci_high": None}
    pick = np.random.default_rng(0).integers(0, k.size, size=(resamples, k.size))
    freq = k[pick].sum(1) / n[pick].sum(1)
    low, high = np.percentile(freq, [2.5, 97.5])
    return {**out, "ci_low": float(low), "ci_high": float(high)}


def median_recovery(events: list[dict]) -> str:
    """Median recovery; a censored one counts as longer than any observed (``> k`` when the median is one)."""
    if not events:
        return "-"
    ordered = sorted(events, key=lambda e: (e["censored"], e["recovery"]))
    middle = ordered[(len(ordered) - 1) // 2: len(ordered) // 2 + 1]
    if any(e["censored"] for e in middle):
        return f"> {middle[0]['recovery']}"
    return f"{np.mean([e['recovery'] for e in middle]):g}"


def summarize_method(runs: list[dict]) -> dict:
    """Per stratum the pooled frequency with its interval; the set-backs' median fall, depth and recovery."""
    strata = {s: bootstrap_frequency([r["counts"][s]["setbacks"] for r in runs],
                                     [r["counts"][s]["rounds"] for r in runs]) for s in STRATA}
    events = [e for r in runs for e in r["events"]]
    return {"strata": strata, "runs_with_setback": sum(1 for r in runs if r["events"]),
            "median_fall": float(np.median([e["fall"] for e in events])) if events else None,
            "median_depth": float(np.median([e["depth"] for e in events])) if events else None,
            "median_recovery": median_recovery(events), "censored": sum(e["censored"] for e in events)}


def against_control(runs: list[dict], control: list[dict]) -> dict:
    """Per stratum, the mean over seeds of (this run's rate - FedBN's same-seed rate), 95% t interval."""
    base = {r["seed"]: r for r in control}
    out = {}

    def rate(run: dict, stratum: str) -> float | None:
        counts = run["counts"][stratum]
        return counts["setbacks"] / counts["rounds"] if counts["rounds"] else None

    for s in STRATA:
        pairs = [(rate(r, s), rate(base[r["seed"]], s)) for r in runs if r["seed"] in base]
        diffs = [a - b for a, b in pairs if a is not None and b is not None]
        if len(diffs) >= 2:
            out[s] = {**paired(diffs), "differences": diffs}
    return out


def count_regime(folder: Path, threshold: float) -> dict:
    """Every method of one regime folder: its runs' counts, its summary and its comparison with FedBN."""
    by_method = {}
    for method, by_seed in sorted(load_folder(folder).items()):
        masks_at_all = method_masks(method)
        runs = []
        for _, data in sorted(by_seed.items()):
            conf = data["run_config"]
            masks = masked_rounds(data) if masks_at_all else schedule_rounds(
                int(conf["num-server-rounds"]), int(conf["every"]))
            runs.append(count_run(data, masks, threshold, placebo=not masks_at_all))
        by_method[method] = {"masks": "recorded" if masks_at_all else "placebo (the schedule's rounds)",
                             "runs": runs, "summary": summarize_method(runs)}
    control = by_method.get(CONTROL, {}).get("runs", [])
    for method, entry in by_method.items():
        if method != CONTROL and control:
            entry["vs_fedbn"] = against_control(entry["runs"], control)
    return by_method


# ----------------------------------------------------------------------------- output

def _pct(entry: dict) -> str:
    """``0.51% [0.17, 1.01] (3/594)``; no interval when there is no set-back."""
    head = f"{100 * entry['frequency']:.2f}%"
    if entry["ci_low"] is not None:
        head += f" [{100 * entry['ci_low']:.2f}, {100 * entry['ci_high']:.2f}]"
    return f"{head} ({entry['setbacks']}/{entry['rounds']})"


def _diff(entry: dict | None) -> str:
    """``+0.17 [-0.63, +0.97]``; without an interval when every seed has the same difference."""
    if entry is None:
        return "-"
    head = f"{100 * entry['mean']:+.2f}"
    if math.isnan(entry["ci_low"]):  # no spread to build one on (lips_flwr.experiments.stats.paired)
        return f"{head} (every seed the same)"
    return f"{head} [{100 * entry['ci_low']:+.2f}, {100 * entry['ci_high']:+.2f}]"


def _events(runs: list[dict], most: int = 30) -> str:
    """Each set-back as ``seed: r<round> -fall/-depth pt, recovery``; past ``most``, see the JSON."""
    parts = [f"{r['seed']}: r{e['round']} -{100 * e['fall']:.1f}/-{100 * e['depth']:.1f} pt, "
             + (f"> {e['recovery']} rounds (censored)" if e["censored"] else f"{e['recovery']} rounds")
             for r in runs for e in r["events"]]
    return ("; ".join(parts) or "none") if len(parts) <= most else "(in setbacks.json)"


def regime_lines(name: str, methods: dict, label: str) -> list[str]:
    """Markdown tables for one regime and one threshold."""
    lines = [f"### {name}, {label}", "",
             "Frequency of set-backs per round judged, in %, with the 95% bootstrap interval over runs "
             "(set-backs / rounds judged); the mask columns are the recorded mask rounds, or for a method "
             "that never masks the schedule's rounds (6, 11, ..., 96) as a placebo.", "",
             "| method | masks | runs with one | all rounds | mask rounds | after a mask | other rounds "
             "| rounds 2-50 | rounds 51-100 |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for method, entry in methods.items():
        s = entry["summary"]
        masks = entry["masks"].split(" ")[0]
        head = f"| {method} | {masks} | {s['runs_with_setback']} of {len(entry['runs'])} | "
        lines.append(head + " | ".join(_pct(s["strata"][k]) for k in STRATA) + " |")
    lines += ["", "Against FedBN's run of the same seed: mean difference of the per-run rates, in points of "
              "%, with its 95% t interval over seeds (FedBN's mask columns are its placebo rounds).", "",
              "| method | all rounds | mask rounds | after a mask | other rounds | rounds 2-50 "
              "| rounds 51-100 |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for method, entry in methods.items():
        if "vs_fedbn" in entry:
            cells = " | ".join(_diff(entry["vs_fedbn"].get(k)) for k in STRATA)
            lines.append(f"| {method} | {cells} |")
    lines += ["", "The set-backs (seed: round, fall / depth in points, recovery):", "",
              "| method | set-backs | median fall | median depth | median recovery (rounds) | censored "
              "| each |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for method, entry in methods.items():
        s = entry["summary"]
        fall = "-" if s["median_fall"] is None else f"{100 * s['median_fall']:.1f} pt"
        depth = "-" if s["median_depth"] is None else f"{100 * s['median_depth']:.1f} pt"
        lines.append(f"| {method} | {s['strata']['all']['setbacks']} | {fall} | {depth} | "
                     f"{s['median_recovery']} | {s['censored']} | {_events(entry['runs'])} |")
    return lines + [""]


def reading(primary: dict) -> list[str]:
    """LIPS's set-backs per regime and what they suggest for ``tau0`` (numbers from ``primary``)."""
    lines, taus = ["## Reading: LIPS at the paper's tau0 = 0.5, set-backs of >= 10 points", ""], []
    for regime, methods in primary.items():
        if "lips" not in methods:
            continue
        lips, control = methods["lips"], methods.get(CONTROL)
        strata, summary = lips["summary"]["strata"], lips["summary"]
        at_masks = [e for r in lips["runs"] for e in r["events"] if e["place"] == "mask"]
        taus += [e["last_mask"]["tau"] for e in at_masks]
        text = (f"- {regime}: LIPS set a run back in {_pct(strata['mask'])} of its mask rounds, "
                f"{_pct(strata['after-mask'])} of the rounds right after one and {_pct(strata['other'])} of "
                f"the others")
        if control:
            text += f"; FedBN in {_pct(control['summary']['strata']['all'])} of its rounds"
        if at_masks:
            text += (f". Its set-backs at mask rounds came in rounds {min(e['round'] for e in at_masks)}-"
                     f"{max(e['round'] for e in at_masks)}, where tau(t) was "
                     f"{max(e['last_mask']['tau'] for e in at_masks):.3f} down to "
                     f"{min(e['last_mask']['tau'] for e in at_masks):.3f}")
        if summary["median_fall"] is not None:
            text += (f"; the median set-back fell {100 * summary['median_fall']:.1f} points and was regained "
                     f"in a median of {summary['median_recovery']} rounds")
        lines.append(text + ".")
        for r in lips["runs"]:
            for e in (e for e in r["events"] if e["censored"]):
                mask = e["last_mask"]
                where = f"; the last mask before it was round {mask['round']}, tau(t) = {mask['tau']:.3f}"
                lines.append(f"  Seed {r['seed']}'s set-back in round {e['round']} (a fall of "
                             f"{100 * e['fall']:.1f} points) was not regained by the last round"
                             f"{where if mask else ''}.")
    censored = any(e["censored"] for m in primary.values() for r in m.get("lips", {}).get("runs", [])
                   for e in r["events"])
    if taus:
        lines += ["", "For choosing tau0: `tau(t) = tau0 * (1 - (t - 1) / T)`, so a smaller tau0 lowers "
                  "every mask's fraction. In these runs no LIPS mask round with tau(t) below "
                  f"{min(taus):.2f} was itself a set-back, but the study ran only tau0 = 0.5: that is a "
                  "hint, not a threshold" + (", and a run can still fall in the rounds after a small mask "
                                             "(the set-back not regained, above)." if censored else ".")]
    for entry in (m["lips-inertia"] for m in primary.values() if "lips-inertia" in m):
        masks = entry["summary"]["strata"]["mask"]
        setbacks = entry["summary"]["strata"]["all"]["setbacks"]
        lines.append(f"The inertia trigger masked in {masks['rounds']} rounds of its {len(entry['runs'])} "
                     f"runs; its runs had {setbacks} set-backs.")
    return lines + [""]


def figure(results: dict, out: Path) -> Path:
    """Frequency per method (all rounds, mask rounds, after a mask) and every set-back's depth by round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    primary = results["primary"]
    rows = [(regime, method, entry) for regime, methods in primary.items()
            for method, entry in methods.items()]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 0.32 * len(rows) + 2.2),
                                      gridspec_kw={"width_ratios": [1.2, 1]})
    for i, (_, _, entry) in enumerate(rows):
        for j, (stratum, marker) in enumerate((("all", "o"), ("mask", "v"), ("after-mask", "^"))):
            s = entry["summary"]["strata"][stratum]
            y = i + (j - 1) * 0.22
            left.plot(100 * s["frequency"], y, marker, color=f"C{j}", ms=5)
            if s["ci_low"] is not None:
                left.plot([100 * s["ci_low"], 100 * s["ci_high"]], [y, y], color=f"C{j}", lw=1.2)
    for j, label in enumerate(("all rounds", "mask rounds (placebo for no mask)", "the round after a mask")):
        left.plot([], [], "ov^"[j], color=f"C{j}", label=label)
    left.set_yticks(range(len(rows)), [f"{m} ({r.split('-')[-1]})" for r, m, _ in rows], fontsize=8)
    left.invert_yaxis()
    left.set(xlabel="set-backs per round judged (%), 95% bootstrap interval over runs")
    left.grid(alpha=0.3, axis="x")
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=3)
    with_events = sorted({m for _, m, e in rows if e["summary"]["strata"]["all"]["setbacks"]})
    shapes = {regime: "os^D"[k % 4] for k, regime in enumerate(primary)}
    for regime, method, entry in rows:
        color = f"C{with_events.index(method) % 10}" if method in with_events else None
        for r in entry["runs"]:
            for e in r["events"]:
                right.scatter(e["round"], 100 * e["depth"], s=22, color=color,
                              marker="x" if e["censored"] else shapes[regime], alpha=0.8)
    for k, method in enumerate(with_events):
        right.scatter([], [], color=f"C{k % 10}", s=22, label=method)
    for regime, shape in shapes.items():
        right.scatter([], [], color="0.4", s=22, marker=shape, label=regime)
    right.scatter([], [], color="0.4", marker="x", label="not regained by the last round")
    right.set(xlabel="round of the set-back", ylabel="depth below the round before (points)", xlim=(0, 101))
    right.grid(alpha=0.3)
    right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("Set-backs (acc-after falls >= 10 points from one round to the next), every committed run "
                 "of the pre-registered study", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=OUT, help="the study's results folder")
    parser.add_argument("--out", type=Path, default=None, help="where setbacks.* go (default: --results)")
    args = parser.parse_args()
    out = (args.out or args.results).resolve()
    folders = sorted(f for f in args.results.resolve().iterdir()
                     if f.is_dir() and any(f.glob("*-seed*.json")))
    if not folders:
        raise SystemExit(f"no results folders with *-seed*.json in {args.results}")
    results = {level: {f.name: count_regime(f, threshold) for f in folders}
               for level, threshold in (("primary", THRESHOLD), ("secondary", SECONDARY_THRESHOLD))}
    paths = [out / f"setbacks.{ext}" for ext in ("md", "json", "png")]
    inputs = sorted(p for f in folders for p in f.glob("*-seed*.json"))
    lines = ["# Set-backs of the accuracy, every committed run", "",
             "Definition, strata and intervals: [PROTOCOL.md, Addenda, 2026-12-03]"
             "(../../../examples/paper/PROTOCOL.md#addenda) (exploratory). A set-back is a round whose "
             "`acc-after` falls by at least 10 points (secondary: 5) from the round before; it is regained "
             "when `acc-after` is back within 1 point of that round's; its depth is how far below it the run "
             "went meanwhile. Generated by `examples/paper/setbacks.py`; the numbers and their provenance "
             "are in `setbacks.json`.", ""]
    lines += reading(results["primary"])
    for level, label in (("primary", "set-back = a fall of >= 10 points"),
                         ("secondary", "secondary: a fall of >= 5 points")):
        lines.append(f"## {label}")
        lines.append("")
        for name, methods in results[level].items():
            lines += regime_lines(name, methods, label.split(": ")[-1])
    lines.append("![Set-back frequencies and depths](setbacks.png)")
    out.mkdir(parents=True, exist_ok=True)
    paths[0].write_text("\n".join(lines) + "\n")
    bootstrap = {"resamples": RESAMPLES, "rng": "default_rng(0)", "percentiles": [2.5, 97.5], "unit": "run"}
    definition = {"threshold": THRESHOLD, "secondary_threshold": SECONDARY_THRESHOLD, "tolerance": TOLERANCE,
                  "early_rounds": [2, EARLY_LAST], "bootstrap": bootstrap,
                  "protocol": "examples/paper/PROTOCOL.md, Addenda, 2026-12-03"}
    record = {"definition": definition, "provenance": provenance(inputs, paths, Path(__file__)), **results}
    paths[1].write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    figure(results, paths[2])
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""What ``lips-flwr compare`` writes: ``summary.json``, ``report.md``, ``curves.png`` and ``inertia.png``.

``curves.png``: left, both arms' mean curves of the endpoint metric per
round with each seed's curve faint, LIPS's mask rounds marked (B dotted, A
dashed); right, each seed's paired difference ``B - A`` with their mean and
95% CI. ``inertia.png``: arm A's relative step per weight layer and round,
``log10``, averaged over its seeds, layers in the model's order with the
first and last marked. Round ticks are integers. Every file is written
atomically, ``summary.json`` last."""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ..results import write_bytes_atomic, write_json_atomic
from ..runner.runs import run_name
from ..runner.store import Result
from .comparison import Comparison, layer_groups, relative_steps
from .lips import lips_lines
from .metric import evaluate_series


def _overrides(values: dict[str, Any]) -> str:
    return " ".join(f"{k}={v!r}" for k, v in values.items()) or "(none)"


def _arms(comparison: Comparison) -> tuple[str, str]:
    if comparison.lips_off:
        return ("the app with LIPS off (every LIPS strategy in it forced to `tau0 = 0`: its wrapped "
                "strategy, bit for bit; client mods mask nothing)", "the app as written")
    return f"the app with {_overrides(comparison.a)}", f"the app with {_overrides(comparison.b)}"


def _goal_words(summary: dict) -> str:
    """How the report reads the metric: which way is better, and where that came from."""
    goal = summary.get("goal", "max")  # (summaries written before --goal: higher was better)
    return f"{'higher' if goal == 'max' else 'lower'} is better (--goal {goal})"


def _metric_words(summary: dict) -> str:
    """Which metric the endpoint reads: the clients' (weighted) or the ServerApp's own evaluation."""
    if summary.get("metric_source") == "server":
        return f"the ServerApp's own evaluate metric `{summary['metric']}` (its `evaluate_fn`)"
    return f"the clients' evaluate metric `{summary['metric']}` averaged with `num-examples` weights"


def _ahead(summary: dict) -> int:
    """The seeds on which B did better than A by the goal."""
    return summary["losses"] if summary.get("goal", "max") == "min" else summary["wins"]


def _test_lines(summary: dict) -> list[str]:
    if summary["n"] == 1:
        return [f"B - A: {summary['diff_mean']:+.4f} on one seed: no test (a paired test needs two seeds or "
                "more)."]
    sign = f"p = {summary['p_sign']:.3g} (exact sign test)"
    if summary["ci95"] is None:
        return [f"B - A: {summary['diff_mean']:+.4f} on every one of the {summary['n']} seeds: zero "
                f"variance, so no t-test and no CI; {sign}.", "",
                f"**Verdict: {summary['verdict']}** (a verdict needs a t-test)."]
    test = (f"paired t-test over {summary['n']} seeds at 95%, with the exact sign test beside it: *B "
            "better* when p < 0.05 and the 95% CI lies on the better side of 0, *B worse* when p < 0.05 and "
            "it lies on the worse side, else *no difference detected*")
    ahead = f"B better on {_ahead(summary)} of {summary['n']} seeds"
    if summary["n"] == 2:  # (t on 1 degree of freedom: the CI is +-12.7 standard errors, often past [-1, 1])
        return [f"B - A: mean {summary['diff_mean']:+.4f}, p = {summary['p_t']:.3g} (t), {sign}; {ahead}. "
                "**2 seeds cannot bound the effect**: a t interval on one degree of freedom spans 12.7 "
                "standard errors either side of the mean; run 6 seeds or more to bound it.", "",
                f"**Verdict: {summary['verdict']}** ({test})."]
    low, high = summary["ci95"]
    return [f"B - A: mean {summary['diff_mean']:+.4f}, 95% CI [{low:+.4f}, {high:+.4f}] (paired t, "
            f"ddof = 1), p = {summary['p_t']:.3g} (t), {sign}; {ahead}.", "",
            f"**Verdict: {summary['verdict']}** ({test}; the CI is the range of effects these seeds cannot "
            "rule out)."]


def _inertia_lines(inertia: dict) -> list[str]:
    if not inertia["runs"]:
        needs, has = inertia.get("needs_rounds", 16), inertia.get("rounds")
        if has is not None and has < needs:
            why = f"it needs {needs} rounds or more; this run has {has}"
        else:
            why = "no run of arm A had relative steps of every weight layer in both windows"
        return [f"Inertia (arm A): not measured: {why} (the study protocol's rule compares the relative "
                "steps of rounds 2-6 with those of the last 10 rounds)."]
    return [f"Inertia (arm A, late/early relative step per layer, the study protocol's rule): middle layers' "
            f"median rho {inertia['middle']:.3f}, first and last layers' {inertia['edges']:.3f} (medians "
            f"over runs); inertia arises in {inertia['arises_in']} of {inertia['runs']} runs: it "
            f"**{inertia['verdict']}** (it arises when it does in at least 5 of 6 runs)."]


def _environment_lines(summary: dict) -> list[str]:
    rows = summary["environments"]
    if all(row["same"] for row in rows):
        return ["Each seed's two runs ran in one environment (the same Python, numpy, torch and flwr "
                "versions, CPU flags, GPU, threads and engine)."]
    lines = ["Not every seed's two runs ran in one environment:", ""]
    for row in rows:
        state = ("unknown (a file without provenance)" if row["same"] is None else
                 "one environment" if row["same"] else f"different: {', '.join(row['differing'])}")
        lines.append(f"- seed {row['seed']}: {state}")
    return lines


def _stalled_lines(stalled: dict) -> list[str]:
    if not stalled:
        return ["Every round of every run moved its global model (each had an aggregate)."]
    words = {"no_aggregate": "no aggregate", "unchanged": "global model unchanged",
             "nonfinite": "global model not finite"}
    lines = ["**Rounds that did not move the global model** (the strategy's warnings are in each run's "
             "`observed.warnings`):", ""]
    for name, found in sorted(stalled.items()):
        lines.append(f"- {name}: " + "; ".join(f"{words.get(why, why)} in rounds {', '.join(map(str, r))}"
                                               for why, r in found.items()))
    return lines


def report_text(comparison: Comparison, summary: dict) -> str:
    arm_a, arm_b = _arms(comparison)
    name = summary.get("app_name") or comparison.app.name
    lines = [f"# Does it help? `{name}`: B vs A over {summary['n']} paired seeds", "",
             f"- A: {arm_a}", f"- B: {arm_b}",
             f"- both: run config {_overrides(comparison.run_config)}, {comparison.num_nodes} nodes, "
             f"engine {summary['engine']}, seeds {', '.join(map(str, summary['seeds']))}",
             f"- endpoint: one number per run, the mean of its last {summary['last']} evaluated rounds of "
             f"{_metric_words(summary)}; {_goal_words(summary)}", "",
             "| seed | A | B | B - A |", "| --- | --- | --- | --- |"]
    for seed, a, b, d in zip(summary["seeds"], summary["endpoint_a"], summary["endpoint_b"],
                             summary["differences"]):
        lines.append(f"| {seed} | {a:.4f} | {b:.4f} | {d:+.4f} |")
    lines += ["", *_test_lines(summary), "", *lips_lines(summary.get("lips"), summary["last"]), "",
              *_inertia_lines(summary["inertia_a"]), "",
              *_environment_lines(summary), ""]
    errors = summary["error_replies"]
    if errors:
        lines += ["Error replies (clients that failed; their rounds went on without them):", ""]
        lines += [f"- {name}: {c['train']} train, {c['evaluate']} evaluate"
                  for name, c in sorted(errors.items())]
    else:
        lines.append("No client sent an error reply.")
    lines += ["", *_stalled_lines(summary.get("stalled_rounds") or {})]
    lines += ["", "Figures: `curves.png` (curves and paired differences), `inertia.png` (arm A's relative "
              "step per layer). Runs: `runs/<a|b>-seed<k>.json` (per-round metrics, identity, provenance)."]
    return "\n".join(lines) + "\n"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _integer_rounds(ax: Any) -> None:
    """Round ticks at integers only (matplotlib would put one at 2.5)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def mark_mask_rounds(ax: Any, summary: dict) -> None:
    """Each arm's LIPS mask rounds as vertical lines (B dotted, A dashed), as examples/paper/plot.py does."""
    for arm, style in (("b", ":"), ("a", "--")):
        masked = (summary.get("lips") or {}).get(arm, {}).get("mask_rounds", [])
        for r in masked:
            ax.axvline(r, color="0.55", lw=0.7, ls=style, zorder=0)
        if masked:
            ax.plot([], [], color="0.55", lw=0.7, ls=style, label=f"LIPS mask rounds ({arm.upper()})")


def plot_curves(summary: dict, results: dict[str, Result], path: Path) -> Path:
    plt = _pyplot()
    fig, (ax, dx) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    for color, arm in (("C0", "a"), ("C3", "b")):
        source = summary.get("metric_source", "clients")
        curves = [evaluate_series(results[run_name(arm, s)], summary["metric"], source)
                  for s in summary["seeds"]]
        rounds = sorted(set.intersection(*(set(c) for c in curves)))
        values = np.array([[c[r] for r in rounds] for c in curves])
        for row in values:
            ax.plot(rounds, row, color=color, alpha=0.2, lw=0.8)
        ax.plot(rounds, values.mean(0), color=color, lw=2, label=f"{arm.upper()} (mean of {len(curves)})")
    mark_mask_rounds(ax, summary)
    _integer_rounds(ax)
    ax.set(xlabel="round", ylabel=summary["metric"], title=f"{summary['metric']} per round (faint: a seed)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    diffs = np.array(summary["differences"])
    dx.scatter(range(len(diffs)), diffs, color="0.4", s=16, zorder=2, label="B - A per seed")
    dx.axhline(summary["diff_mean"], color="C3", lw=1.2, label="mean")
    if summary["ci95"] is not None:
        dx.axhspan(*summary["ci95"], color="C3", alpha=0.15, label="95% CI")
    dx.axhline(0, color="k", lw=0.8)
    dx.set_xticks(range(len(diffs)), [str(s) for s in summary["seeds"]], fontsize=7, rotation=45)
    dx.set(xlabel="seed", ylabel=f"B - A, endpoint (last {summary['last']})", title="paired differences")
    dx.legend(fontsize=7)
    return _save(plt, fig, path)


def plot_inertia(summary: dict, results: dict[str, Result], path: Path) -> Path:
    plt = _pyplot()
    runs = [results[run_name("a", s)] for s in summary["seeds"]]
    layers, middle = layer_groups(runs[0])
    steps = [relative_steps(r) for r in runs]
    rounds = sorted({t for s in steps for series in s.values() for t in series})
    fig, ax = plt.subplots(figsize=(9, 0.35 * max(len(layers), 1) + 2))
    if layers and rounds:
        logs = np.full((len(steps), len(layers), len(rounds)), np.nan)
        for i, s in enumerate(steps):
            for j, layer in enumerate(layers):
                for k, t in enumerate(rounds):
                    value = s.get(layer, {}).get(t)
                    if value is not None and value > 0:
                        logs[i, j, k] = np.log10(value)
        with warnings.catch_warnings():  # (a layer and round no seed has: an empty cell)
            warnings.simplefilter("ignore", RuntimeWarning)
            grid = np.nanmean(logs, axis=0)
        image = ax.imshow(grid, aspect="auto", cmap="viridis",
                          extent=(rounds[0] - 0.5, rounds[-1] + 0.5, len(layers) - 0.5, -0.5))
        labels = [f"{name} ({'middle' if name in middle else 'first' if i == 0 else 'last'})"
                  for i, name in enumerate(layers)]  # ("middle": every weight layer but the first and last)
        ax.set_yticks(range(len(layers)), labels, fontsize=7)
        fig.colorbar(image, ax=ax, label="log10 relative step")
    _integer_rounds(ax)
    ax.set(xlabel="round", title=f"arm A: log10 ||w_t - w_t-1|| / ||w_t-1|| per layer, mean over "
                                 f"{len(runs)} seeds; inertia {summary['inertia_a']['verdict']}")
    return _save(plt, fig, path)


def _save(plt: Any, fig: Any, path: Path) -> Path:
    """``fig`` as a PNG at ``path``, written atomically; the figure closed."""
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=120)
    plt.close(fig)
    write_bytes_atomic(path, image.getvalue())
    return path


def write_report(comparison: Comparison, summary: dict, results: dict[str, Result], out: Path) -> None:
    """``curves.png``, ``inertia.png``, ``report.md`` and last ``summary.json`` in ``out``, each atomic."""
    plot_curves(summary, results, out / "curves.png")
    plot_inertia(summary, results, out / "inertia.png")
    write_bytes_atomic(out / "report.md", report_text(comparison, summary).encode("utf-8"))
    write_json_atomic(out / "summary.json", summary)


__all__ = ["mark_mask_rounds", "plot_curves", "plot_inertia", "report_text", "write_report"]

"""``summary.json``'s content from the runs' result files: the endpoints, the paired test of ``B - A``
and its verdict in the goal's words, arm A's inertia verdict, the environments, error replies,
stalled rounds, what LIPS did and what made it all (see :mod:`lips_flwr.experiments.compare`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ConfigError
from ..runner.observe import stalled_rounds
from ..runner.provenance import git_state, now_utc, same_environment, versions
from ..runner.runs import LIPS_OFF, run_name
from ..runner.store import Result
from ..stats import MIN_ROUNDS, NO_TEST_ZERO_VARIANCE, inertia_rho, inertia_verdict, paired, verdict
from .comparison import Comparison, app_name, check_metric, default_goal, layer_groups, relative_steps
from .lips import lips_summary
from .metric import choose_metric, evaluate_series, unknown_metric

DEFAULT_LAST = 10


def better_or_worse(test: dict, goal: str) -> str:
    """The verdict of a paired test of ``B - A`` in plain words, following ``goal``.

    ``"B better"`` when p < 0.05 and the 95% CI lies on the goal's side of 0
    (above it for ``max``, below for ``min``), ``"B worse"`` when it lies on the
    other side, else ``"no difference detected"``; no t-test (zero variance):
    :data:`~..stats.NO_TEST_ZERO_VARIANCE`.
    """
    found = verdict(test, test["p_t"])
    if found == NO_TEST_ZERO_VARIANCE:
        return found
    higher = {"supported": True, "contradicted": False}.get(found)
    if higher is None:
        return "no difference detected"
    return "B better" if higher == (goal == "max") else "B worse"


def endpoint(series: dict[int, float], last: int) -> float:
    """The mean of the last ``last`` evaluated rounds of ``series``."""
    rounds = sorted(series)[-last:]
    return float(np.mean([series[r] for r in rounds]))


def _inertia(results_a: list[Result]) -> dict:
    """Arm A's inertia verdict, its runs' ``rho``, and the fewest rounds of a run (``rounds``)."""
    rhos, lasts = [], []
    for result in results_a:
        all_layers, middle = layer_groups(result)
        edges = [name for name in all_layers if name not in middle]
        last = max((int(r) for r in (result.observed or {}).get("rounds", {})), default=0)
        lasts.append(last)
        rho = inertia_rho(relative_steps(result), middle, edges, last) if last >= MIN_ROUNDS else None
        if rho is not None:
            rhos.append(rho)
    return {**inertia_verdict(rhos), "per_run": rhos, "rounds": min(lasts, default=0),
            "needs_rounds": MIN_ROUNDS}


def _errors(results: dict[str, Result]) -> dict[str, dict[str, int]]:
    out = {}
    for name, result in results.items():
        rounds = (result.observed or {}).get("rounds", {}).values()
        counts = {kind: sum(entry.get(kind, {}).get("errors", 0) for entry in rounds)
                  for kind in ("train", "evaluate")}
        if any(counts.values()):
            out[name] = counts
    return out


def _stalled(results: dict[str, Result]) -> dict[str, dict[str, list[int]]]:
    """Per run with any, the rounds that did not move its global model
    (:func:`~..runner.observe.stalled_rounds`)."""
    out = {}
    for name, result in results.items():
        found = stalled_rounds((result.observed or {}).get("rounds", {}))
        if any(found.values()):
            out[name] = {why: rounds for why, rounds in found.items() if rounds}
    return out


def summarize(comparison: Comparison, results: dict[str, Result]) -> dict:
    """``summary.json``'s content from the runs' result files (see the module docstring)."""
    first = results[run_name("a", comparison.seeds[0])]
    metric, source = choose_metric(first.observed, comparison.metric, first.path.name)
    check_metric(metric, comparison.goal)
    goal = comparison.goal or default_goal(metric)
    series = {name: evaluate_series(result, metric, source) for name, result in results.items()}
    empty = sorted(name for name, s in series.items() if not s)
    if empty:
        raise unknown_metric(metric, first.observed, empty)
    shortest = min(len(s) for s in series.values())
    last = comparison.last if comparison.last is not None else min(DEFAULT_LAST, shortest)
    if not 1 <= last <= shortest:
        raise ConfigError(f"--last {last}: the runs have {shortest} evaluated rounds (the fewest of any run)")
    a = [endpoint(series[run_name("a", s)], last) for s in comparison.seeds]
    b = [endpoint(series[run_name("b", s)], last) for s in comparison.seeds]
    diffs = [y - x for x, y in zip(a, b)]
    summary: dict[str, Any] = {
        "app": str(comparison.app), "app_name": app_name(comparison, first), "seeds": list(comparison.seeds),
        "metric": metric, "metric_source": source, "goal": goal, "last": last,
        "arms": {"a": {"overrides": comparison.a,
                       "lips_forced": dict(LIPS_OFF) if comparison.lips_off else {}},
                 "b": {"overrides": comparison.b, "lips_forced": {}}},
        "run_config": comparison.run_config,
        # (the count the runs were made with, as their identity records it)
        "num_nodes": (first.identity or {}).get("num_nodes", comparison.num_nodes),
        "num_nodes_from": comparison.num_nodes_from,
        "engine": first.identity["engine"] if first.identity else None,
        "endpoint_a": a, "endpoint_b": b, "differences": diffs, "n": len(diffs),
        "diff_mean": float(np.mean(diffs)),
    }
    if len(diffs) >= 2:
        test = paired(diffs)
        tested = test["sd"] > 0  # (zero variance: no t-test, no CI; None in the JSON, not NaN)
        summary.update(ci95=[test["ci_low"], test["ci_high"]] if tested else None,
                       p_t=test["p_t"] if tested else None, p_sign=test["p_sign"], sd=test["sd"],
                       wins=test["wins"], losses=test["losses"], verdict=better_or_worse(test, goal))
    else:
        summary.update(ci95=None, p_t=None, p_sign=None, sd=None, wins=int(diffs[0] > 0),
                       losses=int(diffs[0] < 0), verdict="no test (one seed)")
    summary["inertia_a"] = _inertia([results[run_name("a", s)] for s in comparison.seeds])
    summary["environments"] = []
    for s in comparison.seeds:
        a_run, b_run = results[run_name("a", s)], results[run_name("b", s)]
        same, differing = same_environment(a_run.provenance, b_run.provenance)
        summary["environments"].append({"seed": s, "same": same, "differing": differing})
    summary["error_replies"] = _errors(results)
    summary["stalled_rounds"] = _stalled(results)
    windows = {name: sorted(s)[-last:] for name, s in series.items()}
    summary["lips"] = lips_summary(comparison.seeds, results, windows)
    summary["provenance"] = _provenance(results)
    return summary


def _provenance(results: dict[str, Result]) -> dict[str, Any]:
    """What made the summary (code, libraries, time) and, per run, the code that computed it.

    Each run's full provenance stays in its result file; this names them so
    that a summary read alone says which code made its numbers.
    """
    import lips_flwr

    runs = {}
    for name, result in sorted(results.items()):
        record, identity = result.provenance or {}, result.identity or {}
        runs[name] = {"file": result.path.name, "code": identity.get("code"), "git": record.get("git"),
                      "started": record.get("started"), "wall_seconds": record.get("wall_seconds")}
    return {"summary": {"lips_flwr": lips_flwr.__version__, "git": git_state(), **versions(),
                        "made": now_utc()},
            "runs": runs}


__all__ = ["DEFAULT_LAST", "better_or_worse", "endpoint", "summarize"]

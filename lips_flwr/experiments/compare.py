"""``lips-flwr compare``: does LIPS (or any change of run config) help on this Flower App?

Two arms of the same App over paired seeds, on the batched Grid, through the
one runner (:func:`~.sweep.run_sweep`):

- by default arm A is the app with LIPS off (every LIPS strategy built in it
  is forced to ``tau0 = 0``, bit for bit its wrapped strategy; client mods
  then mask nothing) and arm B the app as written;
- with ``a``/``b`` overrides, each arm is the app with its own run-config
  overrides (nothing forced).

The runs go to ``<out>/runs/<a|b>-seed<k>.json``, after the checks of
:mod:`.compare_out`. The **endpoint** of a run is the mean over its last
``K`` evaluated rounds (default ``min(10, rounds)``) of evaluate metric
``NAME``: the clients' (averaged with ``num-examples`` weights) or the
ServerApp's own (:mod:`.compare_metric`; default: the first whose name
contains ``acc``). Which way is better is the **goal** (``max``, or ``min``
by default for a name with ``loss``, ``error`` or ``err``). Per seed,
``B - A``; over seeds, the paired t-test with its 95% CI (ddof = 1) and the
exact sign test (:mod:`.stats`), and a verdict in plain words that follow the
goal: *B better*, *B worse* or *no difference detected* (no t-test, CI or
verdict from one seed, nor when every seed gave the same difference). The
**inertia verdict** of arm A applies the protocol's rule to the relative
steps of the global models the runner saw. The summary also flags the rounds
that did not move a run's global model, says what LIPS did in each arm
(:mod:`.compare_lips`), and names the code and libraries that made it and
each run's code (``provenance``). ``<out>/summary.json``, ``<out>/report.md``,
``<out>/curves.png`` and ``<out>/inertia.png`` hold it all
(:mod:`.compare_report`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from .compare_lips import lips_summary
from .compare_metric import MetricWatch, choose_metric, default_metric, evaluate_series, unknown_metric
from .runner.observe import WEIGHT_KEYS, stalled_rounds
from .runner.provenance import git_state, now_utc, same_environment, versions
from .runner.runs import LIPS_OFF, RunSpec, run_name
from .runner.stall import DEFAULT_STALL_TIMEOUT
from .runner.store import Result, SweepLock, read_result, staging_path
from .runner.sweep import run_sweep
from .stats import MIN_ROUNDS, NO_TEST_ZERO_VARIANCE, inertia_rho, inertia_verdict, paired, verdict

DEFAULT_LAST = 10
GOALS = ("max", "min")
LOWER_IS_BETTER = ("loss", "error", "err")  # a metric named with one of these defaults to --goal min


def default_goal(metric: str) -> str:
    """``"min"`` for a metric named with ``loss``, ``error`` or ``err`` (any case), else ``"max"``."""
    return "min" if any(word in metric.lower() for word in LOWER_IS_BETTER) else "max"


def check_metric(metric: str | None, goal: str | None) -> None:
    """``ConfigError`` for a weight key named as the metric, or a goal other than ``max``/``min``."""
    if metric in WEIGHT_KEYS:
        raise ConfigError(f"--metric {metric}: {metric!r} is the weight of the clients' replies (how many "
                          "examples each evaluated), not a measure of the model: name an evaluate metric")
    if goal is not None and goal not in GOALS:
        raise ConfigError(f"--goal must be max or min, got {goal!r}")


def better_or_worse(test: dict, goal: str) -> str:
    """The verdict of a paired test of ``B - A`` in plain words, following ``goal``.

    ``"B better"`` when p < 0.05 and the 95% CI lies on the goal's side of 0
    (above it for ``max``, below for ``min``), ``"B worse"`` when it lies on the
    other side, else ``"no difference detected"``; no t-test (zero variance):
    :data:`~.stats.NO_TEST_ZERO_VARIANCE`.
    """
    found = verdict(test, test["p_t"])
    if found == NO_TEST_ZERO_VARIANCE:
        return found
    higher = {"supported": True, "contradicted": False}.get(found)
    if higher is None:
        return "no difference detected"
    return "B better" if higher == (goal == "max") else "B worse"


@dataclass(frozen=True)
class Comparison:
    """What ``lips-flwr compare`` was asked: the app, seeds, arms, shared overrides and how to run."""

    app: Path
    seeds: tuple[int, ...]
    a: dict[str, Any] = field(default_factory=dict)
    b: dict[str, Any] = field(default_factory=dict)
    run_config: dict[str, Any] = field(default_factory=dict)
    num_nodes: int | None = None  # None: what `flwr run` would use for the app (runner.federation)
    metric: str | None = None
    last: int | None = None
    engine: str = "auto"
    num_nodes_from: str | None = None  # where the node count came from, in words (the CLI's; None: given)
    goal: str | None = None

    def nodes(self) -> tuple[int, str | None]:
        """The node count and where it came from: ``num_nodes`` as given, else ``flwr run``'s for the app."""
        if self.num_nodes is not None:
            return self.num_nodes, self.num_nodes_from
        from .runner.federation import node_count

        found = node_count(self.app)
        return found.nodes, found.source

    @property
    def lips_off(self) -> bool:
        """The default arms: A is the app with LIPS forced off, B the app as written."""
        return not self.a and not self.b

    def specs(self) -> list[RunSpec]:
        """One spec per arm and seed, in seed order (A then B), named ``<a|b>-seed<k>``."""
        if self.engine not in ("auto", "sequential", "stacked"):
            raise ConfigError(f"compare runs on the batched Grid: engine auto, sequential or stacked, "
                              f"got {self.engine!r}")
        check_metric(self.metric, self.goal)
        if len(set(self.seeds)) != len(self.seeds) or not self.seeds:
            raise ConfigError(f"the seeds must be distinct and at least one, got {list(self.seeds)}")
        nodes, _ = self.nodes()
        out = []
        for seed in self.seeds:
            for arm, overrides in (("a", self.a), ("b", self.b)):
                out.append(RunSpec(self.app, run_name(arm, seed), seed, {**self.run_config, **overrides},
                                   num_nodes=nodes, engine=self.engine,
                                   lips_off=self.lips_off and arm == "a", require_evaluate=True))
        return out


def app_name(comparison: Comparison, result: Result) -> str:
    """The app's name from its ``pyproject.toml`` (as its runs' identity has it), else its folder's name."""
    name = ((result.identity or {}).get("app") or {}).get("name")
    if not name:
        from .runner.apps import load_app

        try:
            name = load_app(comparison.app).name
        except (OSError, ValueError):  # (older result files, an app moved or gone since)
            name = comparison.app.name
    return str(name)


def endpoint(series: dict[int, float], last: int) -> float:
    """The mean of the last ``last`` evaluated rounds of ``series``."""
    rounds = sorted(series)[-last:]
    return float(np.mean([series[r] for r in rounds]))


def relative_steps(result: Result) -> dict[str, dict[int, float]]:
    """Layer -> round -> the relative step of the global model the runner saw."""
    steps: dict[str, dict[int, float]] = {}
    for r, entry in (result.observed or {}).get("rounds", {}).items():
        for layer, value in (entry.get("relative_step") or {}).items():
            if value is not None:
                steps.setdefault(layer, {})[int(r)] = float(value)
    return steps


def layer_groups(result: Result) -> tuple[list[str], list[str]]:
    """(all weight layers in model order, the middle ones) as the runner saw them."""
    layers = (result.observed or {}).get("layers") or {}
    return list(layers.get("all", [])), list(layers.get("middle", []))


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
    """Per run with any, the rounds that did not move its global model (:func:`~.observe.stalled_rounds`)."""
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


def run_compare(comparison: Comparison, out: str | Path, jobs: int | None = None, recompute: bool = False,
                progress: Callable[[str], None] = print,
                stall_timeout: float | None = DEFAULT_STALL_TIMEOUT) -> dict:
    """Run both arms (reusing finished runs), then write the summary, report and figures into ``out``.

    ``stall_timeout``: a run without progress for that many seconds fails (:mod:`.runner.stall`).
    """
    from .compare_out import check_out, made_folders, prepared_sweep, remove_made
    from .compare_report import write_report

    out = Path(out).resolve()
    specs = comparison.specs()
    made = made_folders(out / "runs")
    try:
        check_out(out)  # (before the lock makes runs/: a file in the way is named, not an OS error)
        # The sweep's lock, held before anything in `out` is removed (a result file under --recompute,
        # the old report) and until the report is written: a second compare into `out` is refused
        # before it touches the first one's files.
        with SweepLock(out / "runs") as lock:
            prepared_sweep(specs, out, recompute, progress)
            first = specs[0].name  # (its first evaluated round tells whether the metric is there)
            watch = MetricWatch(comparison.metric, first, staging_path(out / "runs", first), progress)
            paths = run_sweep(specs, out / "runs", jobs=jobs, recompute=recompute, progress=watch,
                              stall_timeout=stall_timeout, lock=lock)
            results = {spec.name: read_result(path) for spec, path in zip(specs, paths)}
            summary = summarize(comparison, results)
            write_report(comparison, summary, results, out)
    except BaseException:
        remove_made(made)  # (a refused sweep leaves no empty runs/; a stopped run's staging stays)
        raise
    return summary


__all__ = ["Comparison", "default_metric", "endpoint", "evaluate_series", "run_compare", "summarize"]

"""What ``lips-flwr compare`` was asked (:class:`Comparison`: the app, seeds, arms, metric and goal),
and what it reads of a run's result file (the app's name, the relative steps, the layer groups).

The summary (:mod:`.summary`) and the report (:mod:`.report`) read runs through
these; nothing here runs anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ..runner.observe import WEIGHT_KEYS
from ..runner.runs import RunSpec, run_name
from ..runner.store import Result

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


@dataclass(frozen=True)
class Comparison:
    """What ``lips-flwr compare`` was asked: the app, seeds, arms, shared overrides and how to run."""

    app: Path
    seeds: tuple[int, ...]
    a: dict[str, Any] = field(default_factory=dict)
    b: dict[str, Any] = field(default_factory=dict)
    run_config: dict[str, Any] = field(default_factory=dict)
    num_nodes: int | None = None  # None: what `flwr run` would use for the app (compare.federation)
    metric: str | None = None
    last: int | None = None
    engine: str = "auto"
    num_nodes_from: str | None = None  # where the node count came from, in words (the CLI's; None: given)
    goal: str | None = None

    def nodes(self) -> tuple[int, str | None]:
        """The node count and where it came from: ``num_nodes`` as given, else ``flwr run``'s for the app."""
        if self.num_nodes is not None:
            return self.num_nodes, self.num_nodes_from
        from .federation import node_count

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
        from ..runner.apps import load_app

        try:
            name = load_app(comparison.app).name
        except (OSError, ValueError):  # (older result files, an app moved or gone since)
            name = comparison.app.name
    return str(name)


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


__all__ = ["GOALS", "LOWER_IS_BETTER", "Comparison", "app_name", "check_metric", "default_goal",
           "layer_groups", "relative_steps"]

"""What LIPS did in each arm of a comparison: its mask rounds, their tau, and how much of each layer group.

A run's mask rounds come from what its result file holds, the newest first:

- ``observed.rounds[r].strategy``: the strategy's own ``lips-*`` train
  metrics (``lips-mask-round``, ``lips-tau``), Message API;
- ``observed.rounds[r].lips``: a LIPS mask round's log line (tau, zeros),
  either API;
- ``app.rounds[r].train``: the app's own results file (the paper app's
  ``lips-*`` train metrics), for result files written before the runner
  kept the strategy's metrics.

The fraction masked per layer group (first, middle, last weight layer) is
the fraction of exact zeros in the model broadcast after the mask round
(``observed.rounds[r].zeros``); files without it say so. A mask round in the
endpoint window (the last K evaluated rounds) is named: the endpoint then
averages rounds right after a mask, when the model has just lost weights.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ..runner.runs import run_name
from ..runner.store import Result

GROUPS = ("first", "middle", "last")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def mask_rounds(result: Result) -> dict[int, dict[str, Any]]:
    """Round -> ``{"tau", "zeros" (per layer group, or None)}`` of each round in which LIPS masked."""
    observed = (result.observed or {}).get("rounds", {})
    app_rounds = (result.app or {}).get("rounds")
    app_rounds = app_rounds if isinstance(app_rounds, dict) else {}
    out: dict[int, dict[str, Any]] = {}
    for key in {*observed, *app_rounds}:
        entry, train = observed.get(key, {}), (app_rounds.get(key) or {}).get("train") or {}
        strategy, heard = entry.get("strategy") or {}, entry.get("lips") or {}
        flag = _number(strategy.get("lips-mask-round", train.get("lips-mask-round")))
        tau = _number(strategy.get("lips-tau", heard.get("tau", train.get("lips-tau"))))
        masked = bool(flag) if flag is not None else "tau" in heard
        if masked and tau:
            out[int(key)] = {"tau": tau, "zeros": entry.get("zeros")}
    return dict(sorted(out.items()))


def arm_masks(results: Iterable[Result]) -> dict[str, Any]:
    """An arm's mask rounds over its runs: each round's tau and mean zero fraction per layer group."""
    per_run = [mask_rounds(result) for result in results]
    rounds = sorted({r for run in per_run for r in run})
    table = {}
    for r in rounds:
        found = [run[r] for run in per_run if r in run]
        zeros = {}
        for group in GROUPS:
            values = [z[group] for z in (f["zeros"] for f in found) if z and group in z]
            if values:
                zeros[group] = float(np.mean(values))
        table[str(r)] = {"tau": float(np.mean([f["tau"] for f in found])), "runs": len(found),
                         "zeros": zeros or None}
    return {"mask_rounds": rounds, "rounds": table, "runs": len(per_run)}


def lips_summary(seeds: Iterable[int], results: dict[str, Result], windows: dict[str, list[int]]) -> dict:
    """``summary.json``'s ``lips``: per arm :func:`arm_masks`, and its mask rounds in the endpoint window.

    ``windows``: run name -> the rounds of its endpoint.
    """
    seeds = list(seeds)
    out: dict[str, Any] = {}
    for arm in ("a", "b"):
        names = [run_name(arm, s) for s in seeds]
        masks = arm_masks(results[name] for name in names)
        inside = sorted({r for name in names for r in masks["mask_rounds"] if r in windows.get(name, [])})
        out[arm] = {**masks, "in_endpoint_window": inside}
    return out


def lips_lines(lips: dict | None, last: int) -> list[str]:
    """``report.md``'s "What LIPS did" part (``lips``: :func:`lips_summary`; ``None`` in older summaries)."""
    if lips is None:
        return []
    lines = ["## What LIPS did", ""]
    for arm in ("a", "b"):
        masks = lips[arm]
        if not masks["mask_rounds"]:
            lines += [f"- arm {arm.upper()}: no mask round (nothing masked).", ""]
            continue
        lines += [f"- arm {arm.upper()}: mask rounds {', '.join(map(str, masks['mask_rounds']))} "
                  f"(over its {masks['runs']} runs).", "",
                  "  | round | tau | runs | masked: first layer | middle layers | last layer |",
                  "  | --- | --- | --- | --- | --- | --- |"]
        for r, row in masks["rounds"].items():
            zeros = row["zeros"] or {}
            cells = [f"{zeros[g]:.3f}" if g in zeros else "(not recorded)" for g in GROUPS]
            lines.append(f"  | {r} | {row['tau']:.4f} | {row['runs']} | {' | '.join(cells)} |")
        lines.append("")
        if masks["in_endpoint_window"]:
            rounds = ", ".join(map(str, masks["in_endpoint_window"]))
            lines += [f"  Mask rounds {rounds} fall inside the endpoint window (the last {last} evaluated "
                      f"rounds): arm {arm.upper()}'s endpoint averages rounds right after a mask, when the "
                      "model has just lost weights.", ""]
    lines.append("(masked: the fraction of exact zeros in the model broadcast after the mask round, mean "
                 "over the runs that masked then; server mode. In client mode the clients mask their own "
                 "copy.)")
    return lines


__all__ = ["GROUPS", "arm_masks", "lips_lines", "lips_summary", "mask_rounds"]

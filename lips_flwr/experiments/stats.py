"""The study protocol's statistics (examples/paper/PROTOCOL.md): paired tests, Holm, verdicts, inertia.

Each seed gives one paired difference (method A - method B on the same data
split, initial model and batch order). For ``n`` differences:

- mean and sample standard deviation (``ddof = 1``);
- the 95% confidence interval of the mean, ``mean +- t(0.975, n-1) * sd / sqrt(n)``;
- the paired t-test, two-sided; none when every difference is the same
  (zero variance: ``t``, ``p_t`` and the CI are ``nan``, the verdict
  :data:`NO_TEST_ZERO_VARIANCE`);
- the exact sign test, two-sided (ties, exact zeros, dropped);
- Holm's step-down correction over a family of p-values;
- the verdict in the protocol's words (:func:`verdict`);
- whether layer-wise inertia arises (:func:`inertia_rho`, :func:`inertia_verdict`).

Used by ``lips-flwr compare`` and the paper's ``prereg.py``; needs scipy
(``pip install "lips-flwr[examples]"``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats as _stats

from ..errors import LipsError


def sign_test(differences: Sequence[float]) -> float:
    """Exact two-sided sign test p-value of ``differences`` (zeros dropped); 1.0 when none is left."""
    pos = sum(1 for d in differences if d > 0)
    neg = sum(1 for d in differences if d < 0)
    n = pos + neg
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(0, min(pos, neg) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired(differences: Sequence[float], confidence: float = 0.95) -> dict:
    """Summary of paired ``differences``: n, mean, sd, CI, t, p (t-test), p (sign test), wins/losses.

    :class:`~lips_flwr.errors.LipsError` (a ``ValueError``) for fewer than 2
    differences or one that is not finite.
    """
    d = np.asarray(differences, dtype=float)
    n = int(d.size)
    if n < 2:
        raise LipsError(f"a paired test needs at least 2 differences, got {n}")
    if not np.isfinite(d).all():  # (a NaN would pass for zero variance below)
        raise LipsError(f"paired differences must be finite numbers, got {d.tolist()}")
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd > 0:
        half = float(_stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
        t = mean / (sd / math.sqrt(n))
        p = float(2 * _stats.t.sf(abs(t), n - 1))
    else:  # every seed the same difference: no spread to test against (a CI [m, m] would claim certainty)
        half = t = p = math.nan
    return {"n": n, "mean": mean, "sd": sd, "ci_low": mean - half, "ci_high": mean + half,
            "t": t, "p_t": p, "p_sign": sign_test(d.tolist()), "wins": int((d > 0).sum()),
            "losses": int((d < 0).sum())}


def holm(pvalues: Mapping[str, float]) -> dict[str, float]:
    """Holm-adjusted p-values (monotone, capped at 1), by name; a ``nan`` (no test) stays ``nan``.

    A test that could not be made still counts in the family's size.
    """
    order = sorted((k for k in pvalues if not math.isnan(pvalues[k])), key=lambda k: pvalues[k])
    m, running = len(pvalues), 0.0
    out = {name: math.nan for name in pvalues if math.isnan(pvalues[name])}
    for i, name in enumerate(order):
        running = max(running, min(1.0, (m - i) * pvalues[name]))
        out[name] = running
    return out


VERDICTS = ("supported", "contradicted", "no effect detected")
NO_TEST_ZERO_VARIANCE = "no test (zero variance)"  # every seed gave the same difference: no t-test


def verdict(result: Mapping[str, float], p: float, alpha: float = 0.05) -> str:
    """The protocol's verdict for a paired ``result`` (:func:`paired`) whose (adjusted) p-value is ``p``.

    ``"supported"``: ``p < alpha`` and the CI above 0; ``"contradicted"``:
    ``p < alpha`` and the CI below 0; else ``"no effect detected"``; when
    there was no t-test (zero variance: ``p`` is ``nan``),
    :data:`NO_TEST_ZERO_VARIANCE`.
    """
    if math.isnan(p) or math.isnan(result["ci_low"]):
        return NO_TEST_ZERO_VARIANCE
    if p < alpha and result["ci_low"] > 0:
        return "supported"
    if p < alpha and result["ci_high"] < 0:
        return "contradicted"
    return "no effect detected"


EARLY_ROUNDS = range(2, 7)  # the protocol's early window, rounds 2-6
LATE_ROUNDS = 10  # its late window, the last 10 rounds
MIN_ROUNDS = EARLY_ROUNDS[-1] + LATE_ROUNDS  # fewer rounds: the windows overlap


def inertia_rho(steps: Mapping[str, Mapping[int, float]], middle: Sequence[str], edges: Sequence[str],
                last_round: int) -> dict | None:
    """One run's ``rho_l`` = late / early mean relative step per layer, and whether inertia arises in it.

    ``steps``: per weight layer, round -> relative step ``||w_t - w_{t-1}|| /
    ||w_{t-1}||``; ``middle`` and ``edges``: the middle layers and the first
    and last. Early: rounds 2-6; late: the last 10 rounds up to
    ``last_round``. Inertia arises when the middle layers' median ``rho`` is
    below half the first and last layers' mean ``rho``. ``None`` when a layer
    has no step in either window (a run too short), or no early movement.
    The windows are apart from 16 rounds on (:data:`MIN_ROUNDS`).
    """
    rho = {}
    for layer in [*middle, *edges]:
        series = steps.get(layer, {})
        early = [series[r] for r in EARLY_ROUNDS if r in series]
        late = [series[r] for r in range(last_round - LATE_ROUNDS + 1, last_round + 1) if r in series]
        if not early or not late or np.mean(early) == 0:
            return None
        rho[layer] = float(np.mean(late) / np.mean(early))
    if not middle or not edges:
        return None
    middle_rho = float(np.median([rho[m] for m in middle]))
    edge_rho = float(np.mean([rho[e] for e in edges]))
    return {"rho": rho, "middle": middle_rho, "edges": edge_rho, "arises": middle_rho < 0.5 * edge_rho}


def inertia_verdict(rhos: Sequence[Mapping]) -> dict:
    """The protocol's verdict over runs (:func:`inertia_rho` of each): it arises in at least 5 of 6.

    ``{"runs", "arises_in", "middle", "edges" (medians over runs), "verdict"}``,
    the verdict ``"arises"`` or ``"does not arise"``; with no run, ``"not
    measured"``.
    """
    if not rhos:
        return {"runs": 0, "arises_in": 0, "middle": None, "edges": None, "verdict": "not measured"}
    arises = sum(bool(r["arises"]) for r in rhos)
    return {"runs": len(rhos), "arises_in": arises, "middle": float(np.median([r["middle"] for r in rhos])),
            "edges": float(np.median([r["edges"] for r in rhos])),
            "verdict": "arises" if arises >= 5 * len(rhos) / 6 else "does not arise"}


__all__ = ["NO_TEST_ZERO_VARIANCE", "holm", "inertia_rho", "inertia_verdict", "paired", "sign_test",
           "verdict"]

"""The pre-registered study's tests: paired differences over seeds, their CI, p-values, Holm.

Each seed gives one paired difference (method A - method B on the same data
split, initial model and batch order). For ``n`` differences:

- mean and sample standard deviation (``ddof = 1``);
- the 95% confidence interval of the mean, ``mean +- t(0.975, n-1) * sd / sqrt(n)``;
- the paired t-test, two-sided;
- the exact sign test, two-sided (ties, exact zeros, dropped);
- Holm's step-down correction over a family of p-values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats as _stats


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
    """Summary of paired ``differences``: n, mean, sd, CI, t, p (t-test), p (sign test), wins/losses."""
    d = np.asarray(differences, dtype=float)
    n = int(d.size)
    if n < 2:
        raise ValueError(f"a paired test needs at least 2 differences, got {n}")
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    half = float(_stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    if sd > 0:
        t = mean / (sd / math.sqrt(n))
        p = float(2 * _stats.t.sf(abs(t), n - 1))
    else:  # every seed the same difference: zero is inside the CI only if that difference is 0
        t, p = (0.0, 1.0) if mean == 0 else (math.copysign(math.inf, mean), 0.0)
    return {"n": n, "mean": mean, "sd": sd, "ci_low": mean - half, "ci_high": mean + half,
            "t": t, "p_t": p, "p_sign": sign_test(d), "wins": int((d > 0).sum()), "losses": int((d < 0).sum())}


def holm(pvalues: Mapping[str, float]) -> dict[str, float]:
    """Holm-adjusted p-values (monotone, capped at 1), by name."""
    order = sorted(pvalues, key=lambda k: pvalues[k])
    m, running, out = len(order), 0.0, {}
    for i, name in enumerate(order):
        running = max(running, min(1.0, (m - i) * pvalues[name]))
        out[name] = running
    return out


__all__ = ["holm", "paired", "sign_test"]

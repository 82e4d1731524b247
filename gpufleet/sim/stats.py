"""Confidence intervals over Monte Carlo replications (no SciPy at run time)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054


def t_quantile_975(df: int) -> float:
    """Student-t 97.5% quantile (Hill 1970 expansion; within 1e-3 of the exact value for df >= 2)."""
    if df <= 0:
        return math.inf
    if df == 1:
        return 12.706204736
    z = Z95
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


@dataclass(frozen=True)
class Estimate:
    """A mean over replications with its 95% confidence interval."""

    mean: float
    low: float
    high: float
    n: int

    def as_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "ci95_low": self.low, "ci95_high": self.high, "runs": self.n}

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


def mean_ci(values: Sequence[float] | np.ndarray, lo: float = -math.inf, hi: float = math.inf) -> Estimate:
    """Mean and t-interval; `lo`/`hi` clip the interval to the quantity's range (e.g. a share)."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        raise ValueError("no replications")
    m = float(x.mean())
    if n == 1:
        return Estimate(m, m, m, 1)
    half = t_quantile_975(n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
    return Estimate(m, max(lo, m - half), min(hi, m + half), n)


def proportion_ci(successes: int, n: int) -> Estimate:
    """Wilson score interval (sane at 0 and n)."""
    if n == 0:
        raise ValueError("no replications")
    p = successes / n
    z2 = Z95 * Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half), n)

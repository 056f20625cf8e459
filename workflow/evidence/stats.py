"""Statistics of the learning curves: scores over seeds, and Welch's confidence interval for
the difference of two means, with Student's t from the regularized incomplete beta function
(the standard library has no t distribution, and the workflow needs no SciPy)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass
class Cell:
    """The test scores (0..1) of one pipeline at one training size, over seeds."""

    values: list[float]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float | None:
        """Sample standard deviation over seeds; None for a single run."""
        return statistics.stdev(self.values) if self.n > 1 else None


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    value = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            value *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return value


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` (> 0, not necessarily whole) degrees of freedom."""
    tail = 0.5 * regularized_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def student_t_quantile(q: float, df: float) -> float:
    """The t with P(T <= t) = q, 0.5 <= q < 1, by bisection on the CDF."""
    if not 0.5 <= q < 1.0:
        raise ValueError(f"quantile level must be in [0.5, 1), got {q}")
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < q:
        high *= 2.0
    for _ in range(200):
        middle = (low + high) / 2.0
        low, high = (middle, high) if student_t_cdf(middle, df) < q else (low, middle)
    return (low + high) / 2.0


def welch_interval(
    better: Cell, reference: Cell, level: float = 0.95
) -> tuple[float, float, float] | None:
    """(low, high, df) of Welch's interval for mean(better) - mean(reference); None unless
    both have at least two runs and some spread."""
    if better.n < 2 or reference.n < 2:
        return None
    terms = [cell.std**2 / cell.n for cell in (better, reference)]
    variance = sum(terms)
    if variance == 0.0:
        return None
    df = variance**2 / sum(t**2 / (cell.n - 1) for t, cell in zip(terms, (better, reference)))
    half = student_t_quantile(0.5 + level / 2.0, df) * math.sqrt(variance)
    difference = better.mean - reference.mean
    return difference - half, difference + half, df

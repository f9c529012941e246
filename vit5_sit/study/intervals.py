"""Intervals for a study's means over training seeds: the percentile bootstrap, Student's t, and the bootstrap
probability that one arm's mean FID is below another's, paired by training seed where both arms have the seed.

A study has 2-5 training seeds per arm, so every number here is honest about its sample: a bootstrap of n values
has only C(2n - 1, n) distinct resamples (3 for 2 seeds, 10 for 3, 126 for 5), its percentile interval never
reaches beyond the values' own range, and it covers less than its nominal 95% at such n; the t-interval beside it
is the one to read there. Numpy only (scipy is a dev-only dependency): t's quantile comes from a table.

Every bootstrap draws from a generator seeded with ``SEED`` afresh, so a report is the same on every run and
does not depend on the order in which its numbers are computed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95            # two-sided coverage of every interval here
RESAMPLES = 10_000      # bootstrap resamples of the training seeds
SEED = 0                # bootstrap RNG seed: a report is reproducible
FEW_SEEDS = 5           # below this many seeds (10 distinct resamples at 3) a bootstrap interval is marked as resting
                        # on too few seeds; the t-interval is given beside it
# Student's t 0.975 quantile (two-sided 95%) by degrees of freedom; between and beyond the tabulated df the next
# one below is used (a slightly wider interval, never a narrower one).
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
         29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t_quantile(df: int) -> float:
    """Student's t quantile at 0.975 (the half-width factor of a two-sided 95% interval), df >= 1."""
    if df < 1:
        raise ValueError(f"t_quantile: df must be >= 1, got {df}")
    return _T975[max(k for k in _T975 if k <= df)]


def t_interval(values) -> tuple[float, float] | None:
    """The 95% t-interval of the mean, mean ± t(n-1) sd / sqrt(n); None for fewer than 2 values."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2:
        return None
    half = t_quantile(len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return float(x.mean()) - half, float(x.mean()) + half


def distinct_resamples(n: int) -> int:
    """How many different multisets a bootstrap of n values can draw: C(2n - 1, n)."""
    return math.comb(2 * n - 1, n) if n > 0 else 0


def _percentiles(draws: np.ndarray) -> tuple[float, float]:
    tail = 100 * (1 - LEVEL) / 2
    low, high = np.percentile(draws, [tail, 100 - tail])
    return float(low), float(high)


def bootstrap_means(values, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """The means of ``resamples`` resamples (with replacement, n of n) of ``values``."""
    x = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    return x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)


def bootstrap_interval(values, resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float] | None:
    """The percentile bootstrap 95% interval of the mean; None for fewer than 2 values."""
    if len(values) < 2:
        return None
    return _percentiles(bootstrap_means(values, resamples, seed))


@dataclass(frozen=True)
class Comparison:
    """Arm a against arm b (scores by training seed): the difference of their means a - b and its bootstrap."""
    diff: float                            # mean(a) - mean(b), each over all of its own seeds
    interval: tuple[float, float] | None   # percentile bootstrap 95% of diff; None when it cannot vary
    p_ahead: float                         # P(mean(a) < mean(b)) over the resamples, a tie counted as half
    ties: float                            # the share of resamples where the two means are equal
    shared: tuple[int, ...]                # seeds both have: resampled together (paired)
    only_a: tuple[int, ...]                # seeds of one arm only: resampled within that arm
    only_b: tuple[int, ...]
    distinct: int                          # distinct resamples the bootstrap can draw

    @property
    def paired(self) -> bool:
        return bool(self.shared) and not self.only_a and not self.only_b


def compare(a: dict[int, float], b: dict[int, float], resamples: int = RESAMPLES, seed: int = SEED) -> Comparison:
    """Bootstrap of mean(a) - mean(b) over training seeds, paired where the seeds are shared.

    A stratified bootstrap: each resample draws the shared seeds with replacement as pairs (the same seeds for
    both arms, so what the seed fixes in both runs cancels), and each arm's other seeds with replacement among
    themselves; every arm's mean keeps its seed count. With every seed shared this is the paired bootstrap of
    the differences d_s = a_s - b_s; with none shared, two independent bootstraps. A resample where the two
    means are equal (to rounding) is a tie and counts half towards ``p_ahead``: identical arms give 0.5.
    """
    if not a or not b:
        raise ValueError("compare: each arm needs at least one scored seed")
    shared = tuple(s for s in a if s in b)
    only_a, only_b = tuple(s for s in a if s not in b), tuple(s for s in b if s not in a)
    rng = np.random.default_rng(seed)

    def draw(seeds: tuple[int, ...], *arms: dict[int, float]) -> list[np.ndarray]:
        """Per arm, the sum over one resample of ``seeds`` (the same draws for every arm given)."""
        if not seeds:
            return [np.zeros(resamples) for _ in arms]
        idx = rng.integers(0, len(seeds), size=(resamples, len(seeds)))
        return [np.array([arm[s] for s in seeds], dtype=np.float64)[idx].sum(axis=1) for arm in arms]

    sum_a, sum_b = draw(shared, a, b)
    sum_a = sum_a + draw(only_a, a)[0]
    sum_b = sum_b + draw(only_b, b)[0]
    delta = sum_a / len(a) - sum_b / len(b)
    scale = max(abs(v) for v in (*a.values(), *b.values()))
    tie = np.abs(delta) <= 1e-9 * max(scale, 1.0)
    distinct = math.prod(distinct_resamples(len(g)) for g in (shared, only_a, only_b) if g)
    diff = float(np.mean(list(a.values())) - np.mean(list(b.values())))
    return Comparison(diff=diff, interval=_percentiles(delta) if distinct > 1 else None,
                      p_ahead=float(np.mean(np.where(tie, 0.5, delta < 0))), ties=float(tie.mean()),
                      shared=shared, only_a=only_a, only_b=only_b, distinct=distinct)


def few_seeds(n: int) -> bool:
    """Whether a bootstrap over n seeds rests on too few of them to be read as a 95% interval."""
    return n < FEW_SEEDS


def percent(p: float) -> str:
    """A probability in plain words' form: '93%', '100%', '< 1%' / '> 99%' only where it is not exact."""
    if 0 < p < 0.005:
        return "< 1%"
    if 0.995 <= p < 1:
        return "> 99%"
    return f"{100 * p:.0f}%"

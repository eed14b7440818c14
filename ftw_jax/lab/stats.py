"""The statistics that report seeds: intervals for one method's mean, and tests of two methods' difference.

low, high = t_interval(finals)                  # 95% Student-t interval of the mean over seeds
row = seed_statistics(finals)                   # mean, t- and bootstrap intervals, IQM
test = welch(ftw_finals, ppo_finals)            # difference, Welch's interval and p-value
verdict(ftw_finals, ppo_finals, margin=0.05)    # "better", "worse", "equivalent" or "inconclusive"
adjusted = holm(p_values)                       # a table's p-values, adjusted for their number (Holm)
"""

from __future__ import annotations

import numpy as np
import scipy.stats

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 10_000


def interquartile_mean(values: np.ndarray, axis: int = 0) -> np.ndarray:
    """The mean of the middle half (scipy's 25% trimmed mean): robust to one run that diverged or got lucky."""
    return scipy.stats.trim_mean(np.asarray(values, np.float64), 0.25, axis=axis)


def bootstrap_interval(values: np.ndarray, axis: int = 0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The 95% percentile-bootstrap interval of the mean over `axis` (seeds); deterministic given `seed`."""
    values = np.asarray(values, np.float64)
    if values.shape[axis] < 2:
        return values.mean(axis=axis), values.mean(axis=axis)
    result = scipy.stats.bootstrap(
        (values,),
        np.mean,
        axis=axis,
        confidence_level=CONFIDENCE,
        method="percentile",
        n_resamples=BOOTSTRAP_RESAMPLES,
        rng=np.random.default_rng(seed),
    )
    return result.confidence_interval.low, result.confidence_interval.high


def t_interval(values: np.ndarray) -> tuple[float, float]:
    """The 95% Student-t interval of the mean of one value per seed (wider than the bootstrap's at few seeds)."""
    values = np.asarray(values, np.float64)
    if values.size < 2 or np.all(values == values[0]):
        return float(values.mean()), float(values.mean())
    low, high = scipy.stats.t.interval(CONFIDENCE, values.size - 1, loc=values.mean(), scale=scipy.stats.sem(values))
    return float(low), float(high)


def seed_statistics(values: np.ndarray) -> dict:
    """mean, 95% t-interval, 95% bootstrap CI and IQM of one value per seed."""
    low, high = bootstrap_interval(values)
    t_low, t_high = t_interval(values)
    return {
        "mean": float(np.mean(values)),
        "t_low": t_low,
        "t_high": t_high,
        "ci_low": float(low),
        "ci_high": float(high),
        "iqm": float(interquartile_mean(values)),
    }


def welch(a: np.ndarray, b: np.ndarray, confidence: float = CONFIDENCE) -> dict:
    """mean(a) − mean(b), its Welch–Satterthwaite interval at `confidence`, and Welch's two-sided p-value."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    variance_a, variance_b = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    difference, standard_error = a.mean() - b.mean(), np.sqrt(variance_a + variance_b)
    if standard_error == 0:
        return {
            "difference": float(difference),
            "low": float(difference),
            "high": float(difference),
            "p_value": 1.0 if difference == 0 else 0.0,
        }
    dof = (variance_a + variance_b) ** 2 / (variance_a**2 / (a.size - 1) + variance_b**2 / (b.size - 1))
    half = scipy.stats.t.ppf(0.5 + confidence / 2, dof) * standard_error
    p_value = scipy.stats.ttest_ind(a, b, equal_var=False).pvalue  # pyright: ignore[reportAttributeAccessIssue]
    return {
        "difference": float(difference),
        "low": float(difference - half),
        "high": float(difference + half),
        "p_value": float(p_value),
    }


def rank_test(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sided Mann–Whitney U test's p-value for a vs b (exact where scipy can, ties corrected): no
    normality assumed, which bounded, bimodal results (most seeds at 100%, a few stuck) violate."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if np.all(a == a[0]) and np.array_equal(np.unique(a), np.unique(b)):
        return 1.0  # every value the same: scipy's statistic is undefined
    return float(scipy.stats.mannwhitneyu(a, b, alternative="two-sided").pvalue)


def holm(p_values: np.ndarray) -> np.ndarray:
    """Holm's step-down adjustment of a family of p-values [m] (the tests of one table): the i-th smallest becomes
    max over j <= i of min(1, (m − j + 1) p_(j)), so "adjusted p < 5%" holds the chance of any false "better" or
    "worse" in the family at 5% (Holm 1979). scipy adjusts only for the false discovery rate, statsmodels would
    be a large dependency for these four lines."""
    p_values = np.asarray(p_values, np.float64)
    order = np.argsort(p_values, kind="stable")
    scaled = np.minimum(1.0, (p_values.size - np.arange(p_values.size)) * p_values[order])
    adjusted = np.empty_like(p_values)
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted


def p_text(p_value: float) -> str:
    """A p-value as a table prints it: three decimals, or "p < 0.001" (never "p = 0.000")."""
    return "p < 0.001" if p_value < 0.001 else f"p = {p_value:.3f}"


def verdict(a: np.ndarray, b: np.ndarray, margin: float, p_value: float | None = None) -> str:
    """ "better", "worse", "equivalent" (the 90% interval of the difference inside ±margin: two one-sided tests at
    5%) or "inconclusive", for a − b from one value per seed each; "better" or "worse" where `p_value` (default
    Welch's; a table passes its Holm-adjusted one, `holm`) is below 5%."""
    test = welch(a, b)
    if (test["p_value"] if p_value is None else p_value) < 1 - CONFIDENCE:
        return "better" if test["difference"] > 0 else "worse"
    equivalence = welch(a, b, confidence=1 - 2 * (1 - CONFIDENCE))
    return "equivalent" if -margin < equivalence["low"] and equivalence["high"] < margin else "inconclusive"

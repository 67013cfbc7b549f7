"""Estimates, binomial intervals (Wilson, Clopper-Pearson) and task-level suite intervals."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ._special import (
    BoolArray,
    FloatArray,
    IntArray,
    _beta_quantile,
    _check_confidence,
    _t_quantile,
    _whole,
    _z,
)

INTERVAL_METHODS: Mapping[str, str] = {
    "wilson": "Wilson score interval for a binomial proportion",
    "clopper-pearson": "Clopper-Pearson (exact binomial) interval",
    "wilson-neff-padded": "Wilson score interval at the effective number of tasks, the task "
    "variance padded by 0.3 of a pseudo-task at 0 and at 1 (suites whose task values are not all "
    "0 or 1)",
    "wilson-neff-t": "Wilson score interval at the effective number of tasks, Student-t quantile "
    "(the per-run intervals under paired differences and the null model)",
    "clopper-pearson-tasks": "Clopper-Pearson with each task as one Bernoulli draw (suites whose "
    "task values are all 0 or 1, e.g. pass^k at k = n)",
    "wilson-neff-t-clustered": "wilson-neff-t with a cluster-robust standard error",
    "clopper-pearson-clustered": "clopper-pearson-tasks at the clusters' effective task count",
    "mover-t-hull": "hull of Newcombe's paired MOVER interval and the paired t interval",
    "percentile-bootstrap": "task-level percentile bootstrap (undercovers for small suites)",
}

# Below this many tasks' worth of successes (or failures) the task-level variance is too poorly
# estimated to trust: the coverage simulation fails at 2 and holds at 3 and 5.
_SPARSE_MASS = 5.0

# Pseudo-tasks added to the task-level sum of squares of a suite interval, half at 0 and half at
# 1 in effect (``_PSEUDO_TASKS * (m^2 + (1 - m)^2)``): they widen the interval most where few
# tasks carry the mean (an estimate near 0 or 1, a small suite), where the sample variance is
# least reliable. Tuned on benchmarks/interval_coverage.py's tuning grid (0.15 undercovers,
# 0.3 holds) and checked on its held-out grid.
_PSEUDO_TASKS = 0.3


# --------------------------------------------------------------------------------------------
# Estimates and binomial intervals.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """A point estimate with a confidence interval and what it rests on.

    Attributes:
        value: The point estimate.
        low: Lower end of the interval.
        high: Upper end of the interval.
        method: The interval method (a key of ``INTERVAL_METHODS``).
        confidence: Nominal coverage, e.g. 0.95.
        n_tasks: Independent units behind the interval: tasks for suite estimates, trials or
            steps for a plain binomial proportion.
        k: The k of pass^k / pass@k, when there is one.
        se: Standard error of ``value`` at the unit level, when defined.
        n_eff: Effective sample size the interval used, when it used one.
        n_trials: Total trials behind a suite estimate.
        n_clusters: Number of task families, for cluster-robust estimates.
    """

    value: float
    low: float
    high: float
    method: str
    confidence: float
    n_tasks: int
    k: int | None = None
    se: float | None = None
    n_eff: float | None = None
    n_trials: int | None = None
    n_clusters: int | None = None

    @property
    def width(self) -> float:
        """``high - low``."""
        return self.high - self.low

    def contains(self, x: float) -> bool:
        """Whether ``x`` lies in the closed interval."""
        return self.low <= x <= self.high

    def to_dict(self) -> dict[str, float | int | str | None]:
        """The estimate as a JSON-ready dict (same keys as the attributes)."""
        return {
            "value": self.value,
            "low": self.low,
            "high": self.high,
            "method": self.method,
            "confidence": self.confidence,
            "n_tasks": self.n_tasks,
            "k": self.k,
            "se": self.se,
            "n_eff": self.n_eff,
            "n_trials": self.n_trials,
            "n_clusters": self.n_clusters,
        }

    def __str__(self) -> str:
        return (
            f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}] "
            f"({self.confidence:.0%} {self.method}, n={self.n_tasks})"
        )


def _check_binomial(c: int, n: int) -> tuple[int, int]:
    c_, n_ = int(_whole("c", c)), int(_whole("n", n))
    if n_ < 1:
        raise ValueError(f"n must be at least 1, got {n!r}")
    if not 0 <= c_ <= n_:
        raise ValueError(f"c must lie between 0 and n={n_}, got {c!r}")
    return c_, n_


def _wilson_bounds(m: FloatArray, n: FloatArray, z: float) -> tuple[FloatArray, FloatArray]:
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (m + z2 / (2.0 * n)) / denom
    half = (z / denom) * np.sqrt(np.maximum(m * (1.0 - m), 0.0) / n + z2 / (4.0 * n * n))
    low = np.where(m <= 0.0, 0.0, np.clip(center - half, 0.0, 1.0))
    high = np.where(m >= 1.0, 1.0, np.clip(center + half, 0.0, 1.0))
    return low, high


def _cp_bounds(x: FloatArray, n: FloatArray, confidence: float) -> tuple[FloatArray, FloatArray]:
    """Clopper-Pearson bounds for x successes in n (x may be fractional: the beta extension)."""
    alpha = 1.0 - confidence
    low, high = np.zeros(x.shape), np.ones(x.shape)
    pos, below = x > 0, x < n
    if pos.any():
        low[pos] = _beta_quantile(alpha / 2.0, x[pos], n[pos] - x[pos] + 1.0)
    if below.any():
        high[below] = _beta_quantile(1.0 - alpha / 2.0, x[below] + 1.0, n[below] - x[below])
    return low, high


def wilson(c: int, n: int, confidence: float = 0.95) -> Estimate:
    """Wilson score interval for ``c`` successes in ``n`` independent trials.

    Args:
        c: Successes, ``0 <= c <= n``.
        n: Trials, at least 1.
        confidence: Nominal coverage in (0, 1).

    Returns:
        An ``Estimate`` with ``value = c / n`` and ``method = "wilson"``.

    Raises:
        ValueError: Counts out of range or not whole numbers; confidence outside (0, 1).
    """
    c_, n_ = _check_binomial(c, n)
    conf = _check_confidence(confidence)
    m = c_ / n_
    low, high = _wilson_bounds(np.array(m), np.array(float(n_)), _z(conf))
    return Estimate(
        value=m,
        low=float(low),
        high=float(high),
        method="wilson",
        confidence=conf,
        n_tasks=n_,
        se=math.sqrt(m * (1.0 - m) / n_),
        n_eff=float(n_),
    )


def clopper_pearson(c: int, n: int, confidence: float = 0.95) -> Estimate:
    """Clopper-Pearson (exact, conservative) interval for ``c`` successes in ``n`` trials.

    Args:
        c: Successes, ``0 <= c <= n``.
        n: Trials, at least 1.
        confidence: Nominal coverage in (0, 1).

    Returns:
        An ``Estimate`` with ``value = c / n`` and ``method = "clopper-pearson"``.

    Raises:
        ValueError: Counts out of range or not whole numbers; confidence outside (0, 1).
    """
    c_, n_ = _check_binomial(c, n)
    conf = _check_confidence(confidence)
    m = c_ / n_
    low, high = _cp_bounds(np.array([float(c_)]), np.array([float(n_)]), conf)
    return Estimate(
        value=m,
        low=float(low[0]),
        high=float(high[0]),
        method="clopper-pearson",
        confidence=conf,
        n_tasks=n_,
        se=math.sqrt(m * (1.0 - m) / n_),
        n_eff=float(n_),
    )


# --------------------------------------------------------------------------------------------
# Task-level intervals for suites.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Clusters:
    order: IntArray  # tasks sorted by cluster
    starts: IntArray  # first position of each cluster in ``order``
    count: int
    n_units: float  # T^2 / sum(size^2): independent units under perfect within-cluster correlation


def _clusters(labels: Sequence[Hashable] | npt.ArrayLike, n_tasks: int) -> _Clusters:
    arr = np.asarray(labels)
    if arr.shape != (n_tasks,):
        raise ValueError(f"clusters must hold one label per task ({n_tasks}), got {arr.shape}")
    _, codes, sizes = np.unique(arr, return_inverse=True, return_counts=True)
    if len(sizes) < 2:
        raise ValueError("clusters must contain at least two distinct families")
    order = np.argsort(codes, kind="stable").astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    units = n_tasks**2 / float(np.sum(sizes.astype(np.float64) ** 2))
    return _Clusters(order=order, starts=starts, count=len(sizes), n_units=units)


@dataclass(frozen=True, eq=False)
class _Bounds:
    value: FloatArray
    low: FloatArray
    high: FloatArray
    se: FloatArray
    n_eff: FloatArray
    sparse: BoolArray


def _task_bounds(
    x: FloatArray, cap: FloatArray, confidence: float, clusters: _Clusters | None
) -> _Bounds:
    """Interval for the mean of per-task values in [0, 1], one row of ``x`` (R, T) per suite."""
    n_tasks = x.shape[-1]
    m = x.mean(axis=-1)
    resid = x - m[..., None]
    # Sample variance of the task values over T: the squared standard error of their mean.
    se2 = np.sum(resid**2, axis=-1) / max(n_tasks - 1, 1) / n_tasks
    if clusters is None:
        worst, df = float(n_tasks), n_tasks - 1
        units = np.full(m.shape, worst)
    else:
        worst, df, g = clusters.n_units, clusters.count - 1, clusters.count
        totals = np.add.reduceat(resid[..., clusters.order], clusters.starts, axis=-1)
        se2_tasks, se2 = se2, g / (g - 1) * np.sum(totals**2, axis=-1) / n_tasks**2
        # Tasks' worth of independent information: T over the estimated design effect.
        with np.errstate(divide="ignore", invalid="ignore"):
            units = n_tasks * se2_tasks / se2
        units = np.clip(np.nan_to_num(units, nan=worst, posinf=worst), worst, n_tasks)
    cap = np.maximum(np.broadcast_to(cap, m.shape), units)
    with np.errstate(divide="ignore", invalid="ignore"):
        n_eff = np.where(se2 > 0, m * (1.0 - m) / se2, cap)
    n_eff = np.clip(np.nan_to_num(n_eff, nan=worst), units, cap)
    sparse = (units * m < _SPARSE_MASS) | (units * (1.0 - m) < _SPARSE_MASS)
    dense = ~sparse
    low, high = np.empty_like(m), np.empty_like(m)
    if dense.any():
        z = _t_quantile(max(df, 1), 0.5 + confidence / 2.0)
        low[dense], high[dense] = _wilson_bounds(m[dense], n_eff[dense], z)
    if sparse.any():
        # Each task (or, with clusters, each worst-case unit) as one Bernoulli draw.
        n_units = np.full(int(sparse.sum()), worst)
        low[sparse], high[sparse] = _cp_bounds(worst * m[sparse], n_units, confidence)
        n_eff = np.where(sparse, worst, n_eff)
    # The clipped Wilson/CP bounds can sit a rounding error off the point estimate.
    low, high = np.minimum(low, m), np.maximum(high, m)
    return _Bounds(value=m, low=low, high=high, se=np.sqrt(se2), n_eff=n_eff, sparse=sparse)


def _padded_bounds(x: FloatArray, cap: FloatArray, confidence: float) -> _Bounds:
    """Interval for the mean of per-task values in [0, 1] (one row of ``x`` per suite), unclustered.

    Rows whose values are all 0 or 1 get Clopper-Pearson on ``T`` Bernoulli draws (``sparse``
    is True for them); the others a Wilson score interval, normal quantile, at
    ``n_eff = m(1 - m) T (T - 1) / (sum of squares + pseudo-tasks)``, kept in ``[T, cap]``.
    """
    n_tasks = x.shape[-1]
    m = x.mean(axis=-1)
    ss = np.sum((x - m[..., None]) ** 2, axis=-1)
    se2 = ss / max(n_tasks - 1, 1) / n_tasks
    binary = np.all((x == 0.0) | (x == 1.0), axis=-1)
    # m^2 + (1 - m)^2 >= 1/2: with pseudo-tasks the padded sum of squares is never 0.
    padded = ss + _PSEUDO_TASKS * (m * m + (1.0 - m) ** 2)
    top = np.maximum(np.broadcast_to(cap, m.shape), float(n_tasks))
    with np.errstate(divide="ignore", invalid="ignore"):
        n_eff = m * (1.0 - m) * n_tasks * max(n_tasks - 1, 1) / padded
    n_eff = np.clip(np.where(padded > 0.0, n_eff, top), n_tasks, top)
    n_eff = np.where(binary, float(n_tasks), n_eff)
    low, high = np.empty_like(m), np.empty_like(m)
    dense = ~binary
    if dense.any():
        low[dense], high[dense] = _wilson_bounds(m[dense], n_eff[dense], _z(confidence))
    if binary.any():
        count = np.round(n_tasks * m[binary])
        low[binary], high[binary] = _cp_bounds(
            count, np.full(count.shape, float(n_tasks)), confidence
        )
    low, high = np.minimum(low, m), np.maximum(high, m)
    return _Bounds(value=m, low=low, high=high, se=np.sqrt(se2), n_eff=n_eff, sparse=binary)


def _suite_bounds(
    x: FloatArray, cap: FloatArray, confidence: float, clusters: _Clusters | None
) -> _Bounds:
    """A suite's task-level interval: padded Wilson or Clopper-Pearson, or the clustered one."""
    if clusters is None:
        return _padded_bounds(x, cap, confidence)
    return _task_bounds(x, cap, confidence, clusters)


def _method(sparse: bool, clustered: bool) -> str:
    """The method ``_suite_bounds`` took for one suite (``sparse``: its ``_Bounds.sparse``)."""
    if clustered:
        return "clopper-pearson-clustered" if sparse else "wilson-neff-t-clustered"
    return "clopper-pearson-tasks" if sparse else "wilson-neff-padded"

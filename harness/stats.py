"""Reliability statistics: pass^k and pass@k with intervals chosen for coverage.

Everything here is a pure function of counts (numpy-vectorised, no state, no I/O).

The estimand of a suite estimate is the *task population*: ``E[p^k]``, the expected pass^k of a
task drawn from the population the suite samples, where ``p`` is that task's success probability.
Per task, ``C(c, k) / C(n, k)`` is the unbiased estimator of ``p^k`` from ``n`` trials with ``c``
successes; the suite value is its mean over tasks. Intervals are computed at the task level only
(trials inside a task are never resampled or treated as independent units of the population).

Interval methods (``Estimate.method``):

``wilson-neff-t``
    Wilson score interval at the effective number of tasks ``n_eff = m(1 - m) / se^2`` (``se``
    the task-level standard error; ``n_eff`` kept within ``[T, total trials]``), with a Student-t
    quantile on ``T - 1`` degrees of freedom in place of the normal one. Used when the suite holds
    at least five tasks' worth of both successes and failures (``T*m >= 5`` and
    ``T*(1 - m) >= 5``).
``clopper-pearson-tasks``
    Otherwise: Clopper-Pearson with ``n = T`` and ``x = T*m`` successes, i.e. each task counted
    as one Bernoulli draw, the most dispersed law on ``[0, 1]`` with that mean. Near 0 and 1, and
    for suites under ten tasks, the task-level variance cannot be estimated reliably; this
    branch does not need it and is conservative.
``...-clustered``
    With task families (``clusters``), the standard error is cluster-robust and the degrees of
    freedom are ``G - 1``. The task count in the sparse test and in the floor of ``n_eff`` becomes
    ``T`` over the estimated design effect (``se_cluster^2 / se_task^2``), kept between ``T`` and
    ``T^2 / sum(size_g^2)``, the number of independent units if tasks of a family were perfectly
    correlated; the Clopper-Pearson branch uses that worst case.
``mover-t-hull``
    Paired difference of two runs: the hull of Newcombe's MOVER interval (built from the two
    task-level intervals and the correlation of the per-task values) and the paired t interval
    on per-task differences. Each alone undercovers somewhere (t where differences are sparse,
    MOVER slightly where they are dense); the hull costs about 1% width.

``tests/test_stats.py`` proves the coverage by simulation (task difficulty from several Beta
laws, 10 to 50 tasks, several ``(n, k)``); the worst cell it measured is recorded there.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from statistics import NormalDist
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt

__all__ = [
    "INFRA_POLICIES",
    "INTERVAL_METHODS",
    "Estimate",
    "InfraPolicy",
    "NullModel",
    "NullModelRow",
    "SelfConditioning",
    "SuiteCurve",
    "apply_infra_policy",
    "bootstrap_curve",
    "clopper_pearson",
    "fit_step_success",
    "horizon",
    "null_model",
    "paired_difference",
    "paired_difference_batch",
    "pass_at_k",
    "pass_hat_k",
    "self_conditioning",
    "suite_curve",
    "suite_pass_at_k",
    "suite_pass_hat_k",
    "suite_pass_hat_k_batch",
    "wilson",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

InfraPolicy = Literal["fail", "exclude"]
"""How trials that ended in an infrastructure error count.

``"fail"``: as failed trials (tau-bench's convention). ``"exclude"``: dropped from the trial
count (tau2-bench's convention). Reports state which one they used.
"""

INFRA_POLICIES: tuple[InfraPolicy, ...] = ("fail", "exclude")

INTERVAL_METHODS: Mapping[str, str] = {
    "wilson": "Wilson score interval for a binomial proportion",
    "clopper-pearson": "Clopper-Pearson (exact binomial) interval",
    "wilson-neff-t": "Wilson score interval at the effective number of tasks, Student-t quantile",
    "clopper-pearson-tasks": "Clopper-Pearson with each task as one Bernoulli draw (sparse suites)",
    "wilson-neff-t-clustered": "wilson-neff-t with a cluster-robust standard error",
    "clopper-pearson-clustered": "clopper-pearson-tasks at the clusters' effective task count",
    "mover-t-hull": "hull of Newcombe's paired MOVER interval and the paired t interval",
    "percentile-bootstrap": "task-level percentile bootstrap (undercovers for small suites)",
}

# Below this many tasks' worth of successes (or failures) the task-level variance is too poorly
# estimated to trust: the coverage simulation fails at 2 and holds at 3 and 5.
_SPARSE_MASS = 5.0


# --------------------------------------------------------------------------------------------
# Special functions: regularized incomplete beta, its inverse, t quantiles.
# --------------------------------------------------------------------------------------------

_TINY = 1e-300


def _lgamma(x: FloatArray) -> FloatArray:
    flat = [math.lgamma(float(v)) for v in x.ravel()]
    return np.asarray(flat, dtype=np.float64).reshape(x.shape)


def _log_beta(a: FloatArray, b: FloatArray) -> FloatArray:
    return _lgamma(a) + _lgamma(b) - _lgamma(a + b)


def _beta_cf(a: FloatArray, b: FloatArray, x: FloatArray) -> FloatArray:
    """Continued fraction of I_x(a, b) (modified Lentz); converges fast for x < (a+1)/(a+b+2)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = np.ones_like(x)
    d = 1.0 - qab * x / qap
    d = 1.0 / np.where(np.abs(d) < _TINY, _TINY, d)
    h = d.copy()
    # Convergence takes O(sqrt(max(a, b))) terms; the cap only guards against a runaway loop.
    max_terms = 200 + int(10 * math.sqrt(float(np.max(np.maximum(a, b), initial=1.0))))
    for m in range(1, max_terms + 1):
        m2 = 2 * m
        for aa in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + aa * d
            d = 1.0 / np.where(np.abs(d) < _TINY, _TINY, d)
            c = 1.0 + aa / c
            c = np.where(np.abs(c) < _TINY, _TINY, c)
            delta = d * c
            h = h * delta
        if np.all(np.abs(delta - 1.0) < 1e-15):
            break
    return h


def _betainc(a: FloatArray, b: FloatArray, x: FloatArray) -> FloatArray:
    """Regularized incomplete beta I_x(a, b), elementwise (a, b > 0)."""
    a, b, x = np.broadcast_arrays(a, b, x)
    out = np.where(x >= 1.0, 1.0, 0.0)
    inner = (x > 0.0) & (x < 1.0)
    if not inner.any():
        return out
    ai, bi, xi = a[inner], b[inner], x[inner]
    log_front = ai * np.log(xi) + bi * np.log1p(-xi) - _log_beta(ai, bi)
    flip = xi >= (ai + 1.0) / (ai + bi + 2.0)
    pa, pb, px = np.where(flip, bi, ai), np.where(flip, ai, bi), np.where(flip, 1.0 - xi, xi)
    part = np.exp(log_front) * _beta_cf(pa, pb, px) / pa
    out[inner] = np.where(flip, 1.0 - part, part)
    return out


def _betaincinv(a: FloatArray, b: FloatArray, q: FloatArray) -> FloatArray:
    """Inverse of I_x(a, b) in x, elementwise: Newton steps safeguarded by bisection.

    Converges to a relative tolerance of 1e-12 in x (the tests check 1e-10 absolute).
    """
    a, b, q = (np.asarray(v, dtype=np.float64) for v in np.broadcast_arrays(a, b, q))
    lo, hi = np.zeros(q.shape), np.ones(q.shape)
    lb = _log_beta(a, b)
    with np.errstate(all="ignore"):
        # Tail approximations I_x ~ x^a / (a B) and 1 - I_x ~ (1-x)^b / (b B) give a start
        # close to the root when it sits near 0 or 1; otherwise start at the mean.
        near0 = np.exp((np.log(q) + np.log(a) + lb) / a)
        near1 = -np.expm1((np.log1p(-q) + np.log(b) + lb) / b)
    mean = a / (a + b)
    x = np.where(near0 < mean, near0, np.where(near1 > mean, near1, mean))
    x = np.clip(np.nan_to_num(x, nan=0.5), _TINY, 1.0 - 1e-16)
    done = np.zeros(q.shape, dtype=bool)
    for _ in range(400):
        f = _betainc(a, b, x) - q
        lo = np.where(f < 0, x, lo)
        hi = np.where(f >= 0, x, hi)
        with np.errstate(all="ignore"):
            log_pdf = (a - 1.0) * np.log(x) + (b - 1.0) * np.log1p(-x) - lb
            newton = x - f / np.exp(log_pdf)
        bad = ~np.isfinite(newton) | (newton < lo) | (newton > hi)
        # Bisect geometrically while the bracket spans orders of magnitude (roots near 0).
        mid = np.where(
            lo == 0.0, 0.01 * hi, np.where(lo < 1e-3 * hi, np.sqrt(lo * hi), 0.5 * (lo + hi))
        )
        new = np.where(bad, mid, newton)
        done |= (~bad & (np.abs(new - x) <= 1e-12 * x)) | (hi - lo <= 1e-12 * hi)
        x = new
        if done.all():
            break
    return np.where(q <= 0.0, 0.0, np.where(q >= 1.0, 1.0, x))


def _beta_quantile(q: float, a: FloatArray, b: FloatArray) -> FloatArray:
    return _betaincinv(a, b, np.full(np.shape(a), q))


@lru_cache(maxsize=256)
def _t_quantile(df: int, q: float) -> float:
    """Quantile q (> 0.5) of Student's t on df degrees of freedom, via the incomplete beta."""
    x = float(_betaincinv(np.array(df / 2.0), np.array(0.5), np.array(2.0 * (1.0 - q))))
    return math.sqrt(df * (1.0 - x) / x)


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


# --------------------------------------------------------------------------------------------
# Argument checks.
# --------------------------------------------------------------------------------------------


def _check_confidence(confidence: float) -> float:
    if not isinstance(confidence, int | float) or not 0.0 < float(confidence) < 1.0:
        raise ValueError(f"confidence must be a number in (0, 1), got {confidence!r}")
    return float(confidence)


def _whole(name: str, value: Any) -> IntArray:
    """``value`` as an int64 array, or a ValueError naming ``name`` if it holds non-integers."""
    arr = np.asarray(value)
    if arr.dtype == np.bool_:
        return arr.astype(np.int64)
    if np.issubdtype(arr.dtype, np.integer):
        return arr.astype(np.int64)
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise ValueError(f"{name} must hold whole numbers, got {value!r}")
        return arr.astype(np.int64)
    raise ValueError(f"{name} must be an integer or an array of integers, got {value!r}")


def _first_bad(mask: npt.NDArray[np.bool_]) -> str:
    if mask.ndim == 0:
        return ""
    index = np.unravel_index(int(np.argmax(mask)), mask.shape)
    return f" (first at index {index[0] if len(index) == 1 else index})"


def _check_nck(n: Any, c: Any, k: Any) -> tuple[IntArray, IntArray, IntArray]:
    n_, c_, k_ = (_whole(name, v) for name, v in (("n", n), ("c", c), ("k", k)))
    try:
        n_, c_, k_ = np.broadcast_arrays(n_, c_, k_)
    except ValueError:
        raise ValueError(
            f"n, c and k must broadcast together, got shapes {np.shape(n)}, {np.shape(c)}, "
            f"{np.shape(k)}"
        ) from None
    for name, bad, what in (
        ("n", n_ < 1, "the number of trials must be at least 1"),
        ("c", (c_ < 0) | (c_ > n_), "the successes must lie between 0 and n"),
        ("k", k_ < 1, "k must be at least 1"),
    ):
        if bad.any():
            raise ValueError(f"{name} is out of range{_first_bad(bad)}: {what}")
    if (k_ > n_).any():
        bad = k_ > n_
        where = _first_bad(bad)
        kk, nn = int(k_[bad].flat[0]), int(n_[bad].flat[0])
        raise ValueError(
            f"k={kk} exceeds the number of trials n={nn}{where}: pass^k needs at least k trials"
        )
    return n_, c_, k_


# --------------------------------------------------------------------------------------------
# Per-task estimators.
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=8)
def _log_factorials(upto: int) -> FloatArray:
    table = np.array([math.lgamma(i + 1.0) for i in range(upto + 1)], dtype=np.float64)
    table.setflags(write=False)
    return table


def _comb_ratio(top: IntArray, n: IntArray, k: IntArray) -> FloatArray:
    """C(top, k) / C(n, k) for 0 <= top <= n, 1 <= k <= n, through log-factorials (stable)."""
    lf = _log_factorials(int(n.max(initial=0)))
    ok = top >= k
    safe_top = np.where(ok, top, k)
    log_ratio = lf[safe_top] - lf[safe_top - k] - lf[n] + lf[n - k]
    # Rounding in the log-factorials must not push a ratio past 1 (top = n is exactly 1).
    ratio = np.where(top == n, 1.0, np.minimum(np.exp(log_ratio), 1.0))
    return np.where(ok, ratio, 0.0)


@overload
def pass_hat_k(n: int, c: int, k: int) -> float: ...
@overload
def pass_hat_k(n: npt.ArrayLike, c: npt.ArrayLike, k: npt.ArrayLike) -> FloatArray: ...
def pass_hat_k(n: npt.ArrayLike, c: npt.ArrayLike, k: npt.ArrayLike) -> float | FloatArray:
    """Unbiased estimate of pass^k (``p^k``) for a task: ``C(c, k) / C(n, k)``.

    Args:
        n: Trials per task (scalar or array; tasks may have unequal counts).
        c: Successes per task, ``0 <= c <= n``.
        k: How many trials must all pass, ``1 <= k <= n``.

    Returns:
        A float for scalar arguments, else an array of the broadcast shape.

    Raises:
        ValueError: An argument is not a whole number, is out of range, or ``k > n``.
    """
    n_, c_, k_ = _check_nck(n, c, k)
    out = _comb_ratio(c_, n_, k_)
    return float(out) if out.ndim == 0 else out


@overload
def pass_at_k(n: int, c: int, k: int) -> float: ...
@overload
def pass_at_k(n: npt.ArrayLike, c: npt.ArrayLike, k: npt.ArrayLike) -> FloatArray: ...
def pass_at_k(n: npt.ArrayLike, c: npt.ArrayLike, k: npt.ArrayLike) -> float | FloatArray:
    """Unbiased estimate of pass@k (``1 - (1-p)^k``) for a task: ``1 - C(n-c, k) / C(n, k)``.

    Args:
        n: Trials per task (scalar or array).
        c: Successes per task, ``0 <= c <= n``.
        k: Attempts allowed, ``1 <= k <= n``.

    Returns:
        A float for scalar arguments, else an array of the broadcast shape.

    Raises:
        ValueError: An argument is not a whole number, is out of range, or ``k > n``.
    """
    n_, c_, k_ = _check_nck(n, c, k)
    out = 1.0 - _comb_ratio(n_ - c_, n_, k_)
    return float(out) if out.ndim == 0 else out


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


def _method(sparse: bool, clustered: bool) -> str:
    if clustered:
        return "clopper-pearson-clustered" if sparse else "wilson-neff-t-clustered"
    return "clopper-pearson-tasks" if sparse else "wilson-neff-t"


def _suite_counts(successes: npt.ArrayLike, trials: npt.ArrayLike) -> tuple[IntArray, IntArray]:
    s = _whole("successes", successes)
    n = _whole("trials", trials)
    if s.ndim != 1 or s.size == 0:
        raise ValueError(
            f"successes must be a non-empty 1-D sequence (one per task), got {s.shape}"
        )
    if n.ndim == 0:
        n = np.full(s.shape, int(n), dtype=np.int64)
    if n.shape != s.shape:
        raise ValueError(f"trials must match successes: {n.shape} != {s.shape}")
    if (n < 1).any():
        raise ValueError(f"trials must be at least 1 per task{_first_bad(n < 1)}")
    bad = (s < 0) | (s > n)
    if bad.any():
        raise ValueError(f"successes must lie between 0 and trials{_first_bad(bad)}")
    return s, n


def _check_k(k: int, trials: IntArray) -> int:
    k_ = _whole("k", k)
    if k_.ndim != 0:
        raise ValueError(f"k must be a single integer here, got {k!r}")
    kk = int(k_)
    if kk < 1:
        raise ValueError(f"k must be at least 1, got {k!r}")
    short = trials < kk
    if short.any():
        i = int(np.argmax(short))
        raise ValueError(
            f"k={kk} exceeds the trials of task {i} (n={int(trials[i])}): every task needs at "
            "least k trials"
        )
    return kk


def _suite_estimate(
    values: FloatArray, trials: IntArray, k: int, confidence: float, clusters: Any
) -> Estimate:
    groups = None if clusters is None else _clusters(clusters, len(values))
    b = _task_bounds(values[None, :], np.array(float(trials.sum())), confidence, groups)
    sparse = bool(b.sparse[0])
    return Estimate(
        value=float(b.value[0]),
        low=float(b.low[0]),
        high=float(b.high[0]),
        method=_method(sparse, groups is not None),
        confidence=confidence,
        n_tasks=len(values),
        k=k,
        se=float(b.se[0]),
        n_eff=float(b.n_eff[0]),
        n_trials=int(trials.sum()),
        n_clusters=None if groups is None else groups.count,
    )


def suite_pass_hat_k(
    successes: npt.ArrayLike,
    trials: npt.ArrayLike,
    k: int,
    confidence: float = 0.95,
    clusters: Sequence[Hashable] | npt.ArrayLike | None = None,
) -> Estimate:
    """Suite pass^k: the mean over tasks of ``pass_hat_k``, with a task-level interval.

    The estimand is the expected pass^k of a task from the population the suite samples. The
    interval treats tasks (or task families, with ``clusters``) as the independent units; see the
    module docstring for the method and ``tests/test_stats.py`` for its simulated coverage.

    Args:
        successes: Successful trials per task.
        trials: Trials per task (an array, or one integer for all tasks).
        k: How many trials must all pass, ``1 <= k <= min(trials)``.
        confidence: Nominal coverage in (0, 1).
        clusters: Optional family label per task (e.g. the template it came from); the standard
            error is then cluster-robust.

    Returns:
        An ``Estimate`` whose ``method`` names the branch taken.

    Raises:
        ValueError: Bad counts, ``k`` larger than some task's trials, bad clusters or confidence.
    """
    s, n = _suite_counts(successes, trials)
    kk = _check_k(k, n)
    conf = _check_confidence(confidence)
    return _suite_estimate(_comb_ratio(s, n, np.full_like(n, kk)), n, kk, conf, clusters)


def suite_pass_at_k(
    successes: npt.ArrayLike,
    trials: npt.ArrayLike,
    k: int,
    confidence: float = 0.95,
    clusters: Sequence[Hashable] | npt.ArrayLike | None = None,
) -> Estimate:
    """Suite pass@k: the mean over tasks of ``pass_at_k``, with the same task-level interval.

    Args:
        successes: Successful trials per task.
        trials: Trials per task (an array, or one integer for all tasks).
        k: Attempts allowed, ``1 <= k <= min(trials)``.
        confidence: Nominal coverage in (0, 1).
        clusters: Optional family label per task, for a cluster-robust standard error.

    Returns:
        An ``Estimate`` whose ``method`` names the branch taken.

    Raises:
        ValueError: Bad counts, ``k`` larger than some task's trials, bad clusters or confidence.
    """
    s, n = _suite_counts(successes, trials)
    kk = _check_k(k, n)
    conf = _check_confidence(confidence)
    values = 1.0 - _comb_ratio(n - s, n, np.full_like(n, kk))
    return _suite_estimate(values, n, kk, conf, clusters)


def suite_pass_hat_k_batch(
    successes: npt.ArrayLike,
    trials: npt.ArrayLike,
    k: int,
    confidence: float = 0.95,
    clusters: Sequence[Hashable] | npt.ArrayLike | None = None,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``suite_pass_hat_k`` for many suites at once (simulations, sensitivity analyses).

    Args:
        successes: Array of shape ``(..., T)``: each row one suite of ``T`` tasks.
        trials: Trials, broadcastable to ``successes``.
        k: As in ``suite_pass_hat_k``.
        confidence: Nominal coverage in (0, 1).
        clusters: Optional family label per task (the same ``T`` labels for every suite).

    Returns:
        ``(value, low, high)``, each of shape ``successes.shape[:-1]``; row ``i`` equals
        ``suite_pass_hat_k(successes[i], trials[i], k)``.

    Raises:
        ValueError: As ``suite_pass_hat_k``.
    """
    s = _whole("successes", successes)
    if s.ndim < 1 or s.shape[-1] == 0:
        raise ValueError(f"successes must have a non-empty last axis of tasks, got {s.shape}")
    n = np.broadcast_to(_whole("trials", trials), s.shape)
    if (n < 1).any() or (s < 0).any() or (s > n).any():
        raise ValueError("successes must lie between 0 and trials, and trials must be >= 1")
    kk = _check_k(k, n.reshape(-1))
    conf = _check_confidence(confidence)
    n_tasks = s.shape[-1]
    values = _comb_ratio(s, n, np.full(s.shape, kk, dtype=np.int64)).reshape(-1, n_tasks)
    cap = n.reshape(-1, n_tasks).sum(axis=-1).astype(np.float64)
    groups = None if clusters is None else _clusters(clusters, n_tasks)
    b = _task_bounds(values, cap, conf, groups)
    shape = s.shape[:-1]
    return b.value.reshape(shape), b.low.reshape(shape), b.high.reshape(shape)


# --------------------------------------------------------------------------------------------
# Curves: pass^k and pass@k for many k at once, and a task-level bootstrap.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class SuiteCurve:
    """pass^k and pass@k of a suite for several k, with intervals (arrays indexed like ``ks``).

    Attributes:
        ks: The k values, ascending.
        confidence: Nominal coverage.
        n_tasks: Tasks in the suite.
        n_trials: Total trials.
        hat_value: Suite pass^k per k.
        hat_low: Lower ends for pass^k.
        hat_high: Upper ends for pass^k.
        hat_methods: Interval method per k for pass^k.
        at_value: Suite pass@k per k.
        at_low: Lower ends for pass@k.
        at_high: Upper ends for pass@k.
        at_methods: Interval method per k for pass@k.
    """

    ks: IntArray
    confidence: float
    n_tasks: int
    n_trials: int
    hat_value: FloatArray
    hat_low: FloatArray
    hat_high: FloatArray
    hat_methods: tuple[str, ...]
    at_value: FloatArray
    at_low: FloatArray
    at_high: FloatArray
    at_methods: tuple[str, ...]

    def _index(self, k: int) -> int:
        hits = np.flatnonzero(self.ks == k)
        if hits.size == 0:
            raise ValueError(f"k={k} is not on this curve (ks {self.ks.min()}..{self.ks.max()})")
        return int(hits[0])

    def _estimate(self, i: int, k: int, which: Literal["hat", "at"]) -> Estimate:
        value, low, high = (getattr(self, f"{which}_{part}") for part in ("value", "low", "high"))
        methods: tuple[str, ...] = getattr(self, f"{which}_methods")
        return Estimate(
            value=float(value[i]),
            low=float(low[i]),
            high=float(high[i]),
            method=methods[i],
            confidence=self.confidence,
            n_tasks=self.n_tasks,
            k=k,
            n_trials=self.n_trials,
        )

    def pass_hat(self, k: int) -> Estimate:
        """The pass^k estimate at ``k``."""
        return self._estimate(self._index(k), k, "hat")

    def pass_at(self, k: int) -> Estimate:
        """The pass@k estimate at ``k``."""
        return self._estimate(self._index(k), k, "at")

    def rows(self) -> list[dict[str, float | int | str]]:
        """One dict per k (``k``, ``pass_hat``, ``pass_hat_low``, ... ``pass_at_high``)."""
        return [
            {
                "k": int(k),
                "pass_hat": float(self.hat_value[i]),
                "pass_hat_low": float(self.hat_low[i]),
                "pass_hat_high": float(self.hat_high[i]),
                "pass_hat_method": self.hat_methods[i],
                "pass_at": float(self.at_value[i]),
                "pass_at_low": float(self.at_low[i]),
                "pass_at_high": float(self.at_high[i]),
                "pass_at_method": self.at_methods[i],
            }
            for i, k in enumerate(self.ks)
        ]

    def to_dict(self) -> dict[str, Any]:
        """The curve as a JSON-ready dict: the suite's size, confidence, and ``rows()``."""
        return {
            "confidence": self.confidence,
            "n_tasks": self.n_tasks,
            "n_trials": self.n_trials,
            "rows": self.rows(),
        }


def _curve_ks(ks: Iterable[int] | None, trials: IntArray) -> IntArray:
    kmax = int(trials.min())
    if ks is None:
        return np.arange(1, kmax + 1, dtype=np.int64)
    arr = np.unique(_whole("ks", list(ks)))
    if arr.size == 0:
        raise ValueError("ks must not be empty")
    if arr[0] < 1 or arr[-1] > kmax:
        raise ValueError(
            f"ks must lie between 1 and the smallest trial count ({kmax}), got {arr.tolist()}"
        )
    return arr


def _curve_values(s: IntArray, n: IntArray, ks: IntArray) -> tuple[FloatArray, FloatArray]:
    """Per-task pass^k and pass@k for every k in ``ks``: arrays (K, T), by running products."""
    j = np.arange(int(ks[-1]), dtype=np.float64)
    sf, nf = s[:, None].astype(np.float64), n[:, None].astype(np.float64)
    # C(c,k)/C(n,k) = prod_{j<k} (c-j)/(n-j); a zero factor at j = c keeps later terms at 0.
    hat = np.cumprod((sf - j) / (nf - j), axis=1)[:, ks - 1]
    miss = np.cumprod((nf - sf - j) / (nf - j), axis=1)[:, ks - 1]
    return np.maximum(hat, 0.0).T, (1.0 - np.maximum(miss, 0.0)).T


def suite_curve(
    successes: npt.ArrayLike,
    trials: npt.ArrayLike,
    ks: Iterable[int] | None = None,
    confidence: float = 0.95,
    clusters: Sequence[Hashable] | npt.ArrayLike | None = None,
) -> SuiteCurve:
    """pass^k and pass@k with task-level intervals for k = 1..min(trials) (or ``ks``).

    Vectorised over k and tasks: 10,000 tasks x 100 k take well under a second.

    Args:
        successes: Successful trials per task.
        trials: Trials per task (an array, or one integer for all tasks).
        ks: The k values (default: 1 to the smallest trial count).
        confidence: Nominal coverage in (0, 1).
        clusters: Optional family label per task, for cluster-robust intervals.

    Returns:
        A ``SuiteCurve``; ``curve.pass_hat(k)`` equals ``suite_pass_hat_k(..., k)``.

    Raises:
        ValueError: Bad counts, ks out of range, bad clusters or confidence.
    """
    s, n = _suite_counts(successes, trials)
    conf = _check_confidence(confidence)
    kk = _curve_ks(ks, n)
    hat, at = _curve_values(s, n, kk)
    groups = None if clusters is None else _clusters(clusters, len(s))
    cap = np.array(float(n.sum()))
    bh = _task_bounds(hat, cap, conf, groups)
    ba = _task_bounds(at, cap, conf, groups)
    clustered = groups is not None
    return SuiteCurve(
        ks=kk,
        confidence=conf,
        n_tasks=len(s),
        n_trials=int(n.sum()),
        hat_value=bh.value,
        hat_low=bh.low,
        hat_high=bh.high,
        hat_methods=tuple(_method(bool(x), clustered) for x in bh.sparse),
        at_value=ba.value,
        at_low=ba.low,
        at_high=ba.high,
        at_methods=tuple(_method(bool(x), clustered) for x in ba.sparse),
    )


def bootstrap_curve(
    successes: npt.ArrayLike,
    trials: npt.ArrayLike,
    ks: Iterable[int] | None = None,
    *,
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int | np.random.Generator | None = None,
    max_chunk_cells: int = 4_000_000,
) -> SuiteCurve:
    """Task-level percentile bootstrap of pass^k and pass@k (whole tasks are resampled).

    Offered for comparison and sensitivity checks: percentile bootstrap intervals undercover for
    small suites and near 0 or 1, so ``suite_curve`` is the default. Resamples are drawn in
    chunks of at most ``max_chunk_cells`` resample-by-task cells, so memory stays bounded; each
    chunk is turned into per-resample task counts and multiplied by the per-task values.

    Args:
        successes: Successful trials per task.
        trials: Trials per task (an array, or one integer for all tasks).
        ks: The k values (default: 1 to the smallest trial count).
        resamples: Bootstrap resamples, at least 100.
        confidence: Nominal coverage in (0, 1).
        seed: Seed or generator, for reproducible resampling.
        max_chunk_cells: Memory bound: resamples per chunk times tasks.

    Returns:
        A ``SuiteCurve`` whose methods are ``"percentile-bootstrap"``.

    Raises:
        ValueError: Bad counts, ks, confidence or resample count.
    """
    s, n = _suite_counts(successes, trials)
    conf = _check_confidence(confidence)
    if resamples < 100:
        raise ValueError(f"resamples must be at least 100, got {resamples}")
    kk = _curve_ks(ks, n)
    hat, at = _curve_values(s, n, kk)
    values = np.concatenate([hat, at], axis=0).T  # (T, 2K)
    n_tasks = len(s)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    chunk = max(1, min(resamples, max_chunk_cells // n_tasks))
    means = np.empty((resamples, values.shape[1]))
    for start in range(0, resamples, chunk):
        rows = min(chunk, resamples - start)
        picks = rng.integers(0, n_tasks, size=(rows, n_tasks))
        picks += np.arange(rows)[:, None] * n_tasks
        counts = np.bincount(picks.ravel(), minlength=rows * n_tasks).reshape(rows, n_tasks)
        means[start : start + rows] = counts @ values / n_tasks
    alpha = 1.0 - conf
    low, high = np.quantile(means, [alpha / 2.0, 1.0 - alpha / 2.0], axis=0)
    point = values.mean(axis=0)
    k_count = len(kk)
    methods = ("percentile-bootstrap",) * k_count
    return SuiteCurve(
        ks=kk,
        confidence=conf,
        n_tasks=n_tasks,
        n_trials=int(n.sum()),
        hat_value=point[:k_count],
        hat_low=np.minimum(low[:k_count], point[:k_count]),
        hat_high=np.maximum(high[:k_count], point[:k_count]),
        hat_methods=methods,
        at_value=point[k_count:],
        at_low=np.minimum(low[k_count:], point[k_count:]),
        at_high=np.maximum(high[k_count:], point[k_count:]),
        at_methods=methods,
    )


# --------------------------------------------------------------------------------------------
# Paired comparison of two runs on the same tasks.
# --------------------------------------------------------------------------------------------


def _paired_bounds(
    xa: FloatArray, xb: FloatArray, cap_a: FloatArray, cap_b: FloatArray, confidence: float
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Value, low, high and se of mean(xa - xb), rows of (R, T) being suites."""
    n_tasks = xa.shape[-1]
    diff = xa - xb
    delta = diff.mean(axis=-1)
    if n_tasks > 1:
        se = diff.std(axis=-1, ddof=1) / math.sqrt(n_tasks)
        t = _t_quantile(n_tasks - 1, 0.5 + confidence / 2.0)
    else:
        se, t = np.zeros_like(delta), 0.0
    ba = _task_bounds(xa, cap_a, confidence, None)
    bb = _task_bounds(xb, cap_b, confidence, None)
    ca, cb = xa - ba.value[..., None], xb - bb.value[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.sum(ca * cb, axis=-1) / np.sqrt(np.sum(ca**2, axis=-1) * np.sum(cb**2, axis=-1))
    r = np.nan_to_num(r, nan=0.0)
    da, ea = ba.value - ba.low, ba.high - ba.value
    db, eb = bb.value - bb.low, bb.high - bb.value
    mover_low = delta - np.sqrt(np.maximum(da**2 - 2.0 * r * da * eb + eb**2, 0.0))
    mover_high = delta + np.sqrt(np.maximum(ea**2 - 2.0 * r * ea * db + db**2, 0.0))
    low = np.clip(np.minimum(mover_low, delta - t * se), -1.0, 1.0)
    high = np.clip(np.maximum(mover_high, delta + t * se), -1.0, 1.0)
    return delta, low, high, se


def _paired_inputs(
    successes_a: npt.ArrayLike,
    trials_a: npt.ArrayLike,
    successes_b: npt.ArrayLike,
    trials_b: npt.ArrayLike,
) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    sa, na = _suite_counts(successes_a, trials_a)
    sb, nb = _suite_counts(successes_b, trials_b)
    if sa.shape != sb.shape:
        raise ValueError(
            f"runs a and b must cover the same tasks in the same order: {len(sa)} tasks != "
            f"{len(sb)} tasks"
        )
    return sa, na, sb, nb


def paired_difference(
    successes_a: npt.ArrayLike,
    trials_a: npt.ArrayLike,
    successes_b: npt.ArrayLike,
    trials_b: npt.ArrayLike,
    k: int,
    confidence: float = 0.95,
) -> Estimate:
    """Difference in suite pass^k between two runs on the same tasks (a minus b), paired.

    The interval (``mover-t-hull``) is the hull of Newcombe's MOVER interval, built from the two
    runs' task-level intervals and the correlation of their per-task values, and the paired t
    interval on per-task differences; its coverage is checked by simulation in the tests.

    Args:
        successes_a: Successes per task in run a.
        trials_a: Trials per task in run a.
        successes_b: Successes per task in run b (same tasks, same order).
        trials_b: Trials per task in run b.
        k: How many trials must all pass; at most the smallest trial count of either run.
        confidence: Nominal coverage in (0, 1).

    Returns:
        An ``Estimate`` of ``pass^k(a) - pass^k(b)`` with a paired interval.

    Raises:
        ValueError: Bad counts, different task lists, k too large, bad confidence.
    """
    sa, na, sb, nb = _paired_inputs(successes_a, trials_a, successes_b, trials_b)
    kk = _check_k(k, np.minimum(na, nb))
    conf = _check_confidence(confidence)
    xa = _comb_ratio(sa, na, np.full_like(na, kk))[None, :]
    xb = _comb_ratio(sb, nb, np.full_like(nb, kk))[None, :]
    cap_a, cap_b = np.array([float(na.sum())]), np.array([float(nb.sum())])
    delta, low, high, se = _paired_bounds(xa, xb, cap_a, cap_b, conf)
    return Estimate(
        value=float(delta[0]),
        low=float(low[0]),
        high=float(high[0]),
        method="mover-t-hull",
        confidence=conf,
        n_tasks=len(sa),
        k=kk,
        se=float(se[0]),
        n_trials=int(na.sum() + nb.sum()),
    )


def paired_difference_batch(
    successes_a: npt.ArrayLike,
    trials_a: npt.ArrayLike,
    successes_b: npt.ArrayLike,
    trials_b: npt.ArrayLike,
    k: int,
    confidence: float = 0.95,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``paired_difference`` for many pairs of runs at once (simulations).

    Args:
        successes_a: Array ``(..., T)`` of run a's successes, one suite per row.
        trials_a: Run a's trials, broadcastable to ``successes_a``.
        successes_b: Run b's successes, same shape as ``successes_a``.
        trials_b: Run b's trials, broadcastable to it.
        k: As in ``paired_difference``.
        confidence: Nominal coverage in (0, 1).

    Returns:
        ``(value, low, high)`` of shape ``successes_a.shape[:-1]``.

    Raises:
        ValueError: Bad counts or shapes, k too large, bad confidence.
    """
    sa, sb = _whole("successes_a", successes_a), _whole("successes_b", successes_b)
    if sa.shape != sb.shape or sa.ndim < 1 or sa.shape[-1] == 0:
        raise ValueError(f"successes_a and successes_b must share a shape (..., T): {sa.shape}")
    na = np.broadcast_to(_whole("trials_a", trials_a), sa.shape)
    nb = np.broadcast_to(_whole("trials_b", trials_b), sb.shape)
    for s, n in ((sa, na), (sb, nb)):
        if (n < 1).any() or (s < 0).any() or (s > n).any():
            raise ValueError("successes must lie between 0 and trials, and trials must be >= 1")
    kk = _check_k(k, np.minimum(na, nb).reshape(-1))
    conf = _check_confidence(confidence)
    n_tasks = sa.shape[-1]
    kfull = np.full(sa.shape, kk, dtype=np.int64)
    xa = _comb_ratio(sa, na, kfull).reshape(-1, n_tasks)
    xb = _comb_ratio(sb, nb, kfull).reshape(-1, n_tasks)
    cap_a = na.reshape(-1, n_tasks).sum(axis=-1).astype(np.float64)
    cap_b = nb.reshape(-1, n_tasks).sum(axis=-1).astype(np.float64)
    delta, low, high, _ = _paired_bounds(xa, xb, cap_a, cap_b, conf)
    shape = sa.shape[:-1]
    return delta.reshape(shape), low.reshape(shape), high.reshape(shape)


# --------------------------------------------------------------------------------------------
# The p^n null model and self-conditioning.
# --------------------------------------------------------------------------------------------


def _flatten_steps(step_ok: Any) -> BoolArray:
    """Per-step outcomes (bools or 0/1), possibly nested per episode, as one flat bool array."""
    if isinstance(step_ok, np.ndarray):
        flat: Any = step_ok.ravel()
    else:
        items: list[Any] = []
        stack: list[Any] = [iter(step_ok)]
        while stack:
            try:
                item = next(stack[-1])
            except StopIteration:
                stack.pop()
                continue
            if isinstance(item, bool | int | np.bool_ | np.integer | float | np.floating):
                items.append(item)
            elif isinstance(item, Iterable) and not isinstance(item, str | bytes):
                stack.append(iter(item))
            else:
                raise ValueError(f"step outcomes must be bools (or 0/1), got {item!r}")
        flat = np.asarray(items)
    values = np.asarray(flat)
    if values.size and not np.isin(values, (0, 1)).all():
        raise ValueError("step outcomes must be bools (or 0/1)")
    return values.astype(bool)


def fit_step_success(
    step_ok: Iterable[Any] | npt.ArrayLike | None = None,
    *,
    ok: int | None = None,
    total: int | None = None,
    confidence: float = 0.95,
) -> Estimate:
    """Per-step success probability ``p`` with a Wilson interval, for the ``p^n`` null model.

    Steps of one episode are not independent (self-conditioning makes errors cluster), so this
    interval is optimistic when they do; ``self_conditioning`` measures how much.

    Args:
        step_ok: Per-step outcomes (bools or 0/1), flat or nested per episode.
        ok: Alternatively, the count of successful steps...
        total: ...out of this many steps.
        confidence: Nominal coverage in (0, 1).

    Returns:
        An ``Estimate`` of ``p`` (``method="wilson"``, ``n_tasks`` = steps).

    Raises:
        ValueError: Both or neither of ``step_ok`` and ``ok``/``total``; no steps; bad values.
    """
    if step_ok is not None and (ok is not None or total is not None):
        raise ValueError("give either step_ok or ok/total counts, not both")
    if step_ok is None:
        if ok is None or total is None:
            raise ValueError("give step_ok, or both ok and total")
        c, n = ok, total
    else:
        flat = _flatten_steps(step_ok)
        c, n = int(flat.sum()), int(flat.size)
    if n == 0:
        raise ValueError("there are no steps to fit")
    return wilson(c, n, confidence)


def horizon(p: float, s: float = 0.5) -> float:
    """Steps until the chance of an error-free run falls to ``s`` under ``p^n``: ``ln s / ln p``.

    Args:
        p: Per-step success probability in [0, 1].
        s: Target success probability in (0, 1); 0.5 gives the half-life in steps.

    Returns:
        ``inf`` for ``p = 1``, ``0`` for ``p = 0``, else ``ln(s) / ln(p)``.

    Raises:
        ValueError: ``p`` outside [0, 1] or ``s`` outside (0, 1).
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must lie in [0, 1], got {p!r}")
    if not 0.0 < s < 1.0:
        raise ValueError(f"s must lie in (0, 1), got {s!r}")
    if p == 1.0:
        return math.inf
    if p == 0.0:
        return 0.0
    return math.log(s) / math.log(p)


@dataclass(frozen=True)
class NullModelRow:
    """Predicted (``p^n``) and observed task success for tasks needing ``steps`` steps.

    Attributes:
        steps: Required steps ``n``.
        n_tasks: Tasks with that step count.
        predicted: ``p^n``.
        predicted_low: ``low^n`` (the interval for ``p`` carried through its endpoints).
        predicted_high: ``high^n``.
        observed: Mean observed success of those tasks.
        observed_low: Lower end of the task-level interval for it.
        observed_high: Upper end.
        consistent: Whether the two intervals overlap.
    """

    steps: int
    n_tasks: int
    predicted: float
    predicted_low: float
    predicted_high: float
    observed: float
    observed_low: float
    observed_high: float
    consistent: bool

    def to_dict(self) -> dict[str, float | int | bool]:
        """The row as a JSON-ready dict."""
        return {
            "steps": self.steps,
            "n_tasks": self.n_tasks,
            "predicted": self.predicted,
            "predicted_low": self.predicted_low,
            "predicted_high": self.predicted_high,
            "observed": self.observed,
            "observed_low": self.observed_low,
            "observed_high": self.observed_high,
            "consistent": self.consistent,
        }


@dataclass(frozen=True)
class NullModel:
    """The ``p^n`` null model: independent steps with success ``p``, against what was observed.

    Attributes:
        p: The per-step success estimate.
        rows: One row per distinct step count, ascending.
    """

    p: Estimate
    rows: tuple[NullModelRow, ...] = field(default_factory=tuple)

    def horizon(self, s: float = 0.5) -> tuple[float, float, float]:
        """``horizon`` at ``p`` and at its interval's ends: ``(value, low, high)``."""
        return horizon(self.p.value, s), horizon(self.p.low, s), horizon(self.p.high, s)

    def to_dict(self) -> dict[str, Any]:
        """The model as a JSON-ready dict (infinite horizons as ``None``)."""
        value, low, high = self.horizon()
        finite = [None if math.isinf(v) else v for v in (value, low, high)]
        return {
            "p": self.p.to_dict(),
            "half_life_steps": {"value": finite[0], "low": finite[1], "high": finite[2]},
            "rows": [row.to_dict() for row in self.rows],
        }


def null_model(
    p_estimate: Estimate | float,
    steps: npt.ArrayLike,
    observed: npt.ArrayLike,
    *,
    trials: npt.ArrayLike | None = None,
    confidence: float | None = None,
) -> NullModel:
    """Compare observed task success with ``p^n``, grouped by required step count ``n``.

    Args:
        p_estimate: Per-step success (``fit_step_success``), or a bare probability.
        steps: Required steps per task.
        observed: Observed success rate per task, in [0, 1].
        trials: Optional trials per task; with them the observed intervals can be narrower
            than the worst case of one Bernoulli draw per task.
        confidence: For the observed intervals (default: that of ``p_estimate``, else 0.95).

    Returns:
        A ``NullModel`` with one row per distinct step count.

    Raises:
        ValueError: Mismatched lengths, rates outside [0, 1], bad step counts or probability.
    """
    if isinstance(p_estimate, Estimate):
        p = p_estimate
    else:
        value = float(p_estimate)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"p_estimate must lie in [0, 1], got {p_estimate!r}")
        p = Estimate(value, value, value, "fixed", 1.0, 0)
    conf = _check_confidence(
        confidence if confidence is not None else (p.confidence if p.method != "fixed" else 0.95)
    )
    st = _whole("steps", steps)
    obs = np.asarray(observed, dtype=np.float64)
    if st.ndim != 1 or obs.shape != st.shape:
        raise ValueError(f"steps and observed must be 1-D of equal length: {st.shape}, {obs.shape}")
    if (st < 0).any():
        raise ValueError(f"steps must be non-negative{_first_bad(st < 0)}")
    if not np.all((obs >= 0.0) & (obs <= 1.0)):
        raise ValueError("observed success rates must lie in [0, 1]")
    tr = None if trials is None else np.broadcast_to(_whole("trials", trials), st.shape)
    rows = []
    for n_steps in np.unique(st):
        mask = st == n_steps
        group = obs[mask][None, :]
        cap = np.array(float(mask.sum() if tr is None else tr[mask].sum()))
        b = _task_bounds(group, cap, conf, None)
        pred = (p.value**n_steps, p.low**n_steps, p.high**n_steps)
        lo, hi = float(b.low[0]), float(b.high[0])
        rows.append(
            NullModelRow(
                steps=int(n_steps),
                n_tasks=int(mask.sum()),
                predicted=pred[0],
                predicted_low=pred[1],
                predicted_high=pred[2],
                observed=float(b.value[0]),
                observed_low=lo,
                observed_high=hi,
                consistent=bool(lo <= pred[2] and pred[1] <= hi),
            )
        )
    return NullModel(p=p, rows=tuple(rows))


@dataclass(frozen=True)
class SelfConditioning:
    """Error rates after an earlier error versus with a clean history, per step.

    Attributes:
        after_error: Error rate on steps preceded by an error in the same episode (None if
            there are no such steps).
        clean: Error rate on steps with no earlier error (None if there are none).
        n_episodes: Episodes measured.
    """

    after_error: Estimate | None
    clean: Estimate | None
    n_episodes: int

    @property
    def difference(self) -> float | None:
        """``after_error - clean`` (positive: errors make later errors likelier)."""
        if self.after_error is None or self.clean is None:
            return None
        return self.after_error.value - self.clean.value

    @property
    def ratio(self) -> float | None:
        """``after_error / clean`` (``inf`` if the clean rate is 0 and the other is not)."""
        if self.after_error is None or self.clean is None:
            return None
        if self.clean.value == 0.0:
            return math.inf if self.after_error.value > 0 else math.nan
        return self.after_error.value / self.clean.value

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "after_error": None if self.after_error is None else self.after_error.to_dict(),
            "clean": None if self.clean is None else self.clean.to_dict(),
            "difference": self.difference,
            "n_episodes": self.n_episodes,
        }


def self_conditioning(
    episodes: Iterable[Iterable[Any] | npt.ArrayLike], confidence: float = 0.95
) -> SelfConditioning:
    """Measure self-conditioning: do errors make later errors in the same episode likelier?

    Each step is classed by its history within its episode: clean (no earlier error) or after
    an error. A higher error rate after errors is what self-conditioning predicts, but episodes
    also differ in difficulty (hard episodes collect both the first error and the later ones),
    so the gap bounds the effect from above; a simulated agent with known parameters calibrates
    it. Intervals are Wilson on step counts and ignore the dependence between steps.

    Args:
        episodes: Per-episode sequences of step outcomes (True = the step went right).
        confidence: Nominal coverage in (0, 1).

    Returns:
        A ``SelfConditioning`` with both error rates.

    Raises:
        ValueError: Step outcomes that are not bools or 0/1; bad confidence.
    """
    conf = _check_confidence(confidence)
    arrays = [_flatten_steps(ep) for ep in episodes]
    lengths = np.array([a.size for a in arrays], dtype=np.int64)
    errors = ~np.concatenate(arrays) if arrays else np.zeros(0, dtype=bool)
    running = np.cumsum(errors)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    # Errors before each episode's first step (an empty episode has none of its own).
    before = (
        np.where(starts > 0, running[np.maximum(starts - 1, 0)], 0)
        if running.size
        else np.zeros(len(lengths), dtype=np.int64)
    )
    # Errors earlier in the same episode: the running count minus the count at episode start.
    earlier = running - np.repeat(before, lengths) - errors
    after = earlier > 0

    def rate(mask: BoolArray) -> Estimate | None:
        total = int(mask.sum())
        return None if total == 0 else wilson(int(errors[mask].sum()), total, conf)

    return SelfConditioning(after_error=rate(after), clean=rate(~after), n_episodes=len(arrays))


# --------------------------------------------------------------------------------------------
# Infrastructure errors.
# --------------------------------------------------------------------------------------------


def apply_infra_policy(
    successes: npt.ArrayLike,
    trials: npt.ArrayLike,
    infra_errors: npt.ArrayLike,
    policy: InfraPolicy,
) -> tuple[IntArray, IntArray]:
    """Adjust per-task counts for trials that ended in an infrastructure error.

    ``trials`` counts every trial run, infra-errored ones included; an infra-errored trial is
    never among ``successes``.

    Args:
        successes: Successful trials per task.
        trials: Trials run per task.
        infra_errors: Trials per task that ended in an infrastructure error.
        policy: ``"fail"`` counts them as failed trials (tau-bench); ``"exclude"`` drops them
            (tau2-bench). Under ``"exclude"`` a task can be left with no trials: drop it (e.g.
            ``keep = trials > 0``) before estimating, and say so in the report.

    Returns:
        ``(successes, trials)`` to estimate from.

    Raises:
        ValueError: Unknown policy; counts that do not add up.
    """
    if policy not in INFRA_POLICIES:
        raise ValueError(f"policy must be one of {INFRA_POLICIES}, got {policy!r}")
    s, n, e = (
        _whole(name, v)
        for name, v in (
            ("successes", successes),
            ("trials", trials),
            ("infra_errors", infra_errors),
        )
    )
    if not s.shape == n.shape == e.shape:
        raise ValueError(
            f"successes, trials and infra_errors must match: {s.shape}, {n.shape}, {e.shape}"
        )
    if (s < 0).any() or (e < 0).any():
        raise ValueError("successes and infra_errors must be non-negative")
    over = s + e > n
    if over.any():
        raise ValueError(f"successes + infra_errors exceed trials{_first_bad(over)}")
    return (s, n) if policy == "fail" else (s, n - e)

"""Special functions (regularized incomplete beta, its inverse, t quantiles), array types
and argument checks shared by the statistics modules."""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


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

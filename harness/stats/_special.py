"""Special functions (beta and Student-t quantiles, from ``scipy.special``), array types and
argument checks shared by the statistics modules.

scipy is imported inside the functions that use it: ``import harness`` loads this module, and
``scipy.special`` would add well over 100 ms to that for callers that never compute an interval.
"""

from __future__ import annotations

from functools import lru_cache
from statistics import NormalDist
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


# --------------------------------------------------------------------------------------------
# Quantiles: beta (the inverse regularized incomplete beta) and Student's t.
# --------------------------------------------------------------------------------------------


def _beta_quantile(q: float, a: FloatArray, b: FloatArray) -> FloatArray:
    """Quantile ``q`` of Beta(a, b), elementwise (a, b > 0)."""
    from scipy.special import betaincinv

    return np.asarray(betaincinv(a, b, q), dtype=np.float64)


@lru_cache(maxsize=256)
def _t_quantile(df: int, q: float) -> float:
    """Quantile ``q`` of Student's t on ``df`` degrees of freedom."""
    from scipy.special import stdtrit

    return float(stdtrit(df, q))


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

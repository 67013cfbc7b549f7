"""Per-task estimators: unbiased pass^k and pass@k from n trials with c successes."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import overload

import numpy as np
import numpy.typing as npt

from ._special import FloatArray, IntArray, _check_nck

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

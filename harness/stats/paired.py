"""Paired comparison of two runs on the same tasks."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from ._special import FloatArray, IntArray, _check_confidence, _t_quantile, _whole
from .estimators import _comb_ratio
from .intervals import Estimate, _task_bounds
from .suite import _check_k, _suite_counts

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


# The arrays-of-rows form of paired_difference (same arguments), for coverage simulations.
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

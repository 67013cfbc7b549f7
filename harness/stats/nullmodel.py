"""The p^n null model (independent steps) and self-conditioning."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ._special import BoolArray, _check_confidence, _first_bad, _whole
from .intervals import Estimate, _task_bounds, wilson

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

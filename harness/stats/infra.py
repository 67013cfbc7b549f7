"""Infrastructure errors: how trials that ended in one count."""

from __future__ import annotations

from typing import Literal

import numpy.typing as npt

from ._special import IntArray, _first_bad, _whole

InfraPolicy = Literal["fail", "exclude"]
"""How trials that ended in an infrastructure error count.

``"fail"``: as failed trials (tau-bench's convention). ``"exclude"``: dropped from the trial
count (tau2-bench's convention). Reports state which one they used.
"""

INFRA_POLICIES: tuple[InfraPolicy, ...] = ("fail", "exclude")


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

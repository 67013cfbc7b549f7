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

from ._special import _t_quantile as _t_quantile
from .estimators import pass_at_k, pass_hat_k
from .infra import INFRA_POLICIES, InfraPolicy, apply_infra_policy
from .intervals import INTERVAL_METHODS, Estimate, clopper_pearson, wilson
from .nullmodel import (
    NullModel,
    NullModelRow,
    SelfConditioning,
    fit_step_success,
    horizon,
    null_model,
    self_conditioning,
)
from .paired import paired_difference, paired_difference_batch
from .suite import (
    SuiteCurve,
    bootstrap_curve,
    suite_curve,
    suite_pass_at_k,
    suite_pass_hat_k,
    suite_pass_hat_k_batch,
)

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

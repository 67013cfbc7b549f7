"""Reliability statistics: pass^k and pass@k with intervals chosen for coverage.

Everything here is a pure function of counts (numpy-vectorised, no state, no I/O).

The estimand of a suite estimate is the *task population*: ``E[p^k]``, the expected pass^k of a
task drawn from the population the suite samples, where ``p`` is that task's success probability.
Per task, ``C(c, k) / C(n, k)`` is the unbiased estimator of ``p^k`` from ``n`` trials with ``c``
successes; the suite value is its mean over tasks. Intervals are computed at the task level only
(trials inside a task are never resampled or treated as independent units of the population).

Interval methods (``Estimate.method``):

``clopper-pearson-tasks``
    When every task's value is 0 or 1 (pass^k at ``k = n``, where a task scores 1 only if all
    its trials pass; or any suite whose tasks all passed or all failed every trial):
    Clopper-Pearson with ``n = T`` and ``x = T*m``. The suite is then exactly a binomial count
    of ``T`` draws, and of the binomial intervals only the exact one keeps its coverage at or
    above nominal at every ``T`` and pass rate (computed exactly for ``T`` from 10 to 114 and
    pass rates in [0.02, 0.98], Wilson, Jeffreys and mid-p each fall below 0.935 somewhere).
``wilson-neff-padded``
    Otherwise: a Wilson score interval (normal quantile) at the effective number of tasks
    ``n_eff = m(1 - m) T (T - 1) / (SS + 0.3 (m^2 + (1 - m)^2))``, ``SS`` the task values' sum
    of squares about their mean ``m``, kept within ``[T, total trials]``. The 0.3 pseudo-task
    at 0 and at 1 widens the interval most where few tasks carry the estimate (near 0 or 1,
    small suites), where the sample variance is least reliable; at a hundred tasks it barely
    counts.
``wilson-neff-t``
    The per-run intervals under paired differences and the p^n null model: Wilson at
    ``n_eff = m(1 - m) / se^2`` with a Student-t quantile on ``T - 1`` degrees of freedom, or
    Clopper-Pearson over tasks under five tasks' worth of successes or failures.
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

``benchmarks/interval_coverage.py`` measures the coverage by simulation on a tuning grid and a
held-out grid (task difficulty laws, 10 to 114 tasks, 4 to 16 trials, k = 1, 2, 4, n);
``tests/stats/test_stats.py`` checks it.
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

"""What crosses from a run to its workers: one frozen run spec, and one job per trial.

A worker may be another process or another machine (Ray), so both are plain, picklable
values: a :class:`RunSpec` says how to build a worker of the run (the suite and agent by name,
the store by URL, the policy, the signing key as PEM), a :class:`Job` names one trial.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ..faults import RunFaults
from ..policy import Policy
from ..store import SigningKey
from ..store.witness import Witness
from .limits import RunLimits

__all__ = ["Job", "JobMode", "RunSpec"]

JobMode = Literal["new", "auto"]


@dataclass(frozen=True, order=True)
class Job:
    """One trial to run.

    Attributes:
        task_id: the task.
        trial: the trial's index (0-based) among the task's trials.
        seed: the trial's seed (:func:`~harness.runs.start.trial_seed`).
        mode: ``new`` (a fresh episode) or ``auto`` (decided from the store under the
            episode's lease: run it, resume it, or leave it).
    """

    task_id: str
    trial: int
    seed: int
    mode: JobMode = "new"


@dataclass(frozen=True)
class RunSpec:
    """How to build a worker of one run, in this process or any other.

    Attributes:
        suite: the suite's path (a worker loads it; one in this process may be given loaded).
        agent: how to build the agent: a built-in name, ``module:Class`` or
            ``path/to/file.py:Class`` (None: an agent object, usable in this process only).
        agent_options: the agent's options, secrets included (never written to the folder).
        store_url: the run's store.
        run_id: the run.
        policy: the policy of every episode.
        faults: the run's fault injection, if any.
        lease_seconds: how long an episode's lease lasts without renewal.
        signing_key: the run's signing key as PEM (a key object does not cross processes).
        transactions: False calls the agent's tools bare
            (:class:`~harness.runs.toolbox.BareToolbox`).
        limits: the limits on model requests that hold for the whole run
            (:class:`~harness.runs.limits.RunLimits`); None: none.
        witness: the file where the workers mirror the signatures they make
            (:class:`~harness.store.witness.Witness`); None: none.
        binding: the digests of the run's configuration and evidence that every trial's
            episode records (:func:`~harness.store.chain.run_binding`); None: none.
        judge: the options of the judge that grades tasks' natural-language assertions
            (:class:`~harness.agents.judge.OpenAIJudge`, its key included, never written to
            the folder); None: no judge.
    """

    suite: str
    agent: str | None
    store_url: str
    run_id: str
    policy: Policy
    agent_options: Mapping[str, Any] = field(default_factory=dict)
    faults: RunFaults | None = None
    lease_seconds: float = 600.0
    signing_key: bytes | None = None
    transactions: bool = True
    limits: RunLimits | None = None
    witness: str | None = None
    binding: Mapping[str, str] | None = None
    judge: Mapping[str, Any] | None = None

    def with_lease(self, seconds: float) -> RunSpec:
        """This spec with episode leases of at most ``seconds``."""
        return replace(self, lease_seconds=min(self.lease_seconds, seconds))


def key_for_workers(key: SigningKey | None, *, executor: str) -> dict[str, Any]:
    """The ``signing_key`` and ``witness`` of a :class:`RunSpec` for ``key``: its PEM (a key
    object does not cross processes), and the path of its witness file when the workers run
    on this machine. Ray's may run on hosts without that file; there the driver's signature of
    the run's manifest, which covers every episode's head, is what the witness holds."""
    if key is None:
        return {"signing_key": None, "witness": None}
    witness = key.witness
    if not isinstance(witness, Witness) or executor == "ray":
        return {"signing_key": key.pem(), "witness": None}
    return {"signing_key": key.pem(), "witness": str(witness.path)}

"""Runs: a suite's tasks as repeated trials, written to one run folder, resumed and replayed.

- :func:`run_trials` (:mod:`.start`) starts a run; :func:`resume_run` (:mod:`.resume`) finishes
  one a crash interrupted; both go through one lifecycle (:mod:`.lifecycle`), with the run's
  workers built from one :class:`~.spec.RunSpec` on one of the executors of
  :mod:`.executors`; :func:`replay_episode` (:mod:`.replay`) re-runs one episode's agent
  against its record.
- :class:`RunLimits` (:mod:`.limits`): limits on model requests that hold for the whole run, in
  every process of it (``run_trials(max_in_flight=, rate_limit=, token_limit=)``).
"""

from .lifecycle import RunResult
from .limits import Rate, RunLimits
from .replay import ReplayReport, replay_episode
from .resume import ResumeResult, resume_run
from .start import run_trials
from .worker import TrialResult

__all__ = [
    "Rate",
    "ReplayReport",
    "ResumeResult",
    "RunLimits",
    "RunResult",
    "TrialResult",
    "replay_episode",
    "resume_run",
    "run_trials",
]

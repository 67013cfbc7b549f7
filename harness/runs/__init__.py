"""Runs: a suite's tasks as repeated trials, written to one run folder, resumed and replayed.

- :func:`run_trials` (:mod:`.start`) starts a run; :func:`resume_run` (:mod:`.resume`) finishes
  one a crash interrupted; :func:`replay_episode` (:mod:`.replay`) re-runs one episode's agent
  against its record.
"""

from .replay import ReplayReport, replay_episode
from .resume import ResumeResult, resume_run
from .start import RunResult, run_trials
from .worker import TrialResult

__all__ = [
    "ReplayReport",
    "ResumeResult",
    "RunResult",
    "TrialResult",
    "replay_episode",
    "resume_run",
    "run_trials",
]

"""Running a run's jobs: in this process, or on a pool of worker processes.

Starting a run and resuming one share this loop: each job is one trial, each result goes to
``on_result`` as it finishes (``None``: another process holds the trial's lease, or it needed
nothing). Ctrl-C stops between trials (:class:`StopOnSigint`).
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .worker import Job, TrialResult, Worker, run_job, start_worker

__all__ = ["StopOnSigint", "Tally", "run_jobs"]


@dataclass
class Tally:
    """Finished trials by what became of them, as a run's progress shows them.

    A trial that ended in an infrastructure error counts there, never as passed or failed.
    """

    done: int = 0
    passed: int = 0
    failed: int = 0
    infra: int = 0

    def add(self, result: TrialResult) -> None:
        """Count one finished trial."""
        self.done += 1
        if result.infra_error:
            self.infra += 1
        elif result.passed:
            self.passed += 1
        else:
            self.failed += 1

    def __str__(self) -> str:
        return f"passed {self.passed}, failed {self.failed}, infrastructure {self.infra}"


class StopOnSigint:
    """Ctrl-C stops a run between trials: the first SIGINT asks, the run ends after the trial
    it is in; a second one interrupts at once (KeyboardInterrupt).

    An interrupt raised at an arbitrary point can land where Python ignores it (a weakref
    callback, a finaliser) and be lost; a flag read between trials cannot.
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._ask)

    def _ask(self, _signum: int, _frame: Any) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self._previous or signal.default_int_handler)

    def restore(self) -> None:
        """Put the handler back as it was."""
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


def run_jobs(
    jobs: Sequence[Job],
    *,
    workers: int,
    worker_args: tuple[Any, ...],
    on_result: Callable[[Job, TrialResult | None], None],
    stop: StopOnSigint | None = None,
    in_process: Worker | None = None,
) -> None:
    """Run ``jobs`` on ``workers`` processes, each building ``Worker(*worker_args)``.

    Args:
        in_process: run every job on this worker in this process instead (one worker, or an
            agent object that cannot be sent to another process).
        stop: raise KeyboardInterrupt between trials once it is requested.

    Raises:
        KeyboardInterrupt: a stop was requested (pending jobs are cancelled).
    """
    if in_process is not None or workers == 1:
        worker = in_process or Worker(*worker_args)
        for job in jobs:
            if stop is not None and stop.requested:
                raise KeyboardInterrupt
            on_result(job, worker.trial(*job))
        return
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(
        workers, mp_context=ctx, initializer=start_worker, initargs=worker_args
    ) as pool:
        submitted = {pool.submit(run_job, job): job for job in jobs}
        try:
            for fut in cf.as_completed(submitted):
                if stop is not None and stop.requested:
                    raise KeyboardInterrupt
                on_result(submitted[fut], fut.result())
        except KeyboardInterrupt:
            for f in submitted:
                f.cancel()
            raise

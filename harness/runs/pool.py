"""Running a run's jobs: in this process, on a pool of worker processes, or on Ray.

Starting a run and resuming one share this loop: each job is one trial, each result goes to
``on_result`` as it finishes (``None``: another process holds the trial's lease, or it needed
nothing). Ctrl-C stops between trials (:class:`StopOnSigint`).

``concurrency`` trials run at once in each worker (threads of a
:class:`~concurrent.futures.ThreadPoolExecutor`, each trial in its own episode): a model-bound
agent spends its time waiting on the server, so one process keeps hundreds in flight. A worker
process gets its share of the jobs as one batch and sends each result back as it finishes.

A model server that is down (:class:`~harness.errors.EndpointDown`) stops the run: no new trial
starts, the trials in flight end, and the error is raised; the trials it stopped have no
result and ``harness resume`` runs them again.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import pickle
import queue
import signal
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ..errors import ConfigurationError, EndpointDown
from .worker import Job, TrialResult, Worker, WorkerLost, run_job, start_worker

__all__ = ["EXECUTORS", "Executor", "Stop", "StopOnSigint", "Tally", "WorkerLost", "run_jobs"]

Executor = Literal["processes", "ray"]
EXECUTORS: tuple[str, ...] = ("processes", "ray")


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


class Stop(Protocol):
    """Something that says when a run should stop between trials."""

    @property
    def requested(self) -> bool:
        """Whether a stop was asked for."""
        ...


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
    concurrency: int = 1,
    executor: Executor = "processes",
    address: str | None = None,
    on_start: Callable[[Job], None] | None = None,
) -> None:
    """Run ``jobs`` on ``workers`` workers, each building ``Worker(*worker_args)`` and running
    ``concurrency`` trials at once.

    Args:
        in_process: run every job on this worker in this process instead (one worker, or an
            agent object that cannot be sent to another process).
        stop: raise KeyboardInterrupt between trials once it is requested.
        concurrency: trials in flight per worker (threads).
        executor: ``processes`` (a pool on this machine) or ``ray`` (Ray tasks, on the cluster
            at ``address``, or a local one started for the run).
        on_start: called when a trial is handed to a worker (processes: when its batch is).

    Raises:
        KeyboardInterrupt: a stop was requested (pending jobs are cancelled).
        EndpointDown: the model server is down; the run stopped.
    """
    if concurrency < 1:
        raise ConfigurationError(f"concurrency must be >= 1 (got {concurrency})")
    if executor == "ray":
        from .ray_pool import run_jobs_on_ray

        run_jobs_on_ray(
            jobs,
            workers=workers,
            concurrency=concurrency,
            worker_args=worker_args,
            on_result=on_result,
            stop=stop,
            address=address,
            on_start=on_start,
        )
        return
    if executor != "processes":
        raise ConfigurationError(f"executor {executor!r}: give one of {', '.join(EXECUTORS)}")
    if in_process is not None or workers == 1:
        worker = in_process or Worker(*worker_args)
        if concurrency == 1:
            for job in jobs:
                if stop is not None and stop.requested:
                    raise KeyboardInterrupt
                if on_start is not None:
                    on_start(job)
                on_result(job, worker.trial(*job))
            return
        for job, outcome in run_in_threads(worker, jobs, concurrency, stop, on_start):
            on_result(job, outcome)
        return
    if concurrency == 1:
        _run_on_processes(jobs, workers, worker_args, on_result, stop, on_start)
    else:
        _run_batches_on_processes(
            jobs, workers, concurrency, worker_args, on_result, stop, on_start
        )


def _run_on_processes(
    jobs: Sequence[Job],
    workers: int,
    worker_args: tuple[Any, ...],
    on_result: Callable[[Job, TrialResult | None], None],
    stop: StopOnSigint | None,
    on_start: Callable[[Job], None] | None,
) -> None:
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(
        workers, mp_context=ctx, initializer=start_worker, initargs=worker_args
    ) as pool:
        submitted = {pool.submit(run_job, job): job for job in jobs}
        if on_start is not None:
            for job in jobs[:workers]:
                on_start(job)
        started = min(workers, len(jobs))
        try:
            for fut in cf.as_completed(submitted):
                if stop is not None and stop.requested:
                    raise KeyboardInterrupt
                if on_start is not None and started < len(jobs):
                    on_start(jobs[started])  # (the next one takes the freed process)
                started += 1
                try:
                    outcome = fut.result()
                except cf.process.BrokenProcessPool as exc:
                    raise WorkerLost(
                        f"a worker process died ({exc}); `harness resume` resumes the trials "
                        "it had in flight"
                    ) from None
                on_result(submitted[fut], outcome)
        except BaseException:
            for f in submitted:
                f.cancel()
            raise


def run_in_threads(
    worker: Worker,
    jobs: Iterable[Job],
    concurrency: int,
    stop: Stop | None = None,
    on_start: Callable[[Job], None] | None = None,
) -> Iterable[tuple[Job, TrialResult | None]]:
    """Run ``jobs`` on ``worker``, ``concurrency`` at once; yield each result as it finishes.

    A stop request, or a job raising (a model server down: :class:`EndpointDown`), starts no
    new job; the jobs in flight end (their results are yielded) before the stop
    (KeyboardInterrupt) or the first error is raised.
    """
    pending = iter(jobs)
    error: BaseException | None = None
    with cf.ThreadPoolExecutor(concurrency, thread_name_prefix="trial") as pool:
        running: dict[cf.Future[TrialResult | None], Job] = {}

        def fill() -> None:
            while len(running) < concurrency and error is None:
                if stop is not None and stop.requested:
                    return
                job = next(pending, None)
                if job is None:
                    return
                if on_start is not None:
                    on_start(job)
                running[pool.submit(worker.trial, *job)] = job

        fill()
        while running:
            done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                job = running.pop(fut)
                exc = fut.exception()
                if exc is None:
                    yield job, fut.result()
                elif error is None or (
                    isinstance(error, EndpointDown) and not isinstance(exc, EndpointDown)
                ):
                    error = exc  # (an error of the code outranks the server being down)
            fill()
    if error is not None:
        raise error
    if stop is not None and stop.requested:
        raise KeyboardInterrupt


class _EventStop:
    """A stop a worker process reads: the parent's event (its StopOnSigint decides)."""

    def __init__(self, event: Any) -> None:
        self.event = event

    @property
    def requested(self) -> bool:
        return bool(self.event.is_set())


def _batch_main(
    results: Any, stop: Any, worker_args: tuple[Any, ...], jobs: list[Job], concurrency: int
) -> None:
    """A worker process: run its share of the jobs, ``concurrency`` at once, sending each
    result back as it finishes, then ``done`` (or the error that ended it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the parent decides when to stop)
    try:
        worker = Worker(*worker_args)
        for job, outcome in run_in_threads(worker, jobs, concurrency, _EventStop(stop)):
            results.put(("result", job, outcome))
    except KeyboardInterrupt:
        pass  # the parent asked
    except BaseException as exc:
        try:
            pickle.dumps(exc)
        except Exception:
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        results.put(("error", None, exc))
    finally:
        results.put(("done", None, None))


def _run_batches_on_processes(
    jobs: Sequence[Job],
    workers: int,
    concurrency: int,
    worker_args: tuple[Any, ...],
    on_result: Callable[[Job, TrialResult | None], None],
    stop: StopOnSigint | None,
    on_start: Callable[[Job], None] | None,
) -> None:
    """``workers`` processes, each taking every ``workers``-th job and running them
    ``concurrency`` at once; results come back on a queue as they finish."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    halt = ctx.Event()
    batches = [list(jobs[i::workers]) for i in range(workers) if jobs[i::workers]]
    processes = [
        ctx.Process(
            target=_batch_main,
            args=(results, halt, worker_args, batch, concurrency),
            name=f"harness-worker-{i}",
        )
        for i, batch in enumerate(batches)
    ]
    for process in processes:
        process.start()
    owner = {job: i for i, batch in enumerate(batches) for job in batch}
    handed = [min(concurrency, len(b)) for b in batches]
    if on_start is not None:
        for batch in batches:
            for job in batch[:concurrency]:
                on_start(job)
    error: BaseException | None = None
    running = len(processes)
    try:
        while running:
            if stop is not None and stop.requested:
                halt.set()  # no new trial; the ones in flight end
            try:
                kind, job, value = results.get(timeout=0.2)
            except queue.Empty:
                if not any(p.is_alive() for p in processes) and results.empty():
                    dead = [p.exitcode for p in processes if p.exitcode]
                    raise WorkerLost(
                        f"a worker process died (exit codes {dead}); `harness resume` resumes "
                        "the trials it had in flight"
                    ) from None
                continue
            if kind == "done":
                running -= 1
            elif kind == "error":
                halt.set()
                if error is None or isinstance(error, EndpointDown):
                    error = value
            else:
                job = tuple(job)
                i = owner[job]
                if on_start is not None and handed[i] < len(batches[i]) and not halt.is_set():
                    on_start(batches[i][handed[i]])
                    handed[i] += 1
                on_result(job, value)
    except BaseException:
        # Interrupted at once (a second Ctrl-C): the workers die as a crash would; resume
        # settles what they had in flight.
        for process in processes:
            process.terminate()
        raise
    finally:
        for process in processes:
            process.join()
    if error is not None:
        raise error
    if stop is not None and stop.requested:
        raise KeyboardInterrupt

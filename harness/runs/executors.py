"""Where a run's trials run: one protocol, three executors.

An :class:`Executor` runs a list of :class:`~harness.runs.spec.Job` and reports each result as
it finishes (``None``: another process holds the trial's lease, or it needed nothing):

- :class:`InProcess`: on one :class:`~harness.runs.worker.Worker` in this process (one worker,
  or an agent object that cannot be sent to another process);
- :class:`Processes`: on worker processes of this machine, each building its worker from the
  run's :class:`~harness.runs.spec.RunSpec` and taking jobs from one queue as it has room;
- :class:`~harness.runs.ray_pool.RayExecutor`: on Ray actors, on a cluster or a local one.

``concurrency`` trials run at once in each worker (threads, each trial in its own episode): a
model-bound agent spends its time waiting on the server, so one process keeps hundreds in
flight.

Stopping: a :class:`Stop` that is requested (Ctrl-C, :class:`StopOnSigint`; too many agent
errors) hands out no new trial; the trials in flight end and are reported, then the executor
raises KeyboardInterrupt. A model server that is down
(:class:`~harness.errors.EndpointDown`) stops the run the same way and is raised. Worker
processes ignore Ctrl-C (the run decides) and die with the process that started them, so a
killed run leaves no worker holding its trials' leases.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import ctypes
import multiprocessing
import os
import pickle
import queue
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .._interrupt import StopOnSigint
from ..errors import ConfigurationError, EndpointDown
from .spec import Job, RunSpec
from .worker import TrialResult, Worker, WorkerLost

__all__ = [
    "EXECUTORS",
    "Executor",
    "InProcess",
    "OnResult",
    "OnStart",
    "Prepares",
    "Processes",
    "Stop",
    "StopFlag",
    "StopOnSigint",
    "Tally",
    "check_placement",
    "die_with_parent",
    "portable",
    "run_in_threads",
    "sigint_ignored",
]

EXECUTORS: tuple[str, ...] = ("processes", "ray")
"""The executors a run may name (``processes`` runs in this process when one worker is asked)."""

OnResult = Callable[[Job, TrialResult | None], None]
OnStart = Callable[[Job], None]


@dataclass
class Tally:
    """Finished trials by what became of them, as a run's progress shows them.

    A trial that ended in an infrastructure error counts there, never as passed or failed;
    one whose agent raised counts as failed, and among the agent errors.
    """

    done: int = 0
    passed: int = 0
    failed: int = 0
    infra: int = 0
    agent_errors: int = 0

    def add(self, result: TrialResult) -> None:
        """Count one finished trial."""
        self.done += 1
        if result.infra_error:
            self.infra += 1
        elif result.passed:
            self.passed += 1
        else:
            self.failed += 1
        if result.agent_error is not None:
            self.agent_errors += 1

    def __str__(self) -> str:
        text = f"passed {self.passed}, failed {self.failed}, infrastructure {self.infra}"
        return text + (f" (agent errors {self.agent_errors})" if self.agent_errors else "")


class Stop(Protocol):
    """Something that says when a run should stop handing out trials."""

    @property
    def requested(self) -> bool:
        """Whether a stop was asked for."""
        ...


@dataclass
class StopFlag:
    """A stop asked for from code (too many agent errors), with why."""

    requested: bool = False
    why: str | None = None

    def ask(self, why: str) -> None:
        """Ask for the stop (the first reason given is kept)."""
        if not self.requested:
            self.requested, self.why = True, why


@dataclass
class AnyStop:
    """Requested when any of ``stops`` is."""

    stops: list[Stop] = field(default_factory=list)

    @property
    def requested(self) -> bool:
        return any(s.requested for s in self.stops)


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """Ctrl-C ignored while worker processes start: they inherit the disposition and so never
    see the terminal's SIGINT (the run decides when they stop, and none prints a traceback)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class Executor(Protocol):
    """Runs a run's jobs and reports each result as it finishes."""

    def run(
        self,
        jobs: Sequence[Job],
        *,
        on_result: OnResult,
        on_start: OnStart | None = None,
        stop: Stop | None = None,
    ) -> None:
        """Run ``jobs``; call ``on_start`` as each is handed to a worker and ``on_result`` (in
        this thread) as each finishes.

        Raises:
            KeyboardInterrupt: ``stop`` was requested (the trials in flight were reported).
            EndpointDown: the model server is down; the run stopped.
            WorkerLost: a worker died with trials in flight (the others were finished).
        """
        ...


@runtime_checkable
class Prepares(Protocol):
    """An executor with something to set up before its run is recorded (Ray's workers, which
    check that they reach the run's store): a setup refused leaves no run behind."""

    def prepare(self, jobs: Sequence[Job]) -> None:
        """Set up to run ``jobs`` (once: a second call does nothing); :meth:`Executor.run` uses
        it and releases it at its end.

        Raises:
            ConfigurationError: the setup was refused (nothing was set up).
        """
        ...

    def close(self) -> None:
        """Release what :meth:`prepare` set up, when the run will not be run."""
        ...


def check_placement(
    caller: str, workers: int, concurrency: int, executor: str, address: str | None
) -> None:
    """Refuse where a run's trials cannot run: fewer than one worker or trial in flight, an
    unknown executor, a Ray address without Ray.

    Raises:
        ConfigurationError: naming ``caller`` and what to give instead.
    """
    if workers < 1 or concurrency < 1:
        raise ConfigurationError(f"{caller}: workers and concurrency must be >= 1")
    if executor not in EXECUTORS:
        raise ConfigurationError(
            f"{caller}: executor {executor!r}: give one of {', '.join(EXECUTORS)}"
        )
    if address is not None and executor != "ray":
        raise ConfigurationError(f"{caller}: address= names a Ray cluster: add executor='ray'")


def run_in_threads(
    worker: Worker,
    jobs: Iterable[Job],
    concurrency: int,
    stop: Stop | None = None,
    on_start: OnStart | None = None,
) -> Iterable[tuple[Job, TrialResult | None]]:
    """Run ``jobs`` on ``worker``, ``concurrency`` at once; yield each result as it finishes.

    A stop request, or a job raising (a model server down: :class:`EndpointDown`), starts no
    new job; the jobs in flight end (their results are yielded) before the stop
    (KeyboardInterrupt) or the first error is raised.

    The worker's gate (the run's limits and shared circuits) stays installed from the first
    job to the last, not set up and taken down around each trial; the store's idle
    connections are closed after the last.
    """
    try:
        with worker.gate:
            yield from _jobs_in_threads(worker, jobs, concurrency, stop, on_start)
    finally:
        worker.store.close_idle()


def _jobs_in_threads(
    worker: Worker,
    jobs: Iterable[Job],
    concurrency: int,
    stop: Stop | None,
    on_start: OnStart | None,
) -> Iterable[tuple[Job, TrialResult | None]]:
    pending = iter(jobs)
    error: BaseException | None = None
    if concurrency == 1:  # (no thread: a trial's own stack, as a plain loop has it)
        for job in pending:
            if stop is not None and stop.requested:
                raise KeyboardInterrupt
            if on_start is not None:
                on_start(job)
            yield job, worker.trial(job)
        return
    pool = cf.ThreadPoolExecutor(concurrency, thread_name_prefix="trial")
    running: dict[cf.Future[TrialResult | None], Job] = {}
    try:

        def fill() -> None:
            while len(running) < concurrency and error is None:
                if stop is not None and stop.requested:
                    return
                job = next(pending, None)
                if job is None:
                    return
                if on_start is not None:
                    on_start(job)
                running[pool.submit(worker.trial, job)] = job

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
    except BaseException:
        # Interrupted at once (a second Ctrl-C): the trials in flight are left to end on
        # their own or with the process, as a crash would leave them; resume settles them.
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    if error is not None:
        raise error
    if stop is not None and stop.requested:
        raise KeyboardInterrupt


@dataclass
class InProcess:
    """Every job on one worker in this process, ``concurrency`` at once."""

    worker: Worker
    concurrency: int = 1

    def run(
        self,
        jobs: Sequence[Job],
        *,
        on_result: OnResult,
        on_start: OnStart | None = None,
        stop: Stop | None = None,
    ) -> None:
        for job, outcome in run_in_threads(self.worker, jobs, self.concurrency, stop, on_start):
            on_result(job, outcome)


def die_with_parent() -> None:
    """Make this process (a worker) die when the process that started it does: a run killed
    with SIGKILL must not leave workers that go on holding its trials' leases, so that the
    resume after it finds every trial free at once.

    Linux: the kernel sends SIGKILL at the parent's death (``PR_SET_PDEATHSIG``); elsewhere a
    thread watches the parent's process id.
    """
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(1, signal.SIGKILL, 0, 0, 0) == 0:  # PR_SET_PDEATHSIG
                if os.getppid() != parent:  # (it died before the call)
                    os._exit(1)
                return

    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="harness-parent-watch", daemon=True).start()


class _EventStop:
    """A stop a worker process reads: the parent's event (the run decides)."""

    def __init__(self, event: Any) -> None:
        self.event = event

    @property
    def requested(self) -> bool:
        return bool(self.event.is_set())


def portable(exc: BaseException) -> BaseException:
    """``exc`` as it can cross to another process: itself when it pickles and unpickles, else
    its nearest harness error class (or RuntimeError) with its message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        pass
    for cls in type(exc).__mro__:
        if cls.__module__ == "harness.errors":
            try:
                copy: BaseException = cls(str(exc))
                pickle.loads(pickle.dumps(copy))
                return copy
            except Exception:
                continue
    return RuntimeError(f"{type(exc).__name__}: {exc}")


def _queued_jobs(jobs: Any, halt: Any) -> Iterable[Job]:
    """The jobs a worker process takes from the run's queue, one when it has room, until
    the queue says there are no more (None) or the run stops."""
    while not halt.is_set():
        job = jobs.get()
        if job is None:
            return
        yield job


def _process_main(spec: RunSpec, concurrency: int, jobs: Any, results: Any, halt: Any) -> None:
    """A worker process: take jobs from the queue, ``concurrency`` at once, sending each start
    and result back as it happens, then ``done`` (or the error that ended it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the parent decides when to stop)
    die_with_parent()
    try:
        worker = Worker(spec)
        for job, outcome in run_in_threads(
            worker,
            _queued_jobs(jobs, halt),
            concurrency,
            _EventStop(halt),
            on_start=lambda job: results.put(("start", job, None)),
        ):
            results.put(("result", job, outcome))
    except KeyboardInterrupt as exc:
        if not halt.is_set():  # (the agent's own interrupt: a stop of the run, as here)
            results.put(("error", None, exc))
    except BaseException as exc:
        results.put(("error", None, portable(exc)))
    finally:
        results.put(("done", None, None))


@dataclass
class Processes:
    """``workers`` processes of this machine, each building its worker from ``spec`` and
    taking jobs from one queue as it has room, ``concurrency`` at once."""

    spec: RunSpec
    workers: int
    concurrency: int = 1

    def run(
        self,
        jobs: Sequence[Job],
        *,
        on_result: OnResult,
        on_start: OnStart | None = None,
        stop: Stop | None = None,
    ) -> None:
        if not jobs:
            return
        ctx = multiprocessing.get_context("spawn")
        work, results, halt = ctx.Queue(), ctx.Queue(), ctx.Event()
        for job in jobs:
            work.put(job)
        count = min(self.workers, len(jobs))
        for _ in range(count):
            work.put(None)
        processes = [
            ctx.Process(
                target=_process_main,
                args=(self.spec, self.concurrency, work, results, halt),
                name=f"harness-worker-{i}",
                daemon=True,
            )
            for i in range(count)
        ]
        with sigint_ignored():
            for process in processes:
                process.start()
        in_flight: dict[Job, int] = {}  # job -> how many times started (and not finished)
        error: BaseException | None = None
        running = count
        try:
            while running:
                if stop is not None and stop.requested:
                    halt.set()  # no new trial; the ones in flight end
                try:
                    kind, job, value = results.get(timeout=0.2)
                except queue.Empty:
                    if not any(p.is_alive() for p in processes) and results.empty():
                        break  # (every process gone without saying done: lost, below)
                    continue
                if kind == "done":
                    running -= 1
                elif kind == "start":
                    in_flight[job] = in_flight.get(job, 0) + 1
                    if on_start is not None:
                        on_start(job)
                elif kind == "error":
                    halt.set()
                    if error is None or isinstance(error, EndpointDown):
                        error = value
                else:
                    in_flight.pop(job, None)
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
            work.cancel_join_thread()
        if error is not None:
            raise error
        dead = [p.exitcode for p in processes if p.exitcode]
        if in_flight or (dead and not (stop is not None and stop.requested)):
            lost = ", ".join(f"{j.task_id} trial {j.trial}" for j in sorted(in_flight))
            raise WorkerLost(
                f"a worker process died (exit codes {dead}) with trial(s) in flight"
                f"{': ' + lost if lost else ''}; the other trials finished; `harness resume` "
                "resumes the ones it had"
            )
        if stop is not None and stop.requested:
            raise KeyboardInterrupt


def executor_for(
    name: str,
    spec: RunSpec,
    *,
    workers: int,
    concurrency: int,
    address: str | None,
    in_process: Callable[[], Worker],
) -> Executor:
    """The executor a run names: ``processes`` (in this process when ``workers`` is 1, or when
    ``spec`` names no agent to build elsewhere: ``in_process`` makes its worker) or ``ray``.

    Raises:
        ConfigurationError: an unknown name, or ``address`` without Ray.
    """
    if name not in EXECUTORS:
        raise ConfigurationError(f"executor {name!r}: give one of {', '.join(EXECUTORS)}")
    if address is not None and name != "ray":
        raise ConfigurationError("address= names a Ray cluster: add executor='ray'")
    if name == "ray":
        from .ray_pool import RayExecutor

        return RayExecutor(spec, workers=workers, concurrency=concurrency, address=address)
    if workers == 1 or spec.agent is None:
        return InProcess(in_process(), concurrency)
    return Processes(spec, workers, concurrency)

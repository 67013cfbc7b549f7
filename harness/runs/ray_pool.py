"""Running a run's jobs on a Ray cluster (``harness run --executor ray``).

Each Ray worker is an actor that builds one :class:`~.worker.Worker` when it starts and keeps
it, running up to ``concurrency`` trials at once in its threads; the workers are placed on the
cluster's live nodes in turn. Every trial runs in mode
``auto``, under its episode's lease: a trial handed out again, after the process running it
was killed, resumes its episode from the records (in-doubt calls probed, nothing committed runs
a second time); one whose episode finished meanwhile is not run again.

A worker that dies is restarted by Ray on its node, and the driver hands its trials out again,
to whichever worker has room; a worker whose node is gone is not restarted elsewhere, and the
driver gives up on it (:data:`RESTART_SECONDS`) and goes on with the others. A lease is free
at once when its holder ran on the same host and its process is gone; a holder on another
machine is waited for until its lease expires, which is why trials on Ray hold
:data:`RAY_LEASE_SECONDS`-second leases (renewed every third of that) instead of the ten
minutes of a local run: a dead machine delays its trials' second attempt by at most that.

Where the workers find the code: a Ray instance this function starts runs on this machine with
this interpreter. Each worker enters the driver's working directory and adds the folders of the
driver's own code on ``sys.path`` (not the interpreter's or installed packages), as a process
of a local pool would have them, so relative run folders, suites, environments and agents named
``module:Class`` resolve alike. A cluster given by address gets this harness's packages shipped
with the job (Ray's ``runtime_env`` ``py_modules``), so its workers run the same harness as the
driver; the suite, the agent's code and the store must be reachable from every node at the same
paths (a shared filesystem, and a Postgres store for nodes on other machines). A worker on
another machine than the driver refuses a SQLite store before it builds its run worker, on its
first start and on every restart (:func:`check_store_reach`), so no SQLite file is written
there; workers are started before the run is recorded (:meth:`RayExecutor.prepare`), so a run
refused that way leaves nothing recorded.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import importlib.util
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError, HarnessError
from ..store import TrialRow
from .layout import episode_id
from .spec import Job, RunSpec
from .worker import TrialResult, Worker, WorkerLost, trial_state

if TYPE_CHECKING:
    from .executors import OnResult, OnStart, Stop

__all__ = [
    "LOST_WORKER_LIMIT",
    "RAY_LEASE_SECONDS",
    "RESTART_SECONDS",
    "RayExecutor",
    "RayWorker",
    "check_store_reach",
]

RAY_LEASE_SECONDS = 60.0
"""The longest episode lease a trial on Ray holds (a shorter one given by the caller is kept)."""

LOST_WORKER_LIMIT = 3
"""How many times a trial is handed out again after the worker running it died."""

RESTART_SECONDS = 120.0
"""How long a Ray worker that died may take to answer again (Ray restarting it, on its node or
another) before the run gives up on it and goes on with the others."""

# What a worker says of a job it did not run: another process holds the episode's lease (the
# driver hands the job out again later), or there is nothing to do.
_HELD = "held"
_DONE = "done"
_INSTALL = "pip install 'transactional-harness[ray]'"
_TICK = 0.5  # seconds between looks at a stop request while trials run


def _import_ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise ConfigurationError(
            f"the Ray executor needs Ray, which is not installed ({exc}): {_INSTALL}"
        ) from exc


def _code_paths() -> list[str]:
    """The folders on this process's ``sys.path`` that hold code of the user's own: not the
    interpreter's library or installed packages, which a worker has of its own."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix) if p}
    out: list[str] = []
    for entry in sys.path:
        path = os.path.realpath(entry or os.getcwd())
        if (
            not os.path.isdir(path)
            or "site-packages" in path
            or "dist-packages" in path
            or any(path == p or path.startswith(p + os.sep) for p in prefixes)
            or path in out
        ):
            continue
        out.append(path)
    return out


def _shipped_packages() -> list[str]:
    """The folder of this harness's package (its verifiers inside), to ship to a cluster's
    workers; never another installed package of a name it once used."""
    spec = importlib.util.find_spec("harness")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [next(iter(spec.submodule_search_locations))]


def check_store_reach(store_url: str, hosts: Sequence[str], here: str | None = None) -> None:
    """Refuse a SQLite store for workers on another machine than this one.

    A SQLite file is one machine's: workers elsewhere would each write a file of their own at
    the same path (or share one over a network filesystem, which SQLite's locks do not survive),
    and this process would read none of it.

    Args:
        store_url: the run's store.
        hosts: the host names of the run's Ray workers.
        here: this machine's host name (default: ``socket.gethostname()``).

    Raises:
        ConfigurationError: the store is SQLite and a worker runs on another machine.
    """
    here = socket.gethostname() if here is None else here
    elsewhere = sorted(set(hosts) - {here})
    if store_url.startswith("sqlite") and elsewhere:
        raise ConfigurationError(
            f"the run's store is a SQLite file on this machine ({here}: {store_url}) and Ray "
            f"workers run on {', '.join(elsewhere)}: a SQLite file is written by one machine; "
            "give the run a Postgres store, or run on Ray without --address (this machine only)"
        )


class RayWorker:
    """What runs in one Ray worker process: one :class:`~.worker.Worker`, kept for every trial.

    The store's reach is checked here, before the worker is built (building it opens the
    store, and would create a SQLite file of its own on another machine): on its first start and
    on every restart Ray gives it, wherever that lands.

    Args:
        cwd: the driver's working directory, entered when it exists here (and the job gave no
            working directory of its own).
        paths: folders of the driver's code to add to ``sys.path`` when they exist here.
        spec: the run; ``Worker(spec)`` builds the worker.
        driver_host: the driver's host name: on another host, a SQLite store is refused
            (:func:`check_store_reach`) and no worker is built.
    """

    def __init__(
        self, cwd: str, paths: list[str], spec: RunSpec, driver_host: str | None = None
    ) -> None:
        if os.path.isdir(cwd) and not _job_working_dir():
            os.chdir(cwd)
        for path in paths:
            if path not in sys.path and os.path.isdir(path):
                sys.path.append(path)
        self.where = f"{socket.gethostname()}:{os.getpid()}"
        self.worker: Worker | None = None
        self.error: str | None = None
        try:
            if driver_host is not None:
                check_store_reach(spec.store_url, [socket.gethostname()], here=driver_host)
            self.worker = Worker(spec)
        except Exception as exc:  # said to the driver, which stops the run with it
            self.error = f"{type(exc).__name__}: {exc}"

    def ready(self) -> tuple[str, str, str | None]:
        """The worker's host, its host and process, and why it could not build its worker."""
        return socket.gethostname(), self.where, self.error

    def trial(self, job: Job, again: bool) -> tuple[str, TrialResult | None]:
        """Run ``job`` in mode ``auto``: new, resumed from its records, or left when done.

        Args:
            again: the job was handed out before and its worker died: when the trial has
                finished since, its recorded result is given (it was lost on the way).

        Returns:
            ``("done", result)``; ``("done", None)``: nothing to do (finished, or waiting for a
            person); ``("held", None)``: another process holds the episode's lease.
        """
        if self.worker is None:
            raise HarnessError(f"Ray worker {self.where} could not build its worker: {self.error}")
        result = self.worker.trial(replace(job, mode="auto"))
        if result is not None:
            return _DONE, result
        state, eid = trial_state(
            self.worker.store, episode_id(self.worker.run_id, job.task_id, job.trial)
        )
        if state in ("new", "resume"):
            return _HELD, None
        if again and state == "done":
            with self.worker.store.session() as s:
                row = s.get(TrialRow, eid)
            return _DONE, None if row is None else TrialResult.from_row(row)
        return _DONE, None


def _job_working_dir() -> bool:
    """Whether this Ray job gave its workers a working directory (``runtime_env``)."""
    try:
        ray = importlib.import_module("ray")
        return bool(ray.get_runtime_context().runtime_env.get("working_dir"))
    except Exception:  # no Ray context: nothing was given
        return False


@dataclass
class RayExecutor:
    """Jobs as Ray tasks on ``workers`` Ray actors, ``concurrency`` trials each at once.

    Ray is started here on this machine (and stopped after) when no ``address`` is given and
    this process is not connected to Ray yet; with an ``address`` (``ray.init(address=...)``:
    ``auto``, ``host:port`` or ``ray://host:port``) the run connects to that cluster and
    disconnects after, leaving it running. A process already connected to Ray uses that
    connection as it is. Each job runs in mode ``auto``, whatever mode it names (a job handed
    out again must resume its episode, not start it anew); the episode lease is capped at
    :data:`RAY_LEASE_SECONDS`.
    """

    spec: RunSpec
    workers: int = 1
    concurrency: int = 1
    address: str | None = None
    _started: _Started | None = field(default=None, init=False, repr=False, compare=False)

    def prepare(self, jobs: Sequence[Job]) -> None:
        """Connect to Ray and start the workers for ``jobs``, each checking that it can reach
        the run's store before it builds its run worker (:class:`RayWorker`): a run refused
        here has recorded nothing. :meth:`run` uses them and :meth:`close` lets them go.

        Raises:
            ConfigurationError: Ray is not installed, ``workers`` or ``concurrency`` is below
                1, a worker could not build its run worker (a suite, agent or store it cannot
                reach), or a SQLite store would be written from several machines.
        """
        if self.workers < 1 or self.concurrency < 1:
            raise ConfigurationError(
                f"the Ray executor needs workers >= 1 and concurrency >= 1 (got workers="
                f"{self.workers}, concurrency={self.concurrency})"
            )
        ray = _import_ray()
        if self._started is None and jobs:
            self._started = _start(
                ray,
                self.spec.with_lease(RAY_LEASE_SECONDS),
                workers=min(self.workers, len(jobs)),
                concurrency=self.concurrency,
                address=self.address,
            )

    @property
    def hosts(self) -> list[str]:
        """The host of each worker :meth:`prepare` started (none before, or after :meth:`close`)."""
        return [] if self._started is None else list(self._started.hosts)

    def close(self) -> None:
        """Stop the workers, and the Ray connection or instance :meth:`prepare` made."""
        started, self._started = self._started, None
        if started is not None:
            started.stop()

    def run(
        self,
        jobs: Sequence[Job],
        *,
        on_result: OnResult,
        on_start: OnStart | None = None,
        stop: Stop | None = None,
    ) -> None:
        """Run ``jobs`` (starting the workers first unless :meth:`prepare` did); results reach
        ``on_result`` here as they finish. The workers are stopped after.

        Raises:
            ConfigurationError: as :meth:`prepare`, or a worker Ray restarted could not build
                its run worker (on another machine, a SQLite store).
            WorkerLost: a trial's worker died more than :data:`LOST_WORKER_LIMIT` times
                (raised after the other trials finished; ``harness resume`` finishes it).
            KeyboardInterrupt: a stop was requested.
        """
        try:
            self.prepare(jobs)
            if self._started is None:  # no jobs
                return
            spec = self.spec.with_lease(RAY_LEASE_SECONDS)
            _drive(
                self._started.ray,
                self._started.actors,
                jobs,
                store_url=spec.store_url,
                concurrency=self.concurrency,
                on_result=on_result,
                on_start=on_start,
                stop=stop,
                poll=min(5.0, spec.lease_seconds / 3),
                restart_for=RESTART_SECONDS,
            )
        finally:
            self.close()


@dataclass
class _Started:
    """The Ray workers of one run, and how to leave Ray as it was found."""

    ray: Any
    actors: list[Any]
    connected_here: bool
    sigterm: Any
    hosts: list[str] = field(default_factory=list)

    def stop(self) -> None:
        for actor in self.actors:
            with contextlib.suppress(Exception):  # already gone
                self.ray.kill(actor, no_restart=True)
        if self.connected_here:
            self.ray.shutdown()
            if self.sigterm is not None:
                signal.signal(signal.SIGTERM, self.sigterm)


def _start(
    ray: Any, spec: RunSpec, *, workers: int, concurrency: int, address: str | None
) -> _Started:
    """Connect to Ray (unless connected), start ``workers`` actors and wait until each has
    built its run worker, or refused to."""
    connected_here = not ray.is_initialized()
    # ray.init sets a SIGTERM handler of its own in the main thread; put ours back after.
    main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main else None
    if connected_here:
        if address is None:
            ray.init(include_dashboard=False, logging_level=logging.WARNING)
        else:
            _connect(ray, address)
    started = _Started(ray, [], connected_here, sigterm)
    try:
        remote = ray.remote(
            num_cpus=0,  # a worker waits on models and stores; it can always be (re)placed
            max_concurrency=concurrency,
            max_restarts=-1,
            max_task_retries=0,  # the driver hands a lost trial out again itself
        )(RayWorker)
        here = socket.gethostname()
        args = (os.getcwd(), _code_paths(), spec, here)
        started.actors = [
            remote.options(scheduling_strategy=where).remote(*args)
            for where in _placements(ray, workers)
        ]
        answers = ray.get([a.ready.remote() for a in started.actors])
        started.hosts = [host for host, _, _ in answers]
        check_store_reach(spec.store_url, started.hosts, here=here)
        for _host, where, error in answers:
            if error is not None:
                raise ConfigurationError(
                    f"Ray worker {where} could not build the run's worker: {error}; every Ray "
                    "node needs the run's suite, agent code and store at the same paths as here"
                )
    except BaseException:
        started.stop()
        raise
    return started


def _first_line(exc: BaseException) -> str:
    """An error's first line (its type when it says nothing)."""
    text = str(exc)
    return text.splitlines()[0] if text.strip() else repr(exc)


def _placements(ray: Any, workers: int) -> list[Any]:
    """Where each of ``workers`` actors goes: the cluster's live nodes in turn; ``SPREAD`` on
    a cluster of one node.

    Ray's ``SPREAD`` places actors that need no CPU at will (of four on two nodes, all on one
    about one time in five), and so does a soft node affinity; a hard one is kept. So a worker
    is restarted on its own node only: one whose node died is not brought back (the run gives
    up on it after :data:`RESTART_SECONDS`), and the other workers take its trials.
    """
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
    if len(nodes) < 2:
        return ["SPREAD"] * workers
    strategies = importlib.import_module("ray.util.scheduling_strategies")
    return [
        strategies.NodeAffinitySchedulingStrategy(node_id=nodes[i % len(nodes)], soft=False)
        for i in range(workers)
    ]


def _connect(ray: Any, address: str) -> None:
    """Connect to the Ray cluster at ``address``, this harness's packages shipped to its
    workers.

    Raises:
        ConfigurationError: the cluster asks for an authentication token this process did
            not send (what to set, on which side), or no cluster answers there.
    """
    try:
        ray.init(
            address=address,
            logging_level=logging.WARNING,
            runtime_env={"py_modules": _shipped_packages(), "excludes": ["__pycache__", "*.pyc"]},
        )
    except (ConnectionError, RuntimeError) as exc:
        if _auth_refused(exc):
            raise ConfigurationError(
                f"the Ray cluster at {address} refused this process: it asks for an "
                "authentication token (token auth is on: `ray start` turns it on where "
                "~/.ray/auth_token exists, or with RAY_AUTH_MODE=token) and this process sent "
                "none, or another one; a driver given an address does not turn it on by "
                "itself. Run the harness with RAY_AUTH_MODE=token and the cluster's token in "
                "~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN, or start the "
                "cluster's nodes with RAY_AUTH_MODE=disabled"
            ) from exc
        hint = (
            "; is a cluster running there (`ray status --address ...`), and does this machine "
            "reach it?"
            if isinstance(exc, ConnectionError)
            else ""
        )
        raise ConfigurationError(
            f"could not join the Ray cluster at {address}: {_first_line(exc)}{hint}"
        ) from exc


def _auth_refused(exc: BaseException) -> bool:
    """Whether ``exc`` or one of its causes is Ray's refusal of a missing or wrong token."""
    seen: BaseException | None = exc
    while seen is not None:
        if type(seen).__name__ == "AuthenticationError" or "InvalidAuthToken" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _drive(
    ray: Any,
    actors: list[Any],
    jobs: Sequence[Job],
    *,
    store_url: str,
    concurrency: int,
    on_result: OnResult,
    on_start: OnStart | None,
    stop: Stop | None,
    poll: float,
    restart_for: float = RESTART_SECONDS,
) -> None:
    """Hand jobs to the least busy live worker, at most ``concurrency`` at once on each; report
    results as they come; hand a job out again when its worker died or another process held
    its lease.

    A worker whose call failed is not handed anything until it answers again (Ray restarts it):
    a call sent while it restarts would fail at once, and count as a lost attempt it never made.
    One that has not answered ``restart_for`` seconds after it died (its actor dead for good,
    or no node to restart it on) is given up on; the others go on.

    Raises:
        WorkerLost: every worker was given up on with jobs left, or a job's worker died under
            it more than :data:`LOST_WORKER_LIMIT` times (after the other jobs finished).
    """
    errors = ray.exceptions
    queue: collections.deque[tuple[Job, int]] = collections.deque((j, 0) for j in jobs)
    waiting: list[tuple[float, Job, int]] = []  # (when to hand it out again, job, workers lost)
    running: dict[Any, tuple[Job, int, int]] = {}  # ref -> (job, worker index, workers lost)
    pings: dict[Any, int] = {}  # ref of a restarted worker's ready() -> its index
    repings: list[tuple[float, int]] = []  # (when to ask again, worker index)
    died: dict[int, tuple[float, str]] = {}  # worker index -> (when it died, why), until back
    gone: dict[int, str] = {}  # workers given up on -> why they died
    load = [0] * len(actors)
    live = [True] * len(actors)
    handed: set[Job] = set()
    lost: list[tuple[Job, str]] = []
    stopping = False

    def ping(i: int) -> None:
        live[i] = False
        pings[actors[i].ready.remote()] = i

    def died_now(i: int, exc: BaseException) -> None:
        died.setdefault(i, (time.monotonic(), _first_line(exc)))

    while queue or waiting or running:
        stopping = stopping or (stop is not None and stop.requested)
        now = time.monotonic()
        for i, (since, _why) in list(died.items()):
            if now - since >= restart_for and all(r[1] != i for r in running.values()):
                gone[i] = died.pop(i)[1]
                pings = {ref: k for ref, k in pings.items() if k != i}
                repings = [r for r in repings if r[1] != i]
        if stopping:
            queue.clear()
            waiting.clear()
        if len(gone) == len(actors) and (queue or waiting):
            why = "; ".join(sorted(set(gone.values())))
            raise WorkerLost(
                f"every Ray worker of the run is gone, with {len(queue) + len(waiting)} "
                f"trial(s) left to run: none answered within {restart_for:g} s of dying "
                f"({why}); the run's records keep what they did: once the cluster has room "
                "for its workers again, `harness resume` on the run's folder finishes them"
            )
        queue.extend((job, losses) for when, job, losses in waiting if when <= now)
        waiting = [w for w in waiting if w[0] > now]
        for i in [i for when, i in repings if when <= now]:
            ping(i)
        repings = [r for r in repings if r[0] > now]
        free = [i for i in range(len(actors)) if live[i] and load[i] < concurrency]
        while queue and free:
            job, losses = queue.popleft()
            i = min(free, key=load.__getitem__)
            if on_start is not None and job not in handed:
                on_start(job)
            handed.add(job)
            running[actors[i].trial.remote(job, losses > 0)] = (job, i, losses)
            load[i] += 1
            if load[i] >= concurrency:
                free.remove(i)
        if not running and not pings:
            later = [w[0] for w in waiting] + [r[0] for r in repings]
            if later:
                time.sleep(max(0.0, min(later) - time.monotonic()))
            continue
        done, _ = ray.wait([*running, *pings], num_returns=1, timeout=_TICK)
        for ref in done:
            if ref in pings:
                i = pings.pop(ref)
                try:
                    host, where, error = ray.get(ref)
                except errors.RayError as exc:  # still restarting, or dead for good
                    died_now(i, exc)
                    repings.append((time.monotonic() + 0.2, i))
                    continue
                check_store_reach(store_url, [host])  # (it refused to build its worker)
                if error is not None:
                    raise ConfigurationError(
                        f"Ray worker {where} (restarted) could not build the run's worker: "
                        f"{error}; every Ray node needs the run's suite, agent code and store "
                        "at the same paths as here"
                    )
                live[i] = True
                died.pop(i, None)
                continue
            job, i, losses = running.pop(ref)
            load[i] -= 1
            try:
                said, result = ray.get(ref)
            except errors.RayTaskError:
                raise  # the trial's own error (a RayTaskError is also one of its cause's type)
            except errors.RayError as exc:  # the worker died, or its answer was lost
                died_now(i, exc)
                if live[i]:
                    ping(i)
                if losses >= LOST_WORKER_LIMIT:
                    lost.append((job, _first_line(exc)))
                else:
                    queue.appendleft((job, losses + 1))
                continue
            if said == _HELD:
                waiting.append((time.monotonic() + poll, job, losses))
                continue
            on_result(job, result)
    if stopping:
        raise KeyboardInterrupt
    if lost:
        names = ", ".join(f"{job.task_id} trial {job.trial}" for job, _ in sorted(lost))
        raise WorkerLost(
            f"{len(lost)} trial(s) given up, their Ray worker having died under them "
            f"{LOST_WORKER_LIMIT + 1} time(s): {names} (last: {lost[-1][1]}); the run's records "
            "keep what they did: "
            "`harness resume` on the run's folder finishes them"
        )

"""Trials per second of model-bound runs by trials in flight, and the harness's CPU per trial.

    python benchmarks/scale.py [--trials 2000] [--levels 1,8,64,256] [--latency 0.2]
                               [--caps 1=100,8=500] [--workers 2] [--worker-concurrency N]
                               [--executors processes,ray] [--suite retail]
                               [--store postgresql+psycopg://user@host:port/db]

The built-in ``openai`` agent runs the suite's tasks against the fake chat-completions server
(:class:`~harness.testing.model_server.FakeChatServer` playing each task's reference actions,
:class:`~harness.testing.model_server.ReplayPolicy`), which answers every call after
``--latency`` seconds, as a model would. The server runs in a process of its own, so its CPU is
not counted as the harness's, and answers from one asyncio thread (:class:`LeanServer`: the
same answers, about half the CPU a call of a thread a connection), so that it takes as little
as it can of the cores the harness's processes are measured on. Settings, each a run of
``--trials`` trials (the suite's tasks, the same number of trials each):

- ``concurrency N``: one process, N trials in flight (threads), for each of ``--levels``; by
  default concurrency 1 runs only about 100 trials and concurrency 8 about 500 (``--caps``), as
  2,000 trials at 1 in flight take over half an hour and at 8 several minutes;
- ``processes``, ``ray``: ``--workers`` worker processes (or Ray workers), each with
  ``--worker-concurrency`` trials in flight (default: the highest level shared among them),
  writing the run folder's own SQLite store;
- ``processes+postgres``, ``ray+postgres``: the same, writing a Postgres store
  (``run_trials(store=URL)``) in a database the benchmark creates on the server ``--store``
  names (default: the environment variable ``HX_BENCH_POSTGRES_URL``) before the setting and
  drops after it. Without a server these rows say why they were not run.

For each it prints the trials, the seconds, trials per second, the ideal (trials in flight /
(model calls per trial x latency), calls per trial counted by the server), the share of the
ideal reached, the CPU seconds per trial of the harness's processes (this one and the workers
it starts, Ray's own processes included; not the server), that as a share of a trial's mean
wall time, the cores they kept busy, and the cores other work on the machine kept busy. One
core runs at most 1 / (CPU seconds per trial) trials a second: the ceiling. Each setting is
judged against the target, 80% of the ideal, or of that ceiling once the cores left free are
saturated (DESIGN.md: "256 trials in flight in one process reach at least 80% of the ideal
throughput until a core is saturated").

For each Postgres setting it then prints the ratio Postgres / SQLite of trials per second and
of the harness's CPU per trial against the same executor on SQLite in the same run, the CPU
Postgres's backends spent on the run's database (sampled from /proc every 0.2 s, when the
server runs on this machine; counted neither as the harness's nor as other work) and the most
connections to it seen at once.

Through every setting it samples, every 0.5 s, the resident memory (VmRSS) of the harness's
processes (this one and its descendants, Ray's own processes included; not the server) and the
trials finished by then (run_trials's ``progress``); the table's ``RSS MB`` is the peak.

Last it prints the performance targets (README, Performance), each from settings of this same
run, one ``target ...`` line each: ``target cores``, ``processes WxC`` against
``concurrency W*C`` in trials per second (at least 0.9 W times: 1.8x at 2 workers);
``target ray cpu``, ``ray WxC`` against ``concurrency W*C`` in the harness's CPU per trial (at
most 1.2x); ``target memory``, for each
setting the RSS at 25% of its trials finished against the end (the last sample with trials
still in flight), flat if it grew under 5%, with the growth per 1,000 trials finished (least
squares from the 25% mark on) and MB per trial in flight. Only what the targets need, in a few
minutes::

    python benchmarks/scale.py --levels 256 --executors processes,ray
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import inspect
import itertools
import json
import multiprocessing
import os
import re
import resource
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from harness.runs.start import run_trials
from harness.suite import Suite, load_suite
from harness.testing.model_server import (
    FakeChatServer,
    ReplayPolicy,
    _check_request,
    _error,
)

TARGET = 0.80  # of the ideal throughput, until the harness's cores are saturated
POSTGRES_ENV = "HX_BENCH_POSTGRES_URL"  # the default --store
NOISY_OTHERS = 0.25  # cores of other work apart, past which a Postgres / SQLite pair is flagged
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # (Ray colours its errors' text)


# --- the fake model server, in a process of its own ---


class LeanServer:
    """The fake server's answers over a lean HTTP/1.1 server: one asyncio loop in one thread.

    It answers as :class:`~harness.testing.model_server.FakeChatServer` does (its request
    checks, its policy, its completions and token counts), but not with a thread a
    connection: at hundreds of connections those threads take turns at the interpreter lock,
    and the server took about 0.8 ms of CPU a call, a share of a small machine's cores that
    the harness's processes are measured without. Requests are counted, not kept.
    """

    def __init__(self, fake: FakeChatServer, latency: float) -> None:
        self.fake = fake
        self.latency = latency
        self.requests = 0
        self._sock = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.port: int = self._sock.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._stopped: asyncio.Future[None] | None = None
        # The open connections: {id(task): (task, writer)}.
        self._open: dict[int, tuple[asyncio.Task[None], asyncio.StreamWriter]] = {}
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(30)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._stopped = self._loop.create_future()

        async def main() -> None:
            server = await asyncio.start_server(self._connection, sock=self._sock)
            ready.set()
            assert self._stopped is not None
            await self._stopped
            server.close()
            # (closed, each connection's read ends and its task with it)
            tasks = [task for task, _ in self._open.values()]
            for _, writer in list(self._open.values()):
                writer.close()
            await asyncio.gather(*tasks, return_exceptions=True)

        self._loop.run_until_complete(main())

    def stop(self) -> None:
        """End the server (the connections in flight are dropped)."""
        if self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set_result, None)
        self._thread.join(10)
        self._loop.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._open[id(task)] = (task, writer)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                lines = head.split("\r\n")
                path = lines[0].split(" ")[1]
                length, close = 0, False
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    name = name.strip().lower()
                    if name == "content-length":
                        length = int(value)
                    elif name == "connection" and value.strip().lower() == "close":
                        close = True
                body = await reader.readexactly(length) if length else b""
                if self.latency:
                    await asyncio.sleep(self.latency)
                status, data = self._answer(path, body)
                writer.write(
                    b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s"
                    % (status, HTTPStatus(status).phrase.encode(), len(data), data)
                )
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, IndexError, ValueError):
            pass
        finally:
            self._open.pop(id(task), None)
            writer.close()

    def _answer(self, path: str, body: bytes) -> tuple[int, bytes]:
        self.requests += 1
        if not path.rstrip("/").endswith("/chat/completions"):
            return 404, json.dumps(_error(f"no route {path}", "not_found")).encode()
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        problem = _check_request(request)
        if problem is not None:
            self.fake.errors.append(f"request {self.requests - 1}: {problem}")
            return 400, json.dumps(_error(problem)).encode()
        message = dict(self.fake.policy(request))
        return 200, json.dumps(self.fake._completion(request, message)).encode()


def _serve(suite_path: str, latency: float, conn: Connection) -> None:
    """Serve the suite's reference actions with ``latency`` until told to stop
    (:class:`LeanServer`).

    Commands on ``conn``: ``("stats",)`` answers (requests received, errors, CPU seconds of
    this process); ``("latency", s)`` changes the latency; ``("stop",)`` ends. The responses
    the answers keep are dropped every second, so 10,000 conversations do not pile up in
    memory.
    """
    suite = load_suite(suite_path, check_references=False)
    fake = FakeChatServer(ReplayPolicy(suite.tasks))
    server = LeanServer(fake, latency)
    conn.send(server.port)

    def drop() -> None:
        del fake.responses[: len(fake.responses)]  # (appends go on behind it)

    try:
        while True:
            if not conn.poll(1.0):
                drop()
                continue
            command = conn.recv()
            if command[0] == "stop":
                break
            if command[0] == "latency":
                server.latency = float(command[1])
                conn.send(server.latency)
            elif command[0] == "stats":
                drop()
                conn.send((server.requests, len(fake.errors), time.process_time()))
    finally:
        server.stop()


class ServerProcess:
    """The fake server in a spawned process, and the questions the benchmark asks it."""

    def __init__(self, suite_path: Path, latency: float) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_serve, args=(str(suite_path), latency, child), daemon=True
        )
        self.process.start()
        if not self._conn.poll(120):
            raise RuntimeError("the fake model server did not start within 120 s")
        self.port: int = self._conn.recv()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def stats(self) -> tuple[int, int, float]:
        """Requests received so far, errors the server recorded, its CPU seconds."""
        self._conn.send(("stats",))
        result: tuple[int, int, float] = self._conn.recv()
        return result

    def set_latency(self, seconds: float) -> None:
        """Answer every later request after ``seconds``."""
        self._conn.send(("latency", seconds))
        self._conn.recv()

    def stop(self) -> None:
        """End the server's process."""
        with contextlib.suppress(OSError):
            self._conn.send(("stop",))
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


# --- CPU of the harness's processes ---

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_table() -> dict[int, tuple[int, str, float]]:
    """Every process /proc shows: pid -> (parent pid, start time, CPU seconds). Empty where
    there is no /proc (not Linux)."""
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read().decode("ascii", "replace")
        except OSError:  # (it ended meanwhile)
            continue
        fields = raw[raw.rfind(")") + 2 :].split()
        # After the name: state, ppid (1), ..., utime (11), stime (12), ..., starttime (19).
        ppid, utime, stime, start = int(fields[1]), int(fields[11]), int(fields[12]), fields[19]
        table[int(name)] = (ppid, start, (utime + stime) / _TICK)
    return table


def _descendants(table: dict[int, tuple[int, str, float]], exclude: set[int]) -> list[int]:
    """The processes in ``table`` descending from this one; those in ``exclude`` and their
    descendants left out."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out = []
    todo = [p for p in children.get(os.getpid(), []) if p not in exclude]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(p for p in children.get(pid, []) if p not in exclude)
    return out


def descendants_cpu(exclude: set[int]) -> dict[tuple[int, str], float]:
    """CPU seconds of each live process descending from this one, keyed by (pid, start time);
    the processes in ``exclude`` and their descendants left out."""
    table = _proc_table()
    return {(pid, table[pid][1]): table[pid][2] for pid in _descendants(table, exclude)}


def machine_busy() -> float | None:
    """CPU seconds every core of the machine has been busy since boot (None without
    /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle, iowait
    # (guest time is counted in user time already)
    return (sum(fields[:8]) - idle) / _TICK


def _rusage_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class HarnessCPU:
    """CPU seconds the harness's processes spend between :meth:`start` and :meth:`stop`.

    This process (every thread) from its rusage; worker processes that ended and were waited
    for from the children's rusage; worker processes still alive (and, with ``sample``, ones
    that ended under a parent other than this process, as Ray's workers do) from /proc, read
    at the start, at the end and, with ``sample``, every 0.2 s. ``exclude``: the fake server.
    """

    def __init__(self, exclude: set[int], *, sample: bool = False) -> None:
        self.exclude = exclude
        self.sample = sample
        self._seen: dict[tuple[int, str], float] = {}
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Take the starting readings (and start sampling, if asked)."""
        self._self0 = _rusage_seconds(resource.RUSAGE_SELF)
        self._children0 = _rusage_seconds(resource.RUSAGE_CHILDREN)
        self._live0 = descendants_cpu(self.exclude)
        if self.sample:
            self._thread = threading.Thread(target=self._sampler, daemon=True)
            self._thread.start()

    def _sampler(self) -> None:
        while not self._done.wait(0.2):
            self._seen.update(descendants_cpu(self.exclude))
        self._sampler_cpu = time.thread_time()

    def stop(self) -> float:
        """CPU seconds since :meth:`start` (the sampler's own not counted)."""
        live = descendants_cpu(self.exclude)
        own = _rusage_seconds(resource.RUSAGE_SELF) - self._self0
        if self.sample:
            self._done.set()
            if self._thread is not None:
                self._thread.join()
                own -= self._sampler_cpu
            self._seen.update(live)
            # Ended processes count as last seen (their children's rusage is not ours to read).
            return own + sum(cpu - self._live0.get(k, 0.0) for k, cpu in self._seen.items())
        reaped = _rusage_seconds(resource.RUSAGE_CHILDREN) - self._children0
        alive = sum(cpu - self._live0.get(k, 0.0) for k, cpu in live.items())
        # A process alive at the start and waited for since: rusage counts its whole life.
        gone = sum(cpu for k, cpu in self._live0.items() if k not in live)
        return own + reaped + alive - gone


# --- resident memory of the harness's processes ---

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
FLAT = 0.05  # RSS growth from 25% of the trials finished to the end, under which it is flat
MARK = 0.25  # the share of trials finished at which the first RSS figure is taken


def harness_rss(exclude: set[int]) -> float | None:
    """Resident memory, in MB, of this process and the live ones descending from it (VmRSS,
    from /proc/<pid>/statm); those in ``exclude`` and their descendants left out. None where
    there is no /proc."""
    table = _proc_table()
    if not table:
        return None
    total = 0
    for pid in [os.getpid(), *_descendants(table, exclude)]:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):  # (it ended meanwhile)
            continue
    return total * _PAGE / 2**20


class HarnessMemory:
    """Resident memory of the harness's processes (:func:`harness_rss`) before a run and every
    ``every`` seconds while it goes on, each sample with the trials finished by then (counted
    by :meth:`progress`, run_trials's ``progress`` callback). The sampler thread's own CPU
    (:attr:`cpu`) is for the caller to leave out of the harness's."""

    def __init__(self, exclude: set[int], every: float = 0.5) -> None:
        self.exclude = exclude
        self.every = every
        self.finished = 0
        self.before: float | None = None
        self.samples: list[tuple[int, float]] = []  # (trials finished, MB)
        self.cpu = 0.0
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def progress(self, _result: object) -> None:
        """Count one finished trial."""
        with self._lock:
            self.finished += 1

    def start(self) -> None:
        """Take the reading before the run and start sampling."""
        self.before = harness_rss(self.exclude)
        if self.before is None:
            return
        self._thread = threading.Thread(target=self._sampler, daemon=True)
        self._thread.start()

    def _sampler(self) -> None:
        while not self._done.wait(self.every):
            finished = self.finished
            mb = harness_rss(self.exclude)
            if mb is not None:
                self.samples.append((finished, mb))
        self.cpu = time.thread_time()

    def stop(self) -> None:
        """Stop sampling."""
        self._done.set()
        if self._thread is not None:
            self._thread.join()


@dataclass
class Memory:
    """What :class:`HarnessMemory` saw of one setting, in MB: before the run, at the first
    sample with ``MARK`` of its trials finished, at the last sample with trials still in
    flight (the end: worker processes still alive), the peak, and the growth per 1,000 trials
    finished (least squares over the samples from the mark to the end)."""

    before: float
    mark: float
    mark_finished: int
    end: float
    end_finished: int
    peak: float
    per_1000: float
    samples: int

    @property
    def growth(self) -> float:
        """RSS at the end over RSS at the mark, less one."""
        return self.end / self.mark - 1

    @classmethod
    def of(cls, sampled: HarnessMemory, trials: int) -> Memory | str:
        """The summary of ``sampled`` over a run of ``trials`` trials, or why there is none."""
        if sampled.before is None:
            return "not measured: no /proc"
        running = [s for s in sampled.samples if s[0] < trials]
        tail = [s for s in running if s[0] >= MARK * trials]
        if len(tail) < 3:
            return f"not measured: {len(tail)} sample(s) past {MARK:.0%} of the trials"
        finished, mb = zip(*tail, strict=True)
        slope = statistics.linear_regression(finished, mb).slope if len(set(finished)) > 1 else 0.0
        return cls(
            before=sampled.before,
            mark=tail[0][1],
            mark_finished=tail[0][0],
            end=tail[-1][1],
            end_finished=tail[-1][0],
            peak=max(m for _, m in sampled.samples),
            per_1000=1000 * slope,
            samples=len(tail),
        )


# --- a throwaway Postgres database for the settings that write one ---

_LOCAL_HOSTS = {None, "", "localhost", "127.0.0.1", "::1"}


def _libpq(url: URL) -> str:
    """``url`` as psycopg's connection string (SQLAlchemy's driver name dropped)."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


class PostgresDatabase:
    """A fresh database on the Postgres server at ``server`` (a SQLAlchemy URL; the database
    it names is the one connected to for creating and dropping), for one setting.

    While watched (:meth:`watch`, :meth:`stop_watching`) it samples, every 0.2 s, the
    server's connections to the database and, when the server runs on this machine, its
    backends' CPU seconds from /proc.
    """

    def __init__(self, server: URL, name: str) -> None:
        self.server = server
        self.name = name
        self.url = server.set(database=name).render_as_string(hide_password=False)
        self.local = server.host in _LOCAL_HOSTS
        self.created = False
        self.connections = 0  # the most seen at once
        self._cpu: dict[tuple[int, str], tuple[float, float]] = {}  # first and last reading
        self._done = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    def _admin(self) -> Any:
        import psycopg  # (only the Postgres settings need it)

        return psycopg.connect(_libpq(self.server), autocommit=True, connect_timeout=10)

    def create(self) -> None:
        """Create the database (empty)."""
        with self._admin() as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        self.created = True

    def drop(self) -> None:
        """Drop the database if :meth:`create` made it, closing any connection still open to
        it."""
        self.stop_watching()
        if not self.created:
            return
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        self.created = False

    def watch(self) -> None:
        """Start sampling the database's connections and backends (back once the first
        sample is taken)."""
        self._done.clear()
        self._ready.clear()
        self._thread = threading.Thread(target=self._sampler, daemon=True)
        self._thread.start()
        self._ready.wait(15)

    def stop_watching(self) -> None:
        """Stop sampling, after one last sample."""
        self._done.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @property
    def cpu(self) -> float | None:
        """CPU seconds the database's backends spent while watched (None: the server is not
        on this machine, or /proc showed none). The last 0.2 s of a backend that ended between
        two samples is missed."""
        if not self.local or not self._cpu:
            return None
        return sum(last - first for first, last in self._cpu.values())

    def _sampler(self) -> None:
        try:
            conn = self._admin()
        except Exception:  # (the run itself reports a server it cannot reach)
            self._ready.set()
            return
        with conn:
            self._sample(conn, first=True)
            self._ready.set()
            while not self._done.wait(0.2):
                self._sample(conn, first=False)
            self._sample(conn, first=False)

    def _sample(self, conn: Any, *, first: bool) -> None:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.name,)
        ).fetchall()
        self.connections = max(self.connections, len(rows))
        if not self.local:
            return
        table = _proc_table()
        for (pid,) in rows:
            if pid in table and _is_postgres(pid):
                _, start, cpu = table[pid]
                # A backend first seen after the first sample started meanwhile: all its CPU.
                since = cpu if first else 0.0
                began, _ = self._cpu.get((pid, start), (since, cpu))
                self._cpu[(pid, start)] = (began, cpu)


def _is_postgres(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().startswith("postgres")
    except OSError:
        return False


# --- one setting ---


@dataclass
class Row:
    """One setting's measurements."""

    setting: str
    in_flight: int
    workers: int = 1
    trials: int = 0
    seconds: float = 0.0
    calls: int = 0
    cpu: float = 0.0
    server_cpu: float = 0.0
    trial_seconds: float = 0.0  # mean wall time of one trial
    passed: int = 0
    infra: int = 0
    server_errors: int = 0
    others: float | None = None  # cores busy with other work: neither harness nor server
    store: str = "sqlite"  # the run's store: its own SQLite file, or "postgres"
    db_connections: int = 0  # Postgres: the most connections to the run's database at once
    db_cpu: float | None = None  # Postgres: CPU seconds of its backends (a server here)
    memory: Memory | str | None = None  # the harness's RSS through the run, or why not
    note: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.trials / self.seconds

    def ideal(self, latency: float) -> float:
        """Trials per second if every trial took only its model calls' latency."""
        return self.in_flight / (self.calls / self.trials * latency)

    @property
    def cpu_per_trial(self) -> float:
        return self.cpu / self.trials


def load() -> str:
    """The machine's load average, to read the figures by."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min)"


def supported() -> set[str]:
    """Which of run_trials's options for trials in flight (and its ``progress``) this harness
    has."""
    options = {"concurrency", "executor", "store", "progress"}
    return set(inspect.signature(run_trials).parameters) & options


def measure(
    row: Row,
    suite: Suite,
    server: ServerProcess,
    *,
    trials_per_task: int,
    logs: Path,
    workers: int = 1,
    concurrency: int = 1,
    executor: str | None = None,
    database: PostgresDatabase | None = None,
    attempts: int = 4,
) -> Row:
    """Run one setting and fill ``row`` with what it measured; its store in ``database``
    (created already) when given."""
    # Passed only when set, so concurrency 1 runs on a harness without these options too.
    extra: dict[str, Any] = {}
    if concurrency != 1:
        extra["concurrency"] = concurrency
    if executor is not None:
        extra["executor"] = executor
    if database is not None:
        extra["store"] = database.url
        database.watch()
    requests0, errors0, server_cpu0 = server.stats()
    exclude = {server.process.pid or -1}
    cpu = HarnessCPU(exclude, sample=executor == "ray")
    memory = HarnessMemory(exclude)
    if "progress" in supported():
        extra["progress"] = memory.progress
    memory.start()
    busy0 = machine_busy()
    cpu.start()
    started = time.perf_counter()
    try:
        result = run_trials(
            suite,
            agent="openai",
            agent_options={"base_url": server.base_url, "model": "fake", "attempts": attempts},
            trials=trials_per_task,
            workers=workers,
            logs=logs,
            **extra,
        )
    finally:
        row.seconds = time.perf_counter() - started
        memory.stop()
        row.cpu = cpu.stop() - memory.cpu
        if database is not None:
            database.stop_watching()
            row.db_connections, row.db_cpu = database.connections, database.cpu
    busy1 = machine_busy()
    requests1, errors1, server_cpu1 = server.stats()
    row.trials = len(result.results)
    row.calls = requests1 - requests0
    row.server_errors = errors1 - errors0
    row.server_cpu = server_cpu1 - server_cpu0
    row.passed = sum(r.passed for r in result.results)
    row.infra = sum(r.infra_error for r in result.results)
    row.trial_seconds = statistics.fmean(r.duration for r in result.results)
    row.memory = (
        Memory.of(memory, row.trials)
        if "progress" in extra
        else "not measured: run_trials has no progress= in this harness"
    )
    if busy0 is not None and busy1 is not None:
        spent = row.cpu + row.server_cpu + (row.db_cpu or 0.0)
        row.others = max(0.0, busy1 - busy0 - spent) / row.seconds
    if result.interrupted:
        row.notes.append("the run was interrupted")
    return row


# --- the report ---

HEADER = (
    f"{'setting':<26} {'trials':>6} {'seconds':>8} {'trials/s':>9} {'ideal/s':>8} "
    f"{'% ideal':>8} {'calls/trial':>11} {'CPU s/trial':>11} {'CPU share':>9} {'cores':>6} "
    f"{'others':>6} {'RSS MB':>7}"
)


def line(row: Row, latency: float) -> str:
    """One row of the table."""
    if row.note:
        return f"{row.setting:<26} {row.note}"
    return (
        f"{row.setting:<26} {row.trials:>6} {row.seconds:>8.1f} {row.rate:>9.2f} "
        f"{row.ideal(latency):>8.1f} {100 * row.rate / row.ideal(latency):>7.0f}% "
        f"{row.calls / row.trials:>11.2f} {row.cpu_per_trial:>11.4f} "
        f"{100 * row.cpu_per_trial / row.trial_seconds:>8.1f}% {row.cpu / row.seconds:>6.2f} "
        + ("     ?" if row.others is None else f"{row.others:>6.2f}")
        + (f" {row.memory.peak:>7.0f}" if isinstance(row.memory, Memory) else "       ?")
    )


def free_cores(row: Row) -> float:
    """The cores the harness's processes could use during ``row``: one a process, of the cores
    neither the server, nor Postgres's backends (on this machine), nor other work on the
    machine kept busy."""
    cores = float(row.workers)
    if row.others is not None:
        taken = row.others + (row.server_cpu + (row.db_cpu or 0.0)) / row.seconds
        cores = min(cores, max(0.1, (os.cpu_count() or 1) - taken))
    return cores


def verdict(rows: list[Row], latency: float) -> list[str]:
    """What the measurements say against the target: at least 80% of the ideal until the
    harness's cores are saturated; past that, the ceiling they set (cores / CPU s per trial).

    A process uses at most one core; on a shared machine, at most the cores the server,
    Postgres (on this machine) and other work left free during the setting."""
    out: list[str] = []
    measured = [r for r in rows if not r.note]
    if not measured:
        return out
    first = min(measured, key=lambda r: r.in_flight)
    calls = first.calls / first.trials
    out.append(
        f"ceiling: at {first.in_flight} in flight the harness spends {first.cpu_per_trial:.4f} "
        f"CPU s a trial, so one core runs at most {1 / first.cpu_per_trial:.1f} trials/s; "
        f"with {calls:.2f} calls x {latency * 1000:.0f} ms a trial the ideal reaches that at "
        f"about {calls * latency / first.cpu_per_trial:.0f} trials in flight"
    )
    for r in measured:
        cores = free_cores(r)
        ceiling = cores / r.cpu_per_trial
        bound, what = (
            (r.ideal(latency), "ideal")
            if r.ideal(latency) <= ceiling
            else (ceiling, f"the ceiling of {cores:.2f} free core(s)")
        )
        mark = "meets" if r.rate >= TARGET * bound else "misses"
        out.append(
            f"  {r.setting}: {r.rate:.2f} trials/s = {100 * r.rate / r.ideal(latency):.0f}% of "
            f"ideal; bound by {what} ({bound:.1f}/s at {r.cpu_per_trial:.4f} CPU s a trial): "
            f"{100 * r.rate / bound:.0f}% of it, {mark} {TARGET:.0%}; "
            f"{r.cpu / r.seconds:.2f} cores busy"
        )
    return out


def postgres_against_sqlite(rows: list[Row]) -> list[str]:
    """Each executor on a Postgres store against the same on SQLite, in this run: the ratio
    Postgres / SQLite of trials per second and of the harness's CPU per trial, Postgres's own
    CPU per trial (its backends, when the server runs on this machine) and its connections."""
    out: list[str] = []
    by_setting = {r.setting: r for r in rows if not r.note}
    for pg in rows:
        if pg.note or pg.store != "postgres":
            continue
        sqlite = by_setting.get(pg.setting.replace("+postgres", "", 1))
        if sqlite is None:
            continue
        if not out:
            out.append("Postgres / SQLite store, the same settings in this run:")
        backends = (
            "its backends' CPU unknown (not on this machine)"
            if pg.db_cpu is None
            else f"its backends {pg.db_cpu / pg.trials:.4f} CPU s a trial more "
            f"({pg.db_cpu / pg.seconds:.2f} cores)"
        )
        out.append(
            f"  {pg.setting}: {pg.rate:.2f} / {sqlite.rate:.2f} trials/s = "
            f"{pg.rate / sqlite.rate:.2f}x; the harness's CPU s a trial {pg.cpu_per_trial:.4f} / "
            f"{sqlite.cpu_per_trial:.4f} = {pg.cpu_per_trial / sqlite.cpu_per_trial:.2f}x, "
            f"{backends}; at most {pg.db_connections} connections to its database"
        )
        apart = None if pg.others is None or sqlite.others is None else pg.others - sqlite.others
        if apart is not None and abs(apart) > NOISY_OTHERS:
            out.append(
                f"    (other work kept {sqlite.others:.2f} cores busy during {sqlite.setting} "
                f"and {pg.others:.2f} during {pg.setting}: the ratio reflects that too; run it "
                "again)"
            )
    return out


CORES_FLOOR = 0.9  # W worker processes: at least 0.9 W times one process's trials per second
RAY_CPU_CAP = 1.2  # Ray's CPU per trial: at most 1.2 times one process's


def _met(ok: bool) -> str:
    return "met" if ok else "not met"


def cores_bound(multi: Row, one: Row) -> str:
    """The most ``multi`` could reach against ``one`` on this machine at the same CPU a trial:
    the cores free to its processes over the cores the one process kept busy. One process keeps
    more than a core busy when enough of its work runs outside the interpreter's lock (SQLite,
    the kernel's sockets, hashing), and then W processes on W cores cannot reach W times it."""
    busy = one.cpu / one.seconds
    if busy <= 0:
        return ""
    free = free_cores(multi)
    return (
        f"; at the same CPU a trial the cores allow at most {free / busy:.2f}x here ({free:.2f} "
        f"free / {busy:.2f} busy with one process), and {multi.setting} kept "
        f"{multi.cpu / multi.seconds / free:.0%} of its free cores busy"
    )


def performance_targets(rows: list[Row], workers: int) -> list[str]:
    """The performance targets, each from settings of this run: W worker processes against one
    process with as many trials in flight (trials per second, at least 0.9 W times: 1.8x at
    2); Ray's CPU per trial against that one process's (at most 1.2x); and the harness's
    resident memory flat as trials finish (growth under 5% from 25% of the trials finished to
    the end), for every setting."""
    out = ["performance targets (each from settings of this run):"]
    by_setting = {r.setting: r for r in rows}

    def against_one(
        target: str,
        executor: str,
        what: str,
        of: Callable[[Row], float],
        bound: float,
        *,
        at_least: bool,
        digits: int,
        more: Callable[[Row, Row], str] = lambda multi, one: "",
    ) -> str:
        """``executor``'s SQLite setting against one process with as many trials in flight:
        the ratio of ``of`` (``what``), at least or at most ``bound``; or why not measured."""
        head = f"target {target}: "
        multi = next((r for r in rows if r.setting.startswith(f"{executor} ")), None)
        if multi is None:
            return f"{head}not measured: no {executor} setting (--executors {executor})"
        if multi.note:
            return head + multi.note
        one = by_setting.get(f"concurrency {multi.in_flight}")
        if one is None or one.note:
            why = one.note if one is not None else f"not run (add {multi.in_flight} to --levels)"
            return f"{head}not measured: concurrency {multi.in_flight} {why}"
        ratio = of(multi) / of(one)
        ok = ratio >= bound if at_least else ratio <= bound
        return (
            f"{head}{multi.setting} / {one.setting} = {ratio:.3f}x {what} ({of(multi):.{digits}f}"
            f" / {of(one):.{digits}f}; {'>=' if at_least else '<='} {bound:.2f}x: {_met(ok)})"
            + more(multi, one)
        )

    out.append(
        against_one(
            "cores",
            "processes",
            "trials/s",
            lambda r: r.rate,
            CORES_FLOOR * workers,
            at_least=True,
            digits=2,
            more=lambda multi, one: (
                f"; cores busy {multi.cpu / multi.seconds:.2f} / {one.cpu / one.seconds:.2f}, "
                f"free to the harness {free_cores(multi):.2f} / {free_cores(one):.2f}; CPU s a "
                f"trial {multi.cpu_per_trial:.4f} / {one.cpu_per_trial:.4f}"
                + cores_bound(multi, one)
            ),
        )
    )
    out.append(
        against_one(
            "ray cpu",
            "ray",
            "CPU s a trial",
            lambda r: r.cpu_per_trial,
            RAY_CPU_CAP,
            at_least=False,
            digits=4,
        )
    )
    flat = []
    for r in rows:
        if r.note:
            continue
        m = r.memory
        if not isinstance(m, Memory):
            out.append(f"target memory: {r.setting}: {m or 'not measured'}")
            continue
        flat.append(m.growth < FLAT)
        out.append(
            f"target memory: {r.setting}: RSS {m.mark:.0f} MB at {m.mark_finished} trials "
            f"finished, {m.end:.0f} MB at {m.end_finished} (the end) = {100 * m.growth:+.1f}% "
            f"(< {FLAT:.0%}: {'flat' if flat[-1] else 'not flat'}); "
            f"{m.per_1000:+.1f} MB per 1,000 trials finished; "
            f"{(m.mark - m.before) / r.in_flight:.2f} MB a trial in flight over the "
            f"{m.before:.0f} MB before the run"
            + (f" (its {r.workers} worker processes' own included)" if r.workers > 1 else "")
            + f"; peak {m.peak:.0f} MB"
        )
    if flat:
        out.append(
            f"target memory: flat in {sum(flat)} of {len(flat)} settings "
            f"(RSS growth under {FLAT:.0%} from {MARK:.0%} of the trials finished to the last "
            f"sample with trials in flight): {_met(all(flat))}"
        )
    return out


def _first_line(exc: BaseException) -> str:
    """``exc``'s type and the first line of its message; a Ray task's error by its cause (its
    own first line names only the actor)."""
    name = type(exc).__name__
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and cause is not exc:
        name, exc = f"{name}({type(cause).__name__})", cause
    text = _ANSI.sub("", str(exc)).strip()
    return f"{name}: {text.splitlines()[0] if text else ''}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000, help="trials per setting")
    parser.add_argument("--levels", default="1,8,64,256", help="trials in flight, one process")
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per model call")
    parser.add_argument(
        "--caps",
        default="1=100,8=500",
        help="fewer trials at these levels, LEVEL=TRIALS,... ('' runs --trials at every level)",
    )
    parser.add_argument("--workers", type=int, default=2, help="processes / Ray workers")
    parser.add_argument(
        "--worker-concurrency",
        type=int,
        default=None,
        help="trials in flight per worker process (default: the highest level / --workers)",
    )
    parser.add_argument(
        "--executors", default="processes,ray", help="multi-process settings ('' for none)"
    )
    parser.add_argument("--suite", default="retail", help="a suite folder or built-in name")
    parser.add_argument(
        "--store",
        default=os.environ.get(POSTGRES_ENV, ""),
        help="a Postgres server URL, postgresql+psycopg://user@host:port/db: each executor also "
        "runs on a Postgres store, in a database created on it and dropped after (default: "
        f"${POSTGRES_ENV}; '' skips those settings)",
    )
    args = parser.parse_args(argv)
    try:
        levels = [int(x) for x in args.levels.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--levels {args.levels!r}: give trials in flight, e.g. 1,8,64,256")
    if not levels:
        parser.error("--levels: give at least one level, e.g. 1,8,64,256")
    if args.trials < 1 or args.latency <= 0 or any(n < 1 for n in levels) or args.workers < 1:
        parser.error("--trials, --latency, --levels and --workers must be positive")
    try:
        caps = {
            int(level): int(n)
            for level, n in (item.split("=") for item in args.caps.split(",") if item.strip())
        }
    except ValueError:
        parser.error(f"--caps {args.caps!r}: give LEVEL=TRIALS pairs, e.g. 1=100,8=500")
    executors = [x.strip() for x in args.executors.split(",") if x.strip()]
    postgres: URL | None = None
    if args.store:
        try:
            postgres = make_url(args.store)
        except (ArgumentError, ValueError) as exc:
            parser.error(f"--store {args.store!r}: not a database URL ({exc})")
        if postgres.get_backend_name() != "postgresql":
            parser.error(f"--store {args.store!r}: give a Postgres server URL, postgresql://...")
    per_worker = args.worker_concurrency or max(1, max(levels, default=2) // args.workers)

    suite = load_suite(args.suite)
    tasks = len(suite.tasks)

    def per_task(n: int) -> int:
        return max(1, round(n / tasks))

    have = supported()
    print(
        f"suite {suite.name}: {tasks} tasks, "
        f"{statistics.fmean(len(t.reference_actions) for t in suite.tasks):.2f} reference "
        f"actions a task; latency {args.latency * 1000:.0f} ms per model call; "
        f"{os.cpu_count()} CPUs; Python {sys.version.split()[0]}; {load()}"
    )
    capped = [
        f"{n} in flight: {per_task(caps[n]) * tasks}"
        for n in levels
        if caps.get(n, args.trials) < args.trials
    ]
    print(
        f"{per_task(args.trials) * tasks} trials a setting"
        + (f"; capped (--caps): {', '.join(capped)}" if capped else "")
    )
    server = ServerProcess(suite.path, args.latency)
    rows: list[Row] = []
    try:
        with tempfile.TemporaryDirectory(prefix="harness-scale-") as tmp:
            logs = Path(tmp)
            # Warm-up, not timed: imports, the first client, every task once, at no latency.
            server.set_latency(0.0)
            warm: dict[str, Any] = (
                {"concurrency": min(max(levels), 64)} if "concurrency" in have else {}
            )
            run_trials(
                suite,
                agent="openai",
                agent_options={"base_url": server.base_url, "model": "fake"},
                trials=1,
                logs=logs / "warm-up",
                **warm,
            )
            server.set_latency(args.latency)
            # Each setting: its row, and run_trials's arguments (None: it cannot run here).
            plan: list[tuple[Row, dict[str, Any] | None]] = []
            for n in levels:
                row = Row(f"concurrency {n}", n)
                if n > 1 and "concurrency" not in have:
                    row.note = "not run: run_trials has no concurrency= in this harness"
                trials = per_task(min(caps.get(n, args.trials), args.trials))
                plan.append(
                    (row, None if row.note else {"trials_per_task": trials, "concurrency": n})
                )
            for executor, store in itertools.product(executors, ("sqlite", "postgres")):
                name = executor if store == "sqlite" else f"{executor}+postgres"
                row = Row(
                    f"{name} {args.workers}x{per_worker}",
                    args.workers * per_worker,
                    workers=args.workers,
                    store=store,
                )
                if "executor" not in have:
                    row.note = "not run: run_trials has no executor= in this harness"
                elif executor == "ray" and importlib.util.find_spec("ray") is None:
                    row.note = "ray: not installed (pip install -e '.[ray]')"
                elif store == "postgres" and "store" not in have:
                    row.note = "not run: run_trials has no store= in this harness"
                elif store == "postgres" and postgres is None:
                    row.note = f"not run: no Postgres server (--store URL or ${POSTGRES_ENV})"
                elif store == "postgres" and importlib.util.find_spec("psycopg") is None:
                    row.note = "not run: psycopg is not installed (pip install psycopg)"
                spread: dict[str, Any] = {
                    "trials_per_task": per_task(args.trials),
                    "workers": args.workers,
                    "concurrency": per_worker,
                    "executor": executor,
                }
                if store == "postgres" and postgres is not None:
                    db = f"harness_scale_{os.getpid()}_{len(plan)}"
                    spread["database"] = PostgresDatabase(postgres, db)
                plan.append((row, None if row.note else spread))
            if postgres is not None and any(r.store == "postgres" for r, _ in plan):
                print(
                    f"Postgres store: a fresh database on "
                    f"{postgres.render_as_string(hide_password=True)} for each setting, dropped "
                    "after it"
                )
            print(HEADER)
            for row, options in plan:
                if options is not None:
                    folder = logs / row.setting.replace(" ", "-")
                    database: PostgresDatabase | None = options.get("database")
                    try:
                        if database is not None:
                            database.create()
                        measure(row, suite, server, logs=folder, **options)
                    except Exception as exc:  # (an executor that cannot run here: go on)
                        row.note = f"failed: {_first_line(exc)}"
                    finally:
                        if database is not None:
                            try:
                                database.drop()
                            except Exception as exc:
                                row.notes.append(
                                    f"its database {database.name} was not dropped: "
                                    f"{_first_line(exc)}"
                                )
                rows.append(row)
                print(line(row, args.latency), flush=True)
    finally:
        server.stop()
    print()
    for r in rows:
        capped_here = r.workers == 1 and r.in_flight in caps
        if capped_here and r.trials and r.trials < per_task(args.trials) * tasks:
            print(
                f"{r.setting} ran {r.trials} trials, not {per_task(args.trials) * tasks}: capped "
                f"by --caps {args.caps} to keep the run short (--caps '' runs them all)"
            )
    for r in rows:
        for text in r.notes:
            print(f"{r.setting}: {text}")
        if not r.note and (r.passed != r.trials or r.server_errors):
            print(
                f"{r.setting}: {r.trials - r.passed} trial(s) failed ({r.infra} infrastructure), "
                f"{r.server_errors} server error(s)"
            )
    measured = [r for r in rows if not r.note]
    if measured:
        cpu = sum(r.server_cpu for r in measured) / sum(r.calls for r in measured)
        print(f"fake server CPU per model call (its own process): {cpu * 1000:.2f} ms")
    print(
        "ideal = in flight / (calls per trial x latency); CPU = the harness's processes "
        "(this one and its workers; not the server): seconds per trial, their share of a "
        "trial's mean wall time, and cores busy (CPU seconds / wall seconds); others = cores "
        "busy with neither the harness, the server nor Postgres's backends for the run (other "
        "work on the machine)"
    )
    print(f"at the end: {load()} (other work on the machine lowers every figure)")
    for text in verdict(rows, args.latency):
        print(text)
    for text in postgres_against_sqlite(rows):
        print(text)
    print()
    for text in performance_targets(rows, args.workers):
        print(text)


if __name__ == "__main__":
    main()

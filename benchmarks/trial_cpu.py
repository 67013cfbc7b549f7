"""The harness's CPU per trial against the floor of what a trial must do, measured in one run.

    python benchmarks/trial_cpu.py [--trials 300] [--repeats 3] [--suite retail]
                                   [--profile [--top 25]]

The built-in ``openai`` agent runs the suite's tasks (one trial in flight, no user) against the
fake chat-completions server (:class:`~harness.testing.model_server.FakeChatServer` playing each
task's reference actions, :class:`~harness.testing.model_server.ReplayPolicy`) answering at no
latency, in a process of its own, so that its CPU is not counted. The harness's CPU is this
process's (``time.process_time``, every thread) over the run, per trial.

Beside it, the floor of a trial, measured in the same run on the same machine:

- HTTP: the trials' own request bodies (captured from one trial of each task on a server in
  this process) sent again over one pooled ``http.client`` connection to the same server, each
  body encoded to JSON and each reply decoded: CPU ms a call, times the model calls a trial made
  (counted by the server);
- SQLite: one raw ``sqlite3`` INSERT committed on its own (WAL, ``synchronous=NORMAL``): CPU ms
  a commit, times the write transactions a trial committed on any SQLite connection (counted in
  a traced pass of one trial of each task: a ``COMMIT`` after a write, or a write outside a
  transaction).

The trials and the HTTP floor are timed ``--repeats`` times, one after the other in turn,
and each figure is the median of its passes: the machine's speed drifts over minutes.

It prints each, the floor, the harness's figure against the floor and against the target of
10 ms a trial. ``--profile`` runs the timed trials again under cProfile and prints
the top functions by their own time and by cumulative time.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import http.client
import io
import json
import os
import pstats
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from scale import ServerProcess, load

from harness.runs.start import run_trials
from harness.suite import Suite, load_suite
from harness.testing.model_server import FakeChatServer, ReplayPolicy

TARGET_MS = 10.0  # CPU ms a trial
USER_TARGET_MS = 20.0  # CPU ms a trial with tau2's user simulator
LATENCY_TARGET = 1.2  # CPU a trial at 200 ms latency / at none


def run(
    suite: Suite,
    base_url: str,
    logs: Path,
    trials_per_task: int,
    in_flight: int = 1,
    *,
    user: bool = False,
) -> int:
    """One run of the openai agent, ``in_flight`` trials at once, with tau2's user simulator
    (``OpenAIUser``, on the same server) if ``user``; the trials it ran."""
    options: dict[str, Any] = {"base_url": base_url, "model": "fake"}
    if user:
        options.update(user="openai", user_base_url=base_url, user_model="fake-user")
    result = run_trials(
        suite,
        agent="openai",
        agent_options=options,
        trials=trials_per_task,
        logs=logs,
        concurrency=in_flight,
    )
    failed = [r for r in result.results if not r.passed]
    if failed:
        print(f"note: {len(failed)} of {len(result.results)} trials did not pass")
    return len(result.results)


def captured_bodies(suite: Suite, logs: Path) -> list[dict[str, Any]]:
    """Every request body one trial of each task sends (from a server in this process)."""
    with FakeChatServer(ReplayPolicy(suite.tasks)) as server:
        run(suite, server.base_url, logs, 1)
        return list(server.requests)


# --- the floors ---


def http_floor(base_url: str, bodies: list[dict[str, Any]], rounds: int) -> float:
    """CPU seconds a call: encode a body, POST it on one kept-alive connection, decode the
    reply."""
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port)
    path = parts.path.rstrip("/") + "/chat/completions"
    headers = {"Content-Type": "application/json"}

    def call(body: dict[str, Any]) -> None:
        conn.request("POST", path, json.dumps(body).encode(), headers)
        response = conn.getresponse()
        json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"the server answered {response.status}")

    for body in bodies[:20]:  # warm-up
        call(body)
    started = time.process_time()
    for _ in range(rounds):
        for body in bodies:
            call(body)
    spent = time.process_time() - started
    conn.close()
    return spent / (rounds * len(bodies))


def commit_floor(folder: Path, n: int = 2000) -> float:
    """CPU seconds of one raw INSERT committed on its own (WAL, synchronous=NORMAL)."""
    conn = sqlite3.connect(folder / "floor.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k TEXT, payload TEXT)")
    payload = json.dumps({"action": "cancel", "args": {"order_id": "#W1"}, "status": "intent"})
    started = time.process_time()
    for i in range(n):
        conn.execute("INSERT INTO t (k, payload) VALUES (?, ?)", (str(i), payload))
    spent = time.process_time() - started
    conn.close()
    return spent / n


_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")


@contextlib.contextmanager
def counting_commits() -> Iterator[list[int]]:
    """Count the write transactions committed on every SQLite connection opened meanwhile."""
    count = [0]
    connect = sqlite3.connect

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)
        state = {"open": False, "wrote": False}

        def trace(sql: str) -> None:
            word = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
            if word == "BEGIN":
                state.update(open=True, wrote=False)
            elif word in ("COMMIT", "END"):
                count[0] += state["wrote"]
                state.update(open=False, wrote=False)
            elif word == "ROLLBACK":
                state.update(open=False, wrote=False)
            elif word in _WRITES:
                if state["open"]:
                    state["wrote"] = True
                else:
                    count[0] += 1

        conn.set_trace_callback(trace)
        return conn

    sqlite3.connect = traced  # type: ignore[assignment]
    try:
        yield count
    finally:
        sqlite3.connect = connect  # type: ignore[assignment]


# --- the profile ---


def profiled(fn: Callable[[], Any], top: int) -> str:
    """The top functions of ``fn`` by own time and by cumulative time."""
    profile = cProfile.Profile(time.process_time)  # CPU, not wall time
    profile.runcall(fn)
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out).strip_dirs()
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


@dataclass
class Measured:
    """One timed run: trials, CPU and wall ms a trial, model calls a trial."""

    trials: int
    cpu_ms: float
    wall_ms: float
    calls: float


def timed(server: ServerProcess, fn: Callable[[], int], *, latency: float = 0.0) -> Measured:
    """Run ``fn`` (a run; it returns its trials) with the server at ``latency``, timed."""
    server.set_latency(latency)
    requests0, errors0, _ = server.stats()
    started, wall = time.process_time(), time.perf_counter()
    trials = fn()
    cpu, wall = time.process_time() - started, time.perf_counter() - wall
    requests1, errors1, _ = server.stats()
    if errors1 > errors0:
        print(f"note: the server recorded {errors1 - errors0} errors")
    return Measured(
        trials, cpu / trials * 1000, wall / trials * 1000, (requests1 - requests0) / trials
    )


def verdict(value: float, target: float) -> str:
    return "met" if value <= target else "not met"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300, help="trials timed (about)")
    parser.add_argument("--suite", default="retail", help="a suite folder or built-in name")
    parser.add_argument("--rounds", type=int, default=3, help="HTTP floor: passes over the bodies")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed passes of the trials (and of the floor)"
    )
    parser.add_argument("--in-flight", type=int, default=16, help="latency check: trials at once")
    parser.add_argument("--latency", type=float, default=0.2, help="latency check: seconds a call")
    parser.add_argument("--no-user", action="store_true", help="skip the user simulator's run")
    parser.add_argument("--no-latency", action="store_true", help="skip the latency check")
    parser.add_argument("--profile", action="store_true", help="cProfile the timed trials too")
    parser.add_argument("--top", type=int, default=25, help="functions the profile lists")
    args = parser.parse_args(argv)
    if min(args.trials, args.rounds, args.repeats, args.in_flight) < 1 or args.latency <= 0:
        parser.error("--trials, --rounds, --repeats, --in-flight and --latency must be positive")

    suite = load_suite(args.suite)
    tasks = len(suite.tasks)
    per_task = max(1, round(args.trials / tasks))
    print(
        f"suite {suite.name}: {tasks} tasks x {per_task} trials, one in flight, latency 0; "
        f"{os.cpu_count()} CPUs; Python {sys.version.split()[0]}; {load()}"
    )
    server = ServerProcess(suite.path, 0.0)
    try:
        with tempfile.TemporaryDirectory(prefix="harness-trial-cpu-") as tmp:
            folder = Path(tmp)
            # Not timed: imports, the first client, every task once.
            bodies = captured_bodies(suite, folder / "capture")
            with counting_commits() as commits:
                traced = run(suite, server.base_url, folder / "traced", 1)
            commits_per_trial = commits[0] / traced

            # Passes of the harness and of the HTTP floor interleaved, medians taken: the
            # machine's speed drifts over minutes, and one pass can land on a slow spell.
            passes: list[Measured] = []
            per_calls: list[float] = []
            for i in range(args.repeats):
                passes.append(
                    timed(
                        server, lambda i=i: run(suite, server.base_url, folder / f"t{i}", per_task)
                    )
                )
                per_calls.append(http_floor(server.base_url, bodies, args.rounds))
            alone = sorted(passes, key=lambda m: m.cpu_ms)[len(passes) // 2]
            per_call = statistics.median(per_calls)
            per_commit = commit_floor(folder)
            http_ms = per_call * alone.calls * 1000
            sql_ms = per_commit * commits_per_trial * 1000
            floor = http_ms + sql_ms
            ms = alone.cpu_ms
            print(
                f"{alone.trials} trials, {alone.calls:.2f} model calls and "
                f"{commits_per_trial:.1f} commits each"
            )
            print(
                f"harness CPU a trial       {ms:7.2f} ms  (wall {alone.wall_ms:.2f} ms; the "
                f"median of {len(passes)} passes: {', '.join(f'{m.cpu_ms:.2f}' for m in passes)})"
            )
            print(
                f"floor: HTTP              {http_ms:7.2f} ms  "
                f"({per_call * 1000:.3f} ms a call over pooled http.client x {alone.calls:.2f})"
            )
            print(
                f"floor: SQLite            {sql_ms:7.2f} ms  "
                f"({per_commit * 1000:.4f} ms a raw commit x {commits_per_trial:.1f})"
            )
            print(f"floor                     {floor:7.2f} ms")
            print(f"harness / floor           {ms / floor:7.2f}x")
            targets = [
                f"target CPU a trial, no user: {ms:.2f} ms (<= {TARGET_MS:g} ms: "
                f"{verdict(ms, TARGET_MS)}; floor {floor:.2f} ms, {ms / floor:.1f}x it)"
            ]

            if not args.no_user:
                # tau2's user simulator on the same server: the agent's calls and the user's.
                with_user = timed(
                    server,
                    lambda: run(suite, server.base_url, folder / "user", per_task, user=True),
                )
                user_floor = per_call * with_user.calls * 1000 + sql_ms
                print(
                    f"with the user simulator  {with_user.cpu_ms:7.2f} ms  "
                    f"(wall {with_user.wall_ms:.2f} ms; {with_user.calls:.2f} model calls, "
                    f"floor {user_floor:.2f} ms)"
                )
                targets.append(
                    f"target CPU a trial, tau2 user simulator: {with_user.cpu_ms:.2f} ms "
                    f"(<= {USER_TARGET_MS:g} ms: {verdict(with_user.cpu_ms, USER_TARGET_MS)}; "
                    f"floor {user_floor:.2f} ms, {with_user.cpu_ms / user_floor:.1f}x it)"
                )

            if not args.no_latency:
                # The same trials in flight at both latencies, interleaved: 0, L, 0, L.
                n = args.in_flight
                figures: dict[float, list[Measured]] = {0.0: [], args.latency: []}
                for i, latency in enumerate([0.0, args.latency] * 2):
                    figures[latency].append(
                        timed(
                            server,
                            lambda i=i: run(suite, server.base_url, folder / f"lat{i}", 1, n),
                            latency=latency,
                        )
                    )
                server.set_latency(0.0)
                fast = statistics.mean(m.cpu_ms for m in figures[0.0])
                slow = statistics.mean(m.cpu_ms for m in figures[args.latency])
                print(
                    f"{n} in flight, latency 0  {fast:7.2f} ms  "
                    f"({', '.join(f'{m.cpu_ms:.2f}' for m in figures[0.0])})"
                )
                print(
                    f"{n} in flight, latency {args.latency:g} {slow:6.2f} ms  "
                    f"({', '.join(f'{m.cpu_ms:.2f}' for m in figures[args.latency])})"
                )
                targets.append(
                    f"target CPU a trial at {args.latency * 1000:g} ms latency / at 0: "
                    f"{slow / fast:.2f}x (<= {LATENCY_TARGET:g}x: "
                    f"{verdict(slow / fast, LATENCY_TARGET)}; {n} in flight, "
                    f"{slow:.2f} / {fast:.2f} ms)"
                )
            print()
            for target in targets:
                print(target)
            if args.profile:
                print()
                print(
                    profiled(
                        lambda: run(suite, server.base_url, folder / "profiled", per_task),
                        args.top,
                    )
                )
    finally:
        server.stop()


if __name__ == "__main__":
    main()

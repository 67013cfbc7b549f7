"""The harness's CPU per trial against the floor of what a trial must do, measured in one run.

    python benchmarks/trial_cpu.py [--trials 300] [--suite retail] [--profile [--top 25]]

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

It prints each, the floor, the harness's figure against the floor and against the target of
10 ms a trial (issue 29). ``--profile`` runs the timed trials again under cProfile and prints
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
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from scale import ServerProcess, load

from harness.runs.start import run_trials
from harness.suite import Suite, load_suite
from harness.testing.model_server import FakeChatServer, ReplayPolicy

TARGET_MS = 10.0  # CPU ms a trial (issue 29)


def run(suite: Suite, base_url: str, logs: Path, trials_per_task: int) -> int:
    """One run of the openai agent, one trial in flight; the trials it ran."""
    result = run_trials(
        suite,
        agent="openai",
        agent_options={"base_url": base_url, "model": "fake"},
        trials=trials_per_task,
        logs=logs,
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300, help="trials timed (about)")
    parser.add_argument("--suite", default="retail", help="a suite folder or built-in name")
    parser.add_argument("--rounds", type=int, default=3, help="HTTP floor: passes over the bodies")
    parser.add_argument("--profile", action="store_true", help="cProfile the timed trials too")
    parser.add_argument("--top", type=int, default=25, help="functions the profile lists")
    args = parser.parse_args(argv)
    if args.trials < 1 or args.rounds < 1:
        parser.error("--trials and --rounds must be positive")

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

            requests0, errors0, _ = server.stats()
            started = time.process_time()
            wall = time.perf_counter()
            trials = run(suite, server.base_url, folder / "timed", per_task)
            cpu = (time.process_time() - started) / trials
            wall = (time.perf_counter() - wall) / trials
            requests1, errors1, _ = server.stats()
            calls = (requests1 - requests0) / trials
            if errors1 > errors0:
                print(f"note: the server recorded {errors1 - errors0} errors")

            per_call = http_floor(server.base_url, bodies, args.rounds)
            per_commit = commit_floor(folder)
            http_ms = per_call * calls * 1000
            sql_ms = per_commit * commits_per_trial * 1000
            floor = http_ms + sql_ms
            ms = cpu * 1000
            print(
                f"{trials} trials, {calls:.2f} model calls and {commits_per_trial:.1f} commits each"
            )
            print(f"harness CPU a trial       {ms:7.2f} ms  (wall {wall * 1000:.2f} ms)")
            print(
                f"floor: HTTP              {http_ms:7.2f} ms  "
                f"({per_call * 1000:.3f} ms a call over pooled http.client x {calls:.2f})"
            )
            print(
                f"floor: SQLite            {sql_ms:7.2f} ms  "
                f"({per_commit * 1000:.4f} ms a raw commit x {commits_per_trial:.1f})"
            )
            print(f"floor                     {floor:7.2f} ms")
            print(f"harness / floor           {ms / floor:7.2f}x")
            verdict = "met" if ms <= TARGET_MS else "not met"
            print(
                f"harness / target          {ms / TARGET_MS:7.2f}x  ({TARGET_MS:.0f} ms {verdict})"
            )
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

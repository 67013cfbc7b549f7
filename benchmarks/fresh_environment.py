"""A trial's fresh environment against tau2-bench's own ``get_environment()``, in one run.

    python benchmarks/fresh_environment.py [--rounds 12] [--slice 0.3]
        [--domains retail,airline,telecom] [--tau2-python PATH] [--tau2-src PATH]

The harness's side, in this process: what a trial of the built-in suite does to get and release
its environment, ``suite.new_environment()`` then ``close()`` (for retail and airline that is
all of ``Suite.environment_for``: they have no ``prepare``; telecom's ``prepare``, the task's
initialization actions, is left out, as tau2's ``get_environment()`` has none). tau2's side:
``get_environment()`` of the same domain in tau2's own Python (``--tau2-python``, default the
environment variable ``TAU2_PYTHON``) from a tau2-bench checkout (``--tau2-src``, default
``TAU2_SRC``; its ``src`` on ``PYTHONPATH``, its ``data`` as ``TAU2_DATA_DIR`` unless that is
set), in a process of its own that stays up for the run (``_tau2_environments.py``).

The two are interleaved: each round gives each domain a slice of wall time on one side, then on
the other (the side that goes first alternates), so both see the same load. Every call is timed
(CPU: ``time.process_time``; wall: ``time.perf_counter``) after a warm-up, and the medians are
compared: the target is a harness environment costing at most 0.1x tau2's, in CPU.
Without tau2's Python or checkout it prints the harness's figures and says tau2 was not
measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from _tau2_environments import timed

from harness.suite import load_suite

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "harness" / "domains"
CHILD = Path(__file__).resolve().with_name("_tau2_environments.py")
TARGET = 0.1  # the harness's fresh environment / tau2's get_environment(), CPU
WARM_UP = 10


Samples = dict[str, list[float]]


def harness_side(domain: str, collector: bool) -> Callable[[float], Samples]:
    """A function giving ``seconds`` of fresh environments of the built-in suite ``domain``,
    each opened and closed, timed (see :func:`timed`; ``cpu_0``: the open, ``cpu_1``: the
    close)."""
    suite = load_suite(domain, check_references=False)
    for _ in range(WARM_UP):  # the template built, the modules' first calls made
        suite.new_environment().close()
    steps = [suite.new_environment, lambda env: env.close()]
    return lambda seconds: timed(steps, seconds, collector)


class Tau2Side:
    """tau2's ``get_environment()`` in tau2's own Python, one process for the run."""

    def __init__(self, python: str, src: Path, domains: list[str]) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(src / "src"), env.get("PYTHONPATH")) if p
        )
        env.setdefault("TAU2_DATA_DIR", str(src / "data"))
        self.errors = open(os.devnull, "w")  # noqa: SIM115  (closed with the process)
        self.process = subprocess.Popen(
            [python, str(CHILD), str(SHIPPED), *domains],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            text=True,
            cwd=src,
            env=env,
        )
        hello = self._reply()
        self.python: str = hello["python"]
        self.domains: dict[str, dict[str, Any]] = hello["domains"]

    def _reply(self) -> dict[str, Any]:
        stdout: TextIO = self.process.stdout  # type: ignore[assignment]
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"tau2's process ended (exit {self.process.wait()})")
        return json.loads(line)

    def timed(self, domain: str, seconds: float, collector: bool) -> Samples:
        stdin: TextIO = self.process.stdin  # type: ignore[assignment]
        asked = {"domain": domain, "seconds": seconds, "collector": collector}
        stdin.write(json.dumps(asked) + "\n")
        stdin.flush()
        return self._reply()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=30)
        self.errors.close()


def tau2_side(python: str | None, src: str | None, domains: list[str]) -> Tau2Side | str:
    """tau2's process, or why tau2 is not measured."""
    if not python or not Path(python).exists():
        return "no tau2 Python (--tau2-python or TAU2_PYTHON)"
    if not src or not (Path(src) / "src" / "tau2").is_dir():
        return "no tau2-bench checkout (--tau2-src or TAU2_SRC)"
    try:
        return Tau2Side(python, Path(src), domains)
    except (OSError, RuntimeError, ValueError) as exc:
        return f"tau2's process failed: {exc}"


def ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument(
        "--slice", type=float, default=0.3, help="wall seconds a side gets a domain a round"
    )
    parser.add_argument("--domains", default="retail,airline,telecom")
    parser.add_argument(
        "--gc",
        action="store_true",
        help="keep the garbage collector on during the calls (default: off, as timeit has it)",
    )
    parser.add_argument("--tau2-python", default=os.environ.get("TAU2_PYTHON"))
    parser.add_argument("--tau2-src", default=os.environ.get("TAU2_SRC"))
    args = parser.parse_args(argv)
    domains = [d for d in args.domains.split(",") if d]

    before = load_average()
    started = time.perf_counter()
    ours = {d: harness_side(d, args.gc) for d in domains}
    tau2 = tau2_side(args.tau2_python, args.tau2_src, domains)
    theirs: dict[str, Callable[[float], Samples]] = {}
    notes: dict[str, str] = {}
    if isinstance(tau2, Tau2Side):
        for d in domains:
            found = tau2.domains[d]
            if "error" in found:
                notes[d] = f"tau2 not measured: {found['error']}"
                continue
            theirs[d] = lambda s, d=d: tau2.timed(d, s, args.gc)
            if found["substituted"]:
                notes[d] = (
                    f"tau2's data folder lacks {', '.join(found['substituted'])}: read from the "
                    "harness's copy of upstream's file"
                )
    samples: dict[tuple[str, str], Samples] = {}
    try:
        for r in range(args.rounds):
            for d in domains:
                sides = [("harness", ours[d])] + ([("tau2", theirs[d])] if d in theirs else [])
                for side, timed in sides if r % 2 == 0 else sides[::-1]:
                    for key, values in timed(args.slice).items():
                        samples.setdefault((d, side), {}).setdefault(key, []).extend(values)
    finally:
        if isinstance(tau2, Tau2Side):
            tau2.close()

    print(
        f"Python {sys.version.split()[0]}"
        + (f", tau2's Python {tau2.python}" if isinstance(tau2, Tau2Side) else "")
        + f"; {args.rounds} rounds of {args.slice} s a side and domain, interleaved; "
        f"{time.perf_counter() - started:.0f} s"
    )
    print(f"load average (1, 5, 15 min): {before} before, {load_average()} after")
    if not isinstance(tau2, Tau2Side):
        print(f"tau2 not measured: {tau2}")
    header = (
        f"{'domain':<8} {'calls':>11} {'harness CPU':>11} {'wall':>7} {'(open':>6} "
        f"{'close)':>6} {'tau2 CPU':>9} {'wall':>7} {'CPU ratio':>9} {'wall ratio':>10}  target"
    )
    print(header)
    for d in domains:
        h = samples[(d, "harness")]
        t = samples.get((d, "tau2"))
        calls = f"{len(h['cpu'])}/{len(t['cpu']) if t else 0}"
        row = (
            f"{d:<8} {calls:>11} {ms(h['cpu']):>8.2f} ms {ms(h['wall']):>7.2f} "
            f"{ms(h['cpu_0']):>6.2f} {ms(h['cpu_1']):>6.2f}"
        )
        if t is None:
            print(f"{row} {'-':>9} {'-':>7} {'-':>9} {'-':>10}  {TARGET}x not measured")
            continue
        ratio = ms(h["cpu"]) / ms(t["cpu"])
        verdict = "met" if ratio <= TARGET else "not met"
        print(
            f"{row} {ms(t['cpu']):>6.2f} ms {ms(t['wall']):>7.2f} {ratio:>8.3f}x "
            f"{ms(h['wall']) / ms(t['wall']):>9.3f}x  {TARGET}x {verdict}"
        )
    for d, note in notes.items():
        print(f"note: {d}: {note}")
    print(
        "calls: harness/tau2 environments timed; ms are medians a call; (open close): the "
        "harness's CPU for new_environment() and for close()"
    )


if __name__ == "__main__":
    main()

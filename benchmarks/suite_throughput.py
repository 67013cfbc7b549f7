"""Trials per second of a simulated-agent run, by worker count, and the cost of a fresh env.

    python benchmarks/suite_throughput.py [--episodes 1000] [--suite tasks/retail]

Runs the same number of simulated episodes at 1 and at 2 workers (each run in its own logs
folder, same seed), prints trials per second and the speed-up, then times setting up and
closing one fresh retail environment (template copy, state adapter, tools).
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

from harness.runs.start import run_trials
from harness.suite import load_suite

ROOT = Path(__file__).resolve().parents[1]


def throughput(suite_path: Path, episodes: int, workers: int, logs: Path) -> tuple[float, int]:
    """Seconds and trials for a run of about ``episodes`` episodes."""
    suite = load_suite(suite_path)
    trials = max(1, math.ceil(episodes / len(suite.tasks)))
    started = time.perf_counter()
    result = run_trials(
        suite,
        agent="simulated",
        agent_options={"error_rate": 0.1},
        trials=trials,
        workers=workers,
        seed=0,
        logs=logs,
    )
    return time.perf_counter() - started, len(result.results)


def env_setup(suite_path: Path, repeats: int = 50) -> tuple[float, float]:
    """Median milliseconds to create, and to close, one fresh environment."""
    suite = load_suite(suite_path)
    suite.new_environment().close()  # warm: template built, modules imported
    opens, closes = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        env = suite.new_environment()
        t1 = time.perf_counter()
        env.close()
        t2 = time.perf_counter()
        opens.append((t1 - t0) * 1000)
        closes.append((t2 - t1) * 1000)
    return statistics.median(opens), statistics.median(closes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--suite", type=Path, default=ROOT / "tasks" / "retail")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rates = {}
        for workers in (1, 2):
            seconds, n = throughput(args.suite, args.episodes, workers, Path(tmp) / str(workers))
            rates[workers] = n / seconds
            print(
                f"{workers} worker(s): {n} trials in {seconds:.1f} s "
                f"= {rates[workers]:.1f} trials/s"
            )
        print(f"speed-up at 2 workers: {rates[2] / rates[1]:.2f}x")
    opened, closed = env_setup(args.suite)
    print(f"fresh environment: {opened:.2f} ms to set up, {closed:.2f} ms to close (median of 50)")


if __name__ == "__main__":
    main()

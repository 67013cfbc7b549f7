"""How long the statistics take at scale: 10,000 tasks x 100 trials, k = 1..100.

Run: ``python benchmarks/stats_speed.py`` (options: ``--tasks``, ``--trials``, ``--resamples``).

Times three parts separately: simulating the trial outcomes, pass^k and pass@k for every k with
task-level intervals (``suite_curve``), and a task-level percentile bootstrap of both curves
(``bootstrap_curve``, drawn in chunks so memory stays bounded).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

try:
    from harness.stats import bootstrap_curve, suite_curve
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from harness.stats import bootstrap_curve, suite_curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    t0 = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    p = rng.beta(2.0, 1.0, size=args.tasks)
    successes = rng.binomial(args.trials, p)
    t1 = time.perf_counter()
    curve = suite_curve(successes, args.trials)
    t2 = time.perf_counter()
    boot = bootstrap_curve(successes, args.trials, resamples=args.resamples, seed=args.seed)
    t3 = time.perf_counter()

    k_max = int(curve.ks[-1])
    print(f"{args.tasks:,} tasks x {args.trials} trials, k = 1..{k_max}")
    print(f"  simulate outcomes                          {t1 - t0:8.3f} s")
    print(f"  pass^k and pass@k with intervals (all k)   {t2 - t1:8.3f} s")
    print(f"  task bootstrap, {args.resamples:,} resamples (all k)  {t3 - t2:8.3f} s")
    for k in sorted({1, 10, k_max}):
        hat, at, bhat = curve.pass_hat(k), curve.pass_at(k), boot.pass_hat(k)
        print(
            f"  k={k:<3} pass^k {hat.value:.4f} [{hat.low:.4f}, {hat.high:.4f}] {hat.method}"
            f"  bootstrap [{bhat.low:.4f}, {bhat.high:.4f}]"
            f"  pass@k {at.value:.4f} [{at.low:.4f}, {at.high:.4f}]"
        )


if __name__ == "__main__":
    main()

"""Coverage of the suite pass^k intervals, measured by simulation over a grid of suites.

Run: ``python benchmarks/interval_coverage.py`` (options: ``--grid heldout|tuning``,
``--suites``, ``--seed``, ``--confidence``, ``--cells`` to print every cell).

Each cell is a task difficulty law, a number of tasks ``T``, trials per task ``n`` and a ``k``.
A suite draws ``T`` task success probabilities ``p`` from the law, then ``n`` trials per task;
the estimand is ``E[p^k]`` over the law (the expected pass^k of a task from the population, as
``suite_pass_hat_k`` defines it), computed exactly. Per cell it prints the share of suites whose
interval (``suite_pass_hat_k_batch``) contains the estimand, the mean interval width and the
methods taken; then the median and the worst coverage over the grid.

Two grids, with different laws, sizes and seeds: ``tuning`` (what the per-regime choice of
method was tuned on) and ``heldout`` (the default: what the figures in the README are measured
on; nothing was tuned on it).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

try:
    from harness.stats import suite_pass_hat_k, suite_pass_hat_k_batch
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from harness.stats import suite_pass_hat_k, suite_pass_hat_k_batch


@dataclass(frozen=True)
class Law:
    """A task difficulty law: Beta(a, b), or a point mass at ``a`` when ``b`` is 0."""

    name: str
    a: float
    b: float = 0.0

    def draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> npt.NDArray[np.float64]:
        if self.b == 0.0:
            return np.full(shape, self.a)
        return rng.beta(self.a, self.b, size=shape)

    def moment(self, k: int) -> float:
        """E[p^k]: B(a + k, b) / B(a, b) for a Beta law, a^k for a point mass."""
        if self.b == 0.0:
            return self.a**k
        a, b = self.a, self.b
        return math.exp(
            math.lgamma(a + k) + math.lgamma(a + b) - math.lgamma(a) - math.lgamma(a + b + k)
        )


GRIDS: dict[str, tuple[list[Law], list[int], list[int]]] = {
    "heldout": (
        [
            Law("easy Beta(6,1.5)", 6.0, 1.5),
            Law("hard Beta(1,5)", 1.0, 5.0),
            Law("U-shaped Beta(0.3,0.3)", 0.3, 0.3),
            Law("uniform Beta(1,1)", 1.0, 1.0),
            Law("point mass 0.9", 0.9),
        ],
        [10, 30, 50, 114],
        [4, 8, 16],
    ),
    "tuning": (
        [
            Law("easy Beta(4,1)", 4.0, 1.0),
            Law("hard Beta(0.7,3)", 0.7, 3.0),
            Law("U-shaped Beta(0.5,0.5)", 0.5, 0.5),
            Law("middle Beta(2,2)", 2.0, 2.0),
            Law("point mass 0.8", 0.8),
            Law("point mass 0.97", 0.97),
        ],
        [12, 20, 40, 80],
        [5, 10, 16],
    ),
}
SEEDS = {"heldout": 20_260_000, "tuning": 7}


@dataclass(frozen=True)
class Cell:
    law: str
    tasks: int
    n: int
    k: int
    truth: float
    coverage: float
    width: float
    methods: str

    def label(self) -> str:
        return f"{self.law:<24} T={self.tasks:<4} n={self.n:<3} k={self.k:<3}"


def ks_for(n: int) -> list[int]:
    return sorted({k for k in (1, 2, 4, n) if k <= n})


def run_grid(grid: str, suites: int, seed: int, confidence: float) -> list[Cell]:
    laws, sizes, trials = GRIDS[grid]
    cells = []
    for li, law in enumerate(laws):
        for tasks in sizes:
            for n in trials:
                rng = np.random.default_rng([seed, li, tasks, n])
                successes = rng.binomial(n, law.draw(rng, (suites, tasks)))
                for k in ks_for(n):
                    truth = law.moment(k)
                    _, low, high = suite_pass_hat_k_batch(successes, n, k, confidence)
                    cover = float(np.mean((low <= truth) & (truth <= high)))
                    # The method each suite's estimate names, from a sample of the suites.
                    names = Counter(
                        suite_pass_hat_k(row, n, k, confidence).method
                        for row in successes[:: max(1, suites // 200)]
                    )
                    methods = ", ".join(
                        f"{m} {c / sum(names.values()):.0%}" for m, c in names.most_common()
                    )
                    cells.append(
                        Cell(
                            law.name, tasks, n, k, truth, cover, float(np.mean(high - low)), methods
                        )
                    )
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", choices=sorted(GRIDS), default="heldout")
    parser.add_argument("--suites", type=int, default=20_000, help="simulated suites per cell")
    parser.add_argument("--seed", type=int, default=None, help="default: the grid's own seed")
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument(
        "--cells", action="store_true", help="print every cell, not only the lowest"
    )
    args = parser.parse_args()
    seed = SEEDS[args.grid] if args.seed is None else args.seed

    start = time.perf_counter()
    cells = run_grid(args.grid, args.suites, seed, args.confidence)
    seconds = time.perf_counter() - start
    cover = np.array([c.coverage for c in cells])
    mc_se = math.sqrt(args.confidence * (1 - args.confidence) / args.suites)
    print(
        f"{args.grid} grid: {len(cells)} cells, {args.suites:,} suites each, seed {seed}, "
        f"nominal {args.confidence:.0%} (Monte Carlo standard error {mc_se:.4f}), {seconds:.0f} s"
    )
    shown = cells if args.cells else sorted(cells, key=lambda c: c.coverage)[:10]
    print("" if args.cells else "lowest ten cells:")
    print(f"{'cell':<45} {'E[p^k]':>7} {'coverage':>8} {'width':>7}  methods")
    for c in shown:
        print(f"{c.label():<45} {c.truth:7.4f} {c.coverage:8.4f} {c.width:7.4f}  {c.methods}")
    print()
    for name, part in (
        ("k = 1", [c for c in cells if c.k == 1]),
        ("1 < k < n", [c for c in cells if 1 < c.k < c.n]),
        ("k = n", [c for c in cells if c.k == c.n]),
        ("all", cells),
    ):
        cv = np.array([c.coverage for c in part])
        width = np.mean([c.width for c in part])
        print(
            f"{name:<10} {len(part):>4} cells: median coverage {np.median(cv):.4f}, "
            f"worst {cv.min():.4f}, mean width {width:.4f}"
        )
    worst = min(cells, key=lambda c: c.coverage)
    print(f"worst cell: {worst.label().strip()} at {worst.coverage:.4f}")
    print(f"median {np.median(cover):.4f}, worst {cover.min():.4f}")


if __name__ == "__main__":
    main()

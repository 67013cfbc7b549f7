"""pass^1 and pass^4 under injected faults: the harness's recovery against plain tool calls.

    python benchmarks/fault_recovery.py [--trials 8] [--rates 0.1 0.3 0.5] [--suite tasks/retail]

At each rate r, every call of a write tool (every attempt, retries included) is faulted with
probability r, the class drawn evenly from four single-call faults:

- ``fail_stop``: a transient error before the tool runs;
- ``fail_slow``: the call takes 12 s on a 5 s timeout, then runs;
- ``silent``: the call says it succeeded but its effect is missing, partial or wrong (a third
  each);
- ``lost_ack``: the effect is applied, then the call raises.

Two runs per rate, on the same suite, seeds and fault plan (faults are drawn per task, trial,
tool and call number, so both arms meet the same fault at the same call until their paths part):

- **harness**: the scripted agent through the harness (retry, timeout, postconditions,
  compensation, recovery of lost acknowledgements);
- **plain**: the same agent calling the same underlying functions with no transaction layer:
  errors come back to the agent as tool errors, nothing is retried, undone or verified.

It prints pass^1 and pass^4 of each arm with 95% intervals, their paired difference (harness
minus plain, with its interval), and the harness arm's detection coverage and effect accounting
from the reliability report. Trials run on a fake clock, so delays and back-offs cost no time.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.action import Action
from harness.agents import AgentOutput, Toolbox
from harness.agents.scripted import ScriptedAgent
from harness.faults import FaultPlan
from harness.report.reliability import ReliabilityReport, load_reliability
from harness.runs.start import RunResult, run_trials
from harness.stats import Estimate, paired_difference
from harness.suite import Task, load_suite

ROOT = Path(__file__).resolve().parents[1]
KS = (1, 4)


class PlainAgent:
    """The scripted agent calling the tools' underlying functions: no transaction layer."""

    name = "scripted-plain"

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "transactions": False}

    def run(self, task: Task, toolbox: Toolbox, *, seed: int) -> AgentOutput:
        # Action.fn is read at call time, so a fault injector's wrapper is what gets called.
        plain = {n: t.fn if isinstance(t, Action) else t for n, t in toolbox.tools.items()}
        inner = Toolbox(plain, toolbox.episode, toolbox.environment)
        out = ScriptedAgent().run(task, inner, seed=seed)
        toolbox.calls.extend(inner.calls)
        return out


def plan_at(rate: float, seed: int) -> FaultPlan:
    """Faults on every write call with probability ``rate``, four classes in equal shares."""
    share = rate / 4
    return FaultPlan.parse(
        {
            "seed": seed,
            "timeout": 5.0,
            "faults": [
                {"kind": "fail_stop", "service": "writes", "rate": share},
                {"kind": "fail_slow", "service": "writes", "rate": share, "delay": 12.0},
                {"kind": "silent", "service": "writes", "rate": share / 3, "mode": "missing"},
                {"kind": "silent", "service": "writes", "rate": share / 3, "mode": "partial"},
                {"kind": "silent", "service": "writes", "rate": share / 3, "mode": "wrong"},
                {"kind": "lost_ack", "service": "writes", "rate": share},
            ],
        }
    )


def arm(
    suite: Any, agent: Any, plan: FaultPlan, trials: int, seed: int, logs: Path
) -> tuple[RunResult, ReliabilityReport]:
    """One arm of one rate."""
    result = run_trials(suite, agent=agent, trials=trials, seed=seed, logs=logs, faults=plan)
    return result, load_reliability(result.folder, result.run_id)


def cell(e: Estimate) -> str:
    return f"{e.value:.3f} [{e.low:.3f}, {e.high:.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--rates", type=float, nargs="+", default=[0.1, 0.3, 0.5])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--suite", type=Path, default=ROOT / "tasks" / "retail")
    args = parser.parse_args()
    if args.trials < max(KS):
        parser.error(f"--trials must be at least {max(KS)} for pass^{max(KS)}")
    suite = load_suite(args.suite)
    print(
        f"suite {suite.name}: {len(suite.tasks)} tasks x {args.trials} trials per arm; "
        "scripted agent; faults on write calls"
    )
    header = f"{'rate':>5}  {'arm':<8}" + "".join(f"  {'pass^' + str(k):<24}" for k in KS)
    with tempfile.TemporaryDirectory() as tmp:
        for rate in args.rates:
            plan = plan_at(rate, args.seed)
            started = time.perf_counter()
            runs = {
                name: arm(suite, agent, plan, args.trials, args.seed, Path(tmp) / f"{name}{rate}")
                for name, agent in (("harness", "scripted"), ("plain", PlainAgent()))
            }
            seconds = time.perf_counter() - started
            print()
            print(header)
            for name, (result, _) in runs.items():
                print(
                    f"{rate:>5.0%}  {name:<8}"
                    + "".join(f"  {cell(result.pass_hat(k)):<24}" for k in KS)
                )
            (h, _), (p, _) = runs["harness"], runs["plain"]
            ids_h, c_h, n_h = h.counts()
            ids_p, c_p, n_p = p.counts()
            assert ids_h == ids_p
            diffs = [paired_difference(c_h, n_h, c_p, n_p, k) for k in KS]
            print(f"{'':>5}  {'diff':<8}" + "".join(f"  {cell(d):<24}" for d in diffs))
            report = runs["harness"][1]
            coverage = ", ".join(
                f"{c.failure_class} {c.detected}/{c.injected}" for c in report.classes.values()
            )
            e = report.effects
            print(
                f"{'':>5}  harness detected: {coverage}; effects duplicated {e['duplicated']}, "
                f"lost {e['lost']}, diverged {e['diverged']}, unaccounted {e['unaccounted']}; "
                f"false positives {len(report.false_positives)}  ({seconds:.1f} s for both arms)"
            )


if __name__ == "__main__":
    main()

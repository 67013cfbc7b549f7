"""Fault injection and the reliability report: every class against the retail suite.

The matrix runs a handful of retail tasks (each with one to three writes, covering all seven
write tools) with the scripted agent under one fault class at a time and checks the decision
the harness takes for it, that it detected what was injected, and that the final state holds
exactly what the committed transactions account for: nothing duplicated, lost or unaccounted.
Trials run on a fake clock, so injected delays and retry back-offs take no real time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import harness as hx
from harness.agents import Toolbox
from harness.cli import main
from harness.faults import (
    FaultPlan,
    FaultPlanError,
    LostAcknowledgement,
    PlannedInterruption,
    WorkerCrash,
)
from harness.report.reliability import ReliabilityReport, reliability_report
from harness.store import TrialRow
from harness.testing import FakeClock

from ..toy_env import ToyEnvironment, write_suite

ROOT = Path(__file__).resolve().parents[2]
RETAIL = ROOT / "tasks" / "retail"

TASKS = [
    "retail-001",  # cancel
    "retail-006",  # order address
    "retail-009",  # items
    "retail-014",  # payment
    "retail-018",  # user address
    "retail-021",  # return
    "retail-025",  # exchange
    "retail-029",  # cancel, payment, return
]

EFFECTS_CLEAN = {"duplicated": 0, "lost": 0, "diverged": 0, "unaccounted": 0}


@pytest.fixture(scope="module")
def retail() -> hx.Suite:
    """The retail suite, loaded once."""
    return hx.load_suite(RETAIL)


def run(
    suite: Any, tmp_path: Path, plan: Any, *, tasks: list[str] | None = TASKS, trials: int = 2
) -> tuple[hx.RunResult, ReliabilityReport]:
    """Run the scripted agent under ``plan``; return the run and its reliability report."""
    result = hx.run_trials(
        suite, agent="scripted", trials=trials, logs=tmp_path / "logs", faults=plan, tasks=tasks
    )
    store = hx.Store(result.folder / "harness.db")
    try:
        return result, reliability_report(store, result.run_id)
    finally:
        store.close()


def plan_of(**fault: Any) -> FaultPlan:
    """A plan with one fault on every write tool and a 5-second timeout."""
    return FaultPlan.parse({"seed": 1, "timeout": 5.0, "faults": [{"service": "writes", **fault}]})


# The matrix: (fault, the decisions the harness must take on it, pass^1 of the scripted agent).
MATRIX: dict[str, tuple[dict[str, Any], set[str], float]] = {
    "fail_stop transient": ({"kind": "fail_stop", "calls": [1]}, {"retry"}, 1.0),
    "fail_stop permanent": (
        {"kind": "fail_stop", "calls": [1], "transient": False},
        {"continue"},
        0.0,
    ),
    "fail_slow": ({"kind": "fail_slow", "calls": [1], "delay": 12.0}, {"retry"}, 1.0),
    "silent missing": ({"kind": "silent", "calls": [1], "mode": "missing"}, {"retry"}, 1.0),
    "silent partial": ({"kind": "silent", "calls": [1], "mode": "partial"}, {"retry"}, 1.0),
    "silent wrong": ({"kind": "silent", "calls": [1], "mode": "wrong"}, {"retry"}, 1.0),
    "lost_ack raise": ({"kind": "lost_ack", "calls": [1]}, {"recover"}, 1.0),
    "lost_ack crash": ({"kind": "lost_ack", "calls": [1], "then": "crash"}, {"recover"}, 1.0),
    "compensation raise": ({"kind": "compensation", "calls": [1]}, {"escalate"}, 0.0),
    "compensation incomplete": (
        {"kind": "compensation", "calls": [1], "undo": "incomplete"},
        {"escalate"},
        0.0,
    ),
}


@pytest.mark.parametrize("case", sorted(MATRIX))
def test_each_class_gets_its_expected_decision(case: str, retail: hx.Suite, tmp_path: Path) -> None:
    """Each injected class is detected every time, decided as expected, and loses no effect."""
    fault, decisions, pass1 = MATRIX[case]
    result, report = run(retail, tmp_path, plan_of(**fault))
    stats = report.classes[fault["kind"]]
    assert stats.injected == len(result.results) > 0
    assert stats.coverage == 1.0
    assert set(stats.decisions) == decisions
    assert {k: stats.effects[k] for k in EFFECTS_CLEAN} == EFFECTS_CLEAN
    assert report.false_positives == []
    assert result.pass_hat(1).value == pytest.approx(pass1)
    if decisions == {"retry"}:
        assert stats.recovered == stats.injected and stats.re_executed == stats.injected
    if decisions == {"recover"}:
        assert stats.re_executed == 0 and stats.recovered == stats.injected


def test_fail_slow_is_detected_after_its_delay_on_the_fake_clock(
    retail: hx.Suite, tmp_path: Path
) -> None:
    """A slow call is detected when it returns past the timeout, after exactly its delay."""
    _, report = run(retail, tmp_path, plan_of(kind="fail_slow", calls=[1], delay=12.0))
    stats = report.classes["fail_slow"]
    assert stats.detected_as == {"fail_slow": stats.injected}
    assert stats.detect_latency.median == pytest.approx(12.0)
    assert stats.detect_latency.max == pytest.approx(12.0)
    # Recovery adds the retry's back-off (0.5 s, plus up to 0.5 s of jitter) to the delay.
    assert stats.recover_time.max is not None and 12.5 <= stats.recover_time.max <= 13.0


def test_progressive_degradation_is_caught_from_the_first_call_over_the_timeout(
    retail: hx.Suite, tmp_path: Path
) -> None:
    """A domain slowing down call after call is flagged exactly when a call passes the timeout."""
    plan = plan_of(kind="fail_slow", delay=2.0, growth=2.0)
    _, report = run(retail, tmp_path, plan, tasks=["retail-029"], trials=1)
    store = hx.Store(next((tmp_path / "logs").iterdir()) / "harness.db")
    from sqlmodel import select

    from harness.store import FaultEventRow

    with store.session() as s:
        events = sorted(s.exec(select(FaultEventRow)), key=lambda e: e.call)
    store.close()
    delays = [json.loads(e.detail)["delay"] for e in events]
    assert delays[:4] == [2.0, 4.0, 8.0, 16.0]
    assert [e.detected for e in events] == [d > 5.0 for d in delays]
    assert report.classes["fail_slow"].coverage == pytest.approx(
        sum(d > 5.0 for d in delays) / len(delays)
    )


def test_lost_ack_crash_is_resolved_in_doubt_without_running_twice(
    retail: hx.Suite, tmp_path: Path
) -> None:
    """A worker dying after the effect is resumed; the probe finds the effect, nothing reruns."""
    result, report = run(retail, tmp_path, plan_of(kind="lost_ack", calls=[1], then="crash"))
    stats = report.classes["lost_ack"]
    assert stats.detected_as == {"in_doubt": stats.injected}
    assert result.outcomes() == {"committed": len(result.results)}
    store = hx.Store(result.folder / "harness.db")
    try:
        kinds = [r.kind for r in store.log(result.results[0].episode_id)]
        assert "resume" in kinds and "recovered" in kinds
        assert store.verify_chain().ok
    finally:
        store.close()


def test_compensation_failure_escalates_and_is_never_swallowed(
    retail: hx.Suite, tmp_path: Path
) -> None:
    """A failed undo leaves a pending escalation with the evidence, and the episode paused."""
    result, report = run(retail, tmp_path, plan_of(kind="compensation", calls=[1]))
    assert result.outcomes() == {"escalated": len(result.results)}
    stats = report.classes["compensation"]
    assert stats.detected_as == {"compensation": stats.injected}
    assert stats.effects["held"] >= stats.injected  # the wrong effect, left for a person
    store = hx.Store(result.folder / "harness.db")
    try:
        pending = store.escalations(status="pending")
        assert len(pending) == len(result.results)
        assert all(e.failure_class == "compensation" for e in pending)
        assert all("CompensationBroken" in e.reason for e in pending)
    finally:
        store.close()


def test_correlated_outage_hits_every_trial_in_its_window(retail: hx.Suite, tmp_path: Path) -> None:
    """An outage of the write service during trial 1 touches every task's trial 1 and no other."""
    plan = plan_of(kind="correlated", trials=[1, 2])
    result, report = run(retail, tmp_path, plan)
    stats = report.classes["correlated"]
    assert stats.instances == 1 and stats.blast_radius_max == len(TASKS)
    assert stats.coverage == 1.0
    assert set(stats.decisions) == {"retry", "continue"}  # retried, then given up
    assert stats.trials_lost == len(TASKS)
    passed = {(r.task_id, r.trial): r.passed for r in result.results}
    assert all(passed[(t, 0)] for t in TASKS) and not any(passed[(t, 1)] for t in TASKS)
    assert {k: stats.effects[k] for k in EFFECTS_CLEAN} == EFFECTS_CLEAN


def test_planned_interruption_is_announced_and_not_counted_against_the_agent(
    retail: hx.Suite, tmp_path: Path
) -> None:
    """Trials hit by announced maintenance are planned interruptions, not lost trials."""
    plan = plan_of(kind="planned", trials=[0, 1], notice="database upgrade")
    result, report = run(retail, tmp_path, plan)
    stats = report.classes["planned"]
    assert stats.detected_as == {"planned": stats.injected}
    assert set(stats.decisions) == {"continue"}
    assert stats.trials_lost == 0 and stats.planned_interruptions == len(TASKS)
    assert [a["notice"] for a in report.announced] == ["database upgrade"]
    evidence = json.loads((result.folder / "evidence.json").read_text())
    assert evidence["faults"]["announced"][0]["window"] == "trials [0, 1)"
    hit = [r for r in result.results if r.trial == 0]
    assert all(r.infra_error and not r.passed for r in hit)
    assert all(r.passed and not r.infra_error for r in result.results if r.trial == 1)


def test_silent_and_lost_ack_are_always_detected(retail: hx.Suite, tmp_path: Path) -> None:
    """Over every retail task, every silent and lost-ack fault is detected; no effect is lost."""
    plan = FaultPlan.parse(
        {
            "seed": 5,
            "faults": [
                {"kind": "silent", "service": "writes", "rate": 0.15, "mode": "missing"},
                {"kind": "silent", "service": "writes", "rate": 0.15, "mode": "partial"},
                {"kind": "silent", "service": "writes", "rate": 0.15, "mode": "wrong"},
                {"kind": "lost_ack", "service": "writes", "rate": 0.15},
                {"kind": "lost_ack", "service": "writes", "rate": 0.15, "then": "crash"},
            ],
        }
    )
    _, report = run(retail, tmp_path, plan, tasks=None, trials=2)
    for kind in ("silent", "lost_ack"):
        assert report.classes[kind].injected >= 20
        assert report.coverage(kind) == 1.0
    assert {k: report.effects[k] for k in EFFECTS_CLEAN} == EFFECTS_CLEAN
    assert report.false_positives == []


def test_clean_runs_report_no_false_positives(retail: hx.Suite, tmp_path: Path) -> None:
    """With nothing injected (no plan, or an empty one) the harness flags no failure."""
    for name, plan in (("none", None), ("empty", FaultPlan())):
        result, report = run(retail, tmp_path / name, plan, tasks=None, trials=1)
        assert report.classes == {} and report.false_positives == []
        assert report.clean_trials_failed == 0
        assert result.pass_hat(1).value == 1.0
    assert report.accounted_trials == len(retail.tasks)
    assert report.effects == {
        "duplicated": 0,
        "lost": 0,
        "diverged": 0,
        "unaccounted": 0,
        "held": 0,
    }


def test_a_failure_nobody_injected_is_a_false_positive(store: hx.Store) -> None:
    """A failure the harness flags in an episode with no injected fault is reported as such."""
    shop = hx.DictState({"c/a": 0})
    calls: list[str] = []

    def bump(name: str) -> int:
        calls.append(name)
        if len(calls) == 1:
            raise hx.TransientError("a real, flaky failure")
        shop[f"c/{name}"] = shop[f"c/{name}"] + 1
        return int(shop[f"c/{name}"])

    act = hx.action(bump, writes=["c/{name}"], idempotent=True)
    with hx.Episode(state=shop, store=store, clock=FakeClock(), run_id="r", episode_id="e"):
        act("a")
    store.add(
        TrialRow(id="e", run_id="r", task_id="t", trial=0, seed=0, episode_id="e", created_at=0.0)
    )
    report = reliability_report(store, "r")
    assert [(f.action, f.attempts) for f in report.false_positives] == [("bump", 2)]
    assert report.clean_trials_failed == 1


def test_seeded_plans_inject_the_same_faults(retail: hx.Suite, tmp_path: Path) -> None:
    """The same plan and seed inject the same faults at the same calls; another seed differs."""

    def events(seed: int, folder: str) -> list[tuple[Any, ...]]:
        plan = FaultPlan.parse(
            {"seed": seed, "faults": [{"kind": "fail_stop", "service": "writes", "rate": 0.4}]}
        )
        result, _ = run(retail, tmp_path / folder, plan)
        store = hx.Store(result.folder / "harness.db")
        from sqlmodel import select

        from harness.store import FaultEventRow

        with store.session() as s:
            rows = [(e.task_id, e.trial, e.tool, e.call) for e in s.exec(select(FaultEventRow))]
        store.close()
        return sorted(rows)

    first = events(3, "a")
    assert first and first == events(3, "b")
    assert events(4, "c") != first


def test_toy_environment_faults_write_through_a_dict_state(tmp_path: Path) -> None:
    """On a DictState the injector alters effects directly; the postcondition still catches them."""
    suite = write_suite(tmp_path / "suite", [3, 3])
    plan = FaultPlan.parse(
        {"faults": [{"kind": "silent", "tool": "bump", "calls": [1, 3], "mode": "wrong"}]}
    )
    result, report = run(suite, tmp_path, plan, tasks=None)
    assert report.coverage("silent") == 1.0 and report.classes["silent"].injected == 8
    assert result.pass_hat(1).value == 1.0


def test_read_tools_can_fail_and_are_restored(tmp_path: Path) -> None:
    """A plain read tool can be faulted; uninstalling puts every tool and undo back."""
    env = ToyEnvironment()
    originals = dict(env.tools)
    bump_fn, bump_undo = env.tools["bump"].fn, env.tools["bump"].compensate
    plan = FaultPlan.parse({"faults": [{"kind": "fail_stop", "service": "reads"}]})
    inj = plan.injector(env, task_id="t", trial=0).install()
    assert env.tools["look"] is not originals["look"]
    with pytest.raises(hx.TransientError, match="injected fail_stop"):
        env.tools["look"]("a")
    assert [e.tool for e in inj.events] == ["look"] and inj.events[0].txn_id is None
    inj.uninstall()
    assert env.tools == originals
    assert env.tools["bump"].fn is bump_fn and env.tools["bump"].compensate is bump_undo


def test_wall_clock_windows_count_from_the_run_start(store: hx.Store) -> None:
    """A correlated window in seconds hits calls made inside it and spares those outside."""
    for window, hits in (([0.0, 60.0], 3), ([300.0, 600.0], 0)):
        env = ToyEnvironment()
        plan = FaultPlan.parse(
            {"faults": [{"kind": "correlated", "tool": "bump", "seconds": window}]}
        )
        episode_id = f"window-{hits}"
        inj = plan.injector(env, trial=0, started=time.time() - 10, episode_id=episode_id)
        with inj, hx.Episode(state=env.state, store=store, clock=inj.clock, episode_id=episode_id):
            try:
                env.tools["bump"]("a", step=1)
            except hx.ActionFailed as exc:  # down on every attempt: retried, then given up
                assert (exc.failure_class, exc.decision) == ("fail_stop", "continue")
        assert len(inj.events) == hits
        assert env.state["c/a"] == (0 if hits else 1)


def test_async_actions_take_injected_delays_on_the_fake_clock(store: hx.Store) -> None:
    """An async tool delayed past its timeout fails slow, is undone, and its retry commits."""
    state = hx.DictState({"c/a": 0})

    async def bump(name: str) -> int:
        state[f"c/{name}"] = state[f"c/{name}"] + 1
        return int(state[f"c/{name}"])

    act = hx.action(bump, writes=["c/{name}"], idempotent=True, timeout=1.0)

    @act.compensation
    async def undo(ctx: hx.Context) -> None:
        for key, value in ctx.before.items():
            state[key] = value

    env = type("Env", (), {"state": state, "tools": {"bump": act}})()
    plan = FaultPlan.parse(
        {"faults": [{"kind": "fail_slow", "tool": "bump", "calls": [1], "delay": 3}]}
    )
    inj = plan.injector(env, episode_id="async")
    clock = inj.clock
    assert isinstance(clock, FakeClock)

    async def go() -> None:
        with inj:
            async with hx.Episode(state=state, store=store, clock=clock, episode_id="async"):
                assert await act("a") == 1

    import asyncio

    asyncio.run(go())
    result = inj.finish(store)
    assert state["c/a"] == 1 and result.clean
    assert [(e.kind, e.detected_as, e.decision) for e in result.events] == [
        ("fail_slow", "fail_slow", "retry")
    ]
    assert clock.now() >= 3.0


def test_direct_injection_raises_what_a_failing_tool_would(store: hx.Store) -> None:
    """Injected errors are ordinary tool errors (or a process death), tagged with the event id."""
    env = ToyEnvironment()
    plan = FaultPlan.parse(
        {
            "faults": [
                {"kind": "lost_ack", "tool": "bump", "calls": [1]},
                {"kind": "lost_ack", "tool": "bump", "calls": [2], "then": "crash"},
                {"kind": "planned", "tool": "look", "trials": [0, 1]},
            ]
        }
    )
    with plan.injector(env, episode_id="d") as inj:
        bump = env.tools["bump"].fn
        with pytest.raises(LostAcknowledgement, match=r"^\[d#1\]"):
            bump(name="a", step=1)
        with pytest.raises(WorkerCrash):
            bump(name="b", step=2)
        with pytest.raises(PlannedInterruption, match="announced maintenance"):
            env.tools["look"]("a")
    assert env.state["c/a"] == 1 and env.state["c/b"] == 1  # the effects were applied
    assert inj.crashes == 1 and inj.planned


BAD_PLANS: list[tuple[dict[str, Any], str]] = [
    ({"faults": [{"tool": "x"}]}, "faults[0]: kind is missing; give kind = one of fail_stop"),
    ({"faults": [{"kind": "boom", "tool": "x"}]}, "faults[0]: unknown kind 'boom'"),
    ({"faults": [{"kind": "silent", "tool": "x", "mood": 1}]}, "faults[0] (silent): mood: unknown"),
    ({"faults": [{"kind": "silent", "tool": "x", "mode": "loud"}]}, "faults[0] (silent): mode:"),
    ({"faults": [{"kind": "fail_stop"}]}, "give exactly one fault domain"),
    ({"faults": [{"kind": "fail_stop", "tool": "x", "worker": True}]}, "exactly one fault domain"),
    ({"faults": [{"kind": "fail_stop", "tool": "x", "rate": 1.5}]}, "rate: Input should be less"),
    ({"faults": [{"kind": "fail_stop", "tool": "x", "rate": 0.5, "calls": [1]}]}, "rate or calls"),
    ({"faults": [{"kind": "fail_slow", "tool": "x"}]}, "faults[0] (fail_slow): delay: required"),
    ({"faults": [{"kind": "correlated", "tool": "x"}]}, "correlated): needs a window"),
    ({"faults": [{"kind": "planned", "tool": "x", "trials": [3, 1]}]}, "needs start < end"),
    ({"faults": [{"kind": "fail_stop", "service": "db"}]}, "no service 'db'; services: reads"),
    ({"services": {"writes": ["x"]}}, "services: writes is built in"),
    ({"faults": [{"kind": "fail_stop", "tool": "x", "name": "a"}] * 2}, "a repeats"),
    ({"version": 2}, "version: Input should be 1"),
    ({"clock": "sundial"}, "clock: Input should be 'fake' or 'real'"),
]


@pytest.mark.parametrize(("data", "message"), BAD_PLANS, ids=[m for _, m in BAD_PLANS])
def test_bad_plans_name_what_is_wrong(data: dict[str, Any], message: str) -> None:
    """A malformed plan raises FaultPlanError naming the fault, the field and the fix."""
    with pytest.raises(FaultPlanError) as info:
        FaultPlan.parse(data)
    assert message in str(info.value)
    assert isinstance(info.value, hx.ConfigurationError)


def test_plan_files_load_from_toml_and_json_and_fail_clearly(tmp_path: Path) -> None:
    """TOML and JSON give the same plan; bad syntax, a wrong suffix and a missing file are named."""
    toml = tmp_path / "plan.toml"
    toml.write_text(
        'seed = 2\n[services]\norders = ["cancel_pending_order"]\n'
        '[[faults]]\nkind = "silent"\nservice = "orders"\nrate = 0.5\n'
    )
    js = tmp_path / "plan.json"
    js.write_text(
        json.dumps(
            {
                "seed": 2,
                "services": {"orders": ["cancel_pending_order"]},
                "faults": [{"kind": "silent", "service": "orders", "rate": 0.5}],
            }
        )
    )
    assert FaultPlan.load(toml) == FaultPlan.load(js)
    (tmp_path / "bad.toml").write_text("seed = = 1\n")
    (tmp_path / "bad.json").write_text('{"seed": 1,}')
    (tmp_path / "plan.yaml").write_text("seed: 1\n")
    for name, message in (
        ("bad.toml", "not valid TOML"),
        ("bad.json", "not valid JSON (Expecting property name"),
        ("plan.yaml", "a fault plan is a .json or .toml file"),
        ("missing.toml", "cannot read the fault plan"),
    ):
        with pytest.raises(FaultPlanError, match=message.replace("(", r"\(")):
            FaultPlan.load(tmp_path / name)


def test_plans_that_do_not_fit_the_suite_fail_before_the_run(
    retail: hx.Suite, tmp_path: Path
) -> None:
    """Unknown tools, effect faults on reads and rates over 1 are refused before any trial."""
    cases = [
        ({"faults": [{"kind": "fail_stop", "tool": "launch_rocket"}]}, "no tool 'launch_rocket'"),
        ({"services": {"s": ["nope"]}}, "services.s: no tool 'nope'"),
        ({"faults": [{"kind": "silent", "tool": "get_order_details"}]}, "changes no state"),
        (
            {
                "faults": [
                    {"kind": "fail_stop", "service": "writes", "rate": 0.7},
                    {"kind": "silent", "tool": "cancel_pending_order", "rate": 0.5},
                ]
            },
            "'cancel_pending_order' sum to more than 1",
        ),
    ]
    for data, message in cases:
        plan = FaultPlan.parse(data)
        with pytest.raises(FaultPlanError, match=message):
            hx.run_trials(retail, agent="scripted", logs=tmp_path / "logs", faults=plan)
    assert not (tmp_path / "logs").exists()


def test_cli_run_with_faults_prints_the_reliability_report(tmp_path: Path) -> None:
    """`harness run --faults PLAN` injects the plan and prints detection by class."""
    plan = tmp_path / "plan.toml"
    plan.write_text('[[faults]]\nkind = "silent"\nservice = "writes"\ncalls = [1]\n')
    out = CliRunner().invoke(
        main,
        [
            "run",
            str(RETAIL),
            "--agent",
            "scripted",
            "--trials",
            "1",
            "--task",
            "retail-001",
            "--logs",
            str(tmp_path / "logs"),
            "--faults",
            str(plan),
        ],
        env={"COLUMNS": "300"},
    )
    assert out.exit_code == 0, out.output
    assert "detection and decisions by class" in out.output
    assert "silent" in out.output and "100%" in out.output
    assert "false positives (failures flagged with nothing injected): 0" in out.output
    plan.write_text('[[faults]]\nkind = "silent"\n')
    bad = CliRunner().invoke(
        main,
        ["run", str(RETAIL), "--agent", "scripted", "--faults", str(plan)],
        env={"COLUMNS": "300"},
    )
    assert bad.exit_code == 2 and "give exactly one fault domain" in bad.output


def test_toolbox_sees_injected_failures_as_tool_results(store: hx.Store) -> None:
    """Through the toolbox an injected permanent failure reaches the agent as a fail_stop result."""
    env = ToyEnvironment()
    plan = FaultPlan.parse(
        {"faults": [{"kind": "fail_stop", "tool": "bump", "calls": [1], "transient": False}]}
    )
    with plan.injector(env, episode_id="tb") as inj:
        with hx.Episode(state=env.state, store=store, clock=inj.clock, episode_id="tb") as ep:
            result = Toolbox(env.tools, ep, env).call("bump", {"name": "a", "step": 1})
    assert not result.ok and result.kind == "fail_stop" and "[tb#1]" in (result.error or "")


def test_effects_on_a_read_only_adapter_need_a_compensation_to_write_through() -> None:
    """A silent fault on an action with no undo over an adapter that takes no writes is refused."""
    inner = hx.DictState({"c/a": 0})

    class ReadOnly:
        """The adapter protocol without writes."""

        def get(self, key: str) -> Any:
            return inner.get(key)

        def snapshot(self, keys: Any) -> dict[str, Any]:
            return inner.snapshot(keys)

        def mark(self) -> Any:
            return inner.mark()

        def changes(self, mark: Any) -> dict[str, Any]:
            return inner.changes(mark)

        def release(self, mark: Any) -> None:
            inner.release(mark)

    def bump(name: str) -> int:
        inner[f"c/{name}"] = inner[f"c/{name}"] + 1
        return 1

    env = type("Env", (), {"state": ReadOnly(), "tools": {"bump": hx.action(bump, writes=["c/*"])}})
    plan = FaultPlan.parse({"faults": [{"kind": "silent", "tool": "bump"}]})
    with pytest.raises(FaultPlanError, match="bump cannot have its effect altered"):
        plan.injector(env()).install()
    assert env.tools["bump"].fn is bump


def test_fault_domains_resolve_to_tools() -> None:
    """A worker domain is every tool; effect faults keep only the writes; services as declared."""
    env = ToyEnvironment()
    plan = FaultPlan.parse(
        {
            "services": {"counters": ["bump"]},
            "faults": [
                {"kind": "fail_slow", "worker": True, "delay": 1.0},
                {"kind": "lost_ack", "worker": True, "rate": 0.0},
                {"kind": "fail_stop", "service": "counters", "rate": 0.0},
                {"kind": "fail_stop", "service": "reads", "rate": 0.0},
            ],
        }
    )
    assert [plan.domain_of(i, env.tools) for i in range(4)] == [
        ["bump", "look"],
        ["bump"],
        ["bump"],
        ["look"],
    ]


def test_example_plan_in_the_repository_loads() -> None:
    """The plan the README points at loads and fits the retail suite's tools."""
    from harness.faults import FaultPlan

    plan = FaultPlan.load(Path(__file__).resolve().parents[2] / "examples" / "faults-retail.toml")
    assert {f.kind for f in plan.faults} == {"fail_stop", "fail_slow", "silent", "lost_ack"}

"""Resume: re-executed agents get their record back, divergence is caught, in-doubt calls are
settled, escalations resume where they stopped, and ``harness resume`` finishes a killed run."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shlex
import signal
import socket
import sqlite3
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import harness as hx
from harness.agents import OpenAIAgent
from harness.cli import main
from harness.errors import Diverged
from harness.runs.resume import resume_run
from harness.runs.start import run_trials
from harness.runs.toolbox import RecordingToolbox
from harness.testing import FakeClock
from harness.testing.model_server import FakeChatServer, text_reply, tool_reply

from ..agents.test_openai import TASK, shop_tools
from ..conftest import Shop
from ..test_transaction import cancel_action


class Crash(BaseException):
    """Stands for the process dying."""


def counting(shop: Shop, counts: Counter[str], **kw: Any) -> hx.Action[..., dict[str, Any]]:
    """The shop's cancel action, counting each execution of its tool by order id."""

    def tool(order_id: str) -> dict[str, Any]:
        counts[order_id] += 1
        return shop.set_status(order_id, "cancelled")

    return cancel_action(shop, tool=tool, **kw)


def open_episode(shop: Shop, store_url: str, clock: FakeClock, **kw: Any) -> hx.Episode:
    """An episode e1 on the shop (resumed when ``resume=True``)."""
    return hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e1", **kw)


# --------------------------------------------------------------------------------------------
# Re-executed agent code gets the record back.
# --------------------------------------------------------------------------------------------


def test_resumed_agent_gets_every_recorded_outcome_and_nothing_runs_again(
    shop: Shop, store_url: str, clock: FakeClock
):
    """Results, refusals, invalid calls and failures come back exactly as the agent first saw
    them; no tool runs and no transaction row is added until the agent passes the record."""
    counts: Counter[str] = Counter()
    cancel = counting(shop, counts)

    @hx.action()
    def status(order_id: str) -> str:
        """Read an order's status (a non-mutating action)."""
        counts["status"] += 1
        return str(shop.state[f"orders/{order_id}"]["status"])

    @hx.action(writes=["orders/{order_id}"], idempotency_key=lambda a: f"x:{a.order_id}")
    def explode(order_id: str) -> None:
        """Always fails."""
        counts["explode"] += 1
        raise RuntimeError("tool exploded")

    explode.compensation(shop.restore)

    def agent(crash: bool) -> list[str]:
        seen = []
        for call in (
            lambda: status("o1"),
            lambda: cancel("o1"),
            lambda: cancel("o3"),  # delivered: refused
            lambda: cancel(order_id=None),  # invalid
            lambda: explode("o2"),
            lambda: cancel("o2"),
            lambda: status("o1"),
        ):
            try:
                seen.append(repr(call()))
            except hx.HarnessError as exc:
                seen.append(f"{type(exc).__name__}: {exc}")
        if crash:
            raise Crash()
        return seen

    with pytest.raises(Crash), open_episode(shop, store_url, clock):
        first = agent(crash=False)
        agent_rows = len(hx.Store(store_url).transactions("e1"))
        raise Crash()
    before = dict(counts)
    with open_episode(shop, store_url, clock, resume=True) as ep:
        again = agent(crash=False)
        assert dict(counts) == before  # nothing executed again
        assert len(hx.Store(store_url).transactions("e1")) == agent_rows
        status("o2")  # past the record: live
    assert again == first
    assert counts["status"] == before["status"] + 1
    assert ep.outcome == "committed" and hx.Store(store_url).verify_chain().ok


def test_different_call_at_a_recorded_step_is_refused_as_divergence(
    shop: Shop, store_url: str, clock: FakeClock
):
    """A call that differs from the record (action or arguments) raises Diverged naming the
    first differing step, what the record has and what the agent did; nothing runs."""
    counts: Counter[str] = Counter()
    cancel = counting(shop, counts)
    with pytest.raises(Crash), open_episode(shop, store_url, clock):
        cancel("o1")
        cancel("o2", reason="asked")
        raise Crash()
    with pytest.raises(Diverged) as info, open_episode(shop, store_url, clock, resume=True) as ep:
        cancel("o1")
        with pytest.raises(Diverged):
            cancel("o2", reason="changed mind")
        cancel("o1")  # every later call raises the same divergence
    error = info.value
    assert error.step == 2 and error.episode_id == "e1"
    assert error.expected is not None and error.expected["arguments"]["reason"] == "asked"
    assert error.actual is not None and error.actual["arguments"]["reason"] == "changed mind"
    assert "diverged from its record at step 2" in str(error)
    assert ep.outcome == "failed" and counts == {"o1": 1, "o2": 1}
    store = hx.Store(store_url)
    (record,) = [r for r in store.log("e1") if r.kind == "diverged"]
    assert json.loads(record.payload)["step"] == 2
    assert store.verify_chain().ok


def test_remembered_values_come_back_on_resume(shop: Shop, store_url: str, clock: FakeClock):
    """Episode.remember computes and records a value once, gives the recorded one back on
    resume, and refuses a different request at that step, or a value JSON cannot hold."""
    answers = iter([1, 2, 3])
    with pytest.raises(Crash), open_episode(shop, store_url, clock) as ep:
        assert ep.remember("read", {"q": "a"}, lambda: {"n": next(answers)}) == {"n": 1}
        with pytest.raises(hx.ConfigurationError, match="not JSON"):
            ep.remember("read", {"q": "b"}, object)
        raise Crash()
    with open_episode(shop, store_url, clock, resume=True) as ep:
        assert ep.remember("read", {"q": "a"}, lambda: {"n": next(answers)}) == {"n": 1}
        assert ep.remember("read", {"q": "b"}, lambda: next(answers)) == 2  # past the record
    with (
        pytest.raises(Diverged, match="step 1"),
        open_episode(shop, store_url, clock, resume=True) as ep,
    ):
        ep.remember("read", {"q": "other"}, lambda: 0)


# --------------------------------------------------------------------------------------------
# In-doubt calls.
# --------------------------------------------------------------------------------------------


def die_during(shop: Shop, store_url: str, clock: FakeClock, *, applied: bool, **kw: Any) -> None:
    """Episode e1 whose cancel of o1 dies inside the tool, after or before applying it."""

    def dying(order_id: str) -> dict[str, Any]:
        if applied:
            shop.set_status(order_id, "cancelled")
        raise Crash()

    cancel = cancel_action(shop, tool=dying, **kw)
    with pytest.raises(Crash), open_episode(shop, store_url, clock):
        cancel("o1")


def test_in_doubt_effect_present_is_recovered_before_the_agent_runs(
    shop: Shop, store_url: str, clock: FakeClock
):
    """With the action known, a resumed episode commits an in-doubt call whose effect is
    present as recovered at once; the agent's call then gets that result."""
    die_during(shop, store_url, clock, applied=True)
    counts: Counter[str] = Counter()
    cancel = counting(shop, counts)
    with open_episode(shop, store_url, clock, resume=True, actions=[cancel]) as ep:
        assert ep.in_doubt == []
        assert [t.status for t in hx.Store(store_url).transactions("e1")] == ["recovered"]
        assert cancel("o1") is None  # recovered without a result hook: None, as recorded
    assert counts == {} and shop.applied == [("o1", "cancelled")]


def test_in_doubt_keyed_call_with_effect_absent_runs_again_once(
    shop: Shop, store_url: str, clock: FakeClock
):
    """A keyed in-doubt call whose effect is absent is abandoned at resume and runs once more
    when the agent makes it again."""
    die_during(shop, store_url, clock, applied=False)
    counts: Counter[str] = Counter()
    cancel = counting(shop, counts)
    with open_episode(shop, store_url, clock, resume=True, actions=[cancel]):
        assert [t.status for t in hx.Store(store_url).transactions("e1")] == ["abandoned"]
        cancel("o1")
    with open_episode(shop, store_url, clock, resume=True, actions=[cancel]):
        cancel("o1")  # replayed
    assert counts == {"o1": 1}
    assert [t.status for t in hx.Store(store_url).transactions("e1")] == [
        "abandoned",
        "committed",
    ]


def test_partial_effect_of_an_in_doubt_call_is_compensated_before_it_runs_again(
    shop: Shop, store_url: str, clock: FakeClock
):
    """An in-doubt call that left its scope changed but its postconditions false is
    compensated back to its snapshot before it runs again."""

    def half(order_id: str) -> dict[str, Any]:
        shop.set_status(order_id, "cancelling")
        raise Crash()

    cancel = cancel_action(shop, tool=half)
    with pytest.raises(Crash), open_episode(shop, store_url, clock):
        cancel("o1")
    counts: Counter[str] = Counter()
    cancel = counting(shop, counts)
    with open_episode(shop, store_url, clock, resume=True, actions=[cancel]):
        assert shop.state["orders/o1"]["status"] == "pending"
        cancel("o1")
    (abandoned, _) = hx.Store(store_url).transactions("e1")
    assert "partial effect compensated" in (abandoned.reason or "")
    assert counts == {"o1": 1} and shop.state["orders/o1"]["status"] == "cancelled"


def test_unkeyed_in_doubt_call_waits_for_approval_then_runs_once(
    shop: Shop, store_url: str, clock: FakeClock
):
    """An unkeyed in-doubt call with no visible effect escalates at resume; the agent's call
    raises that escalation; once approved, the next resume runs it exactly once."""
    die_during(shop, store_url, clock, applied=False, idempotency_key=None)
    counts: Counter[str] = Counter()
    cancel = counting(shop, counts, idempotency_key=None)
    with pytest.raises(hx.Escalated) as info:
        with open_episode(shop, store_url, clock, resume=True, actions=[cancel]):
            cancel("o1")
    store = hx.Store(store_url)
    (pending,) = store.escalations("pending")
    assert pending.id == info.value.escalation_id and "could apply it twice" in pending.reason
    store.resolve(pending.id, "approve", by="ops", reason="checked: not applied")
    for _ in range(2):  # the second resume replays it
        with open_episode(shop, store_url, clock, resume=True, actions=[cancel]):
            cancel("o1")
    assert counts == {"o1": 1} and shop.applied == [("o1", "cancelled")]
    assert store.verify_chain().ok


def test_approved_in_doubt_call_runs_once_when_settled_lazily(
    shop: Shop, store_url: str, clock: FakeClock
):
    """Without the action given up front, an approved in-doubt call runs once when the agent
    makes it again (and is not escalated a second time)."""
    die_during(shop, store_url, clock, applied=False, idempotency_key=None)
    counts: Counter[str] = Counter()
    cancel = counting(shop, counts, idempotency_key=None)
    with pytest.raises(hx.Escalated) as info:
        with open_episode(shop, store_url, clock, resume=True):
            cancel("o1")
    hx.Store(store_url).resolve(info.value.escalation_id, "approve", by="ops")
    for _ in range(2):
        with open_episode(shop, store_url, clock, resume=True):
            cancel("o1")
    assert counts == {"o1": 1}
    assert len(hx.Store(store_url).escalations()) == 1


# --------------------------------------------------------------------------------------------
# Escalations and rollbacks across crashes.
# --------------------------------------------------------------------------------------------


def test_edited_escalation_is_not_run_again_by_a_later_resume(
    shop: Shop, store_url: str, clock: FakeClock
):
    """After an edit resolution ran and the process died, resuming again replays the edited
    call instead of running it a second time."""
    counts: Counter[str] = Counter()

    def flaky(order_id: str) -> dict[str, Any]:
        counts[order_id] += 1
        if counts[order_id] == 1 and order_id == "o2":
            raise RuntimeError("fraud check timed out")
        return shop.set_status(order_id, "cancelled")

    cancel = cancel_action(shop, tool=flaky, compensable=False, idempotency_key=None)

    def agent() -> None:
        cancel("o1")
        cancel("o2")

    with pytest.raises(hx.Escalated) as info, open_episode(shop, store_url, clock):
        agent()
    hx.Store(store_url).resolve(
        info.value.escalation_id, "edit", by="lead", edit={"order_id": "o2", "reason": "edited"}
    )
    with pytest.raises(Crash), open_episode(shop, store_url, clock, resume=True):
        agent()
        raise Crash()
    with open_episode(shop, store_url, clock, resume=True):
        agent()
    assert counts == {"o1": 1, "o2": 2}


def test_crash_inside_a_rollback_does_not_compensate_twice(
    shop: Shop, store_url: str, clock: FakeClock
):
    """A compensation that ran before the process died is found done on resume (the state is
    back) and not run again; the rest of the saga completes."""
    undone: Counter[str] = Counter()
    die = [True]

    def restore(ctx: hx.Context) -> None:
        undone[ctx.args.order_id] += 1
        shop.restore(ctx)
        if die[0]:
            die[0] = False
            raise Crash()

    cancel = cancel_action(shop, compensable=False)
    cancel.compensation(restore)
    original = shop.state.to_dict()
    with pytest.raises(Crash), open_episode(shop, store_url, clock) as ep:
        cancel("o1")
        cancel("o2")
        ep.rollback()
    with open_episode(shop, store_url, clock, resume=True, actions=[cancel]) as ep:
        cancel("o1")
        cancel("o2")
        ep.rollback()
    assert undone == {"o2": 1, "o1": 1}
    assert shop.state.to_dict() == original and ep.outcome == "rolled_back"
    store = hx.Store(store_url)
    found = [json.loads(r.payload) for r in store.log("e1") if r.kind == "compensated"]
    assert found == [{"action": "cancel_order", "found_undone": True}, {"action": "cancel_order"}]


def test_rollback_cut_short_is_completed_when_the_agent_reaches_it_again(
    shop: Shop, store_url: str, clock: FakeClock
):
    """A failure whose decision rolled the episode back, cut short by a crash, finishes its
    saga when the replayed agent reaches it; the agent sees the same error as before."""
    undone: Counter[str] = Counter()
    die = [True]

    def restore(ctx: hx.Context) -> None:
        undone[ctx.args.order_id] += 1
        shop.restore(ctx)
        if die[0] and ctx.args.order_id == "o2":
            die[0] = False
            raise Crash()

    cancel = cancel_action(shop, compensable=False)
    cancel.compensation(restore)

    @hx.action(writes=["orders/{order_id}"], idempotency_key=lambda a: f"x:{a.order_id}")
    def explode(order_id: str) -> None:
        """Always fails."""
        raise RuntimeError("boom")

    explode.compensation(shop.restore)
    policy = hx.Policy(decisions={"fail_stop": "rollback"})

    def agent() -> str:
        cancel("o1")
        cancel("o2")
        try:
            explode("o3")
        except hx.ActionFailed as exc:
            return str(exc)
        raise AssertionError("explode must fail")

    with pytest.raises(Crash), open_episode(shop, store_url, clock, policy=policy):
        agent()
    with open_episode(shop, store_url, clock, resume=True, policy=policy) as ep:
        message = agent()
        with pytest.raises(hx.EpisodeClosed):
            cancel("o1")
    assert "decision rollback" in message and ep.outcome == "rolled_back"
    assert undone == {"o2": 1, "o1": 1}
    assert shop.state["orders/o1"]["status"] == "pending"


def test_openai_agent_resumes_from_recorded_model_calls(
    shop: Shop, store_url: str, clock: FakeClock
):
    """A resumed episode's model calls come from the record: the server sees only the turns
    the interrupted run did not finish, and the cancel runs once."""
    script = [
        tool_reply(("get_order", {"order_id": "o1"})),
        tool_reply(("cancel_order", {"order_id": "o1"})),
        text_reply("Cancelled."),
    ]
    tools = shop_tools(shop)
    with FakeChatServer(script[:2]) as server:  # the third turn fails: the server "went down"
        with open_episode(shop, store_url, clock) as ep:
            agent = OpenAIAgent(base_url=server.base_url, model="m", attempts=1)
            with pytest.raises(hx.ModelServerError):
                agent.run(TASK, RecordingToolbox(tools, ep), seed=3)
    assert len(server.requests) == 3
    with FakeChatServer(script) as server:
        with open_episode(shop, store_url, clock, resume=True) as ep:
            agent = OpenAIAgent(base_url=server.base_url, model="m", attempts=1)
            output = agent.run(TASK, RecordingToolbox(tools, ep), seed=3)
    assert output.message == "Cancelled." and output.meta["model_call_count"] == 3
    assert len(server.requests) == 1  # only the unfinished third turn
    assert shop.applied == [("o1", "cancelled")]


# --------------------------------------------------------------------------------------------
# Leases.
# --------------------------------------------------------------------------------------------


def test_lease_is_exclusive_until_released_expired_or_its_holder_died(store: hx.Store):
    """A lease held by a live owner refuses others; release, expiry or the death of its holder
    on this host frees it."""
    assert store.acquire_lease("e1", owner="a")
    assert store.acquire_lease("e1", owner="a")  # its owner renews it
    assert not store.acquire_lease("e1", owner="b")
    store.release_lease("e1", owner="b")  # not b's to release
    assert not store.acquire_lease("e1", owner="b")
    store.release_lease("e1", owner="a")
    assert store.acquire_lease("e1", owner="b")
    assert store.acquire_lease("e2", owner="a", seconds=-1.0)  # already expired
    assert store.acquire_lease("e2", owner="b")
    proc = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    proc.start()
    proc.join()
    with sqlite3.connect(store.url.removeprefix("sqlite:///")) as conn:
        conn.execute(
            "INSERT INTO hx_lease VALUES ('e3', 'dead', ?, ?, 0, ?)",
            (proc.pid, socket.gethostname(), time.time() + 600),
        )
    assert store.acquire_lease("e3", owner="b")
    (row,) = [lease for lease in store.leases() if lease.episode_id == "e3"]
    assert row.owner == "b" and row.pid == os.getpid()
    with store.lease("e4", owner="a") as held:
        assert held and not store.acquire_lease("e4", owner="b")
        with store.lease("e4", owner="b") as other:
            assert not other
    assert store.acquire_lease("e4", owner="b")


# --------------------------------------------------------------------------------------------
# harness resume on a killed run.
# --------------------------------------------------------------------------------------------


class LedgerToy:
    """Counters on a DictState whose tools also log each execution to a ledger file shared by
    every process, so a test can count executions across crashes and resumes."""

    TOOL_NAMES = frozenset({"bump", "look", "risky"})

    def __init__(self, ledger: str, pause: str = "", delay: float = 0.0) -> None:
        self.state = hx.DictState({f"c/{n}": 0 for n in "abcdefgh"})
        state = self.state

        def who() -> str:  # a trial's episode; not the reference replay's (it has no run)
            ep = hx.current_episode()
            return ep.id if ep is not None and ep.run_id else ""

        def log(line: str) -> None:
            fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(fd, f"{line}\n".encode())
            os.close(fd)

        @hx.action(writes=["c/{name}"], idempotency_key=lambda a: f"{a.name}:{a.step}")
        def bump(name: str, step: int) -> int:
            """Add one to counter `name`, as step `step` of the plan."""
            time.sleep(delay)
            state[f"c/{name}"] = state[f"c/{name}"] + 1
            if who():
                log(f"{who()}\tbump\t{name}:{step}")
            return int(state[f"c/{name}"])

        @bump.postcondition
        def moved(ctx: hx.Context) -> bool:
            key = f"c/{ctx.args.name}"
            return bool(ctx.after[key] - ctx.before[key] == 1)

        @bump.compensation
        def undo(ctx: hx.Context) -> None:
            for key, value in ctx.before.items():
                state[key] = value

        def look(name: str) -> int:
            """Read counter `name`."""
            flag = Path(pause) if pause else None
            if flag is not None and flag.exists() and flag.read_text() == who():
                Path(f"{pause}.reached").write_text("yes")
                time.sleep(60)  # until the test kills the process
            return int(state[f"c/{name}"])

        @hx.action(writes=["c/{name}"])
        def risky(name: str) -> int:
            """Set counter `name` to 100; refused the first time in each episode."""
            if who():
                seen = Path(ledger).read_text() if Path(ledger).exists() else ""
                if f"{who()}\trisky-refused\n" not in seen:
                    log(f"{who()}\trisky-refused")
                    raise RuntimeError("risky refused the first time")
                log(f"{who()}\trisky\t{name}")
            state[f"c/{name}"] = 100
            return 100

        self.tools: dict[str, Any] = {"bump": bump, "look": look, "risky": risky}

    def export(self) -> dict[str, Any]:
        return self.state.to_dict()

    def close(self) -> None:
        pass


def ledger_suite(
    folder: Path, tasks: list[list[tuple[str, dict[str, Any]]]], **options: Any
) -> Path:
    """A suite on LedgerToy whose task i makes the calls tasks[i]."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "suite.json").write_text(
        json.dumps(
            {
                "name": "ledger",
                "version": "1",
                "environment": "tests.runs.test_resume:LedgerToy",
                "environment_options": options,
                "tasks": ["tasks.json"],
            }
        )
    )
    body = [
        {
            "id": f"t{i}",
            "version": "1",
            "instruction": "do the plan",
            "reference_actions": [{"name": n, "arguments": a} for n, a in calls],
        }
        for i, calls in enumerate(tasks)
    ]
    (folder / "tasks.json").write_text(
        json.dumps({"format": "harness.tasks", "version": 1, "tasks": body})
    )
    return folder


PLAN = [
    ("bump", {"name": "a", "step": 0}),
    ("look", {"name": "a"}),
    ("bump", {"name": "b", "step": 1}),
]


def killed_run(
    tmp_path: Path,
    *,
    tasks: int,
    trials: int,
    pause_in: str,
    delay: float = 0.0,
    signing_key: hx.SigningKey | None = None,
) -> Path:
    """Run a suite in a child process, SIGKILL it while episode ``pause_in`` reads; the folder."""
    ledger = tmp_path / "ledger.txt"
    pause = tmp_path / "pause"
    pause.write_text(pause_in)
    suite = ledger_suite(
        tmp_path / "suite", [PLAN] * tasks, ledger=str(ledger), pause=str(pause), delay=delay
    )
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            run_trials(
                suite,
                agent="scripted",
                trials=trials,
                logs=tmp_path / "logs",
                run_id="r1",
                signing_key=signing_key,
            )
        except BaseException:
            (tmp_path / "child-error.txt").write_text(traceback.format_exc())
            code = 3
        finally:
            os._exit(code)
    reached = Path(f"{pause}.reached")
    deadline = time.monotonic() + 60
    while not reached.exists() and time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG) != (0, 0):
            error = tmp_path / "child-error.txt"
            raise AssertionError(error.read_text() if error.exists() else "the run ended early")
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert reached.exists(), "the run never reached the pause"
    pause.unlink()
    return tmp_path / "logs" / "r1"


def executions(tmp_path: Path) -> Counter[tuple[str, ...]]:
    """Each tool execution in the ledger, counted."""
    lines = (tmp_path / "ledger.txt").read_text().splitlines()
    return Counter(tuple(line.split("\t")) for line in lines)


def test_harness_resume_finishes_a_killed_run_without_repeating_effects(tmp_path: Path):
    """`harness resume` keeps the finished trial, resumes the one killed mid-episode (its
    committed step is not run again) and runs the missing ones; every trial passes."""
    folder = killed_run(tmp_path, tasks=3, trials=2, pause_in="r1-t1-0")
    store = hx.Store(folder / "harness.db")
    assert [t.episode_id for t in store.trials("r1")] == ["r1-t0-0"]
    kept = store.trials("r1")[0].created_at
    store.close()
    result = CliRunner().invoke(main, ["resume", str(folder), "--suite", str(tmp_path / "suite")])
    assert result.exit_code == 0, result.output
    assert "kept 1, resumed 1, ran 4 missing" in result.output
    done = executions(tmp_path)
    assert set(done.values()) == {1} and len(done) == 12  # 6 episodes x 2 bumps, once each
    store = hx.Store(folder / "harness.db")
    rows = store.trials("r1")
    assert len(rows) == 6 and all(r.passed for r in rows)
    assert next(r for r in rows if r.episode_id == "r1-t0-0").created_at == kept
    assert "resume" in [r.kind for r in store.log("r1-t1-0")]
    assert store.verify_chain().ok and store.leases() == []
    assert (store.runs()[0].status, len(json.loads(store.runs()[0].evidence)["resumes"])) == (
        "finished",
        1,
    )
    store.close()
    again = CliRunner().invoke(main, ["resume", str(folder), "--trust-suite", "--json"]).output
    again = json.loads(again)
    assert len(again["kept"]) == 6 and again["resumed"] == again["started"] == []


def test_resume_with_worker_processes_finishes_the_run(tmp_path: Path):
    """`harness resume --workers 2` finishes a killed run in worker processes, each effect
    once."""
    folder = killed_run(tmp_path, tasks=2, trials=2, pause_in="r1-t1-0")
    result = CliRunner().invoke(main, ["resume", str(folder), "--workers", "2", "--trust-suite"])
    assert result.exit_code == 0, result.output
    assert "kept 1, resumed 1, ran 2 missing" in result.output
    done = executions(tmp_path)
    assert set(done.values()) == {1} and len(done) == 8


def _resume_in_child(folder: Path, out: Path) -> None:
    result = resume_run(folder, trust=True)
    out.write_text(json.dumps({"did": result.resumed + result.started, "skip": result.skipped}))


def test_two_processes_resuming_at_once_never_run_the_same_episode(tmp_path: Path):
    """Two `resume` processes started together split the work through episode leases: every
    episode is executed by exactly one of them and every effect happens once."""
    folder = killed_run(tmp_path, tasks=4, trials=3, pause_in="r1-t1-0", delay=0.01)
    ctx = multiprocessing.get_context("fork")
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    procs = [ctx.Process(target=_resume_in_child, args=(folder, out)) for out in outs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    did = [json.loads(o.read_text())["did"] for o in outs]
    assert not set(did[0]) & set(did[1])
    assert len(set(did[0]) | set(did[1])) == 11  # 12 trials, 1 finished before the kill
    done = executions(tmp_path)
    assert set(done.values()) == {1} and len(done) == 24
    store = hx.Store(folder / "harness.db")
    assert len(store.trials("r1")) == 12 and all(t.passed for t in store.trials("r1"))
    assert store.leases() == [] and store.verify_chain().ok
    store.close()


def test_escalated_trial_resumes_after_a_person_approves(tmp_path: Path):
    """`harness escalations` lists the pending decision, `resolve --approve` records who and
    why, and `harness resume` continues the episode from where it stopped."""
    suite = ledger_suite(
        tmp_path / "suite",
        [[("bump", {"name": "a", "step": 0}), ("risky", {"name": "c"})]],
        ledger=str(tmp_path / "ledger.txt"),
    )
    run_trials(suite, agent="scripted", trials=1, logs=tmp_path / "logs", run_id="r1")
    folder = str(tmp_path / "logs" / "r1")
    runner = CliRunner()
    listed = runner.invoke(main, ["escalations", folder, "--json"])
    (pending,) = json.loads(listed.output)
    assert pending["action"] == "risky" and pending["status"] == "pending"
    early = runner.invoke(main, ["resume", folder, "--suite", str(suite)])
    assert "1 waiting for a person" in early.output
    args = ["escalations", folder, "resolve", pending["id"], "--approve", "--by", "ana"]
    resolved = runner.invoke(main, [*args, "--reason", "refusal was transient"])
    assert resolved.exit_code == 0 and "approved by ana" in resolved.output
    twice = runner.invoke(main, [*args, "--reason", "again"])
    assert twice.exit_code == 2 and "already approved by ana" in twice.output
    finished = runner.invoke(main, ["resume", folder, "--trust-suite"])
    assert "resumed 1" in finished.output, finished.output
    store = hx.Store(Path(folder) / "harness.db")
    (trial,) = store.trials("r1")
    assert trial.outcome == "committed" and trial.passed
    (esc,) = store.escalations()
    assert (esc.status, esc.resolved_by, esc.resolution_reason) == (
        "approved",
        "ana",
        "refusal was transient",
    )
    store.close()
    done = executions(tmp_path)
    assert done[("r1-t0-0", "bump", "a:0")] == 1 and done[("r1-t0-0", "risky", "c")] == 1


def test_resume_refuses_bad_run_folders_and_writes_nothing(tmp_path: Path):
    """A missing folder, a database from a newer harness and a truncated database are clear
    errors naming the path and the fix; the files are left byte for byte as they were."""
    runner = CliRunner()
    missing = runner.invoke(main, ["resume", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "no run folder" in missing.output
    assert not (tmp_path / "nope").exists()
    suite = ledger_suite(tmp_path / "suite", [PLAN], ledger=str(tmp_path / "ledger.txt"))
    run_trials(suite, agent="scripted", trials=1, logs=tmp_path / "logs", run_id="r1")
    db = tmp_path / "logs" / "r1" / "harness.db"
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE hx_meta SET value = '99' WHERE key = 'schema_version'")
    conn.close()
    before = db.read_bytes()
    newer = runner.invoke(main, ["resume", str(db.parent)])
    assert newer.exit_code == 2 and "schema version 99" in newer.output
    assert "upgrade harness" in newer.output.lower() and db.read_bytes() == before
    db.write_bytes(before[: len(before) // 2])
    for name in ("harness.db-wal", "harness.db-shm"):
        with contextlib.suppress(FileNotFoundError):
            (db.parent / name).unlink()
    cut = db.read_bytes()
    truncated = runner.invoke(main, ["resume", str(db.parent)])
    assert truncated.exit_code == 2 and "damaged" in truncated.output
    assert ".recover" in truncated.output and db.read_bytes() == cut


def test_resume_loads_the_recorded_suite_only_when_told_to(tmp_path: Path):
    """A run folder whose recorded suite path was edited to another suite folder is refused by
    `harness resume` (and resume_run) without --suite or --trust-suite: nothing is imported
    from there and nothing is written; --suite names the suite to resume on instead."""
    folder = killed_run(tmp_path, tasks=2, trials=1, pause_in="r1-t1-0")
    marker = tmp_path / "imported"
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    manifest = json.loads((tmp_path / "suite" / "suite.json").read_text())
    (evil / "suite.json").write_text(json.dumps({**manifest, "environment": "evil:Env"}))
    (evil / "tasks.json").write_text((tmp_path / "suite" / "tasks.json").read_text())
    with sqlite3.connect(folder / "harness.db") as conn:
        conn.execute("UPDATE hx_run SET config = json_set(config, '$.suite_path', ?)", (str(evil),))
    conn.close()
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    unverified = CliRunner().invoke(main, ["resume", str(folder)])
    assert unverified.exit_code == 2, unverified.output
    assert "fails verification" in " ".join(unverified.output.split())
    refused = CliRunner().invoke(main, ["resume", str(folder), "--allow-unverified"])
    assert refused.exit_code == 2, refused.output
    said = " ".join(refused.output.split())
    assert f"--suite {evil}" in said and "--trust-suite" in said
    with pytest.raises(hx.SuiteError, match="not a built-in suite"):
        resume_run(folder)
    assert not marker.exists()
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before
    result = CliRunner().invoke(
        main, ["resume", str(folder), "--allow-unverified", "--suite", str(tmp_path / "suite")]
    )
    assert result.exit_code == 0 and "kept 1, resumed 1" in result.output, result.output
    assert not marker.exists()


def test_two_resumes_of_one_run_at_once_are_both_in_the_evidence(tmp_path: Path):
    """Two `harness resume` processes started at once on one interrupted run both run (the
    trials' leases share the work out, none runs twice) and both are in the run's evidence,
    in the store and in evidence.json: neither's record of itself overwrites the other's."""
    import subprocess
    import sys

    folder = killed_run(tmp_path, tasks=3, trials=1, pause_in="r1-t2-0", delay=0.05)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    command = [sys.executable, "-m", "harness", "resume", str(folder), "--trust-suite"]
    both = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0].decode() for p in both]
    assert [p.returncode for p in both] == [0, 0], outputs
    store = hx.Store(folder / "harness.db", readonly=True)
    try:
        (run,) = store.runs()
        resumes = json.loads(run.evidence)["resumes"]
        assert store.verify("r1").ok
    finally:
        store.close()
    assert sorted(r["pid"] for r in resumes) == sorted(p.pid for p in both), resumes
    written = json.loads((folder / "evidence.json").read_text())["resumes"]
    assert len(written) >= 1 and all(r in resumes for r in written)
    assert set(executions(tmp_path).values()) == {1}  # every trial's effects once


def test_a_run_record_keeps_the_resumes_another_process_wrote_since_it_read(tmp_path: Path):
    """The write of a run's row under the lock keeps resumes it did not read: two records made
    from one read, each with its own resume, written one after the other, leave both."""
    from harness.runs.lifecycle import RunRecord

    folder = killed_run(tmp_path, tasks=2, trials=1, pause_in="r1-t1-0")
    store = hx.Store(folder / "harness.db")
    try:
        (row,) = store.runs()
        config, evidence = json.loads(row.config), json.loads(row.evidence)
        records = [
            RunRecord(
                store,
                row.id,
                row.suite,
                config,
                {**evidence, "resumes": [{"at": float(i), "pid": i}]},
                created_at=row.created_at,
            )
            for i in (1, 2)
        ]
        for record in records:
            record.write("interrupted")
        (after,) = store.runs()
    finally:
        store.close()
    assert [r["pid"] for r in json.loads(after.evidence)["resumes"]] == [1, 2]
    assert records[1].evidence["resumes"] == [{"at": 1.0, "pid": 1}, {"at": 2.0, "pid": 2}]


def test_a_run_with_an_escalation_waiting_says_so_and_names_the_whole_resume_command(
    tmp_path: Path,
):
    """`harness run` of an own suite whose trial waits for a person says an escalation is
    waiting, how to see and decide it, and the resume command with the `--suite` the run needs;
    the decision names the same command, and that command, run as printed, finishes the run."""
    suite = ledger_suite(
        tmp_path / "my suite",  # (a path the printed command must quote)
        [[("bump", {"name": "a", "step": 0}), ("risky", {"name": "c"})]],
        ledger=str(tmp_path / "ledger.txt"),
    )
    logs = tmp_path / "logs"
    runner = CliRunner()
    run = runner.invoke(
        main, ["run", str(suite), "--agent", "scripted", "--trials", "1", "--logs", str(logs)]
    )
    assert run.exit_code == 4, run.output
    (folder,) = logs.iterdir()
    line = shlex.join(["harness", "resume", str(folder), "--suite", str(suite)])
    said = " ".join(run.output.split())
    assert "1 trial(s) not finished: 1 escalation(s) waiting for a person" in said
    assert f"`harness escalations {folder}` shows each and how to decide it" in said
    assert f"then `{line}` finishes them" in said
    (pending,) = json.loads(runner.invoke(main, ["escalations", str(folder), "--json"]).output)
    args = ["escalations", str(folder), "resolve", pending["id"], "--approve", "--by", "ana"]
    resolved = runner.invoke(main, [*args, "--reason", "checked"])
    assert resolved.exit_code == 0 and f"with `{line}`" in " ".join(resolved.output.split())
    finished = runner.invoke(main, shlex.split(line)[1:])
    assert finished.exit_code == 0 and "resumed 1" in finished.output, finished.output
    assert "not finished" not in finished.output

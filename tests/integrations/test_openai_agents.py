"""Actions as OpenAI Agents SDK tools, run end to end by the SDK's ScriptedModel (no network)."""

from __future__ import annotations

import asyncio
import contextvars
import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

pytest.importorskip("agents")

import agents
from agents import Agent, FunctionTool, Runner
from agents.exceptions import UserError
from agents.testing import ScriptedModel, assistant_message, function_call

import harness as hx
from harness.integrations.openai_agents import (
    RunClosed,
    RunEscalated,
    function_tool,
    tools,
)

agents.set_tracing_disabled(True)

Call = tuple[str, dict[str, Any]]
START = {"acct/a": {"balance": 100}, "acct/b": {"balance": 0}}


class Bank:
    """A small world: accounts with a balance, and the actions a model may call on it."""

    def __init__(self) -> None:
        self.state = hx.DictState({k: dict(v) for k, v in START.items()})
        self.ran: list[Call] = []  # every time a tool body ran, with its arguments
        state, ran = self.state, self.ran

        def move(account: str, amount: int) -> dict[str, Any]:
            row = state[f"acct/{account}"]
            row["balance"] += amount
            state[f"acct/{account}"] = row
            return {"account": account, "balance": row["balance"]}

        def changed_by(ctx: hx.Context, amount: int) -> bool:
            key = f"acct/{ctx.args.account}"
            return bool(ctx.after[key]["balance"] == ctx.before[key]["balance"] + amount)

        def put_back(ctx: hx.Context) -> None:
            for key, value in ctx.before.items():
                state[key] = value

        @hx.action(writes=["acct/{account}"])
        def deposit(account: str, amount: int) -> dict[str, Any]:
            """Put money into an account.

            Args:
                account: the account's id.
                amount: how much, in cents.
            """
            ran.append(("deposit", {"account": account, "amount": amount}))
            return move(account, amount)

        @hx.action(writes=["acct/{account}"])
        async def adeposit(account: str, amount: int) -> dict[str, Any]:
            """Put money into an account (from a coroutine)."""
            ran.append(("adeposit", {"account": account, "amount": amount}))
            await asyncio.sleep(0.005)  # other calls' tasks run meanwhile
            return move(account, amount)

        @hx.action(writes=["acct/{account}"])
        def withdraw(account: str, amount: int) -> dict[str, Any]:
            """Take money out of an account."""
            ran.append(("withdraw", {"account": account, "amount": amount}))
            return move(account, -amount)

        @hx.action(writes=["acct/{account}"], approval=True)
        def wire(account: str, amount: int) -> dict[str, Any]:
            """Send money out of an account to another bank (a person approves each wire)."""
            ran.append(("wire", {"account": account, "amount": amount}))
            return move(account, -amount)

        @hx.action(writes=["acct/{account}"])
        def faulty_deposit(account: str, amount: int) -> dict[str, Any]:
            """Put money into an account (but the tool books a cent too little)."""
            ran.append(("faulty_deposit", {"account": account, "amount": amount}))
            return move(account, amount - 1)

        for act in (deposit, adeposit, faulty_deposit):
            act.postcondition(lambda ctx: changed_by(ctx, ctx.args.amount))
            act.compensation(put_back)
        for act in (withdraw, wire):
            act.postcondition(lambda ctx: changed_by(ctx, -ctx.args.amount))
            act.compensation(put_back)

            @act.precondition
            def has_funds(ctx: hx.Context) -> bool:
                return bool(ctx.state.get(f"acct/{ctx.args.account}")["balance"] >= ctx.args.amount)

        self.deposit, self.adeposit, self.withdraw = deposit, adeposit, withdraw
        self.wire, self.faulty_deposit = wire, faulty_deposit

    def balances(self) -> dict[str, int]:
        return {k: v["balance"] for k, v in self.state.items()}


def call(name: str, call_id: str, **arguments: Any) -> Any:
    """One function call the model makes."""
    return function_call(name, arguments, call_id=call_id)


def model(*turns: Sequence[Any] | str) -> ScriptedModel:
    """A model that makes these calls turn by turn (a string: its final answer)."""
    return ScriptedModel([[assistant_message(t)] if isinstance(t, str) else list(t) for t in turns])


def outputs(m: ScriptedModel, turn: int) -> dict[str, str]:
    """The tool answers the model read at the start of ``turn`` (0-based), by call id."""
    given = m.calls[turn].input
    assert isinstance(given, list)
    return {
        item["call_id"]: item["output"]
        for item in given
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }


def agent_for(m: ScriptedModel, *actions: hx.Action[Any, Any]) -> Agent[Any]:
    return Agent(name="teller", instructions="Move money.", model=m, tools=tools(*actions))


@pytest.fixture
def bank() -> Bank:
    """A fresh bank."""
    return Bank()


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A store in a fresh folder."""
    return f"sqlite:///{tmp_path}/h.db"


def statuses(url: str, episode_id: str) -> list[tuple[str, str]]:
    store = hx.Store(url)
    try:
        return [(t.action, t.status) for t in store.transactions(episode_id)]
    finally:
        store.close()


class Memo(BaseModel):
    """A note on a transfer."""

    ref: str
    text: str = ""


class Signer(BaseModel):
    """Who signs."""

    name: str


# --- the tool the model sees ---


def test_tool_carries_the_actions_name_description_and_strict_schema(bank: Bank):
    """The model sees the action's name, docstring summary and schema, strict when every
    argument is required."""
    tool = function_tool(bank.deposit)
    assert isinstance(tool, FunctionTool)
    assert tool.name == "deposit" and tool.description == "Put money into an account."
    assert tool.strict_json_schema is True
    schema = tool.params_json_schema
    assert schema["properties"]["account"]["description"] == "the account's id."
    assert schema["required"] == ["account", "amount"]
    assert schema["additionalProperties"] is False
    assert bank.deposit.schema.get("additionalProperties") is not True  # the action's untouched


def test_defaulted_or_open_arguments_keep_the_schema_as_it_is():
    """An argument (or a nested model's field) with a default stays optional (not strict); an
    open dict cannot be strict, and strict=True for it is a configuration error naming the fix."""

    @hx.action(writes=["acct/{account}"])
    def note(account: str, text: str = "") -> None:
        """Add a note."""

    @hx.action(writes=["acct/{account}"])
    def tag(account: str, tags: dict[str, Any]) -> None:
        """Tag an account."""

    @hx.action(writes=["acct/{account}"])
    def transfer(account: str, memo: Memo) -> None:
        """Transfer with a memo."""

    @hx.action(writes=["acct/{account}"])
    def sign(account: str, by: Signer) -> None:
        """Sign for an account."""

    loose = function_tool(note)
    assert loose.strict_json_schema is False and loose.params_json_schema["required"] == ["account"]
    forced = function_tool(note, strict=True)
    assert forced.strict_json_schema is True
    assert forced.params_json_schema["required"] == ["account", "text"]
    assert function_tool(tag).strict_json_schema is False
    assert function_tool(transfer).strict_json_schema is False  # Memo.text has a default
    assert function_tool(sign).strict_json_schema is True  # every nested field is required
    with pytest.raises(hx.ConfigurationError, match="cannot be made strict"):
        function_tool(tag, strict=True)
    renamed = function_tool(note, name="add_note", description="Note it.")
    assert (renamed.name, renamed.description) == ("add_note", "Note it.")


def test_bad_input_is_a_configuration_error(bank: Bank):
    """A plain function, a wrong episode or two actions of one name are refused with the fix."""

    def plain(x: int) -> int:
        return x

    with pytest.raises(hx.ConfigurationError, match=r"decorate the tool function"):
        function_tool(plain)  # type: ignore[arg-type]
    with pytest.raises(hx.ConfigurationError, match="takes an hx.Episode"):
        function_tool(bank.deposit, episode="e1")  # type: ignore[arg-type]
    with pytest.raises(hx.ConfigurationError, match="two actions are named 'deposit'"):
        tools(bank.deposit, [bank.deposit])
    assert [t.name for t in tools([bank.deposit, bank.withdraw], bank.wire)] == [
        "deposit",
        "withdraw",
        "wire",
    ]


# --- end to end ---


async def test_committed_call_answers_the_model_and_is_recorded_once(bank: Bank, url: str):
    """A call commits once; the model reads the tool's result; the store and state agree."""
    m = model([call("deposit", "c1", account="a", amount=5)], "done")
    async with hx.Episode(state=bank.state, store=url, episode_id="e1") as ep:
        result = await Runner.run(agent_for(m, bank.deposit), "Put 5 in a")
    assert result.final_output == "done"
    assert json.loads(outputs(m, 1)["c1"]) == {"account": "a", "balance": 105}
    assert ep.outcome == "committed" and len(ep.committed) == 1
    assert bank.ran == [("deposit", {"account": "a", "amount": 5})]
    assert bank.balances() == {"acct/a": 105, "acct/b": 0}
    (txn,) = hx.Store(url).transactions("e1")
    assert (txn.action, txn.status, txn.args) == (
        "deposit",
        "committed",
        {"account": "a", "amount": 5},
    )
    assert txn.diff == {"acct/a": [{"balance": 100}, {"balance": 105}]}


async def test_refused_call_is_the_tools_answer_and_the_run_goes_on(bank: Bank, url: str):
    """A false precondition reaches the model as the tool's answer; it adapts and the run
    ends normally, with nothing executed for the refused call."""
    m = model(
        [call("withdraw", "c1", account="b", amount=50)],
        [call("withdraw", "c2", account="a", amount=50)],
        "done",
    )
    async with hx.Episode(state=bank.state, store=url, episode_id="e1") as ep:
        result = await Runner.run(agent_for(m, bank.withdraw), "Take 50")
    told = outputs(m, 1)["c1"]
    assert told.startswith("Error: ") and "precondition 'has_funds' is false" in told
    assert result.final_output == "done" and ep.outcome == "committed"
    assert bank.ran == [("withdraw", {"account": "a", "amount": 50})]
    assert bank.balances() == {"acct/a": 50, "acct/b": 0}
    assert statuses(url, "e1") == [("withdraw", "precondition"), ("withdraw", "committed")]


async def test_invalid_arguments_are_told_to_the_model(bank: Bank, url: str):
    """Arguments that do not match the schema, or are not JSON, are answers, not crashes."""
    m = model(
        [call("deposit", "c1", account="a", amount="lots")],
        [function_call("deposit", "{not json", call_id="c2")],
        "gave up",
    )
    async with hx.Episode(state=bank.state, store=url, episode_id="e1") as ep:
        await Runner.run(agent_for(m, bank.deposit), "Put lots in a")
    assert "Error: invalid arguments for action 'deposit': amount:" in outputs(m, 1)["c1"]
    assert outputs(m, 2)["c2"].startswith("Error: the arguments for deposit are not valid JSON")
    assert ep.outcome == "committed" and bank.ran == [] and bank.balances()["acct/a"] == 100
    assert statuses(url, "e1") == [("deposit", "invalid")]


async def test_failed_postcondition_rolls_back_and_stops_the_run(bank: Bank, url: str):
    """A silent failure under a rollback policy compensates the failed call and the earlier
    committed one, then stops the run with EpisodeClosed: the model gets no further turn."""
    m = model(
        [call("deposit", "c1", account="b", amount=30)],
        [call("faulty_deposit", "c2", account="a", amount=10)],
        "all done",  # never reached
    )
    policy = hx.Policy(decisions={"silent": "rollback"})
    with pytest.raises(hx.EpisodeClosed) as info:
        async with hx.Episode(state=bank.state, store=url, episode_id="e1", policy=policy) as ep:
            await Runner.run(agent_for(m, bank.deposit, bank.faulty_deposit), "Move money")
    assert isinstance(info.value, RunClosed) and info.value.outcome == "rolled_back"
    assert "faulty_deposit" in info.value.reason and "silent" in info.value.reason
    assert m.remaining_steps == 1
    assert ep.outcome == "rolled_back"
    assert bank.balances() == {"acct/a": 100, "acct/b": 0}  # both effects undone
    assert bank.ran == [
        ("deposit", {"account": "b", "amount": 30}),
        ("faulty_deposit", {"account": "a", "amount": 10}),
    ]
    records = hx.Store(url).transactions("e1")
    assert [(t.action, t.status, t.decision) for t in records] == [
        ("deposit", "compensated", None),
        ("faulty_deposit", "failed", "rollback"),
    ]


async def test_calls_after_the_episode_closed_stop_the_run(bank: Bank, url: str):
    """A run started on an episode already rolled back stops at its first call."""
    m = model([call("deposit", "c1", account="a", amount=5)], "done")
    with pytest.raises(hx.EpisodeClosed, match="rolled_back"):
        async with hx.Episode(state=bank.state, store=url, episode_id="e1") as ep:
            await ep.arollback()
            await Runner.run(agent_for(m, bank.deposit), "Put 5 in a")
    assert bank.ran == [] and bank.balances()["acct/a"] == 100


async def test_escalation_stops_the_run_and_resume_runs_the_approved_call_once(
    bank: Bank, url: str
):
    """An approval escalates out of Runner.run as hx.Escalated with its id; after a person
    approves, the same agent run again in the resumed episode runs the wire once and answers
    the committed deposit from the record."""

    def script() -> ScriptedModel:
        return model(
            [call("deposit", "c1", account="a", amount=5)],
            [call("wire", "c2", account="a", amount=30)],
            "sent",
        )

    first = script()
    with pytest.raises(hx.Escalated) as info:
        async with hx.Episode(state=bank.state, store=url, episode_id="e1") as ep:
            await Runner.run(agent_for(first, bank.deposit, bank.wire), "Wire 30 from a")
    assert isinstance(info.value, RunEscalated)
    assert isinstance(info.value.__cause__, hx.Escalated)
    assert ep.outcome == "escalated" and first.remaining_steps == 1
    assert bank.ran == [("deposit", {"account": "a", "amount": 5})]  # the wire did not run
    store = hx.Store(url)
    (pending,) = store.escalations(status="pending")
    assert pending.id == info.value.escalation_id and pending.action == "wire"
    store.resolve(pending.id, "approve", by="ops@example.com", reason="customer confirmed")

    again = script()
    async with hx.Episode(state=bank.state, store=url, episode_id="e1", resume=True) as resumed:
        result = await Runner.run(agent_for(again, bank.deposit, bank.wire), "Wire 30 from a")
    assert result.final_output == "sent" and resumed.outcome == "committed"
    assert json.loads(outputs(again, 1)["c1"]) == {"account": "a", "balance": 105}
    assert json.loads(outputs(again, 2)["c2"]) == {"account": "a", "balance": 75}
    assert bank.ran == [
        ("deposit", {"account": "a", "amount": 5}),
        ("wire", {"account": "a", "amount": 30}),
    ]
    assert bank.balances() == {"acct/a": 75, "acct/b": 0}
    committed = [t.action for t in store.transactions("e1") if t.status == "committed"]
    assert committed == ["deposit", "wire"]
    assert store.escalations(status="pending") == [] and store.verify_chain().ok
    store.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_parallel_calls_of_one_turn_each_commit_once_with_their_own_changes(
    bank: Bank, url: str, kind: str
):
    """Tool calls the model makes in one turn (run at once by the SDK) each commit once, in
    the order the model listed them, each attributed only its own account's change."""
    deposit = bank.deposit if kind == "sync" else bank.adeposit
    name = deposit.name
    listed = [("a", 5), ("b", 7), ("a", 11), ("b", 13)]
    m = model(
        [call(name, f"c{i}", account=acc, amount=n) for i, (acc, n) in enumerate(listed)],
        "done",
    )
    async with hx.Episode(state=bank.state, store=url, episode_id="e1") as ep:
        await Runner.run(agent_for(m, deposit), "Deposit")
    assert ep.outcome == "committed"
    assert bank.ran == [(name, {"account": acc, "amount": n}) for acc, n in listed]
    assert bank.balances() == {"acct/a": 116, "acct/b": 20}
    records = hx.Store(url).transactions("e1")
    assert [(t.status, t.args["account"], t.args["amount"]) for t in records] == [
        ("committed", acc, n) for acc, n in listed
    ]
    for t in records:
        key = f"acct/{t.args['account']}"
        assert list(t.diff) == [key]
        assert t.diff[key][1]["balance"] - t.diff[key][0]["balance"] == t.args["amount"]
    answers = outputs(m, 1)
    assert [json.loads(answers[f"c{i}"])["balance"] for i in range(4)] == [105, 7, 116, 20]


async def test_parallel_turn_with_an_escalation_resumes_in_the_recorded_order(bank: Bank, url: str):
    """A turn with a deposit and a wire held for approval: the deposit commits, the run stops;
    resumed after approval, the deposit is answered from the record and the wire runs once."""

    def script() -> ScriptedModel:
        return model(
            [
                call("deposit", "c1", account="b", amount=40),
                call("wire", "c2", account="a", amount=60),
                call("deposit", "c3", account="a", amount=1),
            ],
            "done",
        )

    with pytest.raises(hx.Escalated) as info:
        async with hx.Episode(state=bank.state, store=url, episode_id="e1"):
            await Runner.run(agent_for(script(), bank.deposit, bank.wire), "Go")
    assert bank.ran == [("deposit", {"account": "b", "amount": 40})]  # c3 never started
    store = hx.Store(url)
    store.resolve(info.value.escalation_id, "approve", by="ops")
    async with hx.Episode(state=bank.state, store=url, episode_id="e1", resume=True) as ep:
        await Runner.run(agent_for(script(), bank.deposit, bank.wire), "Go")
    assert ep.outcome == "committed" and ep.diverged is None
    assert bank.ran == [
        ("deposit", {"account": "b", "amount": 40}),
        ("wire", {"account": "a", "amount": 60}),
        ("deposit", {"account": "a", "amount": 1}),
    ]
    assert bank.balances() == {"acct/a": 41, "acct/b": 40}
    committed = [t.action for t in store.transactions("e1") if t.status == "committed"]
    assert committed == ["deposit", "wire", "deposit"]
    store.close()


def test_run_sync_inside_a_sync_episode(bank: Bank, url: str):
    """Runner.run_sync in a plain `with hx.Episode(...)` runs its calls in that episode."""
    m = model([call("deposit", "c1", account="a", amount=5)], "done")
    with hx.Episode(state=bank.state, store=url, episode_id="e1") as ep:
        result = Runner.run_sync(agent_for(m, bank.deposit), "Put 5 in a")
    assert result.final_output == "done" and ep.outcome == "committed"
    assert bank.balances()["acct/a"] == 105 and statuses(url, "e1") == [("deposit", "committed")]


async def test_tool_bound_to_an_episode_runs_there_and_no_episode_is_an_error(bank: Bank, url: str):
    """A tool given an episode runs there even where none is current; with neither, the run
    fails with the SDK's UserError caused by NotInEpisode, which names the fix."""
    lost = model([call("deposit", "c1", account="a", amount=5)], "done")
    with pytest.raises(UserError) as info:
        await Runner.run(agent_for(lost, bank.deposit), "Put 5 in a")
    assert isinstance(info.value.__cause__, hx.NotInEpisode)
    m = model([call("deposit", "c1", account="a", amount=5)], "done")
    async with hx.Episode(state=bank.state, store=url, episode_id="e1") as bound:
        agent = Agent(name="t", model=m, tools=[function_tool(bank.deposit, episode=bound)])
        empty = contextvars.Context()  # no episode is current in the run
        await asyncio.create_task(Runner.run(agent, "Put 5 in a"), context=empty)
    assert statuses(url, "e1") == [("deposit", "committed")]
    assert bank.balances()["acct/a"] == 105


async def test_rejected_call_is_told_to_the_model_on_resume(bank: Bank, url: str):
    """A wire a person rejects never runs; the resumed run's model reads who rejected it and
    why, and the episode ends committed with the earlier deposit intact."""

    def script(*then: Any) -> ScriptedModel:
        return model(
            [call("deposit", "c1", account="a", amount=5)],
            [call("wire", "c2", account="a", amount=30)],
            *then,
        )

    with pytest.raises(hx.Escalated) as info:
        async with hx.Episode(state=bank.state, store=url, episode_id="e1"):
            await Runner.run(agent_for(script(), bank.deposit, bank.wire), "Wire 30")
    store = hx.Store(url)
    store.resolve(info.value.escalation_id, "reject", by="lead", reason="customer called back")
    again = script("not sent")
    async with hx.Episode(state=bank.state, store=url, episode_id="e1", resume=True) as ep:
        result = await Runner.run(agent_for(again, bank.deposit, bank.wire), "Wire 30")
    assert outputs(again, 2)["c2"] == (
        "Error: action 'wire' was rejected by lead: customer called back"
    )
    assert result.final_output == "not sent" and ep.outcome == "committed"
    assert bank.ran == [("deposit", {"account": "a", "amount": 5})]
    assert bank.balances() == {"acct/a": 105, "acct/b": 0}
    store.close()


async def test_streamed_run_stops_with_the_escalation(bank: Bank, url: str):
    """Runner.run_streamed raises hx.Escalated from stream_events(), as Runner.run does."""
    m = model([call("wire", "c1", account="a", amount=30)], "sent")
    with pytest.raises(hx.Escalated) as info:
        async with hx.Episode(state=bank.state, store=url, episode_id="e1") as ep:
            streamed = Runner.run_streamed(agent_for(m, bank.wire), "Wire 30")
            async for _ in streamed.stream_events():
                pass
    assert info.value.escalation_id == ep.escalation_id and ep.outcome == "escalated"
    assert bank.ran == []


async def test_call_in_flight_when_the_run_fails_finishes_instead_of_hanging_in_doubt(
    bank: Bank, url: str
):
    """When another tool of the same turn fails the run, a call already running is not cut
    off: it commits (or would be undone), and the episode waits for it before it ends."""
    log: list[str] = []

    @hx.action(writes=["acct/{account}"])
    async def slow_deposit(account: str, amount: int) -> dict[str, Any]:
        """Put money into an account, slowly."""
        log.append("start")
        await asyncio.sleep(0.05)
        row = bank.state[f"acct/{account}"]
        bank.state[f"acct/{account}"] = {"balance": row["balance"] + amount}
        log.append("end")
        return {"ok": True}

    @agents.function_tool(failure_error_function=None)
    def audit() -> str:
        """Audit the books."""
        raise RuntimeError("auditor unavailable")

    m = model([call("slow_deposit", "c1", account="a", amount=5), call("audit", "c2")], "done")
    agent = Agent(name="t", model=m, tools=[function_tool(slow_deposit), audit])
    async with hx.Episode(state=bank.state, store=url, episode_id="e1") as ep:
        with pytest.raises(UserError, match="auditor unavailable"):
            await Runner.run(agent, "Deposit and audit")
        assert log == ["start"]  # the run stopped while the deposit was still running
    assert log == ["start", "end"] and ep.outcome == "committed" and ep.in_doubt == []
    assert bank.balances()["acct/a"] == 105
    assert statuses(url, "e1") == [("slow_deposit", "committed")]


def test_example_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """examples/integrations/openai_agents_example.py runs offline and prints what it says."""
    path = Path(__file__).resolve().parents[2] / "examples/integrations/openai_agents_example.py"
    spec = importlib.util.spec_from_file_location("openai_agents_example", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    asyncio.run(example.main(f"sqlite:///{tmp_path}/h.db"))
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("escalated: ")
    assert out[1] == "wired 30 committed {'balance': 20}"
    assert [line.rsplit(" ", 1)[1] for line in out[2:]] == [
        "precondition",
        "committed",
        "held",
        "committed",
    ]


async def test_resumed_run_whose_model_asks_for_something_else_runs_nothing(bank: Bank, url: str):
    """On resume, a model that now calls other arguments than the record holds fails the run
    with hx.Diverged (the SDK's UserError carries it); nothing runs, nothing runs twice."""
    first = model(
        [call("deposit", "c1", account="a", amount=5)],
        [call("wire", "c2", account="a", amount=30)],
    )
    with pytest.raises(hx.Escalated) as info:
        async with hx.Episode(state=bank.state, store=url, episode_id="e1"):
            await Runner.run(agent_for(first, bank.deposit, bank.wire), "Wire 30")
    hx.Store(url).resolve(info.value.escalation_id, "approve", by="ops")
    other = model([call("deposit", "c1", account="a", amount=500)], "done")
    with pytest.raises(UserError) as failed:
        async with hx.Episode(state=bank.state, store=url, episode_id="e1", resume=True) as ep:
            await Runner.run(agent_for(other, bank.deposit, bank.wire), "Wire 30")
    assert isinstance(failed.value.__cause__, hx.Diverged) and ep.diverged is not None
    assert bank.ran == [("deposit", {"account": "a", "amount": 5})]
    assert bank.balances() == {"acct/a": 105, "acct/b": 0}

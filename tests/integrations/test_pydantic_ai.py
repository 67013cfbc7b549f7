"""Actions as Pydantic AI tools, run end to end by Pydantic AI's FunctionModel (no network)."""

from __future__ import annotations

import asyncio
import contextvars
import runpy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent, Tool
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import harness as hx
from harness.integrations.pydantic_ai import as_tool, toolset

Call = tuple[str, dict[str, Any]]


class Bank:
    """A small world: accounts with a balance, and the actions a model may call on it."""

    def __init__(self) -> None:
        self.state = hx.DictState({"accounts/a": {"balance": 0}, "accounts/b": {"balance": 0}})
        self.ran: list[Call] = []  # every time a tool body ran, with its arguments
        self.running = 0
        self.overlap = 0  # the most tool bodies running at once

        state, ran = self.state, self.ran

        @hx.action(writes=["accounts/{account}"])
        async def deposit(account: str, amount: int) -> dict[str, Any]:
            """Put money into an account.

            Args:
                account: the account's id.
                amount: how much, in cents.
            """
            ran.append(("deposit", {"account": account, "amount": amount}))
            self.running += 1
            self.overlap = max(self.overlap, self.running)
            try:
                balance = state[f"accounts/{account}"]["balance"]
                await asyncio.sleep(0.01)  # a read-then-write that racing calls would break
                state[f"accounts/{account}"] = {"balance": balance + amount}
            finally:
                self.running -= 1
            return {"account": account, "balance": balance + amount}

        @deposit.precondition
        def account_exists(ctx: hx.Context) -> bool:
            """the account does not exist"""
            return ctx.state.get(f"accounts/{ctx.args.account}") is not None

        @deposit.postcondition
        def balance_grew(ctx: hx.Context) -> bool:
            key = f"accounts/{ctx.args.account}"
            return bool(ctx.after[key]["balance"] == ctx.before[key]["balance"] + ctx.args.amount)

        @deposit.compensation
        def put_back(ctx: hx.Context) -> None:
            for key, value in ctx.before.items():
                state[key] = value

        @hx.action(writes=["accounts/{account}"])
        def charge_fee(account: str, fee: int) -> str:
            """Charge a fee (its tool takes the fee twice: its postcondition catches it)."""
            ran.append(("charge_fee", {"account": account, "fee": fee}))
            state[f"accounts/{account}"] = {
                "balance": state[f"accounts/{account}"]["balance"] - 2 * fee
            }
            return "charged"

        @charge_fee.postcondition
        def charged_once(ctx: hx.Context) -> bool:
            key = f"accounts/{ctx.args.account}"
            return bool(ctx.after[key]["balance"] == ctx.before[key]["balance"] - ctx.args.fee)

        charge_fee.compensation(put_back)

        @hx.action(writes=["accounts/{account}"], approval=True)
        def close_account(account: str) -> str:
            """Close an account (a person approves every call)."""
            ran.append(("close_account", {"account": account}))
            del state[f"accounts/{account}"]
            return f"closed {account}"

        self.deposit, self.charge_fee, self.close_account = deposit, charge_fee, close_account

    def tools(self) -> list[Any]:
        """The actions as Pydantic AI tools."""
        return [as_tool(a) for a in (self.deposit, self.charge_fee, self.close_account)]


class Script:
    """A FunctionModel's function: one scripted response per model request, the tool calls
    of a response all at once; it keeps every request it was sent."""

    def __init__(self, *turns: Sequence[Call] | str) -> None:
        self.turns = turns
        self.requests: list[list[ModelMessage]] = []
        self.tools: list[Any] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests.append(list(messages))
        self.tools = info.function_tools
        turn = self.turns[sum(1 for m in messages if isinstance(m, ModelResponse))]
        if isinstance(turn, str):
            return ModelResponse(parts=[TextPart(turn)])
        return ModelResponse(
            parts=[
                ToolCallPart(name, args, tool_call_id=f"c{i}")
                for i, (name, args) in enumerate(turn)
            ]
        )

    def returns(self, request: int) -> list[ToolReturnPart]:
        """The tool results the model read in its ``request``-th request (from 0)."""
        last = self.requests[request][-1]
        assert isinstance(last, ModelRequest)
        return [p for p in last.parts if isinstance(p, ToolReturnPart)]


def agent_for(
    bank: Bank, script: Script, tools: Callable[[], Any] | None = None
) -> Agent[None, str]:
    """An agent whose model is the script, with the bank's actions as tools."""
    return Agent(FunctionModel(script), tools=(tools or bank.tools)())


@pytest.fixture
def bank() -> Bank:
    """A fresh bank."""
    return Bank()


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A store URL in a fresh folder."""
    return f"sqlite:///{tmp_path}/h.db"


def statuses(url: str, episode_id: str) -> list[tuple[str, str]]:
    """The episode's transactions as (action, status), in order."""
    return [(t.action, t.status) for t in hx.Store(url).transactions(episode_id)]


async def test_the_model_sees_the_actions_name_description_and_schema(bank: Bank, url: str):
    """The tool definitions the model receives are the actions' own name, description and
    ``action.schema``, argument descriptions included."""
    script = Script("nothing to do")
    async with hx.Episode(state=bank.state, store=url):
        await agent_for(bank, script).run("hi")
    seen = {t.name: t for t in script.tools}
    for act in (bank.deposit, bank.charge_fee, bank.close_account):
        assert seen[act.name].description == act.description
        assert seen[act.name].parameters_json_schema == act.schema
    assert seen["deposit"].parameters_json_schema["properties"]["amount"] == {
        "type": "integer",
        "description": "how much, in cents.",
    }


async def test_a_committed_call_answers_the_model_and_is_recorded(bank: Bank, url: str):
    """A call the model makes commits once; the model reads the tool's result and the store
    holds the committed transaction with its diff."""
    script = Script([("deposit", {"account": "a", "amount": 10})], "done")
    async with hx.Episode(state=bank.state, store=url, episode_id="e1") as ep:
        result = await agent_for(bank, script).run("put 10 in a")
    assert result.output == "done" and ep.outcome == "committed"
    (answer,) = script.returns(1)
    assert answer.outcome == "success" and answer.content == {"account": "a", "balance": 10}
    (txn,) = hx.Store(url).transactions("e1")
    assert (txn.action, txn.status, txn.args) == (
        "deposit",
        "committed",
        {"account": "a", "amount": 10},
    )
    assert txn.diff == {"accounts/a": [{"balance": 0}, {"balance": 10}]}
    assert bank.state["accounts/a"] == {"balance": 10} and len(bank.ran) == 1


async def test_refused_calls_are_failed_results_the_model_reads_and_goes_on(bank: Bank, url: str):
    """A false precondition and invalid arguments reach the model as failed tool results
    naming why; nothing ran, the run goes on and the model's next call commits."""
    script = Script(
        [("deposit", {"account": "c", "amount": 5}), ("deposit", {"account": "a", "amount": "x"})],
        [("deposit", {"account": "a", "amount": 5})],
        "done",
    )
    async with hx.Episode(state=bank.state, store=url, episode_id="e1") as ep:
        result = await agent_for(bank, script).run("deposit")
    assert result.output == "done" and ep.outcome == "committed"
    missing, invalid = script.returns(1)
    assert missing.outcome == "failed" and "the account does not exist" in missing.content
    assert invalid.outcome == "failed" and "amount" in invalid.content
    assert "invalid arguments" in invalid.content
    assert script.returns(2)[0].outcome == "success"
    assert statuses(url, "e1") == [
        ("deposit", "precondition"),
        ("deposit", "invalid"),
        ("deposit", "committed"),
    ]
    assert bank.ran == [("deposit", {"account": "a", "amount": 5})]


async def test_refusals_spend_no_retry_budget(bank: Bank, url: str):
    """A model refused more often than Pydantic AI's retry limit still finishes its run (a
    ``ModelRetry`` answer would have ended it with UnexpectedModelBehavior)."""
    refused = [("deposit", {"account": "c", "amount": 1})]
    script = Script(refused, refused, refused, refused, "gave up")
    async with hx.Episode(state=bank.state, store=url, episode_id="e1"):
        result = await agent_for(bank, script).run("deposit into c")
    assert result.output == "gave up"
    assert [s for _, s in statuses(url, "e1")] == ["precondition"] * 4


async def test_a_failed_postcondition_rolls_the_episode_back(bank: Bank, url: str):
    """When a call's postcondition fails and the policy rolls back, the call is undone, the
    earlier committed deposit is compensated, the model reads why, and the state is as before."""
    script = Script(
        [("deposit", {"account": "a", "amount": 10})],
        [("charge_fee", {"account": "a", "fee": 3})],
        "sorry",
    )
    policy = hx.Policy(decisions={"silent": "rollback"})
    async with hx.Episode(state=bank.state, store=url, policy=policy, episode_id="e1") as ep:
        result = await agent_for(bank, script).run("deposit then charge")
    assert result.output == "sorry" and ep.outcome == "rolled_back"
    (told,) = script.returns(2)
    assert told.outcome == "failed" and "silent" in told.content and "rollback" in told.content
    txns = hx.Store(url).transactions("e1")
    assert [(t.action, t.status) for t in txns] == [
        ("deposit", "compensated"),
        ("charge_fee", "failed"),
    ]
    assert (txns[1].failure_class, txns[1].decision) == ("silent", "rollback")
    assert bank.state["accounts/a"] == {"balance": 0} and bank.state["accounts/b"] == {"balance": 0}
    assert [name for name, _ in bank.ran] == ["deposit", "charge_fee"]  # nothing ran twice


async def test_a_call_after_the_rollback_stops_the_run(bank: Bank, url: str):
    """A call made after the episode rolled back runs nothing: EpisodeClosed ends the run."""
    script = Script(
        [("charge_fee", {"account": "a", "fee": 3})],
        [("deposit", {"account": "a", "amount": 10})],
        "never",
    )
    policy = hx.Policy(decisions={"silent": "rollback"})
    async with hx.Episode(state=bank.state, store=url, policy=policy, episode_id="e1") as ep:
        with pytest.raises(hx.EpisodeClosed):
            await agent_for(bank, script).run("charge then deposit")
    assert ep.outcome == "rolled_back"
    assert [name for name, _ in bank.ran] == ["charge_fee"]
    assert bank.state["accounts/a"] == {"balance": 0}


async def test_an_escalation_stops_the_run_and_resume_runs_the_approved_call_once(
    bank: Bank, url: str
):
    """A call held for approval raises hx.Escalated out of agent.run; after a person approves,
    the same agent resumed in the episode gets the committed deposit from the record (not run
    again) and the approved call runs once."""
    script = Script(
        [("deposit", {"account": "b", "amount": 10})],
        [("close_account", {"account": "a"})],
        "closed",
    )
    with pytest.raises(hx.Escalated) as info:
        async with hx.Episode(state=bank.state, store=url, episode_id="e1") as ep:
            await agent_for(bank, script).run("deposit into b, close a")
    assert ep.outcome == "escalated"
    store = hx.Store(url)
    (pending,) = store.escalations(status="pending")
    assert pending.id == info.value.escalation_id and pending.action == "close_account"
    assert "accounts/a" in bank.state and len(bank.ran) == 1
    store.resolve(pending.id, "approve", by="ops@example.com", reason="customer asked")

    again = Script(*script.turns)
    async with hx.Episode(state=bank.state, store=url, episode_id="e1", resume=True) as ep:
        result = await agent_for(bank, again).run("deposit into b, close a")
    assert result.output == "closed" and ep.outcome == "committed"
    assert again.returns(1)[0].content == {"account": "b", "balance": 10}  # from the record
    assert again.returns(2)[0].content == "closed a"
    assert bank.ran == [
        ("deposit", {"account": "b", "amount": 10}),
        ("close_account", {"account": "a"}),
    ]
    assert "accounts/a" not in bank.state and bank.state["accounts/b"] == {"balance": 10}
    committed = [(t.action, t.status) for t in store.transactions("e1") if t.status != "held"]
    assert committed == [("deposit", "committed"), ("close_account", "committed")]
    assert store.verify_chain().ok
    store.close()


async def test_a_rejected_call_is_a_failed_result_on_resume(bank: Bank, url: str):
    """After a person rejects the held call, the resumed run tells the model who rejected it
    and why, runs nothing, and the run finishes."""
    script = Script([("close_account", {"account": "a"})], "kept it")
    with pytest.raises(hx.Escalated) as info:
        async with hx.Episode(state=bank.state, store=url, episode_id="e1"):
            await agent_for(bank, script).run("close a")
    hx.Store(url).resolve(info.value.escalation_id, "reject", by="lead", reason="has a loan")
    again = Script(*script.turns)
    async with hx.Episode(state=bank.state, store=url, episode_id="e1", resume=True):
        result = await agent_for(bank, again).run("close a")
    assert result.output == "kept it"
    (told,) = again.returns(1)
    assert told.outcome == "failed" and "rejected by lead: has a loan" in told.content
    assert bank.ran == [] and "accounts/a" in bank.state


async def test_parallel_calls_in_one_response_each_commit_once_with_their_own_changes(
    bank: Bank, url: str
):
    """Two deposits into one account in one model response, run by Pydantic AI as concurrent
    tasks, commit once each: their tools never overlap, and each diff holds its own change."""
    script = Script(
        [("deposit", {"account": "a", "amount": 10}), ("deposit", {"account": "a", "amount": 20})],
        "done",
    )
    async with hx.Episode(state=bank.state, store=url, episode_id="e1") as ep:
        await agent_for(bank, script).run("two deposits")
    assert ep.outcome == "committed"
    assert bank.state["accounts/a"] == {"balance": 30} and bank.overlap == 1
    assert sorted(p.outcome for p in script.returns(1)) == ["success", "success"]
    txns = hx.Store(url).transactions("e1")
    assert [t.status for t in txns] == ["committed", "committed"]
    first, second = txns
    start = first.diff["accounts/a"][1]["balance"]
    assert first.diff == {"accounts/a": [{"balance": 0}, {"balance": start}]}
    assert second.diff == {"accounts/a": [{"balance": start}, {"balance": 30}]}
    assert first.args["amount"] == start and second.args["amount"] == 30 - start
    assert sorted(t.args["amount"] for t in txns) == [10, 20]
    assert len(bank.ran) == 2


async def test_calls_of_one_response_take_the_episode_in_the_order_the_model_made_them(
    bank: Bank, url: str
):
    """Sync and async actions called in one response are recorded in the model's order (an
    async call does not overtake a sync one waiting for its worker thread)."""
    calls: list[Call] = [
        ("charge_fee", {"account": "a", "fee": 0}),
        ("deposit", {"account": "a", "amount": 10}),
        ("charge_fee", {"account": "b", "fee": 0}),
        ("deposit", {"account": "b", "amount": 5}),
    ]
    script = Script(calls, "done")
    async with hx.Episode(state=bank.state, store=url, episode_id="e1"):
        await agent_for(bank, script).run("fees and deposits")
    assert [(t.action, t.args) for t in hx.Store(url).transactions("e1")] == calls
    assert bank.ran == calls


@pytest.mark.parametrize("held_first", [False, True], ids=["deposit_first", "held_first"])
async def test_an_escalation_among_parallel_calls_resumes_in_the_same_order(
    bank: Bank, url: str, held_first: bool
):
    """A response with a deposit and a call held for approval stops the run; after approval
    the resumed run repeats the record's order, so each call runs exactly once (a deposit
    after the held call never started, and runs on resume)."""
    calls: list[Call] = [
        ("deposit", {"account": "b", "amount": 10}),
        ("close_account", {"account": "a"}),
    ]
    if held_first:
        calls.reverse()
    script = Script(calls, "done")
    with pytest.raises(hx.Escalated) as info:
        async with hx.Episode(state=bank.state, store=url, episode_id="e1"):
            await agent_for(bank, script).run("deposit into b, close a")
    assert bank.ran == ([] if held_first else [calls[0]])
    hx.Store(url).resolve(info.value.escalation_id, "approve", by="ops")
    again = Script(*script.turns)
    async with hx.Episode(state=bank.state, store=url, episode_id="e1", resume=True) as ep:
        assert (await agent_for(bank, again).run("deposit into b, close a")).output == "done"
    assert ep.outcome == "committed" and bank.ran == calls
    assert [p.outcome for p in again.returns(1)] == ["success", "success"]
    assert "accounts/a" not in bank.state and bank.state["accounts/b"] == {"balance": 10}
    done = [t.action for t in hx.Store(url).transactions("e1") if t.status == "committed"]
    assert sorted(done) == ["close_account", "deposit"]


async def test_a_call_in_flight_when_a_sibling_tool_raises_still_commits(bank: Bank, url: str):
    """When another tool of the same response raises and Pydantic AI cancels the deposit's
    task, the deposit's transaction still ends in a commit (not in doubt), once; the error
    ends the run."""

    def boom() -> str:
        """Fails at once."""
        raise RuntimeError("boom")

    script = Script([("deposit", {"account": "a", "amount": 10}), ("boom", {})], "never")
    agent = Agent(FunctionModel(script), tools=[as_tool(bank.deposit), Tool(boom)])
    with pytest.raises(RuntimeError, match="boom"):
        async with hx.Episode(state=bank.state, store=url, episode_id="e1") as ep:
            await agent.run("deposit and fail")
    assert ep.outcome == "failed" and ep.in_doubt == []
    assert statuses(url, "e1") == [("deposit", "committed")]
    assert bank.state["accounts/a"] == {"balance": 10} and len(bank.ran) == 1


async def test_an_agent_run_inside_an_action_is_part_of_that_call(bank: Bank, url: str):
    """An action whose tool runs another agent with actions of the same episode does not wait
    for itself: the inner calls are part of the outer call, recorded in its diff."""
    inner = Agent(
        FunctionModel(Script([("deposit", {"account": "a", "amount": 3})], "deposited")),
        tools=[as_tool(bank.deposit)],
    )

    @hx.action(writes=["accounts/*"])
    async def delegate(task: str) -> str:
        """Hand a task to a helper agent."""
        return (await inner.run(task)).output

    outer = Agent(
        FunctionModel(Script([("delegate", {"task": "deposit 3 into a"})], "done")),
        tools=[as_tool(delegate)],
    )
    async with hx.Episode(state=bank.state, store=url, episode_id="e1"):
        assert (await outer.run("delegate")).output == "done"
    (txn,) = hx.Store(url).transactions("e1")
    assert (txn.action, txn.status, txn.result) == ("delegate", "committed", "deposited")
    assert txn.diff == {"accounts/a": [{"balance": 0}, {"balance": 3}]}


async def test_a_toolset_of_actions_and_an_explicit_episode(bank: Bank, url: str):
    """``toolset(...)`` gives the actions as one FunctionToolset, and ``episode=`` runs calls in
    that episode from a context where none is current."""
    script = Script([("deposit", {"account": "b", "amount": 7})], "done")
    async with hx.Episode(state=bank.state, store=url, episode_id="e1") as ep:
        agent = Agent(
            FunctionModel(script), toolsets=[toolset([bank.deposit, bank.charge_fee], episode=ep)]
        )
        elsewhere = contextvars.Context()  # no episode current there
        result = await asyncio.get_running_loop().create_task(
            agent.run("deposit into b"), context=elsewhere
        )
    assert result.output == "done"
    assert {t.name for t in script.tools} == {"deposit", "charge_fee"}
    assert statuses(url, "e1") == [("deposit", "committed")]
    assert bank.state["accounts/b"] == {"balance": 7}


def test_run_sync_in_a_sync_episode(bank: Bank, url: str):
    """``agent.run_sync`` inside a plain ``with hx.Episode(...)`` runs each call in it."""
    script = Script([("charge_fee", {"account": "a", "fee": 0})], "done")
    try:
        with hx.Episode(state=bank.state, store=url, episode_id="e1"):
            assert agent_for(bank, script).run_sync("no fee").output == "done"
    finally:  # run_sync leaves the event loop it made open and current, for the next run
        loop = asyncio.get_event_loop_policy().get_event_loop()
        asyncio.set_event_loop(None)
        loop.close()
    assert statuses(url, "e1") == [("charge_fee", "committed")]


async def test_a_call_outside_any_episode_says_how_to_fix_it(bank: Bank):
    """A tool called where no episode is current stops the run with NotInEpisode."""
    script = Script([("deposit", {"account": "a", "amount": 1})], "done")
    with pytest.raises(hx.NotInEpisode, match="outside an episode"):
        await agent_for(bank, script).run("deposit")
    assert bank.ran == []


def test_bad_input_is_a_configuration_error(bank: Bank):
    """A plain function, or two actions of one name, are refused with the fix named."""

    def plain(x: int) -> int:
        return x

    with pytest.raises(hx.ConfigurationError, match=r"@hx\.action"):
        as_tool(plain)  # type: ignore[arg-type]
    with pytest.raises(hx.ConfigurationError, match=r"@hx\.action"):
        toolset(bank.deposit, plain)  # type: ignore[arg-type]
    with pytest.raises(hx.ConfigurationError, match="named 'deposit'"):
        toolset(bank.deposit, bank.deposit)


def test_the_example_runs_as_its_docstring_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """examples/integrations/pydantic_ai_example.py refuses the deposit into a missing account,
    commits the other, and prints both records."""
    path = (
        Path(__file__).resolve().parents[2] / "examples" / "integrations" / "pydantic_ai_example.py"
    )
    example = runpy.run_path(str(path), run_name="example")
    asyncio.run(example["main"](f"sqlite:///{tmp_path}/h.db"))
    assert capsys.readouterr().out.splitlines() == [
        "done: {'account': 'a', 'balance': 10}",
        "deposit {'account': 'z', 'amount': 10} precondition",
        "deposit {'account': 'a', 'amount': 10} committed",
    ]

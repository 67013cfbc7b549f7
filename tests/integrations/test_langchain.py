"""LangChain tools and LangGraph threads: actions run as transactions of the thread's episode."""

from __future__ import annotations

import asyncio
import json
import runpy
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langgraph")

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

import harness as hx
from harness.integrations import langchain as hxl


# --- a scripted chat model and a bank ---
class ScriptedModel(BaseChatModel):
    """A chat model that answers its n-th turn of a conversation with ``turns[n]``.

    The turn is counted from the AI messages already in the conversation, so a graph resumed
    from its checkpoint gets the same answers it would have got in one run.
    """

    turns: list[AIMessage]

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, **kw: Any) -> ChatResult:
        n = sum(isinstance(m, AIMessage) for m in messages)
        reply = self.turns[n] if n < len(self.turns) else AIMessage(content="done")
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def bind_tools(self, tools: Sequence[Any], **kw: Any) -> ScriptedModel:  # type: ignore[override]
        return self


def calls(*calls: tuple[str, dict[str, Any]]) -> AIMessage:
    """An AI message asking for these tool calls (run in parallel by ToolNode)."""
    return AIMessage(
        content="",
        tool_calls=[
            {"name": name, "args": args, "id": f"call-{name}-{i}"}
            for i, (name, args) in enumerate(calls)
        ],
    )


def react_graph(model: BaseChatModel, tools: list[StructuredTool]) -> Any:
    """The usual tool loop: the model, then its tool calls in a ToolNode, until it answers."""

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.bind_tools(tools).invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=InMemorySaver())


class Bank:
    """Accounts on a DictState, and actions that count how often their tools really run."""

    def __init__(self, state: Any = None) -> None:
        self.state = state or hx.DictState(
            {"accounts/a": {"balance": 0}, "accounts/b": {"balance": 0}}
        )
        self.runs: dict[str, int] = {}
        self.threads: set[int] = set()

        def deposit(account: str, amount: int) -> dict[str, Any]:
            """Deposit money into an account.

            Args:
                account: the account's name.
                amount: how much, in whole units.
            """
            return self._move("deposit", account, amount)

        def withdraw(account: str, amount: int) -> dict[str, Any]:
            """Withdraw money from an account; a person approves amounts over 100."""
            return self._move("withdraw", account, -amount)

        def deposit_lost(account: str, amount: int) -> dict[str, Any]:
            """Deposit through a gateway that loses the money and says it worked."""
            self.runs["deposit_lost"] = self.runs.get("deposit_lost", 0) + 1
            return {"account": account, "ok": True}

        self.deposit = self._checked(hx.action(writes=["accounts/{account}"])(deposit), +1)
        self.withdraw = self._checked(
            hx.action(writes=["accounts/{account}"], approval=lambda ctx: ctx.args.amount > 100)(
                withdraw
            ),
            -1,
        )
        self.deposit_lost = self._checked(
            hx.action(writes=["accounts/{account}"])(deposit_lost), +1
        )

    def _move(self, name: str, account: str, delta: int) -> dict[str, Any]:
        self.runs[name] = self.runs.get(name, 0) + 1
        self.threads.add(threading.get_ident())
        row = dict(self.state.get(f"accounts/{account}"))
        row["balance"] += delta
        self.state[f"accounts/{account}"] = row
        return {"account": account, "balance": row["balance"]}

    def _checked(self, action: hx.Action[Any, Any], sign: int) -> hx.Action[Any, Any]:
        @action.precondition
        def amount_is_positive(ctx: hx.Context) -> bool:
            """the amount must be positive"""
            return bool(ctx.args.amount > 0)

        @action.postcondition
        def balance_moved(ctx: hx.Context) -> bool:
            key = f"accounts/{ctx.args.account}"
            moved = ctx.after[key]["balance"] - ctx.before[key]["balance"]
            return bool(moved == sign * ctx.args.amount)

        @action.compensation
        def put_back(ctx: hx.Context) -> None:
            for key, value in ctx.before.items():
                self.state[key] = value

        return action

    def balance(self, account: str) -> int:
        return int(self.state.get(f"accounts/{account}")["balance"])

    @property
    def tools(self) -> list[StructuredTool]:
        return hxl.as_tools(self.deposit, self.withdraw, self.deposit_lost)


def tool_messages(out: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in out["messages"] if isinstance(m, ToolMessage)]


THREAD = {"configurable": {"thread_id": "t1"}}


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/h.db"


# --- the tool ---
def test_tool_carries_the_actions_name_description_and_schema():
    """as_tool gives the model the action's name, docstring summary and argument schema."""
    bank = Bank()
    tool = hxl.as_tool(bank.deposit)
    assert tool.name == "deposit"
    assert tool.description == "Deposit money into an account."
    assert tool.args_schema == bank.deposit.schema
    assert tool.args["amount"] == {"type": "integer", "description": "how much, in whole units."}
    assert tool.func is not None and tool.coroutine is not None
    with pytest.raises(hx.ConfigurationError, match="takes an @hx.action"):
        hxl.as_tool(lambda x: x)  # type: ignore[arg-type]


def test_tool_outside_an_episode_says_how_to_open_one():
    """Invoking the tool with no episode current raises NotInEpisode naming the fix."""
    tool = hxl.as_tool(Bank().deposit)
    with pytest.raises(hx.NotInEpisode, match="outside an episode"):
        tool.invoke({"account": "a", "amount": 1})


def test_committed_call_answers_the_model_and_is_recorded(url: str):
    """A tool call the model makes commits once; the ToolMessage holds the result as JSON
    and the value as its artifact; the thread's episode is committed."""
    bank = Bank()
    model = ScriptedModel(turns=[calls(("deposit", {"account": "a", "amount": 10}))])
    out = hxl.invoke(
        react_graph(model, bank.tools),
        {"messages": [("user", "pay 10")]},
        THREAD,
        state=bank.state,
        store=url,
    )
    (msg,) = tool_messages(out)
    assert msg.status == "success"
    assert json.loads(msg.content) == {"account": "a", "balance": 10}  # type: ignore[arg-type]
    assert msg.artifact == {"account": "a", "balance": 10}
    assert out["messages"][-1].content == "done"
    assert bank.balance("a") == 10 and bank.runs == {"deposit": 1}
    store = hx.Store(url)
    assert store.episode("t1").status == "committed"  # type: ignore[union-attr]
    assert [(t.action, t.status, t.args) for t in store.transactions("t1")] == [
        ("deposit", "committed", {"account": "a", "amount": 10})
    ]
    store.close()


def test_refused_calls_are_answers_the_model_reads(url: str):
    """A false precondition and invalid arguments come back as error ToolMessages with the
    refusal's text; nothing runs, both refusals are recorded, and the model goes on."""
    bank = Bank()
    model = ScriptedModel(
        turns=[
            calls(
                ("deposit", {"account": "a", "amount": -5}),
                ("deposit", {"account": "a", "amount": "lots"}),
            ),
            calls(("deposit", {"account": "a", "amount": 5})),
        ]
    )
    out = hxl.invoke(
        react_graph(model, bank.tools),
        {"messages": [("user", "pay")]},
        THREAD,
        state=bank.state,
        store=url,
    )
    refused, invalid, ok = tool_messages(out)
    assert refused.status == "error" and invalid.status == "error" and ok.status == "success"
    assert "precondition 'amount_is_positive' is false: the amount must be positive" in str(
        refused.content
    )
    assert str(refused.content).startswith("Error: ")
    assert "invalid arguments for action 'deposit': amount" in str(invalid.content)
    assert bank.balance("a") == 5 and bank.runs == {"deposit": 1}
    store = hx.Store(url)
    assert sorted(t.status for t in store.transactions("t1")) == [
        "committed",
        "invalid",
        "precondition",
    ]
    assert store.episode("t1").status == "committed"  # type: ignore[union-attr]
    store.close()


def test_failed_postcondition_rolls_the_thread_back(url: str):
    """A call whose postcondition fails rolls the episode back: the earlier committed deposit
    is compensated, the state is as before, the model is told, and the thread is closed."""
    bank = Bank()
    model = ScriptedModel(
        turns=[
            calls(("deposit", {"account": "a", "amount": 10})),
            calls(("deposit_lost", {"account": "b", "amount": 7})),
        ]
    )
    graph = react_graph(model, bank.tools)
    policy = hx.Policy(decisions={"silent": "rollback"})
    out = hxl.invoke(
        graph, {"messages": [("user", "pay")]}, THREAD, state=bank.state, store=url, policy=policy
    )
    first, lost = tool_messages(out)
    assert first.status == "success" and lost.status == "error"
    assert "silent, decision rollback" in str(lost.content)
    assert bank.balance("a") == 0 and bank.balance("b") == 0
    assert bank.runs == {"deposit": 1, "deposit_lost": 1}
    store = hx.Store(url)
    assert store.episode("t1").status == "rolled_back"  # type: ignore[union-attr]
    assert [(t.action, t.status) for t in store.transactions("t1")] == [
        ("deposit", "compensated"),
        ("deposit_lost", "failed"),
    ]
    assert store.verify_chain().ok
    store.close()
    with pytest.raises(hx.EpisodeClosed, match="t1 is rolled_back"):
        hxl.invoke(graph, {"messages": [("user", "again")]}, THREAD, state=bank.state, store=url)


# --- escalations as interrupts ---
def escalating_thread(bank: Bank, url: str) -> tuple[Any, dict[str, Any]]:
    """A thread that deposits, then in one turn deposits to b and withdraws 150 from a (which
    needs a person's approval) in parallel: the graph is interrupted."""
    model = ScriptedModel(
        turns=[
            calls(("deposit", {"account": "a", "amount": 200})),
            calls(
                ("deposit", {"account": "b", "amount": 5}),
                ("withdraw", {"account": "a", "amount": 150}),
            ),
        ]
    )
    graph = react_graph(model, bank.tools)
    out = hxl.invoke(
        graph, {"messages": [("user", "move money")]}, THREAD, state=bank.state, store=url
    )
    return graph, out


def test_escalation_interrupts_the_graph_with_what_is_asked(url: str):
    """A call held for approval stops the graph with an interrupt carrying the escalation's
    id, action, arguments and reason; the withdrawal has not run, the episode is escalated."""
    bank = Bank()
    graph, out = escalating_thread(bank, url)
    (asked,) = out["__interrupt__"]
    store = hx.Store(url)
    (pending,) = store.escalations(status="pending", episode_id="t1")
    assert asked.value["escalation_id"] == pending.id
    assert asked.value["action"] == "withdraw" and asked.value["episode_id"] == "t1"
    assert asked.value["arguments"] == {"account": "a", "amount": 150}
    assert "held for a person's approval" in asked.value["reason"]
    assert asked.value["decisions"] == ["approve", "reject", "edit"]
    assert "withdraw" not in bank.runs and bank.balance("a") == 200
    assert store.episode("t1").status == "escalated"  # type: ignore[union-attr]
    assert graph.get_state(THREAD).next == ("tools",)
    store.close()


def test_resume_with_approval_runs_the_call_once_and_nothing_twice(url: str):
    """Command(resume={"decision": "approve", ...}) records the decision, the withdrawal runs
    exactly once, and the deposits committed before (in this node and earlier) do not run
    again; the model gets every answer and the episode commits."""
    bank = Bank()
    graph, _ = escalating_thread(bank, url)
    deposits_before = bank.runs["deposit"]
    out = hxl.invoke(
        graph,
        Command(resume={"decision": "approve", "by": "ops", "reason": "ok"}),
        THREAD,
        state=bank.state,
        store=url,
    )
    assert "__interrupt__" not in out
    assert bank.runs["withdraw"] == 1
    assert bank.runs["deposit"] == deposits_before  # nothing committed ran again
    assert deposits_before in (1, 2)  # b's deposit ran before or after the escalation
    assert bank.balance("a") == 50 and bank.balance("b") == 5
    last_turn = tool_messages(out)[-2:]
    assert [m.status for m in last_turn] == ["success", "success"]
    assert json.loads(str(last_turn[1].content)) == {"account": "a", "balance": 50}
    store = hx.Store(url)
    (esc,) = store.escalations(episode_id="t1")
    assert esc.status == "approved" and esc.resolved_by == "ops" and esc.resolution_reason == "ok"
    committed = [(t.action, t.args) for t in store.transactions("t1") if t.status == "committed"]
    assert sorted(committed, key=repr) == sorted(
        [
            ("deposit", {"account": "a", "amount": 200}),
            ("deposit", {"account": "b", "amount": 5}),
            ("withdraw", {"account": "a", "amount": 150}),
        ],
        key=repr,
    )
    assert store.episode("t1").status == "committed"  # type: ignore[union-attr]
    assert store.verify_chain().ok
    store.close()


def test_resume_with_rejection_tells_the_model(url: str):
    """A rejected call does not run; its ToolMessage says who rejected it and why."""
    bank = Bank()
    graph, _ = escalating_thread(bank, url)
    out = hxl.invoke(
        graph,
        Command(resume={"decision": "reject", "by": "lead", "reason": "too much"}),
        THREAD,
        state=bank.state,
        store=url,
    )
    rejected = tool_messages(out)[-1]
    assert rejected.status == "error"
    assert "rejected by lead: too much" in str(rejected.content)
    assert "withdraw" not in bank.runs and bank.balance("a") == 200
    store = hx.Store(url)
    assert store.escalations(episode_id="t1")[0].status == "rejected"
    store.close()


def test_resume_with_an_edit_runs_the_persons_arguments(url: str):
    """An edit decision runs the call once with the person's arguments instead."""
    bank = Bank()
    graph, _ = escalating_thread(bank, url)
    edit = {"account": "a", "amount": 120}
    out = hxl.invoke(
        graph,
        Command(resume={"decision": "edit", "by": "lead", "edit": edit}),
        THREAD,
        state=bank.state,
        store=url,
    )
    assert json.loads(str(tool_messages(out)[-1].content)) == {"account": "a", "balance": 80}
    assert bank.runs["withdraw"] == 1 and bank.balance("a") == 80


def test_two_approvals_in_one_turn_are_asked_one_after_the_other(url: str):
    """Two calls of one turn that each need approval interrupt twice: the node asks again for
    the second (not answered by the first decision), and each withdrawal runs exactly once.

    LangGraph runs the two calls in parallel threads, so whether the approved call runs before
    the other one pauses the episode again is timing: at most one has run after the first
    decision, both after the second."""
    bank = Bank(hx.DictState({"accounts/a": {"balance": 500}, "accounts/b": {"balance": 500}}))
    model = ScriptedModel(
        turns=[
            calls(
                ("withdraw", {"account": "a", "amount": 150}),
                ("withdraw", {"account": "b", "amount": 120}),
            )
        ]
    )
    graph = react_graph(model, bank.tools)
    out = hxl.invoke(graph, {"messages": [("user", "x")]}, THREAD, state=bank.state, store=url)
    first = out["__interrupt__"][0].value
    approve = Command(resume={"decision": "approve", "by": "ops"})
    out = hxl.invoke(graph, approve, THREAD, state=bank.state, store=url)
    second = out["__interrupt__"][0].value
    assert second["escalation_id"] != first["escalation_id"]
    assert {first["arguments"]["account"], second["arguments"]["account"]} == {"a", "b"}
    assert bank.runs.get("withdraw", 0) <= 1
    out = hxl.invoke(graph, approve, THREAD, state=bank.state, store=url)
    assert "__interrupt__" not in out
    assert bank.runs == {"withdraw": 2}
    assert bank.balance("a") == 350 and bank.balance("b") == 380
    store = hx.Store(url)
    assert [e.status for e in store.escalations(episode_id="t1")] == ["approved", "approved"]
    assert sorted(t.status for t in store.transactions("t1")) == [
        "committed",
        "committed",
        "held",
        "held",
    ]
    store.close()


def test_resolved_in_the_store_first_then_resumed(url: str):
    """A decision recorded with Store.resolve before resuming is used as it is; resuming
    without any decision keeps the graph interrupted and runs nothing."""
    bank = Bank()
    graph, out = escalating_thread(bank, url)
    again = hxl.invoke(graph, None, THREAD, state=bank.state, store=url)
    assert (
        again["__interrupt__"][0].value["escalation_id"]
        == out["__interrupt__"][0].value["escalation_id"]
    )
    assert "withdraw" not in bank.runs
    store = hx.Store(url)
    store.resolve(out["__interrupt__"][0].value["escalation_id"], "approve", by="desk")
    store.close()
    done = hxl.invoke(graph, Command(resume="go"), THREAD, state=bank.state, store=url)
    assert "__interrupt__" not in done and bank.runs["withdraw"] == 1


def test_resume_value_must_be_a_decision(url: str):
    """Resuming a pending escalation with something that is not a decision is a clear
    ConfigurationError, and the escalation stays pending."""
    bank = Bank()
    graph, _ = escalating_thread(bank, url)
    with pytest.raises(hx.ConfigurationError, match="waiting for a person's decision"):
        hxl.invoke(graph, Command(resume="yes"), THREAD, state=bank.state, store=url)
    with pytest.raises(hx.ConfigurationError, match="say who decided"):
        hxl.invoke(
            graph, Command(resume={"decision": "approve"}), THREAD, state=bank.state, store=url
        )
    with pytest.raises(hx.ConfigurationError, match="not one of"):
        hxl.invoke(
            graph,
            Command(resume={"decision": "ok", "by": "x"}),
            THREAD,
            state=bank.state,
            store=url,
        )
    store = hx.Store(url)
    assert store.escalations(episode_id="t1")[0].status == "pending"
    store.close()


def test_a_decision_that_bypassed_the_store_is_refused(url: str):
    """Resuming the graph with a decision in an episode opened without it (so nothing was
    recorded) is a ConfigurationError naming the fix; the held call does not run."""
    bank = Bank()
    graph, _ = escalating_thread(bank, url)
    with pytest.raises(hx.ConfigurationError, match="still pending in the episode"):
        with hxl.episode_for_thread(THREAD, state=bank.state, store=url):
            graph.invoke(Command(resume={"decision": "approve", "by": "ops"}), THREAD)
    assert "withdraw" not in bank.runs
    store = hx.Store(url)
    assert store.escalations(episode_id="t1")[0].status == "pending"
    store.close()


def test_resume_keyed_by_interrupt_id(url: str):
    """A resume value keyed by interrupt id (LangGraph's form) reaches the escalation that
    interrupt asks about."""
    bank = Bank()
    graph, out = escalating_thread(bank, url)
    (asked,) = out["__interrupt__"]
    hxl.invoke(
        graph,
        Command(resume={asked.id: {"decision": "approve", "by": "ops"}}),
        THREAD,
        state=bank.state,
        store=url,
    )
    assert bank.runs["withdraw"] == 1 and bank.balance("a") == 50


def test_the_next_turn_of_a_thread_continues_its_episode(url: str):
    """A second user message on the same thread resumes the same episode: one episode per
    thread, each call recorded once."""
    bank = Bank()
    model = ScriptedModel(
        turns=[
            calls(("deposit", {"account": "a", "amount": 1})),
            AIMessage(content="paid"),
            calls(("deposit", {"account": "a", "amount": 2})),
        ]
    )
    graph = react_graph(model, bank.tools)
    hxl.invoke(graph, {"messages": [("user", "pay 1")]}, THREAD, state=bank.state, store=url)
    hxl.invoke(graph, {"messages": [("user", "pay 2")]}, THREAD, state=bank.state, store=url)
    assert bank.balance("a") == 3 and bank.runs == {"deposit": 2}
    store = hx.Store(url)
    assert [e.id for e in store.episodes()] == ["t1"]
    assert [t.status for t in store.transactions("t1")] == ["committed", "committed"]
    store.close()


def test_thread_id_is_required():
    """A config without a thread_id is a ConfigurationError saying what to pass."""
    with pytest.raises(hx.ConfigurationError, match="thread_id"):
        hxl.episode_for_thread({}, state=hx.DictState({}))
    with pytest.raises(hx.ConfigurationError, match="takes no episode_id"):
        hxl.episode_for_thread(THREAD, state=hx.DictState({}), episode_id="x")


# --- parallel calls, threads and SQL ---
def test_parallel_calls_on_sql_state_commit_each_with_its_own_changes(tmp_path: Path):
    """Two tool calls of one AI message run in ToolNode's worker threads on an SQLState; each
    commits with exactly its own change, and the store and state agree afterwards."""
    db = tmp_path / "bank.db"
    with sqlite3.connect(db) as conn:
        conn.execute("create table accounts (name text primary key, balance int)")
        conn.executemany("insert into accounts values (?, 0)", [("a",), ("b",)])
    conn.close()
    state = hx.SQLState(f"sqlite:///{db}")
    runs: list[int] = []

    @hx.action(writes=["accounts/{account}"])
    def deposit(account: str, amount: int) -> int:
        """Deposit money."""
        runs.append(threading.get_ident())
        # Through the adapter's connection, from ToolNode's threads (the calls take turns).
        state.connection.execute(
            "update accounts set balance = balance + ? where name = ?", (amount, account)
        )
        return amount

    @deposit.postcondition
    def credited(ctx: hx.Context) -> bool:
        key = f"accounts/{ctx.args.account}"
        return bool(ctx.after[key]["balance"] == ctx.before[key]["balance"] + ctx.args.amount)

    url = f"sqlite:///{tmp_path}/h.db"
    model = ScriptedModel(
        turns=[
            calls(
                ("deposit", {"account": "a", "amount": 3}),
                ("deposit", {"account": "b", "amount": 4}),
            )
        ]
    )
    out = hxl.invoke(
        react_graph(model, hxl.as_tools(deposit)),
        {"messages": [("user", "x")]},
        THREAD,
        state=state,
        store=url,
    )
    assert [m.status for m in tool_messages(out)] == ["success", "success"]
    assert len(runs) == 2 and threading.get_ident() not in runs  # worker threads
    store = hx.Store(url)
    diffs = sorted((t.diff for t in store.transactions("t1")), key=repr)
    assert diffs == [
        {"accounts/a": [{"name": "a", "balance": 0}, {"name": "a", "balance": 3}]},
        {"accounts/b": [{"name": "b", "balance": 0}, {"name": "b", "balance": 4}]},
    ]
    assert store.episode("t1").status == "committed"  # type: ignore[union-attr]
    store.close()
    assert state.get("accounts/a")["balance"] == 3 and state.get("accounts/b")["balance"] == 4
    state.close()


def test_async_graph_runs_sync_and_async_actions(url: str):
    """With ainvoke, an async action and a sync one run in parallel in one turn, and an
    escalation interrupts and resumes the same way."""
    bank = Bank()

    @hx.action(writes=["accounts/{account}"], approval=True)
    async def close_account(account: str) -> str:
        """Close an account."""
        bank.runs["close"] = bank.runs.get("close", 0) + 1
        bank.state[f"accounts/{account}"] = {"balance": 0, "closed": True}
        return "closed"

    model = ScriptedModel(
        turns=[
            calls(("deposit", {"account": "a", "amount": 4}), ("close_account", {"account": "b"}))
        ]
    )
    graph = react_graph(model, [*bank.tools, hxl.as_tool(close_account)])

    async def scenario() -> tuple[Any, Any]:
        first = await hxl.ainvoke(
            graph, {"messages": [("user", "x")]}, THREAD, state=bank.state, store=url
        )
        second = await hxl.ainvoke(
            graph,
            Command(resume={"decision": "approve", "by": "ops"}),
            THREAD,
            state=bank.state,
            store=url,
        )
        return first, second

    first, second = asyncio.run(scenario())
    with pytest.raises(hx.ConfigurationError, match="async def: its tool runs only in an async"):
        with hxl.episode_for_thread(
            {"configurable": {"thread_id": "t2"}}, state=bank.state, store=url
        ):
            hxl.as_tool(close_account).invoke({"account": "a"})
    assert first["__interrupt__"][0].value["action"] == "close_account"
    assert [m.content for m in tool_messages(second)][-1] == "closed"
    assert bank.runs["close"] == 1 and bank.runs["deposit"] == 1
    assert bank.balance("a") == 4 and bank.state.get("accounts/b")["closed"] is True


def test_episode_for_thread_drives_a_stream(url: str):
    """episode_for_thread runs any graph call (here stream) in the thread's episode."""
    bank = Bank()
    model = ScriptedModel(turns=[calls(("deposit", {"account": "a", "amount": 2}))])
    graph = react_graph(model, bank.tools)
    with hxl.episode_for_thread(THREAD, state=bank.state, store=url) as ep:
        chunks = list(graph.stream({"messages": [("user", "x")]}, THREAD))
    assert ep.id == "t1" and ep.outcome == "committed" and len(chunks) == 3
    assert [c.action for c in ep.committed] == ["deposit"] and bank.balance("a") == 2


def test_the_example_runs_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """examples/integrations/langgraph_example.py runs with LangChain's fake chat model: a
    refusal the model reads, an interrupt for approval, and each effect once after resuming."""
    example = Path(__file__).resolve().parents[2] / "examples/integrations/langgraph_example.py"
    result = runpy.run_path(str(example))["main"](tmp_path)
    assert result["balance"] == 50
    assert sorted(result["records"]) == [
        ("move", -500, "precondition"),
        ("move", -150, "committed"),
        ("move", -150, "held"),
        ("move", 200, "committed"),
    ]
    assert "asked: move {'account': 'a', 'amount': -150}" in capsys.readouterr().out

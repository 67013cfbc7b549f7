"""A plain ``@hx.action`` handed to a framework through the framework's own entry point.

Frameworks decide how to call a tool by looking at it (``inspect.iscoroutinefunction``,
``inspect.isroutine``, its signature and type hints) and run sync tools in thread pools. Each
case calls a sync and an async action inside an episode and checks that every call committed
once, with its own changes, before any adapter of ours is involved.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import threading
import typing
from pathlib import Path
from typing import Any

import pytest
import tenacity

import harness as hx

from ..conftest import restore_before


class Bank:
    """Two accounts on a DictState, with a deposit action (sync and async) that counts runs."""

    def __init__(self) -> None:
        self.state = hx.DictState({"acct/a": 0, "acct/b": 0})
        self.runs: list[tuple[str, int]] = []
        lock = threading.Lock()

        @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: f"{a.name}:{a.ref}")
        def deposit(name: str, amount: int, ref: str = "r") -> int:
            """Deposit money into an account.

            Args:
                name: The account.
                amount: How much.
                ref: The deposit's reference.
            """
            with lock:
                self.runs.append((name, amount))
            self.state[f"acct/{name}"] = self.state[f"acct/{name}"] + amount
            return int(self.state[f"acct/{name}"])

        @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: f"a{a.name}:{a.ref}")
        async def adeposit(name: str, amount: int, ref: str = "r") -> int:
            """Deposit money into an account, asynchronously.

            Args:
                name: The account.
                amount: How much.
                ref: The deposit's reference.
            """
            await asyncio.sleep(0)
            self.runs.append((name, amount))
            self.state[f"acct/{name}"] = self.state[f"acct/{name}"] + amount
            return int(self.state[f"acct/{name}"])

        for act in (deposit, adeposit):
            act.compensation(functools.partial(restore_before, self.state))

            @act.postcondition
            def credited(ctx: hx.Context) -> bool:
                key = f"acct/{ctx.args.name}"
                return bool(ctx.after[key] == ctx.before[key] + ctx.args.amount)

        self.deposit, self.adeposit = deposit, adeposit

    def episode(self, tmp_path: Path) -> hx.Episode:
        return hx.Episode(state=self.state, store=f"sqlite:///{tmp_path}/h.db")


@pytest.fixture
def bank() -> Bank:
    return Bank()


def committed_diffs(tmp_path: Path, ep: hx.Episode) -> list[tuple[str, dict[str, Any]]]:
    """(action, diff) of every committed transaction of the episode, from the store."""
    store = hx.Store(f"sqlite:///{tmp_path}/h.db")
    try:
        return [(t.action, t.diff) for t in store.transactions(ep.id) if t.status == "committed"]
    finally:
        store.close()


# --- what introspection sees ---


def test_an_async_action_is_a_coroutine_function_and_a_sync_one_is_not(bank: Bank):
    """Frameworks await what inspect calls a coroutine function, and call the rest."""
    assert inspect.iscoroutinefunction(bank.adeposit)
    assert not inspect.iscoroutinefunction(bank.deposit)
    assert inspect.isroutine(bank.deposit) and inspect.isroutine(bank.adeposit)


def test_wraps_metadata_signature_and_type_hints_are_the_tools(bank: Bank):
    fn = bank.deposit.__wrapped__
    assert bank.deposit.__name__ == "deposit"
    assert bank.deposit.__qualname__ == fn.__qualname__
    assert bank.deposit.__module__ == __name__
    assert bank.deposit.__doc__ == fn.__doc__
    assert inspect.signature(bank.deposit) == inspect.signature(fn)
    assert typing.get_type_hints(bank.deposit) == typing.get_type_hints(fn)
    assert typing.get_type_hints(bank.deposit)["amount"] is int


def test_a_tools_own_attributes_do_not_replace_the_actions():
    """tenacity's @retry leaves `.retry` on the function it returns; the action keeps its own."""

    @hx.action(writes=["x"], retry=hx.Retry(attempts=2))
    @tenacity.retry(stop=tenacity.stop_after_attempt(1))
    def flaky() -> None:
        """Do it."""

    assert isinstance(flaky.retry, hx.Retry)
    assert flaky.name == "flaky" and flaky.mutating


def test_an_action_in_a_class_body_is_not_bound_as_a_method(bank: Bank):
    class Tools:
        deposit = bank.deposit

    assert Tools().deposit is bank.deposit
    assert Tools.deposit is bank.deposit


# --- threads and executors ---


def test_calls_from_many_threads_each_commit_once_with_their_own_changes(
    bank: Bank, tmp_path: Path
):
    """Eight threads deposit at once; each transaction's diff is exactly its own account."""
    names = [f"t{i}" for i in range(8)]
    for n in names:
        bank.state[f"acct/{n}"] = 0
    with bank.episode(tmp_path) as ep, hx.ContextExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda n: bank.deposit(n, 5), names))
    assert results == [5] * 8
    assert ep.outcome == "committed"
    diffs = committed_diffs(tmp_path, ep)
    assert sorted((d for _, d in diffs), key=repr) == [{f"acct/{n}": [0, 5]} for n in names]
    assert sorted(bank.runs) == sorted((n, 5) for n in names)


def test_asyncio_to_thread_and_run_in_executor_keep_the_episode(bank: Bank, tmp_path: Path):
    """The two ways frameworks run a sync tool from a coroutine find the episode current."""

    async def go() -> hx.Episode:
        async with bank.episode(tmp_path) as ep:
            loop = asyncio.get_running_loop()
            await asyncio.gather(
                asyncio.to_thread(bank.deposit, "a", 1),
                loop.run_in_executor(None, functools.partial(bank.deposit, "b", 2)),
            )
        return ep

    ep = asyncio.run(go())
    assert ep.outcome == "committed" and len(ep.committed) == 2
    assert bank.state.to_dict() == {"acct/a": 1, "acct/b": 2}


def test_a_thread_without_the_context_is_told_how_to_carry_it(bank: Bank, tmp_path: Path):
    """A plain pool starts threads in an empty context: the call is refused, says why and
    how to fix it, and nothing ran."""
    with bank.episode(tmp_path) as ep, concurrent.futures.ThreadPoolExecutor(1) as pool:
        with pytest.raises(hx.NotInEpisode) as info:
            pool.submit(bank.deposit, "a", 1).result()
    message = str(info.value)
    assert "1 episode(s) are open" in message
    assert "hx.ContextExecutor()" in message and "asyncio.to_thread" in message
    assert bank.runs == [] and bank.state["acct/a"] == 0
    assert ep.outcome == "committed" and ep.committed == []


def test_outside_any_episode_the_message_stays_the_plain_one(bank: Bank):
    with pytest.raises(hx.NotInEpisode) as info:
        bank.deposit("a", 1)
    assert "outside an episode" in str(info.value)
    assert info.value.open_elsewhere == 0


# --- the frameworks' own entry points ---


def test_langchain_structured_tool_sync_and_async(bank: Bank, tmp_path: Path):
    tools = pytest.importorskip("langchain_core.tools")
    sync_tool = tools.StructuredTool.from_function(func=bank.deposit)
    async_tool = tools.StructuredTool.from_function(coroutine=bank.adeposit)

    async def go() -> hx.Episode:
        async with bank.episode(tmp_path) as ep:
            assert await async_tool.ainvoke({"name": "a", "amount": 3}) == 4
            assert await sync_tool.ainvoke({"name": "b", "amount": 4}) == 4
        return ep

    with bank.episode(tmp_path / "sync") as ep1:
        assert sync_tool.invoke({"name": "a", "amount": 1}) == 1
    (tmp_path / "sync").mkdir(exist_ok=True)
    ep = asyncio.run(go())
    assert ep1.outcome == ep.outcome == "committed"
    assert [c.action for c in ep.committed] == ["adeposit", "deposit"]
    assert bank.state.to_dict() == {"acct/a": 4, "acct/b": 4}


def test_langgraph_tool_node_runs_two_calls_in_parallel_threads(bank: Bank, tmp_path: Path):
    """ToolNode runs the two sync calls of one message in threads: each commits once."""
    pytest.importorskip("langgraph")
    from langchain_core.messages import AIMessage
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode([bank.deposit]))
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    calls = [
        {"name": "deposit", "args": {"name": "a", "amount": 1}, "id": "1"},
        {"name": "deposit", "args": {"name": "b", "amount": 2}, "id": "2"},
    ]
    with bank.episode(tmp_path) as ep:
        out = graph.compile().invoke({"messages": [AIMessage(content="", tool_calls=calls)]})
    assert [m.content for m in out["messages"][1:]] == ["1", "2"]
    assert ep.outcome == "committed"
    assert sorted((d for _, d in committed_diffs(tmp_path, ep)), key=repr) == [
        {"acct/a": [0, 1]},
        {"acct/b": [0, 2]},
    ]


def test_langgraph_tool_node_in_parallel_on_sql_state(tmp_path: Path):
    """The same with the state and the store in SQLite files, written from two threads."""
    pytest.importorskip("langgraph")
    import sqlite3

    from langchain_core.messages import AIMessage
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    db = tmp_path / "bank.db"
    with sqlite3.connect(db) as conn:
        conn.execute("create table acct (name text primary key, balance int)")
        conn.executemany("insert into acct values (?, 0)", [("a",), ("b",)])
    state = hx.SQLState(f"sqlite:///{db}")

    @hx.action(writes=["acct/{name}"])
    def deposit(name: str, amount: int) -> int:
        """Deposit money.

        Args:
            name: The account.
            amount: How much.
        """
        # Through the adapter's connection: a write through another connection would be
        # another writer's, not the call's.
        state.connection.execute(
            "update acct set balance = balance + ? where name = ?", (amount, name)
        )
        return amount

    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode([deposit]))
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    calls = [
        {"name": "deposit", "args": {"name": n, "amount": i}, "id": n}
        for i, n in enumerate("ab", 1)
    ]
    with hx.Episode(state=state, store=f"sqlite:///{tmp_path}/h.db") as ep:
        graph.compile().invoke({"messages": [AIMessage(content="", tool_calls=calls)]})
    assert ep.outcome == "committed"
    assert sorted((d for _, d in committed_diffs(tmp_path, ep)), key=repr) == [
        {"acct/a": [{"name": "a", "balance": 0}, {"name": "a", "balance": 1}]},
        {"acct/b": [{"name": "b", "balance": 0}, {"name": "b", "balance": 2}]},
    ]


def test_pydantic_ai_agent_with_plain_actions(bank: Bank, tmp_path: Path):
    pydantic_ai = pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.test import TestModel

    agent = pydantic_ai.Agent(TestModel(), tools=[bank.deposit, bank.adeposit])
    with bank.episode(tmp_path) as ep:
        agent.run_sync("deposit")
    assert ep.outcome == "committed"
    assert sorted(c.action for c in ep.committed) == ["adeposit", "deposit"]
    assert len(bank.runs) == 2


def test_openai_agents_function_tool_sync_and_async(bank: Bank, tmp_path: Path):
    agents = pytest.importorskip("agents")
    from agents.tool_context import ToolContext

    tools = [agents.function_tool(bank.deposit), agents.function_tool(bank.adeposit)]

    async def go() -> tuple[list[Any], hx.Episode]:
        async with bank.episode(tmp_path) as ep:
            answers = []
            for tool, args in zip(
                tools, ['{"name":"a","amount":1}', '{"name":"b","amount":2}'], strict=True
            ):
                ctx = ToolContext(None, tool_name=tool.name, tool_call_id="c", tool_arguments=args)
                answers.append(await tool.on_invoke_tool(ctx, args))
        return answers, ep

    answers, ep = asyncio.run(go())
    assert answers == [1, 2]
    assert [c.action for c in ep.committed] == ["deposit", "adeposit"]


def test_mcp_server_awaits_the_async_action(bank: Bank, tmp_path: Path):
    pytest.importorskip("mcp")
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("bank")
    server.tool()(bank.adeposit)
    server.tool()(bank.deposit)

    async def go() -> tuple[Any, Any, hx.Episode]:
        async with bank.episode(tmp_path) as ep:
            first = await server.call_tool("adeposit", {"name": "a", "amount": 5})
            second = await server.call_tool("deposit", {"name": "a", "amount": 5})
        return first, second, ep

    first, second, ep = asyncio.run(go())
    assert (first.structured_content, second.structured_content) == ({"result": 5}, {"result": 10})
    assert not first.is_error and not second.is_error
    assert [c.action for c in ep.committed] == ["adeposit", "deposit"]
    assert bank.runs == [("a", 5), ("a", 5)]

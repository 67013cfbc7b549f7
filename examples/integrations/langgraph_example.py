"""A LangGraph agent whose tools are transactional actions, offline.

One graph thread is one episode. The scripted model (LangChain's own GenericFakeChatModel)
deposits twice in one turn (one deposit is refused by its precondition, and the model is told),
then asks to withdraw 150, which a person must approve: the graph stops with an interrupt,
and resumes with the person's decision. Nothing that committed runs twice.

    python examples/integrations/langgraph_example.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

import harness as hx
from harness.integrations import langchain as hxl

bank = hx.DictState({"accounts/a": {"balance": 0}})


def takes_over_100(ctx: hx.Context) -> bool:
    """Taking more than 100 needs a person's approval."""
    return bool(ctx.args.amount < -100)


@hx.action(writes=["accounts/{account}"], approval=takes_over_100)
def move(account: str, amount: int) -> dict[str, Any]:
    """Add (or, negative, take) money on an account; taking more than 100 needs approval.

    Args:
        account: the account's name.
        amount: how much, in whole units.
    """
    row = {"balance": bank.get(f"accounts/{account}")["balance"] + amount}
    bank[f"accounts/{account}"] = row
    return row


@move.precondition
def keeps_balance_positive(ctx: hx.Context) -> bool:
    """the balance may not go below zero"""
    return bool(ctx.state.get(f"accounts/{ctx.args.account}")["balance"] + ctx.args.amount >= 0)


@move.postcondition
def moved(ctx: hx.Context) -> bool:
    key = f"accounts/{ctx.args.account}"
    return bool(ctx.after[key]["balance"] - ctx.before[key]["balance"] == ctx.args.amount)


@move.compensation
def put_back(ctx: hx.Context) -> None:
    bank.update(ctx.before)


def call(i: int, amount: int) -> dict[str, Any]:
    return {"name": "move", "args": {"account": "a", "amount": amount}, "id": f"c{i}"}


model = GenericFakeChatModel(
    messages=iter(
        [
            AIMessage(content="", tool_calls=[call(1, 200), call(2, -500)]),
            AIMessage(content="", tool_calls=[call(3, -150)]),
            AIMessage(content="Moved the money."),
        ]
    )
)
tools = hxl.as_tools(move)


def agent(state: MessagesState) -> dict[str, Any]:
    return {"messages": [model.invoke(state["messages"])]}


builder = StateGraph(MessagesState)
builder.add_node("agent", agent)
builder.add_node("tools", ToolNode(tools))
builder.add_edge(START, "agent")
builder.add_conditional_edges("agent", tools_condition)
builder.add_edge("tools", "agent")
graph = builder.compile(checkpointer=InMemorySaver())


def main(folder: Path) -> dict[str, Any]:
    """Run the thread to its interrupt, approve, and finish; return what happened."""
    store = f"sqlite:///{folder / 'harness.db'}"
    config = {"configurable": {"thread_id": "thread-1"}}
    out = hxl.invoke(graph, {"messages": [("user", "sort out a")]}, config, state=bank, store=store)
    asked = out["__interrupt__"][0].value
    print("asked:", asked["action"], asked["arguments"], "-", asked["reason"])
    decision = {"decision": "approve", "by": "ops@example.com", "reason": "checked"}
    out = hxl.invoke(graph, Command(resume=decision), config, state=bank, store=store)
    for message in out["messages"]:
        print(f"{message.type:>5}: {message.content or message.tool_calls}")
    records = hx.Store(store)
    rows = [(t.action, t.args["amount"], t.status) for t in records.transactions("thread-1")]
    records.close()
    print("balance:", bank.get("accounts/a")["balance"], "records:", rows)
    return {"balance": bank.get("accounts/a")["balance"], "records": rows}


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        main(Path(tmp))

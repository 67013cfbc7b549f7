"""A Pydantic AI agent whose tool calls are transactions (offline: a scripted FunctionModel).

Run it with ``python examples/integrations/pydantic_ai_example.py``. The model deposits into
an account that does not exist (refused by the precondition: it reads why), then into one that
does (committed); the store records both.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import harness as hx
from harness.integrations.pydantic_ai import as_tool

bank = hx.DictState({"accounts/a": {"balance": 0}})


@hx.action(writes=["accounts/{account}"])
def deposit(account: str, amount: int) -> dict[str, Any]:
    """Put money into an account.

    Args:
        account: the account's id.
        amount: how much, in cents.
    """
    balance = bank[f"accounts/{account}"]["balance"] + amount
    bank[f"accounts/{account}"] = {"balance": balance}
    return {"account": account, "balance": balance}


@deposit.precondition
def account_exists(ctx: hx.Context) -> bool:
    """the account does not exist"""
    return ctx.state.get(f"accounts/{ctx.args.account}") is not None


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A scripted model: deposit into "z", then into "a", then report."""
    turn = sum(isinstance(m, ModelResponse) for m in messages)
    if turn < 2:
        account = "za"[turn]
        return ModelResponse(parts=[ToolCallPart("deposit", {"account": account, "amount": 10})])
    return ModelResponse(parts=[TextPart(f"done: {messages[-1].parts[0].content}")])


async def main(store: str) -> None:
    """Run the agent in an episode and print what the store recorded."""
    agent = Agent(FunctionModel(model), tools=[as_tool(deposit)])
    async with hx.Episode(state=bank, store=store) as ep:
        result = await agent.run("Put 10 cents into my account")
    print(result.output)  # done: {'account': 'a', 'balance': 10}
    records = hx.Store(store)
    for txn in records.transactions(ep.id):
        print(txn.action, txn.args, txn.status)  # ... precondition, then ... committed
    records.close()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(main(f"sqlite:///{Path(folder) / 'harness.db'}"))

"""An OpenAI Agents SDK agent whose tool calls are transactions (offline: the SDK's ScriptedModel).

Run it with ``python examples/integrations/openai_agents_example.py``. The model withdraws from
an account without the funds (refused by the precondition: it reads why), deposits, then wires
money out, which a person must approve: the run stops with ``hx.Escalated``. Once approved, the
same agent runs again in the resumed episode: the deposit is answered from the record, the wire
runs once.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import agents
from agents import Agent, Runner
from agents.testing import ScriptedModel, assistant_message, function_call

import harness as hx
from harness.integrations.openai_agents import tools

agents.set_tracing_disabled(True)
bank = hx.DictState({"accounts/a": {"balance": 0}})


def _move(account: str, amount: int) -> dict[str, Any]:
    balance = bank[f"accounts/{account}"]["balance"] + amount
    bank[f"accounts/{account}"] = {"balance": balance}
    return {"account": account, "balance": balance}


@hx.action(writes=["accounts/{account}"])
def deposit(account: str, amount: int) -> dict[str, Any]:
    """Put money into an account."""
    return _move(account, amount)


@hx.action(writes=["accounts/{account}"], approval=True)
def wire(account: str, amount: int) -> dict[str, Any]:
    """Send money out of an account (a person approves each wire)."""
    return _move(account, -amount)


@wire.precondition
def has_funds(ctx: hx.Context) -> bool:
    return bool(ctx.state.get(f"accounts/{ctx.args.account}")["balance"] >= ctx.args.amount)


def model() -> ScriptedModel:
    """The model's turns: wire 30 (refused: no funds), deposit 50, wire 30, answer."""
    turns = [("wire", 30), ("deposit", 50), ("wire", 30)]
    return ScriptedModel(
        [
            [function_call(n, {"account": "a", "amount": x}, call_id=f"c{i}")]
            for i, (n, x) in enumerate(turns)
        ]
        + [[assistant_message("wired 30")]]
    )


async def main(store: str) -> None:
    """Run the agent until it escalates, approve, resume, and print what the store recorded."""
    try:
        async with hx.Episode(state=bank, store=store, episode_id="e1"):
            await Runner.run(Agent(name="teller", model=model(), tools=tools(deposit, wire)), "Go")
    except hx.Escalated as stop:
        print("escalated:", stop.escalation_id)  # the wire waits for a person
        escalation = stop.escalation_id
    records = hx.Store(store)
    records.resolve(escalation, "approve", by="ops@example.com")
    async with hx.Episode(state=bank, store=store, episode_id="e1", resume=True) as ep:
        agent = Agent(name="teller", model=model(), tools=tools(deposit, wire))
        result = await Runner.run(agent, "Go")
    print(result.final_output, ep.outcome, bank["accounts/a"])  # wired 30 committed {'balance': 20}
    for txn in records.transactions("e1"):
        print(txn.action, txn.args, txn.status)  # precondition, committed, held, committed
    records.close()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(main(f"sqlite:///{Path(folder) / 'harness.db'}"))

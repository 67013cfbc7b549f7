"""A small environment whose writes a person approves: accounts on a DictState."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import harness as hx

from .toy_env import write_files


class ApprovalToy:
    """Accounts ``acct/<name>`` at 100. ``refund`` is held for approval on every call,
    ``credit`` when its amount is over 50; ``balance`` reads. With ``ledger``, every run of a
    write's function in a trial appends ``episode<TAB>tool<TAB>account<TAB>amount`` to it.
    With ``fresh_keys``, each refund call has a new idempotency key."""

    def __init__(self, ledger: str = "", fresh_keys: bool = False) -> None:
        self.state = hx.DictState({f"acct/{n}": 100 for n in "abc"})
        state = self.state

        def log(tool: str, account: str, amount: int) -> None:
            ep = hx.current_episode()
            if ledger and ep is not None and ep.run_id:  # (a trial's, not the reference's)
                fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                os.write(fd, f"{ep.id}\t{tool}\t{account}\t{amount}\n".encode())
                os.close(fd)

        def add(tool: str, account: str, amount: int) -> int:
            log(tool, account, amount)
            state[f"acct/{account}"] = state[f"acct/{account}"] + amount
            return int(state[f"acct/{account}"])

        @hx.action(
            writes=["acct/{account}"],
            # (fresh_keys: every call a new key, so a call made again is held again)
            idempotency_key=lambda a: (
                f"refund:{a.account}" + (uuid.uuid4().hex if fresh_keys else "")
            ),
            approval=True,
        )
        def refund(account: str, amount: int) -> int:
            """Refund `amount` to `account`; a supervisor approves every refund."""
            return add("refund", account, amount)

        @hx.action(
            writes=["acct/{account}"],
            idempotency_key=lambda a: f"credit:{a.account}",
            approval=lambda ctx: ctx.args.amount > 50,
        )
        def credit(account: str, amount: int) -> int:
            """Credit `amount` to `account`; over 50 needs a supervisor."""
            return add("credit", account, amount)

        for write in (refund, credit):

            @write.postcondition
            def moved(ctx: hx.Context) -> bool:
                key = f"acct/{ctx.args.account}"
                return bool(ctx.after[key] - ctx.before[key] == ctx.args.amount)

            @write.compensation
            def undo(ctx: hx.Context) -> None:
                for key, value in ctx.before.items():
                    state[key] = value

        def balance(account: str) -> Any:
            """The balance of `account`."""
            return state.get(f"acct/{account}")

        self.tools: dict[str, Any] = {"refund": refund, "credit": credit, "balance": balance}

    def export(self) -> dict[str, Any]:
        return self.state.to_dict()

    def close(self) -> None:
        pass


def approval_suite(folder: Path, tasks: list[dict[str, Any]], **options: Any) -> Path:
    """A suite on :class:`ApprovalToy` with these tasks (``reference_actions`` and ``id``
    given; the instruction filled in)."""
    body = [{"instruction": "do what the supervisor allows", **t} for t in tasks]
    return Path(write_files(folder, "approvals", "tests.approval_env:ApprovalToy", body, **options))


def call(name: str, approval: dict[str, Any] | None = None, **arguments: Any) -> dict[str, Any]:
    """A reference action, with its recorded approval when given."""
    return {"name": name, "arguments": arguments, **({"approval": approval} if approval else {})}


class OtherAmount:
    """An agent that makes a task's reference calls, but refunds 100 less than the reference."""

    name = "other-amount"

    def config(self) -> dict[str, Any]:
        return {"name": self.name}

    def run(self, task: Any, toolbox: Any, *, seed: int) -> Any:
        from harness.agents.base import AgentOutput

        for step in task.reference_actions:
            arguments = dict(step.arguments)
            if step.name == "refund":
                arguments["amount"] -= 100
            toolbox.call(step.name, arguments)
        return AgentOutput(message="done")

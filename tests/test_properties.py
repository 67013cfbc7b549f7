"""The invariant: the final state equals exactly the committed actions applied once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import harness as hx
from harness.testing import FakeClock

FAULTS = ["none", "transient_before", "lost_ack", "silent", "wrong_scope", "permanent"]


def build(state: hx.DictState, ledger: list[str], faults: dict[str, str]) -> hx.Action[..., Any]:
    """A keyed, compensable 'add' action whose calls fail as `faults` says, once each."""

    @hx.action(writes=["acct/{account}"], idempotency_key=lambda a: a.op)
    def add(op: str, account: str, amount: int) -> int:
        """Add `amount` to an account; `op` names the operation."""
        fault = faults.pop(op, "none")
        if fault == "transient_before":
            raise hx.TransientError("busy")
        if fault == "permanent":
            raise ValueError("refused")
        if fault == "silent":
            return 0
        value = (state.get(f"acct/{account}") or 0) + amount
        state[f"acct/{account}"] = value
        ledger.append(op)
        if fault == "wrong_scope":
            state["acct/other"] = (state.get("acct/other") or 0) + 1
            ledger.append(f"{op}:other")
        if fault == "lost_ack":
            raise hx.TransientError("reset")
        return value

    @add.postcondition
    def added(ctx: hx.Context) -> bool:
        key = f"acct/{ctx.args.account}"
        return bool((ctx.after[key] or 0) - (ctx.before[key] or 0) == ctx.args.amount)

    @add.compensation
    def undo(ctx: hx.Context) -> None:
        for key, value in ctx.before.items():
            if value is None:
                if key in state:
                    del state[key]
            else:
                state[key] = value
        ledger.append(f"undo:{ctx.args.op}")

    return add


steps = st.lists(
    st.tuples(
        st.integers(0, 7),  # op id (repeats exercise deduplication)
        st.sampled_from(["a", "b", "c"]),
        st.integers(1, 9),
        st.sampled_from(FAULTS),
    ),
    max_size=12,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=steps)
def test_final_state_is_committed_actions_applied_once(tmp_path_factory: Any, plan: list[Any]):
    """Random actions with random faults leave exactly the committed effects, each once."""
    folder: Path = tmp_path_factory.mktemp("prop")
    state = hx.DictState()
    ledger: list[str] = []
    faults: dict[str, str] = {}
    add = build(state, ledger, faults)
    policy = hx.Policy(retry=hx.Retry(attempts=3, backoff=0.1, jitter=False))
    store = hx.Store(folder / "h.db", create=True)
    with hx.Episode(state=state, store=store, policy=policy, clock=FakeClock()) as ep:
        for op_id, account, amount, fault in plan:
            op = f"op{op_id}"
            if fault != "none":
                faults.setdefault(op, fault)
            try:
                add(op=op, account=account, amount=amount)
            except hx.ActionFailed as exc:
                if exc.decision == "rollback":
                    break
            except hx.HarnessError:
                pass

    committed = [t for t in store.transactions(ep.id) if t.status in ("committed", "recovered")]
    expected: dict[str, int] = {}
    for t in committed:
        args = t.args
        key = f"acct/{args['account']}"
        expected[key] = expected.get(key, 0) + args["amount"]
    assert {k: v for k, v in state.to_dict().items() if v} == {
        k: v for k, v in expected.items() if v
    }
    # Each operation's effect applied at most once net of its undos, and only if committed.
    ops = {t.args["op"] for t in committed}
    for op in {f"op{i}" for i in range(8)}:
        net = ledger.count(op) - ledger.count(f"undo:{op}")
        assert net == (1 if op in ops else 0), (op, ledger)
    assert store.verify_chain().ok
    store.close()

"""The telecom domain's tools against upstream's behaviour: both sides' tool definitions equal
what tau2's own ``Tool`` code builds (``telecom_tool_defs.json`` was made with it), upstream's
error texts, state changes, ``sync_tools`` and initialization actions, and writes of either side
as transactions in one episode."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

import harness as hx
from harness.agents.base import Toolbox
from harness.domains.telecom.environment import (
    TelecomEnvironment,
    TelecomError,
    evaluate_environment,
)
from harness.testing import FakeClock

REFERENCE = json.loads((Path(__file__).parent / "telecom_tool_defs.json").read_text("utf-8"))
TASKS = Path(__file__).parents[2] / "tasks" / "telecom" / "tau2_tasks_small.json"


def _task(prefix: str) -> dict[str, Any]:
    tasks = json.loads(TASKS.read_text("utf-8"))
    return next(t for t in tasks if t["id"].startswith(prefix))


def _plain(env: TelecomEnvironment, name: str) -> Any:
    """The tool as upstream's environment runs it, outside a transaction."""
    if name in env.actions:
        return env.actions[name].fn
    return env.tools.get(name) or env.user_tools[name]


def test_tool_definitions_are_upstreams() -> None:
    """Thirteen agent tools and thirty phone tools, as tau2 hands them out, keys in order."""
    assert TelecomEnvironment.tool_defs() == REFERENCE["tool_defs"]
    assert TelecomEnvironment.user_tool_defs() == REFERENCE["user_tool_defs"]
    assert json.dumps(TelecomEnvironment.user_tool_defs()) == json.dumps(
        REFERENCE["user_tool_defs"]
    )
    env = TelecomEnvironment()
    assert list(env.tools) == [d["function"]["name"] for d in REFERENCE["tool_defs"]]
    assert list(env.user_tools) == [d["function"]["name"] for d in REFERENCE["user_tool_defs"]]
    assert len(env.user_tools) == 30


def test_reads_answer_as_upstreams_tool_messages() -> None:
    env = TelecomEnvironment()
    usage = json.loads(_plain(env, "get_data_usage")(customer_id="C1001", line_id="L1002"))
    assert usage == {
        "line_id": "L1002",
        "data_used_gb": "8.7",
        "data_limit_gb": "15.0",
        "data_refueling_gb": "0.0",
        "cycle_end_date": "2025-02-28",
    }
    customer = json.loads(_plain(env, "get_customer_by_phone")(phone_number="555-123-2002"))
    assert customer["customer_id"] == "C1001" and customer["created_at"].count(" ") == 1
    with pytest.raises(TelecomError, match="^Customer with phone number 000 not found$"):
        _plain(env, "get_customer_by_phone")(phone_number="000")
    with pytest.raises(TelecomError, match="^Unknown ID format or type: X1$"):
        _plain(env, "get_details_by_id")(id="X1")
    assert _plain(env, "check_sim_status")() == "Your SIM card is active and working."


def test_each_environment_starts_from_upstreams_databases_of_its_own() -> None:
    """A fresh environment's two databases are upstream's TOML as tau2 validates it (equal
    models, equal hashes), and what one environment's tools change no other sees."""
    from harness.domains.telecom import load_db, load_user_db
    from harness.domains.telecom.data_model import TelecomDB
    from harness.domains.telecom.user_data_model import TelecomUserDB

    upstream = TelecomDB.model_validate(load_db())
    upstream_user = TelecomUserDB.model_validate(load_user_db())
    first = TelecomEnvironment()
    assert first.backend.db == upstream and first.user_backend.db == upstream_user
    given = TelecomEnvironment(load_db(), load_user_db())
    assert (first.db_hash(), first.user_db_hash()) == (given.db_hash(), given.user_db_hash())
    _plain(first, "suspend_line")(customer_id="C1001", line_id="L1002", reason="lost")
    first.user_backend.db.device.airplane_mode = True
    second = TelecomEnvironment()
    assert second.backend.db == upstream and second.user_backend.db == upstream_user
    assert first.db_hash() != second.db_hash()


def test_each_environment_has_actions_of_its_own() -> None:
    """Environments copy their write actions from one made once: each copy calls its own
    environment's tools, undoes into its own databases, keys its own calls, and a check
    registered on one environment's action is not on another's."""
    first, second = TelecomEnvironment(), TelecomEnvironment()
    assert set(first.actions) == set(second.actions) and len(first.actions) > 10
    for name, act in first.actions.items():
        other = second.actions[name]
        assert act is not other and act.fn is not other.fn
        assert act.compensate.__self__ is first and other.compensate.__self__ is second
        assert act.idempotency_key.__self__ is not other.idempotency_key.__self__
        assert act.schema == other.schema and act.__wrapped__ is act.fn
        assert inspect.signature(act) == inspect.signature(other)
    first.actions["suspend_line"].precondition(lambda ctx: False)
    assert second.actions["suspend_line"].preconditions == []
    assert TelecomEnvironment().actions["suspend_line"].preconditions == []
    _plain(first, "suspend_line")(customer_id="C1001", line_id="L1002", reason="lost")
    assert first.db_hash() != second.db_hash()


def test_initialization_actions_and_sync_tools() -> None:
    """A task's initialization actions run on the user's side, and sync_tools carries the
    line's state to the phone: roaming off for a user abroad, then enabled by the agent."""
    task = _task("[mobile_data_issue]user_abroad_roaming_enabled_off")
    env = TelecomEnvironment()
    env.initialize(task["initial_state"]["initialization_actions"])
    surroundings = env.user_backend.db.surroundings
    assert surroundings.phone_number == "555-123-2002" and surroundings.is_abroad
    assert surroundings.roaming_allowed is True  # the line's roaming, enabled by the agent
    assert env.user_backend.db.device.roaming_enabled is False  # the phone's, turned off
    assert _plain(env, "disable_roaming")(customer_id="C1001", line_id="L1002") == (
        "Roaming disabled successfully"
    )
    assert env.user_backend.db.surroundings.roaming_allowed is False
    assert _plain(env, "enable_roaming")(customer_id="C1001", line_id="L1002") == (
        "Roaming enabled successfully"
    )
    assert _plain(env, "enable_roaming")(customer_id="C1001", line_id="L1002") == (
        "Roaming was already enabled"
    )
    assert _plain(env, "toggle_roaming")().startswith("Data Roaming is now ON.\nStatus Bar: ")


def test_writes_of_both_sides_are_transactions(store: hx.Store, clock: FakeClock) -> None:
    """The agent's and the user's writes commit as transactions in one episode; a refused
    write reads as upstream's error and leaves both databases as they were."""
    env = TelecomEnvironment()
    env.initialize(
        _task("[mobile_data_issue]user_abroad_roaming_enabled_off")["initial_state"][
            "initialization_actions"
        ]
    )
    before = env.export()
    with hx.Episode(state=env.state, store=store, clock=clock) as ep:
        toolbox = Toolbox(env.tools, ep, env)
        refused = toolbox.call(
            "suspend_line", {"customer_id": "C1001", "line_id": "L9", "reason": "travel"}
        )
        assert not refused.ok
        assert refused.text == "Error: Line L9 not found for customer C1001"
        assert env.export() == before
        wrong = toolbox.call("refuel_data", {"customer_id": "C1001"})
        assert wrong.text == (
            "Error: TelecomTools.refuel_data() missing 2 required positional arguments: "
            "'line_id' and 'gb_amount'"
        )
        toggled = toolbox.call("toggle_airplane_mode", {}, requestor="user")
        assert toggled.ok and env.user_backend.db.device.airplane_mode is True
        unknown = toolbox.call("no_such_tool", {}, requestor="user")
        assert unknown.text == "Error: Tool 'no_such_tool' not found."
        done = toolbox.call(
            "suspend_line", {"customer_id": "C1001", "line_id": "L1002", "reason": "x"}
        )
        assert done.ok and json.loads(done.text)["line"]["status"] == "Suspended"
        assert env.user_backend.db.surroundings.line_active is False
    txns = [(t.action, t.status) for t in store.transactions(ep.id)]
    assert ("toggle_airplane_mode", "committed") in txns
    assert ("suspend_line", "committed") in txns
    assert env.user_backend.db.device.airplane_mode is True


def test_a_payment_flows_from_the_agents_request_to_the_users_phone_and_back() -> None:
    """send_payment_request puts the bill on the phone (sync_tools); make_payment pays it and
    the next sync marks the bill paid, as upstream's environment does."""
    env = TelecomEnvironment()
    env.run_env_function_call(
        "user", "set_user_info", {"name": "John Smith", "phone_number": "555-123-2002"}
    )
    bills = json.loads(_plain(env, "get_bills_for_customer")(customer_id="C1001"))
    bill_id = bills[0]["bill_id"]
    env.backend._get_bill_by_id(bill_id).status = "Issued"
    _plain(env, "send_payment_request")(customer_id="C1001", bill_id=bill_id)
    request = env.user_backend.db.surroundings.payment_request
    assert request is not None and request.bill_id == bill_id
    with pytest.raises(
        TelecomError, match="^A bill is already awaiting payment for this customer$"
    ):
        _plain(env, "send_payment_request")(customer_id="C1001", bill_id=bill_id)
    _plain(env, "make_payment")()
    assert env.backend._get_bill_by_id(bill_id).status == "Paid"
    assert env.user_backend.db.surroundings.payment_request is None


def test_tau2s_environment_reward_over_every_small_task() -> None:
    """Every task of tasks_small.json: its reference actions (by their requestors) on top of
    its initialization actions earn tau2's environment reward 1.0 (the device assertions hold);
    the state the initialization actions leave fails the assertions of every task that has
    any to fix, and evaluating leaves the trial's databases as they were."""
    tasks = json.loads(TASKS.read_text("utf-8"))
    assert len(tasks) == 20
    for task in tasks:
        env = TelecomEnvironment()
        env.initialize(task["initial_state"]["initialization_actions"])
        untouched = evaluate_environment(task, env)
        for action in task["evaluation_criteria"]["actions"] or []:
            _plain(env, action["name"])(**action["arguments"])
        before = env.export()
        scored = evaluate_environment(task, env)
        assert env.export() == before
        assert scored["reward"] == 1.0, task["id"]
        assert scored["reward_breakdown"]["ENV_ASSERTION"] == 1.0
        if any(a["requestor"] == "user" for a in task["evaluation_criteria"]["actions"]):
            assert untouched["reward"] == 0.0, task["id"]

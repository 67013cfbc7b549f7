"""The telecom environment against tau2-bench's own: from each task's initial state, a fixed
sequence of 89 calls of both sides (every phone tool and every CRM tool, their errors, writes
that undo each other, a payment from request to phone) answers with the text tau2's
``Environment.get_response`` gave, marks the same calls as errors, and leaves both databases
with tau2's hashes after every call. ``telecom_probes.json`` was made with tau2's code by
``make_telecom_probes.py``; here each call goes through the harness's toolbox, writes of
either side as transactions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import harness as hx
from harness.agents.base import Toolbox
from harness.domains.telecom.environment import TelecomEnvironment
from harness.domains.telecom.user_tools import TelecomUserTools
from harness.testing import FakeClock

from .make_telecom_probes import plain

# tau2 hands every phone of a process one VpnDetails object, which break_vpn makes poor in
# place; the probes were recorded with each task starting from a fresh process's details, and
# the harness gives each phone its own, so no probe depends on another having run before it.


@pytest.fixture(autouse=True)
def _no_shared_vpn_damage() -> Iterator[None]:
    """The class's default VPN details are the same after each test as before it (a phone
    breaking its VPN must not change them for the next trial in the process)."""
    before = TelecomUserTools.default_vpn_details.model_dump()
    yield
    assert TelecomUserTools.default_vpn_details.model_dump() == before


PROBES = json.loads((Path(__file__).parent / "telecom_probes.json").read_text("utf-8"))
TASKS = {
    t["id"]: t
    for t in json.loads(
        (Path(__file__).parents[2] / "tasks" / "telecom" / "tau2_tasks_small.json").read_text(
            "utf-8"
        )
    )
}


def answer(toolbox: Toolbox, call: dict[str, Any]) -> tuple[str, bool]:
    """The tool message the model reads for ``call`` and whether it is an error."""
    result = toolbox.call(call["name"], dict(call["arguments"]), requestor=call["requestor"])
    return result.as_text(), not result.ok


@pytest.mark.parametrize("probe", PROBES["probes"], ids=lambda p: p["task"])
def test_every_call_answers_and_changes_as_tau2s_environment(
    probe: dict[str, Any], store: hx.Store, clock: FakeClock
) -> None:
    env = TelecomEnvironment()
    env.initialize(TASKS[probe["task"]]["initial_state"]["initialization_actions"])
    hashes = len(probe["answers"][0]["db_hash"])
    with hx.Episode(state=env.state, store=store, clock=clock) as ep:
        toolbox = Toolbox(env.tools, ep, env)
        for i, (call, theirs) in enumerate(zip(PROBES["sequence"], probe["answers"], strict=True)):
            at = f"call {i} {call['requestor']} {call['name']}({call['arguments']})"
            content, error = answer(toolbox, call)
            assert (content, error) == (theirs["content"], theirs["error"]), at
            assert env.db_hash()[:hashes] == theirs["db_hash"], at
            assert env.user_db_hash()[:hashes] == theirs["user_db_hash"], at


@pytest.mark.parametrize("probe", PROBES["function_probes"], ids=lambda p: p["task"])
def test_the_functions_tasks_set_up_and_score_with_answer_as_tau2s(probe: dict[str, Any]) -> None:
    """From a task's initial state, the functions initialization actions and env assertions
    name (breaking and fixing the phone, locking the SIM, overdue bills, every assertion) return
    what tau2's ``run_env_function_call`` returned, raise where it raised, and leave both
    databases with its hashes after every call."""
    env = TelecomEnvironment()
    env.initialize(TASKS[probe["task"]]["initial_state"]["initialization_actions"])
    hashes = len(probe["answers"][0]["db_hash"])
    for i, (call, theirs) in enumerate(zip(PROBES["functions"], probe["answers"], strict=True)):
        at = f"call {i} {call['env_type']} {call['name']}({call['arguments']})"
        try:
            ours: dict[str, Any] = {
                "value": plain(
                    env.run_env_function_call(call["env_type"], call["name"], call["arguments"])
                )
            }
        except Exception as exc:
            ours = {"error": f"{type(exc).__name__}: {exc}"}
        assert ours == {k: v for k, v in theirs.items() if k in ("value", "error")}, at
        assert env.db_hash()[:hashes] == theirs["db_hash"], at
        assert env.user_db_hash()[:hashes] == theirs["user_db_hash"], at

"""The telecom environment against tau2-bench's own: from each task's initial state, a fixed
sequence of 89 calls of both sides (every phone tool and every CRM tool, their errors, writes
that undo each other, a payment from request to phone) answers with the text tau2's
``Environment.get_response`` gave, marks the same calls as errors, and leaves both databases
with tau2's hashes after every call. ``telecom_probes.json`` was made with tau2's code by
``make_telecom_probes.py``; here each call goes through the harness's toolbox, writes of
either side as transactions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import harness as hx
from harness.agents.base import Toolbox
from harness.domains.telecom.environment import TelecomEnvironment
from harness.testing import FakeClock

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

"""The airline environment is tau2-bench's, word for word and change for change.

The reference data is in the shared folder beside the repository (``../shared/data/tau2-airline``:
``tools.json``, ``errors.json``, ``policy.md``, ``gold.json``, made with tau2's own code); tests
that need it skip when it is absent. The tool definitions the agent is handed, every tool message
of a failing call, and every reference replay (its failures, results, changed records and their
fingerprint) are compared with it, while every write runs as a transaction underneath.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator
from typing import Any

import pytest

import harness as hx
from harness.agents.base import Toolbox
from harness.domains.airline import POLICY, AirlineEnvironment, AirlineError, AirlineTools, db
from harness.domains.airline.actions import PRECONDITIONS
from harness.domains.airline.tools import WRITE_TOOLS
from harness.domains.records import changes_fingerprint
from harness.testing import FakeClock
from tests.domains.tau2_reference import Fresh, Reference, Rows, replay_as_gold, stored_rows

AIRLINE = Reference("airline")
FAILED = (hx.PreconditionFailed, hx.ActionFailed, AirlineError)
"""What counts as ``ok=false``: a refusal, a failed action, a tool's own refusal."""
REFERENCE = AIRLINE.folder
needs_reference = AIRLINE.needed
_reference, _params = AIRLINE.load, AIRLINE.params


def _rows(env: AirlineEnvironment) -> Rows:
    return stored_rows(env, db.DATABASE)


@pytest.fixture(scope="module")
def fresh() -> Fresh:
    return Fresh(AirlineEnvironment)


@pytest.fixture
def env() -> Iterator[AirlineEnvironment]:
    with AirlineEnvironment() as environment:
        yield environment


def _episode(env: AirlineEnvironment, store: str | hx.Store, **kw: Any) -> hx.Episode:
    return hx.Episode(state=env.state, store=store, clock=kw.pop("clock", FakeClock()), **kw)


# -- the data, the tool definitions and the policy ---------------------------------------------


@needs_reference
def test_a_fresh_database_exports_the_reference_db_json(fresh: Fresh) -> None:
    """A fresh environment's export is the reference ``db.json``, record for record, with
    gift-card and certificate amounts still floats."""
    assert fresh.export == _reference("db.json")
    amounts = [
        m["amount"]
        for user in fresh.export["users"].values()
        for m in user["payment_methods"].values()
        if m["source"] != "credit_card"
    ]
    assert amounts and all(type(a) is float for a in amounts)


@needs_reference
def test_tool_definitions_are_tau2s_whole_function_objects() -> None:
    """``AirlineEnvironment.tool_defs()`` equals ``tools.json`` (names, descriptions, parameter
    schemas with ``$defs`` and ``title`` keys), in tau2's order and key order; it is a copy."""
    defs = AirlineEnvironment.tool_defs()
    assert defs == _reference("tools.json")
    assert [d["function"]["name"] for d in defs] == [
        d["function"]["name"] for d in _reference("tools.json")
    ]
    for spec in defs:
        assert list(spec) == ["type", "function"]
        assert list(spec["function"]) == ["name", "description", "parameters"]
        keys = ["$defs", "properties", "required", "title", "type"]
        assert list(spec["function"]["parameters"]) == [
            k for k in keys if k in spec["function"]["parameters"]
        ]
    defs[0]["function"]["name"] = "changed"
    assert AirlineEnvironment.tool_defs() == _reference("tools.json")


def test_tool_definitions_fit_the_tools_that_run(env: AirlineEnvironment) -> None:
    """Each definition names exactly the arguments of the tool that runs, all required, and
    every tool the environment offers is defined, in the definitions' order."""
    defs = AirlineEnvironment.tool_defs()
    assert list(env.tools) == [d["function"]["name"] for d in defs]
    for spec in defs:
        name, parameters = spec["function"]["name"], spec["function"]["parameters"]
        params = list(inspect.signature(getattr(AirlineTools, name)).parameters)[1:]
        assert list(parameters["properties"]) == params, name
        assert parameters.get("required", []) == params, name
    assert sorted(env.actions) == sorted(WRITE_TOOLS)


@needs_reference
def test_the_policy_is_tau2s_word_for_word(env: AirlineEnvironment) -> None:
    """The policy the agent is given is tau2's airline ``policy.md``."""
    assert env.policy == POLICY == (REFERENCE / "policy.md").read_text(encoding="utf-8")


# -- failing calls -----------------------------------------------------------------------------


@needs_reference
@pytest.mark.parametrize("case", _params("errors.json", "{i}-{tool}"))
def test_a_probe_reads_as_tau2s_tool_message(
    case: dict[str, Any], env: AirlineEnvironment, shared_store: hx.Store
) -> None:
    """Each probe of ``errors.json``, made through the toolbox on a fresh database, gives the
    model exactly tau2's tool message and changes nothing; a refused write is refused before
    the tool runs, by a precondition the store names."""
    name = case["tool"]
    before = _rows(env)
    with _episode(env, shared_store) as ep:
        result = Toolbox(env.tools, ep, env).call(name, json.loads(json.dumps(case["arguments"])))
    assert result.as_text() == case["content"]
    assert result.ok is not case["error"]
    assert _rows(env) == before
    txns = shared_store.transactions(ep.id)
    if name in env.actions:
        statuses = [(t.status, t.reason.split(": ", 1)[0]) for t in txns]
        checks = {c.__name__ for c in PRECONDITIONS[name]}
        refused = [s for s, reason in statuses if s in ("precondition", "invalid")]
        assert refused == [s for s, _ in statuses] and len(statuses) <= 1
        assert all(reason in checks for s, reason in statuses if s == "precondition")
    else:
        assert txns == []


def test_the_harness_refusal_keeps_its_reason_while_the_model_reads_upstreams(
    env: AirlineEnvironment, shared_store: hx.Store
) -> None:
    """A certificate paying for bags is refused by ``not_a_certificate`` (in the store, with its
    docstring), while the model reads upstream's sentence."""
    user = next(
        u
        for u in env.export()["users"].values()
        if u["reservations"]
        and any(m["source"] == "certificate" for m in u["payment_methods"].values())
    )
    certificate = next(
        k for k, m in user["payment_methods"].items() if m["source"] == "certificate"
    )
    arguments = {
        "reservation_id": user["reservations"][0],
        "total_baggages": 1,
        "nonfree_baggages": 0,
        "payment_id": certificate,
    }
    with _episode(env, shared_store) as ep:
        result = Toolbox(env.tools, ep, env).call("update_reservation_baggages", arguments)
    assert result.as_text() == "Error: Certificate cannot be used to update reservation"
    (txn,) = shared_store.transactions(ep.id)
    assert txn.status == "precondition"
    assert (
        txn.reason == "not_a_certificate: A certificate cannot pay for a change to a reservation."
    )
    with pytest.raises(AirlineError, match="^Certificate cannot be used to update reservation$"):
        env.backend.update_reservation_baggages(**arguments)


# -- reference replays -------------------------------------------------------------------------


@needs_reference
@pytest.mark.parametrize("task", _params("gold.json", "task-{task_id}"))
def test_replay_through_the_harness_changes_exactly_what_tau2_changes(
    task: dict[str, Any], fresh: Fresh, shared_store: hx.Store
) -> None:
    """Replaying a task's reference actions as transactions fails, returns and changes exactly
    what tau2's own tools did: the same records with the same values (``98.0`` stays a float)
    and the same fingerprint; every write commits as a transaction."""
    with AirlineEnvironment() as env:
        ep = replay_as_gold(
            env, task, shared_store, (hx.PreconditionFailed, hx.ActionFailed, AirlineError)
        )
        changes = fresh.changes(env)
    assert changes == task["changes"]
    assert changes_fingerprint(changes) == task["changes_fingerprint"]
    writes = [a for a in task["actions"] if a["name"] in WRITE_TOOLS]
    assert [t.status for t in shared_store.transactions(ep.id)] == ["committed"] * len(writes)


@needs_reference
def test_tool_messages_of_the_gold_writes_read_as_tau2_serialises_them(
    shared_store: hx.Store,
) -> None:
    """Through the toolbox, a write's tool message is tau2's result as tau2 serialises it
    (``json.dumps`` of the model's dump, in its field order; a string as it is)."""
    seen = 0
    for task in _reference("gold.json"):
        if not any("result" in a for a in task["actions"]):
            continue
        with AirlineEnvironment() as env, _episode(env, shared_store) as ep:
            toolbox = Toolbox(env.tools, ep, env)
            for action in task["actions"]:
                result = toolbox.call(action["name"], json.loads(json.dumps(action["arguments"])))
                if "result" in action:
                    value = action["result"]
                    expected = value if isinstance(value, str) else json.dumps(value, default=str)
                    assert result.as_text() == expected, (task["task_id"], action["name"])
                    seen += 1
    assert seen > 0

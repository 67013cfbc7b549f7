"""The built-in airline suite (``tasks/airline``, tau2-bench's 50 airline tasks) and the airline
writes as transactions: the scripted agent passes every task, a tau2 ``tasks.json`` runs on the
built-in environment, each trial's environment is its own, and a rollback or a lost
acknowledgement leaves exactly what upstream's tools would."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import harness as hx
from harness.cli import main
from harness.domains.airline import AirlineEnvironment
from harness.testing import FakeClock

AIRLINE = Path(__file__).resolve().parents[2] / "tasks" / "airline"
USER = "mia_li_3668"
BOOKING: dict[str, Any] = {
    "user_id": USER,
    "origin": "JFK",
    "destination": "SEA",
    "flight_type": "one_way",
    "cabin": "economy",
    "flights": [
        {"flight_number": "HAT136", "date": "2024-05-20"},
        {"flight_number": "HAT039", "date": "2024-05-20"},
    ],
    "passengers": [{"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05"}],
    "payment_methods": [
        {"payment_id": "certificate_7504069", "amount": 250},
        {"payment_id": "credit_card_4421486", "amount": 5},
    ],
    "total_baggages": 3,
    "nonfree_baggages": 0,
    "insurance": "no",
}
"""Task 20's booking (upstream's reference): a certificate used up, two flights' seats taken."""


@pytest.fixture
def env() -> Iterator[AirlineEnvironment]:
    with AirlineEnvironment() as environment:
        yield environment


def _summary(out: Any) -> str:
    return " ".join(out.output.split())


def test_the_scripted_agent_passes_every_task_of_the_builtin_suite(tmp_path: Path) -> None:
    """``harness run airline --agent scripted`` passes all 50 tasks (pass^1 = 1)."""
    logs = tmp_path / "logs"
    args = ["run", "airline", "--agent", "scripted", "--trials", "1", "--logs", str(logs)]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    assert "passed 50, failed 0, infrastructure 0" in _summary(out), out.output
    assert "airline x 1: 50/50 done" in _summary(out), out.output


def test_a_tau2_tasks_file_runs_on_the_builtin_environment(tmp_path: Path) -> None:
    """A tau2-format airline ``tasks.json`` (here five of upstream's tasks, writes among them)
    runs on the built-in airline environment, and the scripted agent passes it."""
    upstream = json.loads((AIRLINE / "tau2_tasks.json").read_text(encoding="utf-8"))
    chosen = [t for t in upstream if t["id"] in {"0", "5", "11", "20", "23"}]
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(chosen), encoding="utf-8")
    assert hx.load_suite(path).name == "tau2-airline"
    args = [
        "run",
        str(path),
        "--agent",
        "scripted",
        "--trials",
        "1",
        "--logs",
        str(tmp_path / "logs"),
    ]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    assert "passed 5, failed 0" in _summary(out), out.output


def test_the_suite_is_upstreams_fifty_tasks_as_the_generator_writes_them() -> None:
    """tasks.json is exactly make_tasks.py's output, and holds upstream's 50 tasks (ids,
    reference actions and what to communicate) in upstream's order."""
    spec = importlib.util.spec_from_file_location("airline_make_tasks", AIRLINE / "make_tasks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.render() == (AIRLINE / "tasks.json").read_text("utf-8")
    upstream = json.loads((AIRLINE / "tau2_tasks.json").read_text(encoding="utf-8"))
    suite = hx.load_suite("airline", check_references=False)
    assert [t.id for t in suite.tasks] == [t["id"] for t in upstream] == [str(i) for i in range(50)]
    for task, raw in zip(suite.tasks, upstream, strict=True):
        criteria = raw["evaluation_criteria"]
        assert [(c.name, c.arguments) for c in task.reference_actions] == [
            (a["name"], a["arguments"]) for a in criteria["actions"] or []
        ]
        assert task.required_outputs == (criteria["communicate_info"] or [])


def test_each_trial_gets_an_environment_of_its_own(tmp_path: Path) -> None:
    """A booking in one trial's environment is not in the next one's: each is a fresh copy."""
    suite = hx.load_suite("airline", check_references=False)
    first = suite.new_environment()
    try:
        with hx.Episode(state=first.state, store=f"sqlite:///{tmp_path}/h.db", clock=FakeClock()):
            booked = first.tools["book_reservation"](**BOOKING)
        assert first.state.get(f"reservations/{booked['reservation_id']}") is not None
        second = suite.new_environment()
        try:
            assert second.state.get(f"reservations/{booked['reservation_id']}") is None
            assert "certificate_7504069" in second.state.get(f"users/{USER}")["payment_methods"]
            assert second.state.connection is not first.state.connection
        finally:
            second.close()
    finally:
        first.close()


def test_a_rollback_undoes_a_booking_a_certificate_and_a_cancellation(
    env: AirlineEnvironment, tmp_path: Path
) -> None:
    """Compensating a booking (the reservation removed, seats and certificate back), a
    certificate sent and a cancellation, newest first, leaves the database as it was."""
    before = env.export()
    with hx.Episode(state=env.state, store=f"sqlite:///{tmp_path}/h.db", clock=FakeClock()) as ep:
        booked = env.tools["book_reservation"](**BOOKING)
        env.tools["send_certificate"](user_id=USER, amount=100)
        env.tools["cancel_reservation"](reservation_id=booked["reservation_id"])
        assert env.export() != before
        ep.rollback()
    assert ep.outcome == "rolled_back"
    assert env.export() == before


def test_a_lost_acknowledgement_is_recovered_without_booking_twice(
    env: AirlineEnvironment, tmp_path: Path
) -> None:
    """A booking whose answer is lost after it took effect is recovered from the state (the
    agent gets upstream's reservation) and never booked a second time (no ``HATHAU``)."""
    real = env.backend.book_reservation
    runs: list[str] = []

    def lost(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        runs.append(result["reservation_id"])
        raise hx.TransientError("acknowledgement lost")

    env.backend.book_reservation = lost  # type: ignore[method-assign]
    with hx.Episode(state=env.state, store=f"sqlite:///{tmp_path}/h.db", clock=FakeClock()):
        booked = env.tools["book_reservation"](**BOOKING)
    assert runs == ["HATHAT"]
    assert booked == env.backend.get_reservation_details("HATHAT")
    assert env.state.get("reservations/HATHAU") is None
    assert "certificate_7504069" not in env.state.get(f"users/{USER}")["payment_methods"]


@pytest.mark.parametrize("written", [99.0, 100], ids=["wrong-amount", "integer-amount"])
def test_a_silent_tool_is_caught_by_the_postcondition_and_undone(
    env: AirlineEnvironment, tmp_path: Path, written: float
) -> None:
    """A certificate tool that writes another amount than upstream's (99.0, or the integer 100
    where upstream's model stores the float 100.0) fails its postcondition and is compensated:
    nothing stays."""
    before = env.state.get(f"users/{USER}")

    def wrong(user_id: str, amount: int) -> str:
        user = env.backend.get_user_details(user_id)
        user["payment_methods"]["certificate_3221322"] = {
            "source": "certificate",
            "id": "certificate_3221322",
            "amount": written,
        }
        env.backend._put("users", user)
        return "Certificate certificate_3221322 added"

    env.backend.send_certificate = wrong  # type: ignore[method-assign]
    with hx.Episode(state=env.state, store=f"sqlite:///{tmp_path}/h.db", clock=FakeClock()):
        with pytest.raises(hx.ActionFailed) as failed:
            env.tools["send_certificate"](user_id=USER, amount=100)
    assert failed.value.failure_class == "silent"
    assert env.state.get(f"users/{USER}") == before

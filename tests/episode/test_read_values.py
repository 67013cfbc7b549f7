"""Reads are values too, and arguments are bounded: what JSON cannot hold is refused, recorded."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from collections.abc import Callable
from typing import Any

import pytest

import harness as hx
from harness.agents.base import Toolbox
from harness.runs.toolbox import RecordingToolbox
from harness.store.tables import LogRow
from harness.testing import FakeClock


class Plain:
    """A class pydantic knows nothing about."""

    def __init__(self) -> None:
        self.x = 1


@dataclasses.dataclass
class Placed:
    """A dataclass: pydantic gives it a JSON form."""

    order_id: str
    placed: dt.date


def episode(store: hx.Store, **kw: Any) -> hx.Episode:
    """An episode on an empty DictState with a fake clock."""
    return hx.Episode(state=hx.DictState({}), store=store, clock=FakeClock(), **kw)


def remembered(store: hx.Store, episode_id: str) -> list[LogRow]:
    """The episode's log records of remembered reads."""
    return [r for r in store.log(episode_id) if r.kind == "recorded"]


def no_address(text: str) -> bool:
    """Whether ``text`` holds no memory address (what an object's repr shows)."""
    return " at 0x" not in text


# --- B. reads are values ---


def test_a_read_action_returning_an_object_is_refused_with_the_fix(store: hx.Store):
    """A read action returning an object() or a plain class instance is NotSerializable, the
    reason naming the fix, and the call is recorded as failed."""

    @hx.action
    def look():  # type: ignore[no-untyped-def]
        return object()

    @hx.action(name="look_plain")
    def look_plain():  # type: ignore[no-untyped-def]
        return Plain()

    with episode(store) as ep:
        for read in (look, look_plain):
            with pytest.raises(hx.NotSerializable) as info:
                read()
            assert "pydantic model or a dataclass" in str(info.value)
            assert no_address(str(info.value))
    assert [t.status for t in store.transactions(ep.id)] == ["failed", "failed"]
    assert ep.outcome == "committed"


def test_a_read_annotated_with_a_plain_class_is_refused_not_a_crash(store: hx.Store):
    """A read whose return annotation pydantic cannot store is NotSerializable, recorded, not a
    pydantic schema error escaping the transaction."""

    @hx.action
    def look() -> Plain:
        return Plain()

    with episode(store) as ep:
        with pytest.raises(hx.NotSerializable, match="return annotation Plain"):
            look()
    (txn,) = store.transactions(ep.id)
    assert txn.status == "failed" and "make Plain a pydantic model" in (txn.reason or "")


@pytest.mark.parametrize("recording", [True, False], ids=["recording", "plain-toolbox"])
def test_a_read_tool_returning_an_object_is_refused_in_the_toolbox(
    store: hx.Store, recording: bool
):
    """A read tool (a plain function) returning an object the agent cannot read as JSON gives
    ok=False with the fix, never ok=True with a repr; the recording toolbox logs the refusal."""

    def order(order_id: str) -> Any:
        """An order, as an object."""
        return Plain()

    with episode(store) as ep:
        box = (RecordingToolbox if recording else Toolbox)({"order": order}, ep)
        result = box.call("order", {"order_id": "o1"})
    assert not result.ok and result.kind == "fail_stop"
    assert "Plain" in (result.error or "") and "pydantic model or a dataclass" in (
        result.error or ""
    )
    assert no_address(result.as_text())
    if recording:
        (row,) = remembered(store, ep.id)
        assert '"ok":false' in row.payload and no_address(row.payload)


def test_a_read_tool_returning_a_dataclass_gives_the_agent_json(store: hx.Store):
    """A read tool returning a dataclass with a date gives the agent its JSON form, as its
    record holds it."""

    def when(order_id: str) -> Placed:
        """When the order was placed."""
        return Placed(order_id, dt.date(2024, 5, 1))

    with episode(store) as ep:
        result = RecordingToolbox({"when": when}, ep).call("when", {"order_id": "o1"})
    assert result.ok and result.content == {"order_id": "o1", "placed": "2024-05-01"}
    assert result.as_text() == '{"order_id":"o1","placed":"2024-05-01"}'


def test_a_remembered_value_is_durable_on_its_own_and_given_back_after_a_crash(
    store: hx.Store, store_url: str
):
    """A remembered value is written as an intent is, a single-row commit: in the log at once
    while the episode's row (its witness) waits for the next write. A process that dies there
    leaves a store that verifies (a crashed episode may end with such records past its
    witness), and the resumed episode gets the recorded value without computing it again."""
    pid = os.fork()
    if pid == 0:  # the child: remembers a value, then dies
        code = 1
        try:
            mine = hx.Store(store_url)
            ep = episode(mine, episode_id="e1")
            ep.__enter__()
            if ep.remember("read", {"item": "apple"}, lambda: {"stock": 7}) == {"stock": 7}:
                code = 0
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    (row,) = remembered(store, "e1")
    found = store.episode("e1")
    assert found is not None and row.seq > found.log_count and found.status == "running"
    assert store.verify_chain("e1").ok
    computed: list[int] = []
    with episode(store, episode_id="e1", resume=True) as again:
        assert again.remember("read", {"item": "apple"}, lambda: computed.append(1)) == {"stock": 7}
    assert computed == []
    assert store.verify_chain("e1").ok
    found = store.episode("e1")
    assert found is not None and found.log_count == len(store.log("e1"))


def test_a_value_remembered_after_a_rollback_then_a_crash_verifies(store: hx.Store, store_url: str):
    """An episode rolled back is still open, and its agent's next model answer is remembered;
    a process that dies right after leaves that record past the witness of a rolled-back
    episode, which verifies (only remembered values may be there)."""
    pid = os.fork()
    if pid == 0:  # the child: rolls back, remembers a value, then dies
        code = 1
        try:
            ep = episode(hx.Store(store_url), episode_id="e1")
            ep.__enter__()
            ep.rollback()
            if ep.remember("model_call", {"turn": 1}, lambda: {"text": "sorry"}) is not None:
                code = 0
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    found = store.episode("e1")
    assert found is not None and found.status == "rolled_back"
    (row,) = remembered(store, "e1")
    assert row.seq > found.log_count
    assert store.verify_chain("e1").ok
    edit = store.raw_connection()
    edit.execute("UPDATE hx_log SET kind = 'committed' WHERE id = ?", (row.id,))
    edit.close()
    assert not store.verify_chain("e1").ok  # (anything else there is still caught)


# --- C. arguments nested too deep ---


def nested_list(depth: int) -> Any:
    """A list nested ``depth`` deep."""
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def nested_dict(depth: int) -> Any:
    """A dict nested ``depth`` deep."""
    value: Any = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def cycle() -> Any:
    """A list that contains itself."""
    value: list[Any] = []
    value.append(value)
    return value


DEEP: dict[str, Callable[[], Any]] = {
    "list-100000": lambda: nested_list(100_000),
    "dict-5000": lambda: nested_dict(5_000),
    "dict-400": lambda: nested_dict(400),
    "cycle": cycle,
}


@pytest.mark.parametrize("value", DEEP.values(), ids=DEEP.keys())
@pytest.mark.parametrize("kind", ["write", "read", "async"])
def test_an_argument_nested_too_deep_is_invalid_arguments(
    store: hx.Store, value: Callable[[], Any], kind: str
):
    """An argument nested too deep (or holding a cycle) is InvalidArguments naming the problem:
    the tool never runs, the call is recorded as invalid and the store verifies."""
    ran: list[str] = []

    def tool(k: str, v: Any) -> None:
        ran.append(k)

    async def atool(k: str, v: Any) -> None:
        ran.append(k)

    act: hx.Action[..., Any]
    if kind == "write":
        act = hx.action(tool, writes=["x/{k}"])
    elif kind == "read":
        act = hx.action(tool)
    else:
        act = hx.action(atool, writes=["x/{k}"])
    with episode(store) as ep:
        with pytest.raises(hx.InvalidArguments) as info:
            if kind == "async":
                import asyncio

                asyncio.run(act("k", value()))  # type: ignore[arg-type]
            else:
                act("k", value())
    assert ("nested too deep" in str(info.value)) or ("cycle" in str(info.value))
    assert ran == []
    (txn,) = store.transactions(ep.id)
    assert txn.status == "invalid"
    assert store.verify().ok


def test_a_deep_argument_from_the_toolbox_is_an_answer_for_the_agent(store: hx.Store):
    """A model's tool call with an argument nested too deep comes back as an invalid-arguments
    result the agent reads, not a traceback."""

    @hx.action(writes=["x/{k}"])
    def put(k: str, v: Any) -> None:
        """Store v under k."""

    with episode(store) as ep:
        result = RecordingToolbox({"put": put}, ep).call("put", {"k": "a", "v": nested_dict(5000)})
    assert not result.ok and result.kind == "invalid" and "nested too deep" in (result.error or "")
    assert ep.outcome == "committed"

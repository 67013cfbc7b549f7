"""OpenTelemetry traces of episodes, calls and compensations (harness.integrations.otel).

Spans go to the SDK's in-memory exporter through a SimpleSpanProcessor, so each test reads
exactly the spans its episode made; each also checks the store, so the trace is shown to tell
what the records say.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode

import harness as hx
from harness import observe
from harness.integrations import otel
from harness.integrations._calls import call
from harness.testing import FakeClock

from ..conftest import Shop


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, into an in-memory exporter; off again after the test."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(tracer_provider=provider)
    yield exporter
    otel.uninstrument()
    provider.shutdown()


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    """The finished spans whose name starts with ``prefix``, in the order they ended."""
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def one(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    """The one finished span called ``name``."""
    found = [s for s in exporter.get_finished_spans() if s.name == name]
    assert len(found) == 1, [s.name for s in exporter.get_finished_spans()]
    return found[0]


def parent_of(span: ReadableSpan) -> int | None:
    """The span id of ``span``'s parent (None: a root)."""
    return span.parent.span_id if span.parent is not None else None


def log_lines(store_url: str) -> list[dict[str, Any]]:
    """The JSON-lines log written beside the store."""
    path = Path(store_url.removeprefix("sqlite:///")).with_suffix(".jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def cancel_action(shop: Shop, **kw: Any) -> hx.Action[Any, Any]:
    """``cancel(order_id)``: a keyed, compensable write to one order."""

    @hx.action(writes=["orders/{order_id}"], idempotency_key=lambda a: a.order_id, **kw)
    def cancel(order_id: str) -> dict[str, Any]:
        """Cancel a pending order."""
        return shop.set_status(order_id, "cancelled")

    @cancel.precondition
    def is_pending(ctx: hx.Context) -> bool:
        """The order is pending."""
        return bool(ctx.state.get(f"orders/{ctx.args.order_id}")["status"] == "pending")

    cancel.compensation(shop.restore)
    return cancel


def test_import_harness_imports_no_opentelemetry(tmp_path: Path) -> None:
    """``import harness`` and a whole episode with a call load no OpenTelemetry module."""
    code = (
        "import sys, harness as hx\n"
        "db = hx.DictState({'k/a': 0})\n"
        "@hx.action(writes=['k/{name}'])\n"
        "def bump(name: str) -> int:\n"
        "    db[f'k/{name}'] = db[f'k/{name}'] + 1\n"
        "    return db[f'k/{name}']\n"
        f"with hx.Episode(state=db, store='sqlite:///{tmp_path}/h.db'):\n"
        "    bump('a')\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_committed_call_is_an_execute_tool_span(
    spans: InMemorySpanExporter, shop: Shop, store_url: str
) -> None:
    """A committed call is one ``execute_tool`` span, child of the episode's span, with the
    GenAI tool attributes and the transaction's id, key, status, attempts and step."""
    cancel = cancel_action(shop)
    with hx.Episode(state=shop.state, store=store_url, run_id="r1", task_id="t1", trial=2) as ep:
        cancel("o1")
    (row,) = hx.Store(store_url).transactions(ep.id)
    assert row.status == "committed" and shop.applied == [("o1", "cancelled")]

    span = one(spans, "execute_tool cancel")
    episode = one(spans, "harness.episode")
    assert span.kind is SpanKind.INTERNAL
    assert parent_of(span) == episode.context.span_id
    assert span.context.trace_id == episode.context.trace_id
    assert span.status.status_code is StatusCode.UNSET
    assert dict(span.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "cancel",
        "gen_ai.tool.type": "function",
        "gen_ai.tool.description": "Cancel a pending order.",
        "harness.episode.id": ep.id,
        "harness.txn.id": row.id,
        "harness.idempotency_key": row.idem_key,
        "harness.mutating": True,
        "harness.txn.status": "committed",
        "harness.attempts": 1,
        "harness.step": 1,
    }
    assert dict(episode.attributes or {}) == {
        "harness.episode.id": ep.id,
        "harness.episode.resume": False,
        "harness.run.id": "r1",
        "harness.task.id": "t1",
        "harness.trial": 2,
        "harness.episode.outcome": "committed",
        "harness.episode.steps": 1,
    }
    assert episode.parent is None and episode.status.status_code is StatusCode.UNSET


def test_failed_precondition_is_an_error_span(
    spans: InMemorySpanExporter, shop: Shop, store_url: str
) -> None:
    """A call its precondition refuses has an ERROR span naming the class, the decision and
    the exception, and nothing ran."""
    cancel = cancel_action(shop)
    with hx.Episode(state=shop.state, store=store_url) as ep:
        with pytest.raises(hx.PreconditionFailed):
            cancel("o3")  # delivered, not pending
    (row,) = hx.Store(store_url).transactions(ep.id)
    assert (row.status, row.decision) == ("precondition", "continue")
    assert shop.applied == [] and shop.state["orders/o3"]["status"] == "delivered"

    span = one(spans, "execute_tool cancel")
    attributes = span.attributes or {}
    assert span.status.status_code is StatusCode.ERROR
    assert "precondition 'is_pending' is false" in (span.status.description or "")
    assert attributes["harness.txn.status"] == "precondition"
    assert attributes["harness.failure_class"] == "precondition"
    assert attributes["harness.decision"] == "continue"
    assert attributes["harness.txn.id"] == row.id
    assert attributes["harness.attempts"] == 0
    assert attributes["error.type"] == "harness.errors.PreconditionFailed"
    assert [e.name for e in span.events] == ["exception"]
    # The episode goes on: a refusal is the agent's to handle.
    assert ep.outcome == "committed"
    assert one(spans, "harness.episode").status.status_code is StatusCode.UNSET


def test_rollback_makes_a_compensation_span_per_undone_call(
    spans: InMemorySpanExporter, shop: Shop, store_url: str
) -> None:
    """When a failure rolls the episode back, each committed call's compensation is a span,
    newest first, under the failing call's span; the state is back and the store agrees."""
    cancel = cancel_action(shop)

    @hx.action(writes=["audit/count"], idempotency_key=lambda a: "boom")
    def boom() -> None:
        """Fail before any change."""
        raise RuntimeError("down")

    policy = hx.Policy(decisions={hx.FailureClass.FAIL_STOP: hx.Decision.ROLLBACK})
    with hx.Episode(state=shop.state, store=store_url, policy=policy) as ep:
        cancel("o1")
        cancel("o2")
        with pytest.raises(hx.ActionFailed):
            boom()
    assert ep.outcome == "rolled_back"
    rows = hx.Store(store_url).transactions(ep.id)
    assert [(r.action, r.status) for r in rows] == [
        ("cancel", "compensated"),
        ("cancel", "compensated"),
        ("boom", "failed"),
    ]
    assert shop.state["orders/o1"]["status"] == shop.state["orders/o2"]["status"] == "pending"

    failing = one(spans, "execute_tool boom")
    attributes = failing.attributes or {}
    assert failing.status.status_code is StatusCode.ERROR
    assert (attributes["harness.failure_class"], attributes["harness.decision"]) == (
        "fail_stop",
        "rollback",
    )
    assert attributes["harness.txn.status"] == "failed"
    undone = named(spans, "compensate ")
    assert [(s.attributes or {})["harness.txn.id"] for s in undone] == [rows[1].id, rows[0].id]
    for span in undone:
        assert span.name == "compensate cancel"
        assert parent_of(span) == failing.context.span_id
        assert (span.attributes or {})["harness.rollback"] is True
        assert (span.attributes or {})["harness.compensation.semantic"] is False
        assert span.status.status_code is StatusCode.UNSET
    assert (one(spans, "harness.episode").attributes or {})["harness.episode.outcome"] == (
        "rolled_back"
    )


def test_failed_compensation_is_an_error_span(
    spans: InMemorySpanExporter, shop: Shop, store_url: str
) -> None:
    """An undo that raises is an ERROR compensation span, and the call's span carries the
    escalation a person must resolve."""

    @hx.action(writes=["orders/{order_id}"], idempotency_key=lambda a: a.order_id)
    def ship(order_id: str) -> None:
        """Ship an order, then lose the answer."""
        shop.set_status(order_id, "shipped")
        raise RuntimeError("connection reset")

    @ship.compensation
    def unship(ctx: hx.Context) -> None:
        raise RuntimeError("undo refused")

    with hx.Episode(state=shop.state, store=store_url) as ep:
        with pytest.raises(hx.Escalated) as raised:
            ship("o1")
    (escalation,) = hx.Store(store_url).escalations(episode_id=ep.id)
    assert escalation.id == raised.value.escalation_id
    assert shop.state["orders/o1"]["status"] == "shipped"  # what the evidence says is left

    undo = one(spans, "compensate ship")
    assert undo.status.status_code is StatusCode.ERROR
    assert (undo.attributes or {})["harness.rollback"] is False  # its own attempt's undo
    assert (undo.attributes or {})["error.type"] == "harness.errors.CompensationFailed"
    call_span = one(spans, "execute_tool ship")
    assert parent_of(undo) == call_span.context.span_id
    attributes = call_span.attributes or {}
    assert attributes["harness.escalation.id"] == escalation.id
    assert attributes["harness.failure_class"] == "compensation"
    assert attributes["harness.decision"] == "escalate"
    assert attributes["error.type"] == "harness.errors.Escalated"
    episode = one(spans, "harness.episode")
    assert (episode.attributes or {})["harness.episode.outcome"] == "escalated"
    assert (episode.attributes or {})["harness.escalation.id"] == escalation.id


def test_call_span_is_a_child_of_the_callers_span(
    spans: InMemorySpanExporter, shop: Shop, store_url: str
) -> None:
    """A call made inside a framework's span (an agent run) is that span's child, and a span
    started around the episode is the episode span's parent."""
    tracer = observe.installed().tracer  # type: ignore[union-attr]
    cancel = cancel_action(shop)
    with tracer.start_as_current_span("request") as request:
        with hx.Episode(state=shop.state, store=store_url):
            with tracer.start_as_current_span("invoke_agent shop") as run:
                cancel("o1")
    span = one(spans, "execute_tool cancel")
    episode = one(spans, "harness.episode")
    assert parent_of(span) == run.get_span_context().span_id
    assert parent_of(one(spans, "invoke_agent shop")) == episode.context.span_id
    assert parent_of(episode) == request.get_span_context().span_id
    assert len({s.context.trace_id for s in spans.get_finished_spans()}) == 1


def test_calls_from_threads_each_get_their_own_span(
    spans: InMemorySpanExporter, store_url: str
) -> None:
    """Calls made at once from threads are one span each, under the span of the thread that
    made it (or the episode's, for a thread with none), each with its own transaction."""
    tracer = observe.installed().tracer  # type: ignore[union-attr]
    state = hx.DictState({f"acct/{i}": 0 for i in range(6)})
    lock = threading.Lock()
    runs: list[int] = []

    @hx.action(writes=["acct/{n}"], idempotency_key=lambda a: str(a.n))
    def deposit(n: int) -> int:
        """Add one to account n."""
        with lock:
            runs.append(n)
        state[f"acct/{n}"] = state[f"acct/{n}"] + 1
        return n

    def worker(n: int) -> int:
        with tracer.start_as_current_span(f"worker {n}"):
            return int(deposit(n))

    with hx.Episode(state=state, store=store_url) as ep:
        with hx.ContextExecutor(max_workers=4) as pool:
            assert sorted(pool.map(worker, range(4))) == [0, 1, 2, 3]
        # Threads started with no context of the caller's: the episode given explicitly.
        bare = [
            threading.Thread(target=call, args=(deposit, {"n": n}), kwargs={"episode": ep})
            for n in (4, 5)
        ]
        for t in bare:
            t.start()
        for t in bare:
            t.join()
    rows = hx.Store(store_url).transactions(ep.id)
    assert sorted(r.status for r in rows) == ["committed"] * 6
    assert sorted(runs) == [0, 1, 2, 3, 4, 5]  # each ran once
    assert all(state[f"acct/{i}"] == 1 for i in range(6))

    calls = named(spans, "execute_tool deposit")
    assert len(calls) == 6
    by_txn = {(s.attributes or {})["harness.txn.id"]: s for s in calls}
    assert set(by_txn) == {r.id for r in rows}  # one span per transaction
    workers = {s.name: s.context.span_id for s in named(spans, "worker ")}
    episode = one(spans, "harness.episode")
    for row in rows:
        n = row.args["n"]
        expected = workers[f"worker {n}"] if n < 4 else episode.context.span_id
        assert parent_of(by_txn[row.id]) == expected
        assert (by_txn[row.id].attributes or {})["harness.idempotency_key"] == row.idem_key


def test_log_lines_carry_the_current_span_ids(
    spans: InMemorySpanExporter, shop: Shop, store_url: str
) -> None:
    """Every line of the episode's JSON-lines log carries trace_id and span_id: a call's
    lines its span's, the episode's lines the episode span's."""
    cancel = cancel_action(shop)
    with hx.Episode(state=shop.state, store=store_url) as ep:
        cancel("o1")
        with pytest.raises(hx.PreconditionFailed):
            cancel("o3")
    lines = [line for line in log_lines(store_url) if line["episode_id"] == ep.id]
    episode = one(spans, "harness.episode")
    trace_id = format(episode.context.trace_id, "032x")
    assert lines and all(line["trace_id"] == trace_id for line in lines)
    by_event = {line["event"]: line for line in lines}
    calls = {(s.attributes or {})["harness.txn.status"]: s for s in named(spans, "execute_tool")}
    assert by_event["committed"]["span_id"] == format(calls["committed"].context.span_id, "016x")
    assert by_event["precondition_failed"]["span_id"] == format(
        calls["precondition"].context.span_id, "016x"
    )
    for event in ("episode_start", "episode_end"):
        assert by_event[event]["span_id"] == format(episode.context.span_id, "016x")


def test_retries_are_span_events(
    spans: InMemorySpanExporter, shop: Shop, store_url: str, clock: FakeClock
) -> None:
    """A transient failure retried is a ``harness.retry`` event on the call's span, which
    ends committed after two attempts."""
    failures = [hx.TransientError("busy")]

    @hx.action(writes=["audit/count"], idempotency_key=lambda a: "count")
    def count() -> int:
        """Count one."""
        if failures:
            raise failures.pop()
        shop.state["audit/count"] = {"n": shop.state["audit/count"]["n"] + 1}
        return 1

    with hx.Episode(state=shop.state, store=store_url, clock=clock) as ep:
        count()
    (row,) = hx.Store(store_url).transactions(ep.id)
    assert (row.status, row.attempts) == ("committed", 2)
    assert shop.state["audit/count"] == {"n": 1}
    span = one(spans, "execute_tool count")
    assert (span.attributes or {})["harness.attempts"] == 2
    assert (span.attributes or {})["harness.txn.status"] == "committed"
    (retry,) = span.events
    assert retry.name == "harness.retry"
    assert (retry.attributes or {})["harness.attempt"] == 1
    assert (retry.attributes or {})["error.type"] == "harness.errors.TransientError"


def test_calls_that_never_became_transactions(
    spans: InMemorySpanExporter, shop: Shop, store_url: str
) -> None:
    """Invalid arguments and a call answered from the record are spans too (``invalid``,
    ``recorded``), and the duplicate runs nothing."""
    cancel = cancel_action(shop)
    with hx.Episode(state=shop.state, store=store_url) as ep:
        cancel("o1")
        cancel("o1")  # same key: the recorded result
        with pytest.raises(hx.InvalidArguments):
            ep.call_mapping(cancel, {"order": "o1"})
    assert shop.applied == [("o1", "cancelled")]
    assert [r.status for r in hx.Store(store_url).transactions(ep.id)] == ["committed", "invalid"]
    statuses = [(s.attributes or {})["harness.txn.status"] for s in named(spans, "execute_tool")]
    assert statuses == ["committed", "recorded", "invalid"]
    invalid = named(spans, "execute_tool")[2]
    assert invalid.status.status_code is StatusCode.ERROR
    assert (invalid.attributes or {})["error.type"] == "harness.errors.InvalidArguments"
    assert "harness.txn.id" not in (invalid.attributes or {})


def test_approval_hold_and_tool_call_id(
    spans: InMemorySpanExporter, shop: Shop, store_url: str
) -> None:
    """A call held for approval is a ``held`` span with its escalation, and carries the tool
    call id the adapter gave."""
    cancel = cancel_action(shop, approval=True)
    with hx.Episode(state=shop.state, store=store_url) as ep:
        with observe.tool_call("call_7"), pytest.raises(hx.Escalated):
            cancel("o1")
    (escalation,) = hx.Store(store_url).escalations(episode_id=ep.id)
    assert shop.applied == []
    attributes = one(spans, "execute_tool cancel").attributes or {}
    assert attributes["gen_ai.tool.call.id"] == "call_7"
    assert attributes["harness.txn.status"] == "held"
    assert attributes["harness.failure_class"] == "approval"
    assert attributes["harness.escalation.id"] == escalation.id


async def test_async_calls_nest_under_the_tasks_span(
    spans: InMemorySpanExporter, shop: Shop, store_url: str
) -> None:
    """Async calls from concurrent tasks are each a child of their own task's span."""
    tracer = observe.installed().tracer  # type: ignore[union-attr]

    @hx.action(writes=["orders/{order_id}"], idempotency_key=lambda a: a.order_id)
    async def close(order_id: str) -> str:
        """Close an order."""
        await asyncio.sleep(0)
        shop.set_status(order_id, "closed")
        return order_id

    async def task(order_id: str) -> str:
        with tracer.start_as_current_span(f"task {order_id}"):
            return str(await close(order_id))

    async with hx.Episode(state=shop.state, store=store_url) as ep:
        assert list(await asyncio.gather(task("o1"), task("o2"))) == ["o1", "o2"]
    assert sorted(r.status for r in hx.Store(store_url).transactions(ep.id)) == ["committed"] * 2
    tasks = {s.name.split()[1]: s.context.span_id for s in named(spans, "task ")}
    for span in named(spans, "execute_tool close"):
        txn_args = span.attributes or {}
        row = next(
            r for r in hx.Store(store_url).transactions(ep.id) if r.id == txn_args["harness.txn.id"]
        )
        assert parent_of(span) == tasks[row.args["order_id"]]


def test_capture_content_records_arguments_and_result(shop: Shop, store_url: str) -> None:
    """With ``capture_content=True`` a call's arguments and result are on its span as JSON."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(provider, capture_content=True)
    try:
        cancel = cancel_action(shop)
        with hx.Episode(state=shop.state, store=store_url):
            cancel("o1")
    finally:
        otel.uninstrument()
    attributes = one(exporter, "execute_tool cancel").attributes or {}
    assert json.loads(str(attributes["gen_ai.tool.call.arguments"])) == {"order_id": "o1"}
    assert json.loads(str(attributes["gen_ai.tool.call.result"])) == {
        "order_id": "o1",
        "status": "cancelled",
    }


def test_instrument_and_uninstrument(shop: Shop, store_url: str) -> None:
    """A wrong provider is refused with the fix; after ``uninstrument`` no span is made and
    the log carries no ids."""
    with pytest.raises(hx.ConfigurationError, match="TracerProvider"):
        otel.instrument(tracer_provider="console")  # type: ignore[arg-type]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(provider)
    assert otel.instrumented()
    otel.uninstrument()
    assert not otel.instrumented() and observe.installed() is None
    cancel = cancel_action(shop)
    with hx.Episode(state=shop.state, store=store_url):
        cancel("o1")
    assert exporter.get_finished_spans() == ()
    assert all("trace_id" not in line for line in log_lines(store_url))


def test_thread_pool_without_context_still_finds_the_episode_span(
    spans: InMemorySpanExporter, shop: Shop, store_url: str
) -> None:
    """A rollback run from a plain pool thread (no span current there) puts its compensation
    spans under the episode's span, not in a trace of their own."""
    cancel = cancel_action(shop)
    with hx.Episode(state=shop.state, store=store_url) as ep:
        cancel("o1")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(ep.rollback).result()
    assert ep.outcome == "rolled_back"
    assert [r.status for r in hx.Store(store_url).transactions(ep.id)] == ["compensated"]
    undo = one(spans, "compensate cancel")
    assert parent_of(undo) == one(spans, "harness.episode").context.span_id
    assert (undo.attributes or {})["harness.rollback"] is True


def test_example_prints_the_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """examples/integrations/otel_example.py prints the tree its docstring shows."""
    path = Path(__file__).resolve().parents[2] / "examples" / "integrations" / "otel_example.py"
    spec = importlib.util.spec_from_file_location("otel_example", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main(f"sqlite:///{tmp_path / 'h.db'}")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "harness.episode  outcome=rolled_back"
    assert lines[1] == "  invoke_agent bank"
    assert (
        lines[2].startswith("    execute_tool deposit  status=precondition") and "ERROR" in lines[2]
    )
    assert lines[3].startswith("    execute_tool deposit  status=committed")
    assert lines[4].startswith("  compensate deposit")
    assert not otel.instrumented()


def test_adapters_pass_the_models_tool_call_id_to_the_span(
    spans: InMemorySpanExporter, shop: Shop, store_url: str
):
    """The Agents SDK's and Pydantic AI's call ids land on gen_ai.tool.call.id."""
    pytest.importorskip("agents")
    pytest.importorskip("pydantic_ai")
    import agents
    from agents.testing import ScriptedModel, assistant_message, function_call
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    from harness.integrations.openai_agents import tools
    from harness.integrations.pydantic_ai import as_tool

    cancel = cancel_action(shop)
    agents.set_tracing_disabled(True)
    model = ScriptedModel(
        [
            [function_call("cancel", {"order_id": "o1"}, call_id="sdk-1")],
            [assistant_message("ok")],
        ]
    )

    def scripted(messages: Any, info: Any) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("cancel", {"order_id": "o2"}, "pai-2")])
        return ModelResponse(parts=[TextPart("ok")])

    with hx.Episode(state=shop.state, store=store_url):
        agents.Runner.run_sync(agents.Agent(name="a", model=model, tools=tools(cancel)), "go")
        Agent(FunctionModel(scripted), tools=[as_tool(cancel)]).run_sync("go")
    ids = [s.attributes.get("gen_ai.tool.call.id") for s in named(spans, "execute_tool")]
    assert ids == ["sdk-1", "pai-2"]
    assert shop.applied == [("o1", "cancelled"), ("o2", "cancelled")]

"""OpenTelemetry traces of an episode (offline: the SDK's in-memory exporter).

Run it with ``python examples/integrations/otel_example.py``. An "agent run" span wraps two
calls: one refused by its precondition, one committed; then the episode rolls back, which
compensates the committed call. It prints the spans as a tree with the harness's attributes,
and a log line stamped with the trace and span ids::

    harness.episode  outcome=rolled_back
      invoke_agent bank
        execute_tool deposit  status=precondition  txn=...:1  ERROR
        execute_tool deposit  status=committed  txn=...:2
      compensate deposit  txn=...:2
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import harness as hx
from harness.integrations import otel

bank = hx.DictState({"accounts/a": {"balance": 0}})


@hx.action(writes=["accounts/{account}"])
def deposit(account: str, amount: int) -> dict[str, Any]:
    """Put money into an account."""
    balance = bank[f"accounts/{account}"]["balance"] + amount
    bank[f"accounts/{account}"] = {"balance": balance}
    return {"account": account, "balance": balance}


@deposit.precondition
def account_exists(ctx: hx.Context) -> bool:
    """the account does not exist"""
    return ctx.state.get(f"accounts/{ctx.args.account}") is not None


@deposit.compensation
def withdraw(ctx: hx.Context) -> None:
    bank[f"accounts/{ctx.args.account}"] = ctx.before[f"accounts/{ctx.args.account}"]


def show(spans: tuple[ReadableSpan, ...]) -> None:
    """Print the spans as a tree, parents first, with a few of their attributes."""
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in sorted(spans, key=lambda s: s.start_time or 0):
        children.setdefault(span.parent.span_id if span.parent else None, []).append(span)

    def walk(parent: int | None, depth: int) -> None:
        for span in children.get(parent, []):
            a = span.attributes or {}
            notes = [
                f"{label}={a[key]}"
                for label, key in (
                    ("outcome", "harness.episode.outcome"),
                    ("status", "harness.txn.status"),
                    ("txn", "harness.txn.id"),
                )
                if key in a
            ]
            if span.status.status_code is trace.StatusCode.ERROR:
                notes.append("ERROR")
            print("  " * depth + "  ".join([span.name, *notes]))
            walk(span.context.span_id, depth + 1)

    walk(None, 0)


def main(store: str) -> None:
    """Trace one episode into memory, then print its spans and a log line."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(tracer_provider=provider)
    tracer = provider.get_tracer("example")
    with hx.Episode(state=bank, store=store) as ep:
        with tracer.start_as_current_span("invoke_agent bank"):
            with contextlib.suppress(hx.PreconditionFailed):  # (a model would read why)
                deposit("z", 10)
            deposit("a", 10)
        ep.rollback()
    otel.uninstrument()
    show(exporter.get_finished_spans())
    log = Path(store.removeprefix("sqlite:///")).with_suffix(".jsonl")
    committed = next(json.loads(x) for x in log.read_text().splitlines() if '"committed"' in x)
    print({k: committed[k] for k in ("event", "txn_id", "trace_id", "span_id")})


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        main(f"sqlite:///{Path(folder) / 'harness.db'}")

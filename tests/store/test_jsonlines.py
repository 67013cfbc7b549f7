"""The JSON-lines log beside the store on a full disk: it never stops the harness, its lines
wait for space, and what it had to drop is counted and said."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.store import jsonlines
from harness.store.jsonlines import JsonLines

pytestmark = pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")


def _free(sink: JsonLines, target: Path) -> None:
    """Space again: the descriptor of a sink opened on /dev/full (where every write fails, no
    space left on device) now writes ``target``."""
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, sink._fd)
    os.close(fd)


def test_lines_wait_out_a_full_disk_and_are_written_in_order_once_there_is_space(
    tmp_path: Path,
) -> None:
    """Flushing on a full disk raises nothing; once there is space, every line queued before
    and after is written, whole and in order, none twice."""
    sink, target = JsonLines(Path("/dev/full")), tmp_path / "harness.jsonl"
    for n in range(10):
        sink.msg(json.dumps({"n": n}))
    sink.flush()  # no space: nothing raised
    sink.msg(json.dumps({"n": 10}))
    _free(sink, target)
    sink.close()
    assert [json.loads(x)["n"] for x in target.read_text().splitlines()] == list(range(11))
    assert sink.dropped == 0


def test_past_what_it_keeps_the_oldest_lines_are_dropped_counted_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk that lasts: the newest lines are kept up to the limit, the older ones are
    dropped whole and counted, and a line says how many once writing works again."""
    monkeypatch.setattr(jsonlines, "KEEP", 100)
    sink, target = JsonLines(Path("/dev/full")), tmp_path / "harness.jsonl"
    for n in range(50):
        sink.msg(json.dumps({"n": n}))  # (10 bytes a line)
        sink.flush()
    assert 0 < sink.dropped < 50
    _free(sink, target)
    sink.close()
    lines = [json.loads(x) for x in target.read_text().splitlines()]
    kept = [x["n"] for x in lines if "n" in x]
    assert kept == list(range(50 - len(kept), 50)) and len(kept) + sink.dropped == 50
    (note,) = [x for x in lines if x.get("event") == "jsonl_lines_dropped"]
    assert note["count"] == sink.dropped and note["level"] == "warning"

"""Outputs go only to regular files (or new paths), atomically, as strict JSON; anything else is
a clear error with nothing written and no temporary file left."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.errors import HarnessError
from harness.runs.layout import open_run, write_json
from harness.runs.output import json_text, write_output


def _no_temp_files(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_write_output_replaces_a_regular_file_atomically(tmp_path: Path) -> None:
    target = tmp_path / "a" / "out.json"
    assert write_output(target, "one") == target
    assert target.read_text() == "one"
    write_output(target, iter(["t", "wo"]))
    assert target.read_text() == "two"
    _no_temp_files(target.parent)


def test_write_output_leaves_nothing_when_the_text_fails(tmp_path: Path) -> None:
    target = tmp_path / "out.jsonl"
    target.write_text("old")

    def chunks() -> object:
        yield "half"
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        write_output(target, chunks())  # type: ignore[arg-type]
    assert target.read_text() == "old"
    _no_temp_files(tmp_path)


def _symlink(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    link = tmp_path / "link.json"
    link.symlink_to(victim)
    return link


def _fifo(tmp_path: Path) -> Path:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    return fifo


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "folder.json"
    folder.mkdir()
    return folder


def _under_a_file(tmp_path: Path) -> Path:
    (tmp_path / "plain").write_text("x")
    return tmp_path / "plain" / "out.json"


BAD = {"symlink": _symlink, "fifo": _fifo, "folder": _folder, "unwritable folder": _under_a_file}


@pytest.mark.parametrize("make", list(BAD.values()), ids=list(BAD))
def test_write_output_refuses_what_is_not_a_regular_file(make: object, tmp_path: Path) -> None:
    target = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(HarnessError, match="nothing was written"):
        write_output(target, "x")
    if (tmp_path / "victim.txt").exists():
        assert (tmp_path / "victim.txt").read_text() == "keep"
    _no_temp_files(tmp_path)


def test_write_output_refuses_a_device(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match="/dev/null is not a regular file"):
        write_output("/dev/null", "x")


def _cli_commands(run: Path, out: Path, episode: str) -> list[list[str]]:
    r = str(run)
    return [
        ["export", r, "--format", "jsonl", "--out", str(out)],
        ["export", r, "--format", "tau2", "--out", str(out)],
        ["report", r, "--html", str(out)],
        ["audit", r, "--episode", episode, "--html", str(out)],
    ]


@pytest.mark.parametrize(
    "make",
    [_symlink, _fifo, _under_a_file, lambda _: Path("/dev/null")],
    ids=["symlink", "fifo", "unwritable folder", "device"],
)
def test_commands_refuse_bad_outputs_with_a_clear_error(
    make: object,
    good_run: Path,
    tmp_path: Path,
) -> None:
    with open_run(good_run) as opened:
        episode = opened.trials[0].episode_id
    out = make(tmp_path)  # type: ignore[operator]
    kind = os.lstat(out).st_mode if os.path.lexists(out) else None
    for args in _cli_commands(good_run, out, episode):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, (args, result.output, result.exception)
        assert "error:" in result.output and "nothing was written" in result.output, args
        assert "Traceback" not in result.output
        assert not isinstance(result.exception, Exception) or isinstance(
            result.exception, SystemExit
        )
        assert (os.lstat(out).st_mode if os.path.lexists(out) else None) == kind
        _no_temp_files(tmp_path)
    if (tmp_path / "victim.txt").exists():
        assert (tmp_path / "victim.txt").read_text() == "keep"


def test_json_text_writes_nan_and_infinity_as_null(tmp_path: Path) -> None:
    value = {"a": math.nan, "b": [math.inf, -math.inf, 1.5], "c": (math.nan,)}
    assert json.loads(json_text(value)) == {"a": None, "b": [None, None, 1.5], "c": [None]}
    write_json(tmp_path, "summary.json", value)
    assert json.loads((tmp_path / "summary.json").read_text())["a"] is None
    _no_temp_files(tmp_path)

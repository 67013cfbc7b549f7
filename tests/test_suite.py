"""Suite loading: manifests, task files across a suite, and errors that name the place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import harness as hx

from .toy_env import write_suite


def test_duplicate_id_across_files_is_named(tmp_path: Path):
    """The same task id in two files of one suite names both files."""
    suite = write_suite(tmp_path / "s", [1])
    (suite / "more.json").write_text((suite / "tasks.json").read_text())
    manifest = json.loads((suite / "suite.json").read_text())
    manifest["tasks"] = ["tasks.json", "more.json"]
    (suite / "suite.json").write_text(json.dumps(manifest))
    with pytest.raises(hx.SuiteError, match=r"more.json: task 't0': field id: already defined in"):
        hx.load_suite(suite)


def test_unknown_manifest_field_is_named(tmp_path: Path):
    """A misspelt manifest field is an error, not silently ignored."""
    suite = write_suite(tmp_path / "s", [1])
    manifest = json.loads((suite / "suite.json").read_text())
    manifest["descripton"] = "typo"
    (suite / "suite.json").write_text(json.dumps(manifest))
    with pytest.raises(hx.SuiteError, match="suite.json: field descripton: not a manifest field"):
        hx.load_suite(suite)


def test_missing_task_field_names_the_field(tmp_path: Path):
    """A task missing a required field is reported with that field's name."""
    suite = write_suite(tmp_path / "s", [1])
    data = json.loads((suite / "tasks.json").read_text())
    del data["tasks"][0]["instruction"]
    (suite / "tasks.json").write_text(json.dumps(data))
    with pytest.raises(hx.SuiteError, match="task 't0': field instruction: 'instruction' is a"):
        hx.load_suite(suite)


def test_unknown_tool_is_named(tmp_path: Path):
    """A reference action naming a tool the environment lacks is refused at load time."""
    suite = write_suite(tmp_path / "s", [1])
    data = json.loads((suite / "tasks.json").read_text())
    data["tasks"][0]["reference_actions"][0]["name"] = "launch_rockets"
    (suite / "tasks.json").write_text(json.dumps(data))
    with pytest.raises(hx.SuiteError, match=r"task 't0': reference_actions\[0\].name 'launch"):
        hx.load_suite(suite)


def test_missing_suite_and_bad_environment(tmp_path: Path):
    """A missing path or an unimportable environment is a SuiteError naming it."""
    with pytest.raises(hx.SuiteError, match="no such suite folder"):
        hx.load_suite(tmp_path / "nope")
    suite = write_suite(tmp_path / "s", [1])
    manifest = json.loads((suite / "suite.json").read_text())
    manifest["environment"] = "no.such.module:Env"
    (suite / "suite.json").write_text(json.dumps(manifest))
    with pytest.raises(hx.SuiteError, match="cannot import environment 'no.such.module:Env'"):
        hx.load_suite(suite)


def test_task_digest_follows_content():
    """A task's digest changes when its content does, so evidence can tell versions apart."""
    a = hx.Task(id="x", instruction="do it")
    b = hx.Task(id="x", instruction="do it!")
    assert a.digest != b.digest and a.digest == hx.Task(id="x", instruction="do it").digest

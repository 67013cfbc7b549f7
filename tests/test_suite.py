"""Suite loading: manifests, task files across a suite, and errors that name the place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import harness as hx
from harness import suite as suite_module
from harness.cli import main
from harness.suite import BUILTIN_SUITES, builtin_suite

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
    with pytest.raises(hx.SuiteError, match="neither a suite folder"):
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


@pytest.mark.parametrize("name", ["retail", "configs"])
def test_builtin_suite_loads_by_name(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A built-in suite loads by its name from a folder with no such path in it."""
    monkeypatch.chdir(tmp_path)
    assert name in BUILTIN_SUITES
    loaded = hx.load_suite(name)
    assert loaded.name == name and loaded.tasks
    assert loaded.path == builtin_suite(name)


def test_unknown_suite_name_lists_the_builtins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A name that is neither a path nor a built-in is a SuiteError naming the built-ins."""
    monkeypatch.chdir(tmp_path)
    assert builtin_suite("nope") is None
    with pytest.raises(
        hx.SuiteError, match=r"'nope' is neither .* built-in suite \(retail, configs\)"
    ):
        hx.load_suite("nope")


def test_a_path_wins_over_a_builtin_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A folder named like a built-in suite, in the current folder, is what loads."""
    write_suite(tmp_path / "retail", [1])
    monkeypatch.chdir(tmp_path)
    assert hx.load_suite("retail").name == "toy"


def test_builtin_without_its_data_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A built-in whose data is in neither the package nor a checkout says where it looked."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(suite_module, "_checkout_tasks", lambda: tmp_path / "tasks")
    if builtin_suite("configs") is not None:
        pytest.skip("the suites are packaged in this install (harness/_suites)")
    with pytest.raises(hx.SuiteError, match="built-in suite 'configs': its data is in neither"):
        hx.load_suite("configs")


def test_cli_runs_a_builtin_suite_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``harness run configs`` finds the built-in suite from any folder."""
    monkeypatch.chdir(tmp_path)
    args = ["run", "configs", "--trials", "1", "--agent", "scripted", "--logs", str(tmp_path / "l")]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output

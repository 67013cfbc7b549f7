"""Suite loading: manifests, task files across a suite, and errors that name the place."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import sys
from importlib.metadata import EntryPoint, EntryPoints, entry_points
from pathlib import Path

import jsonschema
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


def test_the_published_schemas_are_the_ones_used():
    """The JSON Schemas shipped in harness/schemas are valid and are what the loader uses."""
    folder = Path(suite_module.__file__).parent / "schemas"
    for name, used in (
        ("tasks", suite_module.task_schema()),
        ("suite", suite_module.suite_schema()),
    ):
        published = json.loads((folder / f"{name}.schema.json").read_text())
        jsonschema.Draft202012Validator.check_schema(published)
        assert used == published


def test_task_model_and_task_schema_agree():
    """Every field of a task in the schema is a Task field and back, and what the schema lets
    a file leave out has the default the schema states (version: "1")."""
    schema = suite_module.task_schema()["$defs"]["task"]
    assert set(schema["properties"]) == set(hx.Task.model_fields)
    assert "version" not in schema["required"]
    for name, spec in schema["properties"].items():
        if "default" in spec:
            assert hx.Task.model_fields[name].default == spec["default"], name
    manifest = suite_module.suite_schema()["properties"]
    assert manifest["verifier"]["default"] == suite_module.DEFAULT_VERIFIER


def test_versions_may_be_left_out(tmp_path: Path):
    """A task file without versions (file or task) loads, each task at version "1"."""
    suite = write_suite(tmp_path / "s", [1, 1])
    data = json.loads((suite / "tasks.json").read_text())
    del data["version"]
    del data["tasks"][0]["version"]
    data["tasks"][1]["version"] = "3"
    (suite / "tasks.json").write_text(json.dumps(data))
    assert [t.version for t in hx.load_suite(suite).tasks] == ["1", "3"]


def test_manifest_field_types_are_checked(tmp_path: Path):
    """A manifest field of the wrong type is named with the schema's complaint."""
    suite = write_suite(tmp_path / "s", [1])
    manifest = json.loads((suite / "suite.json").read_text())
    (suite / "suite.json").write_text(json.dumps({**manifest, "tasks": "tasks.json"}))
    with pytest.raises(hx.SuiteError, match="suite.json: field tasks: 'tasks.json' is not of type"):
        hx.load_suite(suite)
    (suite / "suite.json").write_text(json.dumps({**manifest, "environment_options": [1]}))
    with pytest.raises(
        hx.SuiteError, match="field environment_options: .* is not of type 'object'"
    ):
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


@pytest.mark.parametrize("name", ["retail", "airline", "configs", "telecom"])
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
        hx.SuiteError,
        match=r"'nope' is neither .* built-in suite \(retail, airline, configs, telecom\)",
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


# --------------------------------------------------------------------------------------------
# Suites name environments, not arbitrary callables.
# --------------------------------------------------------------------------------------------


def _manifest(suite: Path, **fields: object) -> Path:
    """Change fields of the suite's manifest; the suite folder."""
    manifest = json.loads((suite / "suite.json").read_text())
    manifest.update(fields)
    (suite / "suite.json").write_text(json.dumps(manifest))
    return suite


ENV_MODULE = '''
import harness as hx

from . import helpers


class ShopEnvironment:
    """Counters on a DictState, from a module in the suite's folder."""

    TOOL_NAMES = frozenset({"bump", "look"})

    def __init__(self, start: int = 0) -> None:
        self.state = hx.DictState({"c/a": start})
        self.tools = {"bump": helpers.bump, "look": helpers.look}

    def export(self):
        return self.state.to_dict()

    def close(self):
        pass
'''


def test_os_system_is_refused_and_nothing_runs(tmp_path: Path):
    """`os:system` with a command in environment_options is refused, naming the file and the
    field, and the command never runs."""
    marker = tmp_path / "x"
    suite = _manifest(
        write_suite(tmp_path / "s", [1]),
        environment="os:system",
        environment_options={"command": f"touch {marker}"},
    )
    with pytest.raises(hx.SuiteError) as caught:
        hx.load_suite(suite)
    message = str(caught.value)
    assert "suite.json: field environment: 'os:system' is not a class" in message
    assert not marker.exists()


def test_functions_and_classes_without_the_environment_shape_are_refused(tmp_path: Path):
    """A function, and a class that is not an environment (subprocess.Popen, with a shell
    command for options), are refused before anything is called."""
    marker = tmp_path / "x"
    suite = _manifest(write_suite(tmp_path / "s", [1]), environment="tests.toy_env:write_suite")
    with pytest.raises(hx.SuiteError, match="'tests.toy_env:write_suite' is not a class"):
        hx.load_suite(suite)
    _manifest(
        suite,
        environment="subprocess:Popen",
        environment_options={"args": f"touch {marker}", "shell": True},
    )
    with pytest.raises(
        hx.SuiteError, match=r"field environment: 'subprocess:Popen' is not an environment: .*lack"
    ):
        hx.load_suite(suite)
    (suite / "plain.py").write_text("class Plain:\n    def close(self):\n        pass\n")
    _manifest(suite, environment="plain:Plain", environment_options={})
    with pytest.raises(hx.SuiteError, match=r"instances lack export\(\), state, tools"):
        hx.load_suite(suite)
    assert not marker.exists()


def test_unknown_environment_options_are_refused(tmp_path: Path):
    """An environment_options key that is not a parameter of the class's __init__ is refused,
    naming the key and the parameters there are."""
    suite = _manifest(
        write_suite(tmp_path / "s", [1]),
        environment="tests.runs.test_resume:LedgerToy",
        environment_options={"ledger": "l.txt", "command": "rm -rf /"},
    )
    with pytest.raises(
        hx.SuiteError,
        match=r"suite.json: field environment_options.command: not a parameter of .*LedgerToy "
        r"\(parameters: ledger, pause, delay\)",
    ):
        hx.load_suite(suite)
    _manifest(suite, environment_options={})
    with pytest.raises(hx.SuiteError, match="missing a required argument: 'ledger'"):
        hx.load_suite(suite)


def test_environment_module_in_the_suite_folder_loads_without_pythonpath(tmp_path: Path):
    """`my_env:ShopEnvironment` loads `<suite>/my_env.py` (and its relative imports), and a
    package inside the folder works too; two suites' modules of one name do not meet."""
    for name, start in (("a", 1), ("b", 2)):
        suite = write_suite(tmp_path / name, [1])
        (suite / "my_env.py").write_text(ENV_MODULE)
        (suite / "helpers.py").write_text(
            "def bump(name, step, amount=1):\n    return amount\n\ndef look(name):\n    return 0\n"
        )
        _manifest(suite, environment="my_env:ShopEnvironment", environment_options={"start": start})
        loaded = hx.load_suite(suite)
        env = loaded.new_environment()
        assert env.export() == {"c/a": start} and set(env.tools) == {"bump", "look"}
    package = tmp_path / "a" / "shop"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "environment.py").write_text(ENV_MODULE.replace("from . import", "from .. import"))
    _manifest(tmp_path / "a", environment="shop.environment:ShopEnvironment")
    assert hx.load_suite(tmp_path / "a").new_environment().export() == {"c/a": 1}


def test_environments_load_by_registered_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`"environment": "retail"` is the built-in registered under harness.environments; a
    name another package registers loads; an unregistered name is refused, listing them."""
    registered = {ep.name for ep in entry_points(group=suite_module.ENVIRONMENT_GROUP)}
    assert {"retail", "airline", "configs"} <= registered
    retail = builtin_suite("retail")
    assert retail is not None
    suite = tmp_path / "retail"
    shutil.copytree(retail, suite)
    loaded = hx.load_suite(_manifest(suite, environment="retail"))
    env = loaded.new_environment()
    try:
        assert type(env).__name__ == "RetailEnvironment"
    finally:
        env.close()
    toy = EntryPoint(
        name="toy", value="tests.toy_env:ToyEnvironment", group=suite_module.ENVIRONMENT_GROUP
    )
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda **kw: EntryPoints([toy]).select(**kw)
    )
    assert hx.load_suite(_manifest(write_suite(tmp_path / "s", [1]), environment="toy"))
    with pytest.raises(hx.SuiteError, match=r"'shell' is not a registered environment .*: toy\)"):
        hx.load_suite(_manifest(tmp_path / "s", environment="shell"))


def test_verifiers_come_from_the_suite_folder_a_registry_or_the_builtins(tmp_path: Path):
    """A verifier function in the suite's folder loads; `os:system` and a class are refused."""
    suite = write_suite(tmp_path / "s", [1])
    (suite / "checks.py").write_text(
        "from harness.verifiers import verify as base\n\n"
        "def verify(task, **kw):\n    return base(task, **kw)\n\n"
        "class NotAFunction:\n    pass\n"
    )
    assert hx.load_suite(_manifest(suite, verifier="checks:verify")).verify.__name__ == "verify"
    with pytest.raises(hx.SuiteError, match=r"'os:system' is not in the suite's folder"):
        hx.load_suite(_manifest(suite, verifier="os:system"))
    with pytest.raises(hx.SuiteError, match="'checks:NotAFunction' is not a function"):
        hx.load_suite(_manifest(suite, verifier="checks:NotAFunction"))


FAKE_VERIFIERS = '''"""An unrelated package that happens to be named verifiers."""


def verify(task, **kwargs):
    raise AssertionError("the unrelated verifiers package judged a trial")
'''


def test_verifiers_colon_names_ours_never_an_installed_verifiers_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """An unrelated top-level `verifiers` package on sys.path is never imported: a suite that
    says `verifiers:<name>` (the built-ins' former name), `harness.verifiers:<name>` or nothing
    is judged by harness's own verifiers, the built-in suites too, to the end of a run."""
    from harness import verifiers as ours
    from harness.verifiers import checks

    (tmp_path / "site" / "verifiers").mkdir(parents=True)
    (tmp_path / "site" / "verifiers" / "__init__.py").write_text(FAKE_VERIFIERS)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "verifiers", raising=False)
    suite = write_suite(tmp_path / "s", [1])
    named = {
        None: ours.verify,
        "verifiers:verify": ours.verify,
        "harness.verifiers:verify": ours.verify,
        "verifiers.checks:verify": checks.verify,
    }
    for spec, function in named.items():
        manifest = json.loads((suite / "suite.json").read_text())
        manifest.pop("verifier", None)
        (suite / "suite.json").write_text(
            json.dumps(manifest | ({"verifier": spec} if spec else {}))
        )
        assert hx.load_suite(suite).verify is function, spec
    assert hx.load_suite(suite).verifier == "verifiers.checks:verify"
    with pytest.raises(
        hx.SuiteError, match=r"module 'harness.verifiers' has no attribute 'nothing'"
    ):
        hx.load_suite(_manifest(suite, verifier="verifiers:nothing"))
    for name in BUILTIN_SUITES:
        assert hx.load_suite(name).verify is ours.verify, name
    args = ["run", "configs", "--trials", "1", "--agent", "scripted", "--logs", str(tmp_path / "l")]
    out = CliRunner().invoke(main, [*args, "--task", hx.load_suite("configs").tasks[0].id])
    assert out.exit_code == 0 and "passed 1, failed 0" in out.output, out.output
    assert "verifiers" not in sys.modules


def test_a_verifier_importing_the_former_top_level_verifiers_is_told_the_new_name(tmp_path: Path):
    """A suite's own verifier written against the built-ins' former top-level name (`from
    verifiers import verify`) is refused with the name to import instead."""
    suite = write_suite(tmp_path / "s", [1])
    (suite / "checks.py").write_text("from verifiers import verify\n")
    with pytest.raises(hx.SuiteError) as refused:
        hx.load_suite(_manifest(suite, verifier="checks:verify"))
    assert "No module named 'verifiers'" in str(refused.value)
    assert "`from harness.verifiers import verify`" in str(refused.value)


def test_replay_of_a_builtin_suite_run_needs_no_flag(tmp_path: Path):
    """A run of a built-in suite replays as recorded: its suite path is the built-in's."""
    task = hx.load_suite("configs").tasks[0].id
    logs = tmp_path / "l"
    args = ["run", "configs", "--trials", "1", "--agent", "scripted", "--task", task]
    assert CliRunner().invoke(main, [*args, "--logs", str(logs)]).exit_code == 0
    (folder,) = logs.iterdir()
    out = CliRunner().invoke(main, ["replay", str(folder), "--episode", f"{folder.name}-{task}-0"])
    assert out.exit_code == 0 and "no divergence" in out.output, out.output

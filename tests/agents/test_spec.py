"""Agents named by the user: ``module:Class`` and ``path/to/file.py:Class``, and every way
naming one goes wrong."""

from __future__ import annotations

import json
import pydoc
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

import harness as hx
from harness.agents import Agent, AgentSpec, recorded_spec, registry
from harness.cli import main

from ..toy_env import write_suite

GOOD = """
from harness.agents import AgentOutput


class Careful:
    name = "careful"

    def __init__(self, greeting: str = "done") -> None:
        self.greeting = greeting

    def config(self):
        return {"name": self.name, "greeting": self.greeting}

    def run(self, task, toolbox, *, seed):
        for call in task.reference_actions:
            toolbox.call(call.name, dict(call.arguments))
        return AgentOutput(message=self.greeting)
"""


def module_file(folder: Path, body: str) -> str:
    """Write ``body`` as a module with a name no other test uses into ``folder``; its name."""
    name = f"agent_{uuid.uuid4().hex[:10]}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(body))
    return name


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own folder as the current directory."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def refused(spec: str, match: str) -> str:
    """The ConfigurationError building ``spec`` raises (it must match ``match``)."""
    with pytest.raises(hx.ConfigurationError, match=match) as info:
        registry.create(spec)
    return str(info.value)


def test_module_class_from_the_current_directory_builds_a_checked_agent(here: Path):
    """`module:Class` imports a module of the current directory (not on sys.path) and builds
    the class with the options given; sys.path is left as it was."""
    name = module_file(here, GOOD)
    path_before = list(sys.path)
    agent = registry.create(f"{name}:Careful", greeting="hi")
    assert isinstance(agent, Agent) and agent.name == "careful"
    assert agent.config() == {"name": "careful", "greeting": "hi"}
    assert sys.path == path_before


def test_file_class_imports_the_file_with_its_siblings(here: Path):
    """`path/to/file.py:Class` imports the file (which may import a module beside it), gives
    the same class when named again, and records the file by its absolute path."""
    folder = here / "agents"
    helper = module_file(folder, "GREETING = 'from the helper'\n")
    body = GOOD.replace('greeting: str = "done"', f"greeting: str = {helper}.GREETING")
    (folder / "mine.py").write_text(f"import {helper}\n" + textwrap.dedent(body))
    spec = AgentSpec.parse("agents/mine.py:Careful")
    assert str(spec) == f"{here / 'agents' / 'mine.py'}:Careful"
    assert recorded_spec("agents/mine.py:Careful") == str(spec)
    assert recorded_spec("scripted") == "scripted"
    assert spec.load() is AgentSpec.parse(str(spec)).load()
    assert registry.create("agents/mine.py:Careful").config()["greeting"] == "from the helper"


def test_a_run_records_the_spec_and_its_trials_use_the_agent(here: Path):
    """run_trials with a spec builds the user's agent in worker processes too, and the run
    records the spec (file made absolute), the agent's name and its configuration."""
    (here / "mine.py").write_text(textwrap.dedent(GOOD))
    suite = write_suite(here / "suite", [1, 2])
    result = hx.run_trials(
        suite, agent="mine.py:Careful", trials=2, workers=2, logs=here / "logs", run_id="r1"
    )
    assert len(result.results) == 4 and all(r.passed for r in result.results)
    store = hx.Store(result.folder / "harness.db")
    config = json.loads(store.runs()[0].config)
    evidence = json.loads(store.runs()[0].evidence)
    store.close()
    assert config["agent"] == f"{here / 'mine.py'}:Careful"
    assert (config["agent_name"], config["agent_object"]) == ("careful", False)
    assert evidence["agent"] == {"name": "careful", "greeting": "done"}


def test_unknown_module_names_the_module_and_the_fixes(here: Path):
    """A module that is neither in the current directory nor installed is named, with the
    fixes: the spelling, the folder to run from, or naming the file."""
    said = refused("no_such_agent_module:Agent", "no module named 'no_such_agent_module'")
    assert str(here) in said and "--agent path/to/no_such_agent_module.py:Agent" in said


def test_missing_file_names_the_path(here: Path):
    """A file that does not exist is named by its absolute path."""
    said = refused("agents/nope.py:Agent", "no file")
    assert str(here / "agents" / "nope.py") in said


def test_a_module_that_fails_to_import_says_why(here: Path):
    """A module whose own import fails (a missing dependency, an error at import) is not
    reported as missing: the message is the error it raised."""
    dep = module_file(here, "import not_installed_dependency_xyz\n")
    refused(f"{dep}:Agent", r"importing module .* raised ModuleNotFoundError: .*not_installed")
    broken = module_file(here, "raise RuntimeError('boom at import')\n")
    refused(f"{broken}:Agent", "raised RuntimeError: boom at import")
    (here / "broken.py").write_text("def oops(:\n")
    refused("broken.py:Agent", "raised SyntaxError")
    assert not any(m.startswith("_harness_agent_") and "broken" in m for m in sys.modules)


def test_missing_class_lists_the_classes_the_module_defines(here: Path):
    """A name the module does not define is refused with the classes it does define."""
    name = module_file(here, GOOD)
    said = refused(f"{name}:Carefull", "has no 'Carefull'")
    assert "classes defined there: Careful" in said


@pytest.mark.parametrize(
    ("body", "attr", "match"),
    [
        ("def make():\n    pass\n", "make", "is a function, not a class"),
        ("class A:\n    name = 'a'\n", "A", r"it has no config\(\) and no run\(\)"),
        (
            "class A:\n    name = 'a'\n    def config(self): return {}\n"
            "    def run(self, task): pass\n",
            "A",
            r"cannot be called as run\(task, toolbox, \*, seed\)",
        ),
        (
            "class A:\n    def config(self): return {}\n"
            "    def run(self, task, toolbox, *, seed): pass\n",
            "A",
            'has no `name` .*`name = "a"`',
        ),
        (
            "class A:\n    name = ''\n    def config(self): return {}\n"
            "    def run(self, task, toolbox, *, seed): pass\n",
            "A",
            "has no `name` \\(found ''\\)",
        ),
        (
            "class A:\n    name = 'a'\n    def config(self): return ['a']\n"
            "    def run(self, task, toolbox, *, seed): pass\n",
            "A",
            r"config\(\) must return a JSON-ready dict .* list, not a dict",
        ),
        (
            "class A:\n    name = 'a'\n    def config(self): return {'f': object()}\n"
            "    def run(self, task, toolbox, *, seed): pass\n",
            "A",
            r"config\(\) must return a JSON-ready dict",
        ),
        (
            "class A:\n    name = 'a'\n    def __init__(self, model): pass\n"
            "    def config(self): return {}\n    def run(self, task, toolbox, *, seed): pass\n",
            "A",
            "cannot be built with options {} .*give its __init__ parameters defaults",
        ),
        (
            "class A:\n    name = 'a'\n    def __init__(self): raise ValueError('no key')\n"
            "    def config(self): return {}\n    def run(self, task, toolbox, *, seed): pass\n",
            "A",
            r"A\(\) raised ValueError: no key",
        ),
    ],
)
def test_a_class_that_is_not_an_agent_is_refused_with_what_it_lacks(
    here: Path, body: str, attr: str, match: str
):
    """Whatever the class lacks (being a class, config(), run(task, toolbox, *, seed), a name,
    a JSON-ready config, buildable without arguments) is named, with the agent's shape."""
    name = module_file(here, body)
    refused(f"{name}:{attr}", match)


@pytest.mark.parametrize("spec", ["mod:", ":Class", "mod:1x", "my-agent:Class", "a b:C"])
def test_a_malformed_spec_says_what_a_spec_looks_like(here: Path, spec: str):
    """A spec that is not `module:Class` or `path/to/file.py:Class` says what it must be."""
    refused(spec, "must look like|neither a module name")


def test_an_unknown_name_lists_the_built_in_agents_and_how_to_name_ones_own():
    """A name without a colon that is not registered lists the built-in agents and the two
    ways to name one's own class."""
    said = refused("my_agent", "unknown agent 'my_agent'")
    assert "scripted" in said and "module:Class or path/to/file.py:Class" in said


def test_help_of_the_agent_protocol_shows_what_an_agent_needs():
    """help(Agent) shows the required `name` attribute, config() and run(task, toolbox, *,
    seed), and how to name an agent on the command line."""
    text = pydoc.render_doc(Agent, renderer=pydoc.plaintext)
    for needed in ("name", "required", "config(self)", "run(self, task, toolbox, *, seed)"):
        assert needed in text
    assert "path/to/file.py:Class" in text


def test_the_command_line_refuses_a_bad_agent_before_anything_runs(here: Path):
    """`harness run --agent` with a missing module, a missing class or a nameless class exits
    2 with the problem, and no run folder is left behind for the first two."""
    name = module_file(here, GOOD)
    nameless = module_file(
        here, "class A:\n    def config(self): return {}\n    def run(self, t, tb, *, seed): pass\n"
    )
    suite = write_suite(here / "suite", [1])
    runner = CliRunner()
    for spec, said in [
        ("nowhere_mod:A", "no module named 'nowhere_mod'"),
        (f"{name}:Nope", "classes defined there: Careful"),
        (f"{nameless}:A", "has no `name`"),
    ]:
        out = runner.invoke(main, ["run", str(suite), "--agent", spec, "--logs", "logs"])
        assert out.exit_code == 2, out.output
        assert said in " ".join(out.output.split())
    assert not (here / "logs").exists()


OPTIONED = """
from __future__ import annotations

from typing import Literal

from harness.agents import AgentOutput


class Tuned:
    name = "tuned"

    def __init__(
        self,
        retries: int,
        strict: bool = False,
        ratio: float = 0.5,
        mode: Literal["fast", "careful"] = "fast",
        tags: list[str] | None = None,
        label="plain",
        budget=10,
    ) -> None:
        self.options = {
            "retries": retries, "strict": strict, "ratio": ratio, "mode": mode, "tags": tags,
            "label": label, "budget": budget,
        }

    def config(self):
        return {"name": self.name, **self.options}

    def run(self, task, toolbox, *, seed):
        for call in task.reference_actions:
            toolbox.call(call.name, dict(call.arguments))
        return AgentOutput(message="done")
"""


def test_agent_options_on_the_command_line_are_typed_by_the_constructor(here: Path):
    """`--agent-option key=value` (repeatable) builds a module:Class agent with options typed by
    its constructor's annotations (int, bool, float, Literal, a JSON list; an unannotated one by
    its default's type, else text), and the run records them. Without the option a required
    parameter is refused naming --agent-option; a key the class does not take lists those it
    takes; a value of the wrong type names the type; nothing runs for any of them."""
    name = module_file(here, OPTIONED)
    suite = write_suite(here / "suite", [1])
    runner = CliRunner()
    base = ["run", str(suite), "--agent", f"{name}:Tuned", "--trials", "1"]

    def given(*pairs: str, logs: str = "logs") -> object:
        flags = [flag for pair in pairs for flag in ("--agent-option", pair)]
        return runner.invoke(main, [*base, "--logs", logs, *flags])

    out = given(
        *("retries=3", "strict=true", "ratio=0.25", "mode=careful", 'tags=["a", "b"]'),
        *("label=x=y", "budget=7"),
    )
    assert out.exit_code == 0, out.output
    (folder,) = (here / "logs").iterdir()
    recorded = json.loads((folder / "evidence.json").read_text())["agent"]
    assert recorded == {
        "name": "tuned",
        **{"retries": 3, "strict": True, "ratio": 0.25, "mode": "careful", "tags": ["a", "b"]},
        **{"label": "x=y", "budget": 7},
    }

    for pairs, said in [
        (
            (),
            "give its __init__ parameters defaults, or pass them as agent options "
            "(--agent-option key=value",
        ),
        (("retries=3", "retry=4"), "takes no option 'retry'; it takes: retries, strict, ratio"),
        (("retries=three",), "option retries='three' is not of its type, int"),
        (("retries=3", "mode=slow"), "option mode='slow' is not of its type, Literal"),
        (("retries",), "agent option 'retries': give it as key=value"),
        (("retries=3", "retries=4"), "agent option 'retries' is given twice"),
    ]:
        out = given(*pairs, logs="refused")
        assert out.exit_code in (1, 2), out.output
        assert said in " ".join(out.output.split()), out.output
        assert "Traceback" not in out.output
    refused_runs = list((here / "refused").glob("*/harness.jsonl"))
    assert all('"kind": "trial"' not in p.read_text() for p in refused_runs), (
        "a refused agent option ran trials"
    )

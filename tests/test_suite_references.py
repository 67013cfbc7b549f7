"""Reference actions are checked when a suite loads: tools, arguments, and a replay."""

from __future__ import annotations

import gc
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest

import harness as hx
from harness.runs.judge import reference_outcome

from .toy_env import write_suite


def _with_action(suite: Path, index: int, call: dict[str, Any]) -> Path:
    """Put ``call`` at ``reference_actions[index]`` of the suite's first task."""
    data = json.loads((suite / "tasks.json").read_text())
    actions = data["tasks"][0]["reference_actions"]
    if index < len(actions):
        actions[index] = call
    else:
        actions.append(call)
    (suite / "tasks.json").write_text(json.dumps(data))
    return suite


def _own_environment(folder: Path, module: str, source: str, cls: str) -> Path:
    """A suite of one task with no reference actions, on the class ``cls`` of the module
    ``source``, written into the suite's folder as ``<module>.py``."""
    suite = write_suite(folder, [0])
    (suite / f"{module}.py").write_text(source)
    manifest = json.loads((suite / "suite.json").read_text())
    (suite / "suite.json").write_text(json.dumps({**manifest, "environment": f"{module}:{cls}"}))
    return suite


def _load_error(suite: Path, **options: Any) -> str:
    with pytest.raises(hx.SuiteError) as caught:
        hx.load_suite(suite, **options)
    return str(caught.value)


@pytest.mark.parametrize("check_references", [True, False])
def test_unknown_tool_names_task_action_and_the_tools(tmp_path: Path, check_references: bool):
    """A reference action naming a tool the environment lacks is refused at load (checked
    replay or not), naming the task, the action's index and name, and the tools there are."""
    suite = _with_action(write_suite(tmp_path / "s", [1]), 0, {"name": "launch_rockets"})
    message = _load_error(suite, check_references=check_references)
    assert message.startswith(
        f"{suite / 'tasks.json'}: task 't0': reference_actions[0] (launch_rockets): "
    )
    assert "unknown tool 'launch_rockets'" in message
    assert "the tools of tests.toy_env:ToyEnvironment are bump, look" in message


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"name": "a"}, "step: Field required"),
        ({"name": "a", "step": 0, "amonut": 2}, "amonut: Extra inputs are not permitted"),
        ({"name": "a", "step": "first"}, "step: Input should be a valid integer"),
    ],
)
def test_arguments_that_do_not_fit_the_action_schema(
    tmp_path: Path, arguments: dict[str, Any], problem: str
):
    """A missing, misspelt or mistyped argument of an action is refused at load, naming the
    task, the action, the argument's problem and the signature to follow."""
    suite = _with_action(
        write_suite(tmp_path / "s", [1]), 1, {"name": "bump", "arguments": arguments}
    )
    message = _load_error(suite)
    assert f"task 't0': reference_actions[1] (bump): arguments {sorted(arguments)}" in message
    assert problem in message
    assert "give the arguments of bump(name: str, step: int, amount: int = 1)" in message


def test_arguments_of_a_plain_read_function_are_checked(tmp_path: Path):
    """A read tool (a plain function, not an action) is checked against its signature too."""
    suite = _with_action(
        write_suite(tmp_path / "s", [1]), 0, {"name": "look", "arguments": {"who": "a"}}
    )
    message = _load_error(suite, check_references=False)
    assert "task 't0': reference_actions[0] (look): arguments ['who']" in message
    assert "name: Field required" in message and "who: Extra inputs are not permitted" in message


STAR_ENV = '''
import harness as hx


class StarEnvironment:
    """A read tool taking *names, which has no schema: its signature is bound instead."""

    def __init__(self) -> None:
        self.state = hx.DictState({"c/a": 0})

        def look(first, *names):
            return first

        def find(name: "NoSuchType") -> int:
            return 0

        self.tools = {"look": look, "find": find}

    def export(self):
        return self.state.to_dict()

    def close(self):
        pass
'''


def test_a_tool_without_a_schema_is_checked_by_its_signature(tmp_path: Path):
    """A tool whose signature gives no schema (``*names``) has its arguments bound to it."""
    suite = _own_environment(tmp_path / "s", "star", STAR_ENV, "StarEnvironment")
    _with_action(suite, 0, {"name": "look", "arguments": {"first": "a"}})
    assert hx.load_suite(suite).tasks[0].reference_actions[0].name == "look"
    _with_action(suite, 0, {"name": "look", "arguments": {"second": "a"}})
    message = _load_error(suite)
    assert "reference_actions[0] (look): arguments ['second']" in message
    assert "missing a required argument: 'first'" in message
    _with_action(suite, 0, {"name": "find", "arguments": {"nmae": "a"}})
    message = _load_error(suite)  # hints that do not resolve: the signature is bound, as written
    assert "reference_actions[0] (find): arguments ['nmae']" in message
    assert "give the arguments of find(name: 'NoSuchType')" in message


def test_a_failing_precondition_names_task_action_and_reason(tmp_path: Path):
    """A reference action whose precondition is false on the replayed state is refused at
    load, naming the task, the action, the precondition and that it defines the expected
    state; with check_references=False the suite loads and the refusal is in its reference."""
    suite = _with_action(
        write_suite(tmp_path / "s", [2]),
        2,
        {"name": "bump", "arguments": {"name": "zz", "step": 5}},
    )
    message = _load_error(suite)
    where = suite / "tasks.json"
    assert f"{where}: task 't0': reference_actions[2] (bump): refused when the" in message
    assert "its precondition 'counter_exists' is false" in message
    assert "define the task's expected state" in message
    loaded = hx.load_suite(suite, check_references=False)
    reference = loaded.reference(loaded.tasks[0])
    assert [(r.index, r.tool) for r in reference.refused] == [(2, "bump")]
    assert reference.changes == {"c/a": 1}  # the step before it still counts


RAISING_ENV = '''
import harness as hx


class RaisingEnvironment:
    """A read and a write that raise for a counter they do not know."""

    def __init__(self) -> None:
        self.state = hx.DictState({"c/a": 0})
        state = self.state

        def look(name: str) -> int:
            if f"c/{name}" not in state:
                raise LookupError(f"no counter {name}")
            return 0

        @hx.action(writes=["c/{name}"])
        def put(name: str, value: int) -> None:
            if f"c/{name}" not in state:
                raise LookupError(f"no counter {name}")
            state[f"c/{name}"] = value

        @put.postcondition
        def stored(ctx):
            return ctx.args.value != 13  # a tool that "forgets" 13: its postcondition is false

        self.tools = {"look": look, "put": put}

    def export(self):
        return self.state.to_dict()

    def close(self):
        pass
'''


def test_a_reference_write_that_raises_is_named_and_a_failed_read_is_listed(tmp_path: Path):
    """A reference write whose tool raises on the replay is refused with the tool's error; a
    read that raises changes no state, so the suite loads and the read is listed as refused."""
    suite = _own_environment(tmp_path / "s", "raising", RAISING_ENV, "RaisingEnvironment")
    _with_action(suite, 0, {"name": "look", "arguments": {"name": "b"}})
    _with_action(suite, 1, {"name": "put", "arguments": {"name": "a", "value": 7}})
    loaded = hx.load_suite(suite)
    reference = loaded.reference(loaded.tasks[0])
    assert [(r.index, r.tool, r.write) for r in reference.refused] == [(0, "look", False)]
    assert "the tool raised LookupError: no counter b" in reference.refused[0].problem
    assert reference.changes == {"c/a": 7}
    _with_action(suite, 2, {"name": "put", "arguments": {"name": "b", "value": 1}})
    message = _load_error(suite)
    assert "task 't0': reference_actions[2] (put): refused when the reference" in message
    assert "LookupError: no counter b" in message
    _with_action(suite, 2, {"name": "put", "arguments": {"name": "a", "value": 13}})
    message = _load_error(suite)
    assert "reference_actions[2] (put): refused when" in message
    assert "it did not commit (silent): postcondition 'stored' is false" in message


def test_the_checked_replay_is_what_runs_are_judged_against(tmp_path: Path):
    """Loading replays each task once; the judge's reference outcome is that replay, and it
    holds the changes and the committed writes of the reference actions."""
    loaded = hx.load_suite(write_suite(tmp_path / "s", [2, 1]))
    first, second = loaded.tasks
    reference = reference_outcome(loaded, first)
    assert reference is loaded.reference(first)
    assert reference.changes == {"c/a": 1, "c/b": 1} and reference.refused == []
    assert [name for name, _ in reference.writes] == ["bump", "bump"]
    assert json.loads(reference.writes[0][1]) == {"name": "a", "step": 0, "amount": 1}
    assert loaded.reference(second).changes == {"c/a": 1}


def test_loading_writes_nothing_beside_the_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The replay's records go to a temporary store, removed with the suite: loading leaves
    no logs folder, nothing in the suite's folder, and nothing behind once the suite is gone."""
    monkeypatch.chdir(tmp_path)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    suite = write_suite(tmp_path / "s", [1, 2])
    before = sorted(p.name for p in suite.iterdir())
    loaded = hx.load_suite(suite)
    assert [p.name.startswith("harness-reference-") for p in scratch.iterdir()] == [True]
    assert loaded.reference(hx.Task(id="extra", instruction="look")).refused == []
    assert not (tmp_path / "logs").exists()
    assert sorted(p.name for p in suite.iterdir()) == before
    del loaded
    gc.collect()
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize("name", ["retail", "airline", "configs"])
def test_builtin_suites_replay_every_reference(name: str):
    """Every reference action of the built-in suites runs on a fresh environment."""
    loaded = hx.load_suite(name)
    assert all(loaded.reference(t).refused == [] for t in loaded.tasks)
    assert any(loaded.reference(t).writes for t in loaded.tasks)


ASYNC_ENV = '''
import harness as hx


class AsyncEnvironment:
    """An async write tool and an async read tool."""

    def __init__(self) -> None:
        self.state = hx.DictState({"c/a": 0})
        state = self.state

        async def look(name: str) -> int:
            return state[f"c/{name}"]

        @hx.action(writes=["c/{name}"], idempotency_key=lambda a: a.name)
        async def put(name: str, value: int) -> None:
            state[f"c/{name}"] = value

        @put.precondition
        def known(ctx) -> bool:
            """Only a counter that exists can be set."""
            return ctx.state.get(f"c/{ctx.args.name}") is not None

        self.tools = {"look": look, "put": put}

    def export(self):
        return self.state.to_dict()

    def close(self):
        pass
'''


def test_async_tools_are_replayed_and_checked(tmp_path: Path):
    """References of async tools run to completion in the replay, and a false precondition
    of an async action is named like a sync one's."""
    suite = _own_environment(tmp_path / "s", "async_env", ASYNC_ENV, "AsyncEnvironment")
    _with_action(suite, 0, {"name": "look", "arguments": {"name": "a"}})
    _with_action(suite, 1, {"name": "put", "arguments": {"name": "a", "value": 5}})
    loaded = hx.load_suite(suite)
    reference = loaded.reference(loaded.tasks[0])
    assert reference.changes == {"c/a": 5} and reference.refused == []
    _with_action(suite, 1, {"name": "put", "arguments": {"name": "q", "value": 5}})
    message = _load_error(suite)
    assert "reference_actions[1] (put): refused" in message
    assert "its precondition 'known' is false: Only a counter that exists can be set." in message
    _with_action(suite, 1, {"name": "put", "arguments": {"name": "a", "value": 5}})
    _with_action(suite, 2, {"name": "put", "arguments": {"name": "a", "value": 6}})
    message = _load_error(suite)
    assert "reference_actions[2] (put): refused" in message
    assert "idempotency key 'put:a'" in message and "committed with other arguments" in message

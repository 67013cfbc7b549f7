"""The project's own retail suite (``tasks/retail``): it loads, covers every write tool, and
every task's reference actions replay on a fresh database to the state the task expects."""

from __future__ import annotations

import copy
import importlib.util
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from harness.domains.retail.environment import RetailEnvironment
from harness.domains.retail.tools import TOOL_TYPES, WRITE_TOOLS, RetailError
from harness.errors import SuiteError
from harness.suite import Suite, Task, load_suite

RETAIL = Path(__file__).resolve().parents[2] / "tasks" / "retail"
_RAW = json.loads((RETAIL / "tasks.json").read_text("utf-8"))["tasks"]
TASK_IDS = [t["id"] for t in _RAW]
REFUSAL_IDS = [t["id"] for t in _RAW if t.get("expect") == "refuse"]
ENVIRONMENT = "harness.domains.retail.environment:RetailEnvironment"
IDENTIFY = ("find_user_id_by_email", "find_user_id_by_name_zip")


class NamedRetailEnvironment(RetailEnvironment):
    """The retail environment declaring its tool names, so the loader can check them.

    ``RetailEnvironment`` itself has no ``TOOL_NAMES``, and ``Suite`` checks reference tool
    names only for environments that declare them.
    """

    TOOL_NAMES = tuple(TOOL_TYPES)


@pytest.fixture(scope="module")
def suite() -> Suite:
    return load_suite(RETAIL)


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("retail_make_tasks", RETAIL / "make_tasks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pristine() -> Any:
    """The export of a fresh database (every fresh environment copies the same template)."""
    with RetailEnvironment() as environment:
        return environment.export()


@pytest.fixture
def env() -> Iterator[RetailEnvironment]:
    environment = RetailEnvironment()
    yield environment
    environment.close()


def _run(env: RetailEnvironment, name: str, arguments: dict[str, Any]) -> Any:
    """Call the plain tool under ``name`` (an action's ``fn``, no episode needed)."""
    tool = env.tools[name]
    fn = getattr(tool, "fn", tool) if name in WRITE_TOOLS else tool
    return fn(**copy.deepcopy(arguments))


def _field(resource: Any, path: list[str]) -> tuple[bool, Any]:
    """(present, value) of ``path`` inside ``resource``."""
    value = resource
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return resource is not None, value


def _writes(task: Task) -> list[str]:
    return [call.name for call in task.reference_actions if call.name in WRITE_TOOLS]


def test_suite_loads_from_its_manifest(suite: Suite) -> None:
    """The folder loads as suite 'retail' version '1' on RetailEnvironment, with 40+ tasks."""
    assert (suite.name, suite.version, suite.environment) == ("retail", "1", ENVIRONMENT)
    assert len(suite.tasks) >= 40
    assert [t.id for t in suite.tasks] == TASK_IDS


def test_task_ids_are_unique(suite: Suite) -> None:
    """No two tasks share an id."""
    counts = Counter(t.id for t in suite.tasks)
    assert [i for i, n in counts.items() if n > 1] == []


def test_every_write_tool_is_covered_by_several_tasks(suite: Suite) -> None:
    """Each of the seven write tools is a reference write of at least three tasks."""
    counts = Counter(name for t in suite.tasks for name in set(_writes(t)))
    assert {tool: counts[tool] for tool in WRITE_TOOLS if counts[tool] < 3} == {}


def test_refusals_and_handoffs_are_present(suite: Suite) -> None:
    """At least five tasks expect a refusal and three a hand-off that calls the transfer tool."""
    expects = Counter(t.expect for t in suite.tasks)
    assert expects["refuse"] >= 5 and expects["handoff"] >= 3
    for t in suite.tasks:
        transfers = [c.name == "transfer_to_human_agents" for c in t.reference_actions]
        assert any(transfers) == (t.expect == "handoff"), t.id


def test_step_counts_are_between_2_and_12(suite: Suite) -> None:
    """Every task has 2 to 12 reference actions."""
    assert {
        t.id: len(t.reference_actions)
        for t in suite.tasks
        if not 2 <= len(t.reference_actions) <= 12
    } == {}


def test_tasks_begin_by_identifying_the_customer(suite: Suite) -> None:
    """Every task's first reference action looks the customer up by email or by name and zip."""
    assert [t.id for t in suite.tasks if t.reference_actions[0].name not in IDENTIFY] == []


def test_tasks_json_is_the_generators_output(generator: ModuleType) -> None:
    """The committed tasks.json is exactly what make_tasks.py writes."""
    assert generator.render() == (RETAIL / "tasks.json").read_text("utf-8")


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_reference_actions_replay(
    suite: Suite, env: RetailEnvironment, pristine: Any, task_id: str
) -> None:
    """Replayed in order on a fresh database, the reference actions raise nothing, touch only
    the identified customer's data, change the database exactly when the task has writes
    (always for 'complete', never for 'refuse'), and leave every check true."""
    task = suite.task(task_id)
    customer = None
    for index, call in enumerate(task.reference_actions):
        result = _run(env, call.name, call.arguments)
        if call.name in IDENTIFY:
            customer = result
        if call.name in WRITE_TOOLS:
            args = call.arguments
            owner = (
                args["user_id"]
                if "user_id" in args
                else env.state.get(f"orders/{args['order_id']}")["user_id"]
            )
            assert owner == customer, f"reference_actions[{index}] acts for {owner}"
    changed = env.export() != pristine
    if task.expect == "complete":
        assert _writes(task) and changed
    elif task.expect == "refuse":
        assert not _writes(task) and not changed
    else:
        assert changed == bool(_writes(task))
    for check in task.checks:
        present, value = _field(env.state.get(check.key), check.path)
        if check.absent:
            assert not present, check
        else:
            assert present and value == check.equals, (check, value)


def test_every_refusal_names_the_write_it_refuses(suite: Suite, generator: ModuleType) -> None:
    """The generator records the requested write of exactly the tasks that expect a refusal."""
    _, refused = generator.build()
    assert sorted(refused) == sorted(t.id for t in suite.tasks if t.expect == "refuse")


@pytest.mark.parametrize("task_id", REFUSAL_IDS)
def test_refused_write_is_rejected_by_the_tool(
    suite: Suite, generator: ModuleType, env: RetailEnvironment, pristine: Any, task_id: str
) -> None:
    """After the reads, the write a refusal task's customer asks for fails the tool's own
    validation and changes nothing."""
    task = suite.task(task_id)
    _, refused = generator.build()
    for call in task.reference_actions:
        _run(env, call.name, call.arguments)
    with pytest.raises(RetailError):
        _run(env, refused[task_id]["name"], refused[task_id]["arguments"])
    assert env.export() == pristine


# -- malformed task files ----------------------------------------------------------------------


def _task(task_id: str) -> dict[str, Any]:
    return {
        "id": task_id,
        "version": "1",
        "instruction": "You are someone; cancel an order.",
        "reference_actions": [
            {"name": "find_user_id_by_email", "arguments": {"email": "a@example.com"}},
            {"name": "get_order_details", "arguments": {"order_id": "#W0000000"}},
        ],
    }


def _write_suite(folder: Path, text: str, environment: str = ENVIRONMENT) -> Path:
    manifest = {"name": "bad", "version": "1", "environment": environment, "tasks": ["bad.json"]}
    (folder / "suite.json").write_text(json.dumps(manifest), "utf-8")
    (folder / "bad.json").write_text(text, "utf-8")
    return folder


def _document(*tasks: dict[str, Any]) -> str:
    return json.dumps({"format": "harness.tasks", "version": 1, "tasks": list(tasks)})


def test_missing_field_names_file_task_and_field(tmp_path: Path) -> None:
    """A task without its instruction is refused, naming the file, the task and 'instruction'."""
    broken = _task("bad-2")
    del broken["instruction"]
    with pytest.raises(SuiteError) as caught:
        load_suite(_write_suite(tmp_path, _document(_task("bad-1"), broken)))
    message = str(caught.value)
    assert "bad.json" in message and "'bad-2'" in message and "instruction" in message


def test_wrong_type_names_file_task_and_field(tmp_path: Path) -> None:
    """Arguments given as a list are refused, naming the file, the task and the field's path."""
    broken = _task("bad-2")
    broken["reference_actions"][1]["arguments"] = ["#W0000000"]
    with pytest.raises(SuiteError) as caught:
        load_suite(_write_suite(tmp_path, _document(_task("bad-1"), broken)))
    message = str(caught.value)
    assert "bad.json" in message and "'bad-2'" in message
    assert "reference_actions.1.arguments" in message


def test_unknown_tool_names_file_task_and_field(tmp_path: Path) -> None:
    """A reference action naming no tool of the environment is refused, naming the file, the
    task, the field and the tool."""
    broken = _task("bad-2")
    broken["reference_actions"][1]["name"] = "refund_everything"
    environment = f"{__name__}:{NamedRetailEnvironment.__name__}"
    with pytest.raises(SuiteError) as caught:
        load_suite(_write_suite(tmp_path, _document(_task("bad-1"), broken), environment))
    message = str(caught.value)
    assert str(tmp_path) in message and "'bad-2'" in message
    assert "reference_actions[1] (refund_everything): unknown tool" in message


def test_duplicate_id_names_file_task_and_field(tmp_path: Path) -> None:
    """Two tasks with one id are refused, naming the file, the id and the field 'id'."""
    with pytest.raises(SuiteError) as caught:
        load_suite(_write_suite(tmp_path, _document(_task("bad-1"), _task("bad-1"))))
    message = str(caught.value)
    assert "bad.json" in message and "'bad-1'" in message and "field id" in message


def test_invalid_json_names_file_and_line(tmp_path: Path) -> None:
    """A task file that is not JSON is refused, naming the file and the line (it has no task or
    field to name)."""
    text = '{"format": "harness.tasks", "version": 1,\n "tasks": [}\n'
    with pytest.raises(SuiteError) as caught:
        load_suite(_write_suite(tmp_path, text))
    message = str(caught.value)
    assert "bad.json" in message and "not valid JSON" in message and "line 2" in message

"""Tasks and suites: the task file format, its JSON Schema, and the loaders.

A suite is a folder with a ``suite.json`` manifest naming its environment (an importable
``module:Class``) and its task files; each task file is validated against the JSON Schema that
ships in the package (``harness/schemas/tasks.schema.json``) before anything runs. A tau2-bench
``tasks.json`` loads too, on the built-in environment of its domain.

The built-in suites (:data:`BUILTIN_SUITES`) load by name: ``load_suite("retail")``. Their data
(``suite.json``, ``tasks.json``) lives in the repository's ``tasks/`` folder, and a built wheel
carries a copy in ``harness/_suites/`` (:func:`builtin_suite`).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Final, Literal, Protocol, runtime_checkable

import jsonschema
from pydantic import BaseModel, ConfigDict, Field

from ._json import digest
from .errors import SuiteError

__all__ = [
    "BUILTIN_ENVIRONMENTS",
    "BUILTIN_SUITES",
    "Environment",
    "FieldCheck",
    "Suite",
    "SuiteError",
    "Task",
    "ToolCall",
    "builtin_suite",
    "load_suite",
    "resolve_suite",
    "task_schema",
]

TASK_FORMAT_VERSION = 1
MANIFEST_FIELDS = frozenset(
    {"name", "version", "description", "environment", "environment_options", "verifier", "tasks"}
)
BUILTIN_SUITES: Final = ("retail", "configs")
"""The suites that ship with harness, loadable by name (:func:`builtin_suite`)."""
BUILTIN_ENVIRONMENTS = {"retail": "harness.domains.retail.environment:RetailEnvironment"}
"""tau2 domain -> the built-in environment a tau2 ``tasks.json`` of that domain runs on."""
# The verifier a suite uses unless its manifest names another (``"verifier": "module:function"``).
DEFAULT_VERIFIER = "verifiers:verify"


@runtime_checkable
class Environment(Protocol):
    """One isolated copy of a domain's external state, with its tools."""

    state: Any
    tools: dict[str, Callable[..., Any]]

    def export(self) -> Any:
        """The domain's data as plain JSON in upstream's shape."""
        ...

    def close(self) -> None:
        """Release the copy."""
        ...


class Verification(Protocol):
    """What a verifier returns: pass/fail, partial credit beside it, and what it compared."""

    @property
    def passed(self) -> bool: ...

    @property
    def partial(self) -> float | None: ...

    def to_dict(self) -> dict[str, Any]:
        """The verdict as stored with the trial (JSON-ready)."""
        ...


class Verifier(Protocol):
    """Judges one trial on the external state it left (named by a suite like its environment).

    Args:
        task: the task.
        actual: resources the trial changed: key -> final value (None: removed).
        expected: the same for the task's reference actions on a fresh environment.
        message: the agent's final message.
        state: the trial's state adapter, after the trial.
        steps: for each reference write, whether the trial committed the same call.
    """

    def __call__(
        self,
        task: Task,
        *,
        actual: Mapping[str, Any],
        expected: Mapping[str, Any],
        message: str,
        state: Any,
        steps: Sequence[bool],
    ) -> Verification: ...


class ToolCall(BaseModel):
    """One tool call: a name and its arguments."""

    model_config = ConfigDict(frozen=True)
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class FieldCheck(BaseModel):
    """A field of a resource that must hold a value in the final state."""

    key: str
    path: list[str] = Field(default_factory=list)
    equals: Any = None
    absent: bool = False


class Task(BaseModel):
    """A task: instruction, reference actions, what a verifier checks. Versioned.

    Attributes:
        id: unique within the suite.
        version: bumped whenever the task's meaning changes.
        instruction: what the user asks, in words.
        reference_actions: the tool calls that accomplish it, in order.
        expect: ``complete``, ``refuse`` (the right answer is not to act) or ``handoff``.
        required_outputs: substrings the agent's final message must contain (case-insensitive).
        checks: field checks on the final state, beyond equality with the reference.
        partial_credit: ``none`` or ``steps`` (fraction of reference writes whose effect is
            present), reported separately from pass/fail.
    """

    id: str
    version: str = "1"
    instruction: str = ""
    reference_actions: list[ToolCall] = Field(default_factory=list)
    expect: Literal["complete", "refuse", "handoff"] = "complete"
    required_outputs: list[str] = Field(default_factory=list)
    checks: list[FieldCheck] = Field(default_factory=list)
    partial_credit: Literal["none", "steps"] = "steps"
    user: dict[str, Any] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)
    source: str = ""

    @property
    def digest(self) -> str:
        """A digest of the task's content (its evidence identity)."""
        return digest(self.model_dump(mode="json"))


@cache
def task_schema() -> dict[str, Any]:
    """The JSON Schema task files are validated against."""
    text = resources.files("harness").joinpath("schemas/tasks.schema.json").read_text()
    return dict(json.loads(text))


def _import(spec: str, where: str, what: str = "environment") -> Any:
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise SuiteError(f"{where}: {what} {spec!r} must look like 'package.module:name'")
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise SuiteError(f"{where}: cannot import {what} {spec!r} ({exc})") from exc
    if not callable(found):
        raise SuiteError(f"{where}: {what} {spec!r} is not callable")
    return found


class Suite:
    """A set of tasks on one environment.

    Attributes:
        name, version: from the manifest.
        path: where it was loaded from.
        tasks: the tasks, in file order.
        environment: the ``module:Class`` that builds a fresh environment.
        verifier: the ``module:function`` that judges a trial (:class:`Verifier`); its
            callable is :attr:`verify`.
    """

    def __init__(
        self,
        *,
        name: str,
        version: str,
        path: Path,
        tasks: list[Task],
        environment: str,
        environment_options: dict[str, Any] | None = None,
        verifier: str = DEFAULT_VERIFIER,
    ) -> None:
        self.name = name
        self.version = version
        self.path = path
        self.tasks = tasks
        self.environment = environment
        self.environment_options = environment_options or {}
        self._factory = _import(environment, str(path))
        self.verifier = verifier
        self.verify: Verifier = _import(verifier, str(path), what="verifier")
        self._check_tools()

    def _check_tools(self) -> None:
        names = getattr(self._factory, "TOOL_NAMES", None)
        if names is None:
            return
        for task in self.tasks:
            for i, call in enumerate(task.reference_actions):
                if call.name not in names:
                    raise SuiteError(
                        f"{self.path}: task {task.id!r}: reference_actions[{i}].name "
                        f"{call.name!r} is not a tool of {self.environment} "
                        f"(tools: {', '.join(sorted(names))})"
                    )

    def new_environment(self) -> Any:
        """A fresh, isolated environment for one trial."""
        return self._factory(**self.environment_options)

    def task(self, task_id: str) -> Task:
        """The task with ``task_id``."""
        for t in self.tasks:
            if t.id == task_id:
                return t
        raise SuiteError(f"suite {self.name}: no task {task_id!r}")

    def manifest(self) -> dict[str, Any]:
        """What identifies this suite in a run's evidence record."""
        return {
            "name": self.name,
            "version": self.version,
            "environment": self.environment,
            "verifier": self.verifier,
            "tasks": {t.id: {"version": t.version, "digest": t.digest} for t in self.tasks},
        }

    def __repr__(self) -> str:
        return f"<Suite {self.name} v{self.version}: {len(self.tasks)} tasks>"


def _checkout_tasks() -> Path | None:
    """The repository's ``tasks/`` folder, beside the ``harness`` package in a source checkout.

    The one place that knows where suite data lives in a checkout; None when the package is not
    a folder on disk.
    """
    package = resources.files("harness")
    return package.resolve().parent / "tasks" if isinstance(package, Path) else None


def builtin_suite(name: str) -> Path | None:
    """The folder of the built-in suite ``name`` (one of :data:`BUILTIN_SUITES`).

    A built wheel carries each built-in's ``suite.json`` and task files in
    ``harness/_suites/<name>/``; a source checkout has them in the repository's
    ``tasks/<name>/``. The packaged copy comes first.

    Returns:
        The folder, or None: ``name`` is not a built-in, or its data is in neither place.
    """
    if name not in BUILTIN_SUITES:
        return None
    packaged = resources.files("harness") / "_suites" / name
    checkout = _checkout_tasks()
    for folder in (packaged, None if checkout is None else checkout / name):
        if isinstance(folder, Path) and (folder / "suite.json").is_file():
            return folder
    return None


def resolve_suite(path: str | Path) -> Path:
    """What :func:`load_suite` loads: ``path`` if it exists, else the built-in suite so named.

    Raises:
        SuiteError: ``path`` is neither an existing path nor a built-in suite (the message
            lists the built-ins), or a built-in's data is missing.
    """
    p = Path(path)
    if p.exists():
        return p
    builtin = builtin_suite(str(path))
    if builtin is not None:
        return builtin
    if str(path) in BUILTIN_SUITES:
        raise SuiteError(
            f"built-in suite {str(path)!r}: its data is in neither the package "
            f"(harness/_suites) nor a source checkout ({_checkout_tasks()})"
        )
    raise SuiteError(
        f"{str(path)!r} is neither a suite folder, a task file, nor a built-in suite "
        f"({', '.join(BUILTIN_SUITES)})"
    )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SuiteError(f"{path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise SuiteError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None


def _validate_task_file(path: Path, data: Any) -> list[Task]:
    validator = jsonschema.Draft202012Validator(task_schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        loc = list(err.absolute_path)
        task = ""
        if len(loc) >= 2 and loc[0] == "tasks" and isinstance(loc[1], int):
            tid = (
                data["tasks"][loc[1]].get("id") if isinstance(data["tasks"][loc[1]], dict) else None
            )
            task = f"task {tid or '#' + str(loc[1])!r}: "
            loc = loc[2:]
        if err.validator == "required" and isinstance(err.instance, dict):
            missing = [f for f in err.validator_value if f not in err.instance]
            loc = [*loc, missing[0]] if missing else loc
        field = ".".join(str(p) for p in loc) or "(top level)"
        raise SuiteError(f"{path}: {task}field {field}: {err.message}")
    tasks = [Task.model_validate(t) for t in data["tasks"]]
    seen: set[str] = set()
    for t in tasks:
        if t.id in seen:
            raise SuiteError(f"{path}: task {t.id!r}: field id: duplicated")
        seen.add(t.id)
    return tasks


def _is_tau2(data: Any) -> bool:
    return isinstance(data, list) and bool(data) and "evaluation_criteria" in data[0]


def _from_tau2(path: Path, data: list[dict[str, Any]]) -> list[Task]:
    tasks = []
    for i, raw in enumerate(data):
        where = f"{path}: task {raw.get('id', '#' + str(i))!r}"
        try:
            crit = raw.get("evaluation_criteria") or {}
            scenario = raw.get("user_scenario") or {}
            instr = scenario.get("instructions") or {}
            text = instr if isinstance(instr, str) else instr.get("reason_for_call", "")
            actions = [
                ToolCall(name=a["name"], arguments=a.get("arguments") or {})
                for a in crit.get("actions") or []
            ]
            tasks.append(
                Task(
                    id=str(raw["id"]),
                    instruction=text,
                    reference_actions=actions,
                    required_outputs=list(crit.get("communicate_info") or []),
                    user=instr if isinstance(instr, dict) else {},
                    source="tau2",
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SuiteError(f"{where}: not a tau2 task ({exc})") from None
    return tasks


def load_suite(path: str | Path) -> Suite:
    """Load a suite folder (with ``suite.json``), a task file, a tau2-format ``tasks.json``, or
    a built-in suite by name (:data:`BUILTIN_SUITES`) when no such path exists.

    Raises:
        SuiteError: naming the file, the task and the field that is wrong.
    """
    p = resolve_suite(path)
    if p.is_dir():
        manifest_path = p / "suite.json"
        manifest = _read_json(manifest_path)
        if not isinstance(manifest, dict):
            raise SuiteError(f"{manifest_path}: must be a JSON object")
        for field in ("name", "environment", "tasks"):
            if field not in manifest:
                raise SuiteError(f"{manifest_path}: field {field}: missing")
        unknown = sorted(set(manifest) - MANIFEST_FIELDS)
        if unknown:
            raise SuiteError(
                f"{manifest_path}: field {unknown[0]}: not a manifest field "
                f"(fields: {', '.join(sorted(MANIFEST_FIELDS))})"
            )
        tasks: list[Task] = []
        first_file: dict[str, Path] = {}
        for rel in manifest["tasks"]:
            file = p / rel
            for task in _validate_task_file(file, _read_json(file)):
                if task.id in first_file:
                    raise SuiteError(
                        f"{file}: task {task.id!r}: field id: already defined in "
                        f"{first_file[task.id]}"
                    )
                first_file[task.id] = file
                tasks.append(task)
        return Suite(
            name=manifest["name"],
            version=str(manifest.get("version", "1")),
            path=p,
            tasks=tasks,
            environment=manifest["environment"],
            environment_options=manifest.get("environment_options") or {},
            verifier=manifest.get("verifier") or DEFAULT_VERIFIER,
        )
    data = _read_json(p)
    if _is_tau2(data):
        domain = (data[0].get("user_scenario") or {}).get("instructions", {}).get("domain")
        env = BUILTIN_ENVIRONMENTS.get(domain or "")
        if env is None:
            raise SuiteError(
                f"{p}: tau2 domain {domain!r} has no built-in environment "
                f"(built in: {', '.join(BUILTIN_ENVIRONMENTS)})"
            )
        return Suite(
            name=f"tau2-{domain}",
            version="tau2",
            path=p,
            tasks=_from_tau2(p, data),
            environment=env,
        )
    tasks = _validate_task_file(p, data)
    env = data.get("environment") if isinstance(data, dict) else None
    if not env:
        raise SuiteError(f"{p}: field environment: missing (a task file run alone names it)")
    return Suite(
        name=p.stem, version=str(data.get("version", "1")), path=p, tasks=tasks, environment=env
    )

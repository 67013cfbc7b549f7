"""Tasks and suites: the task file format, its JSON Schema, and the loaders.

A suite is a folder with a ``suite.json`` manifest naming its environment (a registered name,
or a ``module:Class`` of the suite's folder or an importable module: :class:`Suite` says
exactly what is accepted) and its task files. The manifest and each task file are validated
against the JSON Schemas that ship in the package (``harness/schemas/suite.schema.json`` and
``tasks.schema.json``) before anything runs, and every task's reference actions are checked
against the environment's tools (:meth:`Suite.check`).
A tau2-bench ``tasks.json`` loads too, on the built-in environment of its domain.

The built-in suites (:data:`BUILTIN_SUITES`) load by name: ``load_suite("retail")``. Their data
(``suite.json``, ``tasks.json``) lives in the repository's ``tasks/`` folder, and a built wheel
carries a copy in ``harness/_suites/`` (:func:`builtin_suite`).
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import inspect
import json
import sys
import tempfile
import textwrap
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Final, Literal, Protocol, cast, runtime_checkable

import jsonschema
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from ._json import canonical, digest
from .action import Action
from .clock import FakeClock
from .episode import Episode
from .errors import (
    ActionFailed,
    ConfigurationError,
    Escalated,
    HarnessError,
    InvalidArguments,
    PreconditionFailed,
    Rejected,
    SuiteError,
)
from .policy import Decision, FailureClass, Policy, Retry
from .store import Escalation, SigningKey, Store
from .transaction import observed_changes

__all__ = [
    "BUILTIN_ENVIRONMENTS",
    "BUILTIN_ENVIRONMENT_NAMES",
    "BUILTIN_SUITES",
    "ENVIRONMENT_GROUP",
    "VERIFIER_GROUP",
    "Approval",
    "Environment",
    "FieldCheck",
    "Reference",
    "Refusal",
    "Suite",
    "SuiteError",
    "Task",
    "ToolCall",
    "builtin_suite",
    "is_builtin_suite",
    "load_suite",
    "resolve_suite",
    "suite_schema",
    "task_schema",
]

TASK_FORMAT_VERSION = 1
BUILTIN_SUITES: Final = ("retail", "airline", "configs", "telecom")
"""The suites that ship with harness, loadable by name (:func:`builtin_suite`)."""
BUILTIN_ENVIRONMENTS = {
    "retail": "harness.domains.retail.environment:RetailEnvironment",
    "airline": "harness.domains.airline.environment:AirlineEnvironment",
    "telecom": "harness.domains.telecom.environment:TelecomEnvironment",
}
"""tau2 domain -> the built-in environment a tau2 ``tasks.json`` of that domain runs on."""
# The verifier a suite uses unless its manifest names another (``"verifier": "module:function"``).
DEFAULT_VERIFIER = "harness.verifiers:verify"
ENVIRONMENT_GROUP: Final = "harness.environments"
"""The entry-point group a package registers environments in (``"environment": "<name>"``)."""
VERIFIER_GROUP: Final = "harness.verifiers"
"""The entry-point group a package registers verifiers in (``"verifier": "<name>"``)."""
BUILTIN_ENVIRONMENT_NAMES: Final = {
    "retail": "harness.domains.retail.environment:RetailEnvironment",
    "airline": "harness.domains.airline.environment:AirlineEnvironment",
    "configs": "harness.domains.configs.environment:ConfigsEnvironment",
    "telecom": "harness.domains.telecom.environment:TelecomEnvironment",
}
"""The built-in environments by name (registered in ``harness.environments`` too; this copy
answers when the installed package's metadata is older than the source)."""
BUILTIN_VERIFIERS: Final = "harness.verifiers"
"""The package of the built-in verifiers (``"verifier": "harness.verifiers:verify"``)."""
FORMER_VERIFIERS: Final = "verifiers"
"""The top-level name the built-in verifiers had before they moved into harness: a suite's
``"verifiers:<name>"`` means :data:`BUILTIN_VERIFIERS`, and a package of that name installed
beside harness (an unrelated project's) is never imported for it."""
# What an environment class must have (:class:`Environment`), checked on the class.
ENVIRONMENT_METHODS: Final = ("close", "export")
ENVIRONMENT_ATTRIBUTES: Final = ("state", "tools")


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


class Approval(BaseModel):
    """The decision a person gives a reference call that is held for approval, as the task
    records it (``"approval"`` beside a reference action's name and arguments).

    The reference replay answers the held call with it, and so does a trial whose agent makes
    the same call (same tool, same arguments): the decision is recorded as this person's, with
    a reason saying which task recorded it.

    Attributes:
        by: who decides (recorded as the decision's author).
        decision: ``approve`` (the call runs), ``reject`` (it does not; the agent is told) or
            ``edit`` (it runs with the arguments in ``edit``).
        reason: why, in words (optional).
        edit: the arguments the call runs with instead; given with ``edit`` only.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    by: str = Field(min_length=1)
    decision: Literal["approve", "reject", "edit"]
    reason: str = ""
    edit: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _edit_goes_with_edit(self) -> Approval:
        if self.decision == "edit" and self.edit is None:
            raise ValueError(
                "decision 'edit' needs edit: the call's arguments, in full, that it runs "
                'with instead, e.g. "edit": {"account": "a", "amount": 50}'
            )
        if self.decision != "edit" and self.edit is not None:
            raise ValueError(
                f"edit is given only with decision 'edit', not {self.decision!r}: remove edit, "
                "or say decision 'edit'"
            )
        return self

    def resolve(
        self,
        store: Store,
        escalation_id: str,
        task_id: str,
        *,
        signing_key: SigningKey | None = None,
    ) -> Escalation:
        """Record this decision on ``escalation_id`` (a held call of task ``task_id``), as
        this person's, with a reason saying the task recorded it."""
        reason = f"recorded in task {task_id!r}" + (f": {self.reason}" if self.reason else "")
        return store.resolve(
            escalation_id,
            self.decision,
            by=self.by,
            reason=reason,
            edit=self.edit,
            signing_key=signing_key,
        )


class ToolCall(BaseModel):
    """One tool call: a name and its arguments, and, for a call held for a person's approval,
    the decision the task records for it (:class:`Approval`)."""

    model_config = ConfigDict(frozen=True)
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    approval: Approval | None = None
    requestor: Literal["assistant", "user"] = "assistant"
    """Who makes the call: the agent (``assistant``) or, in an environment whose user has
    tools of its own (``user_tools``), the user."""
    compare_args: list[str] | None = None
    """The arguments a trial's call must give the same values of to count as this one
    (tau2's ``compare_args``): None compares every argument the trial's call gave, an empty
    list only the tool's name. Read by an environment that scores tau2's ``ACTION`` reward."""

    def matches(self, name: str, arguments: Mapping[str, Any]) -> bool:
        """Whether a call of ``name`` with ``arguments`` counts as this one, as tau2's
        ``Action.compare_with_tool_call`` decides: the same tool, and the same values of
        :attr:`compare_args` (None: of every argument the call gave)."""
        if name != self.name:
            return False
        keys = list(arguments) if self.compare_args is None else self.compare_args
        given = {k: v for k, v in arguments.items() if k in keys}
        return given == {k: v for k, v in self.arguments.items() if k in keys}

    @model_serializer(mode="wrap")
    def _without_unset_approval(self, handler: SerializerFunctionWrapHandler) -> Any:
        # A call without a recorded approval, made by the agent, comparing every argument,
        # reads as it did before these existed (its task keeps the digest runs recorded).
        data = handler(self)
        if isinstance(data, dict):
            if self.approval is None:
                data.pop("approval", None)
            if self.requestor == "assistant":
                data.pop("requestor", None)
            if self.compare_args is None:
                data.pop("compare_args", None)
        return data


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
        nl_assertions: statements about the conversation a judge model must find met (tau2's
            ``nl_assertions``; Inspect's model-graded scorers): every one must be met for the
            trial to pass. A run without a judge cannot pass such a task, and says so.
        initialization: calls that set the environment up before the agent starts (tau2's
            ``initial_state.initialization_actions``: each ``{"env_type", "func_name",
            "arguments"}``), run by an environment that has ``prepare(task)``.
        env_assertions: tau2's assertions on the environment's end state (each
            ``{"env_type", "func_name", "arguments", "assert_value"}``), checked by an
            environment that has ``reward(task, calls)``.
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
    nl_assertions: list[str] = Field(default_factory=list)
    initialization: list[dict[str, Any]] = Field(default_factory=list)
    env_assertions: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def digest(self) -> str:
        """A digest of the task's content (its evidence identity). A field added since a task
        was first written, left at its default, leaves the digest as it was."""
        unset = {
            name for name, default in _LATER_DEFAULTS.items() if getattr(self, name) == default
        }
        return digest(self.model_dump(mode="json", exclude=unset))


# Task fields added after tasks were first written, with their defaults: a task that leaves
# one at its default keeps the digest it had (runs recorded before it still match).
_LATER_DEFAULTS: Final[dict[str, Any]] = {
    "nl_assertions": [],
    "initialization": [],
    "env_assertions": [],
}


@cache
def _schema(name: str) -> dict[str, Any]:
    text = resources.files("harness").joinpath(f"schemas/{name}.schema.json").read_text()
    return dict(json.loads(text))


def task_schema() -> dict[str, Any]:
    """The JSON Schema task files (``tasks.json``) are validated against: the file
    ``harness/schemas/tasks.schema.json`` shipped in the package."""
    return _schema("tasks")


def suite_schema() -> dict[str, Any]:
    """The JSON Schema suite manifests (``suite.json``) are validated against: the file
    ``harness/schemas/suite.schema.json`` shipped in the package."""
    return _schema("suite")


@dataclass(frozen=True)
class Refusal:
    """A reference action that did not run as written: which one, why, and whether it fails
    a load (``write``): a write (a mutating action), whose refusal changes the expected state,
    or a call whose recorded approval is never used, which would mislead."""

    index: int
    tool: str
    problem: str
    write: bool

    def message(self, task: Task) -> str:
        """The refusal as an error names it: the task, the action and the problem."""
        return f"task {task.id!r}: reference_actions[{self.index}] ({self.tool}): {self.problem}"


@dataclass(frozen=True)
class Reference:
    """What a task's reference actions do on a fresh environment (:meth:`Suite.reference`).

    Attributes:
        changes: the resources they changed: key -> final value (None: removed).
        writes: the writes that committed: (action, canonical arguments), in order.
        refused: the reference actions that did not run (for a suite loaded with its
            references checked, reads only: a refused write is an error there).
        approvals: the decisions the task records for its held calls, each as the held call
            bound it: (action, canonical arguments, decision). A trial's held call with the
            same action and arguments is answered with it.
    """

    changes: dict[str, Any]
    writes: list[tuple[str, str]]
    refused: list[Refusal]
    approvals: list[tuple[str, str, Approval]] = dataclass_field(default_factory=list)

    def approval(self, action: str, arguments: str) -> Approval | None:
        """The recorded decision for a held call of ``action`` with ``arguments`` (canonical
        JSON, as its escalation binds them); None: the task records none."""
        for name, bound, approval in self.approvals:
            if (name, bound) == (action, arguments):
                return approval
        return None


# How reference actions are replayed: no retries and no waiting, and every failure goes on to
# the next call (it is reported, never rolled back over the calls before it).
REPLAY_POLICY: Final = Policy(
    retry=Retry(attempts=1),
    decisions={FailureClass.SCOPE: Decision.CONTINUE},
    unsafe=Decision.CONTINUE,
)


def _signature(name: str, tool: Any) -> str:
    """``name(arguments)`` as the tool's function declares them, for error messages."""
    fn = tool.fn if isinstance(tool, Action) else tool
    try:
        signature = inspect.signature(fn, eval_str=True)
    except Exception:  # hints that do not resolve: shown as written
        signature = inspect.signature(fn)
    return f"{name}{signature.replace(return_annotation=inspect.Signature.empty)}"


def _argument_errors(name: str, tool: Any, arguments: dict[str, Any]) -> list[str]:
    """Why ``arguments`` do not fit ``tool`` (empty: they fit).

    An action validates them against its schema; a plain function is judged by the schema
    its signature and type hints give (as if it were an action), or, when it has none (``**``
    arguments, unresolvable hints), by binding its signature.
    """
    try:
        checked = tool if isinstance(tool, Action) else Action(tool, name=name)
    except (ConfigurationError, TypeError, ValueError):
        try:
            inspect.signature(tool).bind(**arguments)
        except TypeError as exc:
            return [str(exc)]
        except ValueError:  # no signature to read: nothing to check the arguments against
            return []
        return []
    try:
        checked.validate_mapping(dict(arguments))
    except InvalidArguments as exc:
        return exc.errors
    return []


def _tools_of(env: Any, call: ToolCall) -> Mapping[str, Any]:
    """The tools ``call``'s requestor may call in ``env`` (the user's: ``env.user_tools``)."""
    if call.requestor == "user":
        return cast("Mapping[str, Any]", getattr(env, "user_tools", None) or {})
    return cast("Mapping[str, Any]", env.tools)


def _call_problem(tools: Mapping[str, Any], call: ToolCall, environment: str) -> str | None:
    """What is wrong with a reference call before it runs: its tool, or its arguments."""
    tool = tools.get(call.name)
    if tool is None:
        return (
            f"unknown tool {call.name!r}; the tools of {environment} are "
            f"{', '.join(sorted(tools)) or 'none'}: name one of them, or add the tool to the "
            "environment's tools"
        )
    given = [("arguments", call.arguments)]
    if call.approval is not None:
        if not isinstance(tool, Action):
            return (
                f"approval: {call.name!r} is a read (a plain function), which is never held for "
                "a person's approval: remove the approval"
            )
        if call.approval.edit is not None:
            given.append(("approval.edit: arguments", call.approval.edit))
    for what, arguments in given:
        errors = _argument_errors(call.name, tool, arguments)
        if errors:
            return (
                f"{what} {sorted(arguments)} do not fit the tool's schema: "
                f"{'; '.join(errors)}; give the arguments of {_signature(call.name, tool)}"
            )
    return None


def _refusal(exc: Exception) -> str:
    """Why a reference call was refused when it ran, with the fix."""
    error: BaseException = exc
    if isinstance(exc, ActionFailed) and exc.failure_class == "fail_stop" and exc.errors:
        error = exc.errors[-1]
    if isinstance(error, PreconditionFailed):
        why = f"its precondition {error.check!r} is false"
        why += f": {error.reason}" if error.reason else ""
    elif isinstance(error, ActionFailed | Escalated):
        why = f"it did not commit ({error.failure_class}): {error.reason}"
    elif isinstance(error, HarnessError):
        why = str(error)
    else:
        why = f"the tool raised {type(error).__name__}: {error}"
    why = why.rstrip(".")
    return (
        f"refused when the reference actions are replayed on a fresh environment: {why}. "
        "The reference actions define the task's expected state: fix this action or the ones "
        "before it"
    )


HELD_FOR_APPROVAL: Final = "approval"
"""The failure class of a call held for a person's approval before it runs."""


def _unanswered(exc: Escalated) -> str:
    """Why a reference call held for approval, with no decision recorded, is refused."""
    return (
        f"it is {exc.reason.rstrip('.')}, and the task records no decision for it, so the "
        "reference path would wait for a person. Record the decision it gets beside the "
        'call\'s name and arguments, e.g. "approval": {"by": "supervisor", "decision": '
        '"approve"} (docs/suites.md, section Approvals)'
    )


class _ReferenceReplay:
    """One task's reference actions called in order, as an agent would call them, in the
    episode that is open; a call held for approval whose decision the task records stops the
    pass, so that the decision is recorded and the episode resumed (:meth:`Suite._replay_task`).

    Attributes:
        answered: the reference calls a recorded decision answered: index -> their arguments
            as the escalation bound them (canonical JSON).
        writes, refused: what the last pass committed and refused.
    """

    def __init__(
        self,
        task: Task,
        tools: Mapping[str, Any],
        environment: str,
        user_tools: Mapping[str, Any] | None = None,
    ) -> None:
        self.task = task
        self.tools = tools
        self.user_tools: Mapping[str, Any] = user_tools or {}
        self.environment = environment
        self.answered: dict[int, str] = {}
        self.writes: list[tuple[str, str]] = []
        self.refused: list[Refusal] = []

    def run(self) -> tuple[int, str] | None:
        """One pass; the held call to answer (its index and escalation), or None: done."""
        self.writes, self.refused = [], []
        for i, call in enumerate(self.task.reference_actions):
            tools = self.tools if call.requestor == "assistant" else self.user_tools
            problem = _call_problem(tools, call, self.environment)
            tool = tools.get(call.name)
            ran = call.arguments
            if problem is None:
                try:
                    _run(tool, call.arguments)
                except Escalated as exc:
                    if exc.failure_class != HELD_FOR_APPROVAL or i in self.answered:
                        problem = _refusal(exc)
                    elif call.approval is None:
                        problem = _unanswered(exc)
                    else:
                        return i, exc.escalation_id
                except Rejected as exc:
                    if call.approval is None or call.approval.decision != "reject":
                        problem = _refusal(exc)
                    else:
                        continue  # (rejected as recorded: not done, and not refused)
                except Exception as exc:
                    problem = _refusal(exc)
                else:
                    if call.approval is not None and call.approval.edit is not None:
                        ran = call.approval.edit
            if problem is not None:
                write = isinstance(tool, Action) and tool.mutating
                self.refused.append(Refusal(i, call.name, problem, write))
            elif isinstance(tool, Action) and tool.mutating:
                # As the transaction log records a call: validated, defaults filled in.
                values = tool.call_values(tool.validate_mapping(dict(ran)))
                self.writes.append((call.name, canonical(values)))
        return None

    def reference(self, changes: dict[str, Any]) -> Reference:
        """The outcome, with a refusal for each recorded decision no held call used."""
        refused = {r.index for r in self.refused}
        unused = [
            Refusal(
                i,
                call.name,
                "its approval is recorded, but the call is not held for a person's approval "
                "when the reference actions are replayed, so the decision would never be "
                "used: remove the approval from the task, or give the action the approval "
                "rule that holds this call (@hx.action(approval=...))",
                True,
            )
            for i, call in enumerate(self.task.reference_actions)
            if call.approval is not None and i not in self.answered and i not in refused
        ]
        approvals = [
            (call.name, self.answered[i], call.approval)
            for i, call in enumerate(self.task.reference_actions)
            if call.approval is not None and i in self.answered
        ]
        refusals = sorted([*self.refused, *unused], key=lambda r: r.index)
        return Reference(changes, self.writes, refusals, approvals)


_REPLAY_STORE_LOCK = threading.Lock()


def _remove_store(store: Store, folder: tempfile.TemporaryDirectory[str]) -> None:
    store.close()
    folder.cleanup()


def _run(tool: Any, arguments: dict[str, Any]) -> Any:
    """Call ``tool``; an async tool is run to completion."""
    result = tool(**arguments)
    return asyncio.run(result) if inspect.iscoroutine(result) else result


def _suite_folder(path: Path) -> Path:
    """The folder whose modules a suite may name: the suite folder, or a task file's folder."""
    return path if path.is_dir() else path.parent


def _manifest_file(path: Path) -> Path:
    """The file a suite's environment and verifier are named in (for error messages)."""
    return path / "suite.json" if path.is_dir() else path


def _folder_package(folder: Path) -> str:
    """A package (made here, not on ``sys.path``) whose modules are the files of ``folder``.

    Its name depends on the folder's resolved path, so two suites' ``my_env.py`` never meet.
    """
    resolved = folder.resolve()
    name = "_harness_suite_" + hashlib.sha256(str(resolved).encode()).hexdigest()[:16]
    if name not in sys.modules:
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(resolved)]
        sys.modules[name] = importlib.util.module_from_spec(spec)
    return name


def _in_folder(folder: Path | None, module: str) -> bool:
    if folder is None:
        return False
    top = module.split(".")[0]
    return (folder / f"{top}.py").is_file() or (folder / top / "__init__.py").is_file()


def _entry_point(group: str, name: str) -> Any:
    """The object registered as ``name`` in the entry-point ``group`` (None: not registered)."""
    for ep in importlib.metadata.entry_points(group=group, name=name):
        return ep.load()
    return None


def _refuse(where: Path, field: str, spec: str, reason: str) -> SuiteError:
    return SuiteError(f"{where}: field {field}: {spec!r} {reason}")


def _resolve(spec: str, where: Path, folder: Path | None, field: str) -> Any:
    """What ``spec`` names, imported only from the places :class:`Suite` accepts.

    Nothing found is called here: the caller checks its kind first.
    """
    what = field
    group = ENVIRONMENT_GROUP if field == "environment" else VERIFIER_GROUP
    if not isinstance(spec, str) or not spec:
        raise SuiteError(f"{where}: field {field}: must be a non-empty string")
    if ":" not in spec:
        try:
            found = _entry_point(group, spec)
        except Exception as exc:
            raise _refuse(where, field, spec, f"is registered but does not load ({exc})") from exc
        if found is None and field == "environment" and spec in BUILTIN_ENVIRONMENT_NAMES:
            return _resolve(BUILTIN_ENVIRONMENT_NAMES[spec], where, None, field)
        if found is None:
            names = sorted(ep.name for ep in importlib.metadata.entry_points(group=group))
            raise _refuse(
                where,
                field,
                spec,
                f"is not a registered {what} (entry-point group {group}: "
                f"{', '.join(names) or 'none'}); name one as 'module:name'",
            )
        return found
    module, _, attr = spec.partition(":")
    if not all(part.isidentifier() for part in module.split(".")) or not attr.isidentifier():
        raise _refuse(where, field, spec, "must look like 'package.module:name'")
    if _in_folder(folder, module):
        assert folder is not None
        target = f"{_folder_package(folder)}.{module}"
    elif field == "environment":
        target = module
    elif (builtin := _builtin_verifiers(module)) is not None:
        target = builtin
    else:
        raise _refuse(
            where,
            field,
            spec,
            f"is not in the suite's folder ({folder}), not a registered verifier "
            f"(entry-point group {group}) and not in the built-in verifiers package "
            f"({BUILTIN_VERIFIERS})",
        )
    try:
        return getattr(importlib.import_module(target), attr)
    except Exception as exc:
        hint = ""
        if isinstance(exc, ImportError) and (exc.name or "").split(".")[0] == FORMER_VERIFIERS:
            hint = (
                f"; harness's built-in verifiers are the package {BUILTIN_VERIFIERS}, no longer "
                f"a top-level {FORMER_VERIFIERS}: import them as "
                f"`from {BUILTIN_VERIFIERS} import verify`"
            )
        raise SuiteError(
            f"{where}: field {field}: cannot import {what} {spec!r} "
            f"({type(exc).__name__}: {exc}){hint}"
        ) from exc


def _builtin_verifiers(module: str) -> str | None:
    """The module of the built-in verifiers that ``module`` names, or None: not one of them.

    ``harness.verifiers[.<sub>]`` names itself; ``verifiers[.<sub>]`` (:data:`FORMER_VERIFIERS`)
    names the same module of :data:`BUILTIN_VERIFIERS`.
    """
    for package in (BUILTIN_VERIFIERS, FORMER_VERIFIERS):
        if module == package or module.startswith(package + "."):
            return BUILTIN_VERIFIERS + module[len(package) :]
    return None


def _declares(cls: type, name: str) -> bool:
    """Whether instances of ``cls`` have attribute ``name``, judged without running anything:
    a class attribute or annotation along its bases, or ``self.<name> = ...`` in their source."""
    for klass in cls.__mro__:
        if name in vars(klass) or name in getattr(klass, "__annotations__", {}):
            return True
    for klass in cls.__mro__[:-1]:
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            for t in targets:
                if (
                    isinstance(t, ast.Attribute)
                    and t.attr == name
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                ):
                    return True
    return False


def _environment_class(
    spec: str, where: Path, folder: Path | None, options: Mapping[str, Any]
) -> type:
    """The environment class ``spec`` names, checked against :class:`Environment` and
    ``options`` (its ``environment_options``) before anything is called."""
    found = _resolve(spec, where, folder, "environment")
    if not isinstance(found, type):
        raise _refuse(
            where,
            "environment",
            spec,
            f"is not a class ({type(found).__name__}); an environment is a class whose "
            "instances have state, tools, export() and close()",
        )
    lacking = [m + "()" for m in ENVIRONMENT_METHODS if not callable(getattr(found, m, None))]
    lacking += [a for a in ENVIRONMENT_ATTRIBUTES if not _declares(found, a)]
    if lacking:
        raise _refuse(
            where,
            "environment",
            spec,
            f"is not an environment: its instances lack {', '.join(lacking)}",
        )
    if not isinstance(options, Mapping):
        raise SuiteError(f"{where}: field environment_options: must be a JSON object")
    try:
        signature = inspect.signature(found)
    except (TypeError, ValueError) as exc:
        raise _refuse(where, "environment", spec, f"has no readable signature ({exc})") from exc
    params = signature.parameters.values()
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        accepted = [
            p.name
            for p in params
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        ]
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            raise SuiteError(
                f"{where}: field environment_options.{unknown[0]}: not a parameter of "
                f"{spec} (parameters: {', '.join(accepted) or 'none'})"
            )
    try:
        signature.bind(**options)
    except TypeError as exc:
        raise SuiteError(f"{where}: field environment_options: {spec}: {exc}") from None
    return found


def _verifier_function(spec: str, where: Path, folder: Path | None) -> Verifier:
    """The verifier function ``spec`` names, checked against :class:`Verifier`."""
    found = _resolve(spec, where, folder, "verifier")
    if not inspect.isfunction(found):
        raise _refuse(where, "verifier", spec, f"is not a function ({type(found).__name__})")
    try:
        inspect.signature(found).bind(
            None, actual={}, expected={}, message="", state=None, steps=[]
        )
    except TypeError as exc:
        raise _refuse(
            where,
            "verifier",
            spec,
            f"does not take a verifier's arguments (task, *, actual, expected, message, state, "
            f"steps): {exc}",
        ) from None
    return cast(Verifier, found)


class Suite:
    """A set of tasks on one environment.

    A suite names an environment class and a verifier function, never an arbitrary callable;
    both are resolved and checked here, before anything is called, and anything else is a
    :class:`SuiteError` naming the file (``suite.json`` or the task file), the field and why.

    ``environment`` is accepted when it is

    - a name without a colon: an environment registered under the entry-point group
      ``harness.environments`` (:data:`ENVIRONMENT_GROUP`; harness registers ``retail``,
      ``airline``, ``configs`` and ``telecom``), or
    - ``module:Class`` where ``module`` (or its top package) is a file ``<module>.py`` or a
      package ``<module>/__init__.py`` in the suite's own folder (a task file's folder): it is
      imported from there as a package of that folder, without ``sys.path`` or PYTHONPATH (its
      modules import each other relatively: ``from . import helpers``), or
    - ``module:Class`` of any other importable module: a built-in environment
      (``harness.domains.*``) or an installed one,

    and, in each case, what it names is a class (not a function such as ``os:system``) that
    has ``close()`` and ``export()`` methods and whose instances have ``state`` and ``tools``
    (a class attribute or annotation, or ``self.state = ...`` in its or a base's source: read,
    not run), and every key of ``environment_options`` is a parameter of its ``__init__`` (all
    required ones given).

    ``verifier`` is accepted when it is a name registered under the entry-point group
    ``harness.verifiers`` (:data:`VERIFIER_GROUP`), or ``module:function`` of a module in the
    suite's own folder or of the built-in verifiers, the package ``harness.verifiers`` (the
    default is ``harness.verifiers:verify``; ``verifiers:<name>``, their former top-level name,
    still means ``harness.verifiers:<name>``, never a package ``verifiers`` installed beside
    harness); what it names is a Python function taking a verifier's arguments
    (:class:`Verifier`).

    Then every task's reference actions are checked (:meth:`check`): tools, arguments and,
    unless ``check_references`` is False, a replay on a fresh environment that refuses no
    write.

    Attributes:
        name, version: from the manifest.
        path: where it was loaded from.
        tasks: the tasks, in file order.
        task_files: task id -> the file it was read from (named in errors).
        environment: what names the class that builds a fresh environment.
        verifier: what names the function that judges a trial (:class:`Verifier`); the
            function is :attr:`verify`.
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
        check_references: bool = True,
        task_files: Mapping[str, Path] | None = None,
    ) -> None:
        self.name = name
        self.version = version
        self.path = path
        self.tasks = tasks
        self.environment = environment
        self.environment_options = environment_options or {}
        where, folder = _manifest_file(path), _suite_folder(path)
        self._factory = _environment_class(environment, where, folder, self.environment_options)
        self.verifier = verifier
        self.verify: Verifier = _verifier_function(verifier, where, folder)
        self.task_files = dict(task_files or {})
        self._references: dict[str, Reference] = {}
        self._store: Store | None = None
        self.check(references=check_references)

    def check(self, *, references: bool = True) -> None:
        """Check every task's reference actions; :func:`load_suite` does this.

        Each reference action must name a tool of the environment with arguments that fit the
        tool's schema. With ``references``, each task's reference actions are also replayed
        in an episode on a fresh environment (:meth:`reference`, kept for judging the run's
        trials), and no write may be refused: the replay defines the task's expected state,
        so a refused write would silently make it wrong. A read that fails changes nothing,
        and is only listed in :attr:`Reference.refused` (upstream's tau2 tasks have such).

        Raises:
            SuiteError: naming the file, the task, the action (index and tool) and the problem.
        """
        env = self.new_environment()
        try:
            for task in self.tasks:
                for i, call in enumerate(task.reference_actions):
                    problem = _call_problem(_tools_of(env, call), call, self.environment)
                    if problem is not None:
                        raise SuiteError(
                            f"{self._file(task)}: "
                            f"{Refusal(i, call.name, problem, False).message(task)}"
                        )
        finally:
            env.close()
        if references:
            self._replay(self.tasks)
            for task in self.tasks:
                for refusal in self._references[task.digest].refused:
                    if refusal.write:
                        raise SuiteError(f"{self._file(task)}: {refusal.message(task)}")

    def _file(self, task: Task) -> Path:
        """The file ``task`` was read from (the suite's path when not known)."""
        return self.task_files.get(task.id, self.path)

    def reference(self, task: Task) -> Reference:
        """What ``task``'s reference actions do on a fresh environment (computed once).

        They are called in order, as an agent would call them, in an episode on a fresh
        environment (its records kept in a temporary store); an action that is refused (a
        false precondition, bad arguments, an unknown tool, an error) is skipped and listed in
        :attr:`Reference.refused`.
        """
        found = self._references.get(task.digest)
        if found is None:
            found = self._replay([task])[task.digest]
        return found

    def _replay(self, tasks: Sequence[Task]) -> dict[str, Reference]:
        """Replay the reference actions of ``tasks`` not replayed yet."""
        for task in tasks:
            if task.digest not in self._references:
                self._references[task.digest] = self._replay_task(task, self._replay_store())
        return self._references

    def _replay_store(self) -> Store:
        """The store of this suite's reference replays: a temporary one, made at the first
        replay and removed with the suite (one for all: making a store costs milliseconds)."""
        with _REPLAY_STORE_LOCK:  # (a worker's threads replay different tasks at once)
            if self._store is None:
                folder = tempfile.TemporaryDirectory(prefix="harness-reference-")
                self._store = Store(Path(folder.name) / "reference.db", create=True)
                weakref.finalize(self, _remove_store, self._store, folder)
            return self._store

    def _replay_task(self, task: Task, store: Store) -> Reference:
        env = self.environment_for(task)
        try:
            mark = env.state.mark()
            replay = _ReferenceReplay(
                task, env.tools, self.environment, getattr(env, "user_tools", None)
            )
            episode_id: str | None = None
            while True:  # (once more for each held call a recorded decision answers)
                episode = Episode(
                    state=env.state,
                    store=store,
                    policy=REPLAY_POLICY,
                    clock=FakeClock(),
                    task_id=task.id,
                    episode_id=episode_id,
                    resume=episode_id is not None,
                )
                episode_id = episode.id
                with episode:
                    held = replay.run()
                if held is None:
                    break
                index, escalation_id = held
                approval = task.reference_actions[index].approval
                assert approval is not None
                decided = approval.resolve(store, escalation_id, task.id)
                replay.answered[index] = canonical(decided.args)
            changes = {k: after for k, (_, after) in observed_changes(env.state, mark).items()}
            env.state.release(mark)
            return replay.reference(changes)
        finally:
            env.close()

    def new_environment(self) -> Any:
        """A fresh, isolated environment for one trial."""
        return self._factory(**self.environment_options)

    def environment_for(self, task: Task) -> Any:
        """A fresh environment set up for ``task``: the environment's ``prepare(task)``, when
        it has one, runs before anything else (tau2's initialization actions, say)."""
        env = self.new_environment()
        prepare = getattr(env, "prepare", None)
        if callable(prepare):
            try:
                prepare(task)
            except BaseException:
                env.close()
                raise
        return env

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


def is_builtin_suite(path: str | Path) -> bool:
    """Whether ``path`` is the folder of a built-in suite (packaged or in the source checkout)."""
    try:
        resolved = Path(path).resolve()
    except (OSError, RuntimeError):
        return False
    package = resources.files("harness")
    checkout = _checkout_tasks()
    for name in BUILTIN_SUITES:
        for folder in (package / "_suites" / name, None if checkout is None else checkout / name):
            if isinstance(folder, Path) and folder.resolve() == resolved:
                return True
    return False


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
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SuiteError(f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise SuiteError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise SuiteError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SuiteError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except RecursionError:
        raise SuiteError(
            f"{path}: nests too deeply to be read (thousands of levels of lists or objects); "
            "a task file nests a few levels"
        ) from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise SuiteError(f"{path}: not valid JSON ({exc})") from None


def _check_schema(path: Path, data: Any, schema: dict[str, Any]) -> None:
    """Raise a :class:`SuiteError` naming the first place ``data`` breaks ``schema``: the
    file, the task (of a task file) and the field."""
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if not errors:
        return
    err = errors[0]
    loc = list(err.absolute_path)
    task = ""
    if len(loc) >= 2 and loc[0] == "tasks" and isinstance(data["tasks"][loc[1]], dict):
        task = f"task {data['tasks'][loc[1]].get('id') or '#' + str(loc[1])!r}: "
        loc = loc[2:]
    if err.validator == "required" and isinstance(err.instance, dict):
        missing = [f for f in err.validator_value if f not in err.instance]
        loc = [*loc, missing[0]] if missing else loc
    field = ".".join(str(p) for p in loc) or "(top level)"
    message = err.message
    if err.validator == "type" and len(repr(err.instance)) > 80:  # not the whole value
        message = f"{_kind(err.instance)} is not of type {err.validator_value!r}"
    raise SuiteError(f"{path}: {task}field {field}: {message}")


def _validate_task_file(path: Path, data: Any) -> list[Task]:
    _check_schema(path, data, task_schema())
    tasks = []
    for i, raw in enumerate(data["tasks"]):
        try:
            tasks.append(Task.model_validate(raw))
        except ValidationError as exc:  # (what the schema cannot say: an edit without edit)
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "(top level)"
            message = str(err["msg"]).removeprefix("Value error, ")
            raise SuiteError(
                f"{path}: task {raw.get('id') or '#' + str(i)!r}: field {field}: {message}"
            ) from None
    seen: set[str] = set()
    for t in tasks:
        if t.id in seen:
            raise SuiteError(f"{path}: task {t.id!r}: field id: duplicated")
        seen.add(t.id)
    return tasks


TAU2_INDEX_TAG = "tau2-index:"
"""Tag prefix of a tau2 task's position in the tasks file it was loaded from (``tau2-index:5``)."""

TAU2_BASIS_TAG = "tau2-reward-basis:"
"""Tag prefix of a tau2 task's reward basis as its file gives it
(``tau2-reward-basis:DB,COMMUNICATE``)."""

TAU2_DEFAULT_BASIS = ("DB", "COMMUNICATE")
"""tau2's reward basis when a task names none (``EvaluationCriteria.reward_basis``'s default)."""

TAU2_REWARD_TYPES: Final = ("DB", "ENV_ASSERTION", "NL_ASSERTION", "ACTION", "COMMUNICATE")
"""The reward types a tau2 task's ``reward_basis`` may list (tau2's ``RewardType``)."""

# tau2's StructuredUserInstructions: its required string fields, and those that may be null.
_TAU2_INSTRUCTIONS: Final = ("domain", "reason_for_call", "task_instructions")
_TAU2_OPTIONAL_INSTRUCTIONS: Final = ("known_info", "unknown_info")


def _kind(value: Any) -> str:
    """What a JSON value is, as an error names it (``a list``, ``a string``, ``null``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    kinds: dict[type, str] = {dict: "an object", list: "a list", str: "a string"}
    return kinds.get(type(value), f"a {type(value).__name__}")


class _Tau2Task:
    """One task of a tau2 ``tasks.json``, read field by field: every field a run reads has
    tau2's type, or a :class:`SuiteError` names the file, the task and the field."""

    def __init__(self, path: Path, index: int, raw: Any) -> None:
        self.index = index
        self.where = f"{path}: task #{index}"
        if not isinstance(raw, dict):
            raise SuiteError(
                f"{self.where}: must be a JSON object (a tau2 task with id, user_scenario "
                f"and evaluation_criteria), not {_kind(raw)}"
            )
        self.raw = raw
        task_id = self.field(raw, "id", str, "a non-empty string")
        if not task_id:
            raise self.error("id", "must be a non-empty string")
        self.id: str = task_id
        self.where = f"{path}: task #{index} (id {task_id!r})"

    def error(self, field: str, problem: str) -> SuiteError:
        """The refusal of ``field`` (a dotted path in the task) for ``problem``."""
        return SuiteError(f"{self.where}: field {field}: {problem}")

    def field(
        self,
        obj: dict[str, Any],
        field: str,
        kind: type | tuple[type, ...],
        what: str,
        *,
        required: bool = True,
    ) -> Any:
        """The value of ``field`` (a dotted path ending in a key of ``obj``) if it is a
        ``kind``; None when it is null or absent and not ``required``."""
        key = field.rpartition(".")[2]
        if obj.get(key) is None:
            if required:
                absent = "missing" if key not in obj else "null"
                raise self.error(field, f"{absent} (must be {what})")
            return None
        value = obj[key]
        if not isinstance(value, kind):
            raise self.error(field, f"must be {what}, not {_kind(value)}")
        return value

    def strings(self, obj: dict[str, Any], field: str, what: str) -> list[str] | None:
        """``obj``'s list of strings at ``field`` (None when null or absent)."""
        values: list[Any] | None = self.field(obj, field, list, what, required=False)
        for j, value in enumerate(values or []):
            if not isinstance(value, str):
                raise self.error(f"{field}[{j}]", f"must be a string, not {_kind(value)}")
        return cast("list[str] | None", values)

    def instructions(self) -> dict[str, Any] | str:
        """``user_scenario.instructions``: a plain string, or tau2's structured ones."""
        scenario = self.field(
            self.raw,
            "user_scenario",
            dict,
            'an object such as {"persona": null, "instructions": {...}}',
        )
        self.field(scenario, "user_scenario.persona", str, "a string or null", required=False)
        instr = self.field(
            scenario,
            "user_scenario.instructions",
            (str, dict),
            "a string or an object with " + ", ".join(_TAU2_INSTRUCTIONS),
        )
        if isinstance(instr, dict):
            for name in _TAU2_INSTRUCTIONS:
                self.field(instr, f"user_scenario.instructions.{name}", str, "a string")
            for name in _TAU2_OPTIONAL_INSTRUCTIONS:
                self.field(
                    instr,
                    f"user_scenario.instructions.{name}",
                    str,
                    "a string or null",
                    required=False,
                )
        return cast("dict[str, Any] | str", instr)

    def actions(self, crit: dict[str, Any]) -> list[ToolCall]:
        """``evaluation_criteria.actions`` as tool calls (none when null)."""
        field = "evaluation_criteria.actions"
        listed = self.field(crit, field, list, "a list of actions", required=False) or []
        calls = []
        for j, action in enumerate(listed):
            at = f"{field}[{j}]"
            if not isinstance(action, dict):
                raise self.error(
                    at,
                    f'must be an object such as {{"name": ..., "arguments": {{}}}}, '
                    f"not {_kind(action)}",
                )
            name = self.field(action, f"{at}.name", str, "a string naming the tool")
            if not name:
                raise self.error(f"{at}.name", "must be the tool's name, not an empty string")
            arguments = self.field(
                action,
                f"{at}.arguments",
                dict,
                "an object of argument names to values",
                required=False,
            )
            requestor = self.field(
                action,
                f"{at}.requestor",
                str,
                "'assistant' or 'user'",
                required=False,
            )
            if requestor not in (None, "assistant", "user"):
                raise self.error(
                    f"{at}.requestor", f"must be 'assistant' or 'user', not {requestor!r}"
                )
            compare = self.field(
                action,
                f"{at}.compare_args",
                list,
                "a list of argument names, or null to compare every argument",
                required=False,
            )
            if compare is not None and not all(isinstance(k, str) for k in compare):
                raise self.error(f"{at}.compare_args", "must list argument names (strings)")
            calls.append(
                ToolCall(
                    name=name,
                    arguments=arguments or {},
                    requestor=requestor or "assistant",
                    compare_args=compare,
                )
            )
        return calls

    def objects(self, obj: dict[str, Any], field: str, what: str) -> list[dict[str, Any]]:
        """``obj``'s list of objects at ``field`` (none when null or absent)."""
        values: list[Any] = self.field(obj, field, list, what, required=False) or []
        for j, value in enumerate(values):
            if not isinstance(value, dict):
                raise self.error(f"{field}[{j}]", f"must be an object, not {_kind(value)}")
            self.field(value, f"{field}[{j}].env_type", str, "'assistant' or 'user'")
            self.field(value, f"{field}[{j}].func_name", str, "a string naming the function")
            self.field(value, f"{field}[{j}].arguments", dict, "an object", required=False)
        return [dict(value) for value in values]

    def basis(self, crit: dict[str, Any]) -> list[str]:
        """``evaluation_criteria.reward_basis`` (tau2's default when null or absent)."""
        field = "evaluation_criteria.reward_basis"
        example = 'a list of reward types such as ["DB", "COMMUNICATE"]'
        basis = self.field(crit, field, list, example, required=False)
        if basis is None:
            return list(TAU2_DEFAULT_BASIS)
        for j, kind in enumerate(basis):
            if kind not in TAU2_REWARD_TYPES:
                shown = repr(kind) if isinstance(kind, str) else _kind(kind)
                raise self.error(
                    f"{field}[{j}]",
                    f"{shown} is not a tau2 reward type ({', '.join(TAU2_REWARD_TYPES)})",
                )
        return list(basis)

    def task(self) -> Task:
        """The harness task: tau2's id, and tags for the task's index in the file
        (:data:`TAU2_INDEX_TAG`) and its reward basis (:data:`TAU2_BASIS_TAG`).

        The communicate_info strings are required outputs only when the basis has
        ``COMMUNICATE``, and the nl_assertions are judged only when it has ``NL_ASSERTION``
        (tau2 gates the reward on them only then).
        """
        instr = self.instructions()
        crit = self.field(
            self.raw,
            "evaluation_criteria",
            dict,
            "an object with the task's actions and reward_basis, by which a trial is judged",
        )
        actions = self.actions(crit)
        basis = self.basis(crit)
        info = self.strings(crit, "evaluation_criteria.communicate_info", "a list of strings")
        judged = self.strings(crit, "evaluation_criteria.nl_assertions", "a list of strings")
        assertions = self.objects(
            crit, "evaluation_criteria.env_assertions", "a list of assertions on the environment"
        )
        initial = self.field(self.raw, "initial_state", dict, "an object or null", required=False)
        setup = (
            []
            if initial is None
            else self.objects(
                initial, "initial_state.initialization_actions", "a list of function calls"
            )
        )
        return Task(
            id=self.id,
            instruction=instr if isinstance(instr, str) else instr["reason_for_call"],
            reference_actions=actions,
            required_outputs=list(info or []) if "COMMUNICATE" in basis else [],
            nl_assertions=list(judged or []) if "NL_ASSERTION" in basis else [],
            user=instr if isinstance(instr, dict) else {},
            initialization=setup,
            env_assertions=assertions,
            tags=[f"{TAU2_INDEX_TAG}{self.index}", f"{TAU2_BASIS_TAG}{','.join(basis)}"],
            source="tau2",
        )


def _from_tau2(path: Path, data: list[Any]) -> tuple[str, list[Task]]:
    """A tau2 ``tasks.json``'s domain and its tasks as harness tasks (:meth:`_Tau2Task.task`).

    The domain is what the tasks' structured instructions name; every task that names one
    names the same.

    Raises:
        SuiteError: naming the file, the task (index and id) and the field that does not have
            tau2's shape, or a duplicated id.
    """
    if not data:
        raise SuiteError(f"{path}: holds no tasks (a tau2 tasks.json is a list of tasks)")
    tasks: list[Task] = []
    first: dict[str, int] = {}
    domain: tuple[str, int] | None = None
    for i, raw in enumerate(data):
        reader = _Tau2Task(path, i, raw)
        if reader.id in first:
            raise reader.error(
                "id", f"duplicated: task #{first[reader.id]} has it too; give each task its own id"
            )
        first[reader.id] = i
        task = reader.task()
        named = task.user.get("domain")
        if isinstance(named, str):
            if domain is None:
                domain = (named, i)
            elif named != domain[0]:
                raise reader.error(
                    "user_scenario.instructions.domain",
                    f"{named!r}, but task #{domain[1]} is of domain {domain[0]!r}; a tasks "
                    "file runs on one domain's environment: split it by domain",
                )
        tasks.append(task)
    if domain is None:
        raise SuiteError(
            f"{path}: no task names its domain (user_scenario.instructions.domain), which "
            f"picks the environment (built in: {', '.join(BUILTIN_ENVIRONMENTS)})"
        )
    return domain[0], tasks


def load_suite(path: str | Path, *, check_references: bool = True) -> Suite:
    """Load a suite folder (with ``suite.json``), a task file, a tau2-format ``tasks.json``, or
    a built-in suite by name (:data:`BUILTIN_SUITES`) when no such path exists.

    Every task's reference actions are checked (:meth:`Suite.check`): each names a tool of the
    environment with arguments that fit its schema, and, unless ``check_references`` is
    False, replaying them on a fresh environment refuses none of them. The replay is what a
    run judges trials against, so a run does not repeat it; it costs about as much as one
    trial per task (about a second for the built-in ``retail`` suite's 49 tasks).

    Raises:
        SuiteError: naming the file, the task and the field, or the reference action, that is
            wrong, and how to fix it.
    """
    p = resolve_suite(path)
    if p.is_dir():
        manifest_path = p / "suite.json"
        manifest = _read_json(manifest_path)
        if not isinstance(manifest, dict):
            raise SuiteError(f"{manifest_path}: must be a JSON object")
        schema = suite_schema()
        for field in schema["required"]:
            if field not in manifest:
                raise SuiteError(f"{manifest_path}: field {field}: missing")
        unknown = sorted(set(manifest) - set(schema["properties"]))
        if unknown:
            raise SuiteError(
                f"{manifest_path}: field {unknown[0]}: not a manifest field "
                f"(fields: {', '.join(sorted(schema['properties']))})"
            )
        _check_schema(manifest_path, manifest, schema)
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
            check_references=check_references,
            task_files=first_file,
        )
    data = _read_json(p)
    if isinstance(data, list):  # a harness task file is an object: a list is tau2's format
        domain, tau2_tasks = _from_tau2(p, data)
        env = BUILTIN_ENVIRONMENTS.get(domain)
        if env is None:
            raise SuiteError(
                f"{p}: tau2 domain {domain!r} has no built-in environment "
                f"(built in: {', '.join(BUILTIN_ENVIRONMENTS)})"
            )
        return Suite(
            name=f"tau2-{domain}",
            version="tau2",
            path=p,
            tasks=tau2_tasks,
            environment=env,
            # Upstream's evaluation skips a reference call its tools refuse, and so does the
            # judge: only the tools and arguments are checked here.
            check_references=False,
        )
    if not isinstance(data, dict) or "format" not in data:
        what = "an object without field format" if isinstance(data, dict) else _kind(data)
        raise SuiteError(
            f"{p}: holds {what}, so is no task file: a harness task file is "
            '{"format": "harness.tasks", "environment": ..., "tasks": [...]}, a tau2 '
            "tasks.json a list of tasks"
        )
    tasks = _validate_task_file(p, data)
    env = data.get("environment")
    if not env:
        raise SuiteError(f"{p}: field environment: missing (a task file run alone names it)")
    return Suite(
        name=p.stem,
        version=str(data.get("version", "1")),
        path=p,
        tasks=tasks,
        environment=env,
        check_references=check_references,
    )

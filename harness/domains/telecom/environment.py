"""``TelecomEnvironment``: tau2's telecom domain for one trial, both sides of the conversation.

The agent works a CRM database (:class:`~harness.domains.telecom.tools.TelecomTools` over
:class:`~harness.domains.telecom.data_model.TelecomDB`); the user holds a simulated phone
(:class:`~harness.domains.telecom.user_tools.TelecomUserTools` over
:class:`~harness.domains.telecom.user_data_model.TelecomUserDB`). Both toolkits are upstream's
code (Sierra Research's tau2-bench, MIT licence in ``data/LICENSE``). Around them, as tau2's
environment does:

- after every call that succeeds, and after each initialization action, :meth:`sync_tools`
  carries the line's state to the phone's surroundings and a paid request back to the bill;
- every tool message is upstream's (``Environment.get_response``: ``to_json_str`` of the result,
  ``Error: <message>`` for a failure);
- every write tool of either side is a transaction over both databases (``db`` and ``user_db``,
  the resources of :attr:`state`): a call that fails leaves both as they were.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import date, datetime
from typing import Any, ClassVar, Final

from docstring_parser import parse
from pydantic import BaseModel, Field, create_model

import harness as hx
from harness._json import json_copy
from harness.domains.base import OccurrenceKeys
from harness.domains.tau2 import UpstreamError
from harness.domains.telecom import load_db, load_user_db, policy
from harness.domains.telecom._toolkit import TOOL_TYPE_ATTR, ToolKitBase, ToolType, get_dict_hash
from harness.domains.telecom.data_model import LineStatus, TelecomDB
from harness.domains.telecom.tools import TelecomTools
from harness.domains.telecom.user_data_model import PaymentRequest, TelecomUserDB
from harness.domains.telecom.user_tools import TelecomUserTools

__all__ = [
    "TOOL_DEFS",
    "USER_TOOL_DEFS",
    "TelecomEnvironment",
    "TelecomError",
    "TelecomState",
    "evaluate_environment",
    "make_tool_call",
    "run_env_assertion",
    "to_json_str",
    "upstream_tool_def",
]


class TelecomError(UpstreamError):
    """A telecom tool refused the call; ``str(error)`` is upstream's message."""


def upstream_tool_def(method: Callable[..., Any]) -> dict[str, Any]:
    """A tool's definition as upstream's ``as_tool(method).openai_schema`` builds it: the
    docstring's short and long description, and ``create_model("parameters", ...)`` of the
    signature with each argument's described ``Field``."""
    doc = parse(method.__doc__ or "")
    described = {p.arg_name: p for p in doc.params}
    params: dict[str, Any] = {}
    for name, param in inspect.signature(method).parameters.items():
        annotation = Any if param.annotation is param.empty else param.annotation
        default: Any = ... if param.default is param.empty else param.default
        if name in described:
            default = Field(default, description=described[name].description)
        params[name] = (annotation, default)
    short, long = doc.short_description or "", doc.long_description or ""
    description = (short + "\n\n" + long if long else short) if short else method.__name__
    return {
        "type": "function",
        "function": {
            "name": method.__name__,
            "description": description,
            "parameters": create_model("parameters", **params).model_json_schema(),
        },
    }


def _defs(kit: type[ToolKitBase], db: Any) -> tuple[dict[str, Any], ...]:
    instance = kit(db)
    return tuple(upstream_tool_def(getattr(instance, name)) for name in kit.tool_names())


TOOL_DEFS: Final = _defs(TelecomTools, None)
"""The agent's thirteen tools as upstream hands them to an agent, in upstream's order."""

USER_TOOL_DEFS: Final = _defs(TelecomUserTools, None)
"""The user's thirty phone tools as upstream hands them to the user simulator."""


def to_json_str(resp: Any) -> str:
    """Upstream's ``Environment.to_json_str``: a string as it is, anything else as JSON."""

    def process(value: Any) -> Any:
        if isinstance(value, BaseModel):
            return value.model_dump()
        if isinstance(value, str) or value is None:
            return value
        if isinstance(value, int | float | bool):
            return str(value)
        if isinstance(value, list):
            return [process(item) for item in value]
        if isinstance(value, tuple):
            return tuple(process(item) for item in value)
        if isinstance(value, dict):
            return {k: process(v) for k, v in value.items()}
        if isinstance(value, datetime | date):
            return value.isoformat()
        raise ValueError(f"Unsupported type: {type(value)}")

    return resp if isinstance(resp, str) else json.dumps(process(resp), default=str)


class TelecomState:
    """The harness's view of the two databases: resources ``db`` (the agent's) and ``user_db``
    (the user's phone and surroundings), each the JSON dump of upstream's model."""

    KEYS: ClassVar[tuple[str, str]] = ("db", "user_db")

    def __init__(self, environment: TelecomEnvironment) -> None:
        self._env = environment
        self._windows: dict[int, dict[str, Any]] = {}
        self._next = 0

    def _model(self, key: str) -> BaseModel | None:
        if key == "db":
            return self._env.backend.db
        if key == "user_db":
            return self._env.user_backend.db
        return None

    def get(self, key: str) -> Any | None:
        model = self._model(key)
        return None if model is None else model.model_dump(mode="json")

    def snapshot(self, keys: Iterable[str]) -> dict[str, Any]:
        return {key: self.get(key) for key in keys}

    def mark(self) -> int:
        self._next += 1
        self._windows[self._next] = self.snapshot(self.KEYS)
        return self._next

    def changes(self, mark: int) -> dict[str, Any]:
        before = self._windows.get(mark, {})
        return {k: v for k, v in before.items() if self.get(k) != v}

    def release(self, mark: int) -> None:
        self._windows.pop(mark, None)

    def fingerprint(self) -> str:
        return get_dict_hash(self.snapshot(self.KEYS))

    def apply_changes(self, changes: Mapping[str, Any]) -> None:
        """Set each database to its value in ``changes``, as a record says."""
        for key, value in changes.items():
            if key == "db":
                self._env.backend.db = TelecomDB.model_validate(value)
            elif key == "user_db":
                self._env.user_backend.db = TelecomUserDB.model_validate(value)

    def __iter__(self) -> Iterator[str]:
        return iter(self.KEYS)

    def to_dict(self) -> dict[str, Any]:
        return self.snapshot(self.KEYS)


class TelecomEnvironment:
    """Upstream's two telecom databases, fresh, with both sides' tools.

    Attributes:
        backend: The agent's :class:`TelecomTools` (``backend.db`` its database).
        user_backend: The user's :class:`TelecomUserTools` (``user_backend.db`` the phone).
        state: The :class:`TelecomState` over both.
        actions: ``{name: hx.Action}`` for the write tools of both sides.
        tools: The agent's tools in upstream's order (actions for writes).
        user_tools: The user's tools in upstream's order (actions for writes).
        policy: The policy tau2 gives the agent, word for word.
    """

    policy: str = policy()
    TOOL_NAMES: ClassVar[frozenset[str]] = frozenset(TelecomTools.tool_names())
    USER_TOOL_NAMES: ClassVar[frozenset[str]] = frozenset(TelecomUserTools.tool_names())

    def __init__(
        self, db: Mapping[str, Any] | None = None, user_db: Mapping[str, Any] | None = None
    ):
        self.backend = TelecomTools(
            TelecomDB.model_validate_json(_shipped_json(TelecomDB))
            if db is None
            else TelecomDB.model_validate(db)
        )
        self.user_backend = TelecomUserTools(
            TelecomUserDB.model_validate_json(_shipped_json(TelecomUserDB))
            if user_db is None
            else TelecomUserDB.model_validate(user_db)
        )
        self.state = TelecomState(self)
        self.sync_tools()  # as tau2's Environment.__init__
        self.actions: dict[str, hx.Action[..., Any]] = {}
        occurrences = OccurrenceKeys()
        self.tools = self._toolbox(self.backend, occurrences)
        self.user_tools = self._toolbox(self.user_backend, occurrences)

    def _toolbox(
        self, kit: ToolKitBase, occurrences: OccurrenceKeys
    ) -> dict[str, Callable[..., Any]]:
        tools: dict[str, Callable[..., Any]] = {}
        for name, write in _tools_of(type(kit)):
            call = self._upstream_call(getattr(kit, name))
            if write:
                made = _ACTIONS.get((type(kit), name))
                if made is None:
                    made = _ACTIONS[type(kit), name] = hx.Action(
                        call, writes=list(TelecomState.KEYS), idempotency_key=occurrences.key
                    )
                act = made._around(call, idempotency_key=occurrences.key)
                act.compensation(self._restore)
                self.actions[name] = act
                tools[name] = act
            else:
                tools[name] = call
        return tools

    def _upstream_call(self, method: Callable[..., Any]) -> Callable[..., str]:
        """The tool as upstream's environment runs it: the call, then :meth:`sync_tools`, the
        result as upstream's tool message; a failure as :class:`TelecomError`."""
        name = method.__name__
        kit = method.__self__  # type: ignore[attr-defined]

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> str:
            bound = getattr(kit, name)  # looked up at each call: patch one to inject a fault
            try:
                result = bound(*args, **kwargs)
                self.sync_tools()
            except TelecomError:
                raise
            except Exception as error:  # upstream reports any exception as "Error: <message>"
                raise TelecomError(str(error)) from error
            return to_json_str(result)

        return call

    def _restore(self, ctx: hx.Context) -> None:
        self.state.apply_changes({k: v for k, v in ctx.before.items() if v is not None})

    # Upstream's TelecomEnvironment.sync_tools (tau2-bench, MIT licence), word for word in effect.
    def sync_tools(self) -> None:
        """Sync the tools with the user's surroundings: the line's status, roaming and data
        usage go to the phone's surroundings, a paid payment request marks its bill paid, and a
        bill awaiting payment becomes the phone's payment request."""
        tools, user_db = self.backend, self.user_backend.db
        if user_db.surroundings.phone_number is None:
            return
        phone_number = user_db.surroundings.phone_number
        line = tools._get_line_by_phone(phone_number)
        if line is None:
            raise ValueError(f"Wrong scenario, line not found for phone number: {phone_number}")
        user_db.surroundings.line_active = line.status == LineStatus.ACTIVE
        user_db.surroundings.roaming_allowed = bool(line.roaming_enabled)
        plan = tools._get_plan_by_id(line.plan_id)
        if plan is None:
            raise ValueError(
                f"Wrong scenario, invalid plan id ({line.plan_id}) for the phone number "
                f"{phone_number}"
            )
        user_db.surroundings.mobile_data_usage_exceeded = (
            line.data_used_gb >= plan.data_limit_gb + line.data_refueling_gb
        )
        current = user_db.surroundings.payment_request
        if current is not None and current.paid:
            tools._set_bill_to_paid(current.bill_id)
            user_db.surroundings.payment_request = None
        if user_db.surroundings.payment_request is None:
            customer = tools.get_customer_by_phone(phone_number)
            bills = tools._get_bills_awaiting_payment(customer)
            if len(bills) != 0:
                bill = bills[0]
                user_db.surroundings.payment_request = PaymentRequest(
                    bill_id=bill.bill_id, amount_due=bill.total_due
                )

    def run_env_function_call(
        self, env_type: str, func_name: str, arguments: Mapping[str, Any] | None = None
    ) -> Any:
        """Upstream's ``run_env_function_call``: any function of the agent's (``assistant``) or
        the user's (``user``) toolkit, tools or not, then :meth:`sync_tools`.

        Raises:
            ValueError: Another ``env_type``, as upstream words it.
        """
        if env_type == "user":
            kit: ToolKitBase = self.user_backend
        elif env_type == "assistant":
            kit = self.backend
        else:
            raise ValueError(f"Invalid environment type: {env_type}")
        result = getattr(kit, func_name)(**dict(arguments or {}))
        self.sync_tools()
        return result

    def initialize(self, initialization_actions: Sequence[Mapping[str, Any]]) -> None:
        """Run a task's ``initial_state.initialization_actions`` in order (each
        ``{"env_type", "func_name", "arguments"}``), as tau2's ``set_state`` does."""
        for action in initialization_actions:
            self.run_env_function_call(
                str(action["env_type"]), str(action["func_name"]), action.get("arguments")
            )

    def prepare(self, task: Any) -> None:
        """Set the environment up for a harness task before its trial (or its reference
        replay): the task's ``initialization`` (tau2's initialization actions)."""
        self.initialize(task.initialization)

    def reward(self, task: Any, calls: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """tau2's reward for a harness task on this environment's end state, with the tool
        calls the trial made (the agent's and the user's, from the trial's record: each
        ``{"name", "arguments"}``), as tau2's ``evaluate_simulation`` combines its parts for
        the task's reward basis (from its tags): the environment's (:func:`evaluate_environment`:
        both databases, the assertions on the device) and, for ``ACTION``, whether some call
        matches each reference action (:func:`action_checks`)."""
        basis_tag = next(
            (t.partition(":")[2] for t in task.tags if t.startswith("tau2-reward-basis:")), ""
        )
        basis = basis_tag.split(",") if basis_tag else None
        tau2_task = {
            "initial_state": {"initialization_actions": list(task.initialization)},
            "evaluation_criteria": {
                "actions": [
                    {"name": c.name, "arguments": dict(c.arguments), "requestor": c.requestor}
                    for c in task.reference_actions
                ],
                "env_assertions": list(task.env_assertions),
                "reward_basis": basis,
            },
        }
        out = evaluate_environment(tau2_task, self)
        # tau2 checks the actions whatever the basis (its metrics count them), and leaves
        # action_checks out for a task with no reference action; the reward counts them for
        # ACTION only.
        checks = action_checks(task, calls, self.tool_type)
        if checks:
            out["action_checks"] = checks
        if "ACTION" in (out.get("reward_basis") or []):
            matched = 1.0 if all(c["action_match"] for c in checks) else 0.0
            out["reward_breakdown"] = {**(out.get("reward_breakdown") or {}), "ACTION": matched}
            out["reward"] = float(out["reward"]) * matched
        return out

    def tool_type(self, name: str) -> str | None:
        """tau2's type of tool ``name`` (``read``, ``write``, ``think``, ``generic``), the
        agent's or the user's; None for another name."""
        for kit in (self.backend, self.user_backend):
            if name in kit.tools:
                return str(kit.tool_type(name).value)
        return None

    @classmethod
    def tool_defs(cls) -> list[dict[str, Any]]:
        """The agent's tools as upstream hands them to an agent (a fresh copy)."""
        defs: list[dict[str, Any]] = json_copy(TOOL_DEFS)
        return defs

    @classmethod
    def user_tool_defs(cls) -> list[dict[str, Any]]:
        """The user's tools as upstream hands them to the user simulator (a fresh copy)."""
        defs: list[dict[str, Any]] = json_copy(USER_TOOL_DEFS)
        return defs

    def tool_message(
        self, name: str, arguments: Mapping[str, Any], result: Any, error: BaseException | None
    ) -> str | None:
        """The tool message for a call, as upstream's ``Environment.get_response`` writes it."""
        if result.ok:
            content = result.content
            return content if isinstance(content, str) else json.dumps(content, default=str)
        kit: ToolKitBase | None = None
        if name in self.TOOL_NAMES:
            kit = self.backend
        elif name in self.USER_TOOL_NAMES:
            kit = self.user_backend
        if kit is None:
            return f"Error: Tool '{name}' not found."
        if isinstance(error, hx.InvalidArguments):
            told = _argument_error(kit, name, arguments)
            return None if told is None else f"Error: {told}"
        if isinstance(error, hx.ActionFailed):
            last = error.errors[-1] if error.errors else None
            text = "" if last is None else str(last)
            prefix = f"{TelecomError.__name__}: "
            if isinstance(last, TelecomError):
                return f"Error: {last}"
            if error.failure_class == "fail_stop" and text.startswith(prefix):
                return f"Error: {text[len(prefix) :]}"
            return None
        if isinstance(error, TelecomError):
            return f"Error: {error}"
        return None

    def db_hash(self) -> str:
        """tau2's hash of the agent's database (``get_db_hash``)."""
        return self.backend.get_db_hash()

    def user_db_hash(self) -> str:
        """tau2's hash of the user's database (``get_user_db_hash``)."""
        return self.user_backend.get_db_hash()

    def export(self) -> dict[str, Any]:
        """Both databases as JSON: ``{"db": ..., "user_db": ...}``."""
        return self.state.to_dict()

    def close(self) -> None:
        """Nothing to release: both databases live in memory."""


_ACTIONS: dict[tuple[type, str], hx.Action[..., Any]] = {}
"""A write tool's action as first built, by toolkit and name: every environment copies it."""


_TOOLS: dict[type, tuple[tuple[str, bool], ...]] = {}


def _tools_of(kit: type[ToolKitBase]) -> tuple[tuple[str, bool], ...]:
    """The toolkit's tools in upstream's order, each with whether it writes (read once)."""
    found = _TOOLS.get(kit)
    if found is None:
        found = _TOOLS[kit] = tuple(
            (name, getattr(getattr(kit, name), TOOL_TYPE_ATTR, None) == ToolType.WRITE)
            for name in kit.tool_names()
        )
    return found


@functools.cache
def _shipped_json(model: type[BaseModel]) -> str:
    """Upstream's database for ``model`` (the agent's or the user's), parsed from its TOML and
    validated once a process, as JSON: validating that text gives every environment objects of
    its own (about 0.07 ms for the agent's, against 1.7 ms to parse the TOML again)."""
    data = load_db() if model is TelecomDB else load_user_db()
    return model.model_validate(data).model_dump_json()


def _argument_error(kit: ToolKitBase, name: str, arguments: Mapping[str, Any]) -> str | None:
    """Python's own text for arguments that do not fit the tool (upstream's, whose classes and
    methods have these names), found without running the tool's body."""
    function = getattr(type(kit), name)
    try:
        inspect.signature(function).bind(kit, **arguments)
    except TypeError:
        try:
            function(kit, **arguments)
        except TypeError as error:
            return str(error)
    return None


def _copy_of(environment: TelecomEnvironment) -> TelecomEnvironment:
    """A new environment over deep copies of ``environment``'s two databases."""
    copied = TelecomEnvironment.__new__(TelecomEnvironment)
    copied.backend = TelecomTools(environment.backend.db.model_copy(deep=True))
    copied.user_backend = TelecomUserTools(environment.user_backend.db.model_copy(deep=True))
    copied.state = TelecomState(copied)
    copied.actions, copied.tools, copied.user_tools = {}, {}, {}
    return copied


def make_tool_call(
    environment: TelecomEnvironment,
    name: str,
    requestor: str = "assistant",
    arguments: Mapping[str, Any] | None = None,
) -> Any:
    """Upstream's ``Environment.make_tool_call``: the tool of ``requestor``'s side, without
    :meth:`~TelecomEnvironment.sync_tools` (upstream's note: "This does not call sync_tools").

    Raises:
        ValueError: Another requestor, or a name that is not a tool of that side, as upstream
            words them.
    """
    if requestor == "user":
        kit: ToolKitBase = environment.user_backend
    elif requestor == "assistant":
        kit = environment.backend
    else:
        raise ValueError(f"Invalid requestor: {requestor}")
    if name not in type(kit).tool_names():
        raise ValueError(f"Tool '{name}' not found.")
    return getattr(kit, name)(**dict(arguments or {}))


def run_env_assertion(environment: TelecomEnvironment, assertion: Mapping[str, Any]) -> bool:
    """Upstream's ``run_env_assertion`` (without raising): the function's result (after
    :meth:`~TelecomEnvironment.sync_tools`) equals ``assert_value``.

    Raises:
        ValueError: The function returned something other than a bool, as upstream words it.
    """
    func_name = str(assertion["func_name"])
    result = environment.run_env_function_call(
        str(assertion["env_type"]), func_name, assertion.get("arguments")
    )
    if not isinstance(result, bool):
        raise ValueError(f"Function {func_name} returned {type(result)} instead of bool")
    return bool(result == assertion.get("assert_value", True))


def action_checks(
    task: Any, calls: Iterable[Mapping[str, Any]], tool_type: Callable[[str], str | None]
) -> list[dict[str, Any]]:
    """tau2's ``ActionEvaluator`` checks: for each of the harness task's reference actions,
    whether some call of ``calls`` (each ``{"name", "arguments"}``) matches it
    (:meth:`harness.ToolCall.matches`, tau2's ``compare_with_tool_call``), written as tau2's
    ``ActionCheck`` (``action``, ``action_match``, ``action_reward``, ``tool_type``)."""
    made = [
        (str(c.get("name")), c.get("arguments") if isinstance(c.get("arguments"), dict) else {})
        for c in calls
    ]
    checks = []
    for i, action in enumerate(task.reference_actions):
        matched = any(action.matches(name, arguments) for name, arguments in made)
        checks.append(
            {
                "action": {
                    "action_id": f"{task.id}_{i}",
                    "requestor": action.requestor,
                    "name": action.name,
                    "arguments": dict(action.arguments),
                    "info": None,
                    "compare_args": action.compare_args,
                },
                "action_match": matched,
                "action_reward": 1.0 if matched else 0.0,
                "tool_type": tool_type(action.name),
            }
        )
    return checks


def evaluate_environment(task: Mapping[str, Any], trial: TelecomEnvironment) -> dict[str, Any]:
    """tau2's ``EnvironmentEvaluator.calculate_reward`` for a telecom task and a trial's end
    state: the gold environment (fresh, the task's initialization actions, then its reference
    actions by their requestors, as upstream runs them) against the trial's two databases by
    hash, and the task's env assertions run on a copy of the trial's end state.

    Args:
        task: The task as tau2's ``tasks.json`` holds it.
        trial: The trial's environment at the end of the conversation (left unchanged).

    Returns:
        tau2's ``RewardInfo`` fields: ``reward``, ``db_check`` (``db_match``, ``db_reward``),
        ``env_assertions`` (each ``env_assertion``, ``met``, ``reward``), ``reward_basis`` and
        ``reward_breakdown``.
    """
    criteria = task.get("evaluation_criteria")
    if criteria is None:
        return {"reward": 1.0, "info": {"note": "No evaluation criteria"}}
    actions, assertions = criteria.get("actions"), criteria.get("env_assertions")
    if actions is None and assertions is None:
        return {
            "reward": 1.0,
            "db_check": {"db_match": True, "db_reward": 1.0},
            "info": {"note": "No expected actions or env assertions"},
        }
    initial = task.get("initial_state") or {}
    gold = TelecomEnvironment()
    gold.initialize(initial.get("initialization_actions") or [])
    for action in actions or []:
        # upstream logs a failing gold action and goes on
        with contextlib.suppress(Exception):
            make_tool_call(
                gold, action["name"], action.get("requestor", "assistant"), action["arguments"]
            )
    db_match = (gold.db_hash(), gold.user_db_hash()) == (trial.db_hash(), trial.user_db_hash())
    db_reward = 1.0 if db_match else 0.0
    predicted = _copy_of(trial)
    checks = []
    assertion_reward = 1.0
    for assertion in assertions or []:
        met = run_env_assertion(predicted, assertion)
        checks.append({"env_assertion": dict(assertion), "met": met, "reward": 1.0 if met else 0.0})
        assertion_reward *= 1.0 if met else 0.0
    basis = list(criteria.get("reward_basis") or ["DB", "COMMUNICATE"])
    reward, breakdown = 1.0, {}
    if "DB" in basis:
        breakdown["DB"] = db_reward
        reward *= db_reward
    if "ENV_ASSERTION" in basis:
        breakdown["ENV_ASSERTION"] = assertion_reward
        reward *= assertion_reward
    return {
        "reward": reward,
        "db_check": {"db_match": db_match, "db_reward": db_reward},
        "env_assertions": checks,
        "reward_basis": basis,
        "reward_breakdown": breakdown,
    }

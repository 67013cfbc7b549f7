"""Exports: a run in the shapes the peers' own scorers read.

``taubench``
    tau-bench's results file: a JSON list of ``EnvRunResult`` records (``task_id`` an integer,
    ``reward`` 1.0 or 0.0, ``trial``, ``info``, ``traj``), which its ``display_metrics`` turns
    into pass^k. ``task_id`` is the task's index in the tasks file it came from (a tau2
    ``tasks.json``: its position there); a suite that did not come from one tasks file has no
    such index, and its tasks are numbered in run order with ``info["task_id_source"] =
    "run_order"`` (:func:`taubench_ids_note`). The harness id is kept in
    ``info["harness_task_id"]``. Infrastructure errors are written as reward 0
    (``infra="fail"``, tau-bench's convention) or left out (``infra="exclude"``).
``tau2``
    tau2-bench's ``Results`` (``info``, ``tasks``, ``simulations``), in the shape its
    ``tau2 submit verify-trajs`` accepts (:func:`tau2_results`): tau2's tasks as its file gives
    them, ``num_trials`` simulations of each, ``info`` with the harness commit, ``max_steps``,
    ``max_errors``, the user simulator, the policy and the tool definitions; each simulation
    with its termination reason (an infrastructure error is ``infrastructure_error``, which
    tau2's metrics leave out), costs, token counts, reward basis and messages.
``jsonl``
    One JSON object per trial with everything the store holds about it, transactions included.

Trajectories are the conversation the agent recorded (``AgentOutput.meta["messages"]``) when
it recorded one; otherwise they are rebuilt from the episode's record: the instruction the agent
was given, each tool call in order (reads and bare calls from the log, writes from their
transactions) with its result (or the harness's refusal), then the agent's final message.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, cast

from .._json import loads_or
from .._version import __version__
from ..agents.base import Session, Toolbox, ToolResult
from ..errors import HarnessError
from ..runs.calls import episode_calls
from ..runs.judge import NL_CHECK, REWARD_CHECK
from ..runs.layout import OpenRun, open_run
from ..runs.output import finite, json_text, write_output
from ..runs.resume import run_suite
from ..stats import InfraPolicy
from ..store import TrialRow
from ..store.records import trial_failures, trial_steps
from ..suite import TAU2_BASIS_TAG, TAU2_INDEX_TAG, Suite, Task, is_builtin_suite

__all__ = [
    "EXPORT_FORMATS",
    "ExportFormat",
    "export_run",
    "jsonl_records",
    "suite_left_out",
    "tau2_index",
    "tau2_results",
    "tau2_reward_basis",
    "taubench_ids_note",
    "taubench_records",
]

ExportFormat = Literal["taubench", "tau2", "jsonl"]
EXPORT_FORMATS: tuple[ExportFormat, ...] = ("taubench", "tau2", "jsonl")


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat()


def _task_order(data: OpenRun) -> list[str]:
    seen = {t.task_id for t in data.trials}
    listed = [t for t in data.config.get("tasks", []) if t in seen]
    return listed + sorted(seen - set(listed))


def _ordered_trials(data: OpenRun) -> list[TrialRow]:
    position = {t: i for i, t in enumerate(_task_order(data))}
    return sorted(data.trials, key=lambda r: (r.trial, position[r.task_id]))


def _loaded_suite(data: OpenRun, suite: str | Path | None, trust: bool) -> Suite | None:
    """The run's suite, loaded only from a place the caller vouches for
    (:func:`~harness.runs.resume.run_suite`): a built-in suite, ``suite``, or the recorded path
    when ``trust`` is set. Otherwise (or when it no longer loads) None: the export then carries
    no instructions."""
    try:
        return run_suite(data, suite=suite, trust=trust)
    except (HarnessError, OSError):
        return None


def _suite_tasks(data: OpenRun, suite: str | Path | None, trust: bool) -> dict[str, Task]:
    loaded = _loaded_suite(data, suite, trust)
    return {} if loaded is None else {t.id: t for t in loaded.tasks}


def suite_left_out(run: str | Path, *, suite: str | Path | None, trust: bool) -> str | None:
    """Why an export of ``run`` carries no task instructions, or None when it does."""
    if suite is not None or trust:
        return None
    with open_run(run, finished=True) as data:
        path = data.config.get("suite_path")
        if not path or is_builtin_suite(path):
            return None
    return (
        f"the run's suite {path} is not built in, so it was not loaded and the export carries "
        "no task instructions; name it with --suite PATH, or trust the recorded path with "
        "--trust-suite"
    )


# --- messages an agent recorded (AgentOutput.meta["messages"]), in tau2's shape ---------------

_MESSAGE_FIELDS = ("cost", "usage", "raw_data", "generation_time_seconds")


def _tau2_tool_call(call: Any) -> dict[str, Any]:
    """A tool call in tau2's shape (``id``, ``name``, ``arguments`` as an object,
    ``requestor``), from tau2's or OpenAI's shape."""
    call = dict(call) if isinstance(call, dict) else {}
    function = call.get("function")
    if isinstance(function, dict):  # OpenAI: {"id", "type", "function": {"name", "arguments"}}
        name, arguments = function.get("name", ""), function.get("arguments")
    else:
        name, arguments = call.get("name", ""), call.get("arguments")
    if isinstance(arguments, str):
        arguments = loads_or(arguments, {"_raw": arguments})
    return {
        "id": str(call.get("id") or ""),
        "name": str(name),
        "arguments": arguments if isinstance(arguments, dict) else {},
        "requestor": call.get("requestor") if call.get("requestor") == "user" else "assistant",
    }


def _tau2_recorded(messages: list[Any], stamp: str) -> list[dict[str, Any]]:
    """The conversation an agent recorded, as tau2's messages (system prompts left out, as
    tau2's trajectories leave them out; a missing ``turn_idx`` or ``timestamp`` filled in)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "tool":
            item: dict[str, Any] = {
                "id": str(message.get("id") or message.get("tool_call_id") or ""),
                "role": "tool",
                "content": None if message.get("content") is None else str(message["content"]),
                "requestor": "user" if message.get("requestor") == "user" else "assistant",
                "error": bool(message.get("error", False)),
            }
        elif role in ("assistant", "user"):
            calls = message.get("tool_calls")
            item = {
                "role": role,
                "content": message.get("content"),
                "tool_calls": [_tau2_tool_call(c) for c in calls] if calls else None,
            }
            item.update({k: message[k] for k in _MESSAGE_FIELDS if message.get(k) is not None})
        else:
            continue
        item["turn_idx"] = len(out)
        item["timestamp"] = message.get("timestamp") or stamp
        out.append(item)
    return out


def _tau2_rebuilt(
    instruction: str,
    steps: list[dict[str, Any]],
    message: str,
    end: float,
    user_tools: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """tau2 messages rebuilt from the record: the instruction the agent was given (as the
    user's message), each tool call and its result, the agent's final message. A call of one
    of ``user_tools`` (the user's, in an environment whose user acts) is the user's message,
    and its result goes back to the user, as tau2 writes them."""
    out: list[dict[str, Any]] = []

    def add(item: dict[str, Any], ts: float) -> None:
        item["turn_idx"] = len(out)
        item["timestamp"] = _iso(ts)
        out.append(item)

    first = min([step["start"] for step in steps] + [end])
    if instruction:
        add({"role": "user", "content": instruction}, first)
    for step in steps:
        who = (
            "user" if step["name"] in user_tools or step.get("requestor") == "user" else "assistant"
        )
        call = {"id": step["id"], "name": step["name"], "arguments": step["arguments"]}
        if who == "user":
            call["requestor"] = "user"
        add({"role": who, "content": None, "tool_calls": [call]}, step["start"])
        add(
            {
                "id": step["id"],
                "role": "tool",
                "content": step["content"],
                "requestor": who,
                "error": step["error"],
            },
            step["end"],
        )
    if message:
        add({"role": "assistant", "content": message}, end)
    return out


def _openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """tau2 messages as an OpenAI-style message list (tau-bench's ``traj``)."""
    traj: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for m in messages:
        if m["role"] == "tool":
            traj.append(
                {
                    "role": "tool",
                    "tool_call_id": m["id"],
                    "name": names.get(m["id"], ""),
                    "content": m["content"],
                }
            )
            continue
        item: dict[str, Any] = {"role": m["role"], "content": m.get("content")}
        if m.get("tool_calls"):
            item["tool_calls"] = []
            for c in m["tool_calls"]:
                names[c["id"]] = c["name"]
                item["tool_calls"].append(
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {
                            "name": c["name"],
                            "arguments": json.dumps(c["arguments"], sort_keys=True),
                        },
                    }
                )
        traj.append(item)
    return traj


def _trial_messages(
    data: OpenRun,
    row: TrialRow,
    task: Task | None,
    meta: dict[str, Any],
    env: Any = None,
) -> list[dict[str, Any]]:
    """A trial's conversation in tau2's shape: the one its agent recorded
    (``meta["messages"]``), or else one rebuilt from the episode's record, with the suite's
    environment ``env`` (when it builds): a call of one of its ``user_tools`` is the user's,
    and a write that took effect reads as its ``tool_message`` words it."""
    recorded = meta.get("messages")
    if isinstance(recorded, list) and recorded:
        return _tau2_recorded(recorded, _iso(row.created_at))
    steps = episode_calls(data.store, row.episode_id)
    words = getattr(env, "tool_message", None)
    if callable(words):
        for step in steps:
            if "value" in step:
                result = ToolResult(True, step["value"], None)
                text = words(step["name"], step["arguments"], result, None)
                step["content"] = step["content"] if text is None else str(text)
    user_tools = frozenset(getattr(env, "user_tools", None) or {})
    instruction = task.instruction if task is not None else ""
    return _tau2_rebuilt(instruction, steps, row.message, row.created_at, user_tools)


@contextlib.contextmanager
def _suite_environment(loaded: Suite | None) -> Iterator[Any]:
    """A fresh environment of the suite, closed after (None: no suite, or it does not build,
    and conversations are rebuilt without it)."""
    env = None
    if loaded is not None:
        with contextlib.suppress(Exception):
            env = loaded.new_environment()
    try:
        yield env
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()


def _expected_digest(row: TrialRow) -> str:
    verdict = loads_or(row.verdict, {})
    for check in verdict.get("checks", []):
        if check.get("name") == "state_equality":
            return str(check.get("compared", {}).get("expected_digest", ""))
    return ""


def _harness_info(row: TrialRow) -> dict[str, Any]:
    return {
        "harness_task_id": row.task_id,
        "task_version": row.task_version,
        "episode_id": row.episode_id,
        "seed": row.seed,
        "passed": row.passed,
        "partial": row.partial,
        "outcome": row.outcome,
        "infra_error": row.infra_error,
        "failures": trial_failures(row),
        "steps": trial_steps(row),
        "verdict": loads_or(row.verdict, {}),
        "agent_meta": loads_or(row.agent_meta, {}),
    }


# --- task identity ----------------------------------------------------------------------------


def _tag(task: Task, prefix: str) -> str | None:
    return next((t[len(prefix) :] for t in task.tags if t.startswith(prefix)), None)


def tau2_index(task: Task) -> int | None:
    """The position of a task loaded from a tau2 ``tasks.json`` in that file (None: not one)."""
    index = _tag(task, TAU2_INDEX_TAG)
    return int(index) if index is not None and index.isdigit() else None


def tau2_reward_basis(task: Task) -> list[str] | None:
    """A tau2 task's reward basis as its file gives it (tau2's default when it names none);
    None for a task that did not come from a tau2 ``tasks.json``."""
    basis = _tag(task, TAU2_BASIS_TAG)
    return None if basis is None else [b for b in basis.split(",") if b]


def _file_indexes(loaded: Suite | None, ids: list[str]) -> dict[str, int] | None:
    """Each task's index in the tasks file it came from, or None when some task has none: the
    suite was not loaded, or its tasks come from more than one file."""
    if loaded is None:
        return None
    tasks = {t.id: t for t in loaded.tasks}
    if any(t not in tasks for t in ids):
        return None
    tau2 = {t: tau2_index(tasks[t]) for t in ids}
    if all(i is not None for i in tau2.values()):
        return {t: i for t, i in tau2.items() if i is not None}
    files = {loaded.task_files.get(t.id, loaded.path) for t in loaded.tasks}
    if len(files) != 1:
        return None
    position = {t.id: i for i, t in enumerate(loaded.tasks)}
    return {t: position[t] for t in ids}


def _run_order_ids(ids: list[str]) -> dict[str, int]:
    return {t: i for i, t in enumerate(ids)}


def taubench_ids_note(run: str | Path, *, suite: str | Path | None, trust: bool) -> str | None:
    """Why a tau-bench export of ``run`` numbers its tasks in run order instead of by their
    index in a tasks file, or None when every task has that index."""
    with open_run(run, finished=True) as data:
        if _file_indexes(_loaded_suite(data, suite, trust), _task_order(data)) is not None:
            return None
        where = data.config.get("suite_path") or data.run.suite
    return (
        f"the tasks of the run's suite {where} have no index in a tasks file here (the suite did "
        "not come from one tasks file, or was not loaded): task_id numbers them in run order and "
        "claims no index (info.task_id_source is run_order); load the suite with --suite PATH "
        "or --trust-suite when it is one tasks file"
    )


def taubench_records(
    data: OpenRun,
    *,
    infra: InfraPolicy = "fail",
    suite: str | Path | None = None,
    trust: bool = False,
    require_index: bool = False,
) -> list[dict[str, Any]]:
    """The run as tau-bench's results file (a list of ``EnvRunResult`` records).

    ``task_id`` is the task's index in the tasks file it came from (for a tau2 ``tasks.json``,
    its position in that file, whatever its tau2 id), so it names the same task as the file
    does. A suite that did not come from one tasks file (or was not loaded) has no such index:
    its tasks are numbered in run order and each record says so
    (``info["task_id_source"] = "run_order"``, ``"tasks_file_index"`` otherwise).

    Args:
        data: from ``open_run``.
        infra: ``fail`` writes infrastructure errors as reward 0; ``exclude`` leaves them out.
        suite, trust: where the suite is loaded from (see :func:`export_run`).
        require_index: refuse (``HarnessError``) instead of numbering in run order.

    Raises:
        HarnessError: ``require_index`` and the tasks have no index in a tasks file.
    """
    if infra not in ("fail", "exclude"):
        raise ValueError(f"infra must be 'fail' or 'exclude', got {infra!r}")
    order = _task_order(data)
    loaded = _loaded_suite(data, suite, trust)
    indexes = _file_indexes(loaded, order)
    if indexes is None and require_index:
        raise HarnessError(
            f"export: the run's tasks have no index in a tasks file (suite "
            f"{data.config.get('suite_path') or data.run.suite}: not one tasks file, or not "
            "loaded), so tau-bench's task_id cannot name them; load the suite with --suite PATH "
            "or --trust-suite, or export without requiring the index (tasks numbered in run "
            "order)"
        )
    source = "run_order" if indexes is None else "tasks_file_index"
    ids = indexes if indexes is not None else _run_order_ids(order)
    tasks = {} if loaded is None else {t.id: t for t in loaded.tasks}
    out = []
    for row in _ordered_trials(data):
        if row.infra_error and infra == "exclude":
            continue
        reward = 1.0 if row.passed and not row.infra_error else 0.0
        task = tasks.get(row.task_id)
        meta = loads_or(row.agent_meta, {})
        info: dict[str, Any] = {
            "reward_info": {
                "reward": reward,
                "info": {"r_actions": reward, "gt_data_hash": _expected_digest(row)},
                "actions": [
                    {"name": c.name, "kwargs": dict(c.arguments)}
                    for c in (task.reference_actions if task else [])
                ],
            },
            "source": "harness",
            "task_id_source": source,
            **_harness_info(row),
        }
        if task is not None:
            info["task"] = {
                "user_id": str(task.user.get("user_id", "")),
                "actions": info["reward_info"]["actions"],
                "instruction": task.instruction,
                "outputs": list(task.required_outputs),
            }
        if row.infra_error:
            info["error"] = meta.get("error", "infrastructure error")
        out.append(
            {
                "task_id": ids[row.task_id],
                "reward": reward,
                "info": info,
                "traj": _openai_messages(_trial_messages(data, row, task, meta)),
                "trial": row.trial,
            }
        )
    return out


# --- tau2 -------------------------------------------------------------------------------------

TAU2_TERMINATIONS = frozenset(
    {
        "user_stop",
        "agent_stop",
        "max_steps",
        "timeout",
        "too_many_errors",
        "agent_error",
        "user_error",
        "infrastructure_error",
        "context_window_exceeded",
        "unexpected_error",
    }
)
"""tau2's ``TerminationReason`` values."""


# tau2's tool types (``@is_tool(ToolType...)`` in src/tau2/domains/{retail,airline}/tools.py at
# commit a2c0247): a tool not named here reads (the domains' get_, find_, list_ and search_).
_TAU2_TOOL_TYPES: Final[Mapping[str, str]] = {
    **dict.fromkeys(
        (
            "cancel_pending_order",
            "exchange_delivered_order_items",
            "modify_pending_order_address",
            "modify_pending_order_items",
            "modify_pending_order_payment",
            "modify_user_address",
            "return_delivered_order_items",
            "book_reservation",
            "cancel_reservation",
            "send_certificate",
            "update_reservation_baggages",
            "update_reservation_flights",
            "update_reservation_passengers",
        ),
        "write",
    ),
    "calculate": "generic",
    "transfer_to_human_agents": "generic",
    "think": "think",
}

_REWARDED_ENDS: Final = ("user_stop", "agent_stop")


def _action_checks(messages: list[dict[str, Any]], gold: list[Any]) -> list[dict[str, Any]]:
    """tau2's ``ActionEvaluator``: for each gold action, whether some tool call of the
    conversation (the agent's or the user's) matches it (``Action.compare_with_tool_call``: the
    same name, and the same values of ``compare_args``, or of every argument the call gave)."""
    calls = [
        c
        for m in messages
        if m.get("role") in ("assistant", "user")
        for c in m.get("tool_calls") or []
        if isinstance(c, dict)
    ]

    def matches(action: dict[str, Any], call: dict[str, Any]) -> bool:
        if action.get("name") != call.get("name"):
            return False
        given = call.get("arguments")
        arguments: dict[str, Any] = given if isinstance(given, dict) else {}
        compare = action.get("compare_args")
        keys = list(arguments) if compare is None else list(compare)
        if not keys:
            return True
        wanted = action.get("arguments")
        expected: dict[str, Any] = wanted if isinstance(wanted, dict) else {}
        return {k: v for k, v in arguments.items() if k in keys} == {
            k: v for k, v in expected.items() if k in keys
        }

    checks = []
    for action in gold:
        if not isinstance(action, dict):
            continue
        matched = any(matches(action, call) for call in calls)
        checks.append(
            {
                "action": action,
                "action_match": matched,
                "action_reward": 1.0 if matched else 0.0,
                "tool_type": _TAU2_TOOL_TYPES.get(str(action.get("name")), "read"),
            }
        )
    return checks


def _communicate_checks(
    messages: list[dict[str, Any]], required: list[str]
) -> list[dict[str, Any]]:
    """tau2's ``CommunicateEvaluator``: each required text is met when an assistant message
    holds it (case-insensitive, the message read without commas), with tau2's justification."""
    said = [
        m["content"]
        for m in messages
        if m.get("role") == "assistant" and isinstance(m.get("content"), str) and m["content"]
    ]
    out = []
    for info in required:
        found = next((c for c in said if info.lower() in c.lower().replace(",", "")), None)
        justification = (
            f"Information '{info}' not communicated."
            if found is None
            else f"Information '{info}' communicated in the message:\n '{found}'"
        )
        out.append({"info": info, "met": found is not None, "justification": justification})
    return out


def _tau2_reward_info(
    reward: float,
    basis: list[str],
    info: dict[str, Any],
    termination: str,
    checks: Mapping[str, Any],
    messages: list[dict[str, Any]],
    raw: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """A trial's ``reward_info`` as tau2's ``evaluate_simulation`` writes it: for a
    conversation cut short, only the reward 0 and tau2's note (no checks, no basis); else the
    database check, the action checks, the communicate checks and the judged assertions, with
    the reward of each component of the task's basis (``reward_breakdown``)."""
    if termination not in _REWARDED_ENDS:
        note = f"Simulation terminated prematurely. Termination reason: {termination}"
        return {"reward": 0.0, "reward_basis": None, "info": {"note": note, **info}}
    out: dict[str, Any] = {"reward": reward, "reward_basis": basis, "info": info}
    breakdown: dict[str, float] = {}
    # An environment that scored the trial itself (telecom) recorded tau2's own parts.
    scored = checks.get(REWARD_CHECK)
    own: Mapping[str, Any] = (scored.get("compared") or {}) if isinstance(scored, Mapping) else {}
    own_breakdown = own.get("reward_breakdown") or {}
    state = checks.get("state_equality")
    if isinstance(own.get("db_check"), Mapping):
        out["db_check"] = dict(own["db_check"])
        if "DB" in basis:
            breakdown["DB"] = float(out["db_check"].get("db_reward", 0.0))
    elif isinstance(state, Mapping):
        db_match = bool(state.get("passed"))
        out["db_check"] = {"db_match": db_match, "db_reward": float(db_match)}
        if "DB" in basis:
            breakdown["DB"] = float(db_match)
    criteria = (raw or {}).get("evaluation_criteria") or {}
    if isinstance(own.get("env_assertions"), list):
        out["env_assertions"] = list(own["env_assertions"])
    elif raw is None or any(criteria.get(k) is not None for k in ("actions", "env_assertions")):
        # (tau2's environment evaluator lists the assertions it checked, none here)
        out["env_assertions"] = []
    gold = criteria.get("actions") if isinstance(criteria, Mapping) else None
    if isinstance(own.get("action_checks"), list):  # matched against the trial's record
        out["action_checks"] = list(own["action_checks"])
    elif isinstance(gold, list) and gold:
        out["action_checks"] = _action_checks(messages, gold)
    if "ACTION" in basis:
        made = out.get("action_checks") or []
        breakdown["ACTION"] = float(
            own_breakdown.get("ACTION", all(c["action_match"] for c in made))
        )
    outputs = checks.get("required_outputs")
    if isinstance(outputs, Mapping):
        required = (outputs.get("compared") or {}).get("required") or []
        out["communicate_checks"] = _communicate_checks(messages, [str(r) for r in required])
    if "ENV_ASSERTION" in basis:
        # (tau2's reward with no environment assertion is 1.0)
        breakdown["ENV_ASSERTION"] = float(own_breakdown.get("ENV_ASSERTION", 1.0))
    if "COMMUNICATE" in basis:
        said = out.get("communicate_checks") or []
        breakdown["COMMUNICATE"] = float(all(c["met"] for c in said))
    judged = checks.get(NL_CHECK)
    compared = (judged.get("compared") or {}) if isinstance(judged, Mapping) else {}
    if compared.get("judged"):
        # As tau2's NLAssertionsEvaluator writes them: nl_assertion, met, justification.
        out["nl_assertions"] = [
            {k: a.get(k) for k in ("nl_assertion", "met", "justification")}
            for a in compared.get("assertions") or []
            if isinstance(a, dict)
        ]
    if "NL_ASSERTION" in basis:
        graded = out.get("nl_assertions")
        breakdown["NL_ASSERTION"] = (
            float(bool(judged and judged.get("passed"))) if graded is not None or judged else 1.0
        )
    out["reward_breakdown"] = breakdown
    return out


def _termination(row: TrialRow, meta: dict[str, Any]) -> str:
    if row.infra_error:
        return "infrastructure_error"
    recorded = meta.get("termination_reason")
    if isinstance(recorded, str) and recorded in TAU2_TERMINATIONS:
        return recorded
    if "error" in meta:
        return "agent_error"
    return "agent_stop"


def _costs(messages: list[dict[str, Any]], meta: dict[str, Any]) -> tuple[Any, Any]:
    """(agent cost, user cost) as tau2's ``get_cost`` sums them from the messages' costs: a
    side is None when one of its messages has none; without messages of a side, the total the
    agent recorded (``agent_cost`` / ``user_cost``), else None (unknown)."""

    def side(role: str, key: str) -> float | None:
        costs = [m.get("cost") for m in messages if m["role"] == role]
        known = [float(c) for c in costs if isinstance(c, int | float)]
        if costs and len(known) == len(costs):
            return sum(known)
        value = meta.get(key)
        return float(value) if isinstance(value, int | float) and not costs else None

    return side("assistant", "agent_cost"), side("user", "user_cost")


def _tokens(messages: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """Token counts per side: the messages' ``usage`` summed (tau2's ``get_token_usage``),
    else the totals the agent recorded (``meta["usage"]``, ``meta["user_usage"]``)."""
    out: dict[str, Any] = {}
    for role, key in (("assistant", "usage"), ("user", "user_usage")):
        totals: dict[str, int] = {}
        for m in messages:
            if m["role"] == role and isinstance(m.get("usage"), dict):
                for k, v in m["usage"].items():
                    if isinstance(v, int):
                        totals[k] = totals.get(k, 0) + v
        recorded = meta.get(key)
        if not totals and isinstance(recorded, dict):
            totals = {k: v for k, v in recorded.items() if isinstance(v, int)}
        if totals:
            out["agent" if role == "assistant" else "user"] = totals
    return out


def _tau2_task(task_id: str, task: Task | None, raw: dict[str, Any] | None) -> dict[str, Any]:
    if raw is not None:  # tau2's own task, as its file gives it: tau2's checks compare it whole
        return raw
    if task is None:
        return {
            "id": task_id,
            "user_scenario": {"instructions": ""},
            "evaluation_criteria": {"actions": [], "reward_basis": ["DB"]},
        }
    user = task.user
    structured = all(k in user for k in ("domain", "reason_for_call", "task_instructions"))
    basis = tau2_reward_basis(task) or (["DB", "COMMUNICATE"] if task.required_outputs else ["DB"])
    return {
        "id": task.id,
        "user_scenario": {"instructions": dict(user) if structured else task.instruction},
        "evaluation_criteria": {
            "actions": [
                {
                    "action_id": f"{task.id}_{i}",
                    "requestor": c.requestor,
                    "name": c.name,
                    "arguments": dict(c.arguments),
                    **({} if c.compare_args is None else {"compare_args": c.compare_args}),
                }
                for i, c in enumerate(task.reference_actions)
            ],
            **({"env_assertions": list(task.env_assertions)} if task.env_assertions else {}),
            "communicate_info": list(task.required_outputs) or None,
            "reward_basis": basis,
        },
        **(
            {"initial_state": {"initialization_actions": list(task.initialization)}}
            if task.initialization
            else {}
        ),
    }


def _raw_tau2_tasks(loaded: Suite | None) -> dict[str, dict[str, Any]]:
    """The run's tau2 tasks as its ``tasks.json`` gives them (empty: not a tau2 suite)."""
    if loaded is None or not any(tau2_index(t) is not None for t in loaded.tasks):
        return {}
    try:
        data = json.loads(Path(loaded.path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, list):
        return {}
    return {str(t.get("id")): t for t in data if isinstance(t, dict)}


def _tool_defs(env: Any) -> dict[str, Any] | None:
    """tau2's ``EnvironmentInfo.tool_defs`` (name -> ``ToolSignature``: ``name``, ``doc``,
    ``params``, ``returns``): the environment's ``tool_defs()`` when it has one, else built from
    its tools as the agent sees them (their OpenAI function specs)."""
    hook = getattr(env, "tool_defs", None)
    given = hook() if callable(hook) else None
    specs: list[Any]
    if isinstance(given, dict):
        if all(isinstance(v, dict) and "doc" in v for v in given.values()):
            return dict(given)
        specs = list(given.values())
    elif isinstance(given, list):
        specs = given
    else:
        specs = Toolbox(dict(env.tools), cast(Session, None), env).specs
    out: dict[str, Any] = {}
    for spec in specs:
        function = spec.get("function", spec) if isinstance(spec, dict) else {}
        name = function.get("name")
        if name:
            out[str(name)] = {
                "name": str(name),
                "doc": str(function.get("description") or ""),
                "params": function.get("parameters"),
                "returns": None,
            }
    return out or None


def _policy_text(env: Any) -> str:
    """The domain policy the agent is given: the environment's ``policy`` (text), else its
    module's ``POLICY``; empty when it has none."""
    policy = getattr(env, "policy", None)
    if callable(policy):
        policy = policy()
    if not isinstance(policy, str):
        policy = getattr(sys.modules.get(type(env).__module__), "POLICY", None)
    return policy if isinstance(policy, str) else ""


def _environment_info(loaded: Suite | None, domain: str) -> dict[str, Any]:
    info: dict[str, Any] = {"domain_name": domain, "policy": "", "tool_defs": None}
    if loaded is None:
        return info
    try:
        env = loaded.new_environment()
    except Exception:  # an environment that no longer builds: the export goes on without it
        return info
    try:
        info["policy"] = _policy_text(env)
        info["tool_defs"] = _tool_defs(env)
    except Exception:
        pass
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()
    return info


def _first(metas: Iterable[dict[str, Any]], key: str) -> Any:
    return next((m[key] for m in metas if m.get(key) is not None), None)


def _user_info(metas: list[dict[str, Any]]) -> dict[str, Any]:
    user = _first(metas, "user")
    if isinstance(user, dict) and user.get("implementation"):
        return {
            k: user[k]
            for k in ("implementation", "llm", "llm_args", "global_simulation_guidelines")
            if user.get(k) is not None
        }
    if isinstance(user, str) and user:
        return {"implementation": user}
    return {"implementation": "none (the agent is given the task's instruction)"}


def _cap(metas: list[dict[str, Any]], agent: dict[str, Any], key: str) -> int:
    value = _first(metas, key)
    if value is None:
        value = agent.get(key)
    return int(value) if isinstance(value, int | float) else 0


def _agent_info(evidence: dict[str, Any]) -> dict[str, Any]:
    agent = dict(evidence.get("agent") or {})
    name = str(agent.get("name") or agent.get("agent") or "unknown")
    args = {
        **agent,
        "harness": {
            "transactions": evidence.get("transactions", True),
            "policy": finite(evidence.get("policy") or {}),
        },
    }
    return {"implementation": f"harness:{name}", "llm": agent.get("model"), "llm_args": args}


def _git_commit(evidence: dict[str, Any]) -> str:
    """The harness commit that ran (recorded in the evidence), else its version."""
    commit = evidence.get("harness_commit")
    if isinstance(commit, str) and commit:
        return commit
    return f"harness-{evidence.get('harness_version', __version__)}"


def tau2_results(
    data: OpenRun, *, suite: str | Path | None = None, trust: bool = False
) -> dict[str, Any]:
    """The run as tau2-bench's ``Results`` (``info``, ``tasks``, ``simulations``).

    What tau2's ``submit verify-trajs`` checks offline holds: the file loads as its
    ``Results``; each task is listed once with its tau2 id and, for a tau2 ``tasks.json``, as
    the file gives it (so tau2's task comparison finds it unchanged); every task has
    ``info.num_trials`` simulations. ``info`` carries the harness commit (``git_commit``),
    ``max_steps`` and ``max_errors`` (as the agent recorded them, else its configuration, else
    0: no cap), the user simulator, the domain policy and the tool definitions; each
    simulation its costs (None when the endpoint reported none), token counts
    (``reward_info.info["usage"]``), the task's reward basis, and the conversation: the one
    the agent recorded (``meta["messages"]``), else one rebuilt from the episode's record.
    """
    order = _task_order(data)
    loaded = _loaded_suite(data, suite, trust)
    tasks = {} if loaded is None else {t.id: t for t in loaded.tasks}
    raw = _raw_tau2_tasks(loaded)
    ev = data.evidence
    metas = {row.episode_id: loads_or(row.agent_meta, {}) for row in data.trials}
    per_task: dict[str, int] = {}
    for row in data.trials:
        per_task[row.task_id] = per_task.get(row.task_id, 0) + 1
    simulations = []
    with _suite_environment(loaded) as env:
        for row in _ordered_trials(data):
            meta = metas[row.episode_id] if isinstance(metas[row.episode_id], dict) else {}
            task = tasks.get(row.task_id)
            start = row.created_at - row.duration
            reward = 1.0 if row.passed and not row.infra_error else 0.0
            verdict = loads_or(row.verdict, {})
            checks = {
                str(c.get("name")): c for c in verdict.get("checks", []) if isinstance(c, dict)
            }
            basis = (raw.get(row.task_id, {}).get("evaluation_criteria") or {}).get("reward_basis")
            if basis is None:
                basis = (task and tau2_reward_basis(task)) or ["DB"]
            messages = _trial_messages(data, row, task, meta, env)
            agent_cost, user_cost = _costs(messages, meta)
            info = _harness_info(row)
            info["usage"] = _tokens(messages, meta)
            termination = _termination(row, meta)
            reward_info = _tau2_reward_info(
                reward, basis, info, termination, checks, messages, raw.get(row.task_id)
            )
            simulations.append(
                {
                    "id": row.episode_id,
                    "task_id": row.task_id,
                    "timestamp": _iso(row.created_at),
                    "start_time": _iso(start),
                    "end_time": _iso(row.created_at),
                    "duration": row.duration,
                    "termination_reason": termination,
                    "agent_cost": agent_cost,
                    "user_cost": user_cost,
                    "reward_info": reward_info,
                    "messages": messages,
                    "trial": row.trial,
                    "seed": row.seed,
                }
            )
    domain = next(
        (
            str(d)
            for t in raw.values()
            if isinstance(d := ((t.get("user_scenario") or {}).get("instructions") or {}), dict)
            and (d := d.get("domain"))
        ),
        data.run.suite,
    )
    agent = dict(ev.get("agent") or {})
    all_metas = [m for m in metas.values() if isinstance(m, dict)]
    return {
        "timestamp": _iso(data.run.created_at),
        "info": {
            "git_commit": _git_commit(ev),
            "num_trials": int(data.config.get("trials") or max(per_task.values())),
            "max_steps": _cap(all_metas, agent, "max_steps"),
            "max_errors": _cap(all_metas, agent, "max_errors"),
            "user_info": _user_info(all_metas),
            "agent_info": _agent_info(ev),
            "environment_info": _environment_info(loaded, domain),
            "seed": ev.get("seed", data.config.get("seed")),
        },
        "tasks": [_tau2_task(t, tasks.get(t), raw.get(t)) for t in order],
        "simulations": simulations,
    }


def jsonl_records(data: OpenRun) -> Iterable[dict[str, Any]]:
    """One dict per trial: the trial row, decoded, with its transactions."""
    for row in _ordered_trials(data):
        record: dict[str, Any] = {
            "run_id": data.run.id,
            "suite": data.run.suite,
            "task_id": row.task_id,
        }
        record.update(
            {
                "trial": row.trial,
                "message": row.message,
                "duration": row.duration,
                "created_at": row.created_at,
                **_harness_info(row),
            }
        )
        record["transactions"] = [
            {
                "id": t.id,
                "seq": t.seq,
                "action": t.action,
                "args": loads_or(t.args, t.args),
                "status": t.status,
                "mutating": t.mutating,
                "failure_class": t.failure_class,
                "decision": t.decision,
                "reason": t.reason,
                "result": loads_or(t.result, t.result),
                "diff": loads_or(t.diff, t.diff),
                "attempts": t.attempts,
                "errors": loads_or(t.errors, []),
                "started_at": t.started_at,
                "ended_at": t.ended_at,
                "duration": t.duration,
            }
            for t in data.store.transaction_rows(row.episode_id)
        ]
        yield record


def export_run(
    run: str | Path,
    fmt: ExportFormat,
    out: str | Path | None = None,
    *,
    infra: InfraPolicy = "fail",
    suite: str | Path | None = None,
    trust: bool = False,
    require_index: bool = False,
) -> Path:
    """Write run ``run`` (``logs/<run>``) in format ``fmt``; returns the file written.

    Args:
        run: the run folder.
        fmt: ``taubench``, ``tau2`` or ``jsonl``.
        out: the file to write (default: ``export-<fmt>.json`` or ``export.jsonl`` in the
            run folder).
        infra: for ``taubench``: how infrastructure errors are written (see the module).
        suite: the run's suite (a path or a built-in name), for the tasks' instructions.
        trust: load the suite at the path the run records, whatever it is. Without ``suite``
            or ``trust`` only a built-in suite is loaded: a run folder does not choose the
            code that runs (:func:`suite_left_out` says when instructions are left out).
        require_index: for ``taubench``: refuse when the tasks have no index in a tasks file
            instead of numbering them in run order (:func:`taubench_ids_note` says when).

    Raises:
        RunNotFound: ``run`` is not a run folder.
        HarnessError: ``out`` is not a regular file (a symbolic link, a FIFO, a device, a
            folder) or its folder cannot be written; nothing is written.
        ValueError: an unknown format.

    The file is written atomically (a temporary file beside it, then renamed over it). A NaN
    or infinity stored in the run (a tool's result, a trial's partial score or agent
    metadata) is written as ``null``: strict JSON has no NaN.
    """
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"format must be one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
    with open_run(run, finished=True) as data:
        target = (
            Path(out)
            if out is not None
            else (data.folder or Path("."))
            / ("export.jsonl" if fmt == "jsonl" else f"export-{fmt}.json")
        )
        if fmt == "jsonl":
            text: str | Iterable[str] = (json_text(record) + "\n" for record in jsonl_records(data))
        elif fmt == "taubench":
            text = json_text(
                taubench_records(
                    data, infra=infra, suite=suite, trust=trust, require_index=require_index
                ),
                indent=1,
            )
        else:
            text = json_text(tau2_results(data, suite=suite, trust=trust), indent=1)
        write_output(target, text)
    return target

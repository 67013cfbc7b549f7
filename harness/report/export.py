"""Exports: a run in the shapes the peers' own scorers read.

``taubench``
    tau-bench's results file: a JSON list of ``EnvRunResult`` records (``task_id`` an integer,
    ``reward`` 1.0 or 0.0, ``trial``, ``info``, ``traj``), which its ``display_metrics`` turns
    into pass^k. Task ids that are not integers are numbered in run order; the harness id is
    kept in ``info["harness_task_id"]``. Infrastructure errors are written as reward 0
    (``infra="fail"``, tau-bench's convention) or left out (``infra="exclude"``).
``tau2``
    tau2-bench's ``Results`` (``info``, ``tasks``, ``simulations``): each simulation carries
    ``task_id``, ``trial``, ``reward_info.reward``, ``termination_reason`` (an infrastructure
    error is ``infrastructure_error``, which tau2's metrics leave out), times and messages, and
    each task its reference actions, so ``tau2.metrics.agent_metrics.compute_metrics`` runs on it.
``jsonl``
    One JSON object per trial with everything the store holds about it, transactions included.

Trajectories are rebuilt from the transaction log: each write the agent attempted as a tool
call and its result (or the harness's refusal), then the agent's final message. Reads are not
transactions, so they do not appear.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from .._json import loads_or
from .._version import __version__
from ..errors import HarnessError
from ..runs.layout import OpenRun, open_run
from ..runs.output import finite, json_text, write_output
from ..runs.resume import run_suite
from ..stats import InfraPolicy
from ..store import TransactionRow, TrialRow
from ..store.statuses import APPLIED
from ..suite import Task, is_builtin_suite

__all__ = [
    "EXPORT_FORMATS",
    "ExportFormat",
    "export_run",
    "jsonl_records",
    "suite_left_out",
    "tau2_results",
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


def _suite_tasks(data: OpenRun, suite: str | Path | None, trust: bool) -> dict[str, Task]:
    """The run's tasks from its suite, loaded only from a place the caller vouches for
    (:func:`~harness.runs.resume.run_suite`): a built-in suite, ``suite``, or the recorded path
    when ``trust`` is set. Otherwise (or when it no longer loads) no task: the export then
    carries no instructions."""
    try:
        return {t.id: t for t in run_suite(data, suite=suite, trust=trust).tasks}
    except (HarnessError, OSError):
        return {}


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


def _result_text(txn: TransactionRow) -> str:
    if txn.status in APPLIED:
        return txn.result if txn.result is not None else "null"
    return f"Error: {txn.reason or txn.failure_class or txn.status}"


def _openai_traj(task: Task | None, txns: list[TransactionRow], message: str) -> list[Any]:
    """An OpenAI-style message list (tau-bench's ``traj``)."""
    traj: list[dict[str, Any]] = []
    if task is not None and task.instruction:
        traj.append({"role": "user", "content": task.instruction})
    for txn in txns:
        call_id = f"call_{txn.id}"
        traj.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": txn.action, "arguments": txn.args},
                    }
                ],
            }
        )
        traj.append(
            {
                "role": "tool",
                "tool_call_id": call_id,
                "name": txn.action,
                "content": _result_text(txn),
            }
        )
    if message:
        traj.append({"role": "assistant", "content": message})
    return traj


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
        "failures": loads_or(row.failures, {}),
        "steps": loads_or(row.steps, []),
        "verdict": loads_or(row.verdict, {}),
        "agent_meta": loads_or(row.agent_meta, {}),
    }


def _integer_ids(ids: list[str]) -> dict[str, int]:
    if all(re.fullmatch(r"\d+", t) for t in ids) and len({int(t) for t in ids}) == len(ids):
        return {t: int(t) for t in ids}
    return {t: i for i, t in enumerate(ids)}


def taubench_records(
    data: OpenRun,
    *,
    infra: InfraPolicy = "fail",
    suite: str | Path | None = None,
    trust: bool = False,
) -> list[dict[str, Any]]:
    """The run as tau-bench's results file (a list of ``EnvRunResult`` records).

    Args:
        data: from ``open_run``.
        infra: ``fail`` writes infrastructure errors as reward 0; ``exclude`` leaves them out.
    """
    if infra not in ("fail", "exclude"):
        raise ValueError(f"infra must be 'fail' or 'exclude', got {infra!r}")
    ids = _integer_ids(_task_order(data))
    tasks = _suite_tasks(data, suite, trust)
    out = []
    for row in _ordered_trials(data):
        if row.infra_error and infra == "exclude":
            continue
        reward = 1.0 if row.passed and not row.infra_error else 0.0
        task = tasks.get(row.task_id)
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
            info["error"] = _harness_info(row)["agent_meta"].get("error", "infrastructure error")
        out.append(
            {
                "task_id": ids[row.task_id],
                "reward": reward,
                "info": info,
                "traj": _openai_traj(
                    task, data.store.transaction_rows(row.episode_id), row.message
                ),
                "trial": row.trial,
            }
        )
    return out


def _termination(row: TrialRow) -> str:
    if row.infra_error:
        return "infrastructure_error"
    if "error" in loads_or(row.agent_meta, {}):
        return "agent_error"
    return "agent_stop"


def _tau2_messages(
    txns: list[TransactionRow], message: str, start: float, end: float
) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for txn in txns:
        call_id = f"call_{txn.id}"
        stamp = _iso(txn.started_at)
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "name": txn.action,
                        "arguments": loads_or(txn.args, {}),
                        "requestor": "assistant",
                    }
                ],
                "turn_idx": len(messages),
                "timestamp": stamp,
            }
        )
        messages.append(
            {
                "id": call_id,
                "role": "tool",
                "content": _result_text(txn),
                "requestor": "assistant",
                "error": txn.status not in APPLIED,
                "turn_idx": len(messages),
                "timestamp": _iso(txn.ended_at or txn.started_at),
            }
        )
    if message:
        messages.append(
            {
                "role": "assistant",
                "content": message,
                "turn_idx": len(messages),
                "timestamp": _iso(end),
            }
        )
    return messages


def _tau2_task(task_id: str, task: Task | None) -> dict[str, Any]:
    if task is None:
        return {
            "id": task_id,
            "user_scenario": {"instructions": ""},
            "evaluation_criteria": {"actions": [], "reward_basis": ["DB"]},
        }
    user = task.user
    structured = all(k in user for k in ("domain", "reason_for_call", "task_instructions"))
    basis = ["DB", "COMMUNICATE"] if task.required_outputs else ["DB"]
    return {
        "id": task.id,
        "user_scenario": {"instructions": dict(user) if structured else task.instruction},
        "evaluation_criteria": {
            "actions": [
                {
                    "action_id": f"{task.id}_{i}",
                    "requestor": "assistant",
                    "name": c.name,
                    "arguments": dict(c.arguments),
                }
                for i, c in enumerate(task.reference_actions)
            ],
            "communicate_info": list(task.required_outputs) or None,
            "reward_basis": basis,
        },
    }


def _agent_info(evidence: dict[str, Any]) -> dict[str, Any]:
    agent = dict(evidence.get("agent") or {})
    name = str(agent.get("name") or agent.get("agent") or "unknown")
    return {"implementation": f"harness:{name}", "llm": agent.get("model"), "llm_args": agent}


def tau2_results(
    data: OpenRun, *, suite: str | Path | None = None, trust: bool = False
) -> dict[str, Any]:
    """The run as tau2-bench's ``Results`` (``info``, ``tasks``, ``simulations``)."""
    order = _task_order(data)
    tasks = _suite_tasks(data, suite, trust)
    ev = data.evidence
    per_task: dict[str, int] = {}
    for row in data.trials:
        per_task[row.task_id] = per_task.get(row.task_id, 0) + 1
    simulations = []
    for row in _ordered_trials(data):
        start = row.created_at - row.duration
        reward = 1.0 if row.passed and not row.infra_error else 0.0
        verdict = loads_or(row.verdict, {})
        db_match = next(
            (
                c.get("passed")
                for c in verdict.get("checks", [])
                if c.get("name") == "state_equality"
            ),
            None,
        )
        reward_info: dict[str, Any] = {
            "reward": reward,
            "reward_basis": ["DB"],
            "info": _harness_info(row),
        }
        if db_match is not None:
            reward_info["db_check"] = {
                "db_match": bool(db_match),
                "db_reward": float(bool(db_match)),
            }
        simulations.append(
            {
                "id": row.episode_id,
                "task_id": row.task_id,
                "timestamp": _iso(row.created_at),
                "start_time": _iso(start),
                "end_time": _iso(row.created_at),
                "duration": row.duration,
                "termination_reason": _termination(row),
                "agent_cost": None,
                "user_cost": None,
                "reward_info": reward_info,
                "messages": _tau2_messages(
                    data.store.transaction_rows(row.episode_id), row.message, start, row.created_at
                ),
                "trial": row.trial,
                "seed": row.seed,
            }
        )
    return {
        "timestamp": _iso(data.run.created_at),
        "info": {
            "git_commit": f"harness {ev.get('harness_version', __version__)}",
            "num_trials": int(data.config.get("trials") or max(per_task.values())),
            # The harness caps neither steps nor errors; 0 stands for "no cap".
            "max_steps": 0,
            "max_errors": 0,
            "user_info": {"implementation": "none (harness task instruction)"},
            "agent_info": _agent_info(ev),
            "environment_info": {
                "domain_name": data.run.suite,
                "policy": json.dumps(
                    finite(ev.get("policy") or {}), sort_keys=True, allow_nan=False
                ),
            },
            "seed": ev.get("seed", data.config.get("seed")),
        },
        "tasks": [_tau2_task(t, tasks.get(t)) for t in order],
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
            else data.folder / ("export.jsonl" if fmt == "jsonl" else f"export-{fmt}.json")
        )
        if fmt == "jsonl":
            text: str | Iterable[str] = (json_text(record) + "\n" for record in jsonl_records(data))
        elif fmt == "taubench":
            text = json_text(
                taubench_records(data, infra=infra, suite=suite, trust=trust), indent=1
            )
        else:
            text = json_text(tau2_results(data, suite=suite, trust=trust), indent=1)
        write_output(target, text)
    return target

"""Generate ``tasks.json``, the built-in telecom suite, from tau2-bench's telecom tasks.

``tau2_tasks_small.json`` is upstream's ``data/tau2/domains/telecom/tasks_small.json``
(sierra-research/tau2-bench at commit a2c0247, MIT licence, see ``LICENSE``), unchanged: its 20
tasks. Each becomes a harness task exactly as ``harness run tau2_tasks_small.json`` reads it
(:func:`harness.load_suite` of a tau2 file): upstream's id, the user's reason for calling as the
instruction, the structured instructions for a simulated user, the reference actions
(``evaluation_criteria.actions``, each with its requestor: the agent's CRM calls and the user's
calls on the phone), the initialization actions that set the phone and the line up before the
conversation, the assertions on the environment's end state (``env_assertions``) and tags for
the task's place in the file and its reward basis. The environment scores a trial as tau2 does
(``TelecomEnvironment.reward``).

Run from anywhere: ``python tasks/telecom/make_tasks.py`` (``--check`` only compares the file
with what it would write); ``harness`` must be importable.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import harness as hx

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "tau2_tasks_small.json"


def render() -> str:
    """The text of ``tasks.json``: upstream's tasks in the harness's task format."""
    suite = hx.load_suite(SOURCE, check_references=False)
    tasks = []
    for task in suite.tasks:  # the fields a task sets, and reference_actions (required)
        given = task.model_dump(mode="json", exclude_defaults=True)
        full = task.model_dump(mode="json")
        tasks.append({k: v for k, v in full.items() if k in given or k == "reference_actions"})
    document = {"format": "harness.tasks", "version": 1, "tasks": tasks}
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    target, text = HERE / "tasks.json", render()
    if "--check" in sys.argv[1:]:
        current = target.read_text(encoding="utf-8") if target.exists() else None
        print("tasks.json is up to date" if current == text else "tasks.json differs")
        sys.exit(0 if current == text else 1)
    target.write_text(text, encoding="utf-8")
    print(f"wrote {text.count(chr(10) + '    {' + chr(10))} tasks to {target.name}")

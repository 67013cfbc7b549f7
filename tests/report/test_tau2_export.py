"""tau2 exports that ``tau2 submit verify-trajs`` accepts, and tau-bench ids that name the file.

``tau2 submit verify-trajs`` runs three offline checks (tau2-bench, commit
a2c024725189473d2d7cea3a5cfdbcc67478e41f, src/tau2/scripts/leaderboard/
verify_trajectories_public.py): ``check_format`` (the file loads as
``tau2.data_model.simulation.Results``), ``check_tasks`` (the results' tasks are the domain's
tasks, none missing or extra, each equal to the domain's by ``get_pydantic_hash`` of its
``model_dump``) and ``check_num_trials`` (every task has ``info.num_trials`` simulations). They
are re-stated here: the models below re-state tau2's pydantic models (src/tau2/data_model/
simulation.py, tasks.py, message.py and src/tau2/environment/toolkit.py at that commit) for the
fields a text run writes, with unknown fields forbidden (tau2 ignores them; forbidding them
catches a misspelt name). ``check_tasks`` compares with the tasks file the run came from (tau2
compares with its registry's ``base`` split, all 114 retail tasks). With ``TAU2_SRC`` naming a
tau2-bench checkout, the real checks run too.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import pytest
from click.testing import CliRunner
from pydantic import BaseModel, ConfigDict, Field

from harness.agents import AgentOutput, Toolbox
from harness.cli import main
from harness.errors import HarnessError
from harness.report.export import export_run, tau2_index, tau2_reward_basis, taubench_ids_note
from harness.runs.start import run_trials
from harness.suite import Task as HarnessTask
from harness.suite import load_suite

from .test_report import make_run

pytest.importorskip("pydantic")

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
TASKS = SHARED / "tau2-retail" / "tasks.json"
RUN_TASKS = ["0", "6", "10"]  # ids whose index in the train file differs: 0, 5, 8

needs_data = pytest.mark.skipif(not TASKS.exists(), reason="the shared tau2 data is not here")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- tau2.data_model.tasks ----------------------------------------------------------------


class RewardType(StrEnum):
    DB = "DB"
    ENV_ASSERTION = "ENV_ASSERTION"
    NL_ASSERTION = "NL_ASSERTION"
    ACTION = "ACTION"
    COMMUNICATE = "COMMUNICATE"


class StructuredUserInstructions(_Strict):
    domain: str
    reason_for_call: str
    known_info: str | None = None
    unknown_info: str | None = None
    task_instructions: str


class UserScenario(_Strict):
    persona: str | None = None
    instructions: StructuredUserInstructions | str


class Description(_Strict):
    purpose: str | None = None
    relevant_policies: str | None = None
    notes: str | None = None


class Action(_Strict):
    action_id: str
    requestor: Literal["user", "assistant"] = "assistant"
    name: str
    arguments: dict[str, Any]
    info: str | None = None
    compare_args: list[str] | None = None


class EnvFunctionCall(_Strict):
    env_type: Literal["user", "assistant"]
    func_name: str
    arguments: dict[str, Any]


class EnvAssertion(EnvFunctionCall):
    assert_value: bool = True
    message: str | None = None


class EvaluationCriteria(_Strict):
    actions: list[Action] | None = None
    env_assertions: list[EnvAssertion] | None = None
    communicate_info: list[str] | None = None
    nl_assertions: list[str] | None = None
    reward_basis: list[RewardType] = Field(
        default_factory=lambda: [RewardType.DB, RewardType.COMMUNICATE]
    )

    def info(self) -> dict[str, int]:
        """``EvaluationCriteria.info`` (what ``Results.to_df`` reads of every task)."""
        agent = [a for a in self.actions or [] if a.requestor == "assistant"]
        user = [a for a in self.actions or [] if a.requestor == "user"]
        return {
            "num_agent_actions": len(agent),
            "num_user_actions": len(user),
            "num_env_assertions": len(self.env_assertions or []),
            "num_nl_assertions": len(self.nl_assertions or []),
        }


class InitializationData(_Strict):
    agent_data: dict[str, Any] | None = None
    user_data: dict[str, Any] | None = None


class InitialState(_Strict):
    initialization_data: InitializationData | None = None
    initialization_actions: list[EnvFunctionCall] | None = None
    message_history: list[dict[str, Any]] | None = None


class Task(_Strict):
    id: str
    description: Description | None = None
    user_scenario: UserScenario
    ticket: str | None = None
    initial_state: InitialState | None = None
    evaluation_criteria: EvaluationCriteria | None = None
    issues: list[dict[str, Any]] | None = None
    required_documents: list[str] | None = None
    user_tools: list[str] | None = None


# --- tau2.data_model.message ----------------------------------------------------------------


class ToolCall(_Strict):
    id: str = ""
    name: str
    arguments: dict[str, Any]
    requestor: Literal["user", "assistant"] = "assistant"


class _Participant(_Strict):
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    is_audio: bool = False
    turn_idx: int | None = None
    timestamp: str | None = None
    cost: float | None = None
    usage: dict[str, Any] | None = None
    raw_data: dict[str, Any] | None = None
    generation_time_seconds: float | None = None


class AssistantMessage(_Participant):
    role: Literal["assistant"]


class UserMessage(_Participant):
    role: Literal["user"]


class SystemMessage(_Strict):
    role: Literal["system"]
    content: str | None = None
    turn_idx: int | None = None
    timestamp: str | None = None


class ToolMessage(_Strict):
    id: str
    role: Literal["tool"]
    content: str | None = None
    requestor: Literal["user", "assistant"] = "assistant"
    error: bool = False
    turn_idx: int | None = None
    timestamp: str | None = None


Message = SystemMessage | AssistantMessage | UserMessage | ToolMessage


# --- tau2.data_model.simulation, tau2.environment ------------------------------------------


class TerminationReason(StrEnum):
    USER_STOP = "user_stop"
    AGENT_STOP = "agent_stop"
    MAX_STEPS = "max_steps"
    TIMEOUT = "timeout"
    TOO_MANY_ERRORS = "too_many_errors"
    AGENT_ERROR = "agent_error"
    USER_ERROR = "user_error"
    INFRASTRUCTURE_ERROR = "infrastructure_error"
    CONTEXT_WINDOW_EXCEEDED = "context_window_exceeded"
    UNEXPECTED_ERROR = "unexpected_error"


class DBCheck(_Strict):
    db_match: bool
    db_reward: float


class CommunicateCheck(_Strict):
    info: str
    met: bool
    justification: str


class RewardInfo(_Strict):
    reward: float
    db_check: DBCheck | None = None
    env_assertions: list[dict[str, Any]] | None = None
    action_checks: list[dict[str, Any]] | None = None
    nl_assertions: list[dict[str, Any]] | None = None
    communicate_checks: list[CommunicateCheck] | None = None
    reward_basis: list[RewardType] | None = Field(default_factory=lambda: [RewardType.DB])
    reward_breakdown: dict[RewardType, float] | None = None
    info: dict[str, Any] | None = None


class ToolSignature(_Strict):
    name: str
    doc: str
    params: dict[str, Any] | None = None
    returns: dict[str, Any] | None = None


class EnvironmentInfo(_Strict):
    domain_name: str
    policy: str
    tool_defs: dict[str, ToolSignature] | None = None


class AgentInfo(_Strict):
    implementation: str
    llm: str | None = None
    llm_args: dict[str, Any] | None = None


class UserInfo(_Strict):
    implementation: str
    llm: str | None = None
    llm_args: dict[str, Any] | None = None
    global_simulation_guidelines: str | None = None


class Info(_Strict):
    git_commit: str
    num_trials: int
    max_steps: int
    max_errors: int
    user_info: UserInfo
    agent_info: AgentInfo
    environment_info: EnvironmentInfo
    seed: int | None = None


class SimulationRun(_Strict):
    id: str
    task_id: str
    timestamp: str
    start_time: str
    end_time: str
    duration: float
    termination_reason: TerminationReason
    agent_cost: float | None = None
    user_cost: float | None = None
    reward_info: RewardInfo | None = None
    messages: list[Message] | None = None
    trial: int | None = None
    seed: int | None = None


class Results(_Strict):
    timestamp: str | None = None
    info: Info
    tasks: list[Task]
    simulations: list[SimulationRun] = Field(default_factory=list)


# --- verify_trajectories_public, re-stated -------------------------------------------------


def check_format(path: Path) -> tuple[Results | None, bool, str]:
    """``check_format``: the file loads as ``Results``."""
    try:
        return Results.model_validate_json(path.read_text()), True, ""
    except Exception as exc:
        return None, False, f"Error loading results: {exc}"


def check_tasks(results: Results, domain_tasks: list[Task]) -> tuple[bool, str]:
    """``check_tasks``, against ``domain_tasks`` instead of tau2's registry."""
    domain = {t.id: t for t in domain_tasks}
    ours = {t.id: t for t in results.tasks}
    missing, extra = set(domain) - set(ours), set(ours) - set(domain)
    if missing or extra:
        errors = []
        if missing:
            errors.append(f"Missing tasks: {missing}")
        if extra:
            errors.append(f"Extra tasks: {extra}")
        return False, "; ".join(errors)
    # get_pydantic_hash(task) is the hash of task.model_dump(): equal dumps, equal hashes.
    diffs = [t for t in domain if domain[t].model_dump() != ours[t].model_dump()]
    if diffs:
        return False, f"Task mismatches found in {len(diffs)} tasks"
    return True, ""


def check_num_trials(results: Results) -> tuple[bool, str]:
    """``check_num_trials``: every task has ``info.num_trials`` simulations."""
    counts: dict[str, int] = defaultdict(int)
    for sim in results.simulations:
        counts[sim.task_id] += 1
    wrong = {t.id: counts.get(t.id, 0) for t in results.tasks}
    wrong = {t: n for t, n in wrong.items() if n != results.info.num_trials}
    if wrong:
        return False, f"Incorrect trial counts for {len(wrong)} tasks"
    return True, ""


def _file_tasks() -> list[Task]:
    return [Task.model_validate(t) for t in json.loads(TASKS.read_text())]


# --- a real run on tau2's tasks ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tau2_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scripted agent on three of tau2's retail tasks (its own tasks.json), 2 trials."""
    if not TASKS.exists():
        pytest.skip("the shared tau2 data is not beside the repository")
    base = tmp_path_factory.mktemp("tau2")
    result = run_trials(
        TASKS, agent="scripted", trials=2, logs=base / "logs", tasks=RUN_TASKS, run_id="t2"
    )
    return result.folder


@needs_data
def test_the_export_passes_verify_trajs_offline_checks(tau2_run: Path, tmp_path: Path) -> None:
    """Format, tasks (tau2's ids, each as the file gives it) and trial counts all pass."""
    path = export_run(tau2_run, "tau2", tmp_path / "t2.json", trust=True)
    results, ok, error = check_format(path)
    assert ok, error
    assert results is not None
    assert [t.id for t in results.tasks] == RUN_TASKS
    chosen = [t for t in _file_tasks() if t.id in RUN_TASKS]
    assert check_tasks(results, chosen) == (True, "")
    # Against the whole file, only the tasks not run are missing: none extra, none changed.
    ok, error = check_tasks(results, _file_tasks())
    assert not ok and error.startswith("Missing tasks") and "Extra" not in error
    assert check_num_trials(results) == (True, "")
    assert results.info.num_trials == 2 and len(results.simulations) == 6
    assert {s.task_id for s in results.simulations} == set(RUN_TASKS)
    # A simulation with a trial missing fails the count, as tau2's does.
    results.simulations.pop()
    assert check_num_trials(results)[0] is False


@needs_data
def test_the_export_carries_real_info_policy_tools_and_reward_basis(
    tau2_run: Path, tmp_path: Path
) -> None:
    """info names the domain, the harness commit, the policy text and all 16 tools; each
    simulation the task's reward basis, the DB check and a conversation of tau2 messages."""
    data = json.loads(export_run(tau2_run, "tau2", tmp_path / "t2.json", trust=True).read_text())
    results = Results.model_validate(data)
    info = results.info
    assert info.environment_info.domain_name == "retail"
    assert info.git_commit and info.git_commit != "unknown"
    policy = (SHARED / "tau2-retail" / "policy.md").read_text()
    assert info.environment_info.policy.strip() == policy.strip()
    tools = json.loads((SHARED / "tau2-retail" / "tools.json").read_text())
    names = {t["function"]["name"] if "function" in t else t["name"] for t in tools}
    defs = info.environment_info.tool_defs
    assert defs is not None and set(defs) == names
    cancel = defs["cancel_pending_order"]
    assert cancel.params is not None and "order_id" in cancel.params["properties"]
    assert info.agent_info.llm_args is not None
    assert info.agent_info.llm_args["harness"]["transactions"] is True
    file_tasks = {t.id: t for t in _file_tasks()}
    for sim in results.simulations:
        assert sim.reward_info is not None and sim.reward_info.reward == 1.0
        expected = file_tasks[sim.task_id].evaluation_criteria
        assert expected is not None
        assert sim.reward_info.reward_basis == expected.reward_basis
        assert sim.reward_info.db_check == DBCheck(db_match=True, db_reward=1.0)
        assert sim.termination_reason == TerminationReason.AGENT_STOP
        assert sim.agent_cost is None and sim.user_cost is None  # the scripted agent pays nothing
        messages = sim.messages or []
        assert isinstance(messages[0], UserMessage)
        calls = [c for m in messages if isinstance(m, AssistantMessage) for c in m.tool_calls or []]
        # Every reference call (reads included), in order, each answered by a tool message.
        actions = expected.actions or []
        assert [c.name for c in calls] == [a.name for a in actions]
        answers = [m for m in messages if isinstance(m, ToolMessage)]
        assert [m.id for m in answers] == [c.id for c in calls]
        assert [m.turn_idx for m in messages] == list(range(len(messages)))


@needs_data
def test_tau2_tasks_keep_their_index_and_reward_basis() -> None:
    """A task loaded from tau2's tasks.json keeps tau2's id, its index in the file and its
    reward basis; communicate_info is required only when the basis has COMMUNICATE."""
    suite = load_suite(TASKS, check_references=False)
    raw = json.loads(TASKS.read_text())
    assert [t.id for t in suite.tasks] == [str(t["id"]) for t in raw]
    for i, (task, source) in enumerate(zip(suite.tasks, raw, strict=True)):
        assert tau2_index(task) == i
        assert tau2_reward_basis(task) == source["evaluation_criteria"]["reward_basis"]
        assert task.required_outputs == []  # no retail task gates on COMMUNICATE
    assert tau2_index(suite.task("6")) == 5
    assert (
        tau2_index(HarnessTask(id="x")) is None and tau2_reward_basis(HarnessTask(id="x")) is None
    )


@needs_data
def test_taubench_task_id_is_the_index_in_the_tasks_file(tau2_run: Path, tmp_path: Path) -> None:
    """tau-bench's task_id is each task's position in the tasks file it came from."""
    path = export_run(tau2_run, "taubench", tmp_path / "tb.json", trust=True)
    records = json.loads(path.read_text())
    ids = {r["info"]["harness_task_id"]: r["task_id"] for r in records}
    assert ids == {"0": 0, "6": 5, "10": 8}
    assert {r["info"]["task_id_source"] for r in records} == {"tasks_file_index"}
    assert taubench_ids_note(tau2_run, suite=None, trust=True) is None
    # The trajectory is OpenAI-style: the instruction, each call and its answer, the message.
    traj = records[0]["traj"]
    assert traj[0]["role"] == "user" and traj[-1]["role"] == "assistant"
    call = traj[1]["tool_calls"][0]
    assert traj[2] == {
        "role": "tool",
        "tool_call_id": call["id"],
        "name": call["function"]["name"],
        "content": traj[2]["content"],
    }


def test_taubench_refuses_to_claim_an_index_for_a_suite_without_a_tasks_file(
    tmp_path: Path,
) -> None:
    """Tasks that did not come from a tasks file are numbered in run order, and say so; asked
    to require the index, the export refuses and names the fix."""
    folder = make_run(tmp_path, "r", {"a": "PP", "b": "PF"})
    records = json.loads(export_run(folder, "taubench", tmp_path / "tb.json").read_text())
    assert [(r["task_id"], r["info"]["task_id_source"]) for r in records[:2]] == [
        (0, "run_order"),
        (1, "run_order"),
    ]
    note = taubench_ids_note(folder, suite=None, trust=False)
    assert note is not None and "run order" in note
    with pytest.raises(HarnessError, match="no index in a tasks file"):
        export_run(folder, "taubench", tmp_path / "x.json", require_index=True)
    assert not (tmp_path / "x.json").exists()
    # The same from the command line: a note by default, a refusal with --require-index.
    runner = CliRunner()
    out = runner.invoke(main, ["export", str(folder), "--format", "taubench", "--allow-unverified"])
    assert out.exit_code == 0 and "run order" in out.output
    out = runner.invoke(
        main,
        ["export", str(folder), "--format", "taubench", "--require-index", "--allow-unverified"],
    )
    assert out.exit_code != 0 and "no index in a tasks file" in out.output


# --- what an agent with a simulated user records reaches the export ------------------------


class ConversingAgent:
    """Calls the reference actions and records the conversation as an agent with a simulated
    user does (``meta``: messages with costs and token usage, termination reason, caps, user)."""

    name = "conversing"

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "model": "fake-model", "max_steps": 30, "max_errors": 4}

    def run(self, task: HarnessTask, toolbox: Toolbox, *, seed: int) -> AgentOutput:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "policy"},
            {"role": "assistant", "content": "Hi! How can I help you today?", "cost": 0.0},
            {"role": "user", "content": task.instruction, "cost": 0.002, "usage": {"x": 1}},
        ]
        for i, call in enumerate(task.reference_actions):
            result = toolbox.call(call.name, dict(call.arguments))
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"c{i}",
                            "type": "function",
                            "function": {
                                "name": call.name,
                                "arguments": json.dumps(call.arguments),
                            },
                        }
                    ],
                    "cost": 0.01,
                    "usage": {"prompt_tokens": 100, "completion_tokens": 10},
                }
            )
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": f"c{i}",
                    "content": result.as_text(),
                    "error": not result.ok,
                }
            )
        messages.append(
            {
                "role": "user",
                "content": "###STOP###",
                "cost": 0.001,
                "usage": {"prompt_tokens": 50, "completion_tokens": 2},
            }
        )
        return AgentOutput(
            message="done",
            meta={
                "messages": messages,
                "termination_reason": "user_stop",
                "max_steps": 30,
                "max_errors": 4,
                "user": {
                    "implementation": "user_simulator",
                    "llm": "fake-user",
                    "llm_args": {"temperature": 0.0},
                },
            },
        )


@needs_data
def test_recorded_conversation_costs_caps_and_user_reach_the_export(tmp_path: Path) -> None:
    """The agent's recorded messages become the simulation's (system prompt left out, tool
    calls in tau2's shape), costs are summed per side as tau2 does, token counts are kept,
    and max_steps, max_errors, the termination reason and the user simulator are tau2's."""
    result = run_trials(
        TASKS, agent=ConversingAgent(), trials=1, logs=tmp_path / "logs", tasks=["0"]
    )
    path = export_run(result.folder, "tau2", tmp_path / "t2.json", trust=True)
    results, ok, error = check_format(path)
    assert ok, error
    assert results is not None
    assert (results.info.max_steps, results.info.max_errors) == (30, 4)
    assert results.info.user_info.implementation == "user_simulator"
    assert results.info.user_info.llm == "fake-user"
    assert results.info.agent_info.llm == "fake-model"
    (sim,) = results.simulations
    assert sim.termination_reason == TerminationReason.USER_STOP
    messages = sim.messages or []
    assert not any(isinstance(m, SystemMessage) for m in messages)
    assert isinstance(messages[0], AssistantMessage) and isinstance(messages[1], UserMessage)
    calls = [m for m in messages if isinstance(m, AssistantMessage) and m.tool_calls]
    assert len(calls) == 5
    first = calls[0].tool_calls
    assert first is not None
    assert first[0].name == "find_user_id_by_name_zip"
    assert first[0].arguments == {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}
    assert sim.agent_cost == pytest.approx(0.05)
    assert sim.user_cost == pytest.approx(0.003)
    assert sim.reward_info is not None and sim.reward_info.info is not None
    assert sim.reward_info.info["usage"]["agent"] == {"prompt_tokens": 500, "completion_tokens": 50}
    assert sim.reward_info.reward == 1.0


# --- the real checks, when a tau2-bench checkout is given ----------------------------------


@needs_data
def test_the_real_verify_trajs_checks(tau2_run: Path, tmp_path: Path) -> None:
    """With TAU2_SRC naming a tau2-bench checkout (its requirements installed), tau2's own
    check_format and check_num_trials pass, and check_tasks finds only the tasks not run
    missing; each exported task hashes as tau2's own does."""
    src = os.environ.get("TAU2_SRC")
    if not src:
        pytest.skip("TAU2_SRC does not name a tau2-bench checkout")
    sys.path.insert(0, str(Path(src) / "src"))
    try:
        public = pytest.importorskip("tau2.scripts.leaderboard.verify_trajectories_public")
        from tau2.registry import registry  # type: ignore[import-not-found]
        from tau2.utils.pydantic_utils import get_pydantic_hash  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(Path(src) / "src"))
    path = export_run(tau2_run, "tau2", tmp_path / "t2.json", trust=True)
    results, ok, error = public.check_format(str(path))
    assert ok, error
    assert public.check_num_trials(results) == (True, "")
    ok, error = public.check_tasks(results)
    assert ok or (error.startswith("Missing tasks") and "Extra" not in error)
    theirs = {t.id: t for t in registry.get_tasks_loader("retail")("base")}
    for task in results.tasks:
        assert get_pydantic_hash(task) == get_pydantic_hash(theirs[task.id])


# --- tau2's compute_metrics figures on the export -------------------------------------------

# tau2's WRITE tools in retail (``@is_tool(ToolType.WRITE)`` in src/tau2/domains/retail/
# tools.py at a2c0247); GENERIC: calculate, transfer_to_human_agents; THINK: think; READ: the rest.
TAU2_WRITES = {
    "cancel_pending_order",
    "exchange_delivered_order_items",
    "modify_pending_order_address",
    "modify_pending_order_items",
    "modify_pending_order_payment",
    "modify_user_address",
    "return_delivered_order_items",
}
TAU2_NOT_READ = TAU2_WRITES | {"calculate", "transfer_to_human_agents", "think"}


def tau2_action_metrics(simulations: list[dict[str, Any]]) -> dict[str, int]:
    """tau2's ``compute_metrics`` action and DB counts (src/tau2/metrics/agent_metrics.py at
    a2c0247), re-stated over an exported file's simulations: ``partial_action_reward`` of each
    simulation's ``action_checks`` by tool type, and its ``db_check``."""
    out = dict.fromkeys(
        ("read", "read_correct", "write", "write_correct", "db_match", "db_not_checked"), 0
    )
    for sim in simulations:
        if sim.get("termination_reason") == "infrastructure_error":
            continue
        info = sim.get("reward_info") or {}
        for check in info.get("action_checks") or []:
            kind = check["tool_type"]
            if kind in ("read", "write"):
                out[kind] += 1
                out[f"{kind}_correct"] += bool(check["action_match"])
        db = info.get("db_check")
        if db is None:
            out["db_not_checked"] += 1
        else:
            out["db_match"] += bool(db["db_match"])
    return out


@needs_data
def test_tau2_metrics_read_the_same_action_and_db_figures(tau2_run: Path, tmp_path: Path):
    """The scripted agent calls every gold action: tau2's metrics on the export count each of
    them, read and write as tau2 types them, all correct, and every database matched; the
    reward breakdown gives each component of the basis."""
    path = export_run(tau2_run, "tau2", tmp_path / "t2.json", trust=True)
    data = json.loads(path.read_text())
    gold = {t["id"]: t["evaluation_criteria"]["actions"] for t in json.loads(TASKS.read_text())}
    reads = sum(
        sum(a["name"] not in TAU2_NOT_READ for a in gold[s["task_id"]]) for s in data["simulations"]
    )
    writes = sum(
        sum(a["name"] in TAU2_WRITES for a in gold[s["task_id"]]) for s in data["simulations"]
    )
    assert (reads, writes) == (2 * (4 + 5 + 4), 2 * (1 + 1 + 0))
    assert tau2_action_metrics(data["simulations"]) == {
        "read": reads,
        "read_correct": reads,
        "write": writes,
        "write_correct": writes,
        "db_match": 6,
        "db_not_checked": 0,
    }
    for sim in data["simulations"]:
        info = sim["reward_info"]
        assert info["reward_breakdown"] == {"DB": 1.0, "NL_ASSERTION": 1.0}
        assert [c["action"] for c in info["action_checks"]] == gold[sim["task_id"]]
    _, ok, error = check_format(path)
    assert ok, error


def tau2_module(name: str) -> Any:
    """A module of tau2's own code from the checkout TAU2_SRC names (skips without one, or
    without its requirements installed)."""
    src = os.environ.get("TAU2_SRC")
    if not src:
        pytest.skip("TAU2_SRC does not name a tau2-bench checkout")
    sys.path.insert(0, str(Path(src) / "src"))
    try:
        return pytest.importorskip(name)
    finally:
        sys.path.remove(str(Path(src) / "src"))


@needs_data
def test_the_real_compute_metrics_gives_the_restated_figures(tau2_run: Path, tmp_path: Path):
    """With TAU2_SRC naming a tau2-bench checkout, tau2's own ``compute_metrics`` on the export
    gives the read, write and DB figures :func:`tau2_action_metrics` re-states, every trial
    rewarded, and pass^k as tau2 computes it from the same file."""
    metrics = tau2_module("tau2.metrics.agent_metrics")
    simulation = tau2_module("tau2.data_model.simulation")
    path = export_run(tau2_run, "tau2", tmp_path / "t2.json", trust=True)
    results = simulation.Results.model_validate_json(path.read_text())
    theirs = metrics.compute_metrics(results)
    ours = tau2_action_metrics(json.loads(path.read_text())["simulations"])
    assert (
        theirs.total_read_actions,
        theirs.correct_read_actions,
        theirs.total_write_actions,
        theirs.correct_write_actions,
        theirs.db_match_count,
        theirs.db_not_checked,
    ) == (
        ours["read"],
        ours["read_correct"],
        ours["write"],
        ours["write_correct"],
        ours["db_match"],
        ours["db_not_checked"],
    )
    assert theirs.avg_reward == 1.0 and theirs.pass_hat_ks == {1: 1.0, 2: 1.0}


class SaysDone:
    """Makes no call and says it is done."""

    name = "says-done"

    def config(self) -> dict[str, Any]:
        return {"name": self.name}

    def run(self, task: HarnessTask, toolbox: Toolbox, *, seed: int) -> AgentOutput:
        return AgentOutput(message="All fixed.")


TELECOM_TASKS = Path(__file__).resolve().parents[2] / "tasks" / "telecom" / "tau2_tasks_small.json"


def test_tau2s_own_evaluator_reads_a_telecom_export_as_the_harness_scored_it(tmp_path: Path):
    """With TAU2_SRC naming a tau2-bench checkout with its telecom data, tau2's own
    ``evaluate_simulation`` on the export of telecom runs (the scripted agent, whose user acts
    on the phone, and an agent that does nothing) replays every conversation strictly on its
    own environment and gives the reward, database check, device assertions, action checks
    and breakdown the harness recorded."""
    evaluator = tau2_module("tau2.evaluator.evaluator")
    simulation = tau2_module("tau2.data_model.simulation")
    tasks_module = tau2_module("tau2.data_model.tasks")
    if not (Path(os.environ["TAU2_SRC"]) / "data/tau2/domains/telecom/db.toml").exists():
        pytest.skip("the tau2-bench checkout has no telecom data")
    upstream = {
        t["id"]: tasks_module.Task.model_validate(t)
        for t in json.loads(TELECOM_TASKS.read_text(encoding="utf-8"))
    }
    compared = 0
    for name, agent in (("scripted", "scripted"), ("nothing", SaysDone())):
        result = run_trials("telecom", agent=agent, trials=1, logs=tmp_path / name)
        path = export_run(result.folder, "tau2", tmp_path / f"{name}.json")
        text = path.read_text(encoding="utf-8")
        loaded = simulation.Results.model_validate_json(text)
        for sim, ours in zip(loaded.simulations, json.loads(text)["simulations"], strict=True):
            theirs = evaluator.evaluate_simulation(
                sim,
                upstream[sim.task_id],
                evaluator.EvaluationType.ALL,
                solo_mode=False,
                domain="telecom",
            ).model_dump(mode="json")
            mine = ours["reward_info"]
            for key in ("reward", "db_check", "env_assertions", "reward_breakdown"):
                assert mine.get(key) == theirs.get(key), (sim.task_id, key)
            assert [c["action_match"] for c in mine.get("action_checks") or []] == [
                c["action_match"] for c in theirs.get("action_checks") or []
            ], sim.task_id
            compared += 1
        rewards = [s.reward_info.reward for s in loaded.simulations]
        assert rewards == [1.0] * 20 if name == "scripted" else 0.0 in rewards
    assert compared == 40


class CutShortAgent(ConversingAgent):
    """As :class:`ConversingAgent`, its conversation ended by max_steps."""

    def run(self, task: HarnessTask, toolbox: Toolbox, *, seed: int) -> AgentOutput:
        out = super().run(task, toolbox, seed=seed)
        return AgentOutput(
            message=out.message, meta={**out.meta, "termination_reason": "max_steps"}
        )


@needs_data
def test_a_conversation_cut_short_has_no_checks_as_in_tau2(tmp_path: Path) -> None:
    """tau2 notes "Simulation terminated prematurely" and checks nothing: no db_check, no
    basis, so its metrics count the database as not checked."""
    result = run_trials(TASKS, agent=CutShortAgent(), trials=1, logs=tmp_path / "logs", tasks=["0"])
    path = export_run(result.folder, "tau2", tmp_path / "t2.json", trust=True)
    _, ok, error = check_format(path)
    assert ok, error
    (sim,) = json.loads(path.read_text())["simulations"]
    info = sim["reward_info"]
    assert info["reward"] == 0.0 and info["reward_basis"] is None
    assert info["info"]["note"] == (
        "Simulation terminated prematurely. Termination reason: max_steps"
    )
    assert "db_check" not in info and "action_checks" not in info
    assert tau2_action_metrics([sim])["db_not_checked"] == 1


@needs_data
def test_trials_of_tau2_tasks_get_the_seeds_tau2s_runner_gives_them(tau2_run: Path, tmp_path: Path):
    """tau2's runner seeds Python's random with the run's seed and draws one seed per trial,
    the same for every task; the export carries each trial's seed and the run's."""
    import random

    rng = random.Random(0)  # as random.seed(0), the run's seed (run_trials' default)
    expected = [rng.randint(0, 1000000) for _ in range(2)]
    path = export_run(tau2_run, "tau2", tmp_path / "t2.json", trust=True)
    data = json.loads(path.read_text())
    assert data["info"]["seed"] == 0
    for sim in data["simulations"]:
        assert sim["seed"] == expected[sim["trial"]], sim["task_id"]
    config = json.loads(
        CliRunner().invoke(main, ["report", str(tau2_run), "--json", "--allow-unverified"]).output
    )["config"]
    assert config["seeds"] == "tau2"


@needs_data
def test_a_resumed_tau2_run_keeps_tau2s_seeds(tmp_path: Path):
    """Stopped after its first trial, then resumed: every trial has the seed tau2 gives it."""
    import random

    from harness.runs import resume_run

    def stop(_result: object) -> None:
        raise KeyboardInterrupt

    first = run_trials(
        TASKS,
        agent="scripted",
        trials=2,
        seed=5,
        logs=tmp_path / "logs",
        tasks=["0", "6"],
        progress=stop,
    )
    assert first.interrupted and first.folder is not None
    resume_run(first.folder, suite=TASKS)
    rng = random.Random(5)
    expected = [rng.randint(0, 1000000) for _ in range(2)]
    store = hx_store(first.folder)
    seeds = {(r.task_id, r.trial): r.seed for r in store.trial_rows()}
    store.close()
    assert seeds == {(t, i): expected[i] for t in ("0", "6") for i in range(2)}


def hx_store(folder: Path) -> Any:
    import harness as hx

    return hx.Store(folder / "harness.db")

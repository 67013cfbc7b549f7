"""Replaying episodes: recorded tool reads, state rebuilt from the record, agents re-run.

Three pieces, used by ``harness resume`` and ``harness replay``:

- :class:`RecordingToolbox`: the toolbox trials use. Writes are transactions (recorded by the
  engine); reads go through :meth:`Episode.remember`, so the agent's whole path (what it read,
  what the model said) is in the record and comes back unchanged when the episode resumes.
- :func:`recorded_changes` / :func:`apply_changes`: an episode's effects, from its transaction
  rows, applied to a fresh environment's state (a trial's environment does not outlive its
  process, so a resumed or replayed trial starts from the state its record says it left).
- :func:`replay_episode`: re-runs the verifiers against the recorded final state, and re-runs
  the episode's agent against the record (a :class:`ReplayEpisode` answers every call from it;
  nothing is executed), reporting the first step where the agent and the record differ.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._json import canonical, dumps, loads
from ..action import Action
from ..agents.base import Agent, CallRecord, Toolbox, ToolResult
from ..episode.cursor import REMEMBERED, RecordedStep, call_step, rebuilt_error, recorded_steps
from ..errors import (
    ConfigurationError,
    Diverged,
    EpisodeClosed,
    Escalated,
    HarnessError,
    InvalidArguments,
)
from ..state import DictState, FileState, SQLState
from ..store import EscalationRow, Store, TransactionRow
from ..transaction import observed_changes

__all__ = [
    "RecordingToolbox",
    "ReplayEpisode",
    "ReplayReport",
    "apply_changes",
    "recorded_changes",
    "replay_episode",
]


def _result_data(result: ToolResult) -> dict[str, Any]:
    """A tool result as JSON, its content as text when JSON cannot hold it (as a model reads it)."""
    content = result.content
    try:
        dumps(content)
    except (TypeError, ValueError):
        content = json.dumps(content, default=str)
    return {"ok": result.ok, "content": content, "error": result.error, "kind": result.kind}


class RecordingToolbox(Toolbox):
    """A toolbox whose reads are part of the episode's record.

    Write tools run as transactions, as in :class:`Toolbox`. A read's result is remembered by
    the episode (:meth:`Episode.remember`), so on resume, and in a replay, the agent reads what
    it read the first time; a divergence from the record is raised, not turned into a tool
    result.
    """

    def call(self, name: str, arguments: dict[str, Any] | None = None) -> ToolResult:
        """Call a tool; reads are recorded (and answered from the record on resume)."""
        arguments = dict(arguments or {})
        tool = self.tools.get(name)
        if tool is not None and not isinstance(tool, Action):
            ran: list[ToolResult] = []

            def read() -> dict[str, Any]:
                ran.append(Toolbox.call(self, name, arguments))
                return _result_data(ran[0])

            data = self.episode.remember("read", {"tool": name, "arguments": arguments}, read)
            if not ran:
                self.calls.append(CallRecord(name, arguments, data["ok"], data["kind"], False))
            return ToolResult(data["ok"], data["content"], data["error"], data["kind"])
        result = super().call(name, arguments)
        diverged = getattr(self.episode, "diverged", None)
        if diverged is not None:
            raise diverged
        return result


class RecordEnds(HarnessError):
    """The record stops here: the episode was interrupted in this call (internal to replay)."""


class ReplayEpisode:
    """Stands in for an episode when its agent re-runs against the record; nothing executes.

    Every action call, read and model call is matched against the next recorded step and
    answered with the recorded outcome; the first mismatch raises :class:`Diverged`.

    Args:
        episode_id: the episode replayed.
        steps: its recorded steps (:func:`~harness.episode.cursor.recorded_steps`).
        escalations: its escalations (to raise them again where they were raised).
    """

    def __init__(
        self, episode_id: str, steps: Sequence[RecordedStep], escalations: Sequence[EscalationRow]
    ) -> None:
        self.id = episode_id
        self.steps = list(steps)
        self.at = 0
        self.outcome = "running"
        self.diverged: Diverged | None = None
        self._escalations = {e.txn_id: e for e in escalations}

    def _expect(self, actual: dict[str, Any], same: Callable[[RecordedStep], bool]) -> RecordedStep:
        if self.diverged is not None:
            raise self.diverged
        if self.at >= len(self.steps):
            raise self._diverge(None, {**actual, "step": self.at + 1})
        step = self.steps[self.at]
        if not same(step):
            raise self._diverge(step.describe(), {**actual, "step": step.step})
        self.at += 1
        return step

    def _diverge(self, expected: dict[str, Any] | None, actual: dict[str, Any] | None) -> Diverged:
        step = int((expected or actual or {}).get("step") or self.at + 1)
        self.diverged = Diverged(self.id, step, expected, actual)
        return self.diverged

    def call_mapping(self, action: Action[Any, Any], arguments: dict[str, Any]) -> Any:
        """Answer an action call from the record."""
        if self.diverged is not None:
            raise self.diverged
        if self.outcome != "running":
            raise EpisodeClosed(self.id, self.outcome)
        try:
            model = action.validate_mapping(dict(arguments))
        except InvalidArguments:
            raw = loads(dumps({"args": [], "kwargs": dict(arguments)}))
            self._expect(
                call_step(self.at + 1, action.name, raw),
                lambda s: (
                    s.status == "invalid"
                    and s.name == action.name
                    and canonical(s.arguments) == canonical(raw)
                ),
            )
            raise
        values = action.call_values(model)
        key = action.key_for(model)
        step = self._expect(
            call_step(self.at + 1, action.name, values, key),
            lambda s: s.matches_action(action.name, values, key),
        )
        if step.returned:
            return step.result
        if step.status == "in_doubt":
            raise RecordEnds(f"step {step.step}: the episode was interrupted in this call")
        row = step.row
        assert row is not None
        if row.decision == "escalate":
            esc = self._escalations.get(row.id)
            self.outcome = "escalated"
            raise Escalated(
                esc.id if esc else "?", action.name, row.failure_class or "", row.reason or ""
            )
        if row.decision == "rollback":
            self.outcome = "rolled_back"
        raise rebuilt_error(row)

    def remember(self, what: str, request: Any, compute: Callable[[], Any]) -> Any:
        """The recorded value for ``request`` (``compute`` is never called)."""
        text = canonical(request)
        step = self._expect(
            {"step": self.at + 1, "kind": REMEMBERED, "name": what, "request": request},
            lambda s: s.kind == REMEMBERED and s.name == what and canonical(s.request) == text,
        )
        return step.value

    def finish(self) -> None:
        """Raise :class:`Diverged` if the agent ended before the record does."""
        if self.diverged is None and self.at < len(self.steps):
            raise self._diverge(self.steps[self.at].describe(), None)


# --------------------------------------------------------------------------------------------
# State from the record.
# --------------------------------------------------------------------------------------------


def recorded_changes(rows: Sequence[TransactionRow]) -> dict[str, Any]:
    """The resources an episode's transactions left changed: key -> value after (None: absent).

    Committed and recovered transactions count, and failed ones whose effect remained (their
    row keeps the diff); compensated ones do not. Later writes win.
    """
    out: dict[str, Any] = {}
    for row in sorted(rows, key=lambda r: r.seq):
        if not row.diff or row.status in ("compensated", "abandoned"):
            continue
        for key, change in loads(row.diff).items():
            out[key] = change[1]
    return out


def apply_changes(state: Any, changes: Mapping[str, Any]) -> None:
    """Set each resource of ``state`` to its value in ``changes`` (None: remove it).

    Works for :class:`DictState`, :class:`SQLState` and :class:`FileState` (text files); any
    other adapter needs an ``apply_changes(changes)`` method of its own.

    Raises:
        ConfigurationError: the adapter cannot be written this way.
    """
    if not changes:
        return
    hook = getattr(state, "apply_changes", None)
    if callable(hook):
        hook(changes)
    elif isinstance(state, DictState):
        for key, value in changes.items():
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
    elif isinstance(state, SQLState):
        _apply_sql(state, changes)
    elif isinstance(state, FileState):
        _apply_files(state, changes)
    else:
        raise ConfigurationError(
            f"cannot rebuild the recorded state on {type(state).__name__}: give the adapter an "
            "apply_changes(changes) method (key -> value, None to remove)"
        )


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _apply_sql(state: SQLState, changes: Mapping[str, Any]) -> None:
    conn = state.connection
    conn.execute("BEGIN IMMEDIATE")
    try:
        for key, value in changes.items():
            table, pk = state._split(key)
            if value is None:
                where = " AND ".join(f"{_quote(c)} = ?" for c in table.pk) or "rowid = ?"
                conn.execute(f"DELETE FROM {_quote(table.name)} WHERE {where}", pk)
                continue
            cols = [c for c in table.columns if c in value]
            values = [
                json.dumps(value[c])
                if c in table.json_columns and value[c] is not None
                else value[c]
                for c in cols
            ]
            conn.execute(
                f"INSERT OR REPLACE INTO {_quote(table.name)} ({', '.join(map(_quote, cols))}) "
                f"VALUES ({', '.join('?' for _ in cols)})",
                values,
            )
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _apply_files(state: FileState, changes: Mapping[str, Any]) -> None:
    root = Path(state.root)
    for key, value in changes.items():
        path = root / key
        if value is None:
            path.unlink(missing_ok=True)
        elif isinstance(value, str) and not value.startswith("sha256:"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(value, encoding="utf-8")
        else:
            raise ConfigurationError(
                f"cannot rebuild {key!r} under {root}: the record holds only a digest of its "
                "binary content"
            )


# --------------------------------------------------------------------------------------------
# harness replay
# --------------------------------------------------------------------------------------------


@dataclass
class ReplayReport:
    """What replaying one episode found.

    Attributes:
        episode_id, task_id: the episode and its task.
        steps: the steps in its record.
        replayed: the steps the re-run agent made as recorded.
        divergence: the first step where the agent and the record differ (None: none).
        ended: how the re-run ended (``answered``, ``escalated``, ``rolled_back``,
            ``interrupted``: the record stops in a call the crash cut short, or an error).
        verdict: the verifiers' verdict on the recorded final state, now.
        recorded_verdict: the verdict stored when the trial finished (None: it never did).
        message_matches: whether the agent's final message is the recorded one.
    """

    episode_id: str
    task_id: str | None
    steps: int
    replayed: int
    divergence: Diverged | None
    ended: str
    verdict: dict[str, Any]
    recorded_verdict: dict[str, Any] | None
    message_matches: bool | None
    notes: list[str] = field(default_factory=list)

    @property
    def verdict_matches(self) -> bool | None:
        """Whether the verdict now equals the recorded one (None: nothing recorded)."""
        if self.recorded_verdict is None:
            return None
        return canonical(self.verdict) == canonical(self.recorded_verdict)

    @property
    def ok(self) -> bool:
        """No divergence, and the verdict (when one was recorded) is the same."""
        return self.divergence is None and self.verdict_matches is not False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        d = self.divergence
        return {
            "episode_id": self.episode_id,
            "task_id": self.task_id,
            "steps": self.steps,
            "replayed": self.replayed,
            "divergence": None
            if d is None
            else {"step": d.step, "expected": d.expected, "actual": d.actual, "message": str(d)},
            "ended": self.ended,
            "verdict": self.verdict,
            "recorded_verdict": self.recorded_verdict,
            "verdict_matches": self.verdict_matches,
            "message_matches": self.message_matches,
            "ok": self.ok,
            "notes": self.notes,
        }


def replay_episode(
    folder: str | Path, episode_id: str, *, agent: Agent | None = None
) -> ReplayReport:
    """Re-verify one episode's recorded final state and re-run its agent against its record.

    Args:
        folder: the run folder (``logs/<run>``).
        episode_id: the episode (``harness audit`` lists them).
        agent: the agent to re-run (default: the run's, from its configuration).

    Raises:
        RunNotFound: the folder is not a run folder.
        StoreError: its database is damaged or from a newer harness.
        HarnessError: no such episode in the run; the suite or agent cannot be loaded.
    """
    from verifiers import verify

    from ..audit import open_run
    from .resume import run_agent, run_suite
    from .start import _steps_done, reference_outcome

    with open_run(folder) as run:
        store: Store = run.store
        episode = store.episode(episode_id)
        if episode is None or episode.run_id != run.run.id:
            known = [e.id for e in store.episodes(run.run.id)][:5]
            raise HarnessError(
                f"no episode {episode_id!r} in run {run.run.id} ({run.folder}); "
                f"episodes include: {', '.join(known) or 'none'} (`harness audit {run.folder}`)"
            )
        suite = run_suite(run)
        task = suite.task(episode.task_id or "")
        trial = next((t for t in store.trials(run.run.id) if t.episode_id == episode_id), None)
        rows = store.transactions(episode_id)
        steps = recorded_steps(rows, store.log(episode_id))
        notes: list[str] = []
        # 1. The verifiers against the recorded final state.
        reference = reference_outcome(suite, task)
        env = suite.new_environment()
        try:
            mark = env.state.mark()
            apply_changes(env.state, recorded_changes(rows))
            actual = {k: a for k, (_, a) in observed_changes(env.state, mark).items()}
            committed = [
                (t.action, canonical(loads(t.args)))
                for t in rows
                if t.mutating and t.status in ("committed", "recovered")
            ]
            verdict = verify(
                task,
                actual=actual,
                expected=reference.changes,
                message=trial.message if trial else "",
                state=env.state,
                steps=_steps_done(reference, committed),
            ).to_dict()
            env.state.release(mark)
        finally:
            env.close()
        # 2. The agent against the record.
        agent = agent or run_agent(run)
        replay = ReplayEpisode(episode_id, steps, store.escalations(episode_id=episode_id))
        env = suite.new_environment()
        message: str | None = None
        ended = "answered"
        started = time.perf_counter()
        try:
            toolbox = RecordingToolbox(env.tools, replay, env)  # type: ignore[arg-type]
            try:
                message = agent.run(task, toolbox, seed=trial.seed if trial else 0).message
                replay.finish()
            except Diverged:
                ended = "diverged"
            except RecordEnds as end:
                ended = "interrupted"
                notes.append(f"the record ends in a call a crash cut short ({end})")
            except Escalated:
                ended = "escalated"
            except EpisodeClosed as closed:
                ended = closed.outcome
            except HarnessError as exc:
                ended = f"error: {type(exc).__name__}: {exc}"
            if replay.outcome == "rolled_back" and ended == "answered":
                ended = "rolled_back"
        finally:
            env.close()
        notes.append(f"re-ran in {time.perf_counter() - started:.3f} s")
        return ReplayReport(
            episode_id=episode_id,
            task_id=episode.task_id,
            steps=len(steps),
            replayed=replay.at if replay.diverged is None else replay.diverged.step - 1,
            divergence=replay.diverged,
            ended=ended,
            verdict=verdict,
            recorded_verdict=loads(trial.verdict) if trial and trial.verdict else None,
            message_matches=None if trial is None or message is None else message == trial.message,
            notes=notes,
        )

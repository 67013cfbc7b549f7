"""Actions as LangChain tools, and LangGraph threads as episodes.

Three pieces, for the three things LangChain and LangGraph cannot know about an action:

- :func:`as_tool` (and :func:`as_tools`) makes an ``@hx.action`` a LangChain
  ``StructuredTool`` that a chat model can be bound to and a LangGraph ``ToolNode`` (or
  ``create_react_agent``) can run, parallel tool calls included. Every call is one transaction
  of the episode current where the tool runs. A refused call (invalid arguments, a failed
  precondition, a person's rejection, a failed action) is the tool's answer: a ``ToolMessage``
  with ``status="error"`` and the refusal's text, which the model reads and adapts to.
- One LangGraph thread is one episode: the episode's id is the graph's ``thread_id``
  (``config["configurable"]["thread_id"]``). :func:`invoke` / :func:`ainvoke` run the graph in
  that episode, started on the thread's first run and resumed on every later one (the next
  user turn, or the answer to an interrupt); :func:`episode_for_thread` is the same episode as
  a ``with`` block, for code that drives the graph itself (``stream``, ``astream``).
- An escalation (a call held for a person's approval, or a failure the policy escalates) is a
  LangGraph ``interrupt`` whose value says what is asked: ``escalation_id``, ``action``,
  ``arguments``, ``failure_class``, ``reason``, ``evidence`` and the ``decisions`` a person can
  take. The graph resumes the LangGraph way, with the decision as the resume value::

      graph.invoke(Command(resume={"decision": "approve", "by": "ops@example.com"}), config)

  (``"reject"`` with a ``reason``, or ``"edit"`` with ``"edit": {...arguments...}``). The
  decision is recorded with :meth:`harness.Store.resolve` (hash-chained, who and why) before
  the episode resumes; a decision recorded earlier with ``Store.resolve`` (say, from
  ``harness escalations``) is used as it is, and any resume value then does.

Example (``model`` any chat model with tool calling; ``world`` the state adapter)::

    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from langgraph.types import Command
    from harness.integrations import langchain as hxl

    tools = hxl.as_tools(deposit, withdraw)
    llm = model.bind_tools(tools)
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda s: {"messages": [llm.invoke(s["messages"])]})
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    graph = builder.compile(checkpointer=InMemorySaver())

    config = {"configurable": {"thread_id": "t-42"}}           # the episode is "t-42"
    out = hxl.invoke(graph, {"messages": [("user", "pay 10")]}, config,
                     state=world, store="sqlite:///logs/harness.db")
    if "__interrupt__" in out:                                  # a person is asked
        asked = out["__interrupt__"][0].value                   # escalation_id, action, ...
        out = hxl.invoke(graph, Command(resume={"decision": "approve", "by": "ops"}), config,
                         state=world, store="sqlite:///logs/harness.db")

The tools work in any graph that runs them with ``ToolNode`` (LangChain's agent factories do).

Why resuming re-runs nothing: LangGraph re-runs an interrupted node from its start (a
``ToolNode`` runs every tool call of its message again), and the nodes before it come from the
checkpointer. A thread's episode is therefore resumed answering calls by their idempotency keys,
not by their position in the record: a call that committed (in this node or an earlier turn) is
answered with its recorded result and not executed again, the call a person decided on runs
once as decided (approved, edited, or refused as rejected), and anything else runs live
(read-only tools, refused calls). A graph is resumed from its checkpointer, so compile it with
one (``InMemorySaver``, a database saver); without ``langgraph`` installed, an escalation is
raised as :class:`harness.Escalated`.

After a rollback (a failure the policy rolls the episode back for) the episode takes no more
actions: the failing call's answer tells the model, a later call raises
:class:`harness.EpisodeClosed` out of the graph, and the thread cannot be resumed (start a new
thread).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, NoReturn

from langchain_core.tools import StructuredTool, ToolException

from ..action import Action
from ..episode import Episode
from ..errors import ConfigurationError, EpisodeClosed, Escalated
from ..store import EpisodeStatus, EscalationStatus, Store
from ._calls import Answer, acall, call, episode_for

__all__ = [
    "DECISIONS",
    "ThreadEpisode",
    "ainvoke",
    "as_tool",
    "as_tools",
    "episode_for_thread",
    "invoke",
    "record_decisions",
    "thread_episode_id",
]

DECISIONS = ("approve", "reject", "edit")
"""What a person can decide on an escalation (LangChain's human-in-the-loop vocabulary)."""


# --- tools ---
def as_tool(action: Action[Any, Any], *, episode: Episode | None = None) -> StructuredTool:
    """A LangChain tool that runs ``action`` as a transaction of the current episode.

    The tool's name, description and argument schema are the action's (``action.schema``,
    the JSON Schema of its pydantic model): the model sees what ``@hx.action`` derived from the
    signature and docstring, and the harness (not LangChain) validates the arguments, so an
    invalid call is recorded and answered like any refusal. A sync action gets a sync
    ``func`` and a ``coroutine`` (run in a worker thread carrying the episode); an async action
    runs from its ``coroutine`` only, so run its graph with ``ainvoke``/``astream`` (a sync run
    gets a :class:`~harness.ConfigurationError` saying so).

    The tool answers with ``response_format="content_and_artifact"``: the model reads the
    result as text (JSON for values that are not strings), and ``ToolMessage.artifact`` holds
    the value itself. A refusal is a ``ToolMessage`` with ``status="error"`` and the refusal's
    text. An escalation becomes a LangGraph ``interrupt`` (see the module).

    Args:
        action: an ``@hx.action``.
        episode: the episode calls run in (default: the one current where the tool runs, as
            :func:`invoke` and :func:`episode_for_thread` make it).

    Returns:
        A ``StructuredTool`` for ``bind_tools`` and ``ToolNode``.

    Raises:
        ConfigurationError: ``action`` is not an ``@hx.action``.
    """
    if not isinstance(action, Action):
        raise ConfigurationError(
            f"as_tool() takes an @hx.action, not {type(action).__name__}; decorate the tool "
            "function with @hx.action(...) first"
        )

    async def arun(**arguments: Any) -> tuple[str, Any]:
        ep = episode_for(action, episode)
        try:
            answer = await acall(action, arguments, ep)
        except (Escalated, EpisodeClosed) as exc:
            _pause(ep, exc)
        return _told(answer)

    def run(**arguments: Any) -> tuple[str, Any]:
        ep = episode_for(action, episode)
        try:
            answer = call(action, arguments, ep)
        except (Escalated, EpisodeClosed) as exc:
            _pause(ep, exc)
        return _told(answer)

    def run_async_action(**arguments: Any) -> tuple[str, Any]:
        raise ConfigurationError(
            f"action {action.name!r} is async def: its tool runs only in an async graph run "
            "(graph.ainvoke / graph.astream, or harness.integrations.langchain.ainvoke); "
            "make the tool sync to run it from graph.invoke"
        )

    return StructuredTool(
        name=action.name,
        description=action.description or action.name,
        args_schema=action.schema,
        func=run_async_action if action.is_async else run,
        coroutine=arun,
        handle_tool_error=True,
        response_format="content_and_artifact",
    )


def as_tools(*actions: Action[Any, Any], episode: Episode | None = None) -> list[StructuredTool]:
    """:func:`as_tool` for each action, in order (``ToolNode(as_tools(a, b))``)."""
    return [as_tool(a, episode=episode) for a in actions]


def _told(answer: Answer) -> tuple[str, Any]:
    """A call's answer as the tool's (content, artifact); a refusal as a ToolException, which
    the tool (``handle_tool_error=True``) turns into a ToolMessage with status "error"."""
    if not answer.ok:
        raise ToolException(answer.text)
    return answer.text, answer.value


def _pause(ep: Episode, exc: Escalated | EpisodeClosed) -> NoReturn:
    """Stop the graph for a person: a LangGraph interrupt asking about the escalation.

    A call that found the episode paused by another call's escalation (parallel tool calls)
    interrupts for that escalation too, so the node is not answered with a closed episode:
    on resume the node runs again and the call runs then. Anything else is raised as it is.
    """
    if isinstance(exc, EpisodeClosed):
        if exc.outcome != EpisodeStatus.ESCALATED or ep.escalation_id is None:
            raise exc
        escalation_id = ep.escalation_id
    else:
        escalation_id = exc.escalation_id
    try:
        from langgraph.types import interrupt
    except ImportError:  # LangChain without LangGraph: the caller stops the run
        raise exc from None
    asked = _escalation_request(ep.store, ep.id, escalation_id)
    raised_now = _raised_in_this_run(ep.store, ep.id, escalation_id)
    for _ in range(_MAX_STALE_ANSWERS):
        # Raises GraphInterrupt unless the run was resumed with a value for this interrupt.
        answer = interrupt(asked)
        if not raised_now:
            # The escalation was pending when the episode resumed, yet the graph was resumed
            # with a value: the decision was not recorded before the episode resumed.
            raise ConfigurationError(
                f"the graph was resumed with {answer!r} while escalation {escalation_id} of "
                f"episode {ep.id} was still pending in the episode: run the resumed graph with "
                "harness.integrations.langchain.invoke(graph, Command(resume=...), config, "
                "...) or inside episode_for_thread(config, ..., resume=...), which record the "
                "decision before the episode resumes (or record it first with Store.resolve)"
            ) from exc
        # A new escalation in a node resumed with a value: the value answered the node's
        # earlier interrupt (LangGraph matches resume values to interrupts by their order in
        # the node) and is recorded already. Ask again, for this one.
    raise exc  # pragma: no cover - LangGraph runs out of resume values first


# More answers than any node has interrupts: a bound on asking again (see _pause).
_MAX_STALE_ANSWERS = 1000


def _raised_in_this_run(store: Store, episode_id: str, escalation_id: str) -> bool:
    """Whether the escalation was raised after the episode last resumed (or started)."""
    raised = last_resume = -1
    for i, rec in enumerate(store.log(episode_id)):
        if rec.kind == "resume":
            last_resume = i
        elif rec.kind == "escalation" and escalation_id in rec.payload:
            raised = i
    return raised > last_resume


def _escalation_request(store: Store, episode_id: str, escalation_id: str) -> dict[str, Any]:
    """What a person is asked about an escalation: the value of the LangGraph interrupt."""
    found = [e for e in store.escalations(episode_id=episode_id) if e.id == escalation_id]
    if not found:  # pragma: no cover - the episode has just stored it
        return {"escalation_id": escalation_id, "decisions": list(DECISIONS)}
    esc = found[0]
    return {
        "escalation_id": esc.id,
        "episode_id": esc.episode_id,
        "action": esc.action,
        "arguments": esc.args,
        "failure_class": esc.failure_class,
        "reason": esc.reason,
        "evidence": esc.evidence,
        "decisions": list(DECISIONS),
    }


# --- threads as episodes ---
def thread_episode_id(config: Mapping[str, Any] | None) -> str:
    """The episode id of a LangGraph run: its ``config["configurable"]["thread_id"]``.

    Raises:
        ConfigurationError: the config names no thread.
    """
    configurable = (config or {}).get("configurable") or {}
    thread_id = configurable.get("thread_id") if isinstance(configurable, Mapping) else None
    if thread_id is None or thread_id == "":
        raise ConfigurationError(
            "a LangGraph run maps to an episode by its thread: pass a config with "
            'config={"configurable": {"thread_id": "..."}} (and compile the graph with a '
            "checkpointer, e.g. InMemorySaver(), so the thread can be resumed)"
        )
    return str(thread_id)


class ThreadEpisode:
    """The episode of one LangGraph thread, for one run of its graph (see the module).

    Use it as ``with`` (or ``async with``, for async tools and ``ainvoke``); entering it
    records the resume value's decision, if any, then starts the episode (the thread's first
    run) or resumes it, and returns the :class:`~harness.Episode`.
    """

    def __init__(
        self,
        config: Mapping[str, Any] | None,
        *,
        state: Any,
        store: Store | str | None = None,
        resume: Any = None,
        options: dict[str, Any],
    ) -> None:
        if "episode_id" in options:
            raise ConfigurationError(
                "episode_for_thread() takes no episode_id=: the episode is the thread's (its "
                "thread_id), started on the thread's first run and resumed on every later one"
            )
        self.episode_id = thread_episode_id(config)
        self.state = state
        self.store = store if store is not None else "logs/harness.db"
        self.resume_value = resume
        self.options = options
        self.episode: Episode | None = None

    def _open(self) -> Episode:
        if self.episode is not None:
            raise ConfigurationError(f"the episode of thread {self.episode_id} is already open")
        store = self.store if isinstance(self.store, Store) else Store(self.store, create=True)
        try:
            row = store.episode(self.episode_id)
            if row is not None:
                if row.status == EpisodeStatus.ROLLED_BACK:
                    raise EpisodeClosed(self.episode_id, row.status)
                record_decisions(store, self.episode_id, self.resume_value)
        finally:
            if store is not self.store:
                store.close()
        self.episode = Episode(
            state=self.state,
            store=self.store,
            episode_id=self.episode_id,
            resume=row is not None,
            # LangGraph re-runs only the interrupted node: calls are answered by key.
            follow_record=False,
            **self.options,
        )
        return self.episode

    def __enter__(self) -> Episode:
        ep = self._open()
        try:
            ep.__enter__()
        except BaseException:
            self.episode = None
            raise
        return ep

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        ep, self.episode = self.episode, None
        if ep is not None:
            ep.__exit__(et, ev, tb)

    async def __aenter__(self) -> Episode:
        ep = self._open()
        try:
            await ep.__aenter__()
        except BaseException:
            self.episode = None
            raise
        return ep

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        ep, self.episode = self.episode, None
        if ep is not None:
            await ep.__aexit__(et, ev, tb)


def episode_for_thread(
    config: Mapping[str, Any] | None,
    *,
    state: Any,
    store: Store | str | None = None,
    resume: Any = None,
    **options: Any,
) -> ThreadEpisode:
    """The episode of a LangGraph thread, to run the graph in (``with`` or ``async with``).

    The episode's id is the thread's ``thread_id``: the thread's first run starts it, every
    later run (the next user message, or the answer to an interrupt) resumes it, so calls that
    committed are answered from the record and never executed twice. A thread whose episode
    was rolled back takes no more runs (:class:`~harness.EpisodeClosed`).

    Args:
        config: the graph's run config (``{"configurable": {"thread_id": ...}}``).
        state: the state adapter the actions change.
        store: a :class:`~harness.Store` or URL (default ``logs/harness.db``, as the episode's).
        resume: the resume value of the run, when it answers an interrupt (the
            ``Command(resume=...)``, or its value): a decision
            ``{"decision": "approve"|"reject"|"edit", "by": ..., "reason": ..., "edit": {...}}``
            recorded on the thread's pending escalations before the episode resumes, or a
            mapping of escalation ids to decisions.
        **options: passed to :class:`~harness.Episode` (``policy``, ``clock``, ``actions``,
            ``run_id``, ``meta``, ...).

    Returns:
        A context manager whose ``with`` gives the :class:`~harness.Episode`.

    Raises:
        ConfigurationError: the config names no thread, or the resume value is not a decision.
    """
    return ThreadEpisode(config, state=state, store=store, resume=resume, options=options)


def _is_command(value: Any) -> bool:
    try:
        from langgraph.types import Command
    except ImportError:  # pragma: no cover - LangChain without LangGraph
        return False
    return isinstance(value, Command)


def record_decisions(store: Store, episode_id: str, resume: Any) -> list[str]:
    """Record the decision a resume value carries on the episode's pending escalations.

    Args:
        store: the store holding the episode.
        episode_id: the thread's episode.
        resume: a ``Command(resume=...)`` or its value: one decision (for every pending
            escalation of the episode; there is usually one), or a mapping of escalation ids
            to decisions. Escalations already resolved are left as they are.

    Returns:
        The ids of the escalations resolved now.

    Raises:
        ConfigurationError: an escalation is pending and the value is not a decision.
    """
    if _is_command(resume):
        resume = resume.resume
    if resume is None:
        return []
    escalations = store.escalations(episode_id=episode_id)
    pending = [e.id for e in escalations if e.status == EscalationStatus.PENDING]
    if not pending:
        return []
    if isinstance(resume, Mapping) and resume and set(resume) <= {e.id for e in escalations}:
        decisions = {esc: resume[esc] for esc in resume if esc in pending}
    else:
        decisions = dict.fromkeys(pending, resume)
    for esc_id, decision in decisions.items():
        kind, by, reason, edit = _decision(decision, esc_id)
        store.resolve(esc_id, kind, by=by, reason=reason, edit=edit)
    return list(decisions)


def _decision(value: Any, escalation_id: str) -> tuple[str, str, str, Mapping[str, Any] | None]:
    """(decision, by, reason, edit) from a resume value; a clear error for anything else."""
    how = (
        'resume with Command(resume={"decision": "approve" | "reject" | "edit", '
        '"by": "who decided", "reason": "why", "edit": {...arguments, for edit...}})'
    )
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"escalation {escalation_id} is waiting for a person's decision, and the graph "
            f"was resumed with {value!r}: {how}, or record the decision with Store.resolve "
            "before resuming"
        )
    kind = value.get("decision", value.get("type"))
    by = value.get("by")
    edit = value.get("edit", value.get("args"))
    if kind not in DECISIONS:
        raise ConfigurationError(
            f"escalation {escalation_id}: the decision {kind!r} is not one of {DECISIONS}; {how}"
        )
    if not isinstance(by, str) or not by:
        raise ConfigurationError(
            f"escalation {escalation_id}: say who decided with a non-empty 'by'; {how}"
        )
    if kind == "edit" and not isinstance(edit, Mapping):
        raise ConfigurationError(
            f"escalation {escalation_id}: an edit needs the arguments to run instead, "
            f"as 'edit': {{...}}; {how}"
        )
    return str(kind), by, str(value.get("reason") or ""), edit


def invoke(
    graph: Any,
    input: Any,
    config: Mapping[str, Any],
    *,
    state: Any,
    store: Store | str | None = None,
    **options: Any,
) -> Any:
    """Run ``graph.invoke(input, config)`` in the episode of the config's thread.

    ``input`` may be a ``Command(resume=decision)`` answering the thread's interrupt: the
    decision is recorded first (see :func:`episode_for_thread`). A resume value keyed by
    interrupt id (LangGraph's form for several interrupts) is matched to the escalations
    those interrupts ask about.

    Args:
        graph: a compiled LangGraph graph (with a checkpointer, for interrupts and resume).
        input: the graph's input, or a ``Command``.
        config: the run config, naming the thread.
        state: the state adapter the actions change.
        store: a :class:`~harness.Store` or URL.
        **options: passed to :class:`~harness.Episode`.

    Returns:
        What ``graph.invoke`` returns (``"__interrupt__"`` holds the interrupts asking a
        person, each with the escalation as its ``value``).
    """
    resume = (
        _by_escalation(input.resume, _interrupts(graph, config)) if _is_command(input) else None
    )
    with episode_for_thread(config, state=state, store=store, resume=resume, **options):
        return graph.invoke(input, config)


async def ainvoke(
    graph: Any,
    input: Any,
    config: Mapping[str, Any],
    *,
    state: Any,
    store: Store | str | None = None,
    **options: Any,
) -> Any:
    """:func:`invoke` for ``graph.ainvoke`` (async tools, async models)."""
    resume = (
        _by_escalation(input.resume, await _ainterrupts(graph, config))
        if _is_command(input)
        else None
    )
    async with episode_for_thread(config, state=state, store=store, resume=resume, **options):
        return await graph.ainvoke(input, config)


def _interrupts(graph: Any, config: Mapping[str, Any]) -> list[Any]:
    """The thread's pending interrupts (none when the graph cannot say)."""
    try:
        return list(graph.get_state(config).interrupts)
    except Exception:  # no checkpointer, or an async-only one
        return []


async def _ainterrupts(graph: Any, config: Mapping[str, Any]) -> list[Any]:
    try:
        return list((await graph.aget_state(config)).interrupts)
    except Exception:  # no checkpointer
        return []


def _by_escalation(value: Any, interrupts: Iterable[Any]) -> Any:
    """A resume value keyed by interrupt ids, keyed by the escalations those interrupts ask
    about instead (any other value as it is)."""
    if not isinstance(value, Mapping) or not value:
        return value
    asked = {
        i.id: i.value["escalation_id"]
        for i in interrupts
        if isinstance(i.value, Mapping) and "escalation_id" in i.value
    }
    if not set(value) <= set(asked):
        return value
    return {asked[k]: v for k, v in value.items()}

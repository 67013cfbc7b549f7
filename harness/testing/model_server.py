"""A scripted OpenAI-compatible chat-completions server on loopback, for tests.

``FakeChatServer`` answers ``POST /v1/chat/completions`` as vLLM, llama.cpp or Ollama would,
from a script: a policy callable ``(request) -> assistant message`` or a list of canned
messages. It records every request it receives (the tools offered, the tool results sent back,
the seed, the headers), checks them as a strict server would (an unknown ``tool_call_id`` or a
missing ``messages`` is a 400), and injects failures on demand (HTTP 500 or 429, a dropped
connection, a slow answer). With ``latency`` it answers every request after a fixed wait, as a
model takes time to answer (many requests wait at once, each on its own thread). A reply may
call several tools at once (``tool_reply(("a", {...}), ("b", {...}))``), as models with
parallel tool calling do.
``ReplayPolicy`` plays a task's reference actions, one tool call per turn, then answers with the
task's required outputs, so a whole suite can run with
:class:`~harness.agents.openai.OpenAIAgent` and no model::

    from harness.testing.model_server import FakeChatServer, ReplayPolicy

    with FakeChatServer(ReplayPolicy(suite.tasks)) as server:
        agent = OpenAIAgent(base_url=server.base_url, model="fake")
        output = agent.run(task, toolbox, seed=0)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal

from ..errors import ConfigurationError
from ..suite import Task

__all__ = [
    "ChatPolicy",
    "Failure",
    "FakeChatServer",
    "ReplayPolicy",
    "text_reply",
    "tool_call",
    "tool_reply",
]

ChatPolicy = Callable[[dict[str, Any]], dict[str, Any]]
"""A script: the request's JSON in, the assistant message to answer with out."""

CallSpec = tuple[str, dict[str, Any] | str] | tuple[str] | dict[str, Any]


def tool_call(
    name: str, arguments: dict[str, Any] | str | None = None, *, id: str = ""
) -> dict[str, Any]:
    """One entry of a message's ``tool_calls``.

    Args:
        name: the tool to call.
        arguments: a dict (sent as its JSON text) or a string sent as it is (malformed JSON, to
            test how an agent copes).
        id: the call's id (default: the server numbers it).
    """
    text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": text}}
    if id:
        call["id"] = id
    return call


def tool_reply(*calls: CallSpec, content: str | None = None) -> dict[str, Any]:
    """An assistant message calling tools: each call a ``(name, arguments)`` pair or a
    :func:`tool_call` dict."""
    entries = []
    for spec in calls:
        if isinstance(spec, dict):
            entries.append(dict(spec))
        else:
            entries.append(tool_call(spec[0], spec[1] if len(spec) > 1 else None))
    return {"role": "assistant", "content": content, "tool_calls": entries}


def text_reply(content: str) -> dict[str, Any]:
    """An assistant message answering in text (the end of the agent's turn)."""
    return {"role": "assistant", "content": content}


@dataclass(frozen=True)
class Failure:
    """A failure the server injects instead of (or before) answering one request.

    Build one with :meth:`http`, :meth:`rate_limited`, :meth:`disconnect` or :meth:`delay`.
    """

    kind: Literal["status", "disconnect", "delay"]
    status: int = 500
    message: str = "injected failure"
    retry_after: float | None = None
    seconds: float = 0.0

    @classmethod
    def http(cls, status: int = 500, message: str = "injected failure") -> Failure:
        """Answer with HTTP ``status`` and an OpenAI-style error body."""
        return cls("status", status=status, message=message)

    @classmethod
    def rate_limited(cls, retry_after: float | None = None) -> Failure:
        """Answer 429, with a ``Retry-After`` header when given."""
        return cls("status", status=429, message="rate limit exceeded", retry_after=retry_after)

    @classmethod
    def disconnect(cls) -> Failure:
        """Close the connection without answering."""
        return cls("disconnect")

    @classmethod
    def delay(cls, seconds: float) -> Failure:
        """Hold the request ``seconds`` (a slow server), then answer normally."""
        return cls("delay", seconds=seconds)


class _ScriptError(Exception):
    """The script cannot answer this request (a bug in the test, reported as HTTP 500)."""


class _Canned:
    """Canned replies by turn: reply ``i`` answers the request with ``i`` assistant messages."""

    def __init__(self, replies: Sequence[dict[str, Any]]) -> None:
        self.replies = list(replies)

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        turn = sum(1 for m in request.get("messages", []) if m.get("role") == "assistant")
        if turn >= len(self.replies):
            raise _ScriptError(
                f"the script has {len(self.replies)} replies; no reply for turn {turn}"
            )
        return self.replies[turn]


def _tokens(value: Any) -> int:
    """A deterministic stand-in for a token count (about four characters a token)."""
    return max(1, len(json.dumps(value)) // 4)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default listen backlog is 5: hundreds of clients connecting at once (a
    # run with many trials in flight) would have connections dropped and retried a second
    # later. The kernel caps it at net.core.somaxconn.
    request_queue_size = 1024
    fake: FakeChatServer


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    # Kept-alive connections (the openai client's) would otherwise wait on delayed ACKs for
    # every answer written in two parts (headers, then body): about 40 ms a request.
    disable_nagle_algorithm = True

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        fake = self.server.fake
        fake._arrive(self)
        try:
            fake._handle(self, raw)
        finally:
            fake._depart(self)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            model = self.server.fake.model or "fake-model"
            self.server.fake._send(
                self, 200, {"object": "list", "data": [{"id": model, "object": "model"}]}
            )
        else:
            self.server.fake._send(self, 404, _error(f"no route {self.path}", "not_found"))

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read ``requests``, not stderr."""


def _error(message: str, type_: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "code": None}}


class FakeChatServer:
    """A chat-completions server on 127.0.0.1 in a background thread, answering from a script.

    Args:
        script: a policy ``(request JSON) -> assistant message dict`` (see :func:`tool_reply`,
            :func:`text_reply`, :class:`ReplayPolicy`), or a list of canned messages: reply
            ``i`` answers a conversation's turn ``i`` (the number of assistant messages already
            in the request), so a retried request gets the same reply and every conversation
            plays the same script.
        failures: failures injected into the first requests, one per request, in order.
        model: when given, requests for another model get 404 (as vLLM answers).
        api_key: when given, requests without ``Authorization: Bearer <api_key>`` get 401.
        port: 0 picks any free port.
        latency: seconds every chat-completions request waits before it is answered (a model's
            time to answer; injected failures wait too, and a :meth:`Failure.delay` adds to
            it). Requests wait at once, each on its connection's thread, holding no lock, so
            hundreds in flight each take about ``latency``.

    Attributes:
        requests: every request body received, failed ones included, in order.
        headers: the HTTP headers of each of those requests (names in lower case), in order.
        responses: every completion sent, in order.
        errors: what went wrong on the server's side (a malformed request, a script that could
            not answer); a test that expects a clean conversation asserts it is empty.
        arrived: when each of those requests arrived (``time.time()``), in order.
        answered: when each completion was sent (``time.time()``), in the order of
            ``responses``.
        in_flight: requests being answered now (received, their answer not yet sent).
        peak_in_flight: the most requests it was answering at once.
    """

    def __init__(
        self,
        script: ChatPolicy | Iterable[dict[str, Any]],
        *,
        failures: Iterable[Failure] = (),
        model: str | None = None,
        api_key: str | None = None,
        port: int = 0,
        latency: float = 0.0,
    ) -> None:
        if not latency >= 0:  # also refuses NaN
            raise ConfigurationError(
                f"FakeChatServer(latency={latency!r}): latency is seconds, 0 or more"
            )
        self.latency = latency
        self.policy: ChatPolicy = script if callable(script) else _Canned(list(script))
        self.model = model
        self.api_key = api_key
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.responses: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.arrived: list[float] = []
        self.answered: list[float] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self._failures = list(failures)
        self._port = port
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---
    def start(self) -> FakeChatServer:
        """Start listening (``with FakeChatServer(...)`` does this)."""
        if self._server is not None:
            return self
        server = _Server(("127.0.0.1", self._port), _Handler)
        server.fake = self
        self._server = server
        self._stopping.clear()
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and release the port."""
        if self._server is None:
            return
        self._stopping.set()  # delayed answers give up waiting
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeChatServer:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port it listens on."""
        if self._server is None:
            raise RuntimeError("FakeChatServer is not started; use `with FakeChatServer(...)`")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """The API root to give a client, e.g. ``http://127.0.0.1:PORT/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    # --- scripting and inspection ---
    def fail_next(self, *failures: Failure) -> None:
        """Inject ``failures`` into the next requests, one per request."""
        with self._lock:
            self._failures[:0] = failures

    def clear_failures(self) -> None:
        """Drop the failures not injected yet: the server answers every request again."""
        with self._lock:
            self._failures.clear()

    @property
    def last_request(self) -> dict[str, Any]:
        """The most recent request body."""
        if not self.requests:
            raise LookupError("FakeChatServer has received no request")
        return self.requests[-1]

    def tool_results(self, request: int = -1) -> list[dict[str, Any]]:
        """The ``tool`` messages in a request (default the last): what the tools gave back."""
        return [m for m in self.requests[request].get("messages", []) if m.get("role") == "tool"]

    # --- serving ---
    def _arrive(self, handler: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.arrived.append(time.time())
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            handler._hx_in_flight = True  # type: ignore[attr-defined]

    def _depart(self, handler: BaseHTTPRequestHandler) -> None:
        """The request is no longer in flight: once, before its answer is written (a client
        that has read the answer may send its next request at once) or when it ends without
        one."""
        with self._lock:
            if getattr(handler, "_hx_in_flight", False):
                handler._hx_in_flight = False  # type: ignore[attr-defined]
                self.in_flight -= 1

    def _send(
        self,
        handler: BaseHTTPRequestHandler,
        status: int,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
    ) -> None:
        data = json.dumps(body).encode("utf-8")
        self._depart(handler)
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(data)
            handler.wfile.flush()
        except OSError:  # the client went away (it timed out): nothing to answer
            handler.close_connection = True

    def _handle(self, handler: BaseHTTPRequestHandler, raw: bytes) -> None:
        try:
            request = json.loads(raw)
        except ValueError:
            request = {"_raw": raw.decode("utf-8", "replace")}
        with self._lock:
            self.requests.append(request)
            self.headers.append({k.lower(): v for k, v in handler.headers.items()})
            failure = self._failures.pop(0) if self._failures else None
        if not handler.path.rstrip("/").endswith("/chat/completions"):
            self._send(handler, 404, _error(f"no route {handler.path}", "not_found"))
            return
        # Waits holding no lock (other requests wait at the same time); a stop ends the wait.
        if self.latency and self._stopping.wait(self.latency):
            handler.close_connection = True
            return
        if failure is not None:
            if failure.kind == "disconnect":
                handler.close_connection = True
                return
            if failure.kind == "status":
                headers = {}
                if failure.retry_after is not None:
                    headers["Retry-After"] = f"{failure.retry_after:g}"
                kind = "rate_limit_exceeded" if failure.status == 429 else "server_error"
                self._send(handler, failure.status, _error(failure.message, kind), headers)
                return
            if self._stopping.wait(failure.seconds):
                handler.close_connection = True
                return
        if self.api_key is not None and (
            handler.headers.get("Authorization") != f"Bearer {self.api_key}"
        ):
            self._send(handler, 401, _error("Incorrect API key provided.", "authentication_error"))
            return
        problem = _check_request(request)
        if problem is not None:
            self._record_error(f"request {len(self.requests) - 1}: {problem}")
            self._send(handler, 400, _error(problem))
            return
        if self.model is not None and request["model"] != self.model:
            self._send(
                handler, 404, _error(f"The model `{request['model']}` does not exist.", "not_found")
            )
            return
        try:
            message = dict(self.policy(request))
        except Exception as exc:  # a script bug: a 500 the test sees, and the reason kept
            self._record_error(f"request {len(self.requests) - 1}: script failed: {exc!r}")
            self._send(handler, 500, _error(f"fake server script failed: {exc}", "server_error"))
            return
        self._send(handler, 200, self._completion(request, message))

    def _record_error(self, text: str) -> None:
        with self._lock:
            self.errors.append(text)

    def _completion(self, request: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            n = len(self.responses)
            message.setdefault("role", "assistant")
            message.setdefault("content", None)
            calls = [dict(c) for c in message.get("tool_calls") or []]
            for i, call in enumerate(calls):
                call.setdefault("id", f"call_{n}_{i}")
                call.setdefault("type", "function")
            if calls:
                message["tool_calls"] = calls
            else:
                message.pop("tool_calls", None)
            prompt, completion = _tokens(request.get("messages")), _tokens(message)
            response = {
                "id": f"chatcmpl-fake-{n}",
                "object": "chat.completion",
                "created": 0,
                "model": request.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if calls else "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            }
            self.responses.append(response)
            self.answered.append(time.time())
        return response


def _check_request(request: Any) -> str | None:
    """What a strict server would refuse in ``request``, or None."""
    if not isinstance(request, dict) or "_raw" in request:
        return "the body is not a JSON object"
    if not isinstance(request.get("model"), str) or not request["model"]:
        return "'model' is required"
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list"
    pending: set[str] = set()
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("system", "user", "assistant", "tool"):
            return f"messages[{i}]: unknown role {role!r}"
        if role == "tool":
            if m.get("tool_call_id") not in pending:
                return f"messages[{i}]: tool_call_id {m.get('tool_call_id')!r} answers no tool call"
            pending.discard(m["tool_call_id"])
            if not isinstance(m.get("content"), str):
                return f"messages[{i}]: a tool message's content must be a string"
            continue
        if pending:
            return f"messages[{i}]: tool calls {sorted(pending)} were not answered"
        if role == "assistant":
            for call in m.get("tool_calls") or []:
                function = call.get("function") or {}
                if not call.get("id") or not isinstance(function.get("arguments"), str):
                    return f"messages[{i}]: a tool call needs an id and arguments as a string"
                pending.add(call["id"])
    tools = request.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            return "'tools' must be a list"
        for j, tool in enumerate(tools):
            if not isinstance(tool, dict) or tool.get("type") != "function":
                return f"tools[{j}]: type must be 'function'"
            if not isinstance((tool.get("function") or {}).get("name"), str):
                return f"tools[{j}]: function.name is required"
    if request.get("tool_choice") is not None and not tools:
        return "'tool_choice' is only allowed when 'tools' are given"
    return None


class ReplayPolicy:
    """A script that plays a task's reference actions, then answers with its required outputs.

    Turn ``i`` of a conversation (``i`` assistant messages calling tools so far) calls reference
    action ``i``; after the last one the reply is a text naming every required output (again at
    every later turn, as when a user keeps talking). Given several tasks, it recognises the
    conversation's task by a user message (the task's instruction, which is also what a
    :class:`~harness.agents.user.ScriptedUser` without replies says first), so one server
    serves a whole suite.

    It plays the user too, for a conversation with a model user (``OpenAIUser``, tau2's user
    simulator) on the same server: a request whose system prompt holds a task's user scenario
    is the user's, who says the task's instruction first and ``###STOP###`` at every later
    turn.

    Args:
        tasks: a task, or the tasks of a suite.
        final: the text of the last answer, before the required outputs.
    """

    def __init__(self, tasks: Task | Iterable[Task], *, final: str = "Done.") -> None:
        self.tasks = [tasks] if isinstance(tasks, Task) else list(tasks)
        if not self.tasks:
            raise ValueError("ReplayPolicy needs at least one task")
        self.final = final
        self._by_instruction: dict[str, Task] = {}
        for task in self.tasks:
            self._by_instruction.setdefault(task.instruction, task)
        self._scenarios: list[tuple[str, Task]] | None = None

    def user_task(self, request: dict[str, Any]) -> Task | None:
        """The task whose user this request is (its system prompt holds the task's user
        scenario), or None: the request is the agent's."""
        messages = request.get("messages") or [{}]
        system = messages[0].get("content") if messages[0].get("role") == "system" else None
        if not isinstance(system, str):
            return None
        if self._scenarios is None:
            from ..agents.user import scenario_text

            # Longest first: a scenario that is part of another's is not taken for it.
            scenarios = [(scenario_text(t), t) for t in self.tasks]
            self._scenarios = sorted(scenarios, key=lambda st: -len(st[0]))
        return next((task for text, task in self._scenarios if text in system), None)

    def task_for(self, request: dict[str, Any]) -> Task:
        """The task this conversation is about."""
        if len(self.tasks) == 1:
            return self.tasks[0]
        for m in request.get("messages", []):
            if m.get("role") == "user":
                task = self._by_instruction.get(m.get("content") or "")
                if task is not None:
                    return task
        raise LookupError("no task has this conversation's user message as its instruction")

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        user = self.user_task(request)
        if user is not None:
            from ..agents.user import STOP

            # The user's own earlier messages are the assistant's in the user's view.
            said = any(m.get("role") == "assistant" for m in request.get("messages", []))
            return text_reply(STOP if said else user.instruction)
        task = self.task_for(request)
        # Replies that called tools so far: a conversation's greeting and text answers to the
        # user do not move the script on.
        turn = sum(
            1
            for m in request.get("messages", [])
            if m.get("role") == "assistant" and m.get("tool_calls")
        )
        if turn < len(task.reference_actions):
            ref = task.reference_actions[turn]
            return tool_reply(tool_call(ref.name, dict(ref.arguments), id=f"call_{turn}"))
        return text_reply(" ".join([self.final, *task.required_outputs]))

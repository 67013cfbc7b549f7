"""``OpenAIAgent``: a model behind any OpenAI-compatible chat-completions server acts on a task.

It speaks the chat-completions protocol with tool calling (OpenAI, vLLM, llama.cpp's server,
Ollama) through the official ``openai`` client, pointed at the server by ``base_url``: the
task's instruction is the user's single message (there is no user simulator), the toolbox's
tools are offered as functions, and every tool call the model makes goes through
:meth:`Toolbox.call`, so writes run as transactions and refusals come back to the model as tool
results. Several tool calls in one reply run at once, each its own transaction (the episode
attributes each its own changes), and their results go back in the order of the calls. The turn
ends when the model answers without calling a tool, or after ``max_turns``.

Failures of the model server itself (connection refused or dropped, timeouts, HTTP 5xx, 408,
429) are retried here with exponential backoff, honouring the server's ``Retry-After`` (the
client's own retries are off, so every attempt is counted and every wait is ours) and, if they
persist, raised as :class:`ModelServerError`: an infrastructure error, not the agent's failure.
A request the server refuses (HTTP 4xx other than 408 and 429: a wrong model name, a bad key, a
request it cannot parse) is raised at once as :class:`ModelRequestError`, naming the status and
the server's message.

``openai`` is imported when the agent first talks to a server, not by ``import harness``.
``harness.testing.model_server.FakeChatServer`` is a scripted local server to test against.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import tenacity

from .._json import digest
from ..action import ContextExecutor
from ..errors import RETRYABLE_STATUS, ConfigurationError, ModelRequestError, ModelServerError
from ..suite import Task
from .base import AgentOutput, Session, Toolbox, ToolResult, registry

if TYPE_CHECKING:
    import openai

    from ..action import Action
    from ..errors import Diverged

__all__ = ["DEFAULT_SYSTEM_PROMPT", "OpenAIAgent"]

DEFAULT_SYSTEM_PROMPT = (
    "You are a customer-service agent. Act only through the tools you are given: look up what "
    "you need, make changes only with the tools, and follow the policy. When a tool returns an "
    "error, read it and adapt. When you are done, or cannot go further, answer the customer in "
    "plain text without calling a tool."
)
"""The system prompt unless one is given (the environment's ``policy`` text is appended)."""


def _server_message(text: str) -> str:
    """The error message in an error response, in any of the shapes servers use."""
    text = text.strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            for field in ("message", "detail", "error"):
                if isinstance(err.get(field), str):
                    return str(err[field])
        if isinstance(err, str):
            return err
        if isinstance(data.get("detail"), str):
            return str(data["detail"])
    return text[:500]


def _retry_after(headers: Any) -> float | None:
    """The wait a response asks for, in seconds (``retry-after-ms`` or ``Retry-After``), or
    None (absent, or an HTTP date: our own backoff applies)."""
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name) if headers is not None else None
        if value:
            try:
                return max(float(value) / divisor, 0.0)
            except ValueError:
                continue
    return None


def parse_arguments(raw: Any) -> tuple[dict[str, Any] | None, str | None]:
    """A tool call's arguments as a dict, or the reason they cannot be read.

    Servers send a JSON string (the protocol); some (Ollama) send the object itself.
    """
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, None
    if isinstance(raw, dict):
        return raw, None
    if not isinstance(raw, str):
        return None, f"arguments must be a JSON object, got {type(raw).__name__}"
    try:
        value = json.loads(raw)
    except ValueError as exc:
        return None, f"arguments are not valid JSON ({exc}): {raw[:200]}"
    if not isinstance(value, dict):
        return None, f"arguments must be a JSON object, got {type(value).__name__}: {raw[:200]}"
    return value, None


def _as_text(result: ToolResult) -> str:
    """The result as the model reads it, even when a read tool returned something JSON cannot
    hold (its ``str``), rather than ending the trial on a serialization error."""
    try:
        return result.as_text()
    except (TypeError, ValueError):
        return json.dumps(result.content, default=str)


def _normalized_calls(raw: Any, turn: int) -> list[dict[str, Any]]:
    """The tool calls of a reply as the protocol shapes them, to send back in the history.

    Copies (the recorded response stays as received), with an id and type where a server left
    them out, and arguments as a JSON string where a server sent the object.
    """
    calls: list[dict[str, Any]] = []
    for i, call in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(call, dict):
            continue
        function = call.get("function")
        function = dict(function) if isinstance(function, dict) else {}
        if isinstance(function.get("arguments"), dict):
            function["arguments"] = json.dumps(function["arguments"])
        calls.append(
            {
                "id": call.get("id") or f"call_{turn}_{i}",
                "type": call.get("type") or "function",
                "function": function,
            }
        )
    return calls


class _NotRun(BaseException):
    """A call of a reply left unrun because a call before it raised (an escalation), as a
    reply's calls made one after another would be. A BaseException, so that the toolbox does
    not turn it into a tool result."""


class _Turnstile:
    """Lets the calls of one reply reach the episode in the order of the calls.

    A call's steps that the episode records (a transaction, a remembered read) wait until every
    call before it has finished, so the record holds them in the order of the calls whatever
    thread ran first, and a resumed episode, which makes the calls again in that order, matches
    its record. A call that records nothing (a plain read tool) runs at once.
    """

    def __init__(self, calls: int) -> None:
        self._cond = threading.Condition()
        self._done = [False] * calls
        self._failed: int | None = None  # the first position whose call raised

    def wait(self, position: int) -> None:
        """Return once every call before ``position`` has finished; :class:`_NotRun` when one
        of them raised."""
        with self._cond:
            self._cond.wait_for(lambda: all(self._done[:position]))
            if self._failed is not None and self._failed < position:
                raise _NotRun

    def done(self, position: int, *, failed: bool) -> None:
        """The call at ``position`` has finished (``failed``: it raised)."""
        with self._cond:
            self._done[position] = True
            if failed and (self._failed is None or position < self._failed):
                self._failed = position
            self._cond.notify_all()


class _InOrder:
    """The episode as one call of a reply sees it: what it records waits its turn
    (:class:`_Turnstile`); everything else is the episode's."""

    def __init__(self, session: Session, turnstile: _Turnstile, position: int) -> None:
        self._session = session
        self._turnstile = turnstile
        self._position = position
        self.id = session.id

    @property
    def diverged(self) -> Diverged | None:
        """The episode's divergence from its record, if any."""
        return self._session.diverged

    def call_mapping(self, action: Action[Any, Any], arguments: dict[str, Any]) -> Any:
        """Run ``action`` in the episode once the calls before this one have finished."""
        self._turnstile.wait(self._position)
        return self._session.call_mapping(action, arguments)

    def remember(self, what: str, request: Any, compute: Callable[[], Any]) -> Any:
        """Remember a value in the episode once the calls before this one have finished."""
        self._turnstile.wait(self._position)
        return self._session.remember(what, request, compute)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


def _call_in_order(
    toolbox: Toolbox, turnstile: _Turnstile, position: int, name: str, arguments: dict[str, Any]
) -> ToolResult:
    """One call of a reply, on a view of the toolbox whose episode steps wait their turn."""
    view = copy.copy(toolbox)  # shares the tools and the list of calls
    view.episode = _InOrder(toolbox.episode, turnstile, position)
    try:
        result = view.call(name, arguments)
    except BaseException:
        turnstile.done(position, failed=True)
        raise
    turnstile.done(position, failed=False)
    return result


class OpenAIAgent:
    """A model on an OpenAI-compatible chat-completions server, acting through the toolbox.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1`` (``/chat/completions`` is
            appended).
        model: the model name the server knows.
        api_key: sent as a bearer token when given (local servers usually need none; without
            one no ``Authorization`` header is sent).
        temperature: sampling temperature.
        max_turns: model calls per task before the agent gives up.
        timeout: seconds to wait on the server for one request.
        system_prompt: the instructions the model gets first (default
            :data:`DEFAULT_SYSTEM_PROMPT`).
        max_tokens: a cap on each completion, when given.
        attempts: attempts per model call on infrastructure errors, the first included.
        backoff: first wait in seconds between attempts; doubles each attempt.
        max_backoff: cap on one wait (a server's ``Retry-After`` is honoured up to it).
        proxy: an HTTP proxy URL; none by default.
        parallel_tool_calls: run the tool calls of one reply at once, in threads that carry the
            episode (each call its own transaction; the episode runs their transactions one at
            a time); False runs them one after another, in order.
        sleep: how to wait between attempts (``FakeClock().sleep`` in tests).

    Configuration is what is passed in: environment variables (``http_proxy``,
    ``OPENAI_API_KEY``, ``OPENAI_BASE_URL``, ``OPENAI_ORG_ID``, ``OPENAI_PROJECT_ID``) are not
    read.
    """

    name = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        temperature: float = 0.0,
        max_turns: int = 30,
        timeout: float = 120.0,
        system_prompt: str | None = None,
        max_tokens: int | None = None,
        attempts: int = 4,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        proxy: str | None = None,
        parallel_tool_calls: bool = True,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ConfigurationError(
                f"OpenAIAgent(base_url={base_url!r}): give an http(s) URL such as "
                "http://127.0.0.1:8000/v1"
            )
        if not model:
            raise ConfigurationError("OpenAIAgent(model=...): name the model the server serves")
        if max_turns < 1 or attempts < 1:
            raise ConfigurationError("OpenAIAgent: max_turns and attempts must be >= 1")
        if timeout <= 0 or backoff < 0 or max_backoff < 0:
            raise ConfigurationError("OpenAIAgent: timeout must be > 0, backoff waits >= 0")
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.model = model
        self.api_key = api_key
        self.temperature = temperature
        self.max_turns = max_turns
        self.timeout = timeout
        self.system_prompt = DEFAULT_SYSTEM_PROMPT if system_prompt is None else system_prompt
        self.max_tokens = max_tokens
        self.attempts = attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.proxy = proxy
        self.parallel_tool_calls = parallel_tool_calls
        self._sleep = sleep

    def config(self) -> dict[str, Any]:
        """The agent's configuration for the evidence record (the key itself is left out)."""
        return {
            "agent": self.name,
            "base_url": self.base_url,
            "model": self.model,
            "api_key": "set" if self.api_key else None,
            "temperature": self.temperature,
            "max_turns": self.max_turns,
            "timeout": self.timeout,
            "system_prompt": self.system_prompt,
            "max_tokens": self.max_tokens,
            "attempts": self.attempts,
            "backoff": self.backoff,
            "max_backoff": self.max_backoff,
            "proxy": self.proxy,
            "parallel_tool_calls": self.parallel_tool_calls,
        }

    # --- the loop ---
    def run(self, task: Task, toolbox: Toolbox, *, seed: int) -> AgentOutput:
        """Converse with the model until it answers without a tool call, or ``max_turns``.

        Raises:
            ModelServerError: the server kept failing (an infrastructure error).
            ModelRequestError: the server refused a request (4xx).
            Escalated: a tool call was escalated to a person (from :meth:`Toolbox.call`); the
                other calls of the same reply have finished by then.
        """
        client = self._client()
        try:
            return self._converse(client, task, toolbox, seed)
        finally:
            client.close()

    def _converse(
        self, client: openai.OpenAI, task: Task, toolbox: Toolbox, seed: int
    ) -> AgentOutput:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self._system_prompt(toolbox)},
            {"role": "user", "content": task.instruction},
        ]
        calls: list[dict[str, Any]] = []
        usage: dict[str, int] = {}
        meta: dict[str, Any] = {
            "model_calls": calls,
            "model_call_count": 0,
            "usage": usage,
            "tool_calls": 0,
            "malformed_tool_calls": 0,
            "parallel_turns": 0,
            "stop_reason": "max_turns",
        }
        content = ""
        for turn in range(self.max_turns):
            body = self._request_body(messages, toolbox.specs, seed)
            request_digest = digest(body)
            response, attempts = self._recorded_complete(client, toolbox, request_digest, body)
            message, finish_reason = self._message(response)
            calls.append(
                {
                    "request_digest": request_digest,
                    "response": {
                        "id": response.get("id"),
                        "model": response.get("model"),
                        "message": message,
                        "finish_reason": finish_reason,
                        "usage": response.get("usage"),
                    },
                    "attempts": attempts,
                }
            )
            meta["model_call_count"] = len(calls)
            for k, v in (response.get("usage") or {}).items():
                if isinstance(v, int):
                    usage[k] = usage.get(k, 0) + v
            content = message.get("content") or ""
            if not isinstance(content, str):  # some servers send a list of content parts
                content = json.dumps(content)
            tool_calls = _normalized_calls(message.get("tool_calls"), turn)
            if not tool_calls:
                meta["stop_reason"] = "answered"
                return AgentOutput(message=content, claimed_success=True, meta=meta)
            messages.append(
                {"role": "assistant", "content": message.get("content"), "tool_calls": tool_calls}
            )
            results = self._call_tools(tool_calls, toolbox, meta)
            for call, result in zip(tool_calls, results, strict=True):
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": _as_text(result)}
                )
        meta["stop_reason"] = "max_turns"
        return AgentOutput(message=content, claimed_success=False, meta=meta)

    def _system_prompt(self, toolbox: Toolbox) -> str:
        policy = getattr(toolbox.environment, "policy", None)
        if isinstance(policy, str) and policy.strip():
            return f"{self.system_prompt}\n\n# Policy\n\n{policy.strip()}"
        return self.system_prompt

    def _request_body(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], seed: int
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "seed": seed,
        }
        if tools:  # some servers reject an empty tools list or tool_choice without tools
            body["tools"] = tools
            body["tool_choice"] = "auto"
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        return body

    # --- tools ---
    def _call_tools(
        self, tool_calls: list[dict[str, Any]], toolbox: Toolbox, meta: dict[str, Any]
    ) -> list[ToolResult]:
        """Run one reply's tool calls; their results in the order of the calls.

        Several well-formed calls run at once, in :class:`~harness.action.ContextExecutor`
        threads that carry the episode; each write is its own transaction, attributed its own
        changes. What the episode records (transactions, remembered reads) is recorded in the
        order of the calls (:class:`_Turnstile`), so a resumed episode matches its record. When
        a call raises (an escalation), the calls after it record nothing, as if they had been
        made one after another, and the first error in the order of the calls is raised once
        every call has finished.
        """
        meta["tool_calls"] += len(tool_calls)
        refused: dict[int, ToolResult] = {}
        jobs: dict[int, tuple[str, dict[str, Any]]] = {}
        for i, call in enumerate(tool_calls):
            prepared = self._prepare(call, meta)
            if isinstance(prepared, ToolResult):
                refused[i] = prepared
            else:
                jobs[i] = prepared
        outcomes: dict[int, ToolResult | BaseException] = dict(refused)
        if self.parallel_tool_calls and len(jobs) > 1:
            meta["parallel_turns"] += 1
            turnstile = _Turnstile(len(jobs))
            with ContextExecutor(
                max_workers=min(len(jobs), 8), thread_name_prefix="openai-tool"
            ) as pool:
                futures = {
                    i: pool.submit(_call_in_order, toolbox, turnstile, position, *job)
                    for position, (i, job) in enumerate(jobs.items())
                }
                for i, future in futures.items():
                    error = future.exception()
                    outcomes[i] = error if error is not None else future.result()
        else:
            for i, (name, arguments) in jobs.items():
                outcomes[i] = toolbox.call(name, arguments)
        results: list[ToolResult] = []
        for i in range(len(tool_calls)):
            outcome = outcomes[i]
            if isinstance(outcome, BaseException):
                raise outcome  # the first in the order of the calls: never a _NotRun
            results.append(outcome)
        return results

    @staticmethod
    def _prepare(
        call: dict[str, Any], meta: dict[str, Any]
    ) -> tuple[str, dict[str, Any]] | ToolResult:
        """A call's tool name and arguments, or the result telling the model it was malformed."""
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        name = function.get("name")
        if not isinstance(name, str) or not name:
            meta["malformed_tool_calls"] += 1
            return ToolResult(False, error="tool call without a function name", kind="invalid")
        arguments, problem = parse_arguments(function.get("arguments"))
        if arguments is None:
            meta["malformed_tool_calls"] += 1
            return ToolResult(
                False,
                error=f"tool {name!r} not called: {problem}; send the arguments as a JSON object",
                kind="invalid",
            )
        return name, arguments

    # --- the model ---
    @staticmethod
    def _message(response: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        choices = response.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ValueError("response has no choices")
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise ValueError("response's first choice has no message")
        reason = choices[0].get("finish_reason")
        return dict(message), reason if isinstance(reason, str) else None

    def _recorded_complete(
        self, client: openai.OpenAI, toolbox: Toolbox, request_digest: str, body: dict[str, Any]
    ) -> tuple[dict[str, Any], int]:
        """The completion for ``body``, from the episode's record when it has it.

        The response (the server's JSON, as it sent it) is remembered by the episode under the
        request's digest, so an episode resumed (or replayed) gets the model's recorded answers
        and follows the same path without asking the server again.
        """
        response, attempts = toolbox.episode.remember(
            "model_call", request_digest, lambda: list(self._complete(client, body))
        )
        return dict(response), int(attempts)

    def _client(self) -> openai.OpenAI:
        """An ``openai`` client on ``base_url`` that retries nothing itself (we do) and reads
        no environment variable (no proxy but ``proxy``, no key but ``api_key``)."""
        import openai

        http_client = openai.DefaultHttpxClient(
            trust_env=False, proxy=self.proxy, timeout=self.timeout
        )
        return openai.OpenAI(
            base_url=self.base_url,
            # Given, so that OPENAI_API_KEY is not read; never sent without an api_key
            # (see _extra_headers).
            api_key=self.api_key or "no-key",
            organization="",
            project="",
            timeout=self.timeout,
            max_retries=0,
            http_client=http_client,
        )

    def _extra_headers(self) -> dict[str, Any]:
        """Headers left out of each request: no key, no organization, no project."""
        import openai

        omitted: dict[str, Any] = {
            "OpenAI-Organization": openai.Omit(),
            "OpenAI-Project": openai.Omit(),
        }
        if not self.api_key:
            omitted["Authorization"] = openai.Omit()
        return omitted

    def _complete(self, client: openai.OpenAI, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """Ask for one completion, retrying infrastructure errors; the response and tries."""
        errors: list[ModelServerError] = []

        def attempt() -> dict[str, Any]:
            try:
                response = self._post(client, body)
                self._message(response)
                return response
            except ModelServerError as exc:
                errors.append(exc)
                raise
            except ValueError as exc:  # a body that is not a chat completion
                error = ModelServerError(
                    f"model server at {self.url} sent a malformed response: {exc}", url=self.url
                )
                errors.append(error)
                raise error from exc

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=self._wait,
            retry=tenacity.retry_if_exception(
                lambda e: isinstance(e, ModelServerError) and e.transient
            ),
            sleep=self._sleep,
            reraise=True,
        )
        try:
            response: dict[str, Any] = retrying(attempt)
        except ModelRequestError:
            raise
        except ModelServerError as last:
            raise ModelServerError(
                f"model server at {self.url} failed {len(errors)} time(s); last: {last}",
                url=self.url,
                status=last.status,
                attempts=len(errors),
                errors=errors,
            ) from last
        return response, len(errors) + 1

    def _wait(self, state: tenacity.RetryCallState) -> float:
        """Exponential from ``backoff``, capped; at least the server's ``Retry-After``."""
        wait = min(self.backoff * 2 ** (state.attempt_number - 1), self.max_backoff)
        error = state.outcome.exception() if state.outcome is not None else None
        asked = getattr(error, "retry_after", None)
        if isinstance(asked, float):
            wait = max(wait, min(asked, self.max_backoff))
        return float(wait)

    def _post(self, client: openai.OpenAI, body: dict[str, Any]) -> dict[str, Any]:
        """One attempt; the client's errors as :class:`ModelServerError` (or its 4xx subclass).

        The server's JSON is read as it was sent (not through the client's response types,
        which would reshape what some servers send, such as Ollama's arguments as an object).
        """
        import httpx
        import openai

        try:
            # The body as it is: the typed `chat.completions.create` walks the whole
            # conversation to rebuild it on every turn (about 20 ms for a long retail one).
            raw = client.post(
                "/chat/completions",
                body=body,
                cast_to=httpx.Response,
                options={"headers": self._extra_headers()},
            )
            text = raw.text
        except openai.APIStatusError as exc:
            message = _server_message(exc.response.text)
            status = exc.status_code
            if 400 <= status < 500 and status not in RETRYABLE_STATUS:
                raise ModelRequestError(
                    f"model server at {self.url} refused the request: HTTP {status}: {message}",
                    url=self.url,
                    status=status,
                    server_message=message,
                ) from None
            raise ModelServerError(
                f"HTTP {status}: {message}",
                url=self.url,
                status=status,
                retry_after=_retry_after(exc.response.headers),
            ) from None
        except openai.APITimeoutError as exc:
            raise ModelServerError(f"no answer within {self.timeout} s", url=self.url) from exc
        except openai.APIConnectionError as exc:
            cause = exc.__cause__
            if type(cause).__name__ == "ConnectError":  # nothing listening, or no route
                raise ModelServerError(f"cannot reach the server: {cause}", url=self.url) from exc
            raise ModelServerError(
                f"connection failed: {type(cause).__name__}: {cause}", url=self.url
            ) from exc
        except openai.OpenAIError as exc:  # anything else the client raised
            raise ModelServerError(
                f"the client failed: {type(exc).__name__}: {exc}", url=self.url
            ) from exc
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"not JSON ({exc}): {text[:200]!r}") from None
        if not isinstance(value, dict):
            raise ValueError(f"not a JSON object: {text[:200]!r}")
        return value


registry.register("openai", OpenAIAgent)

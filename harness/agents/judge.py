"""Judges: a model that reads a trial's conversation and grades the task's natural-language
assertions (``Task.nl_assertions``), as tau2-bench's NL-assertion evaluator does and as
Inspect's model-graded scorers do for any task.

:class:`OpenAIJudge` asks any OpenAI-compatible chat-completions server (the client, retries
and limits of :class:`~harness.agents.openai.OpenAIAgent`) with tau2's prompt, at temperature 0
and the trial's seed. Its answer is remembered by the trial's episode under the request's
digest (``judge_model_call``), as the user simulator's are, so a resumed or replayed trial gets
the judgement on record and never asks again. A reply that is not the JSON the prompt asks for
is the judge's failure, an infrastructure error of the trial (``harness resume`` asks again in
a new attempt), never a verdict on the agent.

What is taken from tau2-bench (github.com/sierra-research/tau2-bench, commit
``a2c024725189473d2d7cea3a5cfdbcc67478e41f``, MIT licence, notice below):
``src/tau2/evaluator/evaluator_nl_assertions.py`` (``NLAssertionsEvaluator``): the system
prompt (:data:`JUDGE_SYSTEM_PROMPT`, verbatim) and the user prompt (:func:`judge_user_prompt`:
the conversation as ``role: content`` lines, the assertions as Python's list text), and that
the reward is 1 only when every assertion is met; ``src/tau2/config.py``: temperature 0.0.
One difference: tau2 counts whatever grades the reply holds, so a reply that grades fewer
assertions than the task lists can pass; here every assertion of the task must have a grade,
and one the reply leaves out is unmet.

tau2-bench's licence, for the text copied here (``JUDGE_SYSTEM_PROMPT``, the user prompt)::

    MIT License

    Copyright (c) 2025 Sierra Research

    Permission is hereby granted, free of charge, to any person obtaining a copy
    of this software and associated documentation files (the "Software"), to deal
    in the Software without restriction, including without limitation the rights
    to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
    copies of the Software, and to permit persons to whom the Software is
    furnished to do so, subject to the following conditions:

    The above copyright notice and this permission notice shall be included in all
    copies or substantial portions of the Software.

    THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
    IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
    FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
    AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
    LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
    OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
    SOFTWARE.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..errors import ModelServerError
from ..suite import Task
from .base import Session
from .openai import (
    _ChatRole,
)

__all__ = [
    "JUDGE_DEFAULT_BASE_URL",
    "JUDGE_SYSTEM_PROMPT",
    "AssertionCheck",
    "Judge",
    "JudgeReplyError",
    "Judgement",
    "OpenAIJudge",
    "conversation_text",
    "judge_user_prompt",
    "read_grades",
]

JUDGE_SYSTEM_PROMPT = (
    "\n"
    "        TASK\n"
    "        - You will be given a list of expected outcomes and a conversation that was "
    "collected during a test case run.\n"
    "        - The conversation is between an agent and a customer.\n"
    "        - Your job is to evaluate whether the agent satisfies each of the expected "
    "outcomes.\n"
    "        - Grade each expected outcome individually.\n"
    "\n"
    "        FORMAT\n"
    "        - Your response should be a JSON object with the following fields:\n"
    "        - `reasoning`: a short explanation for your classification\n"
    "        - `metExpectation`: `true` if the agent satisfies the expected outcomes, "
    "`false` otherwise\n"
    "        - `expectedOutcome`: repeat the expectation from the input that you are grading\n"
    "        \n"
    "        Example response structure:\n"
    "        {\n"
    '            "results": [\n'
    "                {\n"
    '                    "expectedOutcome": "<one of the expected outcomes from the input>",\n'
    '                    "reasoning": "<reasoning trace>",\n'
    '                    "metExpectation": <false or true>,\n'
    "                }\n"
    "            ]\n"
    "        }\n"
    "        "
)


JUDGE_DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
"""The judge's server when none is named (vLLM's port, as the agent's)."""


def conversation_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The conversation as tau2's judge reads it: one ``role: content`` line per message
    (``None`` for a message without text, as Python prints it), system prompts left out."""
    return "\n".join(
        f"{m.get('role')}: {m.get('content')}" for m in messages if m.get("role") != "system"
    )


def judge_user_prompt(conversation: str, assertions: Sequence[str]) -> str:
    """tau2's user prompt: the conversation, then the assertions as Python's list text."""
    return (
        "\n        conversation:\n"
        f"        {conversation}\n"
        "        \n"
        "        expectedOutcomes:\n"
        f"        {list(assertions)}\n"
        "        "
    )


@dataclass(frozen=True)
class AssertionCheck:
    """One assertion as the judge graded it (tau2's ``NLAssertionCheck``)."""

    nl_assertion: str
    met: bool
    justification: str

    def to_dict(self) -> dict[str, Any]:
        """tau2's shape: ``nl_assertion``, ``met``, ``justification``."""
        return asdict(self)


@dataclass(frozen=True)
class Judgement:
    """A judge's grades of a task's assertions, and what asking cost.

    Attributes:
        checks: one per assertion of the task, in the task's order.
        judge: the judge's configuration (who graded).
        meta: the request's digest, the response's id, model and usage, attempts, seconds.
    """

    checks: tuple[AssertionCheck, ...]
    judge: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def met(self) -> bool:
        """Every assertion was met."""
        return all(c.met for c in self.checks)


class JudgeReplyError(ModelServerError):
    """The judge's reply is not the JSON its prompt asks for: the trial could not be judged
    (an infrastructure error, asked again by ``harness resume``)."""


@runtime_checkable
class Judge(Protocol):
    """What grades a task's assertions on a trial's conversation."""

    name: str

    def config(self) -> dict[str, Any]:
        """What identifies the judge in a run's evidence (never a key)."""
        ...

    def judge(
        self,
        task: Task,
        messages: Sequence[Mapping[str, Any]],
        *,
        session: Session,
        seed: int,
    ) -> Judgement:
        """Grade ``task.nl_assertions`` on ``messages`` (remembered in ``session``)."""
        ...


def _reply_json(content: str) -> Any:
    """The reply's JSON (a fence such as ```json ... ``` around it is taken off)."""
    text = content.strip()
    if text.startswith("```"):
        text = text.split("\n", 1)[1] if "\n" in text else ""
        text = text.rsplit("```", 1)[0]
    return json.loads(text)


def read_grades(content: Any, assertions: Sequence[str]) -> tuple[AssertionCheck, ...]:
    """The grades in a judge's reply, one per assertion, in the task's order: a result whose
    ``expectedOutcome`` repeats an assertion grades it; the others are taken in order for
    the assertions left; an assertion with no result is unmet.

    Raises:
        ValueError: the reply is not ``{"results": [{"expectedOutcome", "reasoning",
            "metExpectation"}, ...]}`` with a true or false ``metExpectation``.
    """
    if not isinstance(content, str):
        raise ValueError("the reply has no text")
    data = _reply_json(content)
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list):
        raise ValueError('the reply is not an object with a "results" list')
    if assertions and not results:
        raise ValueError("the reply grades none of the assertions")
    graded: list[tuple[str, bool, str]] = []
    for i, result in enumerate(results):
        met = result.get("metExpectation") if isinstance(result, dict) else None
        if not isinstance(met, bool):
            raise ValueError(f"results[{i}] has no true or false metExpectation")
        graded.append(
            (str(result.get("expectedOutcome", "")), met, str(result.get("reasoning", "")))
        )
    left = list(range(len(graded)))
    chosen: dict[int, int] = {}
    for a, assertion in enumerate(assertions):
        for g in left:
            if graded[g][0].strip() == assertion.strip():
                chosen[a] = g
                left.remove(g)
                break
    for a in range(len(assertions)):
        if a not in chosen and left:
            chosen[a] = left.pop(0)
    return tuple(
        AssertionCheck(text, graded[chosen[a]][1], graded[chosen[a]][2])
        if a in chosen
        else AssertionCheck(text, False, "the judge gave no grade for it")
        for a, text in enumerate(assertions)
    )


class OpenAIJudge(_ChatRole):
    """A model on an OpenAI-compatible server grading assertions with tau2's prompt.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1``.
        model: the model name the server knows.
        api_key: sent as a bearer token when given (``HARNESS_JUDGE_API_KEY`` on the command
            line).
        temperature: sampling temperature (tau2's 0.0).
        max_tokens: a cap on the completion, when given.
        timeout, request_timeout, attempts, retry_for, backoff, max_backoff,
            max_response_bytes, proxy, sleep, max_in_flight, down_after, down_failures: as
            for :class:`~harness.agents.openai.OpenAIAgent`.
    """

    def config(self) -> dict[str, Any]:
        """The judge's model, server and settings (the key itself is left out)."""
        return self._role_config()

    def request_body(
        self, task: Task, messages: Sequence[Mapping[str, Any]], seed: int
    ) -> dict[str, Any]:
        """The chat-completions request that grades ``task``'s assertions."""
        prompt = judge_user_prompt(conversation_text(messages), task.nl_assertions)
        return self._body(
            [
                {"role": "system", "content": JUDGE_SYSTEM_PROMPT},
                {"role": "user", "content": prompt},
            ],
            seed,
        )

    def judge(
        self,
        task: Task,
        messages: Sequence[Mapping[str, Any]],
        *,
        session: Session,
        seed: int,
    ) -> Judgement:
        """The grades of ``task.nl_assertions``, from the episode's record when it has them.

        Raises:
            JudgeReplyError: the reply is not the JSON the prompt asks for.
            ModelServerError: the server kept failing (an infrastructure error).
            ModelRequestError: the server refused the request (4xx).
        """
        body = self.request_body(task, messages, seed)
        response, attempts, seconds, request_digest = self._ask(session, "judge_model_call", body)
        message, _ = self._message(response)
        try:
            checks = read_grades(message.get("content"), task.nl_assertions)
        except (ValueError, json.JSONDecodeError) as exc:
            raise JudgeReplyError(
                f"the judge ({self.model} at {self.base_url}) did not answer with the JSON its "
                f"prompt asks for ({exc}); the trial could not be judged",
                url=self.base_url,
                attempts=attempts,
            ) from exc
        return Judgement(
            checks=checks,
            judge=self.config(),
            meta={
                "request_digest": request_digest,
                "response": {
                    "id": response.get("id"),
                    "model": response.get("model"),
                    "usage": response.get("usage"),
                },
                "attempts": attempts,
                "seconds": round(seconds, 6),
            },
        )

"""One call of an action on behalf of a framework, told as the framework's model should see it.

Every adapter runs an action the same way: in the episode current in the caller's context (or
the one given), with the arguments the model sent as a mapping. A refusal (invalid arguments, a
failed precondition, a rejection, a failed action) comes back as an :class:`Answer` the adapter
turns into the framework's tool result; an escalation or a closed episode is raised, for the
adapter to stop the run its own way.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from .._json import dumps
from ..action import CURRENT_EPISODE, OPEN_EPISODES, Action
from ..errors import NotInEpisode, refusal

__all__ = ["Answer", "acall", "call", "episode_for"]


@dataclass(frozen=True)
class Answer:
    """What one call gave: its value, or the refusal the model is told about."""

    ok: bool
    value: Any = None
    kind: str | None = None
    message: str = ""

    @property
    def text(self) -> str:
        """The answer as text, for frameworks whose tool results are strings."""
        if not self.ok:
            return f"Error: {self.message}"
        if isinstance(self.value, str):
            return self.value
        return dumps(self.value)


def episode_for(action: Action[Any, Any], episode: Any = None) -> Any:
    """The episode a call runs in: the one given, else the one current in this context."""
    found = episode if episode is not None else CURRENT_EPISODE.get()
    if found is None:
        raise NotInEpisode(action.name, open_elsewhere=len(OPEN_EPISODES))
    return found


def _refused(exc: Exception) -> Answer:
    told = refusal(exc)
    if told is None:
        raise exc
    return Answer(False, kind=told[0], message=told[1])


def call(action: Action[Any, Any], arguments: dict[str, Any], episode: Any = None) -> Answer:
    """Run a sync action with a model's arguments in the episode (see the module)."""
    ep = episode_for(action, episode)
    try:
        return Answer(True, ep.call_mapping(action, dict(arguments)))
    except Exception as exc:
        return _refused(exc)


async def acall(action: Action[Any, Any], arguments: dict[str, Any], episode: Any = None) -> Answer:
    """Run an action from a coroutine: an async one awaited, a sync one in a worker thread
    (with this context, so the episode is current there) so the event loop keeps running."""
    ep = episode_for(action, episode)
    try:
        if action.is_async:
            value = await ep.call_mapping(action, dict(arguments))
        else:
            value = await asyncio.to_thread(ep.call_mapping, action, dict(arguments))
        return Answer(True, value)
    except Exception as exc:
        return _refused(exc)

"""``Episode``: one agent execution, owning its state, store, policy and log.

Inside ``with Episode(...)`` (or ``async with``) every action call is a transaction recorded in
the store. The episode deduplicates by idempotency key, rolls back saga-style (compensating what
it committed, newest first, and verifying the state is back), stores escalations for a person,
and resumes from its records without re-running what was done: calls in doubt after a crash are
settled by probing the state, and re-executed agent code is held to its record
(:mod:`harness.episode.cursor`), getting every recorded outcome back and :class:`Diverged` where it
departs from it.
"""

from .core import Episode, current_episode
from .values import Committed
from .values import InDoubt as InDoubt
from .values import dumps_args as dumps_args

__all__ = ["Committed", "Episode", "current_episode"]

"""Auditing a run: what happened, step by step, and proof the record was not edited.

- :func:`timeline` gives one episode's record as people read it: every action with its
  arguments, outcome, decision and failure class, attempts, timing, the state diff it made and
  its checkpoint, escalations and who resolved them, the verifier's verdict; given what
  verification found, it marks each record that fails where it appears.
- :func:`render_verify` shows what ``Store.verify`` found (:mod:`harness.store.verify`).
- :func:`render_text` and :func:`render_html` show timelines; ``harness audit`` is the command.
- :func:`render_report` is a run's HTML report whose per-task grid opens each trial's timeline.
"""

from .html import render_html, render_report
from .model import (
    episode_summaries,
    pending_escalations,
    timeline,
)
from .terminal import render_text, render_verify

__all__ = [
    "episode_summaries",
    "pending_escalations",
    "render_html",
    "render_report",
    "render_text",
    "render_verify",
    "timeline",
]

"""The tau2-bench telecom domain's data: the agent's database, the user's phone, the policy.

tau2's telecom domain is dual-control: the agent works a CRM database (customers, lines,
plans, devices, bills) and the user a simulated phone (``user_db.toml``: the device and the
user's surroundings). The files in ``data/`` are upstream's, byte for byte (Sierra Research's
tau2-bench, github.com/sierra-research/tau2-bench at commit
``a2c024725189473d2d7cea3a5cfdbcc67478e41f``, ``data/tau2/domains/telecom/``; MIT licence, kept
beside them in ``data/LICENSE``), read with :mod:`importlib.resources`:

- :func:`load_db`: ``db.toml``, the agent's database, parsed;
- :func:`load_user_db`: ``user_db.toml``, the user's phone as a task starts before its
  initialization actions, parsed;
- :func:`policy`: the policy tau2 gives the agent (``get_environment`` with the ``manual``
  policy: ``main_policy.md`` and ``tech_support_manual.md`` in ``<main_policy>`` and
  ``<tech_support_policy>`` elements).
"""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, Final

__all__ = ["DATA", "UPSTREAM_FILES", "load_db", "load_user_db", "policy"]

DATA: Final[Traversable] = resources.files("harness.domains.telecom") / "data"
"""The folder of upstream's telecom files."""

UPSTREAM_FILES: Final = ("db.toml", "user_db.toml", "main_policy.md", "tech_support_manual.md")
"""The files copied from upstream's ``data/tau2/domains/telecom/``."""


def _text(name: str) -> str:
    return DATA.joinpath(name).read_text(encoding="utf-8")


def load_db() -> dict[str, Any]:
    """The agent's database as upstream's ``db.toml`` holds it (a fresh copy each call)."""
    return tomllib.loads(_text("db.toml"))


def load_user_db() -> dict[str, Any]:
    """The user's phone and surroundings as upstream's ``user_db.toml`` holds them (a fresh
    copy each call)."""
    return tomllib.loads(_text("user_db.toml"))


@cache
def policy() -> str:
    """The agent's policy as tau2 composes it (``get_environment(policy_type="manual")``)."""
    return (
        "<main_policy>\n"
        + _text("main_policy.md")
        + "\n</main_policy>\n"
        + "<tech_support_policy>\n"
        + _text("tech_support_manual.md")
        + "\n</tech_support_policy>"
    )

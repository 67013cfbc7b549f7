"""The jinja2 environment of a package's HTML pages: its ``templates`` folder, autoescaped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined


def environment(package: str, **filters: Callable[..., Any]) -> Environment:
    """Templates from ``<package>/templates``: every value escaped, an unknown name an error."""
    env = Environment(
        loader=PackageLoader(package),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(filters)
    return env

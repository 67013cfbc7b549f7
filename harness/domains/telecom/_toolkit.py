"""What upstream's telecom code imports from tau2's framework, as tau2 defines it.

Sierra Research's tau2-bench (MIT licence, kept in ``data/LICENSE``): ``BaseModelNoExtra``,
``DB`` (its hash), ``ToolKitBase``, ``ToolType``, ``is_tool``, ``update_pydantic_model_with_dict``
and the telecom domain's fixed today (2025-02-25). ``logger`` drops upstream's log lines.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

__all__ = [
    "DB",
    "TOOL_ATTR",
    "TOOL_TYPE_ATTR",
    "BaseModelNoExtra",
    "ToolKitBase",
    "ToolType",
    "get_dict_hash",
    "get_today",
    "is_tool",
    "logger",
    "update_pydantic_model_with_dict",
]

TOOL_ATTR = "__tool__"
TOOL_TYPE_ATTR = "__tool_type__"

T = TypeVar("T", bound=BaseModel)


class BaseModelNoExtra(BaseModel):
    model_config = ConfigDict(extra="forbid")


def get_dict_hash(obj: dict[str, Any]) -> str:
    """tau2's hash of a dict: SHA-256 of its sorted JSON (``default=str``)."""
    hash_string = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(hash_string.encode()).hexdigest()


class DB(BaseModelNoExtra):
    """tau2's database base: a pydantic model with a hash of its dump."""

    def get_hash(self) -> str:
        return get_dict_hash(self.model_dump())


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``addict.Dict.update``: nested dicts merged key by key, anything else replaced."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def update_pydantic_model_with_dict(model_instance: T, update_data: dict[str, Any]) -> T:
    """A copy of the model with ``update_data`` merged into its dump, validated again."""
    raw = _merge(model_instance.model_dump(), json.loads(json.dumps(update_data, default=str)))
    return type(model_instance).model_validate(raw)


class ToolType(str, Enum):  # noqa: UP042 (upstream's type)
    READ = "read"
    WRITE = "write"
    THINK = "think"
    GENERIC = "generic"


def is_tool(tool_type: ToolType = ToolType.READ) -> Callable[[Any], Any]:
    """Mark a method as a tool of ``tool_type``."""

    def decorator(func: Any) -> Any:
        setattr(func, TOOL_ATTR, True)
        setattr(func, TOOL_TYPE_ATTR, tool_type)
        return func

    return decorator


class ToolKitBase:
    """A database and the methods marked :func:`is_tool`, in definition order."""

    def __init__(self, db: Any = None) -> None:
        self.db = db

    @classmethod
    def tool_names(cls) -> list[str]:
        """The tools in upstream's order (the class's definition order)."""
        return [name for name, member in vars(cls).items() if getattr(member, TOOL_ATTR, False)]

    @property
    def tools(self) -> dict[str, Callable[..., Any]]:
        return {name: getattr(self, name) for name in self.tool_names()}

    def tool_type(self, tool_name: str) -> ToolType:
        tool_type: ToolType = getattr(getattr(type(self), tool_name), TOOL_TYPE_ATTR)
        return tool_type

    def get_db_hash(self) -> str:
        db_hash: str = self.db.get_hash()
        return db_hash


class _Quiet:
    """Upstream's loguru logger, silent."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


logger: Any = _Quiet()


def get_today() -> datetime.date:
    """The telecom domain's today: 2025-02-25."""
    return datetime.date(2025, 2, 25)

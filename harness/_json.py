"""Canonical JSON: one encoding for hashes, idempotency keys, digests and stored records."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel

__all__ = ["canonical", "digest", "dumps", "loads"]


def _default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    if isinstance(value, bytes):
        return "sha256:" + hashlib.sha256(value).hexdigest()
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


_COMPACT = json.JSONEncoder(default=_default, separators=(",", ":"), ensure_ascii=False)


def dumps(value: Any, **_: Any) -> str:
    """Compact JSON for storage; raises ``TypeError`` for values JSON cannot hold."""
    # One encoder for every call: json.dumps builds a new one whenever options are given.
    return _COMPACT.encode(value)


def canonical(value: Any) -> str:
    """Sorted-key compact JSON: equal values give equal text."""
    return json.dumps(
        value, default=_default, separators=(",", ":"), sort_keys=True, ensure_ascii=False
    )


def digest(value: Any) -> str:
    """sha256 hex of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical(value).encode()).hexdigest()


loads = json.loads

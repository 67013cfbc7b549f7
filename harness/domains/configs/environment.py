"""``ConfigsEnvironment``: one isolated copy of the configuration tree with its tools.

Each environment copies the seed tree shipped in the package (``harness/domains/configs/seed``)
into a folder of its own (a new temporary one unless given) and tracks it with an
:class:`hx.FileState`; the tools read and write the files of that copy only.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, ClassVar

import harness as hx
from harness.domains.base import FolderEnvironment
from harness.domains.configs.actions import build_actions
from harness.domains.configs.formats import parse
from harness.domains.configs.tools import READ_TOOLS, WRITE_TOOLS, ConfigTools

__all__ = ["POLICY", "ConfigsEnvironment", "seed_tree"]

_PACKAGE = "harness.domains.configs"

POLICY: str = resources.files(_PACKAGE).joinpath("policy.md").read_text(encoding="utf-8")
"""The rules an operations agent follows (what the preconditions enforce), in words."""


def seed_tree() -> Traversable:
    """The seed tree shipped in the package."""
    return resources.files(_PACKAGE).joinpath("seed")


def _copy(source: Traversable, target: Path) -> None:
    """Copy a tree that may not be on disk (a zipped install), file by file."""
    target.mkdir(parents=True, exist_ok=True)
    for child in source.iterdir():
        if child.is_dir():
            _copy(child, target / child.name)
        else:
            (target / child.name).write_bytes(child.read_bytes())


class ConfigsEnvironment(FolderEnvironment):
    """A fresh copy of the configuration tree, its state adapter and its tools.

    Args:
        folder: Where the tree goes (created if missing; left in place on :meth:`close`).
            Default: a new temporary folder, removed on :meth:`close`.

    Attributes:
        root: The tree's folder.
        state: The :class:`hx.FileState` over it (resources: relative paths such as
            ``services/search/config.json``, values: file text).
        backend: The plain :class:`ConfigTools` the actions call (its methods are looked up at
            each call: patch one to inject a fault).
        actions: ``{name: hx.Action}`` for the eight write tools.
        tools: ``{name: callable}`` for all fourteen tools: the actions for writes, the plain
            methods for reads.
    """

    TOOL_NAMES: ClassVar[frozenset[str]] = frozenset(READ_TOOLS + WRITE_TOOLS)
    """Every tool name the environment offers (the keys of ``tools``)."""

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        self.root = self._open_folder(folder, "harness-configs-")
        try:
            seed = seed_tree()
            if isinstance(seed, Path):
                shutil.copytree(seed, self.root, dirs_exist_ok=True)
            else:  # pragma: no cover - only for installs that are not plain folders
                _copy(seed, self.root)
            self.state = hx.FileState(self.root)
        except BaseException:
            self._remove_folder()
            raise
        self.backend = ConfigTools(self.root)
        self.actions: dict[str, hx.Action[..., dict[str, Any]]] = build_actions(self.backend)
        self.tools: dict[str, Callable[..., Any]] = {
            **{name: getattr(self.backend, name) for name in READ_TOOLS},
            **self.actions,
        }

    def export(self) -> dict[str, Any]:
        """Every file of the tree, parsed: ``{relative path: content}`` (JSON, INI sections)."""
        return {key: parse(key, text) for key, text in self.state.to_dict().items()}

    def _where(self) -> object:
        return self.root

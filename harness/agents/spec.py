"""Agents named by the user: ``module:Class`` or ``path/to/file.py:Class``.

An agent spec with a colon names a class of the user's code; without one it is a registered
agent's name (``scripted``, ``simulated``, ``openai``). :class:`AgentSpec` parses a spec,
imports what it names and checks the class against the :class:`~harness.agents.Agent` protocol
before a trial starts, so a typo, a missing class or a class that is not an agent is a
:class:`~harness.ConfigurationError` naming the problem and the fix, not a failed run.

- ``module:Class`` is imported as ``python -m`` would from the current directory: the current
  directory comes first on ``sys.path`` while the module is imported, then the installed
  packages.
- ``path/to/file.py:Class`` imports that file (relative to the current directory) as a module of
  its own, with the file's folder first on ``sys.path`` while it is imported (so it may import
  its sibling modules). A run records the file's absolute path, so it resumes from anywhere.

Importing runs the module's code: a spec is imported only when a person names it (``--agent``)
or trusts a run folder's record of it (``--trust-agent``); see
:func:`harness.runs.resume.run_agent`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

from .._json import dumps
from ..errors import ConfigurationError

if TYPE_CHECKING:
    from .base import Agent

__all__ = ["AGENT_SHAPE", "AgentSpec", "is_agent_spec", "recorded_spec", "typed_options"]

AGENT_SHAPE = (
    "an agent is a class with a `name` attribute (a non-empty string), config() returning a "
    "dict, and run(task, toolbox, *, seed) returning an AgentOutput (help(harness.agents.Agent))"
)
"""What an agent class must have, in words (every error about one ends with it)."""


def is_agent_spec(text: str) -> bool:
    """Whether ``text`` names a class of the user's code (it has a colon), not a registered
    agent."""
    return ":" in text


def recorded_spec(text: str) -> str:
    """``text`` as a run records it: a registered name as it is, a spec with its file made
    absolute (so the run resumes from any directory).

    Raises:
        ConfigurationError: a spec that does not parse (:meth:`AgentSpec.parse`).
    """
    return str(AgentSpec.parse(text)) if is_agent_spec(text) else text


def typed_options(agent: str, factory: Any, pairs: Sequence[str]) -> dict[str, Any]:
    """Options given as ``key=value`` text (``--agent-option``), each typed by the annotation
    of ``factory``'s parameter of that name, as :func:`~harness.run_trials` takes
    ``agent_options``: ``int``, ``float``, ``bool`` (true/false, 1/0, yes/no), a ``Literal``,
    ``X | None`` (``null``), and containers as JSON (``[1, 2]``, ``{"a": 1}``). An unannotated
    parameter takes the type of its default, else the text as it is.

    Raises:
        ConfigurationError: a pair without ``=``, a key given twice, a key the factory does not
            take (the error lists those it takes), or a value its type refuses.
    """
    from pydantic import TypeAdapter, ValidationError

    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        signature = None
    try:
        hints = typing.get_type_hints(getattr(factory, "__init__", factory))
    except Exception:  # (an annotation that does not resolve: typed by its default instead)
        hints = {}
    params = dict(signature.parameters) if signature else {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = [
        n
        for n, p in params.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigurationError(
                f"agent option {pair!r}: give it as key=value (--agent-option retries=3)"
            )
        if key in options:
            raise ConfigurationError(f"agent option {key!r} is given twice; give it once")
        if key not in named and not takes_any:
            raise ConfigurationError(
                f"agent {agent!r} takes no option {key!r}; it takes: {', '.join(named) or 'none'}"
            )
        param = params.get(key)
        annotation = hints.get(key, inspect.Parameter.empty)
        if annotation is inspect.Parameter.empty and param is not None:
            default = param.default
            if isinstance(default, bool | int | float):
                annotation = type(default)
        if annotation in (inspect.Parameter.empty, Any, str):
            options[key] = text
            continue
        adapter: TypeAdapter[Any] = TypeAdapter(annotation)
        try:
            options[key] = adapter.validate_strings(text)
        except ValidationError:
            try:
                options[key] = adapter.validate_json(text)
            except ValidationError as exc:
                wanted = getattr(annotation, "__name__", None) or str(annotation)
                first = exc.errors()[0]["msg"] if exc.errors() else str(exc)
                raise ConfigurationError(
                    f"agent {agent!r}: option {key}={text!r} is not of its type, {wanted} ({first})"
                ) from None
    return options


@contextlib.contextmanager
def _first_on_path(folder: Path) -> Iterator[None]:
    """``folder`` first on ``sys.path`` for the duration (as ``python -m`` puts the current
    directory), then ``sys.path`` as it was."""
    entry = str(folder)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)


@dataclass(frozen=True)
class AgentSpec:
    """A parsed ``module:Class`` or ``path/to/file.py:Class``.

    Attributes:
        given: the spec as written.
        target: a dotted module name, or the file's absolute path.
        attr: the class's name in it (dotted for a nested class).
        is_file: whether ``target`` is a file.
    """

    given: str
    target: str
    attr: str
    is_file: bool

    @classmethod
    def parse(cls, text: str) -> AgentSpec:
        """Parse ``text`` (a file path is made absolute against the current directory).

        Raises:
            ConfigurationError: ``text`` does not look like ``module:Class`` or
                ``path/to/file.py:Class``.
        """
        target, _, attr = text.rpartition(":")
        if not target or not all(part.isidentifier() for part in attr.split(".")):
            raise ConfigurationError(
                f"agent {text!r} must look like 'package.module:Class' or "
                "'path/to/file.py:Class' (or be a built-in agent's name: "
                "scripted, simulated, openai)"
            )
        if target.endswith(".py") or "/" in target or os.sep in target:
            path = Path(target).expanduser()
            return cls(text, str(path if path.is_absolute() else Path.cwd() / path), attr, True)
        if not all(part.isidentifier() for part in target.split(".")):
            raise ConfigurationError(
                f"agent {text!r}: {target!r} is neither a module name ('package.module') nor a "
                "Python file ('path/to/file.py')"
            )
        return cls(text, target, attr, False)

    def __str__(self) -> str:
        """The spec as a run records it (a file by its absolute path)."""
        return f"{self.target}:{self.attr}"

    def _module(self) -> ModuleType:
        if self.is_file:
            return self._file_module()
        try:
            with _first_on_path(Path.cwd()):
                return importlib.import_module(self.target)
        except ModuleNotFoundError as exc:
            parts = self.target.split(".")
            if exc.name in {".".join(parts[: i + 1]) for i in range(len(parts))}:
                raise ConfigurationError(
                    f"agent {self.given!r}: no module named {exc.name!r} in the current "
                    f"directory ({Path.cwd()}) or the installed packages; check the spelling, "
                    f"run harness from the folder that holds {parts[0]}.py, or name the file: "
                    f"--agent path/to/{parts[-1]}.py:{self.attr}"
                ) from exc
            raise self._import_error(exc) from exc
        except Exception as exc:
            raise self._import_error(exc) from exc

    def _file_module(self) -> ModuleType:
        path = Path(self.target)
        if not path.is_file():
            raise ConfigurationError(
                f"agent {self.given!r}: no file {path}; give the path of the Python file that "
                f"defines {self.attr} (relative to the current directory, {Path.cwd()})"
            )
        # One module per file: its name depends on the resolved path, so two files named
        # agent.py never meet, and naming the same file again gives the same class.
        resolved = path.resolve()
        name = "_harness_agent_" + hashlib.sha256(str(resolved).encode()).hexdigest()[:16]
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, resolved)
        if spec is None or spec.loader is None:
            raise ConfigurationError(
                f"agent {self.given!r}: {path} cannot be imported as a Python module; name a "
                "file ending in .py"
            )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            with _first_on_path(resolved.parent):
                spec.loader.exec_module(module)
        except BaseException as exc:
            del sys.modules[name]
            if isinstance(exc, Exception):
                raise self._import_error(exc) from exc
            raise
        return module

    def _import_error(self, exc: Exception) -> ConfigurationError:
        where = self.target if self.is_file else f"module {self.target}"
        return ConfigurationError(
            f"agent {self.given!r}: importing {where} raised {type(exc).__name__}: {exc}; fix "
            "the module (or install what it imports) and try again"
        )

    def load(self) -> type:
        """The class the spec names, checked against the agent protocol (nothing is built).

        Raises:
            ConfigurationError: the module or file cannot be imported, has no such name, or
                what it names is not an agent class.
        """
        module = self._module()
        found: Any = module
        for part in self.attr.split("."):
            if not hasattr(found, part):
                classes = sorted(
                    n
                    for n, v in vars(module).items()
                    if isinstance(v, type) and v.__module__ == module.__name__
                )
                where = self.target if self.is_file else f"module {self.target}"
                raise ConfigurationError(
                    f"agent {self.given!r}: {where} has no {self.attr!r}; classes defined "
                    f"there: {', '.join(classes) or 'none'} (the name after the colon is the "
                    "agent's class)"
                )
            found = getattr(found, part)
        if not isinstance(found, type):
            raise ConfigurationError(
                f"agent {self.given!r}: {self.attr} is a {type(found).__name__}, not a class; "
                f"name the agent's class: {AGENT_SHAPE}"
            )
        lacking = [m + "()" for m in ("config", "run") if not callable(getattr(found, m, None))]
        if lacking:
            raise ConfigurationError(
                f"agent {self.given!r}: class {self.attr} is not an agent: it has no "
                f"{' and no '.join(lacking)}; {AGENT_SHAPE}"
            )
        try:
            inspect.signature(cast(Any, found).run).bind(None, None, None, seed=0)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"agent {self.given!r}: {self.attr}.run cannot "
                f"be called as run(task, toolbox, *, seed) ({exc}); {AGENT_SHAPE}"
            ) from None
        return found

    def create(self, options: Mapping[str, Any] | None = None) -> Agent:
        """A new agent of the class the spec names, built with ``options`` and checked.

        Raises:
            ConfigurationError: as :meth:`load`; the class does not take ``options``, its
                ``__init__`` raised, or the agent has no ``name`` or a ``config()`` that is not
                a JSON-ready dict.
        """
        cls = self.load()
        options = dict(options or {})
        try:
            inspect.signature(cls).bind(**options)
        except TypeError as exc:
            raise ConfigurationError(
                f"agent {self.given!r}: {self.attr} cannot be built with options {options} "
                f"({exc}); give its __init__ parameters defaults, or pass them as agent options "
                "(--agent-option key=value on the command line, run_trials(agent_options=...))"
            ) from None
        try:
            agent = cls(**options)
        except Exception as exc:
            raise ConfigurationError(
                f"agent {self.given!r}: {self.attr}({', '.join(options)}) raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        name = getattr(agent, "name", None)
        if not isinstance(name, str) or not name:
            raise ConfigurationError(
                f"agent {self.given!r}: {self.attr} has no `name` (found {name!r}); give the "
                f'class one, e.g. `name = "{self.attr.lower()}"`: it names the agent in the '
                f"run's records; {AGENT_SHAPE}"
            )
        try:
            config = agent.config()
            if not isinstance(config, dict):
                raise TypeError(f"it returned a {type(config).__name__}, not a dict")
            dumps(config)
        except Exception as exc:
            raise ConfigurationError(
                f"agent {self.given!r}: {self.attr}.config() must return a JSON-ready dict "
                f"(the run's evidence records it): {type(exc).__name__}: {exc}"
            ) from exc
        return cast("Agent", agent)

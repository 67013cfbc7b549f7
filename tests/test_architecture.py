"""Architecture rules that import-linter cannot state: private names stay in their package.

A name starting with one underscore (``_ACTIVE``, ``_jsonable``; dunders such as ``__version__``
are public) may be imported only by modules in the same directory as the module that defines
it. Importing a private *module* (``from .. import _json``, ``from .._json import dumps``) is
fine: it is the imported name that counts. The import contracts themselves live in
pyproject.toml under ``[tool.importlinter]`` and are checked by ``lint-imports``.
"""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("harness",)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _source_of(module: str) -> Path | None:
    """The file that defines ``module`` if it belongs to this project, else None."""
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _resolve(path: Path, node: ast.ImportFrom) -> str:
    """The absolute name of the module a ``from ... import`` statement in ``path`` reads."""
    if not node.level:
        return node.module or ""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package.pop()
    if node.level > 1:
        package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, node.module] if node.module else package)


def _parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree. Python 3.11 keeps the AST constructor's depth count per
    interpreter, not per thread, so another thread parsing at the same moment (a traceback
    being formatted parses its source lines) can fail a parse with ``SystemError: AST
    constructor recursion depth mismatch`` (CPython issue 106905): that one is parsed again."""
    source = path.read_text(encoding="utf-8")
    for _ in range(2):
        with contextlib.suppress(SystemError):
            return ast.parse(source, filename=str(path))
    return ast.parse(source, filename=str(path))


def private_imports_across_packages() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = _parsed(path)
            for node in ast.walk(tree):
                if not isinstance(node, ast.ImportFrom):
                    continue
                module = _resolve(path, node)
                source = _source_of(module)
                if source is None or source.parent == path.parent:
                    continue  # another project's module, or the same package
                for alias in node.names:
                    if not _is_private(alias.name):
                        continue
                    if _source_of(f"{module}.{alias.name}") is not None:
                        continue  # a private module, not a private name
                    where = path.relative_to(ROOT).as_posix()
                    found.append(f"{where}:{node.lineno}: {alias.name} from {module}")
    return found


def test_private_names_stay_in_their_package() -> None:
    """No module imports another package's private name (``_x``): what crosses is public."""
    violations = private_imports_across_packages()
    assert not violations, "private names imported from another package:\n" + "\n".join(violations)

"""The two file formats of the configuration tree: JSON and INI, standard library only.

Each format has one writer, so a file a tool writes is byte-for-byte what the seed would hold
for the same content (JSON with two-space indent and a final newline; INI as
:mod:`configparser` writes it, option names kept in their case, no interpolation).
"""

from __future__ import annotations

import configparser
import io
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["IniSections", "dump_ini", "dump_json", "load_ini", "load_json", "parse"]

IniSections = dict[str, dict[str, str]]
"""An INI file's content: section name -> option name -> value (INI values are text)."""


def dump_json(data: Any) -> str:
    """JSON text as every file of the tree is written: indented, key order kept, newline."""
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def load_json(text: str) -> Any:
    """The value of a JSON file's text."""
    return json.loads(text)


def _parser() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keep option case
    return parser


def load_ini(text: str) -> IniSections:
    """The sections of an INI file's text, in file order.

    Raises:
        configparser.Error: the text is not INI.
    """
    parser = _parser()
    parser.read_string(text)
    return {name: dict(parser[name]) for name in parser.sections()}


def dump_ini(sections: Mapping[str, Mapping[str, str]]) -> str:
    """INI text for ``sections``, as :mod:`configparser` writes it."""
    parser = _parser()
    for name, options in sections.items():
        parser[name] = dict(options)
    buffer = io.StringIO()
    parser.write(buffer)
    return buffer.getvalue()


def parse(key: str, text: str) -> Any:
    """A file's content as plain data, chosen by its name: JSON, INI, or the text itself."""
    if key.endswith(".json"):
        return load_json(text)
    if key.endswith(".ini"):
        return load_ini(text)
    return text

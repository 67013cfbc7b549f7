"""The tau2-bench retail database on SQLite: schema, template, fresh copies, export and diffs.

One table per upstream collection (``products``, ``users``, ``orders``), one column per top-level
field of upstream's pydantic models, in upstream's field order (see
:mod:`harness.domains.records`, which does the work for every domain).

A database is made once per process as a *template* (parsed from ``db.json``), and every trial
gets a byte copy of it (:func:`fresh_copy`), which never parses JSON again.

:func:`export` reads a database back into the exact shape of ``db.json``; :func:`changes` and
:func:`changes_fingerprint` compare two exports the way the reference data (``gold.json``) does.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Final

from harness.domains.records import (
    Column,
    Record,
    Tables,
    changes,
    changes_fingerprint,
    connect,
    json_column,
    text_column,
)

__all__ = [
    "DATABASE",
    "DEFAULT_DB_JSON",
    "PRIMARY_KEYS",
    "TABLES",
    "Column",
    "Record",
    "changes",
    "changes_fingerprint",
    "column_names",
    "connect",
    "decode",
    "encode",
    "export",
    "fresh_copy",
    "schema_sql",
    "template_path",
]

_json, _text = json_column, text_column

# Field order is upstream's (tau2 ``domains/retail/data_model.py``); ``db.json`` uses it too.
TABLES: Final[Mapping[str, tuple[Column, ...]]] = {
    "products": (_text("name"), _text("product_id"), _json("variants")),
    "users": (
        _text("user_id"),
        _json("name"),
        _json("address"),
        _text("email"),
        _json("payment_methods"),
        _json("orders"),
    ),
    "orders": (
        _text("order_id"),
        _text("user_id"),
        _json("address"),
        _json("items"),
        _text("status"),
        _json("fulfillments"),
        _json("payment_history"),
        _text("cancel_reason", required=False),
        _json("exchange_items", required=False),
        _json("exchange_new_items", required=False),
        _text("exchange_payment_method_id", required=False),
        Column("exchange_price_difference", "REAL", required=False),
        _json("return_items", required=False),
        _text("return_payment_method_id", required=False),
    ),
}
"""Every table in ``db.json``'s collection order, with its columns in upstream field order."""

PRIMARY_KEYS: Final[Mapping[str, str]] = {
    "products": "product_id",
    "users": "user_id",
    "orders": "order_id",
}
"""The primary-key column of each table (the key of the record in ``db.json``)."""

DEFAULT_DB_JSON: Final[Traversable] = resources.files("harness.domains.retail") / "data" / "db.json"
"""Upstream's ``db.json``, shipped in the package (``harness/domains/retail/data/db.json``)."""

DATABASE: Final = Tables(
    name="retail", tables=TABLES, primary_keys=PRIMARY_KEYS, default_db_json=DEFAULT_DB_JSON
)
"""The retail tables (:class:`harness.domains.records.Tables`)."""

schema_sql = DATABASE.schema_sql
column_names = DATABASE.column_names
encode = DATABASE.encode
decode = DATABASE.decode
build_template = DATABASE.build_template
template_path = DATABASE.template_path
fresh_copy = DATABASE.fresh_copy
export = DATABASE.export

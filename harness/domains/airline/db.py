"""The tau2-bench airline database on SQLite: schema, template, fresh copies, export and diffs.

One table per upstream collection (``flights``, ``users``, ``reservations``), one column per
top-level field of upstream's pydantic models (tau2 ``domains/airline/data_model.py``), in their
field order (see :mod:`harness.domains.records`, which does the work for every domain).

Records are stored as upstream's models dump them (:func:`shape`): a reservation's flights are
``flight_number, origin, destination, date, price`` (``db.json`` writes tau-bench's order,
origin first), so a tool's result reads as upstream's ``model_dump()``. Amounts keep their JSON
type: gift-card and certificate ``amount`` are floats (``98.0``), prices and payments integers.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Final

from harness.domains.records import Column, Record, Tables, json_column, text_column

__all__ = [
    "DATABASE",
    "DEFAULT_DB_JSON",
    "PRIMARY_KEYS",
    "TABLES",
    "Record",
    "reservation_flight",
    "shape",
]


def _int(name: str) -> Column:
    return Column(name, "INTEGER")


_json, _text = json_column, text_column


TABLES: Final[Mapping[str, tuple[Column, ...]]] = {
    "flights": (
        _text("flight_number"),
        _text("origin"),
        _text("destination"),
        _text("scheduled_departure_time_est"),
        _text("scheduled_arrival_time_est"),
        _json("dates"),
    ),
    "users": (
        _text("user_id"),
        _json("name"),
        _json("address"),
        _text("email"),
        _text("dob"),
        _json("payment_methods"),
        _json("saved_passengers"),
        _text("membership"),
        _json("reservations"),
    ),
    "reservations": (
        _text("reservation_id"),
        _text("user_id"),
        _text("origin"),
        _text("destination"),
        _text("flight_type"),
        _text("cabin"),
        _json("flights"),
        _json("passengers"),
        _json("payment_history"),
        _text("created_at"),
        _int("total_baggages"),
        _int("nonfree_baggages"),
        _text("insurance"),
        _text("status", required=False),
    ),
}
"""Every table in ``db.json``'s collection order, with its columns in upstream field order."""

PRIMARY_KEYS: Final[Mapping[str, str]] = {
    "flights": "flight_number",
    "users": "user_id",
    "reservations": "reservation_id",
}
"""The primary-key column of each table (the key of the record in ``db.json``)."""

DEFAULT_DB_JSON: Final[Traversable] = (
    resources.files("harness.domains.airline") / "data" / "db.json"
)
"""Upstream's ``db.json``, shipped in the package (``harness/domains/airline/data/db.json``)."""


def reservation_flight(
    flight_number: str, origin: str, destination: str, date: str, price: int
) -> Record:
    """One flight of a reservation, as upstream's ``ReservationFlight`` dumps it."""
    return {
        "flight_number": flight_number,
        "origin": origin,
        "destination": destination,
        "date": date,
        "price": price,
    }


def shape(table: str, record: Record) -> Record:
    """A record of ``db.json`` as upstream's model dumps it (the order of a reservation's
    flights' fields; the rest is already in model order)."""
    if table != "reservations":
        return record
    return {**record, "flights": [reservation_flight(**f) for f in record["flights"]]}


DATABASE: Final = Tables(
    name="airline",
    tables=TABLES,
    primary_keys=PRIMARY_KEYS,
    default_db_json=DEFAULT_DB_JSON,
    shape=shape,
)
"""The airline tables (:class:`harness.domains.records.Tables`)."""

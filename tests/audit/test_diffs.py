"""Field-level changes: the audit names each field a transaction changed."""

from __future__ import annotations

from harness.audit.diffs import field_changes


def shown(before: object, after: object) -> list[str]:
    return [c.describe() for c in field_changes(before, after)]


def test_a_changed_field_is_named_with_its_path():
    """A nested field that changed is one line with its path, old and new value."""
    before = {"status": "pending", "items": [{"id": 1, "price": 10}], "user": "u1"}
    after = {"status": "cancelled", "items": [{"id": 1, "price": 12}], "user": "u1"}
    assert shown(before, after) == ['.status: "pending" → "cancelled"', ".items[0].price: 10 → 12"]


def test_added_and_removed_fields_and_list_items():
    """Keys and list items that appear or disappear say so, with their value."""
    before = {"payment_history": [{"amount": 5}], "note": "x"}
    after = {"payment_history": [{"amount": 5}, {"amount": -5}], "refund": True}
    assert shown(before, after) == [
        '.payment_history[1]: added {"amount": -5}',
        '.note: removed (was "x")',
        ".refund: added true",
    ]


def test_created_deleted_and_unchanged_resources():
    """A resource that appears or disappears is one change; an equal one is none."""
    assert shown(None, {"a": 1}) == [': created {"a": 1}']
    assert shown({"a": 1}, None) == [': deleted (was {"a": 1})']
    assert shown({"a": [1, 2]}, {"a": [1, 2]}) == []


def test_a_type_change_is_a_change_and_long_values_are_cut():
    """1 and 1.0 differ in a record; a long value is shortened, not printed whole."""
    assert shown({"n": 1}, {"n": 1.0}) == [".n: 1 → 1.0"]
    (line,) = shown({"t": "a"}, {"t": "b" * 200})
    assert line.endswith("…") and len(line) < 100

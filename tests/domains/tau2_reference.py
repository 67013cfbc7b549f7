"""Reading the tau2 reference data of the shared folder beside the repository, and a database's
rows, for the tau2 domains' fidelity tests (retail, airline)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import harness as hx
from harness.domains.records import Tables, changes
from harness.testing import FakeClock

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"

Export = dict[str, dict[str, dict[str, Any]]]
Rows = dict[str, dict[str, tuple[Any, ...]]]


class Reference:
    """One domain's reference folder (``tau2-<domain>``); tests that need it skip when absent."""

    def __init__(self, domain: str) -> None:
        self.folder = SHARED / f"tau2-{domain}"
        self.absent = (
            f"reference data absent: {self.folder} (the shared folder beside the repository)"
        )
        self.needed = pytest.mark.skipif(not self.folder.is_dir(), reason=self.absent)

    def load(self, name: str) -> Any:
        """The file ``name`` of the folder, parsed."""
        return json.loads((self.folder / name).read_text(encoding="utf-8"))

    def params(self, name: str, ident: str) -> list[Any]:
        """One test parameter per record of the file ``name`` (one skipped one when absent),
        each named by ``ident`` formatted with the record and its index ``i``."""
        if not (self.folder / name).exists():
            return [pytest.param(None, marks=pytest.mark.skip(reason=self.absent))]
        return [pytest.param(r, id=ident.format(i=i, **r)) for i, r in enumerate(self.load(name))]


def stored_rows(env: Any, database: Tables) -> Rows:
    """Every row as stored (JSON columns as text), by table and key, in rowid order: cheap to
    read, and equal only if nothing was written."""
    rows: Rows = {}
    for table in database.tables:
        names = database.column_names(table)
        key = names.index(database.primary_keys[table])
        cursor = env.state.connection.execute(
            f"SELECT {', '.join(names)} FROM {table} ORDER BY rowid"
        )
        rows[table] = {row[key]: tuple(row) for row in cursor}
    return rows


class Fresh:
    """A fresh environment's export and stored rows (every fresh copy is identical)."""

    def __init__(self, environment: Any) -> None:
        self.database: Tables = environment.DATABASE
        with environment() as env:
            self.export: Export = env.export()
            self.rows = stored_rows(env, self.database)

    def changes(self, env: Any) -> dict[str, Any]:
        """``changes(fresh export, env.export())``, decoding only the rows whose stored text
        differs (a row stored identically exports identically)."""
        before: Export = {}
        after: Export = {}
        for table, rows in stored_rows(env, self.database).items():
            old = self.rows[table]
            keys = [k for k, row in rows.items() if old.get(k) != row]
            keys += [k for k in old if k not in rows]
            before[table] = {k: self.export[table][k] for k in keys if k in old}
            after[table] = {
                k: {c: v for c, v in self.database.decode(table, rows[k]).items() if v is not None}
                for k in keys
                if k in rows
            }
        return changes(before, after)


def replay(
    env: Any, task: dict[str, Any], failed: tuple[type[BaseException], ...]
) -> tuple[list[bool], list[Any]]:
    """Call each of a gold task's reference actions through ``env.tools``: a failure (one of
    ``failed``) is ok=false, and the replay goes on, as upstream's evaluation does."""
    oks: list[bool] = []
    results: list[Any] = []
    for action in task["actions"]:
        try:
            results.append(env.tools[action["name"]](**json.loads(json.dumps(action["arguments"]))))
            oks.append(True)
        except failed as error:
            if isinstance(error, hx.ActionFailed):
                assert error.decision == "continue", error
            results.append(None)
            oks.append(False)
    return oks, results


def replay_as_gold(
    env: Any, task: dict[str, Any], store: hx.Store, failed: tuple[type[BaseException], ...]
) -> hx.Episode:
    """Replay a gold task's reference actions in an episode: it commits, and every action
    fails or returns exactly as upstream's did. Returns the episode."""
    with hx.Episode(state=env.state, store=store, clock=FakeClock()) as episode:
        oks, results = replay(env, task, failed)
    assert episode.outcome == "committed"
    assert oks == [a["ok"] for a in task["actions"]]
    for action, result in zip(task["actions"], results, strict=True):
        if "result" in action:
            assert result == action["result"], action["name"]
    return episode

"""The witness: every signature the harness makes, mirrored in a file outside the database.

Signatures prove that what a store holds is what was signed, but they live in the store: a
signed run deleted together with its signature rows, or a store rolled back to a copy made
before a run, leaves nothing there to find. A :class:`Witness` is an append-only file kept
elsewhere (another disk, another user, a log shipped off the machine); a
:class:`~harness.store.signing.SigningKey` given one appends a line to it for each signature it
writes. ``harness verify TARGET --witness FILE`` (:func:`check_witness`) then asks the store
for everything the witness saw of it: each witnessed run and episode must still be there, and
each episode's chain must still hold every head the witness saw (a chain only grows, so the
record at the witnessed count must have the witnessed hash).

One line is canonical JSON (sorted keys, one line, ``\\n``-terminated)::

    {"format": "harness.witness", "version": 1, "scope": "run" | "episode",
     "subject": <run or episode id>, "run_id": <its run>, "store": <the store's URL, no
     password, a SQLite file's path absolute>, "digest": <sha256 of the signed message>,
     "heads": {<episode id>: [<record count>, <head hash>], ...}, "key_id": <the key's id>,
     "time": <when it was signed, as the signature row's created_at>, "signature": <the key's
     signature of the line without this field>}

The line is signed whole, rather than carrying the store's signature of the message, so that it
can be checked with the public key without the message (a run's manifest holds every trial's
verdict digest: the line keeps only what the check needs) and so that its store, heads and time
are covered too. Lines are appended with ``O_APPEND`` in one ``write`` each and fsynced, so
processes signing at once (a run's workers, ``harness work`` on the same machine) interleave
whole lines.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from .._json import canonical
from ..errors import ConfigurationError, StoreError
from .signing import PublicKey, SigningKey
from .tables import SignatureRow
from .verify import Finding

if TYPE_CHECKING:
    from .store import Store

__all__ = [
    "WITNESS_FORMAT",
    "Witness",
    "WitnessLine",
    "WitnessReport",
    "check_witness",
    "read_witness",
    "store_identity",
]

WITNESS_FORMAT = "harness.witness"
_VERSION = 1
# Query parameters of a database URL that carry a secret (libpq's names).
_SECRET_PARAMS = frozenset({"password", "sslpassword", "passfile"})


def store_identity(url: str) -> str:
    """The store as the witness names it: ``url`` without its password, a SQLite file's path
    made absolute (so a run signed from one directory is found when verified from another).

    A URL SQLAlchemy does not parse is returned as given.
    """
    text = str(url) if "://" in str(url) else f"sqlite:///{url}"
    try:
        parsed = make_url(text)
    except (ArgumentError, ValueError):
        return text
    secret = [k for k in parsed.query if k.lower() in _SECRET_PARAMS]
    parsed = parsed.difference_update_query(secret)._replace(password=None)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        parsed = parsed._replace(database=os.path.realpath(str(parsed.database)))
    return parsed.render_as_string(hide_password=False)


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class Witness:
    """An append-only file where each signature a :class:`SigningKey` makes is mirrored.

    Give it to the key: ``SigningKey.load(path, witness=Witness("witness.jsonl"))``
    (``harness run --signing-key KEY --witness FILE``). Keep it where whoever can write the
    database cannot rewrite it.

    Args:
        path: the file; created (mode 0600) when missing, appended to otherwise.

    Raises:
        ConfigurationError: ``path`` is a directory, its folder does not exist, or it cannot
            be opened for appending (checked here, before anything is signed).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise ConfigurationError(
                f"witness {self.path} is a directory: give a file (it is created if missing)"
            )
        if not self.path.parent.is_dir():
            raise ConfigurationError(
                f"witness {self.path}: its folder {self.path.parent} does not exist"
            )
        try:
            os.close(self._open())
        except OSError as exc:
            raise ConfigurationError(
                f"witness {self.path} cannot be appended to ({exc.strerror}): give a file you "
                "may write"
            ) from None

    def __repr__(self) -> str:
        return f"Witness({str(self.path)!r})"

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def record(
        self,
        key: SigningKey,
        row: SignatureRow,
        *,
        store: str,
        run_id: str | None,
        heads: Mapping[str, tuple[int, str]],
    ) -> None:
        """Append the line that mirrors ``row`` (one ``write``, fsynced).

        Raises:
            StoreError: the file could not be appended to (the signature is in the store,
                not in the witness).
        """
        body = {
            "format": WITNESS_FORMAT,
            "version": _VERSION,
            "scope": row.scope,
            "subject": row.subject,
            "run_id": run_id,
            "store": store_identity(store),
            "digest": hashlib.sha256(row.message.encode()).hexdigest(),
            "heads": {eid: [count, head] for eid, (count, head) in sorted(heads.items())},
            "key_id": key.key_id,
            "time": row.created_at,
        }
        line = canonical({**body, "signature": key.sign(canonical(body))}) + "\n"
        data = line.encode()
        try:
            fd = self._open()
            try:
                # One write: with O_APPEND the kernel puts it at the end whole, so lines of
                # processes appending at once do not mix. (A short write, on a full disk, is
                # finished rather than left as half a line.)
                written = os.write(fd, data)
                while written < len(data):
                    written += os.write(fd, data[written:])
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StoreError(
                f"cannot append to the witness {self.path} ({exc.strerror}): the signature of "
                f"{row.scope} {row.subject} is in the store but not witnessed"
            ) from None


@dataclass(frozen=True)
class WitnessLine:
    """One line of a witness file, as read.

    Attributes:
        number: its line number (from 1).
        scope: ``run`` or ``episode``.
        subject: the run or episode id.
        run_id: the run it belongs to.
        store: the store that held it (:func:`store_identity`).
        digest: the sha256 of the signed message.
        heads: each episode it covers, ``{episode_id: (record count, head hash)}``.
        key_id: the id of the key that signed.
        time: when it was signed.
        signature: the key's signature of the line without it.
        body: the text that signature covers.
    """

    number: int
    scope: str
    subject: str
    run_id: str | None
    store: str
    digest: str
    heads: Mapping[str, tuple[int, str]]
    key_id: str
    time: float
    signature: str
    body: str

    @classmethod
    def parse(cls, number: int, text: str) -> WitnessLine:
        """The line ``text`` (line ``number``).

        Raises:
            ValueError: it is not a witness line (the reason is the message).
        """
        try:
            data = json.loads(text)
        except ValueError:
            raise ValueError("not JSON") from None
        if not isinstance(data, dict) or data.get("format") != WITNESS_FORMAT:
            raise ValueError(f"not a {WITNESS_FORMAT} record")
        if data.get("version") != _VERSION:
            raise ValueError(f"version {data.get('version')!r}, not {_VERSION}")
        signature = data.pop("signature", None)
        strings = ("scope", "subject", "store", "digest", "key_id")
        if not isinstance(signature, str) or any(not isinstance(data.get(k), str) for k in strings):
            raise ValueError(f"one of signature, {', '.join(strings)} is missing or not text")
        if data["scope"] not in ("run", "episode"):
            raise ValueError(f"scope {data['scope']!r} is neither run nor episode")
        run_id, when, raw = data.get("run_id"), data.get("time"), data.get("heads")
        if run_id is not None and not isinstance(run_id, str):
            raise ValueError("its run_id is not text")
        if not isinstance(when, int | float) or isinstance(when, bool):
            raise ValueError("its time is not a number")
        if not isinstance(raw, dict):
            raise ValueError("its heads are not an object")
        heads: dict[str, tuple[int, str]] = {}
        for eid, head in raw.items():
            ok = isinstance(head, list) and len(head) == 2
            if not ok or not isinstance(head[0], int) or not isinstance(head[1], str):
                raise ValueError(f"its head of episode {eid} is not [count, hash]")
            heads[eid] = (head[0], head[1])
        return cls(
            number,
            data["scope"],
            data["subject"],
            run_id,
            data["store"],
            data["digest"],
            heads,
            data["key_id"],
            float(when),
            signature,
            canonical(data),
        )

    @property
    def when(self) -> str:
        """When it was signed, in UTC (ISO 8601)."""
        return _when(self.time)


def _line_finding(path: Path, number: int, reason: str) -> Finding:
    return Finding(f"line {number}", "hx_signature", f"witness {path}", reason)


def read_witness(
    path: str | Path, public_key: PublicKey | None = None
) -> tuple[list[WitnessLine], list[Finding]]:
    """The lines of witness ``path`` that read (and, with ``public_key``, whose signature
    holds), and a finding naming each line that does not.

    Raises:
        ConfigurationError: the file cannot be read.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"cannot read the witness {path} ({exc.strerror})") from None
    lines: list[WitnessLine] = []
    findings: list[Finding] = []
    texts = data.split(b"\n")
    if texts and texts[-1] == b"":
        texts.pop()  # (the end of the last line)
    for number, raw in enumerate(texts, start=1):
        try:
            line = WitnessLine.parse(number, raw.decode())
        except (ValueError, UnicodeDecodeError) as exc:
            reason = f"it is not a witness line ({exc}): the witness file was edited or cut"
            findings.append(_line_finding(path, number, reason))
            continue
        if public_key is not None:
            if line.key_id != public_key.key_id:
                reason = f"signed by key {line.key_id}, not by the key given ({public_key.key_id})"
                findings.append(_line_finding(path, number, reason))
                continue
            if not public_key.verifies(line.body, line.signature):
                reason = (
                    f"its signature does not hold for what it says ({line.scope} "
                    f"{line.subject}): the witness file was edited"
                )
                findings.append(_line_finding(path, number, reason))
                continue
        lines.append(line)
    return lines, findings


@dataclass
class WitnessReport:
    """What :func:`check_witness` compared, and what it found.

    Attributes:
        path: the witness file.
        lines: how many lines it holds.
        checked: how many were about the store (or run) checked.
        signed_by: the id of the public key the lines' signatures were checked with (None:
            not checked).
        elsewhere: the stores other lines are about.
        findings: what the store lost or rewrote of what the witness saw, and each line that
            does not read or whose signature does not hold.
    """

    path: Path
    lines: int = 0
    checked: int = 0
    signed_by: str | None = None
    elsewhere: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (without the findings, which the verification's report carries)."""
        return {
            "file": str(self.path),
            "lines": self.lines,
            "checked": self.checked,
            "signatures": (
                "checked"
                if self.signed_by is not None
                else "not checked: give the public key (--public-key)"
            ),
            "signed_by": self.signed_by,
            "other_stores": self.elsewhere,
        }


def _about(lines: Iterable[WitnessLine], store: str, run_id: str | None) -> list[WitnessLine]:
    """The lines about ``store`` (and ``run_id``); for a run none of whose lines name this
    store, its lines in any other (a run folder moved or copied since)."""
    lines = list(lines)
    if run_id is None:
        return [line for line in lines if line.store == store]
    ours = [line for line in lines if line.run_id == run_id]
    here = [line for line in ours if line.store == store]
    return here or ours


def check_witness(
    store: Store,
    path: str | Path,
    *,
    public_key: PublicKey | None = None,
    run_id: str | None = None,
) -> WitnessReport:
    """What the store lost or rewrote of what witness ``path`` saw signed in it.

    For each line about this store (of run ``run_id`` only, when given): the run or episode it
    names must be in the store; each episode head it records must still be in that episode's
    chain (the record at the witnessed count has the witnessed hash); the store's signature of
    it must not be older than the last one witnessed (a rollback). With ``public_key``, each
    line's signature must hold, and a line whose does not is named, not believed.

    Args:
        store: the store (read only).
        path: the witness file.
        public_key: check each line's signature with it.
        run_id: check only what the witness saw of this run (a run folder's target).

    Returns:
        The report; its findings name a subject (``run R: ...``, ``episode E: ...``) or a line
        of the witness (``witness FILE line N: ...``).

    Raises:
        ConfigurationError: the witness cannot be read.
    """
    path = Path(path)
    lines, findings = read_witness(path, public_key)
    report = WitnessReport(path, signed_by=None if public_key is None else public_key.key_id)
    report.lines = len(lines) + len(findings)
    here = store_identity(store.url)
    mine = _about(lines, here, run_id)
    report.checked = len(mine)
    report.elsewhere = sorted({line.store for line in lines} - {line.store for line in mine})
    with store.snapshot():
        report.findings = findings + _compare(store, mine)
    return report


def _compare(store: Store, lines: list[WitnessLine]) -> list[Finding]:
    """What ``store`` lost or rewrote of what ``lines`` witnessed."""
    if not lines:
        return []
    runs = {r.id for r in store.runs()}
    episodes = {e.id: e for e in store.episodes()}
    signatures = {s.id: s for s in store.signatures()}
    last: dict[tuple[str, str], WitnessLine] = {}
    heads: dict[str, dict[tuple[int, str], WitnessLine]] = {}
    for line in lines:
        last[(line.scope, line.subject)] = line
        for eid, head in line.heads.items():
            heads.setdefault(eid, {}).setdefault(head, line)
    found: list[Finding] = []
    gone_runs: set[str] = set()
    for (scope, subject), line in last.items():
        if scope == "run" and subject not in runs:
            gone_runs.add(subject)
            lost = sum(1 for eid in line.heads if eid not in episodes)
            also = f" (and {lost} of its {len(line.heads)} witnessed episodes)" if lost else ""
            found.append(_gone("run", subject, line, also))
    for (scope, subject), line in last.items():
        if scope == "episode" and subject not in episodes and line.run_id not in gone_runs:
            found.append(_gone("episode", subject, line, ""))
    named = {f.episode_id for f in found}
    for eid, seen in heads.items():
        if eid in named:
            continue
        if eid not in episodes:
            line = min(seen.values(), key=lambda w: w.number)
            if line.run_id not in gone_runs:
                found.append(_gone("episode", eid, line, f" (witnessed in run {line.run_id})"))
            continue
        problem = _chain_problem(store, eid, seen)
        if problem is not None:
            found.append(problem)
    named = {f.episode_id for f in found} | gone_runs
    for (scope, subject), line in last.items():
        if subject in named:
            continue
        reason = _signature_problem(signatures.get(f"{scope}:{subject}"), line)
        if reason is not None:
            found.append(Finding(subject, "hx_signature", scope, reason))
    return found


def _gone(scope: str, subject: str, line: WitnessLine, also: str) -> Finding:
    return Finding(
        subject,
        "hx_signature",
        scope,
        f"signed and witnessed at {line.when} but missing from the store: deleted{also}",
    )


def _chain_problem(
    store: Store, episode_id: str, seen: Mapping[tuple[int, str], WitnessLine]
) -> Finding | None:
    """Why episode ``episode_id``'s chain no longer holds a head the witness saw."""
    log = {rec.seq: rec.hash for rec in store.log(episode_id)}
    for (count, head), line in sorted(seen.items()):
        if count <= 0:
            continue  # (an episode with no record yet: nothing to lose)
        now = log.get(count)
        if now is None:
            reason = (
                f"its chain holds {len(log)} record(s), the witness saw {count} at {line.when} "
                f"(witness line {line.number}): rolled back"
            )
        elif now != head:
            reason = (
                f"its chain no longer holds the witnessed head: rewritten (record {count} is "
                f"{now[:12]}, the witness saw {head[:12]} at {line.when}, witness line "
                f"{line.number})"
            )
        else:
            continue
        return Finding(episode_id, "hx_signature", "episode", reason, count)
    return None


def _signature_problem(row: SignatureRow | None, line: WitnessLine) -> str | None:
    """Why the store's signature of what ``line`` witnessed last is not that one or a later
    one: removed, rolled back or replaced."""
    if row is None:
        return (
            f"signed and witnessed at {line.when}, but its signature is missing from the "
            "store: removed"
        )
    if hashlib.sha256(row.message.encode()).hexdigest() == line.digest:
        return None
    if row.created_at > line.time:
        return None  # signed again since, without the witness: the signatures' check covers it
    how = "rolled back" if row.created_at < line.time else "replaced"
    return (
        f"its signature in the store (made at {_when(row.created_at)}) is not the last one "
        f"witnessed (at {line.when}, witness line {line.number}): {how}"
    )

"""Signatures: a key kept outside the database authenticates what the database says.

The hash chain shows that a log was not edited piecewise, but anyone who can write the database
can recompute every hash and every head. A signature made with a private key kept elsewhere
cannot be recomputed. With a :class:`SigningKey`, the store signs each episode's head when the
episode ends (its run, task and trial, outcome, steps, checkpoint digest, record count and
chain head), and the run pipeline signs a manifest when a run ends (every episode's head, a
digest of every trial's verdict, the run's configuration and evidence). Signing happens once per
episode end, never per record, so the hot path pays nothing.

An auditor holding the :class:`PublicKey` checks them with :func:`verify_signatures`: a rewrite
with recomputed hashes, a deleted or added episode, an edited outcome and a flipped verdict each
break a signed fact. Keys are Ed25519 (``cryptography``); ``harness keygen`` makes a pair.

All of that evidence lives in the database, so a signed run deleted together with its signature
rows leaves no trace there. A key given a :class:`SignatureWitness` (``harness.store.witness``:
an append-only file kept elsewhere) also mirrors each signature it makes into it, and
``harness verify --witness`` names a witnessed run or episode the store lost or rewrote.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .._json import canonical, digest
from ..errors import ConfigurationError, StoreError
from .tables import EpisodeRow, RunRow, SignatureRow, TrialRow

if TYPE_CHECKING:
    from .store import Store

__all__ = [
    "PublicKey",
    "SignatureProblem",
    "SignatureWitness",
    "SigningKey",
    "episode_message",
    "run_message",
    "sign_episode",
    "sign_run",
    "signature_row",
    "verify_signatures",
]


def _key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


class PublicKey:
    """An Ed25519 public key: verifies what the matching :class:`SigningKey` signed."""

    def __init__(self, key: Ed25519PublicKey) -> None:
        self._key = key
        self.key_id = _key_id(key)

    @classmethod
    def load(cls, path: str | Path) -> PublicKey:
        """Read a PEM public key (``harness keygen`` writes ``<name>.pub``).

        Raises:
            ConfigurationError: the file is missing or is not an Ed25519 public key.
        """
        data = _read(path, "public key")
        try:
            key = serialization.load_pem_public_key(data)
        except ValueError as exc:
            raise ConfigurationError(f"{path} is not a PEM public key ({exc})") from None
        if not isinstance(key, Ed25519PublicKey):
            raise ConfigurationError(f"{path} is not an Ed25519 public key")
        return cls(key)

    def pem(self) -> bytes:
        """The key as PEM."""
        return self._key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def verifies(self, message: str, signature: str) -> bool:
        """Whether ``signature`` (base64) is this key's signature of ``message``."""
        try:
            self._key.verify(base64.b64decode(signature, validate=True), message.encode())
        except (InvalidSignature, ValueError):
            return False
        return True


class SignatureWitness(Protocol):
    """Where a :class:`SigningKey` mirrors each signature it makes, outside the database
    (:class:`harness.store.witness.Witness` appends them to a file)."""

    def record(
        self,
        key: SigningKey,
        row: SignatureRow,
        *,
        store: str,
        run_id: str | None,
        heads: Mapping[str, tuple[int, str]],
    ) -> None:
        """Mirror the signature ``row`` just written to ``store``.

        Args:
            key: the key that signed ``row`` (it signs the mirrored line too).
            row: the signature record, as stored.
            store: the URL of the store that holds it.
            run_id: the run the signed episode or run belongs to.
            heads: each episode it covers, as ``{episode_id: (record count, head hash)}``.

        Raises:
            StoreError: the signature could not be mirrored.
        """


class SigningKey:
    """An Ed25519 private key: signs episode heads and run manifests.

    Keep it outside the database it signs (a file readable by the writer only, or the
    ``HARNESS_SIGNING_KEY`` environment variable naming that file, read by the CLI).

    Args:
        key: the private key.
        witness: where each signature this key makes is mirrored too (None: nowhere).
    """

    def __init__(self, key: Ed25519PrivateKey, *, witness: SignatureWitness | None = None) -> None:
        self._key = key
        self.public = PublicKey(key.public_key())
        self.key_id = self.public.key_id
        self.witness = witness

    @classmethod
    def generate(cls, *, witness: SignatureWitness | None = None) -> SigningKey:
        """A new random key."""
        return cls(Ed25519PrivateKey.generate(), witness=witness)

    def with_witness(self, witness: SignatureWitness | None) -> SigningKey:
        """This key, mirroring its signatures into ``witness`` (None: nowhere)."""
        return SigningKey(self._key, witness=witness)

    @classmethod
    def from_pem(
        cls, data: bytes, where: str = "the key", *, witness: SignatureWitness | None = None
    ) -> SigningKey:
        """A key from PEM (unencrypted PKCS #8).

        Raises:
            ConfigurationError: ``data`` is not an Ed25519 private key.
        """
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(
                f"{where} is not an unencrypted PEM private key ({exc})"
            ) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigurationError(f"{where} is not an Ed25519 private key")
        return cls(key, witness=witness)

    @classmethod
    def load(cls, path: str | Path, *, witness: SignatureWitness | None = None) -> SigningKey:
        """Read a PEM private key (``harness keygen`` writes it).

        Args:
            path: the key file.
            witness: where each signature the key makes is mirrored too
                (:class:`harness.store.witness.Witness`).

        Raises:
            ConfigurationError: the file is missing, is not an Ed25519 private key, or others
                than its owner may read or write it (as ssh refuses such a key: whoever read
                it could sign a run as you).
        """
        key = cls.from_pem(_read(path, "signing key"), str(path), witness=witness)
        if os.name == "posix":
            mode = stat.S_IMODE(Path(path).stat().st_mode)
            if mode & 0o077:
                raise ConfigurationError(
                    f"signing key {path} is open to others than its owner (mode {mode:04o}): "
                    "whoever read it could sign a run as you, so it was not used. Make it "
                    f"yours alone (`chmod 600 {path}`), or make a new one (`harness keygen`) "
                    "if others may have read it"
                )
        return key

    def pem(self) -> bytes:
        """The key as unencrypted PKCS #8 PEM (what :meth:`save` writes)."""
        return self._key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def save(self, path: str | Path) -> tuple[Path, Path]:
        """Write the private key to ``path`` (mode 0600) and the public key to ``path.pub``.

        Raises:
            ConfigurationError: either file exists already (a key is never overwritten).
        """
        private = Path(path)
        public = private.with_name(private.name + ".pub")
        for target in (private, public):
            if target.exists() or target.is_symlink():
                raise ConfigurationError(
                    f"{target} exists; a key is never overwritten: choose another path"
                )
        private.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(self.pem())
        public.write_bytes(self.public.pem())
        return private, public

    def sign(self, message: str) -> str:
        """The signature of ``message`` (base64)."""
        return base64.b64encode(self._key.sign(message.encode())).decode()


def _read(path: str | Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"cannot read the {what} {path} ({exc.strerror})") from None


def episode_message(row: EpisodeRow) -> dict[str, Any]:
    """What an episode's signature covers: its identity, outcome and chain head."""
    return {
        "kind": "episode",
        "episode_id": row.id,
        "run_id": row.run_id,
        "task_id": row.task_id,
        "trial": row.trial,
        "status": str(row.status),
        "steps": row.steps,
        "digest": row.digest,
        "log_count": row.log_count,
        "head_hash": row.head_hash,
    }


def trial_digest(row: TrialRow) -> str:
    """A digest of what a trial's verdict says (passed, partial, outcome, infrastructure)."""
    return digest(
        {
            "episode_id": row.episode_id,
            "task_id": row.task_id,
            "trial": row.trial,
            "passed": row.passed,
            "partial": row.partial,
            "outcome": str(row.outcome),
            "infra_error": row.infra_error,
            "verdict": row.verdict,
        }
    )


def run_message(
    run: RunRow, episodes: Iterable[EpisodeRow], trials: Iterable[TrialRow]
) -> dict[str, Any]:
    """What a run's manifest covers: its configuration and evidence, every episode's head and
    every trial's verdict."""
    return {
        "kind": "run",
        "run_id": run.id,
        "suite": run.suite,
        "status": str(run.status),
        "config": hashlib.sha256(run.config.encode()).hexdigest(),
        "evidence": hashlib.sha256(run.evidence.encode()).hexdigest(),
        "episodes": {e.id: e.head_hash for e in episodes},
        "trials": {t.episode_id: trial_digest(t) for t in trials},
    }


def signature_row(
    key: SigningKey, scope: str, subject: str, message: Mapping[str, Any]
) -> SignatureRow:
    """The signed record of ``message`` about ``subject`` (an episode or a run)."""
    text = canonical(dict(message))
    return SignatureRow(
        id=f"{scope}:{subject}",
        scope=scope,
        subject=subject,
        message=text,
        signature=key.sign(text),
        key_id=key.key_id,
        created_at=time.time(),
    )


def sign_episode(store: Store, episode_id: str, key: SigningKey) -> None:
    """Sign episode ``episode_id``'s head as the store has it now (when its record is final).

    Raises:
        StoreError: no such episode in the store.
    """
    row = store.episode(episode_id)
    if row is None:
        raise StoreError(f"no episode {episode_id!r} in {store.url} to sign")
    signed = signature_row(key, "episode", episode_id, episode_message(row))
    store.add(signed)
    if key.witness is not None:
        heads = {row.id: (row.log_count, row.head_hash)}
        key.witness.record(key, signed, store=store.url, run_id=row.run_id, heads=heads)


def sign_run(store: Store, run_id: str, key: SigningKey) -> None:
    """Sign run ``run_id``'s manifest as the store has it now (at the end of a run or resume).

    Raises:
        StoreError: no such run in the store.
    """
    run = next((r for r in store.runs() if r.id == run_id), None)
    if run is None:
        raise StoreError(f"no run {run_id!r} in {store.url} to sign")
    episodes = store.episodes(run_id)
    signed = signature_row(key, "run", run_id, run_message(run, episodes, store.trial_rows(run_id)))
    store.add(signed)
    if key.witness is not None:
        heads = {e.id: (e.log_count, e.head_hash) for e in episodes}
        key.witness.record(key, signed, store=store.url, run_id=run_id, heads=heads)


@dataclass(frozen=True)
class SignatureProblem:
    """A signed fact the store no longer shows.

    Attributes:
        scope: ``episode`` or ``run``.
        subject: the episode or run id.
        reason: what differs from what was signed, or why the signature does not hold.
    """

    scope: str
    subject: str
    reason: str

    def __str__(self) -> str:
        return f"{self.scope} {self.subject}: {self.reason}"


def _differences(signed: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    keys = sorted(set(signed) | set(now))
    changed = [k for k in keys if canonical(signed.get(k)) != canonical(now.get(k))]
    shown = []
    for k in changed[:3]:
        a, b = signed.get(k), now.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            gone = sorted(set(a) - set(b))
            new = sorted(set(b) - set(a))
            edited = sorted(x for x in set(a) & set(b) if a[x] != b[x])
            parts = [
                f"{label} {', '.join(items[:3])}"
                for label, items in (("removed", gone), ("added", new), ("changed", edited))
                if items
            ]
            shown.append(f"{k}: {'; '.join(parts)}")
        else:
            shown.append(f"{k} signed {json.dumps(a)}, now {json.dumps(b)}")
    return "; ".join(shown)


def _checked(
    key: PublicKey, row: SignatureRow | None, scope: str, subject: str
) -> tuple[dict[str, Any] | None, SignatureProblem | None]:
    """The signed message of ``row`` when its signature holds, else the problem."""
    if row is None:
        return None, SignatureProblem(
            scope,
            subject,
            "no signature: written without a key, added since, or its signature was removed",
        )
    if row.key_id != key.key_id:
        return None, SignatureProblem(
            scope, subject, f"signed by key {row.key_id}, not by the key given ({key.key_id})"
        )
    if not key.verifies(row.message, row.signature):
        return None, SignatureProblem(
            scope, subject, "the signature does not hold for its message: the message was edited"
        )
    signed: dict[str, Any] = json.loads(row.message)
    return signed, None


def _held(
    key: PublicKey, row: SignatureRow | None, scope: str, subject: str, now: Mapping[str, Any]
) -> SignatureProblem | None:
    """Why the signed fact about ``subject`` does not hold for what the store shows ``now``."""
    signed, problem = _checked(key, row, scope, subject)
    if problem is None and signed is not None and canonical(signed) != canonical(now):
        what = (
            "the episode differs from what was signed"
            if scope == "episode"
            else ("the run differs from its manifest")
        )
        problem = SignatureProblem(scope, subject, f"{what} ({_differences(signed, now)})")
    return problem


def _gone(
    key: PublicKey,
    by_id: Mapping[str, SignatureRow],
    scope: str,
    present: set[str],
    counted: Callable[[dict[str, Any]], bool],
) -> list[SignatureProblem]:
    """A validly signed ``scope`` (episode or run) the store no longer has: deleted."""
    gone = []
    for row in by_id.values():
        if row.scope != scope or row.subject in present:
            continue
        signed, _ = _checked(key, row, scope, row.subject)
        if signed is not None and counted(signed):
            gone.append(
                SignatureProblem(scope, row.subject, f"signed, but the {scope} is gone: deleted")
            )
    return gone


def verify_signatures(
    key: PublicKey,
    signatures: Iterable[SignatureRow],
    episodes: Iterable[EpisodeRow],
    runs: Iterable[tuple[RunRow, list[EpisodeRow], list[TrialRow]]] = (),
    *,
    run_id: str | None = None,
    every_run: bool = False,
) -> list[SignatureProblem]:
    """Check every episode's and run's signature against the rows as they are now.

    Args:
        key: the public key of the key that signed.
        signatures: the store's signature records.
        episodes: the episodes to check (each must carry a valid signature of its head).
        runs: the runs to check, each with its episodes and trials (each must carry a valid
            manifest naming exactly these episodes with these heads, and these verdicts).
        run_id: ``episodes`` are every episode of this run; an episode signed for it and not
            among them was deleted (None: ``episodes`` may be any selection).
        every_run: ``episodes`` and ``runs`` are all of the store's; an episode or a run signed
            and not among them was deleted.

    Returns:
        The problems found, at most one per episode or run, in order.
    """
    by_id = {s.id: s for s in signatures}
    episodes = list(episodes)
    runs = list(runs)
    problems = [
        p
        for e in episodes
        if (p := _held(key, by_id.get(f"episode:{e.id}"), "episode", e.id, episode_message(e)))
    ]
    if run_id is not None or every_run:
        problems += _gone(
            key,
            by_id,
            "episode",
            {e.id for e in episodes},
            lambda signed: every_run or signed.get("run_id") == run_id,
        )
    problems += [
        p
        for run, run_episodes, trials in runs
        if (
            p := _held(
                key,
                by_id.get(f"run:{run.id}"),
                "run",
                run.id,
                run_message(run, run_episodes, trials),
            )
        )
    ]
    if every_run:
        problems += _gone(key, by_id, "run", {run.id for run, _, _ in runs}, lambda _: True)
    return problems

"""``harness keygen``: a signing key pair for runs whose record must survive a database rewrite."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import HarnessError
from ..store import SigningKey
from ._common import console, fail

__all__ = ["keygen_command"]


@click.command("keygen")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def keygen_command(path: Path) -> None:
    """Write a new Ed25519 signing key to PATH (mode 0600) and its public key to PATH.pub.

    Keep PATH where the runs are written (pass it to `harness run --signing-key`, or name it in
    HARNESS_SIGNING_KEY) and outside the database; give PATH.pub to whoever audits
    (`harness audit RUN --verify --public-key PATH.pub`). An existing file is never overwritten.
    """
    try:
        key = SigningKey.generate()
        private, public = key.save(path)
    except (HarnessError, OSError) as exc:
        fail(exc if isinstance(exc, HarnessError) else HarnessError(f"cannot write {path}: {exc}"))
    console.print(f"wrote {private} (private: keep it secret) and {public} (key {key.key_id})")

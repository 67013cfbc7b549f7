"""A run folder does not choose where your Postgres password goes: with PGPASSWORD set, a store
that only the folder's store.json names is refused before anything connects; a store URL you
name yourself is opened. A fake Postgres server asking for a cleartext password records what
arrives."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import harness as hx
from harness.cli import main

SECRET = "pg-secret-7"


class PasswordCatcher:
    """A TCP server speaking just enough of Postgres's protocol to be sent a password."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.passwords: list[str] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn, contextlib.suppress(OSError):
                self._talk(conn)

    @staticmethod
    def _read(conn: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise OSError("closed")
            data += chunk
        return data

    def _talk(self, conn: socket.socket) -> None:
        while True:  # SSL and GSS encryption requests are declined, then the startup message
            (length,) = struct.unpack("!i", self._read(conn, 4))
            (code,) = struct.unpack("!i", self._read(conn, 4))
            self._read(conn, length - 8)
            if code in (80877103, 80877104):
                conn.sendall(b"N")
                continue
            break
        conn.sendall(b"R" + struct.pack("!ii", 8, 3))  # AuthenticationCleartextPassword
        kind = self._read(conn, 1)
        (length,) = struct.unpack("!i", self._read(conn, 4))
        body = self._read(conn, length - 4)
        if kind == b"p":
            self.passwords.append(body.rstrip(b"\0").decode())
        error = b"SFATAL\0C28P01\0Mpassword authentication failed\0\0"
        conn.sendall(b"E" + struct.pack("!i", len(error) + 4) + error)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def catcher() -> Iterator[PasswordCatcher]:
    server = PasswordCatcher()
    yield server
    server.close()


def handed_folder(tmp_path: Path, url: str) -> Path:
    """A run folder as someone could hand it over: only a store.json, naming their server."""
    folder = tmp_path / "logs" / "20261204-101500-abcdef"
    folder.mkdir(parents=True)
    record = {"format": "harness.store", "url": url, "run_id": folder.name}
    (folder / "store.json").write_text(json.dumps(record))
    return folder


@pytest.mark.parametrize(
    "command", [["report"], ["verify"], ["audit"], ["resume", "--json"], ["escalations"]]
)
def test_a_folder_naming_a_postgres_store_gets_no_pgpassword(
    tmp_path: Path, catcher: PasswordCatcher, monkeypatch: pytest.MonkeyPatch, command: list[str]
):
    url = f"postgresql+psycopg://victim@127.0.0.1:{catcher.port}/runs"
    folder = handed_folder(tmp_path, url)
    monkeypatch.setenv("PGPASSWORD", SECRET)
    result = CliRunner().invoke(main, [command[0], str(folder), *command[1:]])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "PGPASSWORD" in said and "~/.pgpass" in said
    assert f"{url}#{folder.name}" in said  # the command that names the store yourself
    assert catcher.connections == 0 and catcher.passwords == []


def test_a_store_url_you_name_yourself_gets_the_password(
    catcher: PasswordCatcher, monkeypatch: pytest.MonkeyPatch
):
    """What the refusal above prevents is real: libpq hands PGPASSWORD to whatever server the
    URL names, so it goes to a URL you give, and only then."""
    monkeypatch.setenv("PGPASSWORD", SECRET)
    url = f"postgresql+psycopg://victim@127.0.0.1:{catcher.port}/runs"
    with pytest.raises(hx.HarnessError):
        hx.Store(url)
    assert catcher.passwords == [SECRET]


def test_without_pgpassword_the_folder_opens_its_store(
    tmp_path: Path, catcher: PasswordCatcher, monkeypatch: pytest.MonkeyPatch
):
    """No password in the environment: the folder's store is opened (a password from
    ~/.pgpass would be the one bound to that host); this one refuses, and the error says where
    a password comes from."""
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-pgpass"))
    folder = handed_folder(tmp_path, f"postgresql+psycopg://victim@127.0.0.1:{catcher.port}/runs")
    result = CliRunner().invoke(main, ["report", str(folder)])
    assert result.exit_code == 2, result.output
    assert catcher.connections >= 1 and catcher.passwords == []
    assert "~/.pgpass" in " ".join(result.output.split())

"""A run folder does not choose where your API key goes: resume and work give a key from the
environment back to the agent only when the server it would reach is the agent's default, one
you name, or the folder is trusted (``--trust-agent``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import harness as hx
from harness.cli import main
from harness.runs.start import run_trials
from harness.suite import Suite
from harness.testing.model_server import FakeChatServer, ReplayPolicy

pytestmark = pytest.mark.usefixtures("fresh_endpoints")

KEY = "sk-live-key-1"


def stopped_run(toy: Suite, server: FakeChatServer, logs: Path) -> Path:
    """An openai run against ``server`` with a key, stopped after its first trial."""

    def stop(_result: object) -> None:
        raise KeyboardInterrupt

    result = run_trials(
        toy,
        agent="openai",
        agent_options={"base_url": server.base_url, "model": "fake", "api_key": KEY},
        tasks=["t0", "t1"],
        logs=logs,
        progress=stop,
    )
    assert result.interrupted and result.missing == 1
    assert result.folder is not None
    return result.folder


def point_at(folder: Path, url: str) -> None:
    """Edit the folder's recorded agent server, as whoever can write the folder can."""
    store = hx.Store(folder / "harness.db")
    try:
        (row,) = store.runs()
        config = hx._json.loads(row.config)
        config["agent_options"]["base_url"] = url
        store.add(hx.store.RunRow(**{**row.model_dump(), "config": hx._json.dumps(config)}))
    finally:
        store.close()


@pytest.fixture
def servers(toy: Suite) -> Any:
    honest = FakeChatServer(ReplayPolicy(toy.tasks))
    other = FakeChatServer(ReplayPolicy(toy.tasks))
    with honest, other:
        yield honest, other


def test_a_recorded_server_the_user_did_not_name_gets_no_key(
    toy: Suite, servers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A folder whose recorded base_url was changed to another server: `harness resume` with
    the key in the environment refuses, naming the server and both ways on, and that server
    gets no request at all; naming the server yourself, or --trust-agent, goes on (and only
    then does the key reach it)."""
    honest, other = servers
    folder = stopped_run(toy, honest, tmp_path / "logs")
    point_at(folder, other.base_url)
    monkeypatch.setenv("HARNESS_OPENAI_API_KEY", KEY)
    monkeypatch.delenv("HARNESS_OPENAI_BASE_URL", raising=False)
    # The edit is found first: every trial's start record binds the run's configuration.
    result = CliRunner().invoke(main, ["resume", str(folder), "--suite", str(toy.path)])
    code, out = result.exit_code, " ".join(result.output.split())
    assert code == 2 and "fails verification" in out and "configuration" in out, out
    assert other.requests == [] and other.headers == []
    # Told to go on unverified, the key still does not go where the folder says.
    unverified = ["resume", str(folder), "--suite", str(toy.path), "--allow-unverified"]
    result = CliRunner().invoke(main, unverified)
    code, out = result.exit_code, result.output
    assert code == 2, out
    assert other.base_url in out and "HARNESS_OPENAI_BASE_URL=" in out and "--trust-agent" in out
    assert other.requests == [] and other.headers == []
    monkeypatch.setenv("HARNESS_OPENAI_BASE_URL", other.base_url + "/")
    result = CliRunner().invoke(main, unverified)
    assert result.exit_code == 0, result.output
    assert other.headers and all(h.get("authorization") == f"Bearer {KEY}" for h in other.headers)


def test_trusting_the_folder_or_its_own_server_goes_on(
    toy: Suite, servers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """--trust-agent gives the key back to the recorded server; so does naming the server the
    run recorded; without a key in the environment there is nothing to give back."""
    honest, other = servers
    trusted = stopped_run(toy, honest, tmp_path / "a")
    point_at(trusted, other.base_url)
    monkeypatch.setenv("HARNESS_OPENAI_API_KEY", KEY)
    monkeypatch.delenv("HARNESS_OPENAI_BASE_URL", raising=False)
    result = CliRunner().invoke(
        main,
        ["resume", str(trusted), "--suite", str(toy.path), "--trust-agent", "--allow-unverified"],
    )
    assert result.exit_code == 0, result.output
    own = stopped_run(toy, honest, tmp_path / "b")
    monkeypatch.setenv("HARNESS_OPENAI_BASE_URL", honest.base_url)
    result = CliRunner().invoke(main, ["resume", str(own), "--suite", str(toy.path)])
    assert result.exit_code == 0, result.output
    keyless = stopped_run(toy, honest, tmp_path / "c")
    point_at(keyless, other.base_url)
    monkeypatch.delenv("HARNESS_OPENAI_API_KEY")
    monkeypatch.delenv("HARNESS_OPENAI_BASE_URL")
    before = len(other.headers)
    result = CliRunner().invoke(
        main, ["resume", str(keyless), "--suite", str(toy.path), "--allow-unverified"]
    )
    assert result.exit_code == 0, result.output
    assert all("authorization" not in h for h in other.headers[before:])


def test_a_recorded_proxy_gets_no_key_even_for_a_server_you_name(
    toy: Suite, servers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key would travel through the proxy the folder records, whatever the server: resume
    refuses to give it back unless the folder is trusted."""
    honest, _ = servers
    folder = stopped_run(toy, honest, tmp_path)
    store = hx.Store(folder / "harness.db")
    try:
        (row,) = store.runs()
        config = hx._json.loads(row.config)
        config["agent_options"]["proxy"] = "http://127.0.0.1:9"
        store.add(hx.store.RunRow(**{**row.model_dump(), "config": hx._json.dumps(config)}))
    finally:
        store.close()
    monkeypatch.setenv("HARNESS_OPENAI_API_KEY", KEY)
    monkeypatch.setenv("HARNESS_OPENAI_BASE_URL", honest.base_url)
    from harness.runs.layout import open_run
    from harness.runs.resume import check_secret_servers

    with open_run(folder) as run:
        with pytest.raises(hx.ConfigurationError, match="records a proxy"):
            check_secret_servers(run, {"api_key": KEY})
        check_secret_servers(run, {"api_key": KEY}, trust=True)

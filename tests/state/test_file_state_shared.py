"""FileState in a shared folder: the harness's own files and other programs' files."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import harness as hx

# Runs episodes on a store until told to stop, printing a line after each one (its store, its
# -wal and -shm, and its JSON lines are written all the while).
_OTHER_EPISODES = """
import pathlib, sys
import harness as hx
store, stop = sys.argv[1], pathlib.Path(sys.argv[2])

@hx.action
def look() -> str:
    return "seen"

while not stop.exists():
    with hx.Episode(state=hx.DictState({"a": 1}), store=store):
        look()
    print("episode", flush=True)
"""

# Appends a line to a file every few milliseconds until told to stop, as a cron job's log does.
_APPENDER = """
import pathlib, sys, time
log, stop = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
log.parent.mkdir(parents=True, exist_ok=True)
while not stop.exists():
    with log.open("a") as f:
        f.write("tick\\n")
    time.sleep(0.005)
"""


def _note_writer(root: Path, then: Callable[[], None] | None = None) -> Any:
    """An action writing ``notes/a.txt`` (after running ``then``, if given)."""

    @hx.action(writes=["notes/*"])
    def write_note(text: str) -> str:
        """Write notes/a.txt."""
        if then is not None:
            then()
        (root / "notes").mkdir(exist_ok=True)
        (root / "notes" / "a.txt").write_text(text, encoding="utf-8")
        return "written"

    return write_note


def _diffs(store: str, episode_id: str) -> list[set[str]]:
    opened = hx.Store(store)
    try:
        return [set(t.diff) for t in opened.transactions(episode_id)]
    finally:
        opened.close()


@pytest.fixture
def other_process(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts, stopped (through their stop file) and reaped at its end."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    (tmp_path / "stop").touch()
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _start(procs: list[subprocess.Popen[str]], script: str, *args: object) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)], stdout=subprocess.PIPE, text=True
    )
    procs.append(proc)
    return proc


def test_an_action_beside_the_store_commits_with_only_its_own_files_in_the_diff(tmp_path: Path):
    """With the store under the folder, an action's window holds its own files (an application
    database included) and none of the store's, and the call commits."""
    root = tmp_path / "world"
    root.mkdir()
    store = f"sqlite:///{root}/logs/harness.db"

    @hx.action(writes=["notes/*", "data/*"])
    def record(text: str) -> str:
        """Write a note and a row of the application's own database."""
        (root / "notes").mkdir(exist_ok=True)
        (root / "notes" / "a.txt").write_text(text, encoding="utf-8")
        (root / "data").mkdir(exist_ok=True)
        with sqlite3.connect(root / "data" / "app.db") as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS t (x TEXT)")
            conn.execute("INSERT INTO t VALUES (?)", (text,))
        conn.close()
        return "written"

    with hx.Episode(state=hx.FileState(root), store=store) as ep:
        assert record("hi") == "written"
    assert ep.outcome == "committed"
    assert _diffs(store, ep.id) == [{"notes/a.txt", "data/app.db"}]


def test_a_store_in_a_nested_folder_under_any_name_is_left_out(tmp_path: Path):
    """A store deep in the folder, named as its user likes, is recognised by what it holds:
    every call commits with only its own file changed."""
    root = tmp_path / "world"
    root.mkdir()
    store = f"sqlite:///{root}/deep/er/audit.sqlite"
    write_note = _note_writer(root)
    with hx.Episode(state=hx.FileState(root), store=store) as ep:
        write_note("one")
        write_note("two")
    assert ep.outcome == "committed"
    assert _diffs(store, ep.id) == [{"notes/a.txt"}, {"notes/a.txt"}]
    assert (root / "deep" / "er" / "audit.jsonl").is_file()


def test_another_process_writing_another_store_under_the_folder_is_not_the_calls_change(
    tmp_path: Path, other_process: list[subprocess.Popen[str]]
):
    """A second process writing its own harness store under the folder while the call runs
    leaves the call's window to the call's own file, and the call commits."""
    root = tmp_path / "world"
    root.mkdir()
    other = _start(
        other_process, _OTHER_EPISODES, f"sqlite:///{root}/other/logs/harness.db", tmp_path / "stop"
    )
    assert other.stdout is not None and other.stdout.readline()  # its store exists

    def while_the_other_writes() -> None:
        assert other.stdout is not None
        for _ in range(2):  # at least one whole episode of the other process inside the call
            assert other.stdout.readline()

    store = f"sqlite:///{root}/logs/harness.db"
    with hx.Episode(state=hx.FileState(root), store=store) as ep:
        _note_writer(root, then=while_the_other_writes)("hi")
    assert ep.outcome == "committed"
    assert _diffs(store, ep.id) == [{"notes/a.txt"}]


def test_another_process_writing_the_same_store_and_its_json_lines_is_not_the_calls_change(
    tmp_path: Path, other_process: list[subprocess.Popen[str]]
):
    """Another episode appending to the same store and to its JSON-lines log during the call
    is no change of the call's."""
    root = tmp_path / "world"
    root.mkdir()
    store = f"sqlite:///{root}/logs/harness.db"
    hx.Store(store, create=True).close()
    other = _start(other_process, _OTHER_EPISODES, store, tmp_path / "stop")
    assert other.stdout is not None and other.stdout.readline()
    log = root / "logs" / "harness.jsonl"
    size = log.stat().st_size

    def while_the_other_writes() -> None:
        assert other.stdout is not None
        for _ in range(2):
            assert other.stdout.readline()

    with hx.Episode(state=hx.FileState(root), store=store) as ep:
        _note_writer(root, then=while_the_other_writes)("hi")
    assert log.stat().st_size > size  # the other episode's lines landed during the call
    assert ep.outcome == "committed"
    assert _diffs(store, ep.id) == [{"notes/a.txt"}]


def test_a_harness_run_in_the_same_folder_during_the_call_is_not_the_calls_change(
    tmp_path: Path, other_process: list[subprocess.Popen[str]]
):
    """`harness run` writing its run folder (store, JSON lines, evidence, summary) under the
    folder while the call runs is no change of the call's."""
    root = tmp_path / "world"
    root.mkdir()
    task = hx.load_suite("configs").tasks[0].id
    command = ["run", "configs", "--agent", "scripted", "--trials", "1", "--task", task]
    run = subprocess.Popen(
        [sys.executable, "-m", "harness", *command, "--logs", "logs"],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    other_process.append(run)
    deadline = time.monotonic() + 120
    while not list(root.glob("logs/*/harness.db")) and run.poll() is None:
        assert time.monotonic() < deadline, "harness run made no run folder"
        time.sleep(0.01)

    def while_the_run_finishes() -> None:
        _, err = run.communicate(timeout=120)
        assert run.returncode == 0, err

    store = f"sqlite:///{tmp_path}/store/harness.db"
    with hx.Episode(state=hx.FileState(root), store=store) as ep:
        _note_writer(root, then=while_the_run_finishes)("hi")
    (folder,) = root.glob("logs/*")
    assert (folder / "summary.json").is_file()
    assert ep.outcome == "committed"
    assert _diffs(store, ep.id) == [{"notes/a.txt"}]


def test_an_ignored_glob_keeps_a_file_another_process_appends_to_out_of_the_window(
    tmp_path: Path, other_process: list[subprocess.Popen[str]]
):
    """With ``ignore=["*.log"]``, a log another process appends to during the call is not the
    call's change, and the call commits."""
    root = tmp_path / "world"
    root.mkdir()
    log = root / "var" / "app.log"
    _start(other_process, _APPENDER, log, tmp_path / "stop")
    deadline = time.monotonic() + 60
    while not log.exists():
        assert time.monotonic() < deadline, "the other process wrote nothing"
        time.sleep(0.005)

    def while_the_log_grows() -> None:
        size = log.stat().st_size
        while log.stat().st_size == size:
            time.sleep(0.005)

    store = f"sqlite:///{tmp_path}/store/harness.db"
    state = hx.FileState(root, ignore=[".git", "*.log"])
    with hx.Episode(state=state, store=store) as ep:
        _note_writer(root, then=while_the_log_grows)("hi")
    assert ep.outcome == "committed"
    assert _diffs(store, ep.id) == [{"notes/a.txt"}]


def test_ignore_takes_names_and_glob_patterns_of_relative_paths(tmp_path: Path):
    """Names and patterns without ``/`` match names anywhere, patterns with ``/`` match paths
    from the folder (``*`` within one folder, ``**`` across any), a trailing ``/`` only
    folders."""
    for path in (
        "keep.txt",
        "a/__pycache__/m.pyc",
        "a/b/app.log",
        "cache/x/y.bin",
        "tmp/x.txt",
        "tmp/x.md",
        "tmp/sub/x.txt",
        "src/build/out.o",
        "src/build.txt",
        "docs/out/index.html",
    ):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(path, encoding="utf-8")
    state = hx.FileState(
        tmp_path, ignore=["__pycache__", "*.log", "cache/**", "tmp/*.txt", "build/", "**/out"]
    )
    assert sorted(state.to_dict()) == ["keep.txt", "src/build.txt", "tmp/sub/x.txt", "tmp/x.md"]


@pytest.mark.parametrize(
    "ignore",
    [[""], ["/var/log/app.log"], ["../elsewhere/*"], ["logs/../../x"], ["."], "*.log", [3]],
)
def test_a_bad_ignore_value_is_refused_with_an_example_of_a_good_one(tmp_path: Path, ignore):
    """An ignore value that is not a list of names or relative patterns is a ConfigurationError
    that names it and shows a good value."""
    with pytest.raises(hx.ConfigurationError) as refused:
        hx.FileState(tmp_path, ignore=ignore)
    assert repr(ignore[0] if isinstance(ignore, list) else ignore) in str(refused.value)
    assert '"*.log", "cache/**"' in str(refused.value)


def test_file_state_says_it_cannot_tell_which_process_wrote_a_file():
    """FileState declares that it does not attribute writes to the process that made them."""
    assert hx.FileState.attributes_writes is False


def test_scanning_the_folder_keeps_this_processs_locks_on_the_store(tmp_path: Path):
    """A scan never opens the store or its sidecars the way that drops this process's SQLite
    locks on them (closing any descriptor of a file drops all the process's POSIX locks on it),
    so another process opening the store cannot take it for unused and reset its index."""
    root = tmp_path / "world"
    root.mkdir()
    store = f"sqlite:///{root}/logs/harness.db"
    # Whether another process could lock, exclusively, the bytes SQLite's connections hold
    # shared while they use the store: the database's shared range and the -shm's
    # "dead man switch" (its whole index is reset when that one is free).
    free = (
        "import fcntl, os, sys\n"
        "def free(path, start, length):\n"
        "    fd = os.open(path, os.O_RDWR)\n"
        "    try:\n"
        "        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, length, start, 0)\n"
        "        return True\n"
        "    except OSError:\n"
        "        return False\n"
        "    finally:\n"
        "        os.close(fd)\n"
        "db = sys.argv[1]\n"
        "print(free(db, 0x40000002, 510), free(db + '-shm', 128, 1))\n"
    )
    write_note = _note_writer(root)
    with hx.Episode(state=hx.FileState(root), store=store) as ep:
        write_note("one")
        held = subprocess.run(
            [sys.executable, "-c", free, root / "logs" / "harness.db"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert held.stdout.split() == ["False", "False"]
        write_note("two")
    assert ep.outcome == "committed"
    assert _diffs(store, ep.id) == [{"notes/a.txt"}, {"notes/a.txt"}]

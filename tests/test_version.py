"""The version and the distribution: installed as transactional-harness, imported as harness."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import harness as hx
from harness.cli import main
from harness.suite import BUILTIN_SUITES

DISTRIBUTION = "transactional-harness"
ROOT = Path(__file__).resolve().parent.parent


def test_version_is_the_installed_distributions_version():
    """``hx.__version__`` is the version the installed ``transactional-harness`` declares."""
    assert hx.__version__ == importlib.metadata.version(DISTRIBUTION)


def test_the_distribution_installs_the_harness_command():
    """The distribution's console script is ``harness``, and it runs the command line."""
    scripts = importlib.metadata.distribution(DISTRIBUTION).entry_points.select(
        group="console_scripts"
    )
    assert {(e.name, e.value) for e in scripts} == {("harness", "harness.cli:main")}


def test_version_option_prints_the_package_version():
    """``harness --version`` answers with the package's version, found without its metadata."""
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"harness, version {hx.__version__}\n"


def test_the_wheel_carries_every_builtin_suite():
    """The build copies each built-in suite's suite.json and tasks.json into harness/_suites."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    included = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    expected = {
        f"tasks/{name}/{file}": f"harness/_suites/{name}/{file}"
        for name in BUILTIN_SUITES
        for file in ("suite.json", "tasks.json")
    }
    assert {k: v for k, v in included.items() if v.startswith("harness/_suites/")} == expected
    assert all((ROOT / source).is_file() for source in expected)


def test_the_wheel_installs_the_harness_package_only(tmp_path: Path):
    """The built wheel's only top-level package is ``harness``: the built-in verifiers are
    ``harness.verifiers``, and no top-level ``verifiers`` (an unrelated project's name on PyPI)
    overwrites or is overwritten by another install."""
    wheel = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["hatch"]
    assert wheel["build"]["targets"]["wheel"]["packages"] == ["harness"]
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if built.returncode != 0 and "satisfies the requirement hatchling" in built.stderr:
        pytest.skip("pip cannot get the build backend (hatchling) here")
    assert built.returncode == 0, built.stderr
    (path,) = tmp_path.glob("transactional_harness-*.whl")
    with zipfile.ZipFile(path) as whl:
        names = whl.namelist()
    assert {n.split("/")[0] for n in names} == {"harness", path.name.split("-py")[0] + ".dist-info"}
    assert {"harness/verifiers/__init__.py", "harness/verifiers/checks.py"} <= set(names)


def test_version_loads_no_command_and_the_public_api_loads_on_use():
    """``harness --version`` answers without importing the store, the runs or SQLAlchemy (it
    took a second and a half), and ``--help`` still lists every command; each public name imports
    on use,
    ``hx.action`` stays the decorator after its submodule loads, and an unknown name is an
    AttributeError."""
    probe = (
        "import sys\n"
        "from harness.cli import main\n"
        "try:\n"
        "    main(['--version'], prog_name='harness')\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'sqlalchemy'\n"
        "               or m.startswith(('harness.store', 'harness.runs', 'harness.cli.run')))\n"
        "print('LOADED', heavy)\n"
        "try:\n"
        "    main(['--help'], prog_name='harness')\n"
        "except SystemExit:\n"
        "    pass\n"
        "import harness as hx\n"
        "import harness.episode\n"
        "assert callable(hx.action) and hx.action.__module__ == 'harness.action', hx.action\n"
        "assert hx.Store.__name__ == 'Store' and hx.store.Store is hx.Store\n"
        "try:\n"
        "    hx.no_such_name\n"
        "except AttributeError as exc:\n"
        "    print('MISSING', exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert "LOADED []" in done.stdout, done.stdout
    assert "MISSING module 'harness' has no attribute 'no_such_name'" in done.stdout
    assert f"harness, version {hx.__version__}" in done.stdout
    listed = done.stdout.split("Commands:")[1]
    for command in ("run", "resume", "work", "report", "verify", "escalations", "mcp"):
        assert f"  {command} " in listed, listed

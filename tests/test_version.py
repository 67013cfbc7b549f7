"""The version and the distribution: installed as transactional-harness, imported as harness."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

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

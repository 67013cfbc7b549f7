"""What ``import harness`` costs now, against the harness before the framework adapters.

The adapters (``harness.integrations``) and the official ``openai`` client must cost nothing to
users who do not use them: ``import harness`` imports no framework, and takes as long as it did
before they were added (target: within 10%). Both trees are imported in fresh interpreters,
interleaved, in the same run; each time is measured inside the interpreter (interpreter start
left out) and the medians are compared.

    python benchmarks/import_time.py [--base REV] [--reps 21]

``--base`` defaults to the commit before ``harness/integrations`` was added.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = (
    "agents",
    "langchain_core",
    "langgraph",
    "pydantic_ai",
    "mcp",
    "opentelemetry",
    "openai",
    "httpx",
)
PROBE = f"""
import sys, time, json
t = time.perf_counter()
import harness
elapsed = time.perf_counter() - t
loaded = sorted(m for m in {FRAMEWORKS!r} if m in sys.modules)
print(json.dumps({{"seconds": elapsed, "frameworks": loaded}}))
"""


def _git(*args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True).stdout


def default_base() -> str:
    """The commit before harness/integrations was added."""
    added = _git(
        "log", "--diff-filter=A", "--format=%H", "--", "harness/integrations/__init__.py"
    ).split()
    if not added:
        raise SystemExit("harness/integrations is not in this history; pass --base REV")
    return _git("rev-parse", added[-1].decode() + "^").decode().strip()


def export(rev: str, into: Path) -> Path:
    """The harness package as it was at ``rev``, in ``into``."""
    data = _git("archive", "--format=tar", rev, "harness")
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def probe(path: Path) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={"PYTHONPATH": str(path), "PYTHONDONTWRITEBYTECODE": "1", "PATH": ""},
        check=True,
        capture_output=True,
        text=True,
        cwd=path,
    ).stdout
    result: dict[str, object] = json.loads(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default=None, help="the revision to compare with")
    parser.add_argument("--reps", type=int, default=21)
    args = parser.parse_args()
    base_rev = args.base or default_base()
    with tempfile.TemporaryDirectory() as tmp:
        base = export(base_rev, Path(tmp) / "base")
        now = export("HEAD", Path(tmp) / "now")
        for path in (base, now):  # warm the file cache and the bytecode of dependencies
            probe(path)
        times: dict[str, list[float]] = {"base": [], "now": []}
        loaded: set[str] = set()
        for _ in range(args.reps):
            for name, path in (("base", base), ("now", now)):
                result = probe(path)
                times[name].append(float(result["seconds"]))  # type: ignore[arg-type]
                if name == "now":
                    loaded.update(result["frameworks"])  # type: ignore[arg-type]
    base_s, now_s = statistics.median(times["base"]), statistics.median(times["now"])
    ratio = now_s / base_s
    print(f"import harness, median of {args.reps} fresh interpreters each (interleaved)")
    print(f"  before the adapters ({base_rev[:12]}): {base_s * 1000:7.1f} ms")
    print(f"  now (HEAD):                          {now_s * 1000:7.1f} ms")
    print(
        f"  ratio now/before: {ratio:.3f}  (target <= 1.10: {'met' if ratio <= 1.10 else 'MISSED'})"
    )
    print(f"  frameworks imported by `import harness`: {', '.join(sorted(loaded)) or 'none'}")
    if loaded or ratio > 1.10:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

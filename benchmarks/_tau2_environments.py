"""tau2-bench's own ``get_environment()``, timed in tau2's own Python for fresh_environment.py.

    TAU2_PYTHON _tau2_environments.py SHIPPED DOMAIN [DOMAIN ...]

Run by ``benchmarks/fresh_environment.py`` with tau2's ``src`` on ``PYTHONPATH`` and its data
folder in ``TAU2_DATA_DIR``; not a benchmark of its own. ``SHIPPED`` is the folder holding the
harness's copies of upstream's data (``<domain>/data/``): a file a domain's ``get_environment``
reads that tau2's data folder lacks (a checkout without airline's ``db.json``, say) is read from
the harness's copy, the same bytes upstream ships, and the reply names it.

It imports each domain's environment module and calls ``get_environment()`` once (warm-up),
then answers one JSON line on its standard output per line read from its standard input:

- first, unasked: ``{"python": ..., "domains": {domain: {"substituted": [file, ...]} or
  {"error": "..."}}}``;
- for ``{"domain": d, "seconds": s, "collector": c}``: ``get_environment()`` called again and
  again for ``s`` seconds of wall time (at least once), each call timed: ``{"cpu": [s, ...],
  "wall": [s, ...]}`` (``time.process_time`` and ``time.perf_counter``, seconds); with ``c``
  false the garbage collector is off while the calls run, and collects after them, untimed.

Anything tau2 prints goes to standard error.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def _substitute_missing(module: Any, shipped: Path) -> list[str]:
    """Point the module's data paths whose file is missing at the harness's copy, if any."""
    substituted = []
    for name, value in vars(module).items():
        if not (name.endswith("_PATH") and isinstance(value, Path)) or value.exists():
            continue
        copy = shipped / value.name
        if copy.is_file():
            setattr(module, name, copy)
            substituted.append(value.name)
    return substituted


def _load(domain: str, shipped: Path) -> tuple[Any, dict[str, Any]]:
    module = importlib.import_module(f"tau2.domains.{domain}.environment")
    substituted = _substitute_missing(module, shipped / domain / "data")
    module.get_environment()
    return module.get_environment, {"substituted": substituted}


def timed(
    steps: Sequence[Callable[..., Any]], seconds: float, collector: bool
) -> dict[str, list[float]]:
    """Run ``steps`` again and again for ``seconds`` of wall time (at least once), each step
    given the previous one's result: CPU and wall seconds of each run (``cpu``, ``wall``) and,
    with more than one step, each step's CPU seconds (``cpu_0``, ``cpu_1``, ...). Without the
    ``collector`` the garbage collector is off while they run, and collects after, untimed."""
    out: dict[str, list[float]] = {"cpu": [], "wall": []}
    parts: list[list[float]] = [out.setdefault(f"cpu_{i}", []) for i in range(len(steps))]
    if not collector:
        gc.disable()
    until = time.perf_counter() + seconds
    try:
        while not out["cpu"] or time.perf_counter() < until:
            value: Any = None
            w0 = time.perf_counter()
            c0 = c = time.process_time()
            for i, step in enumerate(steps):
                value = step() if i == 0 else step(value)
                now = time.process_time()
                parts[i].append(now - c)
                c = now
            out["wall"].append(time.perf_counter() - w0)
            out["cpu"].append(c - c0)
    finally:
        gc.enable()
    gc.collect()
    if len(steps) == 1:
        del out["cpu_0"]
    return out


def main() -> None:
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout = sys.stderr  # tau2's own prints must not mix with the replies
    shipped, domains = Path(sys.argv[1]), sys.argv[2:]
    environments: dict[str, Any] = {}
    found: dict[str, dict[str, Any]] = {}
    for domain in domains:
        try:
            environments[domain], found[domain] = _load(domain, shipped)
        except Exception as exc:
            traceback.print_exc()
            found[domain] = {"error": f"{type(exc).__name__}: {exc}"}
    replies.write(json.dumps({"python": sys.version.split()[0], "domains": found}) + "\n")
    for line in sys.stdin:
        asked = json.loads(line)
        figures = timed([environments[asked["domain"]]], asked["seconds"], asked["collector"])
        replies.write(json.dumps(figures) + "\n")


if __name__ == "__main__":
    main()

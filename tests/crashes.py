"""An episode left as a killed process leaves it, inside the test's own process."""

from __future__ import annotations

from typing import Any


def die(ep: Any) -> None:
    """Leave ``ep`` (open) as a killed process would: its connection gone, nothing finished,
    and its claim on the episode still in the store but no longer renewed, as a killed
    process's keeper dies with it. Left running, the keeper would go on renewing for the rest
    of the test session, against a store the test has removed by then, logging each failure."""
    ep._writer.close()
    ep._writer = None
    claim, ep._claim = ep._claim, None
    if claim is not None:
        claim._stop.set()
        claim._keeper.join()

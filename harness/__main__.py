"""``python -m harness``: the command line, as ``harness`` runs it."""

from .cli import main

main()

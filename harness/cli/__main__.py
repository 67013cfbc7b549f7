"""``python -m harness.cli``: the command line."""

from . import main

main()

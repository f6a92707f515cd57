"""``python -m goodlens``: the same as the ``goodlens`` command."""

from goodlens.cli import main

main(prog_name="goodlens")

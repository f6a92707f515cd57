"""``python -m tests.record [NAME ...]``: record the named runs (all by default)."""

import sys

from tests.record import main

sys.exit(main(sys.argv[1:]))

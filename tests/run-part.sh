#!/usr/bin/env bash
# One pytest run of `make test` (the light tests, then the heavy ones), capped at PART_LIMIT
# seconds (each takes 5-9 minutes here). A hang that no test's own 300 s timeout catches
# (xdist's scheduler once waited forever on a replacement worker, and CI ran into its own
# 90-minute limit with nothing said) then fails this run with a line saying so: at the cap
# every pytest process (xdist's controller and workers) writes where each of its threads is
# (SIGUSR1, tests/conftest.py), printed below, and all are killed 30 s later.
#   usage: PYTHON=.venv/bin/python PART_LIMIT=1500 tests/run-part.sh NAME [pytest args]
set -u
name=$1
shift
limit=${PART_LIMIT:-1500}
stacks=$(mktemp -d)
echo "== $name"
GOODLENS_TEST_STACKS=$stacks timeout -s USR1 -k 30 "$limit" \
  "${PYTHON:-.venv/bin/python}" -m pytest -q -p no:cacheprovider --durations=15 "$@"
st=$?
if [ "$st" -eq 124 ] || [ "$st" -eq 137 ]; then
  echo "== $name did not end in $limit s: stopped. Where each pytest process was:"
  for f in "$stacks"/*.txt; do
    if [ -s "$f" ]; then echo "-- pytest process $(basename "$f" .txt)"; cat "$f"; fi
  done
fi
rm -rf "$stacks"
exit "$st"

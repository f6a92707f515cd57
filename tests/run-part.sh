#!/usr/bin/env bash
# One pytest run of `make test` (the light tests, then the heavy ones), capped at PART_LIMIT
# seconds (each takes 5-9 minutes here). A hang that no test's own 300 s timeout catches
# (xdist's scheduler once waited forever on a replacement worker, and CI ran into its own
# 90-minute limit with nothing said) then fails this run with a line saying so: at the cap
# every pytest process (xdist's controller and workers) writes where each of its threads is
# (SIGUSR1, tests/conftest.py), printed below, and all are killed 30 s later.
# A pytest process that dies of a native abort or a segfault leaves a core file in the repo
# root (the workers' folder): faulthandler shows only its Python threads, and a message the
# dying C++ code wrote went to the test's captured output, lost with the process; so the
# crashing thread's native stack is printed here (gdb, installed by `make test`) and the
# core removed. glibc's own fatal messages go to stderr, not to the terminal, too.
#   usage: PYTHON=.venv/bin/python PART_LIMIT=1500 tests/run-part.sh NAME [pytest args]
set -u
name=$1
shift
limit=${PART_LIMIT:-1500}
stacks=$(mktemp -d)
echo "== $name"
ulimit -c unlimited 2>/dev/null
rm -f core core.[0-9]*
LIBC_FATAL_STDERR_=1 GOODLENS_TEST_STACKS=$stacks timeout -s USR1 -k 30 "$limit" \
  "${PYTHON:-.venv/bin/python}" -m pytest -q -p no:cacheprovider --durations=25 "$@"
st=$?
if [ "$st" -eq 124 ] || [ "$st" -eq 137 ]; then
  echo "== $name did not end in $limit s: stopped. Where each pytest process was:"
  for f in "$stacks"/*.txt; do
    if [ -s "$f" ]; then echo "-- pytest process $(basename "$f" .txt)"; cat "$f"; fi
  done
fi
rm -rf "$stacks"
for core in core core.[0-9]*; do
  [ -f "$core" ] || continue
  echo "== a pytest process of $name dumped $core: its crashing thread, then every thread"
  if command -v gdb >/dev/null; then
    timeout 300 gdb -q -batch -iex "set auto-load python-scripts off" \
      -ex "set print frame-arguments none" -ex "info threads" -ex "bt 60" -ex "thread apply all bt 12" \
      "${PYTHON:-.venv/bin/python}" "$core" 2>&1 | grep -v "^\[New LWP" | head -600
  else
    echo "(gdb is not installed: no native stack)"
  fi
  rm -f "$core"
done
exit "$st"

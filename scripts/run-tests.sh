#!/usr/bin/env bash
# Run every check: ruff, the core/Qt import contract, and the whole pytest suite
# (offscreen, plus one real window on Xvfb).
set -euo pipefail
cd "$(dirname "$0")/.."
export QT_QPA_PLATFORM=offscreen
.venv/bin/ruff check .
.venv/bin/lint-imports
# The slowest tests are listed at the end: what to look at when CI creeps up. Two workers
# (TORCHMEM_TEST_WORKERS, 0 for none), each taking whole modules (--dist loadscope), so
# that a module's fixtures (an sshd cluster, a leak corpus) start once. A worker that dies
# is not replaced: under loadscope, xdist 3.8 then waits forever for work it requeued
# (pytest-xdist #1323, #1363); the run ends and names the test instead.
workers=${TORCHMEM_TEST_WORKERS:-2}
parallel=()
# The longest modules go first (tests/conftest.py), not xdist's order by test count.
[ "$workers" != 0 ] && parallel=(-n "$workers" --dist loadscope --no-loadscope-reorder
  --max-worker-restart=0)
# One OpenMP thread per torch process (the tests' scripts, trials and the windows' own):
# the workers already keep every core busy, and torch's default of a thread per core
# then spins in OpenMP's barriers for the cores another process holds. Two of the leak
# corpus's scripts side by side took 14.1 s with the default and 4.0 s with one thread
# each (one alone: 3.6-3.8 s either way). A developer's own setting is kept.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/python -m pytest --durations=20 "${parallel[@]}" "$@"

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
[ "$workers" != 0 ] && parallel=(-n "$workers" --dist loadscope --max-worker-restart=0)
exec .venv/bin/python -m pytest --durations=20 "${parallel[@]}" "$@"

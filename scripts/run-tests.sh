#!/usr/bin/env bash
# Run every check: ruff, the core/Qt import contract, and the whole pytest suite
# (offscreen, plus one real window on Xvfb).
set -euo pipefail
cd "$(dirname "$0")/.."
export QT_QPA_PLATFORM=offscreen
.venv/bin/ruff check .
.venv/bin/lint-imports
# The slowest tests are listed at the end: what to look at when CI creeps up.
exec .venv/bin/python -m pytest --durations=20 "$@"

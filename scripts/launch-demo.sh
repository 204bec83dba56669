#!/usr/bin/env bash
# Open the torchmem window on the bundled demo. Without a display (a server, a container),
# run it on a virtual X screen so the command still works; say so.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${DISPLAY:-}" ] && [ -z "${WAYLAND_DISPLAY:-}" ] && [ -z "${QT_QPA_PLATFORM:-}" ]; then
  echo "launch: no display found; running on a virtual screen (xvfb-run)." >&2
  echo "launch: on a desktop, run: .venv/bin/torchmem --demo" >&2
  exec xvfb-run -a -s "-screen 0 1400x900x24" .venv/bin/torchmem --demo "$@"
fi
exec .venv/bin/torchmem --demo "$@"

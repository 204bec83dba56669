#!/usr/bin/env bash
# Set up everything torchmem needs on a fresh Debian/Ubuntu machine, idempotently:
# system libraries for Qt and a virtual screen (when run as root, or with sudo), then a
# virtual environment in .venv with torch, the app and its test tools.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for pkg in xvfb libxcb-icccm4 libxcb-keysyms1 libxcb-cursor0 libxkbcommon-x11-0 \
           libegl1 libgl1 libfontconfig1 libdbus-1-3 libxcb-shape0 libxcb-xinerama0 \
           libxcb-randr0 libxcb-render-util0 libxcb-image0 gdb openssh-client; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "setup: installing system packages: ${need_apt[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "setup: no apt-get; make sure Qt's xcb libraries and Xvfb are installed" >&2
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PY --version)"
  $PY -m venv .venv
fi
stamp=.venv/.torchmem-setup
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ core/snapshots/_scan.c -nt "$stamp" ] || [ core/tensors/_heap.c -nt "$stamp" ]; then
  # torch pinned: an unpinned torch pulls a multi-GB CUDA build.
  pkgs=("torch==${TORCH_VERSION:-2.13.0}" -e '.[test]')
  # uv installs the same packages as pip, from the same index, in a third of the time
  # (a fresh set-up: 26-30 s against 51 s); pip stays the fallback where uv cannot be
  # had. uv does not read pip's configuration, so the local wheel folders pip is told of
  # (find-links: the machine's torch wheel) are passed on. --compile-bytecode, as pip
  # does: where PYTHONDONTWRITEBYTECODE is set (this VM), a module not compiled at install
  # is compiled again in every process, and the test suite took 1040 s instead of 570.
  if .venv/bin/python -m pip install -q uv 2>/dev/null; then
    links=$(.venv/bin/python -m pip config get global.find-links 2>/dev/null || true)
    UV_FIND_LINKS=${UV_FIND_LINKS:-$links} \
      .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python "${pkgs[@]}"
  else
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q "${pkgs[@]}"
  fi
  touch "$stamp"
fi
echo "setup: ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"

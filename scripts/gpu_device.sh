#!/usr/bin/env bash
# Runs scripts/gpu_check.py on a lent GPU machine that cannot reach a package registry and
# whose python3 already holds a CUDA build of torch (so `make setup`, which installs the
# CPU wheel from the registry, is not the way there). torchmem is laid out from this
# checkout as the installed package would be (core/ is `torchmem`), and the pure-Python
# dependencies that image lacks travel as wheels in .whl/ (docs/gpu.md says which).
#
#   bash scripts/gpu_device.sh --out "$OUT" [--only NAME ...]
set -euo pipefail
cd "$(dirname "$0")/.."
site="${TMPDIR:-/tmp}/torchmem-site"
rm -rf "$site"
mkdir -p "$site/torchmem"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$site" .whl/*.whl
fi
cp -r core/. "$site/torchmem/"
cp -r gui "$site/torchmem/gui"
cp -r resources "$site/torchmem/resources"
find "$site" -name __pycache__ -prune -exec rm -rf {} +
# The optional C helpers (pyproject.toml's ext-modules), as setuptools would build them.
include=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
suffix=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
for source in core/snapshots/_scan.c core/tensors/_heap.c; do
    target="$site/torchmem/${source#core/}"
    if ! cc -O2 -shared -fPIC -I"$include" "$source" -o "${target%.c}$suffix" 2>/dev/null; then
        echo "$source not built here: torchmem falls back to its Python version"
    fi
done
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c 'import torch, torchmem; print("torch", torch.__version__, "torchmem from", torchmem.__file__)'
exec python3 scripts/gpu_check.py "$@"

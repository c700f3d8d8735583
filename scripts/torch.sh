#!/usr/bin/env bash
# The PyTorch test bed: torch and torchvision from PyPI, pinned, in their own
# ignored venv (.venv-torch), apart from TensorFlow's: the two pull numpy
# and protobuf versions that need not agree, and torch with its CUDA
# dependencies is ~5 GB that a TensorFlow-only user does not want.
# Idempotent: a stamp of tests/requirements-torch.txt says it is done.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
log() { printf '[torch] %s\n' "$*"; }
# shellcheck source=scripts/disk.sh
. "$ROOT/scripts/disk.sh"

PYTHON="${PYTHON:-python3}"
REQ="$ROOT/tests/requirements-torch.txt"
VENV="$ROOT/.venv-torch"
STAMP="$VENV/.plumber-requirements.sha256"

if [ ! -x "$VENV/bin/python" ]; then
    log "venv: creating $VENV ($("$PYTHON" --version 2>&1))"
    "$PYTHON" -m venv "$VENV"
fi
want="$(sha256sum "$REQ" | cut -d' ' -f1)"
have="$(cat "$STAMP" 2>/dev/null || true)"
if [ "$want" = "$have" ] && "$VENV/bin/python" -c 'import torch, torchvision' >/dev/null 2>&1; then
    log "venv: up to date (stamp ${want:0:12}), torch imports"
    exit 0
fi
# The wheels (~3 GB) sit in a temporary folder beside the installed ~5.5 GB
# until pip is done; --no-cache-dir keeps them from staying on in ~/.cache.
need_disk "$ROOT" 10 "installing torch and torchvision"
need_disk "${TMPDIR:-/tmp}" 4 "downloading the torch wheels"
log "venv: pip install -r tests/requirements-torch.txt"
"$VENV/bin/python" -m pip install --disable-pip-version-check --no-cache-dir -q -r "$REQ"
"$VENV/bin/python" -c 'import torch, torchvision; print("[torch] torch", torch.__version__, "torchvision", torchvision.__version__)'
printf '%s\n' "$want" > "$STAMP"

#!/usr/bin/env bash
# Prepare a Debian 12 machine (root) for building and testing plumber-probe.
# Idempotent: every step checks first and only acts when something is missing.
#   1. apt packages for the eBPF/C side (clang libelf-dev pkg-config zlib1g-dev make gcc),
#      and chromium for the report.html test
#   2. .venv in the repo root with tests/requirements.txt (tensorflow-cpu, protobuf, numpy)
#   3. .venv-torch with tests/requirements-torch.txt (torch, torchvision: scripts/torch.sh)
#   4. tracefs mounted at /sys/kernel/tracing (best effort)
# Rust is not built here.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

log() { printf '[setup] %s\n' "$*"; }
# shellcheck source=scripts/disk.sh
. "$ROOT/scripts/disk.sh"

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
fi

# ---------------------------------------------------------------- apt packages
# bpftool: the kill -9 test lists loaded BPF programs; util-linux: setpriv
# for the not-root test; chromium: tests/html/check_report.py opens
# report.html in it headless (over the DevTools pipe, no chromium-driver);
# tmux: the `top` test drives the live view in it.
APT_PACKAGES=(clang libelf-dev pkg-config zlib1g-dev make gcc bpftool util-linux chromium tmux)

pkg_installed() {
    # dpkg -s exits 0 for removed-but-configured packages too; check the status line.
    dpkg -s "$1" 2>/dev/null | grep -q '^Status: install ok installed'
}

PYTHON="${PYTHON:-python3}"
missing=()
for p in "${APT_PACKAGES[@]}"; do
    if pkg_installed "$p"; then
        log "apt: $p already installed"
    else
        missing+=("$p")
    fi
done
# python3 itself, and venv support for Debian's python3 (a pyenv/other python has ensurepip).
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    missing+=(python3 python3-venv python3-pip)
elif ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    missing+=(python3-venv)
fi

if [ "${#missing[@]}" -gt 0 ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        log "ERROR: missing packages (${missing[*]}) and no apt-get" >&2
        exit 1
    fi
    log "apt: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update
    $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
else
    log "apt: nothing to install"
fi

# ---------------------------------------------------------------- python venv
REQ="$ROOT/tests/requirements.txt"
VENV="$ROOT/.venv"
STAMP="$VENV/.plumber-requirements.sha256"

if [ ! -x "$VENV/bin/python" ]; then
    log "venv: creating $VENV ($("$PYTHON" --version 2>&1))"
    "$PYTHON" -m venv "$VENV"
else
    log "venv: $VENV exists ($("$VENV/bin/python" --version 2>&1))"
fi

want_sha="$(sha256sum "$REQ" | cut -d' ' -f1)"
have_sha="$(cat "$STAMP" 2>/dev/null || true)"
need_install=0
if [ "$want_sha" != "$have_sha" ]; then
    log "venv: requirements stamp differs (want ${want_sha:0:12}, have ${have_sha:-none})"
    need_install=1
elif ! TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" -c 'import tensorflow' >/dev/null 2>&1; then
    log "venv: 'import tensorflow' fails"
    need_install=1
fi

if [ "$need_install" -eq 1 ]; then
    need_disk "$ROOT" 4 "installing tensorflow-cpu"
    log "venv: pip install -r tests/requirements.txt"
    "$VENV/bin/python" -m pip install --disable-pip-version-check --no-cache-dir -r "$REQ"
    log "venv: checking 'import tensorflow'"
    if ! tfout="$(TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" -c 'import tensorflow as tf; print(tf.__version__)' 2>&1)"; then
        printf '%s\n' "$tfout" >&2
        log "ERROR: 'import tensorflow' still fails after pip install" >&2
        exit 1
    fi
    log "venv: tensorflow $(printf '%s\n' "$tfout" | tail -n1)"
    printf '%s\n' "$want_sha" > "$STAMP"
    log "venv: wrote stamp $STAMP"
else
    log "venv: requirements up to date (stamp ${want_sha:0:12}), tensorflow imports"
fi

# ---------------------------------------------------------------- PyTorch
# The PyTorch test bed, in its own venv (.venv-torch).
bash "$ROOT/scripts/torch.sh"

# ---------------------------------------------------------------- tracefs
if mountpoint -q /sys/kernel/tracing 2>/dev/null; then
    log "tracefs: already mounted at /sys/kernel/tracing"
else
    log "tracefs: mounting at /sys/kernel/tracing"
    $SUDO mount -t tracefs nodev /sys/kernel/tracing || log "tracefs: mount failed (continuing)"
fi

log "done"

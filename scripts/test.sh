#!/usr/bin/env bash
# The README's second command: the whole test suite (unit, golden, BPF and
# real-TensorFlow end-to-end tests). Needs root for the BPF tests, as CI has.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# A fresh checkout builds once: incremental caches only cost disk there.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

bash scripts/setup.sh
echo "[test] python self-tests"
.venv/bin/python tests/python/test_decode_stats.py
.venv/bin/python tests/python/test_decode_pprof.py
.venv/bin/python tests/python/test_groundtruth.py
# PyTorch workloads: prints SKIP without .venv-torch (scripts/torch.sh).
.venv/bin/python tests/python/test_torch_workloads.py
# Lints first: cheap, and a failure here is a quicker signal.
if cargo fmt --version >/dev/null 2>&1; then
    echo "[test] cargo fmt --check"
    cargo fmt --all -- --check
fi
if cargo clippy --version >/dev/null 2>&1; then
    echo "[test] cargo clippy"
    cargo clippy --workspace --all-targets --quiet -- -D warnings
fi
echo "[test] cargo test"
# One test at a time: the end-to-end tests run real TensorFlow workloads on
# a 2-core machine and look at the machine's loaded BPF programs.
cargo test --workspace -- --test-threads=1

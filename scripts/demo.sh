#!/usr/bin/env bash
# The README's first command: set everything up, start the bundled demo
# workload (a deliberately mis-configured tf.data pipeline), attach
# plumber-probe to it by PID and print what it found.
#   DEMO_SECONDS   how long to record (default 10)
#   DEMO_OUT       output directory (default out/demo)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/setup.sh
echo "[demo] building plumber-probe (release)"
cargo build --release -p plumber-probe
PROBE="$ROOT/target/release/plumber-probe"
SECONDS_TO_RECORD="${DEMO_SECONDS:-10}"
OUT="${DEMO_OUT:-out/demo}"
mkdir -p "$OUT"

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

LOG="$OUT/workload.log"
echo "[demo] starting the demo workload (tests/workloads/demo.py)"
.venv/bin/python tests/workloads/demo.py --seconds $((SECONDS_TO_RECORD + 60)) >"$LOG" 2>"$OUT/workload.err" &
WPID=$!
trap 'kill $WPID 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
    grep -q '^READY' "$LOG" 2>/dev/null && break
    kill -0 $WPID 2>/dev/null || { echo "[demo] the workload died; see $OUT/workload.err" >&2; exit 1; }
    sleep 0.2
done
grep -q '^READY' "$LOG" || { echo "[demo] the workload never became ready" >&2; exit 1; }
echo "[demo] attaching: $SUDO plumber-probe --pid $WPID --duration $SECONDS_TO_RECORD --output $OUT"
$SUDO "$PROBE" --pid "$WPID" --duration "$SECONDS_TO_RECORD" --output "$OUT"

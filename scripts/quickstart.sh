#!/usr/bin/env bash
# Quickstart: installs what is missing, builds release, installs `ate` (and `kubectl-ate`) into
# /usr/local/bin, builds the demo images, and starts the whole system with `ate up` in the
# foreground (Ctrl-C stops it). Run as root on Debian 12.
#
#   scripts/quickstart.sh [extra `ate up` flags]
#
# Environment: ATE_STATE_DIR (default /var/lib/ate), ATE_SKIP_SETUP=1 to skip the package step.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
STATE_DIR=${ATE_STATE_DIR:-/var/lib/ate}

if [[ ${ATE_SKIP_SETUP:-0} != 1 ]]; then
  bash scripts/setup.sh
fi
echo "==> cargo build --release -p ate-cli" >&2
cargo build --release -p ate-cli
install -m 0755 target/release/ate /usr/local/bin/ate
ln -sf /usr/local/bin/ate /usr/local/bin/kubectl-ate
echo "==> demo images into $STATE_DIR/images" >&2
mkdir -p "$STATE_DIR"
workloads/build-images.sh "$STATE_DIR/images" >&2
echo "==> ate up (Ctrl-C to stop)" >&2
exec /usr/local/bin/ate up --state-dir "$STATE_DIR" "$@"

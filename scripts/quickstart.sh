#!/usr/bin/env bash
# Quickstart: installs what is missing, builds release, installs `ate` (and `kubectl-ate`) into
# /usr/local/bin, builds the demo images, and starts the whole system with `ate up` in the
# foreground (Ctrl-C stops it). Run as root on Debian 12.
#
#   scripts/quickstart.sh [extra `ate up` flags]
#
# Environment (the defaults are what a user wants; the README test overrides them):
#   ATE_STATE_DIR      state directory (default /var/lib/ate)
#   ATE_SKIP_SETUP=1   skip installing packages (scripts/setup.sh)
#   ATE_BUILD_PROFILE  cargo profile to build (default release)
#   ATE_INSTALL_DIR    where `ate` is installed (default /usr/local/bin)
#   ATE_BINARY         install this prebuilt `ate` instead of building one
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
STATE_DIR=${ATE_STATE_DIR:-/var/lib/ate}
PROFILE=${ATE_BUILD_PROFILE:-release}
INSTALL_DIR=${ATE_INSTALL_DIR:-/usr/local/bin}

if [[ ${ATE_SKIP_SETUP:-0} != 1 ]]; then
  bash scripts/setup.sh
fi
BINARY=${ATE_BINARY:-}
if [[ -z $BINARY ]]; then
  echo "==> cargo build --profile $PROFILE -p ate-cli" >&2
  cargo build --profile "$PROFILE" -p ate-cli
  case $PROFILE in dev) out=debug ;; *) out=$PROFILE ;; esac
  BINARY=target/$out/ate
fi
mkdir -p "$INSTALL_DIR"
install -m 0755 "$BINARY" "$INSTALL_DIR/ate"
ln -sf "$INSTALL_DIR/ate" "$INSTALL_DIR/kubectl-ate"
echo "==> demo images into $STATE_DIR/images" >&2
mkdir -p "$STATE_DIR"
workloads/build-images.sh "$STATE_DIR/images" >&2
echo "==> ate up (Ctrl-C to stop)" >&2
exec "$INSTALL_DIR/ate" up --state-dir "$STATE_DIR" "$@"

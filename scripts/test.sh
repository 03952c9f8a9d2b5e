#!/usr/bin/env bash
# The project's test command.
#
#   scripts/test.sh [extra args for cargo nextest run]
#
# 1. starts the test services (PostgreSQL, moto S3) unless they already run, and stops at exit the
#    ones it started;
# 2. checks formatting and clippy (main workspace and workloads/);
# 3. builds the demo workload images (OCI layouts) and exports ATE_TEST_IMAGES=<their dir>;
# 4. self-tests the workloads on loopback;
# 5. runs `cargo nextest run --workspace --no-fail-fast "$@"`.
# Every step runs even when an earlier one failed; the exit status is non-zero if any failed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

step() { printf '\n==> %s\n' "$*" >&2; }
FAILED_STEPS=()
run_step() { # name command...
  local name=$1
  shift
  step "$name"
  if "$@"; then
    return 0
  fi
  printf '==> FAILED: %s\n' "$name" >&2
  FAILED_STEPS+=("$name")
  return 1
}

ATE_TEST_SERVICES_STARTED=""
stop_services() {
  if [[ -n ${ATE_TEST_SERVICES_STARTED:-} ]]; then
    step "stopping test services: $ATE_TEST_SERVICES_STARTED"
    # shellcheck disable=SC2086 # a list of names
    scripts/test-services.sh stop $ATE_TEST_SERVICES_STARTED || true
  fi
}
trap stop_services EXIT
trap 'exit 130' INT TERM

step "test services"
if ! services_env=$(scripts/test-services.sh); then
  printf '==> FAILED: test services did not start\n' >&2
  scripts/test-services.sh stop || true
  exit 1
fi
eval "$services_env"
printf '%s\n' "$services_env" | sed 's/^/    /' >&2

export ATE_TEST_IMAGES=${ATE_TEST_IMAGES:-$ROOT/workloads/target/images}

if [[ ${CI:-} == true ]]; then
  # A clean CI build gains nothing from incremental state, which takes several GiB beside the
  # test binaries (a CI run once failed to link for want of space).
  export CARGO_INCREMENTAL=0
fi
step "disk space"
df -h "$ROOT" /tmp >&2 || true

run_step "cargo fmt --all --check" cargo fmt --all --check || true
run_step "cargo fmt --check (workloads)" cargo fmt --manifest-path workloads/Cargo.toml --all --check || true
run_step "cargo clippy --workspace --all-targets -- -D warnings" \
  cargo clippy --workspace --all-targets -- -D warnings || true
run_step "cargo clippy (workloads)" \
  cargo clippy --manifest-path workloads/Cargo.toml --release --target x86_64-unknown-linux-gnu --all-targets -- -D warnings || true

if run_step "build workload images into $ATE_TEST_IMAGES" workloads/build-images.sh "$ATE_TEST_IMAGES"; then
  run_step "workload self-test" workloads/test-workloads.sh "$ATE_TEST_IMAGES" || true
fi

run_step "cargo nextest run --workspace --no-fail-fast $*" cargo nextest run --workspace --no-fail-fast "$@" || true

if ((${#FAILED_STEPS[@]})); then
  printf '\n==> %d step(s) failed:\n' "${#FAILED_STEPS[@]}" >&2
  printf '    - %s\n' "${FAILED_STEPS[@]}" >&2
  exit 1
fi
printf '\n==> all steps passed\n' >&2

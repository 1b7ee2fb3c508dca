#!/usr/bin/env bash
# Runs every check and test: formatting, lints (native and wasm32), unit and
# integration tests, the capture helper end to end (Python), the release web
# build, and the real-browser tests.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" --browser --python

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "cargo fmt --check"
cargo fmt --check

step "cargo clippy (native)"
cargo clippy --all-targets -- -D warnings

step "cargo clippy (wasm32, web)"
cargo clippy --target wasm32-unknown-unknown --no-default-features --features web --lib --bins -- -D warnings

step "cargo test"
cargo test

step "capture helper end to end (Python: a tiny model captured small, answered full)"
"$MEMCAST_PYTHON" tests/capture/check.py target/debug/memcast

step "trunk build --release"
trunk build --release

step "browser end-to-end tests (headless Chromium)"
node --test --test-concurrency=1 tests/e2e/

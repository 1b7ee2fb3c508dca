#!/usr/bin/env bash
# Installs what building and testing memcast needs, skipping what is present.
# Sourced by .ci/serve.sh and .ci/test.sh; safe to run again and again.
# Every tool comes from a package registry (rustup, crates, npm, Debian):
# nothing downloads a prebuilt binary from anywhere else, and Trunk runs offline.
#
# Usage: source .ci/setup.sh [--browser] [--python]
#   --browser: also Chromium + ChromeDriver
#   --python:  also the capture helper's Python venv (torch, transformers, peft),
#              in $MEMCAST_VENV (default ~/.cache/memcast/capture-venv); its
#              python is exported as MEMCAST_PYTHON

set -euo pipefail

MEMCAST_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$MEMCAST_ROOT"
export PATH="$MEMCAST_ROOT/node_modules/.bin:$HOME/.cargo/bin:$PATH"

say() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

apt_install() {
  say "installing Debian packages: $*"
  as_root apt-get update -qq
  if ! DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null; then
    # Seen on a fresh machine: the image's perl was older than the libperl that
    # chromium's dependencies pull in after `apt-get update`, and dpkg stopped
    # half-way ("unmet dependencies"). Let apt finish what it started, then retry.
    say "apt-get install failed; running apt-get --fix-broken install and retrying"
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --fix-broken >/dev/null
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
  fi
}

# 1. The WebAssembly target.
if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  say "adding the wasm32-unknown-unknown target"
  rustup target add wasm32-unknown-unknown
fi

# 2. Trunk 0.21.14 (0.22 needs a newer rustc). LTO off halves the build time.
if ! trunk --version 2>/dev/null | grep -qx 'trunk 0.21.14'; then
  say "installing trunk 0.21.14 (about 9 minutes on 2 cores, once)"
  CARGO_PROFILE_RELEASE_LTO=false cargo install trunk --version 0.21.14 --locked
fi

# 3. wasm-bindgen-cli at exactly the version Cargo.lock pins (without --locked:
#    its own lockfile pins a crate the registry no longer has).
wbg_version="$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)"
if [ -z "$wbg_version" ]; then
  say "Cargo.lock names no wasm-bindgen version; run: cargo fetch"
  exit 1
fi
if ! grep -q "^wasm_bindgen = \"$wbg_version\"" Trunk.toml; then
  say "Trunk.toml [tools] wasm_bindgen must be \"$wbg_version\" (the version in Cargo.lock)"
  exit 1
fi
if ! wasm-bindgen --version 2>/dev/null | grep -qx "wasm-bindgen $wbg_version"; then
  say "installing wasm-bindgen-cli $wbg_version"
  cargo install wasm-bindgen-cli --version "$wbg_version" --force
fi

# 4. Node tools: wasm-opt (npm binaryen@132; never Debian's binaryen 108, whose
#    output breaks the page) and playwright-core (drives the system Chromium).
if ! command -v npm >/dev/null 2>&1; then
  apt_install nodejs npm
fi
if [ ! -x node_modules/.bin/wasm-opt ] || [ ! -f node_modules/playwright-core/package.json ]; then
  say "installing node tools from package-lock.json"
  npm ci --no-audit --no-fund --loglevel=error
fi

# 5. Offline Trunk builds with `cargo build --offline`: make sure every crate is here.
cargo fetch --quiet

# 6. Chromium and ChromeDriver from Debian, for the browser tests only.
case " $* " in *" --browser "*)
  if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    apt_install chromium chromium-driver
  fi
esac

# 7. The capture helper's test venv: torch, transformers and peft from PyPI at
#    the versions tests/capture/requirements.txt pins. Seen here: PyPI's torch
#    wheel does not import without its CUDA wheels (libtorch_cuda links them),
#    so a CPU-only install of it is not possible: about 4 GB, 10 minutes on a
#    bare machine, once. Kept outside the checkout so that a fresh clone (CI)
#    reuses it; made again when the pins change; --no-cache-dir keeps the
#    wheels from taking the same space twice.
case " $* " in *" --python "*)
  venv="${MEMCAST_VENV:-$HOME/.cache/memcast/capture-venv}"
  pins="$MEMCAST_ROOT/tests/capture/requirements.txt"
  if ! cmp -s "$pins" "$venv/memcast-requirements.txt" || ! "$venv/bin/python" -c 'import torch, transformers, peft' 2>/dev/null; then
    say "making the capture helper's Python venv in $venv (torch, transformers, peft: about 4 GB to download, once)"
    if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
      apt_install python3-venv
    fi
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir --only-binary=:all: -r "$pins"
    "$venv/bin/python" -c 'import torch, transformers, peft'
    cp "$pins" "$venv/memcast-requirements.txt"
  fi
  export MEMCAST_PYTHON="$venv/bin/python"
esac

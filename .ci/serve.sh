#!/usr/bin/env bash
# Builds the app and serves it on http://127.0.0.1:${PORT:-8080}/ (Ctrl-C stops it).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
port="${PORT:-8080}"
printf '\n\033[1mmemcast will be served at http://127.0.0.1:%s/ once the build finishes\033[0m\n\n' "$port"
exec trunk serve --release --address 127.0.0.1 --port "$port"

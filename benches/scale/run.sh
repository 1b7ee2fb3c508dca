#!/usr/bin/env bash
# The sizes of issue 33 (any depth × any length), timed natively: each case
# is `memcast` (release build) under /usr/bin/time -v, a wall-clock timeout
# and an address-space limit (prlimit --as), and reported as it ended —
# ok (wall time, peak RSS, the figures the issue names), refused (the core's
# message: the request is beyond the memory budget or a limit), crashed
# (killed by a signal: an allocation failure under the limit aborts),
# timeout, or error. Nothing is committed; the table goes to stdout.
# Each case compares one GPU (a100-80gb, the default target), except those
# named *-every-gpu: every preset, as the CLI does without --gpu. There each
# GPU whose run at capacity parts from the unlimited run (its reserved bytes
# pass the GPU's room) simulates the rest of the job on its own, so the time
# grows with the GPUs that part.
#
#   bash benches/scale/run.sh                # every case, the CLI's default budget
#   BUDGET=4GiB bash benches/scale/run.sh    # with --memory-budget 4GiB
#   LIMIT_GIB=4 TIMEOUT_S=120 bash benches/scale/run.sh
#   bash benches/scale/run.sh NAME...        # only the cases named
#
# The browser's figures: `node benches/browser.mjs --scale` (same cases).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

limit_gib=${LIMIT_GIB:-8}
timeout_s=${TIMEOUT_S:-300}
budget=${BUDGET:-}
shared=${MEMCAST_SHARED:-../shared}
gen="$shared/fixtures/traces-llm/llama_gen16_dynamic.json.gz"
train="$shared/fixtures/traces-depth/llama-small_adamw_bs4_seq128_L2.json.gz"
for f in "$gen" "$train"; do
  [ -f "$f" ] || { echo "missing fixture $f: put ../shared beside the checkout or set MEMCAST_SHARED" >&2; exit 1; }
done
cargo build --release --quiet --bin memcast
cli=./target/release/memcast

# name | command after `memcast` | target (the issue's)
cases=(
  "gen-1024|estimate $gen --new-tokens 1024|-"
  "gen-4096|estimate $gen --new-tokens 4096|-"
  "gen-8192|estimate $gen --new-tokens 8192|issue: aborted under a 4 GB limit"
  "gen-L32-1024|estimate $gen --layers 32 --new-tokens 1024|< 2 s, < 512 MiB, peak reserved 1,356,857,344 B"
  "gen-L80-4096|estimate $gen --layers 80 --new-tokens 4096|-"
  "gen-L80-32768|estimate $gen --layers 80 --new-tokens 32768|< 10 s, < 1 GiB, KV cache 80 × 4,096 × 32,799 B"
  "gen-L80-32768-every-gpu|estimate $gen --layers 80 --new-tokens 32768|(every preset, the CLI's default)"
  "context-L80|whatif context $gen --layers 80 --budget 131072|< 30 s"
  "context-L80-every-gpu|whatif context $gen --layers 80 --budget 131072|(every preset, the CLI's default)"
  "train-L160|estimate $train --layers 160|< 1 s"
)
if [ $# -gt 0 ]; then
  picked=()
  for c in "${cases[@]}"; do
    for name in "$@"; do [ "${c%%|*}" = "$name" ] && picked+=("$c"); done
  done
  cases=("${picked[@]}")
fi

# Seconds of "Elapsed (wall clock)" in /usr/bin/time -v output.
wall_of() { awk -F': ' '/Elapsed \(wall clock\)/ {n=split($2,a,":"); s=0; for(i=1;i<=n;i++) s=s*60+a[i]; print s}' <<<"$1"; }
rss_of() { awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2/1024}' <<<"$1"; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "| case | request | status | wall s | peak RSS MiB | peak reserved B | KV cache at end B | issue's target |"
echo "|---|---|---|---|---|---|---|---|"
for c in "${cases[@]}"; do
  IFS='|' read -r name request target <<<"$c"
  read -r -a argv <<<"$request"
  # One GPU (the default target), but where the case asks for every preset.
  args=("${argv[@]}" --json)
  [[ $name == *-every-gpu ]] || args+=(--gpu a100-80gb)
  [ -n "$budget" ] && args+=(--memory-budget "$budget")
  set +e
  /usr/bin/time -v -o "$out/time" prlimit --as=$((limit_gib << 30)) \
    timeout "$timeout_s" "$cli" "${args[@]}" >"$out/json" 2>"$out/err"
  rc=$?
  set -e
  t=$(cat "$out/time")
  wall=$(wall_of "$t"); rss=$(rss_of "$t")
  reserved=-; kv=-
  case $rc in
    0)
      status=ok
      read -r reserved kv < <(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
peak = r.get("peak") or {}
gen = (r.get("summary") or {}).get("generation") or {}
pts = r.get("points")
if pts:  # whatif context: the first GPU at the longest length run on it (reserved + context)
    runs = [p["runs"][0] for p in pts if p["runs"][0]]
    peak = {"reserved_bytes": "total %d" % runs[-1]["peak_total_bytes"]} if runs else {}
print(peak.get("reserved_bytes", "-"), gen.get("kv_bytes_at_end", "-"))' "$out/json") ;;
    124) status="timeout (${timeout_s} s)" ;;
    1)
      msg=$(grep -v '^\s*Command' "$out/err" | tail -1 | sed 's/|/\\|/g')
      status="refused: ${msg#error: }" ;;
    *)
      if [ $rc -gt 128 ]; then status="crashed (signal $((rc - 128)))"; else status="error $rc: $(tail -1 "$out/err")"; fi ;;
  esac
  echo "| $name | \`memcast ${request//$shared\//}\` | $status | $wall | $rss | $reserved | $kv | $target |"
done
echo
echo "Limits: address space ${limit_gib} GiB (prlimit --as), timeout ${timeout_s} s; memory budget: ${budget:-the CLI default}; $(nproc) cores; $(date -u +%Y-%m-%d)."

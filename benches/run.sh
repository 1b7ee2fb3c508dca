#!/usr/bin/env bash
# The benchmark table of issue 8: per-stage MB/s of raw JSON (benches/pipeline.rs),
# the CLI's end-to-end wall time and peak RSS (/usr/bin/time -v), and the ratio
# of that time to a bare Python `json.load` of the same file, measured in the
# same run (the floor of any Python-based estimator).
#
#   bash benches/run.sh                 # the largest fixture only
#   bash benches/run.sh --big [SIZE_MB] # also a generated trace (default 1200 MB
#                                       # target → ≈ 1 GB of compact JSON) in $TMPDIR
#   bash benches/run.sh FILE...         # these files
#
# Nothing it writes is committed; the generated trace is deleted at the end
# unless MEMCAST_KEEP_BIG=1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

big=0
big_mb=1200
files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --big) big=1; if [[ "${2:-}" =~ ^[0-9]+$ ]]; then big_mb=$2; shift; fi ;;
    *) files+=("$1") ;;
  esac
  shift
done

cargo build --release --quiet --bin memcast --example gen_big_trace
cargo bench --quiet --bench pipeline --no-run 2>/dev/null || true
largest=$(ls -S ../shared/fixtures/traces/*.json.gz | head -1)
if [ ${#files[@]} -eq 0 ]; then
  files=("$largest")
fi
if [ "$big" = 1 ]; then
  out="${TMPDIR:-/tmp}/memcast-big-trace.json"
  ./target/release/examples/gen_big_trace "$out" "$big_mb" >&2
  files+=("$out")
fi

# Seconds of "Elapsed (wall clock)" in /usr/bin/time -v output.
wall_of() { awk -F': ' '/Elapsed \(wall clock\)/ {n=split($2,a,":"); s=0; for(i=1;i<=n;i++) s=s*60+a[i]; print s}' <<<"$1"; }
# The smaller of two numbers; the first may be empty.
min_of() { if [ -z "$1" ]; then echo "$2"; else awk -v a="$1" -v b="$2" 'BEGIN { print (a < b ? a : b) }'; fi; }

rows=()
for f in "${files[@]}"; do
  result=$(cargo bench --quiet --bench pipeline -- "$f" | tee /dev/stderr | grep '^RESULT')
  read -r _ name raw floor parse analyze orchestrate simulate prepare e2e <<<"$result"
  # The CLI as a user runs it (read the file, estimate, print) and the bare
  # Python load, alternately, best of $RUNS each: the wall time and the
  # largest peak RSS of the CLI.
  if [[ "$f" == *.gz ]]; then
    py='import json,gzip,sys; json.load(gzip.open(sys.argv[1]))'
  else
    py='import json,sys; json.load(open(sys.argv[1],"rb"))'
  fi
  cli_s=""; py_s=""; rss_kb=0
  for _ in $(seq "${RUNS:-3}"); do
    cli=$( { /usr/bin/time -v ./target/release/memcast estimate "$f" >/dev/null; } 2>&1 )
    s=$(wall_of "$cli"); cli_s=$(min_of "$cli_s" "$s")
    r=$(awk -F': ' '/Maximum resident set size/ {print $2}' <<<"$cli"); (( r > rss_kb )) && rss_kb=$r
    pyt=$( { /usr/bin/time -v python3 -c "$py" "$f"; } 2>&1 )
    s=$(wall_of "$pyt"); py_s=$(min_of "$py_s" "$s")
  done
  rows+=("$(awk -v name="$name" -v raw="$raw" -v fl="$floor" -v p="$parse" -v a="$analyze" -v o="$orchestrate" \
      -v s="$simulate" -v e="$e2e" -v cli="$cli_s" -v rss="$rss_kb" -v py="$py_s" 'BEGIN {
    mb = raw / 1e6;
    printf "| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f | %.0f | %.2f | %.3f | %.0f | %.2f |",
      name, mb, mb/fl, mb/p, mb/a, mb/o, mb/s, mb/e, cli, mb/cli, py, cli/py, rss/1024, rss*1024/raw }')")
done

echo
echo "| trace | raw MB | gunzip+serde MB/s | parse MB/s | analyze MB/s | orchestrate MB/s | simulate MB/s | end-to-end MB/s (one thread) | CLI wall s | CLI MB/s | python json.load s | ratio | CLI peak RSS MiB | RSS / raw |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
if [ "$big" = 1 ] && [ "${MEMCAST_KEEP_BIG:-0}" != 1 ]; then
  rm -f "$out"
fi

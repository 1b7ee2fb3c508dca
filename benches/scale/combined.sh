#!/bin/bash
# Combined recipes rebuilt in depth and length (issue 31): for each recipe,
# tracegen traces of llama-small / bert / gpt2 at 2 blocks x 64 tokens,
# 2 x 128 and 4 x 128; memcast's estimate of the 2-block traces asked for
# 4 blocks (and 4 blocks at 128 tokens) beside the 4-block trace's own:
# peak reserved, parameter count, optimizer state at the peak.
#
#   PYTHON=/path/to/venv/bin/python bash benches/scale/combined.sh
#
# Traces go to $COMBINED (default /tmp/memcast-combined); nothing is committed.
set -u
cd "$(dirname "$0")/../.."
P=${PYTHON:-python3}
T=${MEMCAST_SHARED:-../shared}/tools/tracegen/profile_cpu.py
O=${COMBINED:-/tmp/memcast-combined}; mkdir -p "$O"
cargo build --release --quiet --bin memcast
M=./target/release/memcast
gen() { n=$1; shift; [ -f "$O/$n.json.gz" ] || OMP_NUM_THREADS=1 $P "$T" --batch-size 2 --iters 3 "$@" --out "$O/$n.json.gz" > "$O/$n.log" 2>&1 || echo "tracegen failed: $n (see $O/$n.log)"; }
est() { $M estimate "$@" --json --gpu a100-80gb 2>/dev/null | $P -c "import json,sys; d=json.load(sys.stdin); print(d['peak']['reserved_bytes'], d['summary']['n_parameters'], d['breakdown_at_peak'].get('optimizer_state') or 0)"; }
declare -A R=(
  [llama_ckpt_bf16_perparam_ga2_clip]="--model llama-small --optimizer adamw --checkpointing --autocast bf16 --foreach false --grad-accum 2 --clip-grad 1.0"
  [llama_ckptre_bf16_foreach_ga2_clip]="--model llama-small --optimizer adamw --checkpointing --reentrant --autocast bf16 --foreach true --grad-accum 2 --clip-grad 1.0"
  [llama_ckptre_perparam_clip]="--model llama-small --optimizer adamw --checkpointing --reentrant --foreach false --clip-grad 1.0"
  [bert_ckptre_bf16_ga2_clip]="--model bert-base-cls --optimizer adamw --checkpointing --reentrant --autocast bf16 --grad-accum 2 --clip-grad 1.0"
  [llama_lora_ckpt_bf16_ga2]="--model llama-small --mode lora --optimizer adamw --checkpointing --autocast bf16 --grad-accum 2"
  [gpt2_ckptre_sgd_perparam_clip]="--model gpt2 --optimizer sgd --momentum 0.9 --checkpointing --reentrant --foreach false --clip-grad 1.0"
  [llama_ckpt_adafactor_clip]="--model llama-small --optimizer adafactor --checkpointing --clip-grad 1.0"
)
printf '| recipe | asked | estimate | 4-block trace | error | parameters | optimizer state |\n|---|---|---|---|---|---|---|\n'
for r in $(printf '%s\n' "${!R[@]}" | sort); do
  # 48 tokens: no other dimension of these models has that size (64 is
  # llama-small's head size: the length would be ambiguous, warned).
  gen ${r}_L2_s48 --n-layer 2 --seq-len 48 ${R[$r]}
  gen ${r}_L2_s128 --n-layer 2 --seq-len 128 ${R[$r]}
  gen ${r}_L4_s128 --n-layer 4 --seq-len 128 ${R[$r]}
  read -r fb fp fo < <(est "$O/${r}_L4_s128.json.gz")
  for asked in "${r}_L2_s128.json.gz --layers 4" "${r}_L2_s48.json.gz --layers 4 --seq-len 128"; do
    read -r b p o < <(est $O/$asked)
    err=$($P -c "print('%+.3f %%' % (100 * ($b - $fb) / $fb))")
    printf '| %s | %s | %s | %s | %s | %s / %s | %s / %s |\n' "$r" "${asked#* }" "$b" "$fb" "$err" "$p" "$fp" "$o" "$fo"
  done
done

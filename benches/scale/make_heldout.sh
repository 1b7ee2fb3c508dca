#!/bin/bash
# Held-out depth/length/recipe traces for issue 24 (not fitted on).
cd "$(dirname "$0")/../../../shared/tools/tracegen"
P=${PYTHON:-python3}
O=${HELDOUT:-/tmp/memcast-heldout24}; mkdir -p $O
run() { out=$1; shift; [ -f $O/$out.json.gz ] || OMP_NUM_THREADS=1 $P profile_cpu.py "$@" --iters 3 --out $O/$out.json.gz > $O/$out.log 2>&1; echo "$out $?"; }
run opt125m_adamw_bs2_seq64_L2 --model opt-125m --optimizer adamw --batch-size 2 --seq-len 64 --n-layer 2
run opt125m_adamw_bs2_seq64_L4 --model opt-125m --optimizer adamw --batch-size 2 --seq-len 64 --n-layer 4
run distilgpt2_ckptclip_bs2_seq64_L2 --model distilgpt2 --optimizer adamw --batch-size 2 --seq-len 64 --n-layer 2 --checkpointing --clip-grad 1.0
run distilgpt2_ckptclip_bs2_seq64_L4 --model distilgpt2 --optimizer adamw --batch-size 2 --seq-len 64 --n-layer 4 --checkpointing --clip-grad 1.0
run gpt2_accum2_bs2_seq48_L2 --model gpt2 --optimizer sgd --momentum 0.9 --batch-size 2 --seq-len 48 --n-layer 2 --grad-accum 2
run gpt2_accum2_bs2_seq48_L3 --model gpt2 --optimizer sgd --momentum 0.9 --batch-size 2 --seq-len 48 --n-layer 3 --grad-accum 2
run bert_train_bs2_seq48_L2 --model bert-base-cls --optimizer adam --batch-size 2 --seq-len 48 --n-layer 2
run bert_train_bs2_seq96_L2 --model bert-base-cls --optimizer adam --batch-size 2 --seq-len 96 --n-layer 2
run bert_train_bs2_seq192_L2 --model bert-base-cls --optimizer adam --batch-size 2 --seq-len 192 --n-layer 2
run opt125m_nograd_bs2_seq40_L2 --model opt-125m --mode inference_mode --batch-size 2 --seq-len 40 --n-layer 2
run opt125m_nograd_bs2_seq160_L2 --model opt-125m --mode inference_mode --batch-size 2 --seq-len 160 --n-layer 2
run t5_adamw_bs2_seq40_L2 --model t5-small --optimizer adamw --batch-size 2 --seq-len 40 --n-layer 2
run t5_adamw_bs2_seq120_L2 --model t5-small --optimizer adamw --batch-size 2 --seq-len 120 --n-layer 2
run llama_evalgrad_bs2_seq48_L2 --model llama-small --mode eval_grad --batch-size 2 --seq-len 48 --n-layer 2
run llama_evalgrad_bs2_seq48_L5 --model llama-small --mode eval_grad --batch-size 2 --seq-len 48 --n-layer 5
run llama_evalgrad_bs2_seq144_L2 --model llama-small --mode eval_grad --batch-size 2 --seq-len 144 --n-layer 2
run llama_gen8_dynamic_bs2_seq32_L2 --model llama-small --mode generate --max-new-tokens 8 --cache dynamic --batch-size 2 --seq-len 32 --n-layer 2
run llama_gen8_dynamic_bs2_seq32_L4 --model llama-small --mode generate --max-new-tokens 8 --cache dynamic --batch-size 2 --seq-len 32 --n-layer 4
run llama_gen8_static_bs2_seq32_L2 --model llama-small --mode generate --max-new-tokens 8 --cache static --batch-size 2 --seq-len 32 --n-layer 2
run llama_gen8_static_bs2_seq32_L4 --model llama-small --mode generate --max-new-tokens 8 --cache static --batch-size 2 --seq-len 32 --n-layer 4
run mixtral_train_bs2_seq48_L2 --model mixtral-small --optimizer adamw --batch-size 2 --seq-len 48 --n-layer 2
run mixtral_train_bs2_seq48_L4 --model mixtral-small --optimizer adamw --batch-size 2 --seq-len 48 --n-layer 4

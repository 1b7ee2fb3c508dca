#!/usr/bin/env python3
"""Held-out check of --layers / --seq-len (issue 24): each pair is (scaled small trace, trace made that way)."""
import json, subprocess, sys
M = sys.argv[1] if len(sys.argv) > 1 else "target/release/memcast"
import os
H = os.environ.get("HELDOUT", "/tmp/memcast-heldout24") + "/"
pairs = [
    ("opt-125m train AdamW, depth", ["opt125m_adamw_bs2_seq64_L2"], ["--layers", "4"], "opt125m_adamw_bs2_seq64_L4"),
    ("distilgpt2 ckpt+clip, depth", ["distilgpt2_ckptclip_bs2_seq64_L2"], ["--layers", "4"], "distilgpt2_ckptclip_bs2_seq64_L4"),
    ("gpt2 accum 2 SGD-m, depth", ["gpt2_accum2_bs2_seq48_L2"], ["--layers", "3"], "gpt2_accum2_bs2_seq48_L3"),
    ("llama eval_grad, depth", ["llama_evalgrad_bs2_seq48_L2"], ["--layers", "5"], "llama_evalgrad_bs2_seq48_L5"),
    ("bert train Adam, 48->96 (one)", ["bert_train_bs2_seq48_L2"], ["--seq-len", "96"], "bert_train_bs2_seq96_L2"),
    ("bert train Adam, 48->192 (one)", ["bert_train_bs2_seq48_L2"], ["--seq-len", "192"], "bert_train_bs2_seq192_L2"),
    ("bert train Adam, 48+96->192 (fit)", ["bert_train_bs2_seq48_L2", "bert_train_bs2_seq96_L2"], ["--seq-len", "192"], "bert_train_bs2_seq192_L2"),
    ("opt-125m inference_mode, 40->160 (one)", ["opt125m_nograd_bs2_seq40_L2"], ["--seq-len", "160"], "opt125m_nograd_bs2_seq160_L2"),
    ("t5 train AdamW, 40->120 (one)", ["t5_adamw_bs2_seq40_L2"], ["--seq-len", "120"], "t5_adamw_bs2_seq120_L2"),
    ("llama eval_grad, 48->144 (one)", ["llama_evalgrad_bs2_seq48_L2"], ["--seq-len", "144"], "llama_evalgrad_bs2_seq144_L2"),
    ("llama generate 8 tokens, DynamicCache, depth", ["llama_gen8_dynamic_bs2_seq32_L2"], ["--layers", "4"], "llama_gen8_dynamic_bs2_seq32_L4"),
    ("llama generate 8 tokens, StaticCache, depth", ["llama_gen8_static_bs2_seq32_L2"], ["--layers", "4"], "llama_gen8_static_bs2_seq32_L4"),
    ("mixtral-small (MoE) train AdamW, depth", ["mixtral_train_bs2_seq48_L2"], ["--layers", "4"], "mixtral_train_bs2_seq48_L4"),
]
def est(files, args):
    r = subprocess.run([M, "estimate", "--json", "--gpu", "a100-80gb", *[H + f + ".json.gz" for f in files], *args], capture_output=True, text=True)
    if r.returncode:
        return None, r.stderr.strip().splitlines()[-1]
    return json.loads(r.stdout), None
print("| pair | scaled reserved | traced reserved | diff | scaled allocated | traced allocated | diff | params equal |")
print("|---|---|---|---|---|---|---|---|")
for label, small, args, big in pairs:
    a, e = est(small, args); b, e2 = est([big], [])
    if a is None or b is None:
        print(f"| {label} | refused: {e or e2} | | | | | | |"); continue
    ra, rb = a["peak"]["reserved_bytes"], b["peak"]["reserved_bytes"]
    aa, ab = a["peak"]["allocated_bytes"], b["peak"]["allocated_bytes"]
    print(f"| {label} | {ra} | {rb} | {100*(ra-rb)/rb:+.2f} % | {aa} | {ab} | {100*(aa-ab)/ab:+.2f} % | {a['summary']['parameter_bytes']==b['summary']['parameter_bytes']} |")

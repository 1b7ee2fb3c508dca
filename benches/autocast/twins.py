#!/usr/bin/env python3
"""bf16 autocast twins (issue 25): every `<job>_bf16*.json.gz` in DIR next to its
fp32 `<job>_none*.json.gz`, estimated by memcast: parameters, buffers, gradients
and optimizer state must be equal; activations and the peak are printed.
Make them with shared/tools/tracegen/profile_cpu.py --autocast {bf16,none}.
Usage (repo root): python3 benches/autocast/twins.py DIR [memcast]"""
import glob, json, os, subprocess, sys
d = sys.argv[1]
exe = sys.argv[2] if len(sys.argv) > 2 else "target/release/memcast"
def est(path):
    r = subprocess.run([exe, "estimate", "--json", path], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)
def state(path):
    r = subprocess.run([exe, "analyze", "--json", path], capture_output=True, text=True, check=True)
    a = json.loads(r.stdout)
    return a["parameters"]["bytes"], a["parameters"]["trainable_bytes"], a["buffers"]["bytes"]
bad = 0
print("| trace | params+buffers equal | grads equal | opt state equal | fp32 peak reserved | bf16 peak reserved | bf16 activations at peak |")
print("|---|---|---|---|---|---|---|")
for b in sorted(glob.glob(os.path.join(d, "*_bf16*.json.gz"))):
    f = b.replace("_bf16", "_none")
    if not os.path.exists(f):
        continue
    e16, e32 = est(b), est(f)
    s_eq = state(b) == state(f)
    g_eq = e16["breakdown_at_peak"]["gradients"] == e32["breakdown_at_peak"]["gradients"]
    o_eq = e16["breakdown_at_peak"]["optimizer_state"] == e32["breakdown_at_peak"]["optimizer_state"]
    bad += not (s_eq and g_eq and o_eq)
    print(f"| {os.path.basename(b)} | {s_eq} | {g_eq} | {o_eq} | {e32['peak']['reserved_bytes']} | {e16['peak']['reserved_bytes']} | {e16['breakdown_at_peak']['activations']} |")
sys.exit(1 if bad else 0)

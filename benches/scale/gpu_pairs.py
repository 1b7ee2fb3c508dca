#!/usr/bin/env python3
"""Re-runs every pair of tests/data/scaled_gpu_pairs.json (issue 24): a 2-block CPU
trace of a CS336 LM estimated at its full depth against the real GPU snapshot's peak.
Usage (repo root): python3 benches/scale/gpu_pairs.py [memcast] [--write]"""
import json, subprocess, sys
exe = next((a for a in sys.argv[1:] if not a.startswith("--")), "target/release/memcast")
path = "tests/data/scaled_gpu_pairs.json"
pairs = json.load(open(path))
print("| snapshot | mode | ctx | est reserved GiB | real reserved GiB | error reserved | est allocated GiB | real allocated GiB | error allocated |")
print("|---|---|---|---|---|---|---|---|---|")
errs = []
for p in pairs:
    if p.get("excluded"):
        print(f"| {p['snapshot'].split('memory_snapshots/')[-1]} | excluded: {p['excluded'][:90]} |"); continue
    args = [exe] + p["estimate_args"][1:]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode:
        print(f"| {p['snapshot']} | refused: {r.stderr.strip().splitlines()[-1]} |"); continue
    d = json.loads(r.stdout)
    er, ea = d["peak"]["reserved_bytes"], d["peak"]["allocated_bytes"]
    if p.get("compare_iteration") is not None:  # the snapshot's window holds that step only
        it = d["iterations"][p["compare_iteration"]]
        er, ea = it["peak_reserved_bytes"], it["peak_allocated_bytes"]
    rr, ra = p["real_peak_reserved"], p["real_peak_allocated"]
    p["estimate_peak_reserved"], p["estimate_peak_allocated"] = er, ea
    p["error_reserved_pct"] = round(100 * (er - rr) / rr, 2)
    name = p["snapshot"].split("memory_snapshots/")[-1]
    window = "" if p.get("compare_iteration") is None else f" (iteration {p['compare_iteration']})"
    print(f"| {name} | {p['config']['mode'][:40]}{window} | {p['estimate']['context']} | {er/2**30:.2f} | {rr/2**30:.2f} | {100*(er-rr)/rr:+.1f} % | {ea/2**30:.2f} | {ra/2**30:.2f} | {100*(ea-ra)/ra:+.1f} % |")
if "--write" in sys.argv:
    json.dump(pairs, open(path, "w"), indent=1)

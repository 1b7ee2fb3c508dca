#!/usr/bin/env python3
"""Sets memcast's estimate beside the real GPU peaks of tests/data/gpu-h200/pairs.json
(CPU trace and GPU run of one job, both made on the GPU machine: benches/gpu/run_pairs.py).

    python3 benches/gpu/pairs.py [MEMCAST] [--only REGEX] [--json]

Prints one row a pair: estimate and real peak reserved and allocated, and their error;
then the mean absolute error and the worst underestimate, over all rows and per group.
"""
import json, re, subprocess, sys

args = [a for a in sys.argv[1:]]
only = ""
if "--only" in args:
    i = args.index("--only"); only = args[i + 1]; del args[i:i + 2]
as_json = "--json" in args
args = [a for a in args if a != "--json"]
exe = args[0] if args else "target/release/memcast"
data = json.load(open("tests/data/gpu-h200/pairs.json"))
rows = []
for p in data["pairs"]:
    if only and not re.search(only, p["name"]):
        continue
    cmd = [exe, "estimate", "--json", p["trace"], "--gpu", data["memcast_gpu"], *p["args"]]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        rows.append({"name": p["name"], "error": r.stderr.strip().splitlines()[-1]})
        continue
    d = json.loads(r.stdout)
    er, ea = d["peak"]["reserved_bytes"], d["peak"]["allocated_bytes"]
    rr, ra = p["real_peak_reserved"], p["real_peak_allocated"]
    rows.append({"name": p["name"], "args": " ".join(p["args"]), "est_reserved": er, "real_reserved": rr,
                 "err_reserved_pct": 100 * (er - rr) / rr, "est_allocated": ea, "real_allocated": ra,
                 "err_allocated_pct": 100 * (ea - ra) / ra})
if as_json:
    json.dump(rows, sys.stdout, indent=1)
    sys.exit(0)
print("| pair | memcast args | est reserved MiB | real reserved MiB | error | est allocated MiB | real allocated MiB | error |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    if "error" in r:
        print(f"| {r['name']} | refused: {r['error'][:100]} |"); continue
    print(f"| {r['name']} | {r['args']} | {r['est_reserved']/2**20:.1f} | {r['real_reserved']/2**20:.1f} | "
          f"{r['err_reserved_pct']:+.1f} % | {r['est_allocated']/2**20:.1f} | {r['real_allocated']/2**20:.1f} | "
          f"{r['err_allocated_pct']:+.1f} % |")
ok = [r for r in rows if "error" not in r]
if ok:
    mae = sum(abs(r["err_reserved_pct"]) for r in ok) / len(ok)
    worst = min(r["err_reserved_pct"] for r in ok)
    print(f"\n{len(ok)} pairs: mean |error| reserved {mae:.2f} %, worst underestimate {worst:+.2f} %, "
          f"mean |error| allocated {sum(abs(r['err_allocated_pct']) for r in ok)/len(ok):.2f} %")

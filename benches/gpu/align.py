#!/usr/bin/env python3
"""Sets memcast's simulated allocation sequence beside a real GPU run's, for one pair of
tests/data/gpu-h200/pairs.json that has a CUDA profiler trace (NAME.cuda.json.gz there, recorded
with tracegen's --x-cuda-trace beside the pair's peaks).

    python3 benches/gpu/align.py NAME [--memcast EXE] [--rows N]

memcast's side is `memcast events --json` on the pair's CPU trace with the pair's
arguments (the target GPU's run without a memory limit). The real side is the CUDA
trace's `[memory]` events on the GPU, each with the innermost op that was running on
its thread. Both runs are printed as the points where reserved bytes grow (a new
segment), side by side in order, with the op and request that made each: the first
row where they part is where memcast's plan and the real run differ first (a block the
real run has and memcast does not, or one it reuses and memcast does not); `--rows`
rows are printed from there (60). Each block's address is shown (`memcast events` gives
every block's, to follow what takes pieces of a segment). Nothing is written.

The requests are memcast's sizes and the CUDA trace's, which are the sizes of the blocks
handed out (a request rounded up, or a whole free block that was not split).
"""
import bisect
import gzip
import json
import subprocess
import sys
from collections import defaultdict

args = sys.argv[1:]


def option(name, default):
    if name in args:
        i = args.index(name)
        value = args[i + 1]
        del args[i:i + 2]
        return value
    return default


exe = option("--memcast", "target/release/memcast")
rows_max = int(option("--rows", "60"))
if len(args) != 1:
    sys.exit(__doc__)
name = args[0]
data = json.load(open("tests/data/gpu-h200/pairs.json"))
pair = next((p for p in data["pairs"] if p["name"] == name), None)
if pair is None:
    sys.exit(f"no pair {name!r} in tests/data/gpu-h200/pairs.json")
# The pair's own recording (a pair rebuilt from a shallower trace with --layers has none).
cuda_path = f"tests/data/gpu-h200/{name}.cuda.json.gz"
try:
    cuda = json.load(gzip.open(cuda_path))
except FileNotFoundError:
    sys.exit(f"no CUDA trace {cuda_path}: only pairs recorded with --x-cuda-trace have one")

# memcast's side.
cmd = [exe, "events", "--json", pair["trace"], "--gpu", data["memcast_gpu"], *pair["args"]]
run = subprocess.run(cmd, capture_output=True, text=True)
if run.returncode:
    sys.exit(f"{' '.join(cmd)} failed: {run.stderr.strip()}")
ours = []
for row in json.loads(run.stdout)["events"]:
    if row["kind"] == "alloc" and row["bytes"] == 0:
        continue
    ours.append({
        "index": row["index"], "kind": row["kind"], "bytes": row["bytes"], "op": row["op"] or "-",
        "allocated": row["allocated"], "reserved": row["reserved"], "address": row.get("address"),
        "where": f"{row['phase']} it{row['iteration'] if row['iteration'] is not None else '-'}",
    })

# The real side: each GPU allocation or free with the innermost op open on its thread.
events = cuda["traceEvents"]
ops_by_tid = defaultdict(list)
for e in events:
    if e.get("ph") == "X" and e.get("cat") == "cpu_op":
        ops_by_tid[e.get("tid")].append((e["ts"], -e.get("dur", 0), e["ts"] + e.get("dur", 0), e["name"]))
for ops in ops_by_tid.values():
    ops.sort()
starts = {tid: [o[0] for o in ops] for tid, ops in ops_by_tid.items()}


def innermost(tid, ts):
    """The innermost op of thread `tid` open at `ts`: ops nest on one thread, so it is the
    latest to start of those still open (sorted longest first at one start)."""
    ops = ops_by_tid.get(tid, [])
    for i in range(bisect.bisect_right(starts.get(tid, []), ts) - 1, -1, -1):
        start, neg_dur, end, op = ops[i]
        if end >= ts:
            return op
    return "-"


memory = sorted((e for e in events if e.get("name") == "[memory]"
                 and e.get("args", {}).get("Device Type") == 1), key=lambda e: e["ts"])
real = []
for e in memory:
    a = e["args"]
    real.append({
        "index": len(real), "kind": "alloc" if a["Bytes"] > 0 else "free", "bytes": max(a["Bytes"], 0),
        "op": innermost(e.get("tid"), e["ts"]),
        "allocated": a["Total Allocated"], "reserved": a["Total Reserved"], "where": "",
        "address": a.get("Addr"),
    })


# The recording starts after the model was moved to the GPU: what was reserved at its first
# event came before it, and memcast's events up to there are not compared.
base = real[0]["reserved"] if real else 0


def points(seq):
    """The events that grow reserved bytes past `base`, each with its place (memcast's
    schedule index, the CUDA trace's memory event index)."""
    out, before = [], base
    for e in seq:
        if e["reserved"] > before:
            out.append((e["index"], e))
        before = max(e["reserved"], base)
    return out


def mib(n):
    return f"{n / 2**20:.1f}"


def at(e):
    """The block's address (memcast's are simulated: its segments get ever higher ones)."""
    return f"{e['address']:#x}" if e.get("address") is not None else "-"


mine, theirs = points(ours), points(real)
print(f"# {name}: memcast `{' '.join(cmd[1:])}` against {cuda_path}")
print(f"# memcast: {len(ours)} events, peak reserved {mib(max(e['reserved'] for e in ours))} MiB, "
      f"allocated {mib(max(e['allocated'] for e in ours))} MiB; "
      f"real: {len(real)} events, peak reserved {mib(max(e['reserved'] for e in real))} MiB, "
      f"allocated {mib(max(e['allocated'] for e in real))} MiB")
print(f"# compared from {mib(base)} MiB reserved (the recording's start); "
      f"segments opened: memcast {len(mine)}, real {len(theirs)}")
print("| # | memcast event | op | request MiB | at | reserved MiB | real event | op | request MiB | at | reserved MiB |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
first = None
for k in range(max(len(mine), len(theirs))):
    m = mine[k] if k < len(mine) else None
    t = theirs[k] if k < len(theirs) else None
    parted = m is None or t is None or m[1]["reserved"] != t[1]["reserved"]
    if parted and first is None:
        first = k
    if first is not None and k >= first + rows_max:
        break
    if first is None and k >= rows_max:
        continue
    left = (f"{m[0]} {m[1]['where']} | {m[1]['op']} | {mib(m[1]['bytes'])} | {at(m[1])} | {mib(m[1]['reserved'])}"
            if m else "- | - | - | - | -")
    right = (f"{t[0]} | {t[1]['op']} | {mib(t[1]['bytes'])} | {at(t[1])} | {mib(t[1]['reserved'])}"
             if t else "- | - | - | - | -")
    print(f"| {k}{' ←' if k == first else ''} | {left} | {right} |")
print(f"\nfirst difference: row {first}" if first is not None else "\nthe two runs open the same segments")

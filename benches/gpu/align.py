#!/usr/bin/env python3
"""Sets memcast's simulated allocation sequence beside a real GPU run's, for one pair of
tests/data/gpu-h200/pairs.json that has a CUDA profiler trace (NAME.cuda.json.gz there, recorded
with tracegen's --x-cuda-trace beside the pair's peaks).

    python3 benches/gpu/align.py NAME [--memcast EXE] [--rows N] [--blocks]

memcast's side is `memcast events --json` on the pair's CPU trace with the pair's
arguments (the target GPU's run without a memory limit). The real side is the CUDA
trace's `[memory]` events on the GPU, each with the innermost op that was running on
its thread. Both runs are printed as the points where reserved bytes grow (a new
segment), side by side in order, with the op and request that made each: the first
row where they part is where memcast's plan and the real run differ first (a block the
real run has and memcast does not, or one it reuses and memcast does not); `--rows`
rows are printed from there (60). Each block's address is shown (`memcast events` gives
every block's, to follow what takes pieces of a segment). With `--blocks`, every large-pool
allocation instead (over 1 MiB), the two runs aligned on their sizes from the first place
one makes a block the other does not: where a layer's blocks come in another order. Nothing
is written.

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
blocks = "--blocks" in args
if blocks:
    args.remove("--blocks")
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


def large_allocations(seq):
    """The allocations of the large pool (over 1 MiB, the small pool's largest request), in
    order."""
    return [e for e in seq if e["kind"] == "alloc" and e["bytes"] > 1 << 20]


if blocks:
    # Allocation by allocation rather than segment by segment: both runs' large-pool
    # allocations aligned on their sizes, from the first place they differ: a block one run
    # makes and the other does not, or makes elsewhere.
    # memcast's set-up (the model moved to the GPU) came before the recording.
    a = large_allocations([e for e in ours if not e["where"].startswith("setup")])
    b = large_allocations(real)

    def same(m, t):
        """The same block: the recording shows the block handed out, which is the request
        rounded up to 512 bytes, or a whole cached block whose rest would have been under
        1 MiB (the large pool splits only past that)."""
        r = -(-m["bytes"] // 512) * 512
        return r <= t["bytes"] < r + (1 << 20)

    # The longest common subsequence of the two lists under `same`, as runs of
    # (tag, memcast's slice, the recording's slice).
    n, m_ = len(a), len(b)
    table = [[0] * (m_ + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        row, below = table[i], table[i + 1]
        for j in range(m_ - 1, -1, -1):
            row[j] = below[j + 1] + 1 if same(a[i], b[j]) else max(below[j], row[j + 1])
    opcodes, i, j = [], 0, 0
    while i < n or j < m_:
        if i < n and j < m_ and same(a[i], b[j]) and table[i][j] == table[i + 1][j + 1] + 1:
            tag, di, dj = "equal", 1, 1
        elif j < m_ and (i == n or table[i][j + 1] >= table[i + 1][j]):
            tag, di, dj = "insert", 0, 1
        else:
            tag, di, dj = "delete", 1, 0
        if opcodes and opcodes[-1][0] == tag:
            t_, i1, i2, j1, j2 = opcodes[-1]
            opcodes[-1] = (t_, i1, i2 + di, j1, j2 + dj)
        else:
            opcodes.append((tag, i, i + di, j, j + dj))
        i, j = i + di, j + dj
    print(f"# {name}: large-pool allocations, memcast {len(a)}, real {len(b)}; "
          f"aligned on their sizes, from the first difference")
    print("| memcast event | where | op | MiB | reserved MiB | | real event | op | MiB | reserved MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    shown, started = 0, False
    for tag, i1, i2, j1, j2 in opcodes:
        if tag == "equal" and not started:
            continue
        started = True
        for k in range(max(i2 - i1, j2 - j1)):
            m = a[i1 + k] if i1 + k < i2 else None
            t = b[j1 + k] if j1 + k < j2 else None
            mark = "=" if tag == "equal" else "≠"
            left = (f"{m['index']} | {m['where']} | {m['op']} | {mib(m['bytes'])} | {mib(m['reserved'])}"
                    if m else "- | - | - | - | -")
            right = (f"{t['index']} | {t['op']} | {mib(t['bytes'])} | {mib(t['reserved'])}"
                     if t else "- | - | - | -")
            print(f"| {left} | {mark} | {right} |")
            shown += 1
            if shown >= rows_max:
                sys.exit(0)
    if not started:
        print("\nthe two runs make the same large-pool allocations, in order")
    sys.exit(0)

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

#!/usr/bin/env python3
"""Measures memcast's error against real GPU peaks and writes it, per kind of
job, to src/report/accuracy.json: the data the README's accuracy table and the
verdict's thin margin ("fits with a thin margin": headroom within the error
measured for this kind of job) are made from.

    python3 benches/accuracy.py [--exe target/release/memcast] [--write]

Sources (each estimate run as its source's own script runs it):
  h200       tests/data/gpu-h200/pairs.json: CPU traces and real peaks of the same
             jobs on an H200, torch 2.11 (python3 benches/gpu/pairs.py)
  cs336      tests/data/scaled_gpu_pairs.json: 2-block CPU traces of the CS336 2.7B
             LM against shared allocator snapshots (python3 benches/scale/gpu_pairs.py)
  shared     ../shared/ground-truth/pairs and published: snapshotted and published
             runs re-created as traces (python3 ../shared/tools/evidence.py)

The error of a run is (estimate - real) / real of the peak reserved bytes (the
published rows: the figure each names). The kind of job is the one memcast's
report gives it (report.job_kind: training, fine_tuning, inference, generation),
so the data is grouped by the same rule the verdict looks it up with. Errors
are stored in basis points (hundredths of a percent), rounded away from zero.
Without --write it prints the table and changes nothing.
"""
import argparse
import glob
import json
import math
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SHARED = os.environ.get("MEMCAST_SHARED", os.path.join(ROOT, "..", "shared"))
OUT = os.path.join(ROOT, "src", "report", "accuracy.json")

SOURCES = [
    {"id": "h200", "name": "real GPU pairs, H200, torch 2.11",
     "command": "python3 benches/gpu/pairs.py"},
    {"id": "cs336", "name": "CS336 2.7B LM, 2-block traces vs shared allocator snapshots",
     "command": "python3 benches/scale/gpu_pairs.py"},
    {"id": "shared", "name": "shared ground truth: snapshotted pairs and published figures",
     "command": "python3 ../shared/tools/evidence.py"},
]


def estimate(exe, trace, args):
    r = subprocess.run([exe, "estimate", "--json", trace, *args], capture_output=True,
                       text=True, timeout=900, cwd=ROOT)
    if r.returncode:
        return None, (r.stderr.strip().splitlines() or ["failed"])[-1]
    return json.loads(r.stdout), None


def get(d, dotted):
    for k in dotted.split("."):
        d = d[k]
    return d


def runs_h200(exe):
    data = json.load(open(os.path.join(ROOT, "tests/data/gpu-h200/pairs.json")))
    for p in data["pairs"]:
        d, err = estimate(exe, p["trace"], ["--gpu", data["memcast_gpu"], *p["args"]])
        yield p["name"], d, err, lambda d: d["peak"]["reserved_bytes"], p["real_peak_reserved"]


def runs_cs336(exe):
    for p in json.load(open(os.path.join(ROOT, "tests/data/scaled_gpu_pairs.json"))):
        if p.get("excluded"):
            continue
        args = p["estimate_args"][2:]  # after "memcast estimate"
        d, err = estimate(exe, args[args.index("--json") + 1], [a for a in args if a != "--json"][1:])
        it = p.get("compare_iteration")
        pick = (lambda d: d["peak"]["reserved_bytes"]) if it is None else (
            lambda d, it=it: d["iterations"][it]["peak_reserved_bytes"])
        name = p["snapshot"].split("memory_snapshots/")[-1]
        yield name, d, err, pick, p["real_peak_reserved"]


def runs_shared(exe):
    gt = os.path.join(SHARED, "ground-truth")
    if not os.path.isdir(gt):
        sys.exit(f"missing {gt}: the shared ground truth must be beside the checkout")
    for meta in sorted(glob.glob(os.path.join(gt, "pairs", "*.meta.json"))):
        m = json.load(open(meta))
        d, err = estimate(exe, meta.replace(".meta.json", ".json.gz"), ["--gpu", "a100-80gb"])
        yield ("pairs/" + os.path.basename(meta)[:-10], d, err,
               lambda d: d["peak"]["reserved_bytes"], m["ground_truth"]["real_peak_reserved_bytes"])
    for meta in sorted(glob.glob(os.path.join(gt, "published", "*.meta.json"))):
        m = json.load(open(meta))
        field = m["memcast"]["compare"]
        d, err = estimate(exe, meta.replace(".meta.json", ".json.gz"), m["memcast"]["args"])
        yield ("published/" + os.path.basename(meta)[:-10], d, err,
               lambda d, field=field: get(d, field), m["published"]["bytes"])


def bp(fraction):
    """A fraction in basis points, rounded away from zero."""
    value = fraction * 10000
    return int(math.copysign(math.ceil(abs(value) - 1e-9), value))


def summarize(errors):
    """runs, mean |error|, worst underestimate (a positive number), worst overestimate."""
    return {
        "runs": len(errors),
        "mean_abs_bp": bp(sum(abs(e) for e in errors) / len(errors)),
        "worst_under_bp": max([bp(-e) for e in errors if e < 0], default=0),
        "worst_over_bp": max([bp(e) for e in errors if e > 0], default=0),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exe", default=os.path.join(ROOT, "target", "release", "memcast"))
    parser.add_argument("--write", action="store_true", help=f"write {os.path.relpath(OUT, ROOT)}")
    args = parser.parse_args()
    if not os.path.exists(args.exe):
        sys.exit(f"no memcast at {args.exe}: cargo build --release --bin memcast, or pass --exe")
    by = {}  # (source, kind) -> errors
    refused = []
    for source, runs in (("h200", runs_h200), ("cs336", runs_cs336), ("shared", runs_shared)):
        for name, d, err, pick, real in runs(args.exe):
            if err:
                refused.append(f"{source}/{name}: {err}")
                continue
            kind = d.get("job_kind") or "training"
            e = (pick(d) - real) / real
            by.setdefault((source, kind), []).append(e)
            print(f"{source:7} {kind:12} {100 * e:+7.2f} %  {name}", file=sys.stderr)
    rows = [{"source": s, "kind": k, **summarize(e)} for (s, k), e in sorted(by.items())]
    kinds = {}
    for (s, k), e in by.items():
        kinds.setdefault(k, []).extend(e)
    data = {
        "schema": "memcast.accuracy/1",
        "regenerate": "python3 benches/accuracy.py --write",
        "sources": SOURCES,
        "rows": rows,
        "kinds": [{"kind": k, "sources": sorted({s for (s, kk) in by if kk == k}), **summarize(e)}
                  for k, e in sorted(kinds.items())],
    }
    for r in refused:
        print(f"refused: {r}", file=sys.stderr)
    text = json.dumps(data, indent=1) + "\n"
    if args.write:
        with open(OUT, "w") as f:
            f.write(text)
        print(f"wrote {os.path.relpath(OUT, ROOT)}; then: MEMCAST_UPDATE_README=1 cargo test "
              "--test integration readme_accuracy  (rewrites the README's table from it)")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()

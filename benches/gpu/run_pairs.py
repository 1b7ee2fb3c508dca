#!/usr/bin/env python3
"""Make (CPU trace, real GPU peak) pairs for a plan, in parallel, within a deadline.

    python3 benches/gpu/run_pairs.py PLAN WORKDIR [--out DIR] [--deadline-s N]
        [--gpu-jobs 2] [--cpu-jobs 6] [--cpu-threads 2] [--only REGEX]

PLAN: one job a line, ``NAME WHERE flags...`` (``#`` starts a comment); WHERE is ``both``,
``gpu`` or ``cpu``; flags are tracegen_x.py's (profile_cpu.py's plus ``--x-*``). GPU runs go
through a pool of --gpu-jobs processes (torch's peaks are per process, so concurrent runs do
not disturb them; NVML's device-wide figure does, and is marked so), CPU traces through a
pool of --cpu-jobs processes with --cpu-threads intra-op threads each, both in plan order.

What comes back (the device tool returns at most 8 files of 16 MiB): DIR/results.tar.gz
(every .gpu.json, .stats.json, .meta.json and log, rewritten as jobs finish, so a run stopped
at its limit still returns what it measured) and DIR/traces-N.tar (the CPU traces, xz, and
the allocator snapshots, in at most 4 bins below 14.5 MiB, every trace before any snapshot, in plan order; what does not fit is listed in
results.tar.gz's packing.json).
"""
import argparse
import concurrent.futures as cf
import io
import json
import lzma
import os
import re
import shlex
import subprocess
import sys
import tarfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BIN_BYTES = int(14.5 * 2**20)
MAX_BINS = 4


def parse_plan(path, only):
    jobs = []
    for line in open(path, encoding="utf-8"):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, where, *flags = shlex.split(line)
        if only and not re.search(only, name):
            continue
        assert where in ("both", "gpu", "cpu"), line
        jobs.append((name, where, flags))
    return jobs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("plan")
    ap.add_argument("work")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--deadline-s", type=float, default=420)
    ap.add_argument("--gpu-jobs", type=int, default=2)
    ap.add_argument("--cpu-jobs", type=int, default=6)
    ap.add_argument("--cpu-threads", type=int, default=2)
    ap.add_argument("--only", default="")
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    t0 = time.time()
    deadline = t0 + a.deadline_s
    os.makedirs(a.work, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    jobs = parse_plan(a.plan, a.only)
    status = {}
    lock = threading.Lock()
    procs = set()

    def run(name, device, flags):
        log = os.path.join(a.work, f"{name}.{device}.log")
        cmd = [a.python, os.path.join(HERE, "tracegen_x.py"), *flags,
               "--out", os.path.join(a.work, f"{name}.json.gz")]
        if device == "cuda":
            cmd += ["--device", "cuda"]
        env = dict(os.environ)
        if device == "cpu":
            env.update(OMP_NUM_THREADS=str(a.cpu_threads), MKL_NUM_THREADS=str(a.cpu_threads))
        left = deadline - time.time()
        if left < 5:
            with lock:
                status[f"{name}.{device}"] = "skipped (deadline)"
            return
        start = time.time()
        with open(log, "w") as f:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
            with lock:
                procs.add(p)
            try:
                rc = p.wait(timeout=left)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = "killed at deadline"
            with lock:
                procs.discard(p)
        with lock:
            status[f"{name}.{device}"] = {"rc": rc, "seconds": round(time.time() - start, 1)}
            if device == "cpu" and rc == 0:
                compress_q.append(name)
        pack_small()

    compress_q = []
    compressed = {}

    def compress_worker():
        while True:
            with lock:
                name = compress_q.pop(0) if compress_q else None
            if name is None:
                if done.is_set():
                    return
                time.sleep(0.5)
                continue
            src = os.path.join(a.work, f"{name}.json.gz")
            dst = os.path.join(a.work, f"{name}.json.xz")
            import gzip
            with gzip.open(src, "rb") as f:
                raw = f.read()
            with open(dst, "wb") as f:
                f.write(lzma.compress(raw, preset=6))
            with lock:
                compressed[name] = dst

    def pack_small():
        with lock:
            st = json.dumps({"elapsed_s": round(time.time() - t0, 1), "status": status},
                            indent=1)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for fn in sorted(os.listdir(a.work)):
                if fn.endswith((".gpu.json", ".stats.json", ".meta.json", ".log")):
                    tar.add(os.path.join(a.work, fn), arcname=fn)
            info = tarfile.TarInfo("status.json")
            info.size = len(st.encode())
            tar.addfile(info, io.BytesIO(st.encode()))
        tmp = os.path.join(a.out, "results.tar.gz.tmp")
        with open(tmp, "wb") as f:
            f.write(buf.getvalue())
        os.replace(tmp, os.path.join(a.out, "results.tar.gz"))

    done = threading.Event()
    compressors = [threading.Thread(target=compress_worker, daemon=True) for _ in range(2)]
    for c in compressors:
        c.start()
    gpu_pool = cf.ThreadPoolExecutor(a.gpu_jobs)
    cpu_pool = cf.ThreadPoolExecutor(a.cpu_jobs)
    futs = []
    for name, where, flags in jobs:
        if where in ("both", "gpu"):
            futs.append(gpu_pool.submit(run, name, "cuda", flags))
    for name, where, flags in jobs:
        if where in ("both", "cpu"):
            futs.append(cpu_pool.submit(run, name, "cpu", flags))
    for fut in futs:
        fut.result()
    done.set()
    for c in compressors:
        c.join(timeout=max(1, deadline + 60 - time.time()))
    pack_small()

    # traces and snapshots into bins, plan order
    files = []
    # every CPU trace, then every CUDA trace, before any snapshot
    for suffix in (".json.xz", ".cuda.json.gz", ".snapshot.pickle.gz"):
        for name, _where, _flags in jobs:
            p = os.path.join(a.work, name + suffix)
            if os.path.exists(p):
                files.append(p)
    bins, cur, size, left_out = [], [], 0, []
    for p in files:
        s = os.path.getsize(p) + 1024
        if s > BIN_BYTES:
            left_out.append(os.path.basename(p))
            continue
        if size + s > BIN_BYTES:
            bins.append(cur)
            cur, size = [], 0
        cur.append(p)
        size += s
    if cur:
        bins.append(cur)
    for extra in bins[MAX_BINS:]:
        left_out += [os.path.basename(p) for p in extra]
    for i, b in enumerate(bins[:MAX_BINS]):
        with tarfile.open(os.path.join(a.out, f"traces-{i}.tar"), "w") as tar:
            for p in b:
                tar.add(p, arcname=os.path.basename(p))
    with open(os.path.join(a.work, "packing.log"), "w") as f:
        json.dump({"bins": [[os.path.basename(p) for p in b] for b in bins[:MAX_BINS]],
                   "left_out": left_out}, f, indent=1)
    pack_small()
    print(json.dumps(status, indent=1))
    print("left out:", left_out)
    print(f"elapsed {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()

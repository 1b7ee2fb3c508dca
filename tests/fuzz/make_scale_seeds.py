#!/usr/bin/env python3
"""Writes the seeds of the `scale` fuzz target (tests/fuzz/seeds/scale) from
real fixtures in ../shared/fixtures, trimmed small enough to fuzz: the first
few calls of a generate() run, or the first iteration of a training step,
with only the module frames (each re-parented to its nearest module
ancestor), the ops the rebuild and the analyzer read, and the arguments
they read. Each seed is a 13-byte request (the fuzz target's header: flags,
then --layers, --seq-len and --new-tokens as little-endian u32) followed by
the trace; two traces of one job (the --seq-len fit) are joined by a NUL.

    python3 tests/fuzz/make_scale_seeds.py      # from the repository root

The same files are read by the always-on property test
(tests/integration/budget.rs), so CI runs every seed without a fuzzer.
"""

import gzip
import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.environ.get("MEMCAST_SHARED", os.path.join(os.path.dirname(ROOT), "shared"))
OUT = os.path.join(ROOT, "tests", "fuzz", "seeds", "scale")

OP_ARGS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs", "Sequence number", "Fwd thread id")
MEM_ARGS = ("Addr", "Bytes", "Total Allocated", "Device Type")
# Ops kept even when nested in another op: what the rebuild and the
# analyzer look for by name.
NAMED = ("aten::cat", "aten::zeros", "aten::embedding", "aten::scaled_dot_product_attention",
         "aten::linear", "aten::mm", "aten::stack", "aten::index_select")


def load(relative):
    path = os.path.join(SHARED, relative)
    if not os.path.exists(path):
        sys.exit(f"missing fixture {path}: put ../shared beside the checkout or set MEMCAST_SHARED")
    with gzip.open(path) as f:
        return json.load(f)


def trim(trace, keep_calls=None, steps=1):
    """The events of the first `steps` ProfilerStep spans (up to the end of
    the outermost module's `keep_calls`-th call, if given), reduced."""
    events = trace["traceEvents"]
    annotations = sorted((e for e in events if e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    profiler_steps = [a for a in annotations if a["name"].startswith("ProfilerStep#")][:steps]
    start = profiler_steps[0]["ts"] if profiler_steps else min(e.get("ts", 0) for e in events if "ts" in e)
    end = max(a["ts"] + a["dur"] for a in profiler_steps) if profiler_steps else float("inf")
    python = [e for e in events if e.get("cat") == "python_function"]
    modules = [e for e in python if e["name"].startswith("nn.Module: ")]
    if keep_calls:
        ids = {e["args"].get("Python id"): e for e in python}
        module_ids = {e["args"].get("Python id") for e in modules}

        def outermost(e):
            parent = e["args"].get("Python parent id")
            while parent in ids:
                if parent in module_ids:
                    return False
                parent = ids[parent]["args"].get("Python parent id")
            return True

        calls = sorted((e for e in modules if start <= e["ts"] <= end and outermost(e)), key=lambda e: e["ts"])
        if len(calls) >= keep_calls:
            end = calls[keep_calls - 1]["ts"] + calls[keep_calls - 1]["dur"]
    inside = lambda e: start <= e["ts"] <= end
    by_id = {e["args"].get("Python id"): e for e in python}
    module_ids = {e["args"].get("Python id") for e in modules}

    def module_parent(e):
        parent = e["args"].get("Python parent id")
        seen = 0
        while parent in by_id and seen < 4096:
            if parent in module_ids:
                return parent
            parent = by_id[parent]["args"].get("Python parent id")
            seen += 1
        return 0

    ops = sorted((e for e in events if e.get("cat") == "cpu_op" and inside(e)), key=lambda e: (e["ts"], -e["dur"]))
    kept_ops = []
    open_until = {}
    for o in ops:
        top = o["ts"] >= open_until.get(o["tid"], float("-inf"))
        if top:
            open_until[o["tid"]] = o["ts"] + o["dur"]
        name = o["name"]
        if top or name in NAMED or name.startswith("autograd::") or "AccumulateGrad" in name or name.startswith("Optimizer"):
            kept_ops.append(o)

    def t(x):
        return round(x - start, 3)

    out = []
    for a in annotations:
        if inside(a):
            out.append({"ph": "X", "cat": "user_annotation", "name": a["name"], "tid": a["tid"],
                        "ts": t(a["ts"]), "dur": round(min(a["dur"], end - a["ts"]), 3)})
    for m in modules:
        if inside(m):
            out.append({"ph": "X", "cat": "python_function", "name": m["name"], "tid": m["tid"],
                        "ts": t(m["ts"]), "dur": m["dur"],
                        "args": {"Python id": m["args"]["Python id"], "Python parent id": module_parent(m)}})
    for o in kept_ops:
        out.append({"ph": "X", "cat": "cpu_op", "name": o["name"], "tid": o["tid"], "ts": t(o["ts"]), "dur": o["dur"],
                    "args": {k: o["args"][k] for k in OP_ARGS if k in o.get("args", {})}})
    for e in events:
        if e.get("name") == "[memory]" and inside(e):
            out.append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "tid": e["tid"], "ts": t(e["ts"]),
                        "args": {k: e["args"][k] for k in MEM_ARGS if k in e["args"]}})
        elif e.get("ph") in ("s", "f") and e.get("cat") == "fwdbwd" and inside(e):
            out.append({"ph": e["ph"], "cat": "fwdbwd", "id": e["id"], "tid": e["tid"], "ts": t(e["ts"]), "name": "fwdbwd"})
    out.sort(key=lambda e: e["ts"])
    header = {k: trace[k] for k in ("schemaVersion", "with_stack", "profile_memory", "record_shapes") if k in trace}
    header["traceEvents"] = out
    return json.dumps(header, separators=(",", ":")).encode()


class Events:
    """A trace being written: µs times, the profiler's event shapes."""

    def __init__(self):
        self.events = []
        self.ids = 100

    def frame(self, name, ts, dur, parent=0):
        self.ids += 1
        self.events.append({"ph": "X", "cat": "python_function", "name": name, "ts": ts, "dur": dur,
                            "args": {"Python id": self.ids, "Python parent id": parent}})
        return self.ids

    def op(self, name, ts, dur, dims, types=None, seq=None, backward=False, concrete=None):
        args = {"Input Dims": dims, "Input type": types or ["float"] * len(dims)}
        if seq is not None:
            args["Sequence number"] = seq
            args["Fwd thread id"] = 1 if backward else 0
        if concrete is not None:
            args["Concrete Inputs"] = concrete
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "args": args})

    def mem(self, ts, addr, size):
        self.events.append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": ts,
                            "args": {"Addr": addr, "Bytes": size, "Device Type": 0}})

    def annotation(self, name, ts, dur):
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur})

    def json(self):
        self.events.sort(key=lambda e: e["ts"])
        return json.dumps({"with_stack": 1, "profile_memory": 1, "record_shapes": 1,
                           "traceEvents": self.events}, separators=(",", ":")).encode()


def synthetic_training(blocks=2, seq=16, width=8, steps=1, per_parameter=True):
    """A model of `blocks` blocks (a Linear each) trained `steps` steps:
    embedding, forward, backward with sequence numbers, AccumulateGrad, and
    an optimizer step that updates one parameter at a time (or one foreach
    op), so every rule of --layers and --seq-len has something to read."""
    e = Events()
    act = 4 * seq * width
    weight = 4 * width * width
    t = 0.0
    for step in range(steps):
        e.annotation(f"ProfilerStep#{step}", t, 1000.0)
        model = e.frame("nn.Module: Model_0", t + 1, 400.0)
        e.frame("nn.Module: Embedding_0", t + 2, 8.0, model)
        e.op("aten::embedding", t + 3, 5.0, [[50, width], [1, seq]], ["float", "long int"], seq=1)
        e.mem(t + 4, 1000, act)
        for k in range(blocks):
            b = t + 20 + 60 * k
            block = e.frame(f"nn.Module: Block_{k}", b, 50.0, model)
            e.frame(f"nn.Module: Linear_{k}", b + 2, 40.0, block)
            e.op("aten::linear", b + 4, 30.0, [[1, seq, width], [width, width]], seq=10 + k)
            e.mem(b + 6, 5000 + 64 * k, act)            # a temporary
            e.mem(b + 8, 1000 + 64 * (k + 1), act)      # the output, kept for backward
            e.mem(b + 10, 5000 + 64 * k, -act)
            e.op("aten::matmul", b + 12, 10.0, [[1, seq, width], [1, width, seq]], seq=20 + k)
            e.mem(b + 14, 6000 + 64 * k, 4 * seq * seq)  # grows as T²
            e.mem(b + 16, 6000 + 64 * k, -4 * seq * seq)
        h = t + 20 + 60 * blocks
        e.frame("nn.Module: Head_0", h, 20.0, model)
        e.op("aten::linear", h + 2, 10.0, [[1, seq, width], [width, width]], seq=10 + blocks)
        e.mem(h + 4, 9000, 64)
        bw = t + 500
        e.op("autograd::engine::evaluate_function: LinearBackward0", bw, 10.0, [[1, seq, width]],
             seq=10 + blocks, backward=True)
        e.mem(bw + 2, 20000 + 64 * blocks, act)
        e.mem(bw + 3, 9000, -64)
        for i, k in enumerate(reversed(range(blocks))):
            b = bw + 20 + 40 * i
            e.op("autograd::engine::evaluate_function: LinearBackward0", b, 30.0, [[1, seq, width]],
                 seq=10 + k, backward=True)
            e.mem(b + 2, 20000 + 64 * k, act)
            e.mem(b + 4, 20000 + 64 * (k + 1), -act)
            e.mem(b + 6, 1000 + 64 * (k + 1), -act)
            e.op("torch::autograd::AccumulateGrad", b + 10, 5.0, [[width, width]], backward=True, seq=-1)
            e.mem(b + 12, 30000 + 64 * k + 100000 * step, weight)
        e.mem(bw + 30 + 40 * blocks, 20000, -act)
        e.mem(bw + 31 + 40 * blocks, 1000, -act)
        o = t + 800
        e.annotation("Optimizer.step#AdamW.step", o, 150.0)
        if per_parameter:
            for k in range(blocks):
                p = o + 5 + 20 * k
                e.op("aten::mul", p, 5.0, [[width, width], []])
                e.mem(p + 1, 40000 + 64 * k, weight)
                e.op("aten::add_", p + 6, 5.0, [[width, width], [width, width]])
                e.mem(p + 8, 40000 + 64 * k, -weight)
        else:
            e.op("aten::_foreach_add_", o + 5, 20.0, [[width, width]] * blocks)
        e.annotation("Optimizer.zero_grad#AdamW.zero_grad", t + 960, 20.0)
        for k in range(blocks):
            e.mem(t + 965 + k, 30000 + 64 * k + 100000 * step, -weight)
        t += 1000
    return e.json()


def synthetic_generation(calls=4, blocks=2, prompt=4, width=8, static=False):
    """A generate() run: `calls` calls of the model (the prompt's, then one
    per new token), each block's KV cache a torch.cat one position longer
    than the last call's (or a StaticCache made by aten::zeros in the first
    call), the logits freed in the next call."""
    e = Events()
    e.annotation("ProfilerStep#0", 0.0, 100.0 + 300.0 * calls)
    positions = prompt + calls - 1
    if static:
        e.op("aten::zeros", 6.0, 4.0, [[]], ["long int"])
    for c in range(calls):
        t = 10.0 + 300.0 * c
        tokens = prompt if c == 0 else 1
        model = e.frame("nn.Module: CausalLM_0", t, 250.0)
        inner = e.frame("nn.Module: Model_0", t + 1, 200.0, model)
        e.frame("nn.Module: Embedding_0", t + 2, 6.0, inner)
        e.op("aten::embedding", t + 3, 4.0, [[50, width], [1, tokens]], ["float", "long int"])
        e.mem(t + 4, 1000 + 10 * c, 4 * tokens * width)
        if static and c == 0:
            for k in range(blocks):
                e.op("aten::zeros", t + 5 + k * 0.1, 0.05, [[]], ["long int"])
                e.mem(t + 5.01 + k * 0.1, 70000 + 64 * k, 4 * width * positions)
        for k in range(blocks):
            b = t + 20 + 60 * k
            block = e.frame(f"nn.Module: Block_{k}", b, 50.0, inner)
            e.frame(f"nn.Module: Attention_{k}", b + 1, 45.0, block)
            e.op("aten::linear", b + 2, 5.0, [[1, tokens, width], [width, width]])
            e.mem(b + 3, 5000 + 64 * k, 4 * tokens * width)
            cached = prompt + c
            if not static:
                e.op("aten::cat", b + 8, 4.0, [[1, cached - tokens, width], [1, tokens, width]],
                     concrete=["", "-2"])
                addr = 60000 + 1000 * c + 64 * k
                e.mem(b + 9, addr, 4 * cached * width)
                if c > 0:
                    e.mem(b + 10, 60000 + 1000 * (c - 1) + 64 * k, -4 * (cached - 1) * width)
            e.op("aten::scaled_dot_product_attention", b + 14, 6.0,
                 [[1, 1, tokens, width], [1, 1, cached, width], [1, 1, cached, width]])
            e.mem(b + 15, 6000 + 64 * k, 4 * tokens * cached)
            e.mem(b + 18, 6000 + 64 * k, -4 * tokens * cached)
            e.mem(b + 20, 5000 + 64 * k, -4 * tokens * width)
        h = t + 20 + 60 * blocks
        e.frame("nn.Module: Linear_9", h, 10.0, model)
        e.op("aten::linear", h + 1, 5.0, [[1, tokens, width], [50, width]])
        if c > 0:
            e.mem(h + 2, 9000 + c - 1, -4 * 50)
        e.mem(h + 3, 9000 + c, 4 * 50)
        e.mem(h + 4, 1000 + 10 * c, -4 * tokens * width)
    end = 10.0 + 300.0 * calls
    e.mem(end, 9000 + calls - 1, -4 * 50)
    for k in range(blocks):
        if static:
            e.mem(end + 1 + k, 70000 + 64 * k, -4 * width * positions)
        else:
            e.mem(end + 1 + k, 60000 + 1000 * (calls - 1) + 64 * k, -4 * (prompt + calls - 1) * width)
    return e.json()


def request(layers=None, seq_len=None, new_tokens=None, two=False):
    flags = (layers is not None) | (seq_len is not None) << 1 | (new_tokens is not None) << 2 | two << 3
    return struct.pack("<BIII", flags, layers or 0, seq_len or 0, new_tokens or 0)


def main():
    os.makedirs(OUT, exist_ok=True)
    gen = trim(load("fixtures/traces-llm/llama_gen16_dynamic.json.gz"), keep_calls=4)
    static = trim(load("fixtures/traces-llm/llama_gen16_static.json.gz"), keep_calls=4)
    gpt2_gen = trim(load("fixtures/traces-llm/distilgpt2_gen8.json.gz"), keep_calls=3)
    moe_gen = trim(load("fixtures/traces-llm/mixtral_gen8.json.gz"), keep_calls=3)
    train = trim(load("fixtures/traces-depth/llama-small_adamw_bs4_seq128_L2.json.gz"))
    nograd64 = trim(load("fixtures/traces-depth/gpt2_nograd_bs4_seq64_L2.json.gz"))
    nograd128 = trim(load("fixtures/traces-depth/gpt2_nograd_bs4_seq128_L2.json.gz"))
    seeds = {
        "synthetic_train_layers": request(layers=5) + synthetic_training(),
        "synthetic_train_seq": request(seq_len=48) + synthetic_training(),
        "synthetic_train_layers_seq": request(layers=4, seq_len=32) + synthetic_training(steps=2),
        "synthetic_train_foreach": request(layers=3) + synthetic_training(per_parameter=False),
        "synthetic_fit": request(seq_len=40, layers=3, two=True)
        + synthetic_training(seq=8) + b"\0" + synthetic_training(seq=16),
        "synthetic_gen_tokens": request(new_tokens=9) + synthetic_generation(),
        "synthetic_gen_layers_tokens": request(layers=4, new_tokens=6) + synthetic_generation(),
        "synthetic_gen_static": request(new_tokens=7) + synthetic_generation(static=True),
        "synthetic_gen_seq": request(seq_len=9, new_tokens=5) + synthetic_generation(),
        # A real trace, trimmed: its first step, module frames only.
        "nograd_seq": request(seq_len=512) + trim(load("fixtures/traces-depth/gpt2_nograd_bs4_seq128_L2.json.gz")),
    }
    for name, data in seeds.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()

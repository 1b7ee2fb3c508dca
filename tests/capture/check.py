#!/usr/bin/env python3
"""End-to-end check of the capture helper (www/memcast_capture.py) with memcast.

A tiny Llama config (6 layers, 4 heads, vocabulary 1000) is captured the way a
user captures a big model: 2 blocks at a short length (and 4 of 12 new tokens
for a generation), with the full job's figures in the trace. memcast is run on
that trace with no flag, and its answer is compared with memcast's estimate of
a trace of the full tiny model (all 6 blocks at the full length, every new
token), for training, LoRA, inference and generation. The wrapper for a user's
own loop is checked the same way on a plain PyTorch model.

    python tests/capture/check.py [MEMCAST]   (default target/debug/memcast)

Needs torch, transformers and peft (bash .ci/test.sh makes a venv with them).
Prints one line per job and exits 1 on any failure.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "www"))
import memcast_capture  # noqa: E402  (the helper as shipped)

MEMCAST = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "debug", "memcast")
# The rebuilt trace is the full trace's, so the estimates agree to the
# allocator's rounding: peak reserved within one 2 MiB segment, or 0.5 %.
TOLERANCE_BYTES = 2 << 20
TOLERANCE_FRACTION = 0.005

TINY = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
    "intermediate_size": 176, "num_hidden_layers": 6, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}

# job, full figures, and how the full model is traced instead of shrunk.
JOBS = [
    ("train", ["--batch", "2", "--seq-len", "256", "--optimizer", "adamw"],
     ["--trace-layers", "6", "--trace-seq-len", "256"]),
    ("lora", ["--batch", "2", "--seq-len", "256"], ["--trace-layers", "6", "--trace-seq-len", "256"]),
    ("inference", ["--batch", "4", "--seq-len", "256"], ["--trace-layers", "6", "--trace-seq-len", "256"]),
    ("generate", ["--batch", "2", "--seq-len", "40", "--new-tokens", "12", "--trace-new-tokens", "4", "--steps", "2"],
     ["--trace-layers", "6", "--trace-new-tokens", "12"]),
]

failures = []


def memcast(*args):
    r = subprocess.run([MEMCAST, *args], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"memcast {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def estimate(trace, *flags):
    return json.loads(memcast("estimate", "--json", trace, "--gpu", "a100-80gb", *flags))


def check(condition, message):
    if not condition:
        failures.append(message)
        print(f"  FAIL {message}")


def capture(config, job, args, out):
    """Runs the helper as `python memcast_capture.py ...` would, in this process."""
    memcast_capture.main([config, "--job", job, *args, "--out", out])


def close(small, full):
    return abs(small - full) <= max(TOLERANCE_BYTES, TOLERANCE_FRACTION * full)


def check_job(tmp, config, job, small_args, full_args):
    started = time.time()
    small = os.path.join(tmp, f"{job}_small.json.gz")
    full = os.path.join(tmp, f"{job}_full.json.gz")
    capture(config, job, small_args, small)
    capture(config, job, small_args + full_args, full)
    got, want = estimate(small), estimate(full)
    summary = got["summary"]
    check(summary.get("capture", {}).get("job") == job, f"{job}: the trace names its job")
    check(bool(summary.get("scaled")), f"{job}: the small trace was rebuilt for the full job")
    check(not want["summary"].get("scaled"), f"{job}: the full trace is estimated as traced")
    r_small, r_full = got["peak"]["reserved_bytes"], want["peak"]["reserved_bytes"]
    a_small, a_full = got["peak"]["allocated_bytes"], want["peak"]["allocated_bytes"]
    check(close(r_small, r_full), f"{job}: peak reserved {r_small} from 2 blocks vs {r_full} from the full model")
    # The link of the flag-less estimate carries the figures it answered,
    # so it is the link of the same estimate asked with the flags.
    flags = [f for pair in (("--layers", summary["scaled"].get("depth", {}).get("estimated")),
                            ("--seq-len", summary["scaled"].get("length", {}).get("estimated")),
                            ("--new-tokens", summary["scaled"].get("tokens", {}).get("estimated")))
             if pair[1] is not None for f in (pair[0], str(pair[1]))]
    base = "https://example.org/memcast/"
    plain = memcast("estimate", small, "--gpu", "a100-80gb", "--link", base)
    explicit = memcast("estimate", small, "--gpu", "a100-80gb", *flags, "--link", base)
    check(plain == explicit, f"{job}: the link without flags equals the link with {flags}")
    print(f"{job}: 2-block trace {r_small} B reserved / {a_small} B allocated, full model "
          f"{r_full} / {a_full} ({100 * (r_small - r_full) / r_full:+.2f} % reserved), "
          f"{time.time() - started:.0f} s")


def check_wrapper(tmp):
    """A user's own loop under memcast_capture.capture: the figures reach memcast."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

        def forward(self, x):
            return x + self.fc2(torch.relu(self.fc1(x)))

    model = torch.nn.Sequential(*[Block() for _ in range(2)], torch.nn.Linear(64, 10))
    opt = torch.optim.AdamW(model.parameters())
    out = os.path.join(tmp, "own_loop.json.gz")
    with memcast_capture.capture(out, layers=8, traced_layers=2, job="train", model="own") as prof:
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(torch.randn(32, 64)), torch.zeros(32, dtype=torch.long)).backward()
            opt.step()
            prof.step()
    report = estimate(out)
    capture_facts = report["summary"].get("capture", {})
    check(capture_facts.get("layers") == 8, "wrapper: the trace carries the full job's 8 layers")
    depth = report["summary"].get("scaled", {}).get("depth", {})
    check(depth.get("estimated") == 8, f"wrapper: memcast rebuilt 8 blocks (got {depth})")
    print(f"wrapper: own loop traced with 2 blocks, estimated with {depth.get('estimated')}: "
          f"{report['peak']['reserved_bytes']} B reserved")


def main():
    if not os.path.exists(MEMCAST):
        sys.exit(f"no memcast at {MEMCAST}: cargo build first, or pass its path")
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="memcast-capture-") as tmp:
        config = os.path.join(tmp, "tiny-llama", "config.json")
        os.makedirs(os.path.dirname(config))
        with open(config, "w") as f:
            json.dump(TINY, f)
        for job, small_args, full_args in JOBS:
            check_job(tmp, config, job, small_args, full_args)
        check_wrapper(tmp)
    ran = len(JOBS) + 1
    print(f"capture helper: {ran - len({m.split(':')[0] for m in failures})} passed, "
          f"{len({m.split(':')[0] for m in failures})} failed ({time.time() - started:.0f} s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

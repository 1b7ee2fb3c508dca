#!/usr/bin/env python3
"""CPU profiler trace of a CS336 'cs336-basics' Transformer LM training loop, paired with a
real GPU allocator snapshot of the same configuration.

Profiler settings are those of ../tracegen/profile_cpu.py (CPU activity, profile_memory,
record_shapes, with_stack, schedule wait=0 warmup=0 active=ITERS, gzipped Chrome trace,
.meta.json sidecar, machine path prefixes rewritten).  Loop per iteration:
optimizer.zero_grad(set_to_none=True) -> forward -> cross_entropy -> backward -> AdamW.step()
(--optimizer picks cs336 AdamW (default), torch.optim.AdamW foreach/single-tensor or none;
--no-backward profiles forward + loss only; --no-grad does it under torch.no_grad()).

    python profile_cs336.py --size small --context-length 128 --batch-size 4 \
        --snapshot shared/.../memory_small_train_128.pickle.gz --real-peak-reserved 2575302656 \
        --source-repo Okazaki-Yumemi/CS336 --out OUT.json.gz
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time

HERE = os.environ.get("CS336_TOOLS_DIR", "/work/shared/tools/cs336")  # variant copy of profile_cs336.py: see --forward-only-drop
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tracegen"))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, schedule  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import profile_cpu  # noqa: E402  (reused: write_outputs, path_rewrites)
import model as cs336  # noqa: E402

CS336_DIR_PLACEHOLDER = "/opt/cs336"
_orig_rewrites = profile_cpu.path_rewrites


def _rewrites():
    pairs = [(HERE, CS336_DIR_PLACEHOLDER)] + _orig_rewrites()
    return sorted(pairs, key=lambda p: -len(p[0]))


profile_cpu.path_rewrites = _rewrites


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--size", required=True, choices=list(cs336.MODEL_SIZES))
    p.add_argument("--context-length", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--optimizer", default="cs336-adamw",
                   choices=["cs336-adamw", "torch-adamw-foreach", "torch-adamw-single", "none"],
                   help="cs336-adamw (default, staff re-implementation); torch-adamw-foreach = "
                        "torch.optim.AdamW(foreach=True), the CUDA default multi-tensor path; "
                        "none = no optimizer step in the profiled loop (fwd[+bwd] windows)")
    p.add_argument("--no-backward", action="store_true",
                   help="forward + loss only (autograd graph still built); implies --optimizer none")
    p.add_argument("--no-grad", action="store_true",
                   help="forward + loss under torch.no_grad() (implies --no-backward)")
    p.add_argument("--inference-mode", action="store_true",
                   help="forward + loss under torch.inference_mode() (implies --no-grad's loop; "
                        "under autocast it differs: no weight cast cache)")
    p.add_argument("--autocast-bf16", action="store_true",
                   help="forward + loss under torch.autocast('cpu', dtype=torch.bfloat16)")
    p.add_argument("--snapshot", default=None, help="matched snapshot (path recorded in the sidecar as given)")
    p.add_argument("--snapshot-device-trace", type=int, default=0)
    p.add_argument("--real-peak-reserved", type=int, default=None)
    p.add_argument("--real-peak-allocated", type=int, default=None)
    p.add_argument("--real-reserved-at-window-start", type=int, default=None)
    p.add_argument("--source-repo", default=None)
    p.add_argument("--source-path", default=None)
    p.add_argument("--source-commit", default=None)
    p.add_argument("--window-note", default="")
    p.add_argument("--layers", type=int, default=None,
                   help="build the model with this many transformer blocks instead of the size's own "
                        "(a reduced-depth trace; the sidecar keeps the full count as full_num_layers)")
    p.add_argument("--forward-only-drop", action="store_true",
                   help="variant: each iteration runs only `_ = model(inputs)` (no loss) and drops the output "
                        "before the next iteration, like a benchmark's forward_step() returning None")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    full_layers = cs336.MODEL_SIZES[args.size]["num_layers"]
    if args.layers is not None:
        if args.layers < 1:
            sys.exit("--layers must be at least 1")
        cs336.MODEL_SIZES[args.size] = dict(cs336.MODEL_SIZES[args.size], num_layers=args.layers)
    if not args.out.endswith(".json.gz"):
        sys.exit("--out must end with .json.gz")
    torch.manual_seed(args.seed)
    t0 = time.time()

    model = cs336.build(args.size, args.context_length).to("cpu")
    model.train()
    if args.inference_mode:
        args.no_grad = True
    if args.no_grad:
        args.no_backward = True
    if args.no_backward:
        args.optimizer = "none"
    if args.optimizer == "cs336-adamw":
        optimizer = cs336.AdamW(model.parameters())
    elif args.optimizer == "torch-adamw-foreach":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    elif args.optimizer == "torch-adamw-single":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    else:
        optimizer = None
    B, T = args.batch_size, args.context_length
    n = B * args.iters
    dataset = TensorDataset(torch.randint(0, cs336.VOCAB_SIZE, (n, T)),
                            torch.randint(0, cs336.VOCAB_SIZE, (n, T)))
    loader = DataLoader(dataset, batch_size=B, shuffle=False, num_workers=0, drop_last=True)

    n_params = sum(q.numel() for q in model.parameters())
    param_bytes = sum(q.numel() * q.element_size() for q in model.parameters())
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())

    tmpdir = tempfile.mkdtemp(prefix="cs336trace_")
    raw_path = os.path.join(tmpdir, "trace.json")

    def on_trace_ready(prof):
        prof.export_chrome_trace(raw_path)

    running_loss = 0.0
    t_loop = time.time()
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=0, active=args.iters, repeat=1),
        on_trace_ready=on_trace_ready,
        profile_memory=True,
        record_shapes=True,
        with_stack=True,
    ) as prof:
        for step, (inputs, targets) in enumerate(loader):
            if step >= args.iters:
                break
            if optimizer is not None:
                optimizer.zero_grad(set_to_none=True)
            elif not args.no_backward:
                model.zero_grad(set_to_none=True)
            amp = (torch.autocast("cpu", dtype=torch.bfloat16) if args.autocast_bf16
                   else contextlib.nullcontext())
            grad_ctx = (torch.inference_mode() if args.inference_mode
                        else torch.no_grad() if args.no_grad else contextlib.nullcontext())
            if args.forward_only_drop:
                with amp, grad_ctx:
                    _ = model(inputs)
                del _
                prof.step()
                continue
            with amp, grad_ctx:
                logits = model(inputs)
                loss = cs336.cross_entropy(logits, targets)
            if not args.no_backward:
                loss.backward()
            if optimizer is not None:
                optimizer.step()
            running_loss += loss.item()
            prof.step()
    loop_s = time.time() - t_loop

    dims = dict(cs336.MODEL_SIZES[args.size])
    dims.update(vocab_size=cs336.VOCAB_SIZE, context_length=T, d_head=dims["d_model"] // dims["num_heads"],
                rope_theta=10000.0, tied_embeddings=False, norm="RMSNorm (pre-norm)", ffn="SwiGLU",
                attention="explicit einsum + masked softmax (no fused SDPA)",
                full_num_layers=full_layers)
    meta = {
        "model": f"cs336-basics-{args.size}",
        "model_family": "causal_lm",
        "model_details": dims,
        "optimizer": "adamw" if optimizer is not None else None,
        "optimizer_class": {
            "cs336-adamw": "cs336_basics.optimizer.AdamW (re-implemented; per-parameter, un-fused)",
            "torch-adamw-foreach": "torch.optim.AdamW(foreach=True) (multi-tensor path, as on CUDA by default)",
            "torch-adamw-single": "torch.optim.AdamW(foreach=False) (single-tensor path)",
            "none": None}[args.optimizer],
        "optimizer_defaults": ({k: v for k, v in optimizer.defaults.items()
                                if isinstance(v, (int, float, bool, str, type(None)))}
                               if optimizer is not None else None),
        "grad_mode": "inference_mode" if args.inference_mode else "no_grad" if args.no_grad else "enabled",
        "autocast": "cpu bfloat16" if args.autocast_bf16 else None,
        "variant": ("profile_cs336_fwdonly.py --forward-only-drop: per iteration only `_ = model(inputs)`, no loss, "
                    "output dropped before the next iteration") if args.forward_only_drop else None,
        "loop": {"backward": not args.no_backward, "optimizer_step": optimizer is not None,
                 "grads_cleared": ("optimizer.zero_grad(set_to_none=True)" if optimizer is not None
                                   else (None if args.no_backward else "model.zero_grad(set_to_none=True)"))},
        "batch_size": B,
        "input_shape": [B, T],
        "input_dtype": "int64",
        "seq_len": T,
        "dtype": "float32",
        "zero_grad_position": "pos1" if not args.no_backward else None,
        "zero_grad_set_to_none": True if not args.no_backward else None,
        "iterations": args.iters,
        "device": "cpu",
        "param_count": n_params,
        "param_bytes": param_bytes,
        "trainable_param_bytes": param_bytes,
        "buffer_bytes": buffer_bytes,
        "dataset_bytes": sum(t.numel() * t.element_size() for t in dataset.tensors),
        "final_running_loss": running_loss,
        "versions": {"torch": torch.__version__},
        "torch_num_threads": torch.get_num_threads(),
        "profiler": {"activities": ["CPU"], "profile_memory": True, "record_shapes": True,
                     "with_stack": True,
                     "schedule": {"wait": 0, "warmup": 0, "active": args.iters, "repeat": 1}},
        "ground_truth": {
            "snapshot": args.snapshot,
            "snapshot_device_trace": args.snapshot_device_trace,
            "source_repo": args.source_repo,
            "source_path": args.source_path,
            "source_commit": args.source_commit,
            "real_peak_reserved_bytes": args.real_peak_reserved,
            "real_peak_allocated_requested_bytes": args.real_peak_allocated,
            "real_reserved_at_window_start_bytes": args.real_reserved_at_window_start,
            "window": args.window_note,
        },
        "timing_seconds": {"profiled_loop_incl_export": round(loop_s, 2)},
    }
    meta_path = profile_cpu.write_outputs(raw_path, args.out, meta, False)
    os.remove(raw_path)
    os.rmdir(tmpdir)
    t = meta["trace"]
    print(f"{os.path.basename(args.out)}: {t['num_events']} events, {t['num_memory_events']} [memory], "
          f"gz {t['gzip_bytes']/1e6:.2f} MB, max Total Allocated "
          f"{(t['max_total_allocated_bytes'] or 0)/2**20:.1f} MiB, {time.time()-t0:.0f} s -> {meta_path}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""tracegen's profile_cpu.py with a few recipes it lacks, for (CPU trace, real GPU peak) pairs.

Runs ``profile_cpu.py`` (found through $TRACEGEN, default ../shared/tools/tracegen) unchanged,
after patching the names it looks up at run time. The extra flags, all ``--x-*``, are taken
out before profile_cpu parses the rest:

  --x-attn eager|sdpa        attention implementation of a Hugging Face model
                             (``model.set_attn_implementation``)
  --x-amp-cuda fp16          on --device cuda, autocast to float16 where the CPU trace
                             uses bfloat16 (the CPU has no float16 autocast worth the name)
  --x-grad-scaler            on --device cuda, torch.amp.GradScaler: the loss is scaled
                             before backward, ``scaler.step`` + ``scaler.update`` replace
                             ``optimizer.step`` (as the Trainer's fp16 does)
  --x-amp-outer bf16         autocast entered OUTSIDE the no_grad / inference_mode block
                             (profile_cpu nests it inside); give --autocast none with it
  --x-bert K=V,...           BertConfig overrides (e.g. bert-large: hidden_size=1024,
                             num_attention_heads=16,intermediate_size=4096)
  --x-snapshot none|events|stacks
                             on --device cuda, record the caching allocator's history and
                             dump it beside NAME.gpu.json (events: no frames; stacks: Python
                             frames of every allocation)
  --x-cuda-trace             on --device cuda, also record the loop under torch.profiler (CPU
                             activity, profile_memory, record_shapes) and write
                             NAME.cuda.json.gz: every CUDA allocation as a [memory] event
                             inside the op that made it (cuDNN workspaces, attention buffers),
                             with the allocator's reserved bytes after it

Model ``x-smallcnn``: Conv2d(3, 8, 3) -> ReLU -> AvgPool2d(4) -> Flatten -> Linear(., classes),
the smallest network whose peak is one convolution's backward.

On --device cuda it also writes NAME.stats.json: torch.cuda.memory_stats() at the end, the
device's capability, cuDNN's version and the scaled-dot-product backends enabled.
"""
import contextlib
import gzip
import json
import os
import pickle
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
TRACEGEN = os.environ.get("TRACEGEN") or os.path.join(HERE, "..", "..", "..", "shared", "tools",
                                                       "tracegen")


def take(argv, flag, has_value=True):
    """Remove `flag` (and its value) from argv; return the value, True, or None."""
    if flag not in argv:
        return None
    i = argv.index(flag)
    if not has_value:
        del argv[i]
        return True
    value = argv[i + 1]
    del argv[i:i + 2]
    return value


def main():
    argv = sys.argv[1:]
    attn = take(argv, "--x-attn")
    amp_cuda = take(argv, "--x-amp-cuda")
    scaler_on = take(argv, "--x-grad-scaler", has_value=False)
    amp_outer = take(argv, "--x-amp-outer")
    bert = take(argv, "--x-bert")
    snapshot = take(argv, "--x-snapshot") or "none"
    cuda_trace = take(argv, "--x-cuda-trace", has_value=False)
    device = "cuda" if ("--device" in argv and argv[argv.index("--device") + 1] == "cuda") else "cpu"
    out = argv[argv.index("--out") + 1]
    stem = out.removesuffix(".gz").removesuffix(".json")

    sys.path.insert(0, TRACEGEN)
    import profile_cpu as pc
    import torch
    import torch.nn as nn

    real_torch = torch
    overrides = {}

    if amp_cuda == "fp16" and device == "cuda":
        def autocast(dev, dtype=None, **kw):
            if dtype is real_torch.bfloat16:
                dtype = real_torch.float16
            return real_torch.autocast(dev, dtype=dtype, **kw)
        overrides["autocast"] = autocast

    if amp_outer:
        dtype = {"bf16": real_torch.bfloat16, "fp16": real_torch.float16}[amp_outer]
        if device == "cuda" and amp_cuda == "fp16":
            dtype = real_torch.float16

        def outer(mode):
            @contextlib.contextmanager
            def ctx():
                with real_torch.autocast(device, dtype=dtype), mode():
                    yield
            return ctx
        overrides["no_grad"] = outer(real_torch.no_grad)
        overrides["inference_mode"] = outer(real_torch.inference_mode)

    if overrides:
        proxy = types.ModuleType("torch")

        def getattr_(name):
            return getattr(real_torch, name)
        proxy.__getattr__ = getattr_
        for k, v in overrides.items():
            setattr(proxy, k, v)
        pc.torch = proxy

    scaler = None
    optimizers = []
    if scaler_on and device == "cuda":
        # init_scale 2**10, not 2**16: a random-init model's first scaled gradients overflow
        # at 2**16 and GradScaler skips those steps, so a 3-step run would never make the
        # optimizer state. The scale's value changes no allocation.
        scaler = real_torch.amp.GradScaler("cuda", init_scale=2.0**10)
        orig_forward_loss = pc.forward_loss

        def forward_loss(*a, **kw):
            return scaler.scale(orig_forward_loss(*a, **kw))
        pc.forward_loss = forward_loss
        orig_build_optimizer = pc.build_optimizer

        def build_optimizer(args, model):
            opt = orig_build_optimizer(args, model)
            plain_step = opt.step
            inside = [False]

            def step(*a, **kw):
                if inside[0]:
                    return plain_step(*a, **kw)
                inside[0] = True
                try:
                    scaler.step(opt)
                    scaler.update()
                finally:
                    inside[0] = False
            opt.step = step
            optimizers.append(opt)
            return opt
        pc.build_optimizer = build_optimizer

    if bert:
        import transformers
        real_cfg = transformers.BertConfig
        extra = {}
        for kv in bert.split(","):
            k, v = kv.split("=")
            extra[k] = int(v) if v.isdigit() else float(v) if "." in v else v

        def bert_config(*a, **kw):
            return real_cfg(*a, **{**kw, **extra})
        transformers.BertConfig = bert_config

    orig_build_model = pc.build_model

    def build_model(args):
        if args.model == "x-smallcnn":
            classes = args.num_classes or 10
            side = (args.image_size - 2) // 4
            model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AvgPool2d(4), nn.Flatten(),
                                  nn.Linear(8 * side * side, classes))
            args.num_classes = classes
            return model, "image_cls", {"model_class": "SmallCNN", "num_classes": classes}
        model, family, details = orig_build_model(args)
        if attn and hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(attn)
            details["attn_implementation"] = attn
        return model, family, details
    pc.build_model = build_model

    if device == "cuda":
        orig_init = pc.GpuPeak.__init__
        orig_write = pc.GpuPeak.write

        orig_enter = pc.GpuPeak.__enter__
        orig_exit = pc.GpuPeak.__exit__
        orig_step = pc.GpuPeak.step

        def init(self):
            orig_init(self)
            self.prof = None
            if cuda_trace:
                from torch.profiler import ProfilerActivity, profile
                self.prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                                    record_shapes=True, with_stack=False)
            if snapshot != "none":
                real_torch.cuda.memory._record_memory_history(
                    enabled="all", context="alloc" if snapshot == "stacks" else None,
                    stacks="python", max_entries=2_000_000)

        def enter(self):
            out = orig_enter(self)
            if self.prof is not None:
                self.prof.__enter__()
            return out

        def exit_(self, *exc):
            out = orig_exit(self, *exc)
            if self.prof is not None:
                self.prof.__exit__(None, None, None)
            return out

        def step(self):
            orig_step(self)
            if self.prof is not None:
                self.prof.step()

        def write(self, args, running_loss):
            orig_write(self, args, running_loss)
            if self.prof is not None:
                raw = stem + ".cuda.json"
                self.prof.export_chrome_trace(raw)
                with open(raw, "rb") as f, gzip.open(raw + ".gz", "wb", compresslevel=6) as g:
                    data = f.read()
                    g.write(data)
                os.remove(raw)
                cuda_events = data.count(b'"Device Type": 1')
                print(f"{os.path.basename(raw)}.gz: {len(data)} B, "
                      f"{cuda_events} CUDA memory events")
            if snapshot != "none":
                snap = real_torch.cuda.memory._snapshot()
                real_torch.cuda.memory._record_memory_history(enabled=None)
                with gzip.open(stem + ".snapshot.pickle.gz", "wb", compresslevel=6) as f:
                    pickle.dump(snap, f)
            cuda = real_torch.backends.cuda
            stats = {
                "memory_stats": real_torch.cuda.memory_stats(),
                "capability": list(real_torch.cuda.get_device_capability(0)),
                "cudnn": real_torch.backends.cudnn.version(),
                "cudnn_benchmark": real_torch.backends.cudnn.benchmark,
                "sdpa_enabled": {
                    "flash": cuda.flash_sdp_enabled(),
                    "mem_efficient": cuda.mem_efficient_sdp_enabled(),
                    "math": cuda.math_sdp_enabled(),
                    "cudnn": getattr(cuda, "cudnn_sdp_enabled", lambda: None)(),
                },
                "x_flags": {"attn": attn, "amp_cuda": amp_cuda, "grad_scaler": bool(scaler_on),
                            "amp_outer": amp_outer, "bert": bert, "snapshot": snapshot,
                            "cuda_trace": bool(cuda_trace)},
                "grad_scaler_scale": float(scaler.get_scale()) if scaler else None,
                "optimizer_state_tensors": sum(
                    sum(1 for v in st.values() if real_torch.is_tensor(v))
                    for opt in optimizers for st in opt.state.values()) if optimizers else None,
            }
            with open(stem + ".stats.json", "w", encoding="utf-8") as f:
                json.dump(stats, f, indent=1)
        pc.GpuPeak.__init__ = init
        pc.GpuPeak.write = write
        pc.GpuPeak.__enter__ = enter
        pc.GpuPeak.__exit__ = exit_
        pc.GpuPeak.step = step

    pc.main(argv)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""memcast_capture: record the CPU trace memcast needs, in one command.

Trace small, run big. For a Hugging Face model id (only its config.json is
read, never its weights) or a local config.json, this builds a copy of the
model with a few of its blocks and random weights, runs the job you describe
on the CPU under torch.profiler with the options memcast needs, and writes
into the trace the full job's figures (layers, sequence length, new tokens,
what was shrunk). memcast then answers for the full job with no flag: drop
the file on the page, or run `memcast estimate TRACE`.

    python memcast_capture.py meta-llama/Llama-3.1-8B --job train --optimizer adamw \\
        --precision bf16-mixed --batch 4 --seq-len 4096
    python memcast_capture.py ./config.json --job qlora --batch 8 --seq-len 2048 --checkpointing
    python memcast_capture.py gpt2 --job generate --seq-len 512 --new-tokens 1024
    python memcast_capture.py gpt2 --job inference --batch 32 --seq-len 1024

Jobs: train (every weight, with --optimizer), lora and qlora (peft adapters on
the frozen or 4-bit NF4 weights; need peft, and bitsandbytes for qlora),
inference (forward under torch.inference_mode) and generate (model.generate,
greedy, with the KV cache).

Your own training loop: wrap it, and the profiler is set up the same way.

    from memcast_capture import capture
    with capture("trace.json.gz", layers=32, seq_len=4096, traced_layers=2,
                 traced_seq_len=128) as prof:
        for step, batch in zip(range(3), loader):
            ...  # your training step, on the CPU, with a 2-block model
            prof.step()

Needs torch (CPU is enough); transformers for a model id or config; peft for
lora and qlora; bitsandbytes for qlora. Nothing here uploads anything.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import time
import warnings

TOOL = "memcast_capture 1"
SCHEMA = "memcast.capture/1"
JOBS = ("train", "lora", "qlora", "inference", "generate")
TRAINING_JOBS = ("train", "lora", "qlora")
PRECISIONS = ("fp32", "bf16", "bf16-mixed", "fp16-mixed")
OPTIMIZERS = ("adamw", "adam", "sgd", "adafactor", "rmsprop", "adagrad")
# Short lengths to trace at, in order of preference (see pick_trace_len).
TRACE_LENGTHS = (128, 96, 160, 112, 144, 192, 80, 176, 208, 240)
# The config attributes that give the number of repeated blocks.
DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers", "n_layers")


def fail(message):
    """Stops with a message that says what to do."""
    sys.exit(f"memcast_capture: {message}")


# --------------------------------------------------------------------------
# The figures written into the trace
# --------------------------------------------------------------------------
def safe_text(value):
    """A string the profiler's JSON writer keeps intact: it turns a backslash
    into a slash and writes quotes and non-ASCII unescaped, which breaks the
    file, so anything but letters, digits and ._/:+- becomes '_'."""
    return re.sub(r"[^A-Za-z0-9._/:+ -]", "_", str(value))[:200]


def capture_figures(**figures):
    """The `memcast` metadata: the JSON the trace carries, None values left out."""
    out = {"schema": SCHEMA, "tool": TOOL}
    for key, value in figures.items():
        if value is None or value is False:
            continue
        if isinstance(value, bool):
            out[key] = 1
        elif isinstance(value, int):
            out[key] = int(value)
        else:
            out[key] = safe_text(value)
    return json.dumps(out, ensure_ascii=True, sort_keys=True)


@contextlib.contextmanager
def capture(path, *, layers=None, seq_len=None, new_tokens=None, traced_layers=None,
            traced_seq_len=None, traced_new_tokens=None, steps=3, **figures):
    """torch.profiler set up as memcast needs it, around your own loop.

    Records CPU activity with profile_memory, record_shapes and with_stack,
    for `steps` calls of `prof.step()` (three let a stateful optimizer reach
    its steady state), writes the full job's figures into the trace and
    exports it to `path` (`.json` or `.json.gz`) when the block ends. Give
    the full job's `layers`, `seq_len` (and `new_tokens` for a generation),
    and what you traced with `traced_*`; other keywords (model, job,
    optimizer, precision, batch, max_positions, autocast_dtype, grad_scaler,
    checkpointing, grad_accum) are written as they are.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    meta = capture_figures(layers=layers, seq_len=seq_len, new_tokens=new_tokens,
                           traced_layers=traced_layers, traced_seq_len=traced_seq_len,
                           traced_new_tokens=traced_new_tokens, **figures)
    written = []

    def export(done):
        done.export_chrome_trace(str(path))
        written.append(path)

    with warnings.catch_warnings():
        # "won't be using warmup": the first step is recorded on purpose.
        warnings.simplefilter("ignore", UserWarning)
        # One cycle of `steps` steps (repeat=1), exported as soon as it is done.
        prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                       record_shapes=True, with_stack=True, on_trace_ready=export,
                       schedule=schedule(wait=0, warmup=0, active=steps, repeat=1))
        # Set before recording starts: the profiler adds it to the trace it records.
        prof.preset_metadata_json("memcast", meta)
        prof.start()
    try:
        yield prof
    finally:
        prof.stop()
    if not written:
        fail(f"the profiler recorded no step, so {path} was not written: call prof.step() "
             "after each step of your loop")
    del torch


# --------------------------------------------------------------------------
# The model: its config, a few blocks, random weights
# --------------------------------------------------------------------------
def load_config(model):
    """The model's config: from a config.json (or a folder with one), else by id."""
    import transformers

    if os.path.isdir(model):
        model = os.path.join(model, "config.json")
    if os.path.isfile(model):
        with open(model, encoding="utf-8") as f:
            raw = json.load(f)
        model_type = raw.pop("model_type", None)
        if not model_type:
            fail(f"{model} has no model_type: give a Hugging Face config.json")
        return transformers.AutoConfig.for_model(model_type, **raw)
    try:
        return transformers.AutoConfig.from_pretrained(model)
    except Exception as err:  # no network, a private model, a typo
        fail(f"cannot read the config of {model!r} ({err}); download its config.json "
             "and give its path instead")


def depth_of(cfg):
    """(config holding the depth, attribute names, layers) of a model config."""
    for holder in (cfg, getattr(cfg, "text_config", None)):
        if holder is None:
            continue
        keys = [k for k in DEPTH_KEYS if isinstance(getattr(holder, k, None), int)]
        if keys:
            return holder, keys, getattr(holder, keys[0])
    fail("the config names no number of layers (num_hidden_layers, n_layer, num_layers)")


def shrink_depth(cfg, layers):
    """The config with `layers` blocks: the depth keys and every per-layer list."""
    holder, keys, full = depth_of(cfg)
    for key in keys:
        setattr(holder, key, min(layers, getattr(holder, key)))
    for key, value in list(vars(holder).items()):
        if isinstance(value, list) and len(value) == full:
            setattr(holder, key, value[:layers])
    return cfg


def max_positions(cfg):
    """The model's position limit, if its config gives one."""
    for holder in (cfg, getattr(cfg, "text_config", None)):
        for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
            value = getattr(holder, key, None) if holder is not None else None
            if isinstance(value, int) and value > 0:
                return value
    return None


def config_dims(cfg):
    """Every whole number of the config: a traced length equal to one of
    them (a head size, say) leaves memcast guessing which dims are lengths."""
    dims = set()
    for holder in (cfg, getattr(cfg, "text_config", None)):
        if holder is None:
            continue
        for value in vars(holder).values():
            if isinstance(value, int) and not isinstance(value, bool):
                dims.add(value)
        heads = getattr(holder, "num_attention_heads", None) or getattr(holder, "n_head", None)
        hidden = getattr(holder, "hidden_size", None) or getattr(holder, "n_embd", None)
        if heads and hidden:
            dims.add(hidden // heads)
    return dims


def pick_trace_len(full, cfg, batch):
    """A short length to trace at: shorter than the job's, equal to no
    dimension of the model (nor the batch), from TRACE_LENGTHS."""
    avoid = config_dims(cfg) | {batch}
    for length in TRACE_LENGTHS:
        if length < full and length not in avoid:
            return length
    return full


def model_class(cfg, job):
    """The transformers class for the job: the config's architecture when it
    is one, else a causal LM (sequence-to-sequence for encoder-decoders)."""
    import transformers

    for name in getattr(cfg, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    if getattr(cfg, "is_encoder_decoder", False):
        return transformers.AutoModelForSeq2SeqLM
    return transformers.AutoModelForCausalLM


def build_model(args, cfg):
    """The few-block model with random weights, as the job needs it."""
    import torch

    cls = model_class(cfg, args.job)
    make = cls.from_config if hasattr(cls, "from_config") else cls._from_config
    if args.job == "qlora":
        return quantized(make(cfg), cls)
    model = make(cfg)
    if args.precision == "bf16":
        model = model.to(torch.bfloat16)
    return model


def quantized(model, cls):
    """The model loaded as QLoRA loads a checkpoint: saved and read back with
    bitsandbytes' 4-bit NF4 (double quantisation) in place of every Linear
    but the output head."""
    import torch
    import transformers

    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        fail("--job qlora needs bitsandbytes: pip install bitsandbytes")
    qcfg = transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16)
    with tempfile.TemporaryDirectory(prefix="memcast_q_") as tmp:
        model.save_pretrained(tmp)
        del model
        model = cls.from_pretrained(tmp, quantization_config=qcfg, device_map={"": "cpu"})
        with torch.no_grad():  # out of the memory-mapped file, into ordinary memory
            for tensor in list(model.parameters()) + list(model.buffers()):
                if tensor.dtype.is_floating_point:
                    tensor.data = tensor.data.clone()
    return model


def add_adapters(args, model):
    """peft LoRA adapters on the frozen (or quantized) weights."""
    try:
        import peft
    except ImportError:
        fail(f"--job {args.job} needs peft: pip install peft")
    targets = args.lora_targets.split(",") if args.lora_targets else None
    lcfg = peft.LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, lora_dropout=0.0,
                           target_modules=targets)
    try:
        return peft.get_peft_model(model, lcfg)
    except ValueError as err:
        fail(f"peft cannot place adapters on this model ({err}); name the projections with "
             "--lora-targets q_proj,v_proj")


def make_optimizer(name, params, lr=1e-4):
    import torch

    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=1e-2)
    cls = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD,
           "rmsprop": torch.optim.RMSprop, "adagrad": torch.optim.Adagrad}[name]
    kwargs = {"momentum": 0.9} if name == "sgd" else {}
    return cls(params, lr=lr, **kwargs)


# --------------------------------------------------------------------------
# The job, under the profiler
# --------------------------------------------------------------------------
def batches(args, cfg, length, count):
    """`count` batches of random token ids through a DataLoader, as a job reads them."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    vocab = getattr(cfg, "vocab_size", None) or getattr(cfg.get_text_config(), "vocab_size")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (args.batch * count, length), generator=g)
    return DataLoader(TensorDataset(ids), batch_size=args.batch)


def labels_for(model, ids):
    """The labels a Hugging Face model computes its loss from."""
    import torch

    if type(model).__name__.endswith("ForSequenceClassification"):
        return torch.zeros(ids.shape[0], dtype=torch.long)
    return ids


def run_job(args, cfg, model, length, prof):
    """Runs the profiled steps of the job, calling prof.step() after each."""
    import torch

    autocast = (torch.autocast("cpu", dtype=torch.bfloat16)
                if args.precision in ("bf16-mixed", "fp16-mixed") else contextlib.nullcontext())
    if args.job == "generate":
        model.eval()
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        for (ids,) in batches(args, cfg, length, args.steps):
            with autocast:
                model.generate(ids, attention_mask=torch.ones_like(ids),
                               max_new_tokens=args.trace_new_tokens,
                               min_new_tokens=args.trace_new_tokens, do_sample=False,
                               num_beams=1, use_cache=True, disable_compile=True)
            prof.step()
        return
    if args.job == "inference":
        model.eval()
        for (ids,) in batches(args, cfg, length, args.steps):
            with torch.inference_mode(), autocast:
                model(input_ids=ids)
            prof.step()
        return
    model.train()
    optimizer = make_optimizer(args.optimizer, [p for p in model.parameters() if p.requires_grad])
    loader = iter(batches(args, cfg, length, args.steps * args.grad_accum))
    for _ in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        for _ in range(args.grad_accum):
            (ids,) = next(loader)
            with autocast:
                loss = model(input_ids=ids, labels=labels_for(model, ids)).loss
            (loss / args.grad_accum).backward()
        optimizer.step()
        prof.step()


def plan(args):
    """The config, the traced figures and the full job's, checked."""
    cfg = load_config(args.model)
    _, _, full_layers = depth_of(cfg)
    positions = max_positions(cfg)
    if args.seq_len is None:
        args.seq_len = min(positions or 512, 512) if args.job != "generate" else 128
    if args.job == "generate":
        if args.new_tokens is None:
            args.new_tokens = 256
        # A generation's prompt is traced at its length (memcast rebuilds
        # the new tokens and the layers, not the prompt).
        args.trace_seq_len = args.seq_len
        args.trace_new_tokens = min(args.trace_new_tokens, args.new_tokens)
        if args.trace_new_tokens < 2:
            fail("--trace-new-tokens must be at least 2: memcast copies a decode step")
    elif args.new_tokens is not None:
        fail("--new-tokens is for --job generate")
    if args.trace_seq_len is None:
        args.trace_seq_len = pick_trace_len(args.seq_len, cfg, args.batch)
    if args.trace_seq_len > args.seq_len:
        fail(f"--trace-seq-len {args.trace_seq_len} is longer than the job's --seq-len {args.seq_len}")
    if args.trace_layers > full_layers:
        args.trace_layers = full_layers
    if args.trace_layers < 2 and full_layers >= 2:
        fail("--trace-layers must be at least 2: memcast aligns a copied block with the one before it")
    if positions and args.seq_len + (args.new_tokens or 0) > positions:
        print(f"memcast_capture: note: {args.seq_len} + {args.new_tokens or 0} positions is past "
              f"the model's {positions}", file=sys.stderr)
    if args.job not in TRAINING_JOBS and (args.grad_accum != 1 or args.checkpointing):
        fail("--grad-accum and --checkpointing are for training jobs (train, lora, qlora)")
    return cfg, full_layers, positions


def model_label(model):
    """The model as the trace names it: its id, or its config file's folder or name."""
    if not os.path.exists(model):
        return model
    path = os.path.abspath(model)
    if os.path.isdir(path) or os.path.basename(path) == "config.json":
        path = path if os.path.isdir(path) else os.path.dirname(path)
        return os.path.basename(path) or "model"
    return os.path.splitext(os.path.basename(path))[0]


def default_out(args):
    name = model_label(args.model).rstrip("/").split("/")[-1]
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{name}_{args.job}_L{args.trace_layers}.json.gz")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="memcast_capture.py",
        description="Record the CPU trace memcast needs: a few blocks of the model, "
                    "a short context, random weights, the full job's figures in the trace.")
    parser.add_argument("model", help="a Hugging Face model id, a config.json, or a folder with one")
    parser.add_argument("--job", choices=JOBS, default="train")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw",
                        help="training jobs (default adamw)")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="fp32; bf16 (weights in bf16); bf16-mixed or fp16-mixed (autocast; "
                             "fp16-mixed also a GradScaler when training)")
    parser.add_argument("--batch", type=int, default=1, help="samples per batch (traced as is)")
    parser.add_argument("--seq-len", type=int, help="the job's sequence length (generate: the prompt)")
    parser.add_argument("--new-tokens", type=int, help="generate: the new tokens of the job")
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing")
    parser.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--lora-targets", help="comma-separated module names (default: peft's)")
    parser.add_argument("--trace-layers", type=int, default=2, help="blocks to trace (default 2)")
    parser.add_argument("--trace-seq-len", type=int,
                        help="length to trace at (default: a short one that equals no model dimension)")
    parser.add_argument("--trace-new-tokens", type=int, default=8,
                        help="generate: new tokens to trace (default 8)")
    parser.add_argument("--steps", type=int, default=3, help="profiled steps (default 3)")
    parser.add_argument("--out", help="the trace to write (.json.gz or .json)")
    args = parser.parse_args(argv)
    for flag in ("batch", "grad_accum", "steps", "lora_rank"):
        if getattr(args, flag) < 1:
            fail(f"--{flag.replace('_', '-')} must be at least 1")

    try:
        import torch
    except ImportError:
        fail("needs torch: pip install torch (the CPU build is enough)")
    try:
        import transformers  # noqa: F401
    except ImportError:
        fail("needs transformers for a model id or config.json: pip install transformers "
             "(for your own model, use memcast_capture.capture around your loop)")

    cfg, full_layers, positions = plan(args)
    shrink_depth(cfg, args.trace_layers)
    torch.manual_seed(0)
    started = time.time()
    model = build_model(args, cfg)
    if args.job in ("lora", "qlora"):
        model = add_adapters(args, model)
    if args.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.job == "generate" and not hasattr(model, "generate"):
        fail(f"{type(model).__name__} cannot generate: use --job inference")

    out = args.out or default_out(args)
    training = args.job in TRAINING_JOBS
    figures = dict(
        model=model_label(args.model),
        job=args.job, optimizer=args.optimizer if training else None,
        precision=args.precision, quantization="nf4" if args.job == "qlora" else None,
        batch=args.batch, layers=full_layers, traced_layers=args.trace_layers,
        seq_len=args.seq_len, traced_seq_len=args.trace_seq_len,
        new_tokens=args.new_tokens, traced_new_tokens=(
            args.trace_new_tokens if args.job == "generate" else None),
        max_positions=positions,
        autocast_dtype="fp16" if args.precision == "fp16-mixed" else None,
        grad_scaler=args.precision == "fp16-mixed" and training,
        checkpointing=args.checkpointing, grad_accum=args.grad_accum if training else None)
    with capture(out, steps=args.steps, **figures) as prof:
        run_job(args, cfg, model, args.trace_seq_len, prof)

    shrunk = [f"{full} -> {traced} {what}" for full, traced, what in (
        (full_layers, args.trace_layers, "layers"),
        (args.seq_len, args.trace_seq_len, "tokens"),
        (args.new_tokens, args.trace_new_tokens if args.job == "generate" else None, "new tokens"))
        if traced is not None and full != traced]
    size = os.path.getsize(out) / 2**20
    print(f"wrote {out} ({size:.1f} MiB, {time.time() - started:.0f} s): {args.job} of "
          f"{figures['model']}, traced with {', '.join(shrunk) or 'nothing shrunk'}")
    print(f"answer: drop it on the memcast page, or run: memcast estimate {out}")


if __name__ == "__main__":
    main()

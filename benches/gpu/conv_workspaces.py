#!/usr/bin/env python3
"""cuDNN's workspace per convolution pass on this GPU, under PyTorch's defaults (issue 32).

    python3 benches/gpu/conv_workspaces.py OUT.json [--quick]

For a grid of 2-D convolutions (channels in/out, kernel, stride, groups, image side, batch,
dtype), runs one forward and one backward on CUDA under torch.profiler with profile_memory
and records, for each pass, the blocks allocated and freed inside the op itself (not in a
child op): the plan's workspace. One warm-up call per geometry first, so cuDNN's plan
cache and the allocator's first segments do not differ from what a training loop's later
iterations see (both are recorded: `first` and `steady`). Writes one JSON row a geometry
with the input, weight and output bytes and the workspaces of `cudnn_convolution` (forward)
and `convolution_backward` (data and filter passes, in call order), and the op that ran the
forward (cuDNN, depthwise, ...).
"""
import itertools, json, sys
import torch
from torch.profiler import ProfilerActivity, profile

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def transients(prof_json):
    ev = prof_json["traceEvents"]
    ops = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    mem = sorted((e for e in ev if e.get("name") == "[memory]"
                  and e["args"].get("Device Type") == 1), key=lambda e: e["ts"])
    def inner(e):
        best = None
        for o in ops:
            if o["tid"] == e["tid"] and o["ts"] <= e["ts"] <= o["ts"] + o["dur"]:
                if best is None or o["dur"] < best["dur"]:
                    best = o
        return best
    live, out, names = {}, {}, set()
    for e in mem:
        o = inner(e)
        if o is None:
            continue
        a = e["args"]
        key = (o["name"], o["ts"])
        if a["Bytes"] > 0:
            live[a["Addr"]] = (key, a["Bytes"])
        elif a["Addr"] in live:
            k, b = live.pop(a["Addr"])
            if k == key:
                out.setdefault(o["name"], []).append(b)
    for o in ops:
        names.add(o["name"])
    return out, sorted(n for n in names if "conv" in n)


def run(cin, cout, k, s, g, hw, n, dt):
    x = torch.randn(n, cin, hw, hw, device="cuda", dtype=DT[dt], requires_grad=True)
    conv = torch.nn.Conv2d(cin, cout, k, stride=s, padding=k // 2, groups=g, bias=False).to(
        "cuda", DT[dt])
    rows = {}
    for phase in ("first", "steady"):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
            y = conv(x)
            y.backward(torch.ones_like(y))
        torch.cuda.synchronize()
        p.export_chrome_trace("/tmp/cw.json")
        t, names = transients(json.load(open("/tmp/cw.json")))
        rows[phase] = {"forward": t.get("aten::cudnn_convolution", []),
                       "backward": t.get("aten::convolution_backward", []),
                       "ops": names}
        x.grad = None
        conv.weight.grad = None
    el = torch.tensor([], dtype=DT[dt]).element_size()
    ho = (hw + 2 * (k // 2) - k) // s + 1
    return {"cin": cin, "cout": cout, "k": k, "stride": s, "groups": g, "hw": hw, "batch": n,
            "dtype": dt, "in_bytes": n * cin * hw * hw * el, "out_bytes": n * cout * ho * ho * el,
            "w_bytes": cout * (cin // g) * k * k * el, **rows}


def main():
    out = sys.argv[1]
    quick = "--quick" in sys.argv
    grid = []
    for dt in ("fp32", "bf16"):
        for (cin, cout, k, s, hw) in [(3, 64, 7, 2, 224), (3, 64, 3, 1, 224), (3, 32, 3, 2, 224),
                                      (3, 8, 3, 1, 224), (64, 64, 3, 1, 56), (64, 128, 3, 2, 56),
                                      (64, 128, 1, 2, 56), (64, 256, 1, 1, 56), (256, 64, 1, 1, 56),
                                      (128, 128, 3, 1, 28), (256, 256, 3, 1, 14),
                                      (512, 512, 3, 1, 7), (64, 128, 3, 1, 112),
                                      (256, 256, 3, 1, 56), (96, 192, 2, 2, 56), (3, 96, 4, 4, 224),
                                      (32, 32, 5, 1, 56)]:
            for n in ((8, 32) if not quick else (8,)):
                grid.append((cin, cout, k, s, 1, hw, n, dt))
        for (c, k, hw) in [(96, 7, 56), (192, 7, 28), (32, 3, 112), (144, 3, 56), (64, 5, 56)]:
            for n in ((8, 32) if not quick else (8,)):
                grid.append((c, c, k, 1, c, hw, n, dt))
    rows = []
    for args in grid:
        try:
            rows.append(run(*args))
        except Exception as e:  # keep going: one geometry's failure is a row too
            rows.append({"args": list(args), "error": repr(e)[:200]})
        torch.cuda.empty_cache()
    meta = {"gpu": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0)),
            "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
            "cudnn_benchmark": torch.backends.cudnn.benchmark}
    json.dump({"meta": meta, "rows": rows}, open(out, "w"), indent=1)
    print(f"{len(rows)} geometries, {sum('error' in r for r in rows)} errors -> {out}")


if __name__ == "__main__":
    main()

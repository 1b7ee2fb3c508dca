//! Rules `sdpa_cuda_kernels` and `dropout_cuda_mask`: ops whose CUDA kernel
//! allocates otherwise than the CPU's, with the CPU's allocations replaced
//! by the CUDA kernel's ([`crate::kernels`] has the selection rules and the
//! sizes, with their sources).
//!
//! - `sdpa_cuda_kernels`: a `scaled_dot_product_attention` call keeps the
//!   blocks any backend makes — its output, and in backward the gradients of
//!   query, key and value (the blocks that outlive the call's backward ops)
//!   — and loses what the CPU kernel made beside them (the CPU flash
//!   kernel's log-sum-exp; the math composite's scores, probabilities and
//!   masks). Each GPU architecture gets the blocks of the backend PyTorch
//!   selects there, marked with the architectures that select it; where the
//!   CPU ran the math composite and a GPU does too, the CPU's blocks stay for
//!   that GPU. Query, key and value live as long as the CUDA kernel keeps
//!   them: until the call's backward for a fused kernel, and where the CPU's
//!   flash kernel kept them but the GPU runs the math composite (which
//!   keeps copies), only until the backward pass starts. Where the CPU ran
//!   the math composite, the copy its caller's `reshape` makes of the
//!   output is made only on the architectures that run it too: a fused
//!   kernel's output is already laid out for that reshape
//!   ([`output_in_place`]).
//! - `dropout_cuda_mask`: the CPU's dropout mask (the input's dtype) is a
//!   bool tensor on CUDA.
//! - `cuda_reduce_buffers`: a CUDA `sum` or `mean` over many rows
//!   allocates a global buffer for its thread blocks' partial results
//!   ([`crate::kernels::reduce`]).
//! - `cudnn_conv_workspaces`: each convolution pass cuDNN runs allocates
//!   its plan's workspace for the pass ([`crate::kernels::conv`]: an
//!   assumed size, the largest tensor the pass writes or reads).
//! - `cuda_softmax_backward`: a softmax backward makes a temporary of the
//!   incoming gradient's size ([`crate::kernels::softmax`]).

use std::collections::{BTreeMap, BTreeSet};

use super::autocast::{AddedBlock, Plan};
use super::RuleId;
use crate::analyzer::kernels::{blocks_by_op, AttentionCall, CpuAttention};
use crate::analyzer::Analysis;
use crate::kernels::attention::{self, Backend, Rules};
use crate::kernels::{ArchSet, KernelNote, Sm};
use crate::units::{Bytes, Nanos};

/// The ops inside `op` on its thread (itself included).
fn descendants(analysis: &Analysis, op: usize) -> BTreeSet<usize> {
    let Some(root) = analysis.ops.get(op) else {
        return BTreeSet::new();
    };
    let mut out = BTreeSet::from([op]);
    for (i, o) in analysis.ops.iter().enumerate().skip(op + 1) {
        if o.tid != root.tid || o.start > root.end {
            break;
        }
        if o.parent.is_some_and(|p| out.contains(&p)) {
            out.insert(i);
        }
    }
    out
}

/// Adds the kernel rules' changes to `plan` (nothing for a trace recorded
/// on CUDA) and returns what the report says each architecture's
/// convolution and attention kernels are. `fp16` says the CUDA run's 16-bit type is fp16.
pub(super) fn apply(
    analysis: &Analysis,
    rules: Rules,
    fp16: bool,
    plan: &mut Plan,
) -> Vec<KernelNote> {
    if analysis.devices.recorded_on_cuda {
        return Vec::new();
    }
    for d in &analysis.kernel_calls.dropout {
        plan.resized
            .insert(d.mask_block, (Bytes(d.numel), RuleId::DropoutCudaMask));
    }
    reduce_buffers(analysis, plan);
    conv_workspaces(analysis, plan);
    let notes = attention_calls(analysis, rules, fp16, plan);
    // After the attention rules: a softmax backward inside an attention
    // call's math composite goes where its gradient goes.
    softmax_backward(analysis, plan);
    notes
}

/// Rule `sdpa_cuda_kernels`' changes to `plan`, and the notes naming the
/// convolution and attention kernels.
fn attention_calls(
    analysis: &Analysis,
    rules: Rules,
    fp16: bool,
    plan: &mut Plan,
) -> Vec<KernelNote> {
    // Convolutions: one choice on every GPU, named so the report says it.
    let mut notes: Vec<KernelNote> = Vec::new();
    let cudnn = analysis
        .kernel_calls
        .conv
        .iter()
        .any(|c| crate::kernels::conv::runs_cudnn(c.native_depthwise));
    if cudnn {
        notes.push(KernelNote {
            on: ArchSet::ALL,
            family: "convolution".to_owned(),
            choice: "cuDNN, default heuristics (workspaces as measured on an H200)".to_owned(),
        });
    }
    let calls = &analysis.kernel_calls.attention;
    if calls.is_empty() {
        return notes;
    }
    let by_op = blocks_by_op(&analysis.blocks);
    let mut chosen: BTreeMap<Sm, BTreeMap<Backend, u32>> = BTreeMap::new();
    // the end of the previous call on each thread
    let mut previous_end: BTreeMap<i64, Nanos> = BTreeMap::new();
    for call in calls {
        let Some(op) = analysis.ops.get(call.op) else {
            continue;
        };
        let since = previous_end
            .insert(op.tid, op.end)
            .unwrap_or(Nanos(i64::MIN));
        for (sm, backend) in attention_call(analysis, &by_op, call, since, rules, fp16, plan) {
            *chosen.entry(sm).or_default().entry(backend).or_default() += 1;
        }
    }
    // One note per group of architectures that chose alike.
    let mut groups: BTreeMap<Vec<(Backend, u32)>, ArchSet> = BTreeMap::new();
    for (sm, backends) in chosen {
        let key: Vec<(Backend, u32)> = backends.into_iter().collect();
        let set = groups.entry(key).or_insert(ArchSet::NONE);
        *set = set.union(ArchSet::of(sm));
    }
    notes.extend(groups.into_iter().map(|(backends, on)| {
        let choice = match backends.as_slice() {
            [(only, _)] => only.label().to_owned(),
            many => many
                .iter()
                .map(|(b, n)| format!("{} ({n} calls)", b.label()))
                .collect::<Vec<_>>()
                .join(", "),
        };
        KernelNote {
            on,
            family: "attention".to_owned(),
            choice,
        }
    }));
    notes
}

/// Rule `cuda_reduce_buffers`: each reduction's global buffer and
/// semaphores, for the call's duration, sized per GPU (the placeholder size
/// is an A100's).
fn reduce_buffers(analysis: &Analysis, plan: &mut Plan) {
    let a100 = crate::kernels::DeviceLimits {
        multiprocessors: 108,
        max_threads_per_multiprocessor: 2048,
    };
    for call in &analysis.kernel_calls.reduce {
        let Some(op) = analysis.ops.get(call.op) else {
            continue;
        };
        for per_gpu in [
            crate::kernels::PerGpu::ReduceBuffer(call.shape),
            crate::kernels::PerGpu::ReduceSemaphores(call.shape),
        ] {
            plan.added.push(AddedBlock {
                size: Bytes(per_gpu.bytes(a100)),
                alloc: op.start,
                free: Some(op.end),
                op: call.op,
                rule: RuleId::CudaReduceBuffers,
                on: ArchSet::ALL,
                per_gpu: Some(per_gpu),
            });
        }
    }
}

/// Rule `cuda_softmax_backward`: each softmax backward's temporary, from
/// the gradient it makes (at the CUDA run's size: autocast may have resized
/// it) to the call's end, on the GPUs that make that gradient (inside an
/// attention call's math composite, those that run it: the attention rule
/// dropped or kept the gradient).
fn softmax_backward(analysis: &Analysis, plan: &mut Plan) {
    for call in &analysis.kernel_calls.softmax_backward {
        let Some(op) = analysis.ops.get(call.op) else {
            continue;
        };
        let on = match call.grad_input {
            Some(b) if plan.dropped.contains_key(&b) => continue,
            Some(b) => plan.kept_on.get(&b).map_or(ArchSet::ALL, |&(on, _)| on),
            None => ArchSet::ALL,
        };
        let made = call.grad_input.and_then(|b| analysis.blocks.get(b));
        let cuda = made.map(|b| plan.resized.get(&b.id).map_or(b.size, |&(s, _)| s).get());
        let size = crate::kernels::softmax::backward_temporary(cuda, call.grad_bytes);
        if size == 0 {
            continue;
        }
        plan.added.push(AddedBlock {
            size: Bytes(size),
            alloc: made.map_or(op.start, |b| b.alloc_ts),
            free: Some(op.end),
            op: call.op,
            rule: RuleId::CudaSoftmaxBackward,
            on,
            per_gpu: None,
        });
    }
}

/// Rule `cudnn_conv_workspaces`: a workspace per cuDNN pass of a
/// convolution call ([`crate::kernels::conv`]): a copy of the input, weight
/// (none of a 1×1 one) and output of the pass at the CUDA run's dtype (the
/// blocks autocast resized give the factor), none where cuDNN reads them in
/// place; the backward-filter pass's with its split reduction's partial sums
/// on top ([`crate::kernels::conv::filter_workspace`]). A forward holds it
/// from its output's allocation to its end. A backward runs its passes in PyTorch's order, each making its gradient,
/// then its workspace, which it frees before the next pass makes its own:
/// the data pass from grad_input's allocation, the filter pass from
/// grad_weight's, each until the next gradient the call makes (or its end);
/// one pass from its first gradient when none has either size. Without
/// shapes, one block of the largest tensor the call touches, from
/// its first gradient to its end.
fn conv_workspaces(analysis: &Analysis, plan: &mut Plan) {
    let cuda_size = |b: usize| -> Option<(u64, Nanos)> {
        let block = analysis.blocks.get(b)?;
        let size = plan.resized.get(&b).map_or(block.size, |&(s, _)| s);
        Some((size.get(), block.alloc_ts))
    };
    // `bytes` at the CUDA run's dtype: scaled as autocast resized block `b`.
    let cuda_share = |b: usize, bytes: u64| -> u64 {
        let traced = analysis.blocks.get(b).map_or(0, |x| x.size.get());
        let cuda = cuda_size(b).map_or(traced, |c| c.0);
        if traced == 0 || cuda == traced {
            bytes
        } else {
            u64::try_from(u128::from(bytes) * u128::from(cuda) / u128::from(traced))
                .unwrap_or(u64::MAX)
        }
    };
    for call in &analysis.kernel_calls.conv {
        if !crate::kernels::conv::runs_cudnn(call.native_depthwise) {
            continue;
        }
        let Some(op) = analysis.ops.get(call.op) else {
            continue;
        };
        let written: Vec<(u64, Nanos)> =
            call.written.iter().filter_map(|&b| cuda_size(b)).collect();
        let largest_written = written.first().map(|w| w.0);
        let grad_output = call
            .forward_output
            .and_then(cuda_size)
            .map(|o| o.0)
            .or(call.grad_output);
        // (size, alloc, free) of each pass's workspace.
        let mut passes: Vec<(u64, Nanos, Nanos)> = Vec::new();
        let sized_by = if call.backward {
            call.forward_output.or(call.written.first().copied())
        } else {
            call.written.first().copied()
        };
        let share = |bytes| sized_by.map_or(bytes, |b| cuda_share(b, bytes));
        let in_place = |o: &crate::analyzer::kernels::ConvOperands| {
            let half = share(o.elem) <= 2;
            crate::kernels::conv::in_place(o.pointwise, o.stride_one, o.thin, call.backward, half)
        };
        match call.operands {
            Some(o) if !call.backward && in_place(&o) => {}
            Some(o) => {
                let weight = if o.pointwise {
                    0
                } else {
                    share(o.weight_bytes)
                };
                if call.backward {
                    let copy = crate::kernels::conv::workspace(
                        share(o.input_bytes),
                        weight,
                        grad_output.unwrap_or(0),
                    );
                    let (data, filter) = if o.pointwise && o.stride_one {
                        crate::kernels::conv::pointwise_backward(
                            share(o.input_bytes),
                            grad_output.unwrap_or(0),
                            share(o.elem),
                            o.batch,
                            o.weight_bytes.checked_div(o.elem).unwrap_or(0),
                            o.c_in,
                        )
                    } else if in_place(&o) {
                        (0, 0)
                    } else {
                        (copy, crate::kernels::conv::filter_workspace(copy))
                    };
                    // The gradients the call makes, in time order; a pass
                    // per gradient of the input's or the weight's size.
                    let mut made: Vec<(Nanos, u64)> = call
                        .written
                        .iter()
                        .filter_map(|&b| analysis.blocks.get(b))
                        .map(|b| (b.alloc_ts, b.size.get()))
                        .collect();
                    made.sort_unstable();
                    // PyTorch runs the data pass, then the filter pass
                    // (`cudnn_convolution_backward`): the last gradient of
                    // the weight's size is the filter pass's.
                    let filter_at = made.iter().rposition(|&(_, b)| b == o.weight_bytes);
                    for (i, &(at, bytes)) in made.iter().enumerate() {
                        if bytes != o.input_bytes && bytes != o.weight_bytes {
                            continue;
                        }
                        let until = made
                            .get(i + 1)
                            .map_or(op.end, |&(next, _)| Nanos(next.get().saturating_sub(1)));
                        let size = if filter_at == Some(i) { filter } else { data };
                        passes.push((size, at, until.max(at)));
                    }
                    // No gradient of the input's or the weight's size (a
                    // CPU kernel that wrote them padded): the call still
                    // runs a pass, one workspace from its first gradient.
                    if passes.is_empty() {
                        let first = made.first().map_or(op.start, |m| m.0);
                        passes.push((data, first, op.end));
                    }
                } else {
                    let size = crate::kernels::conv::forward_workspace(
                        share(o.input_bytes),
                        weight,
                        largest_written.unwrap_or(0),
                        o.c_in,
                        o.c_out,
                        share(o.elem) <= 2,
                    );
                    passes.push((size, written.first().map_or(op.start, |w| w.1), op.end));
                }
            }
            None => {
                let operands: Vec<u64> = if call.backward {
                    [largest_written, grad_output]
                        .into_iter()
                        .flatten()
                        .collect()
                } else {
                    largest_written.into_iter().collect()
                };
                let first = written.iter().map(|w| w.1).min().unwrap_or(op.start);
                passes.push((
                    crate::kernels::conv::assumed_workspace(&operands),
                    first,
                    op.end,
                ));
            }
        }
        for (size, alloc, free) in passes {
            if size == 0 {
                continue;
            }
            plan.added.push(AddedBlock {
                size: Bytes(size),
                alloc,
                free: Some(free),
                op: call.op,
                rule: RuleId::CudnnConvWorkspaces,
                on: ArchSet::ALL,
                per_gpu: None,
            });
        }
    }
}

/// The architectures in `by_backend` outside `except`.
fn by_backend_union(by_backend: &BTreeMap<Backend, ArchSet>, except: ArchSet) -> ArchSet {
    by_backend
        .values()
        .fold(ArchSet::NONE, |all, &set| all.union(set))
        .minus(except)
}

/// The query, key and value a fused CUDA kernel keeps for its backward
/// (flash, memory-efficient and cuDNN attention save their inputs), where
/// the CPU ran the math composite, which keeps copies of its own instead
/// and lets the projections' outputs die with the forward: the latest
/// blocks allocated before the call and after the previous call on its
/// thread ended (the projections of this attention, found without module
/// frames, so the estimate does not depend on them), of the query's, key's
/// or value's size or of the three together (one fused projection whose
/// output they are views of), that die after it but before its backward. On the
/// architectures that run a fused kernel each lives until the call's
/// backward ends; elsewhere (`math_on`) as traced.
fn keep_inputs(
    analysis: &Analysis,
    call: &AttentionCall,
    since: Nanos,
    window: Option<(Nanos, Nanos)>,
    math_on: ArchSet,
    fused_on: ArchSet,
    plan: &mut Plan,
) {
    let (Some((backward_start, backward_end)), Some(op)) = (window, analysis.ops.get(call.op))
    else {
        return;
    };
    if fused_on.is_empty() {
        return;
    }
    let inputs = call_inputs(analysis, call, since, |f| f > op.end && f < backward_start);
    relive(
        analysis,
        call,
        &inputs,
        math_on,
        (fused_on, backward_end),
        plan,
    );
}

/// The query, key and value blocks of an attention call, found without
/// module frames: the latest blocks allocated before the call and after the
/// previous call on its thread ended (`since`), of the query's, key's or
/// value's size or of the three together (one fused projection whose
/// output they are views of: GPT-2's `c_attn(x).split(...)`), at most
/// three, whose free time passes `freed`.
fn call_inputs(
    analysis: &Analysis,
    call: &AttentionCall,
    since: Nanos,
    freed: impl Fn(Nanos) -> bool,
) -> Vec<usize> {
    let Some(op) = analysis.ops.get(call.op) else {
        return Vec::new();
    };
    let elems = |heads: u64, len: u64, dim: u64| {
        call.shape
            .batch
            .saturating_mul(heads)
            .saturating_mul(len)
            .saturating_mul(dim)
            .saturating_mul(call.shape.elem)
    };
    let sizes = [
        elems(call.shape.heads, call.shape.q_len, call.shape.head_dim),
        elems(call.shape.kv_heads, call.shape.kv_len, call.shape.head_dim),
        elems(
            call.shape.kv_heads,
            call.shape.kv_len,
            call.shape.v_head_dim,
        ),
    ];
    let fused = sizes.iter().fold(0_u64, |sum, &s| sum.saturating_add(s));
    let before = analysis.blocks.partition_point(|b| b.alloc_ts < op.start);
    analysis.blocks[..before]
        .iter()
        .rev()
        .take(256)
        .filter(|b| sizes.contains(&b.size.get()) || b.size.get() == fused)
        .take_while(|b| b.alloc_ts >= since)
        .filter(|b| b.free_ts.is_some_and(&freed))
        .take(3)
        .map(|b| b.id)
        .collect()
}

/// Where the CPU ran its flash kernel, which keeps query, key and value
/// for its backward, and a GPU runs the math composite, which keeps copies
/// of its own instead (the scaled query and key, the repeated value): on
/// those architectures (`math_on`) the CPU's blocks are no longer kept by
/// autograd, and live only as long as the model's code holds them. The
/// H200 freed llama-small's (fp32, grouped-query attention) before the
/// backward (`llama-small_adamw_seq1024_L4.cuda.json.gz`: the query when its
/// attention module returned, key and value with the cache at the forward's
/// end); memcast frees them when the backward pass after the call starts,
/// a bound from above where the trace cannot tell. A block that lives past
/// the call's backward (the CPU's kernel did not keep it) is left alone.
fn release_inputs(
    analysis: &Analysis,
    call: &AttentionCall,
    since: Nanos,
    window: Option<(Nanos, Nanos)>,
    math_on: ArchSet,
    others: ArchSet,
    plan: &mut Plan,
) {
    let (Some((backward_start, backward_end)), Some(op)) = (window, analysis.ops.get(call.op))
    else {
        return;
    };
    if math_on.is_empty() {
        return;
    }
    let Some(backward_pass) = analysis
        .iterations
        .iter()
        .flat_map(|it| &it.phases)
        .filter(|p| p.phase == crate::analyzer::Phase::Backward && p.start > op.end)
        .map(|p| p.start)
        .min()
        .filter(|&start| start <= backward_start)
    else {
        return;
    };
    let inputs = call_inputs(analysis, call, since, |f| {
        f >= backward_start && f <= backward_end
    });
    relive(
        analysis,
        call,
        &inputs,
        others,
        (math_on, backward_pass),
        plan,
    );
}

/// The copy a caller makes of the output, where the CPU ran the math
/// composite: its output is `[B, H, Lq, Dv]` in memory, so the caller's
/// `transpose(1, 2)` then `reshape` (or `contiguous`) to `[B, Lq, H·Dv]`
/// copies it, and the output is freed as the copy is made (the math
/// composite does not keep it). The fused kernels write their output
/// `[B, Lq, H, Dv]` in memory and return it transposed (flash and
/// memory-efficient attention allocate it so, `attention.cu`; cuDNN's
/// matches the query's layout, `MHA.cpp` `alloc_with_matching_layout`, and
/// the query is a projection's output viewed `[B, Lq, H, D]` and
/// transposed), so the same `reshape` is a view, nothing is copied, and the
/// output lives as long as that view. (The call's backward reads the
/// output too, a little after the view's reader, the output projection,
/// has had its own; under checkpointing the first forward saves neither:
/// the view's lifetime is taken for both.) The H200 made no
/// such copy in bert-base's and distilgpt2's bf16 steps, which memcast made
/// once per layer before (`benches/gpu/align.py NAME --blocks`). So on the
/// architectures of `fused` the copy is not made and the output lives as
/// long as the copy did; on those of `math`, both stay as traced. The copy
/// is the one block made between the call's end and the output's free, of
/// the output's size.
fn output_in_place(
    analysis: &Analysis,
    call: &AttentionCall,
    output: usize,
    (math, fused): (ArchSet, ArchSet),
    plan: &mut Plan,
) {
    let (Some(op), Some(out)) = (analysis.ops.get(call.op), analysis.blocks.get(output)) else {
        return;
    };
    let Some(freed) = out.free_ts.filter(|_| !fused.is_empty()) else {
        return;
    };
    let from = analysis.blocks.partition_point(|b| b.alloc_ts < op.end);
    let mut made = analysis.blocks[from..]
        .iter()
        .take_while(|b| b.alloc_ts <= freed)
        .filter(|b| b.id != output);
    let (Some(copy), None) = (made.next(), made.next()) else {
        return;
    };
    if copy.size != out.size {
        return;
    }
    let Some(until) = copy.free_ts else {
        return;
    };
    if math.is_empty() {
        plan.dropped.insert(copy.id, RuleId::SdpaCudaKernels);
    } else {
        plan.kept_on
            .insert(copy.id, (math, RuleId::SdpaCudaKernels));
    }
    relive(analysis, call, &[output], math, (fused, until), plan);
}

/// Blocks of an attention call's inputs that live otherwise on some
/// architectures: each stays as traced on `as_traced` (dropped where that
/// is none) and is made again on `changed.0`, freed at `changed.1`.
fn relive(
    analysis: &Analysis,
    call: &AttentionCall,
    inputs: &[usize],
    as_traced: ArchSet,
    changed: (ArchSet, Nanos),
    plan: &mut Plan,
) {
    for &b in inputs {
        let Some(block) = analysis.blocks.get(b) else {
            continue;
        };
        if as_traced.is_empty() {
            plan.dropped.insert(b, RuleId::SdpaCudaKernels);
        } else {
            plan.kept_on.insert(b, (as_traced, RuleId::SdpaCudaKernels));
        }
        plan.added.push(AddedBlock {
            size: block.size,
            alloc: block.alloc_ts,
            free: Some(changed.1),
            op: block.alloc_op.unwrap_or(call.op),
            rule: RuleId::SdpaCudaKernels,
            on: changed.0,
            per_gpu: None,
        });
    }
}

/// Adds the blocks of a kernel's `steps` to `plan`, the steps spread evenly
/// over `span` in their order; a block the steps do not free is freed at
/// `unfreed_until`.
fn lay_out(
    steps: &[attention::Step],
    span: (Nanos, Nanos),
    unfreed_until: Nanos,
    op: usize,
    on: ArchSet,
    plan: &mut Plan,
) {
    let n = i64::try_from(steps.len())
        .unwrap_or(i64::MAX)
        .saturating_add(1);
    let at = |i: usize| {
        let i = i64::try_from(i).unwrap_or(i64::MAX).saturating_add(1);
        let length = span.1.get().saturating_sub(span.0.get());
        Nanos(span.0.get().saturating_add(length / n * i))
    };
    // (bytes, alloc time, free time) per Alloc step, in order
    let mut blocks: Vec<(u64, Nanos, Nanos)> = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        match *step {
            attention::Step::Alloc(bytes) => blocks.push((bytes, at(i), unfreed_until)),
            attention::Step::Free(b) => {
                if let Some(block) = blocks.get_mut(b) {
                    block.2 = at(i);
                }
            }
        }
    }
    for (bytes, alloc, free) in blocks {
        if bytes > 0 {
            plan.added.push(AddedBlock {
                size: Bytes(bytes),
                alloc,
                free: Some(free),
                op,
                rule: RuleId::SdpaCudaKernels,
                on,
                per_gpu: None,
            });
        }
    }
}

/// One attention call: its CPU kernel's blocks dropped (kept where a GPU
/// runs the math composite too), each backend's blocks added for the
/// architectures that select it. Returns the backend per architecture.
fn attention_call(
    analysis: &Analysis,
    by_op: &BTreeMap<usize, Vec<usize>>,
    call: &AttentionCall,
    since: Nanos,
    rules: Rules,
    fp16_target: bool,
    plan: &mut Plan,
) -> Vec<(Sm, Backend)> {
    let Some(kernel) = analysis.ops.get(call.kernel) else {
        return Vec::new();
    };
    let blocks_in = |ops: &BTreeSet<usize>| -> Vec<usize> {
        ops.iter()
            .filter_map(|op| by_op.get(op))
            .flatten()
            .copied()
            .collect()
    };
    // Forward: every block the CPU kernel made but the output (the latest
    // block of the output's size that outlives the kernel).
    let forward = blocks_in(&descendants(analysis, call.kernel));
    let out_elems = call
        .shape
        .batch
        .saturating_mul(call.shape.heads)
        .saturating_mul(call.shape.q_len)
        .saturating_mul(call.shape.v_head_dim);
    let output = forward
        .iter()
        .filter_map(|&b| analysis.blocks.get(b))
        .filter(|b| b.size.get() == out_elems.saturating_mul(call.shape.elem))
        .filter(|b| b.free_ts.is_none_or(|f| f > kernel.end))
        .max_by_key(|b| (b.alloc_ts, b.id))
        .map(|b| b.id);
    // Backward: every block its backward ops made but those that outlive
    // them (the gradients of query, key and value).
    let backward_ops: BTreeSet<usize> = call
        .backward
        .iter()
        .flat_map(|&op| descendants(analysis, op))
        .collect();
    let window = call
        .backward
        .iter()
        .filter_map(|&op| analysis.ops.get(op))
        .fold(None, |w: Option<(Nanos, Nanos)>, o| {
            Some(w.map_or((o.start, o.end), |(s, e)| (s.min(o.start), e.max(o.end))))
        });
    let backward: Vec<usize> = blocks_in(&backward_ops)
        .into_iter()
        .filter(|&b| {
            analysis
                .blocks
                .get(b)
                .is_some_and(|b| window.is_some_and(|(_, end)| b.free_ts.is_some_and(|f| f <= end)))
        })
        .collect();
    let cpu_blocks: Vec<usize> = forward
        .into_iter()
        .filter(|&b| Some(b) != output)
        .chain(backward)
        .collect();

    // The CUDA call: the output's CUDA size says its dtype (autocast may
    // have changed it).
    let elem = output
        .and_then(|b| plan.resized.get(&b))
        .map_or(call.shape.elem, |&(size, _)| {
            size.get().checked_div(out_elems).unwrap_or(call.shape.elem)
        });
    let cuda = attention::Call {
        elem,
        fp16: if elem == call.shape.elem {
            call.shape.fp16
        } else {
            fp16_target
        },
        grad: window.is_some(),
        ..call.shape
    };
    let mut by_backend: BTreeMap<Backend, ArchSet> = BTreeMap::new();
    let mut out = Vec::new();
    for sm in Sm::KNOWN {
        let backend = attention::select(&cuda, sm, rules);
        let set = by_backend.entry(backend).or_insert(ArchSet::NONE);
        *set = set.union(ArchSet::of(sm));
        out.push((sm, backend));
    }
    let cpu_math = call.cpu == CpuAttention::Math;
    let math_on = by_backend
        .get(&Backend::Math)
        .copied()
        .unwrap_or(ArchSet::NONE);
    for b in cpu_blocks {
        if cpu_math && !math_on.is_empty() {
            plan.kept_on.insert(b, (math_on, RuleId::SdpaCudaKernels));
        } else {
            plan.dropped.insert(b, RuleId::SdpaCudaKernels);
        }
    }
    let others = by_backend_union(&by_backend, math_on);
    if cpu_math {
        keep_inputs(analysis, call, since, window, math_on, others, plan);
        if let Some(output) = output {
            output_in_place(analysis, call, output, (math_on, others), plan);
        }
    } else {
        release_inputs(analysis, call, since, window, math_on, others, plan);
    }
    let first_backward = call.backward.first().copied().unwrap_or(call.kernel);
    let saved_until = window.map_or(kernel.end, |(_, end)| end);
    for (backend, on) in by_backend {
        if cpu_math && backend == Backend::Math {
            continue;
        }
        let a = attention::allocations(backend, &cuda);
        lay_out(
            &a.forward,
            (kernel.start, kernel.end),
            saved_until,
            call.kernel,
            on,
            plan,
        );
        if let Some(span) = window {
            lay_out(&a.backward, span, span.1, first_backward, on, plan);
        }
    }
    out
}

#[cfg(test)]
mod tests;

//! `--seq-len L` from one trace: each allocation's size is rescaled by how
//! it depends on the sequence length T — not at all, as T, or as T² — read
//! from the shapes `record_shapes` wrote.
//!
//! The rule, per block (an allocation and its free, in time order):
//! - **Shapes bound it from above**: every op that reads the block names its
//!   dims; the dims equal to T (or to batch × T, a flattened batch) are the
//!   length's; the block grows at most as T to the fewest such dims any
//!   reader shows.
//! - **Data flow bounds it too**: the op that allocated it read inputs whose
//!   blocks were sized before; an element-wise op, a copy, a reduction or a
//!   concatenation makes nothing longer than its longest input (the largest
//!   input power); a matrix product (mm, bmm, matmul, einsum, linear,
//!   attention, convolution and their backward nodes) at most the sum of its
//!   inputs' powers (`q @ kᵀ` is T²). Tensors from before the trace are
//!   weights and buffers (power 0: a rotary `inv_freq` of T entries is not
//!   the length), except integer inputs and what the data loader makes,
//!   which the length shapes.
//! - The power is the smaller bound: a head of 64 at a length of 64 makes
//!   `[B, H, 64, 64]` look like T² to its readers, but the rotary
//!   half it came from (`[B, H, T, 64]`) was T, so it is T.
//!
//! Every recorded dim, stride and view size of a block's readers is rescaled
//! the same way, so the analyzer matches reads to the rebuilt blocks.

use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeMap;

use super::events::{base_total, pair, retotal};
use super::rescale::{div_round, length_count, rebuild_inputs, Rescale, Traced};
use super::shape::{loader_spans, optimizer_steps, router_top_k, traced_shape};
use super::{LengthFacts, ScaleError};
use crate::diag::Warning;
use crate::trace::{Dtype, NameId, TensorArg, Trace};

/// Names of ops whose output may grow as the sum of their inputs' powers.
const PRODUCTS: &[&str] = &[
    "mm",
    "matmul",
    "einsum",
    "linear",
    "attention",
    "conv",
    "bmm",
];

/// Backward kernels whose output has the sizes of the forward's input,
/// passed as an integer list (`derivatives.yaml`: `select_backward(grad,
/// input_sizes, dim, index)` and the like), not those of the gradient they
/// read.
const SIZED_BY_LIST: &[&str] = &[
    "aten::select_backward",
    "aten::slice_backward",
    "aten::index_select_backward",
    "aten::diagonal_backward",
    "aten::unfold_backward",
    "aten::as_strided_backward",
    "aten::embedding_backward",
    "aten::embedding_dense_backward",
];

/// The allocations every kernel makes its outputs with: no factory.
const ALLOCATES: &[&str] = &["aten::empty", "aten::empty_strided", "aten::resize_"];

/// Ops that only run other ops: autograd nodes and Python autograd
/// Functions (no namespace: `MmBackward0`, `CheckpointFunction`) and the
/// engine's call of a node (`autograd::engine::evaluate_function: ...`).
fn is_wrapper(name: &str) -> bool {
    !name.contains("::") || name.starts_with("autograd::engine::")
}

/// Attention kernels (sdpa and its flash, memory-efficient and math
/// variants, forward and backward).
fn is_attention(name: &str) -> bool {
    name.to_ascii_lowercase().contains("attention")
}

/// bitsandbytes' kernels (`bitsandbytes::gemm_4bit`, `dequantize_4bit`,
/// the int8 matmuls): on the CPU backend each runs ATen ops, and makes from
/// the weight's state (its absmax, the dequantized weight) blocks the
/// weight's size, beside its own output, the input's.
fn is_quantized_kernel(name: &str) -> bool {
    name.starts_with("bitsandbytes::")
}

fn is_product(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    PRODUCTS.iter().any(|p| lower.contains(p))
}

/// The trace at length `len`, rebuilt from one trace.
pub(super) fn lengthen(
    trace: &Trace,
    len: u32,
    warnings: &mut Vec<Warning>,
) -> Result<(Trace, LengthFacts), ScaleError> {
    let (t, batch) = traced_shape(trace).ok_or(ScaleError::LengthNotFound)?;
    let mut facts = LengthFacts {
        traced: vec![t],
        estimated: len,
        method: "shapes".to_owned(),
        linear: 0,
        quadratic: 0,
    };
    if t == len {
        return Ok((trace.clone(), facts));
    }
    let traced = Traced {
        t,
        batch,
        top_k: router_top_k(trace, t, batch),
    };
    let mut shape = Shapes::new(trace, traced);
    let powers = shape.powers();
    let mut out = trace.clone();
    let partner = pair(&trace.memory);
    let (num, den) = (i128::from(len), i128::from(t));
    let mut new_size: FxHashMap<usize, i64> = FxHashMap::default();
    for (i, m) in trace.memory.iter().enumerate() {
        if m.bytes <= 0 {
            continue;
        }
        let k = powers.block.get(&i).copied().unwrap_or(0);
        match k {
            1 => facts.linear += 1,
            2 => facts.quadratic += 1,
            _ => {}
        }
        let v = div_round(i128::from(m.bytes) * num.pow(k), den.pow(k));
        new_size.insert(i, i64::try_from(v).unwrap_or(i64::MAX));
    }
    for (i, m) in out.memory.iter_mut().enumerate() {
        if m.bytes > 0 {
            m.bytes = new_size.get(&i).copied().unwrap_or(m.bytes);
        } else if let Some(a) = partner.get(i).copied().flatten() {
            m.bytes = -new_size.get(&a).copied().unwrap_or(-m.bytes);
        }
    }
    retotal(&mut out.memory, base_total(&trace.memory));
    // Dims, strides and view sizes of every read, by the power of what it reads.
    let to = Rescale { traced, len };
    for (arg_index, k) in &powers.args {
        let Some(arg) = trace.op_args.tensors.get(*arg_index).copied() else {
            continue;
        };
        to.arg(&mut out, &arg, *k);
    }
    for (op, k) in &powers.views {
        if let Some(o) = trace.ops.get(*op) {
            to.view(trace, &mut out.op_args.numbers, o, *k);
        }
    }
    rebuild_inputs(&mut out);
    if shape.ambiguous {
        warnings.push(Warning::new(
            "seq_len_ambiguous",
            format!("the traced sequence length {t} equals another dimension of the model's tensors (e.g. a head size), so some shapes name it twice; each tensor's growth was taken from the data flow, which is a guess where it cannot tell them apart: trace at a length no other dimension has, or give two traces at different lengths"),
        ));
    }
    Ok((out, facts))
}

/// The dims and dtype of every quantized weight the trace reads: the
/// integer weight argument of a bitsandbytes kernel or autograd function
/// (4-bit layers' packed bytes, `[in·out/2, 1]` uint8; LLM.int8()'s int8
/// weight). Another op reading a tensor of those dims and that dtype (a
/// `view` or `t()` of the weight on its way to the kernel) reads that
/// weight, never a block of the step: at 48 tokens, batch 2, a
/// `[2048·768/2, 1]` packed weight has the bytes of a `[2, 48, 2048]` fp32
/// activation, and its view, read first, named that activation's dims.
fn quantized_weights(trace: &Trace) -> FxHashSet<(&[i64], NameId)> {
    let mut out = FxHashSet::default();
    for o in &trace.ops {
        let name = trace.name(o.name);
        let weights = crate::trace::weight_args(name, false);
        if !(is_quantized_kernel(name) || name.starts_with("MatMul")) || weights.is_empty() {
            continue;
        }
        for a in trace.tensor_args(o) {
            let Some(dtype) = a.dtype else { continue };
            let integer = Dtype::from_name(trace.name(dtype)) == Some(Dtype::NonFloat);
            if a.list_index.is_none() && integer && weights.contains(&a.position) {
                out.insert((trace.numbers(a.dims), dtype));
            }
        }
    }
    out
}

/// The powers found: per allocation event, per tensor argument, per view op.
struct Powers {
    block: FxHashMap<usize, u32>,
    args: BTreeMap<usize, u32>,
    views: BTreeMap<usize, u32>,
}

/// The reads of a trace matched to its blocks.
struct Shapes<'a> {
    trace: &'a Trace,
    traced: Traced,
    ambiguous: bool,
    /// Op indices by start (longer first).
    order: Vec<usize>,
    /// Each op's place in `order`.
    position: Vec<usize>,
    /// Data loader spans.
    loader: Vec<(i64, i64)>,
    /// The quantized weights' dims and dtypes ([`quantized_weights`]).
    quantized: FxHashSet<(&'a [i64], NameId)>,
    /// The reads of the model's state (weights, quantized weights and
    /// their state: `read_args`), which never hold the length.
    state: FxHashSet<usize>,
}

impl<'a> Shapes<'a> {
    fn new(trace: &'a Trace, traced: Traced) -> Shapes<'a> {
        let mut order: Vec<usize> = (0..trace.ops.len()).collect();
        order.sort_by_key(|&i| {
            trace
                .ops
                .get(i)
                .map(|o| (o.start, std::cmp::Reverse(o.dur)))
        });
        let mut position = vec![usize::MAX; order.len()];
        for (p, &i) in order.iter().enumerate() {
            if let Some(slot) = position.get_mut(i) {
                *slot = p;
            }
        }
        let loader = loader_spans(trace);
        let quantized = quantized_weights(trace);
        Shapes {
            trace,
            traced,
            ambiguous: false,
            order,
            position,
            loader,
            quantized,
            state: FxHashSet::default(),
        }
    }

    /// The byte extent a tensor argument reads (from dims and strides).
    fn extent(&self, arg: &TensorArg, elsize: u64) -> u64 {
        let dims = self.trace.numbers(arg.dims);
        if dims.contains(&0) {
            return 0;
        }
        let elems = match arg.strides.map(|s| self.trace.numbers(s)) {
            Some(strides) if strides.len() == dims.len() => dims
                .iter()
                .zip(strides)
                .map(|(&d, &s)| d.saturating_sub(1).max(0).saturating_mul(s.max(0)))
                .fold(1_i64, i64::saturating_add),
            _ => dims.iter().fold(1_i64, |n, &d| n.saturating_mul(d)),
        };
        u64::try_from(elems.max(0))
            .unwrap_or(0)
            .saturating_mul(elsize)
    }

    fn elsize(&self, arg: &TensorArg) -> Option<u64> {
        arg.dtype
            .and_then(|d| crate::trace::dtype_size(self.trace.name(d)))
    }

    fn is_float(&self, arg: &TensorArg) -> bool {
        arg.dtype
            .and_then(|d| Dtype::from_name(self.trace.name(d)))
            .is_some_and(|d| d.size().is_some())
    }

    fn in_loader(&self, ts: i64) -> bool {
        self.loader.iter().any(|&(s, e)| s <= ts && ts <= e)
    }

    /// Sweeps ops and `[memory]` events in time order: matches each op's
    /// tensor arguments to live blocks, bounds each block from its readers'
    /// shapes, then gives each block its power from the op that made it.
    fn powers(&mut self) -> Powers {
        let trace = self.trace;
        let partner = pair(&trace.memory);
        // Pass 1: reads of live blocks, and the op stack at each allocation.
        let mut live: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        let mut reads: Vec<(usize, usize, Vec<usize>)> = Vec::new(); // (op, arg, candidate blocks)
        let mut maker: FxHashMap<usize, Vec<usize>> = FxHashMap::default(); // block -> op stack
        let mut state_reads: FxHashSet<usize> = FxHashSet::default(); // the model's state's reads
        let mut stack: Vec<usize> = Vec::new();
        let mut next_op = 0;
        for (i, m) in trace.memory.iter().enumerate() {
            let ts = m.ts.get();
            while let Some(&oi) = self.order.get(next_op) {
                let Some(o) = trace.ops.get(oi) else { break };
                if o.start.get() > ts {
                    break;
                }
                next_op += 1;
                let start = o.start.get();
                stack.retain(|&s| {
                    trace
                        .ops
                        .get(s)
                        .is_some_and(|p| p.start.get() + p.dur.get() >= start)
                });
                stack.push(oi);
                self.read_args(oi, &live, &mut reads, &mut state_reads);
            }
            stack.retain(|&s| {
                trace
                    .ops
                    .get(s)
                    .is_some_and(|p| p.start.get() + p.dur.get() >= ts)
            });
            let size = m.bytes.unsigned_abs();
            if m.bytes > 0 {
                live.entry(size).or_default().push(i);
                maker.insert(i, stack.clone());
            } else if let Some(a) = partner.get(i).copied().flatten() {
                let asize = trace.memory.get(a).map_or(0, |x| x.bytes.unsigned_abs());
                if let Some(v) = live.get_mut(&asize) {
                    v.retain(|&b| b != a);
                }
            }
        }
        // ops after the last event still read
        while let Some(&oi) = self.order.get(next_op) {
            next_op += 1;
            self.read_args(oi, &live, &mut reads, &mut state_reads);
        }
        self.state = state_reads;
        let mut upper: FxHashMap<usize, u32> = FxHashMap::default();
        // A gradient `AccumulateGrad` reads has its parameter's shape: no
        // length in it, whatever its dims coincide with (a [256, 768] k_proj
        // gradient at batch 4 × length 64). Not a leaf the forward made:
        // - the inputs a reentrant checkpoint detached to recompute its
        //   block (their AccumulateGrad, in the checkpoint's nested
        //   backward, reads an activation's gradient, as long as the
        //   activation);
        // - an activation set to require grad (the Hugging Face Trainer's
        //   `enable_input_require_grads` on frozen input embeddings, as LoRA
        //   with checkpointing runs): its gradient dies with the graph, before
        //   the optimizer step has read any gradient. A parameter's `.grad`
        //   outlives the step that reads it: the optimizer holds the
        //   parameter, and only zero_grad drops the gradient (the analyzer's
        //   rule, `analyzer/leaves.rs`).
        let detached = crate::trace::reentrant_checkpoint_inputs(trace);
        let steps = optimizer_steps(trace);
        let in_backward = |b: usize| {
            maker.get(&b).is_some_and(|stack| {
                stack.iter().any(|&o| {
                    trace
                        .ops
                        .get(o)
                        .is_some_and(|o| o.fwd_thread_id.is_some_and(|t| t > 0))
                })
            })
        };
        // Freed before the end of the first step that ends after it was made
        // (never, without a step after it: no judgement).
        let dies_before_step = |b: usize| {
            let made = trace.memory.get(b).map_or(i64::MAX, |m| m.ts.get());
            let freed = partner
                .get(b)
                .copied()
                .flatten()
                .and_then(|f| trace.memory.get(f))
                .map(|m| m.ts.get());
            let step_end = steps.iter().map(|s| s.1).find(|&end| end > made);
            matches!((freed, step_end), (Some(f), Some(e)) if f < e)
        };
        let is_accumulate = |op: usize| {
            trace
                .ops
                .get(op)
                .is_some_and(|o| trace.name(o.name) == crate::trace::ACCUMULATE_GRAD)
        };
        let mut leaves: FxHashSet<usize> = detached.iter().copied().collect();
        for (op, _, blocks) in &reads {
            let accumulate = !leaves.contains(op) && is_accumulate(*op);
            // Of the same-sized blocks it may read, the gradient is the one
            // kept longest: `.grad` lives until zero_grad, an input's gradient
            // of the same size is freed in backward.
            // Each call claims its own (two parameters of one shape have two
            // gradients).
            if !accumulate {
                continue;
            }
            let kept = blocks
                .iter()
                .filter(|&&b| !upper.contains_key(&b) && in_backward(b))
                .max_by_key(|&&b| partner.get(b).copied().flatten().unwrap_or(usize::MAX));
            match kept {
                Some(&b) if dies_before_step(b) => {
                    leaves.insert(*op);
                }
                Some(&b) => {
                    upper.insert(b, 0);
                }
                None => {}
            }
        }
        let accumulates = |op: usize| !leaves.contains(&op) && is_accumulate(op);
        // Scalars and empty tensors (`resize_` of a `[0]`) carry no size:
        // an op reading only those is a factory.
        let sized = |arg: usize| {
            trace.op_args.tensors.get(arg).is_some_and(|a| {
                let dims = trace.numbers(a.dims);
                !dims.is_empty() && !dims.contains(&0)
            })
        };
        let mut args_of: FxHashMap<usize, Vec<(usize, &[usize])>> = FxHashMap::default();
        for (op, arg, blocks) in &reads {
            let (op, arg) = (*op, *arg);
            args_of.entry(op).or_default().push((arg, blocks));
            let block = blocks.last().copied();
            // The first reader (the consumer right after the producer)
            // names the block's dims; later reads of a same-sized tensor may
            // be of another one.
            if let (Some(b), Some(a)) = (block, trace.op_args.tensors.get(arg)) {
                let n = length_count(trace.numbers(a.dims), self.traced);
                upper.entry(b).or_insert(n);
            }
        }
        // Pass 2: powers in allocation order.
        let mut block: FxHashMap<usize, u32> = FxHashMap::default();
        for (i, m) in trace.memory.iter().enumerate() {
            if m.bytes <= 0 {
                continue;
            }
            let ops = maker.get(&i).cloned().unwrap_or_default();
            // The outermost op with tensor inputs is the call the user
            // made (`linear`, not the `mm` inside it, whose transposed
            // weight is no trace block): its signature is known. Inside an
            // attention call that runs as ops (the math path: `scores = q @
            // kᵀ`, softmax, dropout), the innermost op made the block: only
            // the kernel's own outputs have the query's shape.
            let bounds: Vec<(u32, bool, bool, usize)> = ops
                .iter()
                .enumerate()
                .filter_map(|(depth, &op)| {
                    let args: Vec<(usize, &[usize])> = args_of
                        .get(&op)?
                        .iter()
                        .filter(|(arg, _)| sized(*arg))
                        .copied()
                        .collect();
                    if args.is_empty() {
                        return None;
                    }
                    let o = trace.ops.get(op)?;
                    let name = trace.name(o.name);
                    // An autograd node or a Python autograd Function
                    // (`MulBackward0`, `CheckpointFunction`, recorded without
                    // a namespace) and the engine's call of a node run ops:
                    // the op inside made the block (a reentrant checkpoint's
                    // forward reads only the block's input, yet its
                    // attention makes T² scores).
                    if is_wrapper(name) {
                        return None;
                    }
                    // `table[ids]`: the profiler records no index tensors, so
                    // only the readers' shapes tell (as for a factory); nor
                    // do the backward kernels that scatter a gradient into
                    // the forward input's sizes, given as integers
                    // (`select_backward`'s `[B, T, D]` from a `[B, D]`).
                    if name == "aten::index" || SIZED_BY_LIST.contains(&name) {
                        return None;
                    }
                    let powers = args
                        .iter()
                        .map(|&(arg, b)| self.arg_power(arg, b, &block, o.start.get()));
                    // Inside a kernel that runs ops, the innermost op made
                    // the block (third field): an attention call's scores,
                    // a quantized layer's dequantized state.
                    let inside = is_quantized_kernel(name);
                    Some(if is_attention(name) {
                        // The kernel's outputs have the query's shape (or
                        // less: the log-sum-exp): no longer than its inputs.
                        (powers.max().unwrap_or(0), false, true, depth)
                    } else if is_product(name) {
                        (powers.sum::<u32>(), true, inside, depth)
                    } else {
                        (powers.max().unwrap_or(0), false, inside, depth)
                    })
                })
                .collect();
            // Inside the attention call, a factory below the innermost op
            // that reads tensors made the block (the math path's causal
            // mask, `ones(T, T).tril()`), not the allocation every kernel
            // makes through `empty`.
            let factory_below = |depth: usize| {
                ops.get(depth + 1..).unwrap_or_default().iter().any(|&op| {
                    trace.ops.get(op).is_some_and(|o| {
                        let name = trace.name(o.name);
                        !ALLOCATES.contains(&name)
                            && !is_wrapper(name)
                            && !args_of
                                .get(&op)
                                .is_some_and(|a| a.iter().any(|(arg, _)| sized(*arg)))
                    })
                })
            };
            let bound = match (bounds.first(), bounds.last()) {
                (Some(&(_, _, true, _)), Some(&(_, _, _, depth))) if factory_below(depth) => None,
                (Some(&(_, _, true, _)), Some(&(b, p, _, _))) => Some((b, p)),
                (Some(&(b, p, _, _)), _) => Some((b, p)),
                _ => None,
            }
            // A factory (arange, zeros, full) reads no tensor: its size
            // comes from numbers the trace does not keep, and only its
            // readers' shapes tell.
            .unwrap_or((u32::MAX, false));
            // Nothing reads it: an operator's scratch, sized by the kernel's
            // tiling more than by the length; at most linear.
            let up = upper.get(&i).copied().unwrap_or(1);
            let (bound, product) = bound;
            let power = if product && bound > up && bound >= 2 {
                // A matrix product contracts one dim: when the sum of its
                // inputs' powers is more than the output's shape can hold,
                // the contracted dim was the length (`scores @ V`, a weight
                // gradient `xᵀ @ dy`), one power from each side.
                (bound - 2).min(up)
            } else {
                up.min(bound)
            };
            if up > power {
                self.ambiguous |= up >= 2;
            }
            // A tensor of fewer bytes than T elements holds no length dim
            // (a loss, a norm's scalar), one of fewer than T² no two.
            let t = u64::from(self.traced.t);
            let size = m.bytes.unsigned_abs();
            let fits = u32::from(size >= t) + u32::from(size >= t.saturating_mul(t));
            block.insert(i, power.min(2).min(fits));
        }
        let mut args = BTreeMap::new();
        for (op, arg, b) in &reads {
            let ts = trace.ops.get(*op).map_or(0, |o| o.start.get());
            // The dims are rescaled by what the read most likely is (the
            // latest block of its size), not by the bound's largest.
            let primary = b.last().map(std::slice::from_ref).unwrap_or_default();
            let k = if accumulates(*op) {
                0
            } else {
                self.arg_power(*arg, primary, &block, ts)
            };
            args.insert(*arg, k);
        }
        // The elements of one tensor list with the same dims hold the length
        // in the same dims, whichever blocks their reads were bound to (a
        // concatenation's operands differ at most in the dim it joins, and
        // `cat((freqs, freqs))` reads one tensor twice): they take one power,
        // the largest any of them shows.
        let list_key = |op: usize, arg: usize| {
            let a = trace.op_args.tensors.get(arg)?;
            a.list_index?;
            Some((op, a.position, trace.numbers(a.dims).to_vec()))
        };
        let mut alike: FxHashMap<(usize, u16, Vec<i64>), u32> = FxHashMap::default();
        for (op, arg, _) in &reads {
            if let (Some(key), Some(&k)) = (list_key(*op, *arg), args.get(arg)) {
                let slot = alike.entry(key).or_insert(k);
                *slot = (*slot).max(k);
            }
        }
        for (op, arg, _) in &reads {
            if let Some(&k) = list_key(*op, *arg).and_then(|key| alike.get(&key)) {
                args.insert(*arg, k);
            }
        }
        // A view's size list follows its input (the op's first tensor).
        let views = trace
            .ops
            .iter()
            .enumerate()
            .filter(|(_, o)| o.concrete.len > 0 && o.tensors.len > 0)
            .filter_map(|(i, o)| Some((i, *args.get(&(o.tensors.start as usize))?)))
            .collect();
        Powers { block, args, views }
    }

    /// The power of one argument: its blocks' (the largest), or for a tensor from before
    /// the trace its length dims if it is integer data or the loader's.
    fn arg_power(
        &self,
        arg: usize,
        blocks: &[usize],
        powers: &FxHashMap<usize, u32>,
        ts: i64,
    ) -> u32 {
        // A weight's dims may equal the length's at some length (a packed
        // 4-bit weight's `[n, 1]` bytes): a weight still never holds it.
        if self.state.contains(&arg) {
            return 0;
        }
        // The block the read most likely is (see `read_args`).
        if let Some(b) = blocks.last() {
            return powers.get(b).copied().unwrap_or(0);
        }
        let Some(a) = self.trace.op_args.tensors.get(arg) else {
            return 0;
        };
        let integer = a.dtype.is_some() && !self.is_float(a);
        if integer || self.in_loader(ts) {
            length_count(self.trace.numbers(a.dims), self.traced).min(2)
        } else {
            0
        }
    }

    /// The element size of each tensor argument of op `oi` that is a
    /// tensor-list element without a recorded dtype, from the op's
    /// children ([`crate::trace::list_element_types`]; `None` elsewhere).
    fn list_elsizes(&self, oi: usize) -> Vec<Option<u64>> {
        let trace = self.trace;
        let Some(o) = trace.ops.get(oi) else {
            return Vec::new();
        };
        let args = trace
            .op_args
            .tensors
            .get(o.tensors.range())
            .unwrap_or_default();
        if !args
            .iter()
            .any(|a| a.list_index.is_some() && a.dtype.is_none())
        {
            return Vec::new();
        }
        let end = o.start.get().saturating_add(o.dur.get());
        let mut children: Vec<(&[i64], u64)> = Vec::new();
        let from = self.position.get(oi).map_or(usize::MAX, |p| p + 1);
        for &j in self.order.get(from..).unwrap_or_default() {
            let Some(c) = trace.ops.get(j) else { break };
            if c.start.get() > end || children.len() >= 64 {
                break;
            }
            if c.tid != o.tid {
                continue;
            }
            for a in trace
                .op_args
                .tensors
                .get(c.tensors.range())
                .unwrap_or_default()
            {
                if let Some(size) = self.elsize(a) {
                    children.push((trace.numbers(a.dims), size));
                }
            }
        }
        let elements: Vec<Option<&[i64]>> = args
            .iter()
            .map(|a| (a.list_index.is_some() && a.dtype.is_none()).then(|| trace.numbers(a.dims)))
            .collect();
        let concatenates = crate::trace::CONCATENATIONS.contains(&trace.name(o.name));
        crate::trace::list_element_types(&elements, &children, concatenates)
    }

    /// Matches the tensor arguments of op `oi` to the live blocks: the
    /// latest block of exactly the bytes it reads, else the smallest block
    /// larger than that and at most twice it (a slice reads less than its
    /// storage), the latest of them.
    fn read_args(
        &self,
        oi: usize,
        live: &BTreeMap<u64, Vec<usize>>,
        reads: &mut Vec<(usize, usize, Vec<usize>)>,
        state_reads: &mut FxHashSet<usize>,
    ) {
        let Some(o) = self.trace.ops.get(oi) else {
            return;
        };
        let range = o.tensors.range();
        let default_size = self
            .trace
            .op_args
            .tensors
            .get(range.clone())
            .unwrap_or_default()
            .iter()
            .find_map(|a| self.elsize(a))
            .unwrap_or(4);
        let name = self.trace.name(o.name);
        let weights = crate::trace::weight_args(name, name == "aten::addmm");
        // A quantized weight's state (bitsandbytes' absmax and code) is the
        // model's, made with the weight before the trace: never a block of
        // the step, whatever its bytes match (a 4-bit layer's absmax taken
        // for an activation made its `gemm_4bit` a product of two
        // length-long inputs, and its output kept its traced size).
        let state = crate::trace::quant_state_args(name);
        let listed = self.list_elsizes(oi);
        let in_loader = self.in_loader(o.start.get());
        let mut used: Vec<usize> = Vec::new();
        for (k, ai) in range.enumerate() {
            let Some(a) = self.trace.op_args.tensors.get(ai) else {
                continue;
            };
            let quantized = a
                .dtype
                .is_some_and(|d| self.quantized.contains(&(self.trace.numbers(a.dims), d)));
            if a.list_index.is_none()
                && (weights.contains(&a.position) || state.contains(&a.position) || quantized)
            {
                reads.push((oi, ai, Vec::new()));
                state_reads.insert(ai);
                continue;
            }
            let elsize = self
                .elsize(a)
                .or_else(|| listed.get(k).copied().flatten())
                .unwrap_or(default_size);
            let extent = self.extent(a, elsize);
            // Every live block the read may be (same-sized tensors cannot be
            // told apart), the latest last.
            let blocks: Vec<usize> = if extent == 0 {
                Vec::new()
            } else if let Some(v) = live.get(&extent).filter(|v| !v.is_empty()) {
                v.clone()
            } else {
                live.range(extent..=extent.saturating_mul(2))
                    .find(|(_, v)| !v.is_empty())
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            // The data loader reads the dataset's samples, from before the
            // trace or made by the loader itself (its collate): never a
            // block of the step (an optimizer state of a sample row's bytes
            // twice over read as the row's storage kept it at its size).
            let mut blocks = if in_loader {
                blocks
                    .into_iter()
                    .filter(|&b| {
                        self.trace
                            .memory
                            .get(b)
                            .is_some_and(|m| self.in_loader(m.ts.get()))
                    })
                    .collect()
            } else {
                blocks
            };
            // The op's arguments are different tensors where the sizes allow:
            // each takes the latest block no earlier argument took (`p @ v`
            // with p and v the same size reads both, not p twice).
            if let Some(pos) = blocks.iter().rposition(|b| !used.contains(b)) {
                let chosen = blocks.remove(pos);
                blocks.push(chosen);
                used.push(chosen);
            }
            reads.push((oi, ai, blocks));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_are_named_as_pytorch_names_them() {
        for op in [
            "aten::mm",
            "aten::bmm",
            "aten::linear",
            "MmBackward0",
            "aten::einsum",
            "aten::_scaled_dot_product_flash_attention_for_cpu",
        ] {
            assert!(is_product(op), "{op}");
        }
        for op in ["aten::add", "aten::cat", "aten::softmax", "aten::mul"] {
            assert!(!is_product(op), "{op}");
        }
    }
}

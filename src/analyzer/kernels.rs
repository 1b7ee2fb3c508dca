//! The calls whose CUDA kernels allocate otherwise than the CPU's, as the
//! trace records them: `scaled_dot_product_attention` (its shapes, flags, the
//! CPU kernel that ran and its backward nodes) and `dropout` (its mask). The
//! orchestrator's kernel rules (`orchestrator::rules::kernels`) replace the
//! CPU's allocations with what [`crate::kernels`] says the CUDA kernels make.
//! This module only reads the facts those rules need.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::lifecycle::Life;
use super::spans::SpanIndex;
use super::{Block, Names};
use crate::kernels::attention;
use crate::trace::{dtype_size, Trace};

/// The op `torch.nn.functional.scaled_dot_product_attention` records.
const SDPA: &str = "aten::scaled_dot_product_attention";

/// Which CPU kernel ran an attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CpuAttention {
    /// `_scaled_dot_product_flash_attention_for_cpu` (no dropout).
    Flash,
    /// `_scaled_dot_product_attention_math`, the composite (dropout, or what
    /// the flash kernel does not take).
    Math,
}

/// One `scaled_dot_product_attention` call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttentionCall {
    /// The `aten::scaled_dot_product_attention` op (index into
    /// [`super::Analysis::ops`]).
    pub op: usize,
    /// The CPU kernel's op (a child of `op`), and which it is.
    pub kernel: usize,
    pub cpu: CpuAttention,
    /// The call as the CPU ran it: query `[batch, heads, q_len, head_dim]`,
    /// key `[batch, kv_heads, kv_len, head_dim]`, value's last dim (a 3-d
    /// call has batch 1); `elem` the query's bytes per element on the CPU;
    /// `dropout` when a probability above 0 ran inside it; `grad` when
    /// autograd recorded its backward.
    pub shape: attention::Call,
    /// The backward ops of the call (autograd nodes made by its ops and
    /// what they run), in time order; empty when autograd recorded nothing.
    pub backward: Vec<usize>,
}

/// One CPU `dropout` in training mode: its mask, a tensor of the input's
/// dtype on the CPU (`_dropout`: `empty_like(input).bernoulli_(1 - p)`), is
/// a bool tensor on CUDA (`native_dropout`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropoutCall {
    pub op: usize,
    /// The block of its mask (index into [`super::Analysis::blocks`]).
    pub mask_block: usize,
    /// Elements of the input.
    pub numel: u64,
}

/// One `sum` or `mean` whose CUDA kernel may split across thread blocks
/// through a global buffer ([`crate::kernels::reduce`]): a contiguous input
/// reduced over its leading or its trailing dims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReduceCall {
    pub op: usize,
    pub shape: crate::kernels::reduce::Shape,
}

/// The kernel calls of a trace (see the module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelCalls {
    pub attention: Vec<AttentionCall>,
    pub dropout: Vec<DropoutCall>,
    #[serde(default)]
    pub reduce: Vec<ReduceCall>,
    #[serde(default)]
    pub conv: Vec<ConvCall>,
    #[serde(default)]
    pub softmax_backward: Vec<SoftmaxBackwardCall>,
}

/// One `aten::_softmax_backward_data`: its CUDA kernel multiplies the
/// incoming gradient by the softmax's output into a temporary before the
/// reduction ([`crate::kernels::softmax`]); the CPU's kernel makes none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoftmaxBackwardCall {
    pub op: usize,
    /// The gradient of the softmax's input the call makes (the largest
    /// block it allocates that outlives it), when the trace shows one.
    pub grad_input: Option<usize>,
    /// Bytes of the incoming gradient at the traced dtype, where the trace
    /// has shapes.
    pub grad_bytes: Option<u64>,
}

/// One convolution pass as the CPU trace records it, for the orchestrator's
/// `cudnn_conv_workspaces` rule ([`crate::kernels::conv`]): a forward
/// `aten::convolution` or a backward `aten::convolution_backward`, with the
/// blocks the pass writes (found by lifetime, so a trace without shapes
/// gives the same calls).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConvCall {
    pub op: usize,
    pub backward: bool,
    /// What the pass writes, largest first: the forward's output; the
    /// backward's gradients of input, weight and bias (the blocks the call
    /// makes that outlive it).
    pub written: Vec<usize>,
    /// The forward's output block, for a backward call linked to its
    /// forward (`None` for a forward call or without the link).
    pub forward_output: Option<usize>,
    /// Bytes of the grad_output argument, where the trace has shapes.
    pub grad_output: Option<u64>,
    /// A depthwise convolution (`groups == C_in > 1`: a weight of one input
    /// channel per group, read from the shapes) in fp32 or bf16, which
    /// PyTorch runs without cuDNN.
    pub native_depthwise: bool,
    /// Bytes of the input and the weight arguments at the traced dtype,
    /// where the trace has shapes (`None` without `record_shapes`).
    #[serde(default)]
    pub operands: Option<ConvOperands>,
}

/// The tensors a convolution pass reads, from the trace's shapes
/// ([`crate::kernels::conv`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConvOperands {
    pub input_bytes: u64,
    pub weight_bytes: u64,
    /// Bytes of an element at the traced dtype.
    pub elem: u64,
    /// A 1×1 window: its weight is the same matrix in either layout.
    pub pointwise: bool,
    /// The output keeps the input's spatial size (stride 1, or padding
    /// that makes up for the window).
    pub stride_one: bool,
    /// Fewer than 8 input channels per group (an RGB image) under a window
    /// of at most 3.
    pub thin: bool,
    /// The input's batch (its first dim; 0 in an analysis saved before it
    /// was kept).
    #[serde(default)]
    pub batch: u64,
    /// Input channels per group (the weight's second dim; 0 likewise).
    #[serde(default)]
    pub c_in: u64,
    /// Output channels (the weight's first dim; 0 likewise).
    #[serde(default)]
    pub c_out: u64,
}

/// A reduction over `reduced` dims of a contiguous tensor of `dims`, as
/// `TensorIterator` coalesces it (size-1 dims dropped): the leading dims
/// (column sums) or the trailing ones (row sums, everything); `None` for
/// any other pattern.
fn reduce_shape(
    dims: &[u64],
    reduced: &[usize],
    in_elem: u64,
    acc_elem: u64,
) -> Option<crate::kernels::reduce::Shape> {
    let kept: Vec<(u64, bool)> = dims
        .iter()
        .enumerate()
        .filter(|&(_, &d)| d != 1)
        .map(|(i, &d)| (d, reduced.is_empty() || reduced.contains(&i)))
        .collect();
    let n_reduced = kept.iter().filter(|k| k.1).count();
    let leading = kept.iter().take(n_reduced).all(|k| k.1);
    let trailing = kept.iter().rev().take(n_reduced).all(|k| k.1);
    let product = |reduced: bool| {
        kept.iter()
            .filter(|k| k.1 == reduced)
            .try_fold(1_u64, |a, k| a.checked_mul(k.0))
    };
    let (inputs, outputs) = (product(true)?, product(false)?);
    let fastest = if n_reduced == kept.len() || trailing {
        true
    } else if leading {
        false
    } else {
        return None;
    };
    Some(crate::kernels::reduce::Shape {
        outputs,
        inputs,
        fastest,
        in_elem,
        acc_elem,
    })
}

/// Every `sum` and `mean` over a contiguous input whose reduction
/// `reduce_shape` can lay out.
fn reductions(trace: &Trace, index: &SpanIndex, names: &Names) -> Vec<ReduceCall> {
    let spans = &index.ops.spans;
    let mut out = Vec::new();
    for (op, span) in spans.iter().enumerate() {
        if !matches!(names.get(span.name), "aten::sum" | "aten::mean") {
            continue;
        }
        let (Some(input), Some(source)) = (
            index.tensor_arg(trace, op, 0),
            index.ops.source_in(op, &trace.ops),
        ) else {
            continue;
        };
        let Some(dims) = trace
            .numbers(input.dims)
            .iter()
            .map(|&d| u64::try_from(d).ok())
            .collect::<Option<Vec<u64>>>()
        else {
            continue;
        };
        // Contiguous: strides row-major where recorded.
        if let Some(strides) = input.strides {
            let strides = trace.numbers(strides);
            let mut expected = 1_i64;
            let contiguous = dims.iter().zip(strides).rev().all(|(&d, &st)| {
                let ok = d == 1 || st == expected;
                expected = expected.saturating_mul(i64::try_from(d).unwrap_or(i64::MAX));
                ok
            });
            if !contiguous {
                continue;
            }
        }
        let rank = i64::try_from(dims.len()).unwrap_or(0);
        let reduced: Vec<usize> = trace
            .concrete_args(source)
            .iter()
            .find(|c| c.position == 1 && c.list)
            .map(|c| {
                trace
                    .numbers(c.values)
                    .iter()
                    .filter_map(|&d| usize::try_from(if d < 0 { d + rank } else { d }).ok())
                    .collect()
            })
            .unwrap_or_default();
        let dtype = input.dtype.map(|d| trace.name(d));
        let Some(in_elem) = dtype.and_then(dtype_size) else {
            continue;
        };
        let acc_elem = if dtype == Some("double") { 8 } else { 4 };
        if let Some(shape) = reduce_shape(&dims, &reduced, in_elem, acc_elem) {
            out.push(ReduceCall { op, shape });
        }
    }
    out
}

/// The ops inside `op` on its thread (itself first): spans are sorted by
/// start per thread, parents first, so they follow it.
fn subtree(index: &SpanIndex, op: usize) -> Vec<usize> {
    let spans = &index.ops.spans;
    let Some(root) = spans.get(op) else {
        return Vec::new();
    };
    let mut out = vec![op];
    for (i, s) in spans.iter().enumerate().skip(op + 1) {
        if s.tid != root.tid || s.start > root.end {
            break;
        }
        if index.ops.chain(i).any(|a| a == op) {
            out.push(i);
        }
    }
    out
}

fn dims_of(trace: &Trace, index: &SpanIndex, op: usize, position: u16) -> Option<Vec<u64>> {
    let a = index.tensor_arg(trace, op, position)?;
    trace
        .numbers(a.dims)
        .iter()
        .map(|&d| u64::try_from(d).ok())
        .collect()
}

/// `(batch, heads, len, dim)` of a 4-d (or 3-d, batch 1) attention operand.
fn bhld(dims: &[u64]) -> Option<(u64, u64, u64, u64)> {
    match *dims {
        [b, h, l, d] => Some((b, h, l, d)),
        [h, l, d] => Some((1, h, l, d)),
        _ => None,
    }
}

/// Every attention call the CPU ran through one of its kernels, with its
/// backward ops.
fn attention(trace: &Trace, index: &SpanIndex, names: &Names) -> Vec<AttentionCall> {
    let spans = &index.ops.spans;
    // Backward ops by the forward op their node links to.
    let mut backward_of: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, s) in spans.iter().enumerate() {
        if let Some(f) = s.forward_op.filter(|_| s.backward) {
            backward_of.entry(f).or_default().push(i);
        }
    }
    let mut out = Vec::new();
    for (kernel, span) in spans.iter().enumerate() {
        let cpu = match names.get(span.name) {
            "aten::_scaled_dot_product_flash_attention_for_cpu" => CpuAttention::Flash,
            "aten::_scaled_dot_product_attention_math" => CpuAttention::Math,
            _ => continue,
        };
        // The innermost `scaled_dot_product_attention` around the kernel:
        // under autocast the op is recorded twice, the outer call with the
        // fp32 inputs, the inner one (after autocast's casts) with those the
        // kernel runs on.
        let Some(op) = index
            .ops
            .chain(kernel)
            .skip(1)
            .find(|&i| spans.get(i).is_some_and(|s| names.get(s.name) == SDPA))
        else {
            continue;
        };
        let inside = subtree(index, op);
        let (Some(q), Some(k), Some(v)) = (
            dims_of(trace, index, op, 0),
            dims_of(trace, index, op, 1),
            dims_of(trace, index, op, 2),
        ) else {
            continue;
        };
        let (Some((batch, heads, q_len, head_dim)), Some((_, kv_heads, kv_len, _)), Some(v)) =
            (bhld(&q), bhld(&k), bhld(&v))
        else {
            continue;
        };
        let dtype = index
            .tensor_arg(trace, op, 0)
            .and_then(|a| a.dtype)
            .map(|d| trace.name(d));
        let Some(elem) = dtype.and_then(dtype_size) else {
            continue;
        };
        let flag = |position: u16| -> Option<i64> {
            let source = index.ops.source_in(op, &trace.ops)?;
            let c = trace
                .concrete_args(source)
                .iter()
                .find(|c| c.position == position && !c.list)?;
            trace.numbers(c.values).first().copied()
        };
        let dropout_ran = inside.iter().any(|&i| {
            spans
                .get(i)
                .is_some_and(|s| names.get(s.name) == "aten::dropout")
        });
        let backward: BTreeSet<usize> = subtree(index, kernel)
            .into_iter()
            .chain([op])
            .filter_map(|f| backward_of.get(&f))
            .flatten()
            .copied()
            .collect();
        let backward: Vec<usize> = backward.into_iter().collect();
        out.push(AttentionCall {
            op,
            kernel,
            cpu,
            shape: attention::Call {
                batch,
                heads,
                kv_heads,
                q_len,
                kv_len,
                head_dim,
                v_head_dim: v.3,
                elem,
                fp16: dtype == Some("c10::Half"),
                mask: index.tensor_arg(trace, op, 3).is_some(),
                causal: flag(5) == Some(1),
                dropout: flag(4).is_some_and(|p| p > 0) || dropout_ran,
                grad: !backward.is_empty(),
            },
            backward,
        });
    }
    out
}

/// Every CPU `aten::dropout` that made a mask: the block a factory call of
/// its own allocated, of the input's size, that outlives the op (saved for
/// backward).
fn dropout(trace: &Trace, index: &SpanIndex, names: &Names, life: &Life) -> Vec<DropoutCall> {
    let spans = &index.ops.spans;
    // Blocks a factory call directly under a dropout made, by that dropout.
    let mut made_under: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for b in &life.blocks {
        let Some(alloc) = b.alloc_op else {
            continue;
        };
        if !spans
            .get(alloc)
            .is_some_and(|a| names.get(a.name).starts_with("aten::empty"))
        {
            continue;
        }
        // Up through the factory calls (`empty_like` calls `empty_strided`).
        let owner = index.ops.chain(alloc).find(|&i| {
            spans
                .get(i)
                .is_none_or(|o| !names.get(o.name).starts_with("aten::empty"))
        });
        if let Some(owner) = owner.filter(|&o| {
            spans
                .get(o)
                .is_some_and(|s| names.get(s.name) == "aten::dropout")
        }) {
            made_under.entry(owner).or_default().push(b.id);
        }
    }
    let mut out = Vec::new();
    for (op, span) in spans.iter().enumerate() {
        if names.get(span.name) != "aten::dropout" {
            continue;
        }
        let Some(input) = index.tensor_arg(trace, op, 0) else {
            continue;
        };
        let numel = trace
            .numbers(input.dims)
            .iter()
            .try_fold(1_u64, |acc, &d| acc.checked_mul(u64::try_from(d).ok()?));
        let elem = input
            .dtype
            .and_then(|d| dtype_size(trace.name(d)))
            .unwrap_or(0);
        let Some(numel) = numel.filter(|&n| n > 0) else {
            continue;
        };
        let bytes = numel.saturating_mul(elem);
        let mask = made_under
            .get(&op)
            .into_iter()
            .flatten()
            .filter_map(|&b| life.blocks.get(b))
            .find(|b| b.size.get() == bytes && b.free_ts.is_none_or(|f| f > span.end));
        if let Some(mask) = mask {
            out.push(DropoutCall {
                op,
                mask_block: mask.id,
                numel,
            });
        }
    }
    out
}

/// The kernel calls of a trace.
pub(crate) fn find(trace: &Trace, index: &SpanIndex, names: &Names, life: &Life) -> KernelCalls {
    let by_op = blocks_by_op(&life.blocks);
    KernelCalls {
        attention: attention(trace, index, names),
        dropout: dropout(trace, index, names, life),
        reduce: reductions(trace, index, names),
        conv: convolutions(trace, index, names, life, &by_op),
        softmax_backward: softmax_backwards(trace, index, names, life, &by_op),
    }
}

/// The blocks each op allocated (as the innermost op), by op index.
pub(crate) fn blocks_by_op(blocks: &[Block]) -> BTreeMap<usize, Vec<usize>> {
    let mut by_op: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for b in blocks {
        if let Some(op) = b.alloc_op {
            by_op.entry(op).or_default().push(b.id);
        }
    }
    by_op
}

/// Every `aten::_softmax_backward_data` with the gradient it makes
/// ([`SoftmaxBackwardCall`]).
fn softmax_backwards(
    trace: &Trace,
    index: &SpanIndex,
    names: &Names,
    life: &Life,
    by_op: &BTreeMap<usize, Vec<usize>>,
) -> Vec<SoftmaxBackwardCall> {
    let spans = &index.ops.spans;
    let calls: Vec<usize> = spans
        .iter()
        .enumerate()
        .filter(|(_, s)| names.get(s.name) == "aten::_softmax_backward_data")
        .map(|(op, _)| op)
        .collect();
    let mut out = Vec::new();
    for op in calls {
        let Some(span) = spans.get(op) else {
            continue;
        };
        let grad_input = subtree(index, op)
            .into_iter()
            .filter_map(|i| by_op.get(&i))
            .flatten()
            .filter_map(|&b| life.blocks.get(b))
            .filter(|b| b.free_ts.is_none_or(|f| f > span.end))
            .max_by_key(|b| (b.size, std::cmp::Reverse(b.id)))
            .map(|b| b.id);
        let grad_bytes = dims_of(trace, index, op, 0).and_then(|dims| {
            let elem = index
                .tensor_arg(trace, op, 0)
                .and_then(|a| a.dtype)
                .and_then(|d| dtype_size(trace.name(d)))?;
            dims.iter().try_fold(elem, |acc, &d| acc.checked_mul(d))
        });
        out.push(SoftmaxBackwardCall {
            op,
            grad_input,
            grad_bytes,
        });
    }
    out
}

/// Whether the weight argument at `weight` of `op` is a depthwise
/// convolution's on an input at `input` in fp32 or bf16 (`is_depthwise` in
/// `Convolution.cpp`; `use_cudnn_depthwise` takes cuDNN for fp16 only, or
/// channels-last, which this does not see).
fn native_depthwise(trace: &Trace, index: &SpanIndex, op: usize, input: u16, weight: u16) -> bool {
    let (Some(x), Some(w)) = (
        dims_of(trace, index, op, input),
        dims_of(trace, index, op, weight),
    ) else {
        return false;
    };
    let dtype = index
        .tensor_arg(trace, op, input)
        .and_then(|a| a.dtype)
        .map(|d| trace.name(d));
    let half = dtype == Some("c10::Half");
    matches!((x.get(1), w.get(1)), (Some(&c), Some(&1)) if c > 1) && x.len() >= 4 && !half
}

/// The input and weight of a convolution pass of `op` (arguments at `input`
/// and `weight`) whose output (the forward's output, the backward's
/// grad_output) is `output_bytes` at the input's dtype: their bytes and the
/// window's facts that decide cuDNN's workspace.
fn conv_operands(
    trace: &Trace,
    index: &SpanIndex,
    op: usize,
    input: u16,
    weight: u16,
    output_bytes: Option<u64>,
) -> Option<ConvOperands> {
    let x = dims_of(trace, index, op, input)?;
    let w = dims_of(trace, index, op, weight)?;
    let elem = index
        .tensor_arg(trace, op, input)
        .and_then(|a| a.dtype)
        .and_then(|d| dtype_size(trace.name(d)))?;
    let bytes = |dims: &[u64]| dims.iter().try_fold(elem, |acc, &d| acc.checked_mul(d));
    let (input_bytes, weight_bytes) = (bytes(&x)?, bytes(&w)?);
    let (&batch, spatial) = x.split_first()?;
    let spatial = spatial.get(1..)?;
    let (&c_out, w_rest) = w.split_first()?;
    let (&c_in_per_group, window) = w_rest.split_first()?;
    // The output keeps the input's spatial size at stride 1 (1×1, no padding).
    let same_size = bytes(&[&[batch, c_out][..], spatial].concat());
    Some(ConvOperands {
        input_bytes,
        weight_bytes,
        elem,
        pointwise: !window.is_empty() && window.iter().all(|&k| k == 1),
        stride_one: output_bytes.is_some() && output_bytes == same_size,
        thin: c_in_per_group < 8 && window.iter().all(|&k| k <= 3),
        batch,
        c_in: c_in_per_group,
        c_out,
    })
}

/// Every forward `aten::convolution` and backward `aten::convolution_backward`
/// with the blocks it writes ([`ConvCall`]).
fn convolutions(
    trace: &Trace,
    index: &SpanIndex,
    names: &Names,
    life: &Life,
    by_op: &BTreeMap<usize, Vec<usize>>,
) -> Vec<ConvCall> {
    let spans = &index.ops.spans;
    let written = |op: usize| -> Vec<usize> {
        let Some(span) = spans.get(op) else {
            return Vec::new();
        };
        let mut out: Vec<usize> = subtree(index, op)
            .into_iter()
            .filter_map(|i| by_op.get(&i))
            .flatten()
            .copied()
            .filter(|&b| {
                life.blocks
                    .get(b)
                    .is_some_and(|b| b.free_ts.is_none_or(|f| f > span.end))
            })
            .collect();
        out.sort_by_key(|&b| std::cmp::Reverse(life.blocks.get(b).map_or(0, |b| b.size.get())));
        out
    };
    let mut out = Vec::new();
    // The forward calls' outputs, by the call and every op around it (the
    // backward's node links to the outermost op of its sequence number).
    let mut output_of: BTreeMap<usize, usize> = BTreeMap::new();
    for (op, span) in spans.iter().enumerate() {
        let backward = match names.get(span.name) {
            "aten::convolution" => false,
            "aten::convolution_backward" => true,
            _ => continue,
        };
        // An `aten::convolution` inside another (none today) counts once.
        if !backward
            && index.ops.chain(op).skip(1).any(|i| {
                spans
                    .get(i)
                    .is_some_and(|s| names.get(s.name) == "aten::convolution")
            })
        {
            continue;
        }
        let written = written(op);
        let forward_output = if backward {
            span.forward_op.and_then(|f| {
                index
                    .ops
                    .chain(f)
                    .find_map(|i| output_of.get(&i).copied())
                    .or_else(|| output_of.get(&f).copied())
            })
        } else {
            if let Some(&o) = written.first() {
                for i in index.ops.chain(op) {
                    output_of.insert(i, o);
                }
            }
            None
        };
        let grad_output = if backward {
            let elem = index
                .tensor_arg(trace, op, 0)
                .and_then(|a| a.dtype)
                .and_then(|d| dtype_size(trace.name(d)));
            dims_of(trace, index, op, 0)
                .and_then(|d| d.iter().try_fold(elem?, |acc, &x| acc.checked_mul(x)))
        } else {
            None
        };
        let (input, weight) = if backward { (1, 2) } else { (0, 1) };
        let output_bytes = if backward {
            grad_output
        } else {
            written
                .first()
                .and_then(|&b| life.blocks.get(b))
                .map(|b| b.size.get())
        };
        let operands = conv_operands(trace, index, op, input, weight, output_bytes);
        out.push(ConvCall {
            op,
            backward,
            written,
            forward_output,
            grad_output,
            native_depthwise: native_depthwise(trace, index, op, input, weight),
            operands,
        });
    }
    out
}

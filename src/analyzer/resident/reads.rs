//! Pre-trace reads: the tensors the forward pass reads that were never
//! allocated inside the trace, each counted once. The rule and its evidence
//! are described in [`super`]; this is the engine, over a neutral model of
//! the trace (top-level ops with their tensor arguments, module calls,
//! blocks) that [`super`] builds from the analysis.

use crate::trace::{quant_state_args, weight_args};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeMap;

use super::views::{contiguous_strides, extent, view_outputs, Concrete, Layout};

/// One tensor argument of an op (`Input Dims` / `Input type` / `Input Strides`).
#[derive(Debug, Clone)]
pub struct Arg {
    pub pos: u16,
    /// Position inside a `TensorList` argument.
    pub list: Option<u16>,
    /// `None` for a tensor-list element (the profiler records no dtype there)
    /// whose op's children do not show it.
    pub dtype: Option<Dtype>,
    pub layout: Layout,
}

/// A dtype as `Input type` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dtype {
    /// Bytes per element.
    pub size: u64,
    /// Its name id.
    pub name: u32,
    /// A floating-point (or complex) type.
    pub floating: bool,
}

/// One top-level op as the engine sees it.
#[derive(Debug, Clone)]
pub struct Op {
    pub name: String,
    pub start: i64,
    /// Index into the module calls, `None` without `with_stack` (one pseudo
    /// call per forward pass is used then).
    pub call: Option<usize>,
    /// Its forward pass (an iteration, or a micro-batch of one), numbered
    /// in time order.
    pub iteration: usize,
    /// The backward passes started before it (to tell micro-batches apart).
    pub pass: usize,
    pub args: Vec<Arg>,
    pub concrete: Vec<Concrete>,
    /// A conditionally viewing op (`to`, `reshape`, `contiguous`) that copied.
    pub copied: bool,
}

/// One call of a module instance (an `nn.Module: Linear_3` frame).
#[derive(Debug, Clone)]
pub struct Call {
    /// The instance (`Linear_3`: `k` counts instances of a class, and an
    /// instance called twice keeps its `k`).
    pub instance: u32,
    /// Its class (`Linear`).
    pub class: u32,
    pub start: i64,
    /// A wrapper (DistributedDataParallel) whose own reads are not state.
    pub wrapper: bool,
    /// Hugging Face's `Conv1D`: `torch.addmm(bias, x, weight)`.
    pub conv1d: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockUse {
    /// Could hold a tensor the forward reads.
    Live,
    /// Persistent and made outside the forward: may be a model built in the trace.
    Construction,
    /// A gradient or optimizer state: never a forward input.
    Ignored,
}

#[derive(Debug, Clone)]
pub struct Blk {
    pub alloc: i64,
    pub free: Option<i64>,
    pub size: u64,
    pub usage: BlockUse,
    /// The layout a block holds from its allocation ([`super::bindings`]).
    pub bound_dims: Option<Vec<i64>>,
    /// The analysis block it stands for.
    pub source: Option<usize>,
}

/// What a state read is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReadKind {
    Parameter,
    Buffer,
    /// Made before the trace but of the batch: an earlier batch, a KV cache.
    Activation,
    /// A quantized weight's quantisation state (bitsandbytes' absmax, code,
    /// `SCB`), read by the layer's kernels.
    QuantState,
}

/// One state tensor found, after de-duplication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub instance: Option<u32>,
    pub dims: Vec<i64>,
    pub dtype: Option<u32>,
    pub bytes: u64,
    pub kind: ReadKind,
    /// Its block was allocated inside the trace (a model built inside the
    /// profiled region): counted once, through that block.
    pub in_trace: bool,
    /// That block (an index into the engine's blocks).
    pub block: Option<usize>,
    /// A weight argument of a known op (linear, conv, embedding, norms).
    pub known_role: bool,
    pub op: String,
    pub arg: u16,
    pub first_read: i64,
    pub last_read: i64,
}

/// Arguments of known ops that are buffers (BatchNorm running statistics).
fn buffer_args(op: &str) -> &'static [u16] {
    match op {
        "aten::batch_norm" | "aten::instance_norm" => &[3, 4],
        _ => &[],
    }
}

/// Views that select positions of a tensor (how buffers such as position ids
/// and rotary caches are read) rather than re-arrange a weight.
fn positional_view(op: &str) -> bool {
    matches!(
        op,
        "aten::slice"
            | "aten::select"
            | "aten::narrow"
            | "aten::unbind"
            | "aten::alias"
            | "aten::expand"
            | "aten::unsqueeze"
            | "aten::squeeze"
            | "aten::to"
            | "aten::view"
            | "aten::reshape"
            | "aten::contiguous"
            | "aten::type_as"
            | "aten::expand_as"
            | "aten::detach"
    )
}

type Binding = (Vec<i64>, Option<u32>);
/// A module call: its instance and start.
type CallKey = (u32, i64);

/// Live in-trace blocks by size, each bound to the first tensor read from it.
struct LiveBlocks<'a> {
    blocks: &'a [Blk],
    events: Vec<(i64, bool, usize)>,
    next: usize,
    by_size: BTreeMap<u64, Vec<(usize, Option<Binding>)>>,
    construction: BTreeMap<u64, Vec<usize>>,
}

impl<'a> LiveBlocks<'a> {
    fn new(blocks: &'a [Blk]) -> Self {
        let mut events = Vec::with_capacity(blocks.len() * 2);
        for (i, b) in blocks.iter().enumerate() {
            if b.usage == BlockUse::Ignored {
                continue;
            }
            events.push((b.alloc, true, i));
            if let Some(f) = b.free {
                events.push((f, false, i));
            }
        }
        // at one instant, allocations first
        events.sort_by_key(|&(t, alloc, i)| (t, !alloc, i));
        LiveBlocks {
            blocks,
            events,
            next: 0,
            by_size: BTreeMap::new(),
            construction: BTreeMap::new(),
        }
    }

    /// Applies every event before `t` (a block freed at `t` still counts).
    fn advance(&mut self, t: i64) {
        while let Some(&(time, alloc, i)) = self.events.get(self.next) {
            if time >= t {
                break;
            }
            self.next += 1;
            let Some(b) = self.blocks.get(i) else {
                continue;
            };
            match (b.usage, alloc) {
                (BlockUse::Construction, true) => {
                    self.construction.entry(b.size).or_default().push(i)
                }
                (BlockUse::Construction, false) => {
                    if let Some(v) = self.construction.get_mut(&b.size) {
                        v.retain(|&j| j != i);
                    }
                }
                (_, true) => {
                    let bound = b.bound_dims.clone().map(|d| (d, None));
                    self.by_size.entry(b.size).or_default().push((i, bound));
                }
                (_, false) => {
                    if let Some(v) = self.by_size.get_mut(&b.size) {
                        v.retain(|&(j, _)| j != i);
                    }
                }
            }
        }
    }

    /// Whether a live block of exactly `size` bytes could hold a tensor of
    /// `dims`/`dtype`. A fresh output is read from the latest block: an
    /// unbound block allocated after every block bound to this shape is
    /// bound to it; else a block bound to this shape explains the read; else
    /// the latest unbound block is bound.
    fn explain(&mut self, size: u64, dims: &[i64], dtype: Option<u32>) -> bool {
        let Some(live) = self.by_size.get_mut(&size) else {
            return false;
        };
        let same = |b: &Binding| b.0 == dims && (b.1.is_none() || dtype.is_none() || b.1 == dtype);
        let last_same = live
            .iter()
            .filter(|(_, b)| b.as_ref().is_some_and(same))
            .map(|(i, _)| *i)
            .max();
        let last_free = live
            .iter()
            .filter(|(_, b)| b.is_none())
            .map(|(i, _)| *i)
            .max();
        match (last_free, last_same) {
            (Some(free), same) if same.is_none_or(|s| free > s) => {
                if let Some(slot) = live.iter_mut().find(|(i, _)| *i == free) {
                    slot.1 = Some((dims.to_vec(), dtype));
                }
                true
            }
            (_, same) => same.is_some(),
        }
    }

    /// A live block of exactly `size` bytes that may be a model built in the trace.
    fn construction_block(&self, size: u64) -> Option<usize> {
        self.construction
            .get(&size)
            .and_then(|v| v.first().copied())
    }

    /// A live block of `size` allocated at or after `since` (inside this call).
    fn allocated_since(&self, size: u64, since: i64) -> bool {
        self.by_size.get(&size).is_some_and(|v| {
            v.iter()
                .any(|&(i, _)| self.blocks.get(i).is_some_and(|b| b.alloc >= since))
        })
    }
}

/// One read that may be state, before the consensus over slots.
struct Read {
    call_key: (u32, i64),
    slot: u64,
    place: u64,
    state: bool,
    dims: Vec<i64>,
    dtype: Option<u32>,
    elem: u64,
    kind: ReadKind,
    in_trace: bool,
    block: Option<usize>,
    known_role: bool,
    op_known: bool,
    data_input: bool,
    co_operand: bool,
    op: String,
    arg: u16,
    iteration: usize,
    time: i64,
}

fn hash_of<T: std::hash::Hash>(t: &T) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(t)
}

/// The state tensors the forward reads. `calls[i].class`, `.instance` are
/// name ids; `class_name` resolves a class id; `default_elem` is the element
/// size assumed for tensor-list elements (no dtype recorded).
pub fn pre_trace_reads(
    ops: &[Op],
    calls: &[Call],
    blocks: &[Blk],
    default_elem: u64,
    default_dtype: Option<u32>,
) -> Vec<Found> {
    let mut live = LiveBlocks::new(blocks);
    // A view's output: whether it views state, its dtype, the read of the
    // state it views, and for an identity view (same layout as its input)
    // the call it was made in: only that call reads the identity through
    // it; another tensor of that layout elsewhere (a weight of the same
    // shape in the next layer) is not it.
    type Derived = (bool, Option<u32>, Option<usize>, Option<(u32, i64)>);
    let mut derived: FxHashMap<Layout, Derived> = FxHashMap::default();
    let mut iteration = usize::MAX;
    let mut nth: FxHashMap<(u32, i64, &str), u32> = FxHashMap::default();
    let mut reads: Vec<Read> = Vec::new();
    // (call, dims, dtype) of the quantisation state read so far: the
    // kernels of one layer call hand the same state down to each other.
    let mut quant_seen: FxHashSet<(CallKey, Vec<i64>, Option<u32>)> = FxHashSet::default();
    // The first read, per call, of a stacked weight indexed by `select`
    // (an eager mixture-of-experts loop's `w[e]`, each expert's slice of
    // one `[experts, out, in]` parameter): the call's later selects of that
    // signature read the same tensor.
    let mut stacked: FxHashMap<(CallKey, Vec<i64>, Option<u32>), usize> = FxHashMap::default();
    for op in ops {
        live.advance(op.start);
        let call = op.call.and_then(|c| calls.get(c));
        if call.is_some_and(|c| c.wrapper) {
            continue;
        }
        if op.iteration != iteration {
            iteration = op.iteration;
            derived.clear();
        }
        // Without module frames, one pseudo call per forward pass.
        let (class, call_start, call_key) = match call {
            Some(c) => (c.class, c.start, (c.instance, c.start)),
            None => (u32::MAX, i64::MIN, (u32::MAX, op.iteration as i64)),
        };
        let weights = weight_args(&op.name, call.is_some_and(|c| c.conv1d));
        let buffers = buffer_args(&op.name);
        let quant = quant_state_args(&op.name);
        let known_op = !weights.is_empty();
        let n = nth
            .entry((call_key.0, call_key.1, op.name.as_str()))
            .or_insert(0);
        *n += 1;
        let nth_here = *n;
        let mut arg0_state: Option<bool> = None;
        let mut arg0_read: Option<usize> = None;
        let first_read = reads.len();
        let mut activations: Vec<Vec<i64>> = Vec::new();
        for a in &op.args {
            let strides = if a.layout.strides.len() == a.layout.dims.len() {
                a.layout.strides.clone()
            } else {
                contiguous_strides(&a.layout.dims)
            };
            let layout = Layout {
                dims: a.layout.dims.clone(),
                strides,
            };
            let dtype = a.dtype.map(|d| d.name).or(default_dtype);
            if a.list.is_none() && quant.contains(&a.pos) {
                // Quantisation state: stored beside its weight, unless the
                // call made a block of its size (the absmax a double
                // quantisation dequantizes on the fly).
                let elem = a.dtype.map_or(default_elem, |d| d.size);
                let size = extent(&layout.dims, &layout.strides).saturating_mul(elem);
                if size == 0
                    || (call.is_some() && live.allocated_since(size, call_start))
                    || !quant_seen.insert((call_key, layout.dims.clone(), dtype))
                {
                    continue;
                }
                let block = live.construction_block(size);
                reads.push(Read {
                    call_key,
                    slot: hash_of(&(
                        class,
                        op.name.as_str(),
                        nth_here,
                        a.pos,
                        &layout.dims,
                        dtype,
                    )),
                    place: hash_of(&(call_key.0, op.name.as_str(), nth_here, a.pos, a.list)),
                    state: true,
                    dims: layout.dims.clone(),
                    dtype,
                    elem,
                    kind: ReadKind::QuantState,
                    in_trace: block.is_some(),
                    block,
                    known_role: true,
                    op_known: true,
                    data_input: false,
                    co_operand: false,
                    op: op.name.clone(),
                    arg: a.pos,
                    iteration: op.iteration,
                    time: op.start,
                });
                continue;
            }
            let stacked_key = (op.name == "aten::select"
                && a.pos == 0
                && a.list.is_none()
                && layout.dims.len() >= 3)
                .then(|| (call_key, layout.dims.clone(), dtype));
            if let Some(&first) = stacked_key.as_ref().and_then(|k| stacked.get(k)) {
                arg0_state = reads.get(first).map(|r| r.state);
                arg0_read = Some(first);
                continue;
            }
            let hit = derived
                .get(&layout)
                .filter(|x| x.3.is_none_or(|call| call == call_key));
            if let Some(&(was_state, d, source, _)) = hit {
                if dtype.is_none() || d.is_none() || d == dtype {
                    let mut is_state = was_state;
                    // What a layer op takes as its weight through a view
                    // (bitsandbytes' `Params4bit` viewed before `gemm_4bit`)
                    // is a parameter, whatever the view's read said, and
                    // follows the weight rule: stored unless the call made
                    // a block of its size. The view's read alone could be
                    // explained by any live block of the packed weight's
                    // bytes (an activation of the same size: a collision).
                    if a.list.is_none() && weights.contains(&a.pos) {
                        if let Some(r) = source.and_then(|i| reads.get_mut(i)) {
                            r.kind = ReadKind::Parameter;
                            r.known_role = true;
                            if !r.state {
                                let size = extent(&r.dims, &contiguous_strides(&r.dims))
                                    .saturating_mul(r.elem);
                                if size > 0
                                    && !(call.is_some() && live.allocated_since(size, call_start))
                                {
                                    r.state = true;
                                    r.block = live.construction_block(size);
                                    r.in_trace = r.block.is_some();
                                    is_state = true;
                                }
                            }
                        }
                        if is_state != was_state {
                            if let Some(entry) = derived.get_mut(&layout) {
                                entry.0 = true;
                            }
                        }
                    }
                    if !is_state {
                        activations.push(layout.dims.clone());
                    }
                    if a.pos == 0 && a.list.is_none() {
                        arg0_state = Some(is_state);
                        arg0_read = source;
                    }
                    continue;
                }
            }
            let elem = a.dtype.map_or(default_elem, |d| d.size);
            let size = extent(&layout.dims, &layout.strides).saturating_mul(elem);
            let known_role = a.list.is_none() && weights.contains(&a.pos);
            // state?, and the block of a model built in the trace
            let (state, block) = if size == 0 {
                (false, None)
            } else if known_role {
                if call.is_some() && live.allocated_since(size, call_start) {
                    (false, None)
                } else {
                    (true, live.construction_block(size))
                }
            } else if live.explain(size, &layout.dims, dtype) {
                (false, None)
            } else {
                (true, live.construction_block(size))
            };
            let in_trace = block.is_some();
            if !state {
                activations.push(layout.dims.clone());
            }
            if a.pos == 0 && a.list.is_none() {
                arg0_state = Some(state);
                arg0_read = Some(reads.len());
            }
            let integer = a.dtype.is_some_and(|d| !d.floating);
            // An integer weight of a known layer op is a quantized
            // parameter; other integer state is a buffer (positions, masks).
            let kind = if buffers.contains(&a.pos)
                || (integer && !known_role)
                || (!known_role && positional_view(&op.name))
            {
                ReadKind::Buffer
            } else {
                ReadKind::Parameter
            };
            let slot = hash_of(&(
                class,
                op.name.as_str(),
                nth_here,
                a.pos,
                a.list,
                &layout.dims,
                dtype,
            ));
            let place = hash_of(&(call_key.0, op.name.as_str(), nth_here, a.pos, a.list));
            reads.push(Read {
                call_key,
                slot,
                place,
                state,
                dims: layout.dims.clone(),
                dtype,
                elem,
                kind,
                in_trace,
                block,
                known_role,
                op_known: known_op,
                data_input: known_op && !known_role,
                co_operand: false,
                op: op.name.clone(),
                arg: a.pos,
                iteration: op.iteration,
                time: op.start,
            });
            if let Some(key) = stacked_key {
                stacked.insert(key, reads.len() - 1);
            }
        }
        for r in reads.get_mut(first_read..).unwrap_or_default() {
            r.co_operand = r.kind != ReadKind::QuantState
                && r.dims.len() >= 2
                && activations
                    .iter()
                    .any(|d| d.len() == r.dims.len() && d.first() == r.dims.first());
        }
        // the op's outputs, when it is a view of its first argument
        if let (Some(is_state), Some(first)) = (
            arg0_state,
            op.args.iter().find(|a| a.pos == 0 && a.list.is_none()),
        ) {
            let other = op
                .args
                .iter()
                .find(|a| a.pos == 1 && a.list.is_none())
                .map(|a| a.layout.dims.as_slice());
            let input = Layout {
                dims: first.layout.dims.clone(),
                strides: if first.layout.strides.len() == first.layout.dims.len() {
                    first.layout.strides.clone()
                } else {
                    contiguous_strides(&first.layout.dims)
                },
            };
            if let Some(outs) = view_outputs(&op.name, &input, &op.concrete, other, op.copied) {
                for out in outs {
                    // An identity (a no-copy `to`, `contiguous`, a `view` to
                    // the same shape) makes no new layout. Within its call a
                    // later read of it is the same tensor: a layer op taking
                    // it as its weight settles what it is (a packed 4-bit
                    // weight whose view a live block of its bytes explained
                    // is still a weight, counted once).
                    let identity = (out == input).then_some(call_key);
                    derived.insert(
                        out,
                        (is_state, first.dtype.map(|d| d.name), arg0_read, identity),
                    );
                }
            }
        }
    }
    classify(reads)
}

/// Consensus over slots, data inputs and early reads, then each instance's
/// largest call.
fn classify(mut reads: Vec<Read>) -> Vec<Found> {
    use std::collections::BTreeSet;
    let state_slots: FxHashSet<u64> = reads.iter().filter(|r| r.state).map(|r| r.slot).collect();
    let iterations: BTreeSet<usize> = reads.iter().map(|r| r.iteration).collect();
    let first_iteration = iterations.first().copied().unwrap_or(0);
    let mut state_iterations: FxHashMap<u64, BTreeSet<usize>> = FxHashMap::default();
    let mut any_iterations: FxHashMap<u64, BTreeSet<usize>> = FxHashMap::default();
    for r in &reads {
        any_iterations
            .entry(r.place)
            .or_default()
            .insert(r.iteration);
        if r.state {
            state_iterations
                .entry(r.place)
                .or_default()
                .insert(r.iteration);
        }
    }
    for r in &mut reads {
        if !state_slots.contains(&r.slot) {
            r.state = false;
            continue;
        }
        r.state = true;
        if r.in_trace {
            continue;
        }
        let early = iterations.len() >= 2
            && state_iterations
                .get(&r.place)
                .is_some_and(|s| s.len() == 1 && s.contains(&first_iteration))
            && any_iterations.get(&r.place).is_some_and(|s| s.len() >= 2);
        if r.kind != ReadKind::QuantState
            && ((r.data_input && r.op_known) || (early && r.co_operand))
        {
            r.kind = ReadKind::Activation;
        }
    }
    // per call multisets, then the largest per instance
    type Key = (Vec<i64>, Option<u32>, ReadKind, bool);
    let mut per_call: BTreeMap<(u32, i64), BTreeMap<Key, Vec<usize>>> = BTreeMap::new();
    for (i, r) in reads.iter().enumerate().filter(|(_, r)| r.state) {
        per_call
            .entry(r.call_key)
            .or_default()
            .entry((r.dims.clone(), r.dtype, r.kind, r.in_trace))
            .or_default()
            .push(i);
    }
    let mut per_instance: BTreeMap<u32, BTreeMap<Key, Vec<usize>>> = BTreeMap::new();
    for ((instance, _), keys) in per_call {
        let slot = per_instance.entry(instance).or_default();
        for (key, idx) in keys {
            let entry = slot.entry(key).or_default();
            if idx.len() > entry.len() {
                *entry = idx;
            }
        }
    }
    let mut last_state_read: FxHashMap<u64, i64> = FxHashMap::default();
    for r in reads.iter().filter(|r| r.state) {
        let slot = last_state_read.entry(r.place).or_insert(r.time);
        *slot = (*slot).max(r.time);
    }
    let mut found = Vec::new();
    for (instance, keys) in per_instance {
        for ((dims, dtype, kind, in_trace), idx) in keys {
            for &i in &idx {
                let Some(r) = reads.get(i) else { continue };
                let numel = dims
                    .iter()
                    .map(|&d| d.max(0).unsigned_abs())
                    .fold(1, u64::saturating_mul);
                let last = last_state_read.get(&r.place).copied().unwrap_or(r.time);
                found.push(Found {
                    instance: (instance != u32::MAX).then_some(instance),
                    dims: dims.clone(),
                    dtype,
                    bytes: numel.saturating_mul(r.elem),
                    kind,
                    in_trace,
                    block: r.block,
                    known_role: r.known_role,
                    op: r.op.clone(),
                    arg: r.arg,
                    first_read: r.time,
                    last_read: last,
                });
            }
        }
    }
    found
}

/// Allocation, copy and bookkeeping ops, and autograd's backward nodes: they
/// never read a model's state as a layer does (a copy's source is read by
/// the op that made it; `as_strided` views of DDP's buckets span whole
/// buckets), so their arguments are not reads.
pub fn is_bookkeeping(op: &str) -> bool {
    const OPS: &[&str] = &[
        "aten::empty",
        "aten::empty_strided",
        "aten::empty_like",
        "aten::as_strided",
        "aten::as_strided_",
        "aten::_to_copy",
        "aten::copy_",
        "aten::resolve_conj",
        "aten::resolve_neg",
        "aten::fill_",
        "aten::zero_",
        "aten::item",
        "aten::_local_scalar_dense",
        "aten::resize_",
        "aten::set_",
        "aten::is_nonzero",
        "aten::result_type",
        // `param.data = t` asks whether t's type fits; no data is read
        "aten::_has_compatible_shallow_copy_type",
    ];
    OPS.contains(&op)
        || ["Backward0", "Backward1", "Backward2"]
            .iter()
            .any(|e| op.ends_with(e))
}

#[cfg(test)]
#[path = "reads_tests.rs"]
mod tests;

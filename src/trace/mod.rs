//! Stage 0 — **trace**: bytes of a `torch.profiler` Chrome trace → typed events.
//!
//! Input: the raw bytes of a `.json` or `.json.gz` file, whole ([`parse`]) or
//! piece by piece from a [`TraceSource`] ([`read`]); gzip is detected by its
//! magic bytes and decoded in pure Rust, so this also runs in WebAssembly.
//! Output: a [`Trace`] holding only what later stages need — `[memory]` events,
//! `cpu_op`, `python_function` and `user_annotation` spans, `fwdbwd` flows and
//! the header flags — plus [`crate::Warning`]s for fields that were missing.
//!
//! Invariants:
//! - This is the only module that knows the profiler's JSON field names.
//! - It reads the input in one pass, piece by piece as it arrives
//!   ([`TraceReader`]), and never holds the whole file, its decompressed text
//!   or a `serde_json::Value` tree: each entry of `traceEvents` is reduced to a
//!   small typed record (names interned) as soon as its last byte arrives.
//! - It never panics on user data: anything that is not a usable trace is a
//!   [`TraceError`] whose message names the capture setting to fix.

mod args;
pub use args::dtype_size;
mod build;
mod checkpoint;
pub use checkpoint::{reentrant_checkpoint_inputs, CHECKPOINT_BACKWARD};
mod capture;
pub use capture::{Capture, CAPTURE_SCHEMA};
mod lists;
pub use lists::{list_element_types, CONCATENATIONS};
mod loose;
mod signatures;
pub use signatures::{quant_state_args, weight_args, ACCUMULATE_GRAD};
mod plain;
mod raw;
mod stream;

pub use stream::{is_bare_list, is_gzip, split_candidate, Gunzip, TracePart, TraceReader};

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::diag::{Warned, Warning};
use crate::units::Nanos;

/// An index into [`Trace::names`] (op, annotation, Python frame and dtype names).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(transparent)]
pub struct NameId(pub u32);

impl NameId {
    /// The position of the name in its table.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// The device a memory event belongs to (`Device Type` in the trace).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    /// `Device Type` 0: host memory through PyTorch's CPU allocator.
    Cpu,
    /// `Device Type` 1: GPU memory through the CUDA caching allocator.
    Cuda,
    /// `Device Type` 6: GPU memory on a ROCm build (HIP), same allocator.
    Hip,
    /// Any other device type code (XPU, MPS, ...), kept as recorded.
    Other(i64),
}

impl Device {
    /// Maps the profiler's `Device Type` code (c10::DeviceType) to a device.
    pub fn from_code(code: i64) -> Device {
        match code {
            0 => Device::Cpu,
            1 => Device::Cuda,
            6 => Device::Hip,
            other => Device::Other(other),
        }
    }
}

impl Device {
    /// CUDA or HIP memory.
    pub fn is_gpu(self) -> bool {
        matches!(self, Device::Cuda | Device::Hip)
    }
}

/// One `[memory]` instant event: an allocation (`bytes > 0`) or a free (`bytes < 0`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryEvent {
    /// When it happened (raw trace clock, nanoseconds).
    pub ts: Nanos,
    /// OS thread id (`tid`), or -1 when it was not an integer.
    pub tid: i64,
    /// Block address (`Addr`).
    pub addr: u64,
    /// Signed size (`Bytes`): positive for an allocation, the negated size for a free.
    pub bytes: i64,
    /// `Total Allocated` after this event as recorded by the profiler, if present.
    pub total_allocated: Option<i64>,
    /// `Total Reserved` after this event, if present (always 0 on CPU).
    pub total_reserved: Option<i64>,
    /// `Device Type`; CPU when the field is missing (with a warning).
    pub device: Device,
    /// `Device Id` (-1 on CPU), if present.
    pub device_id: Option<i64>,
}

/// One `cpu_op` span: an ATen operator, autograd node or C++ `record_function`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpEvent {
    pub name: NameId,
    pub tid: i64,
    pub start: Nanos,
    pub dur: Nanos,
    /// `External id`, if present.
    pub external_id: Option<i64>,
    /// Autograd `Sequence number`: equal on a forward op and the backward node it made.
    pub sequence_number: Option<i64>,
    /// `Fwd thread id`: 0 on forward ops, the forward thread's id on backward ops.
    pub fwd_thread_id: Option<i64>,
    /// Its tensor arguments (`Input Dims`, `Input type`, `Input Strides`): a
    /// range of [`OpArgs::tensors`] (see [`Trace::tensor_args`]); empty for
    /// the ops [`ARGS_KEPT`] drops and without `record_shapes`.
    #[serde(default)]
    pub tensors: Span,
    /// Its integer `Concrete Inputs`: a range of [`OpArgs::concrete`], kept
    /// for view ops only (their dims and sizes).
    #[serde(default)]
    pub concrete: Span,
    /// When the first argument of `Input Dims` is a tensor list, its length.
    /// Kept only for `aten::stack` and `aten::cat`, with which a data
    /// loader's collate function stacks one tensor per sample.
    #[serde(default)]
    pub tensor_list_len: Option<u32>,
    /// Its tensor arguments, from `Input Dims` and `Input type` (the
    /// autocast rules follow dtypes from op to op with them): a range of
    /// [`Trace::tensor_args`] (one array for all ops, not one per op).
    #[serde(default)]
    pub tensor_args: std::ops::Range<u32>,
}

/// One tensor argument of an op: its element count and element type. A
/// tensor list gives one entry per element, with `in_list` set and no dtype
/// (the profiler names the whole list `TensorList`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorInput {
    pub numel: u64,
    pub dtype: Option<Dtype>,
    pub in_list: bool,
}

/// A tensor element type as `Input type` names it, coarsely: the floating
/// types autocast deals with, and everything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    /// `float`
    F32,
    /// `c10::BFloat16`
    Bf16,
    /// `c10::Half`
    F16,
    /// `double`
    F64,
    /// Integers, booleans, complex and 8-bit float types: autocast leaves them.
    NonFloat,
}

impl Dtype {
    /// The dtype of a tensor argument's `Input type`, `None` for what is not
    /// a tensor (`Scalar`, `ScalarList`, `TensorList`, `""`, ...).
    pub fn from_name(name: &str) -> Option<Dtype> {
        Some(match name {
            "float" => Dtype::F32,
            "c10::BFloat16" => Dtype::Bf16,
            "c10::Half" => Dtype::F16,
            "double" => Dtype::F64,
            "long int"
            | "int"
            | "short int"
            | "signed char"
            | "unsigned char"
            | "bool"
            | "long long int"
            | "unsigned int"
            | "unsigned long"
            | "unsigned short"
            | "c10::complex<float>"
            | "c10::complex<double>"
            | "c10::complex<c10::Half>"
            | "c10::Float8_e4m3fn"
            | "c10::Float8_e5m2"
            | "c10::Float8_e4m3fnuz"
            | "c10::Float8_e5m2fnuz" => Dtype::NonFloat,
            _ => return None,
        })
    }

    /// Bytes per element of the floating types, `None` for the others.
    pub const fn size(self) -> Option<u64> {
        match self {
            Dtype::F32 => Some(4),
            Dtype::Bf16 | Dtype::F16 => Some(2),
            Dtype::F64 => Some(8),
            Dtype::NonFloat => None,
        }
    }

    /// bf16 or fp16: the types autocast casts down to.
    pub const fn is_lower(self) -> bool {
        matches!(self, Dtype::Bf16 | Dtype::F16)
    }

    /// fp32, bf16 or fp16: what autocast casts (it leaves double alone).
    pub const fn is_castable(self) -> bool {
        matches!(self, Dtype::F32 | Dtype::Bf16 | Dtype::F16)
    }

    /// The floating type PyTorch's type promotion gives two: the wider;
    /// fp32 for bf16 with fp16; a non-float type yields to the other.
    pub fn promote(self, other: Dtype) -> Dtype {
        match (self, other) {
            (Dtype::NonFloat, x) | (x, Dtype::NonFloat) => x,
            (a, b) if a == b => a,
            (Dtype::F64, _) | (_, Dtype::F64) => Dtype::F64,
            _ => Dtype::F32,
        }
    }
}

/// One `user_annotation` span (`record_function`): `ProfilerStep#N`, optimizer, DataLoader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnnotationEvent {
    pub name: NameId,
    pub tid: i64,
    pub start: Nanos,
    pub dur: Nanos,
}

/// One `python_function` span (a Python call, from `with_stack=True`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PythonEvent {
    pub name: NameId,
    pub tid: i64,
    pub start: Nanos,
    pub dur: Nanos,
    /// `Python id` of this frame.
    pub id: Option<i64>,
    /// `Python id` of the calling frame; `None` on the root.
    pub parent_id: Option<i64>,
    /// `Python module id` on `nn.Module: <Class>_<k>` frames.
    pub module_id: Option<i64>,
}

/// One end of a `fwdbwd` flow (forward op → backward node).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowEvent {
    /// The flow `id` shared by its start and end.
    pub id: i64,
    pub tid: i64,
    pub ts: Nanos,
    /// `true` for the start (`ph: "s"`, on the forward op), `false` for the end (`"f"`).
    pub is_start: bool,
}

/// Header fields of the trace object; every one is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceHeader {
    pub schema_version: Option<i64>,
    /// Profiler flags as recorded (`with_stack`, `profile_memory`, `record_shapes`).
    pub with_stack: Option<bool>,
    pub profile_memory: Option<bool>,
    pub record_shapes: Option<bool>,
    /// `baseTimeNanoseconds`: Unix epoch of trace time 0.
    pub base_time_ns: Option<i64>,
    /// Number of entries in `deviceProperties` (GPUs; 0 on a CPU run).
    pub n_gpu_devices: usize,
    /// `traceName`, if present.
    pub trace_name: Option<String>,
    /// `distributedInfo`: written by the profiler of a process in an
    /// initialised `torch.distributed` process group.
    #[serde(default)]
    pub distributed: Option<DistributedInfo>,
    /// `memcast`: what memcast's capture helper recorded and the full job
    /// the trace stands for ([`Capture`]).
    #[serde(default)]
    pub capture: Option<Box<Capture>>,
}

/// The process group a trace's process belonged to (`distributedInfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DistributedInfo {
    /// `backend`: `gloo` (CPU), `nccl` (CUDA), ...
    pub backend: Option<String>,
    pub rank: Option<i64>,
    pub world_size: Option<i64>,
}

/// A range of an arena: `len` items from `start`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Span {
    pub start: u32,
    pub len: u32,
}

impl Span {
    /// The range as indices.
    pub fn range(self) -> std::ops::Range<usize> {
        let start = self.start as usize;
        start..start.saturating_add(self.len as usize)
    }
}

/// One tensor argument of an op as `record_shapes` wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorArg {
    /// The argument's position in the op's signature.
    pub position: u16,
    /// Its position in a `TensorList` argument.
    pub list_index: Option<u16>,
    /// The dtype name (`float`, `long int`, `c10::BFloat16`, ...); `None` for
    /// a tensor-list element, for which the profiler records none.
    pub dtype: Option<NameId>,
    /// Its dims, in [`OpArgs::numbers`].
    pub dims: Span,
    /// Its strides, when recorded with as many entries as dims.
    pub strides: Option<Span>,
}

/// An integer (or a list of integers) `Concrete Inputs` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConcreteArg {
    pub position: u16,
    /// The value(s), in [`OpArgs::numbers`].
    pub values: Span,
    /// Written as a list (`"[2, 2]"`), not a single integer.
    pub list: bool,
}

/// The tensor arguments and concrete values of every op, in three arenas
/// ([`OpEvent::tensors`] and [`OpEvent::concrete`] are ranges of them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpArgs {
    pub tensors: Vec<TensorArg>,
    pub concrete: Vec<ConcreteArg>,
    /// Dims, strides and concrete values.
    pub numbers: Vec<i64>,
}

impl OpArgs {
    /// The numbers of a span (empty when out of range).
    pub fn slice(&self, span: Span) -> &[i64] {
        self.numbers.get(span.range()).unwrap_or_default()
    }
}

/// A parsed trace: only the events later stages need, names interned.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trace {
    pub header: TraceHeader,
    /// Interned names; [`NameId`] indexes here.
    pub names: Vec<String>,
    /// `[memory]` events sorted by time (stable: ties keep file order).
    pub memory: Vec<MemoryEvent>,
    /// `cpu_op` spans in file order.
    pub ops: Vec<OpEvent>,
    /// `user_annotation` spans in file order.
    pub annotations: Vec<AnnotationEvent>,
    /// `python_function` spans in file order.
    pub python: Vec<PythonEvent>,
    /// `fwdbwd` flow ends in file order.
    pub flows: Vec<FlowEvent>,
    /// The tensor arguments of all ops, each op's a range
    /// ([`OpEvent::tensor_args`]).
    #[serde(default)]
    pub tensor_args: Vec<TensorInput>,
    /// The ops' tensor arguments and concrete values.
    #[serde(default)]
    pub op_args: OpArgs,
    /// Number of device-side GPU events (`kernel`, `gpu_memcpy`, `gpu_memset`,
    /// `gpu_user_annotation`); the host's CUDA API calls are not counted.
    pub n_gpu_events: usize,
    /// Number of entries in `traceEvents`, kept or not.
    pub n_events: usize,
}

impl Trace {
    /// The tensor arguments of `op` (none for an op of another trace).
    pub fn tensor_args_of(&self, op: &OpEvent) -> &[TensorInput] {
        let range = op.tensor_args.start as usize..op.tensor_args.end as usize;
        self.tensor_args.get(range).unwrap_or(&[])
    }

    /// The name behind an id (empty for an id from another trace).
    pub fn name(&self, id: NameId) -> &str {
        self.names.get(id.index()).map_or("", String::as_str)
    }

    /// The tensor arguments of an op, in argument order.
    pub fn tensor_args(&self, op: &OpEvent) -> &[TensorArg] {
        self.op_args
            .tensors
            .get(op.tensors.range())
            .unwrap_or_default()
    }

    /// The integer concrete values of an op (view ops, and the flags of
    /// [`FLAG_OPS`]).
    pub fn concrete_args(&self, op: &OpEvent) -> &[ConcreteArg] {
        self.op_args
            .concrete
            .get(op.concrete.range())
            .unwrap_or_default()
    }

    /// The numbers of a span of [`OpArgs::numbers`].
    pub fn numbers(&self, span: Span) -> &[i64] {
        self.op_args.slice(span)
    }

    /// Whether the job ran on a GPU (CUDA or ROCm): GPU memory events or
    /// GPU-side events (kernels, copies). The header's `deviceProperties`
    /// alone is not evidence: the profiler lists every GPU the machine has,
    /// also for a job that ran on the CPU with `activities=[CPU]` (seen on
    /// an H200 machine with torch 2.11: 3,728 CPU [memory] events, none on
    /// the GPU).
    pub fn recorded_on_cuda(&self) -> bool {
        self.n_gpu_events > 0 || self.memory.iter().any(|m| m.device.is_gpu())
    }
}

/// Which ops keep their arguments while the trace is read. Every op keeps
/// its tensor arguments: the analyzer's `resident` module reads the forward
/// ops' (a model's state), `AccumulateGrad`'s give parameter shapes, and the
/// autocast rules follow dtypes from op to op, casts and backward nodes
/// included. Concrete values are kept for view ops only (their dims). A test
/// in the analyzer checks this list against what it reads; the analyzer
/// checks op names itself and never relies on this filter for correctness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArgsKept {
    /// Ops with one of these names drop their tensor arguments.
    pub no_shapes_of_ops: &'static [&'static str],
    /// Ops whose name ends with one of these drop them too (backward nodes).
    pub no_shapes_of_ops_ending: &'static [&'static str],
    /// Ops with one of these names keep their integer concrete values.
    pub concrete_of_ops: &'static [&'static str],
    /// Ops with one of these names also keep their boolean and floating
    /// concrete values ([`FLAG_OPS`]).
    pub flags_of_ops: &'static [&'static str],
}

/// The ops whose arguments the reader keeps (see [`ArgsKept`]).
pub const ARGS_KEPT: ArgsKept = ArgsKept {
    no_shapes_of_ops: &[],
    no_shapes_of_ops_ending: &[],
    concrete_of_ops: VIEW_OPS,
    flags_of_ops: FLAG_OPS,
};

/// Ops whose `Concrete Inputs` decide which CUDA kernel runs and what it
/// allocates, kept as integers: integers and integer lists as they are,
/// `True`/`False` as 1/0, a floating value in millionths (`0.1` → 100000).
/// `scaled_dot_product_attention` (query, key, value, attn_mask, dropout_p,
/// is_causal, scale, enable_gqa): its dropout probability and causal flag
/// choose the CUDA attention backend; `sum` and `mean` (self, dim, keepdim,
/// dtype): the dims reduced size a CUDA reduction's global buffer; `topk`
/// (self, k, dim, largest, sorted): a mixture of experts' router's k, the
/// experts each token is sent to (`--seq-len` grows the routed rows).
pub const FLAG_OPS: &[&str] = &[
    "aten::scaled_dot_product_attention",
    "aten::sum",
    "aten::mean",
    "aten::topk",
];

/// The op names that return a view of (or the very tensor of) their first
/// argument, at least when they do not copy. The reader keeps their integer
/// concrete values ([`ARGS_KEPT`]: the dims of a `view`, the dims of a
/// `transpose`), which is all the analyzer's resident state needs to follow a
/// view back to its input (`analyzer::resident::views`, which uses this list).
pub const VIEW_OPS: &[&str] = &[
    "aten::t",
    "aten::transpose",
    "aten::swapaxes",
    "aten::permute",
    "aten::movedim",
    "aten::numpy_T",
    "aten::mT",
    "aten::view",
    "aten::_unsafe_view",
    "aten::reshape",
    "aten::view_as",
    "aten::reshape_as",
    "aten::flatten",
    "aten::unflatten",
    "aten::expand",
    "aten::expand_as",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::slice",
    "aten::narrow",
    "aten::select",
    "aten::unbind",
    "aten::split",
    "aten::split_with_sizes",
    "aten::chunk",
    "aten::alias",
    "aten::detach",
    "aten::detach_",
    "aten::lift_fresh",
    "aten::to",
    "aten::type_as",
    "aten::contiguous",
    "aten::requires_grad_",
];

impl ArgsKept {
    /// Whether an op of this name keeps its tensor arguments.
    pub fn keeps_shapes(&self, op: &str) -> bool {
        !self.no_shapes_of_ops.contains(&op)
            && !self
                .no_shapes_of_ops_ending
                .iter()
                .any(|end| op.ends_with(end))
    }

    /// Whether an op of this name keeps its integer concrete values.
    pub fn keeps_concrete(&self, op: &str) -> bool {
        self.concrete_of_ops.contains(&op) || self.flags_of_ops.contains(&op)
    }

    /// Whether an op of this name also keeps its boolean and floating
    /// concrete values (as [`FLAG_OPS`] says).
    pub fn keeps_flags(&self, op: &str) -> bool {
        self.flags_of_ops.contains(&op)
    }
}

/// The most bytes a gzip trace may decompress to. Past it the file is refused
/// as [`TraceError::GzipTooLarge`] instead of exhausting memory (a "gzip
/// bomb" of a few MB can expand to many GB). Real traces of a few profiled
/// steps are tens of MB; 2 GiB is also about what a 32-bit WebAssembly worker
/// can hold next to the parsed events, so the browser and the CLI agree.
pub const MAX_DECOMPRESSED_BYTES: u64 = 2 << 30;

/// The largest size one `[memory]` event may record, 2^50 bytes (1 PiB): no
/// device has that much memory, so a bigger value is a corrupt number, refused
/// as [`TraceError::MemorySizeOutOfRange`] rather than estimated.
pub const MAX_EVENT_BYTES: u64 = 1 << 50;

/// Why bytes could not be read as a profiler trace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    #[error(
        "cannot read the file: {0}; check that it is still there and readable, then try again"
    )]
    Read(String),
    #[error("the file is empty: export the trace again with prof.export_chrome_trace(path) after the profiler has stopped")]
    Empty,
    #[error("the file is neither JSON nor gzip-compressed JSON: pass the file written by prof.export_chrome_trace (.json or .json.gz), not {0}")]
    NotJson(String),
    #[error("the gzip data is truncated: the file was cut off while copying or writing; copy it again (gzip -t checks it)")]
    TruncatedGzip,
    #[error("the gzip data expands to more than {limit} bytes, the most memcast reads: pass a trace of fewer profiled steps (schedule(active=3)) or check that this is really a profiler trace")]
    GzipTooLarge { limit: u64 },
    #[error("the gzip data is corrupt: copy the trace again; decoder said {0:?}")]
    CorruptGzip(String),
    #[error("the trace is truncated at line {line}, column {column}: the export did not finish or the file was cut off; export it again and wait until prof.export_chrome_trace returns")]
    Truncated { line: usize, column: usize },
    #[error("the file is not valid JSON at line {line}, column {column}: export the trace again with prof.export_chrome_trace; parser said {message:?}")]
    InvalidJson {
        line: usize,
        column: usize,
        message: String,
    },
    #[error("the JSON is not a torch.profiler trace (no \"traceEvents\" list): pass the file written by prof.export_chrome_trace; found {0:?}")]
    NotAProfilerTrace(String),
    #[error("the trace's {0} [memory] events have no \"Addr\", so allocations cannot be paired with their frees (PyTorch before 1.10 did not record it): profile again with a recent PyTorch and torch.profiler.profile(profile_memory=True)")]
    MemoryEventsWithoutAddress(usize),
    #[error("a [memory] event records {0} bytes, more than any device holds (the limit is 2^50 bytes): the number is corrupt; export the trace again")]
    MemorySizeOutOfRange(i64),
    #[error("the trace has no [memory] events: profile with torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True) and export again")]
    NoMemoryEvents,
}

/// Where a trace's bytes come from, piece by piece: a file read by the CLI,
/// slices of a browser `Blob` read by the worker, or bytes in memory. The
/// reading itself happens in the shells; the core only asks for the next piece.
pub trait TraceSource {
    /// The size of the whole input in bytes, if known (for progress).
    fn size_hint(&self) -> Option<u64>;
    /// The next piece of the input, or `None` at its end.
    fn next_chunk(&mut self) -> Result<Option<&[u8]>, TraceError>;
    /// The whole trace already read, for a shell that can read parts of the
    /// file at once on several threads ([`TraceReader::continuing`]); asked
    /// before any piece. `None` (the default): read the pieces.
    fn parsed(&mut self) -> Option<Result<Warned<Trace>, TraceError>> {
        None
    }
}

/// Bytes already in memory, handed out as one piece.
#[derive(Debug, Clone, Copy)]
pub struct SliceSource<'a> {
    bytes: Option<&'a [u8]>,
    len: u64,
}

impl<'a> SliceSource<'a> {
    pub fn new(bytes: &'a [u8]) -> SliceSource<'a> {
        SliceSource {
            bytes: Some(bytes),
            len: bytes.len() as u64,
        }
    }
}

impl TraceSource for SliceSource<'_> {
    fn size_hint(&self) -> Option<u64> {
        Some(self.len)
    }

    fn next_chunk(&mut self) -> Result<Option<&[u8]>, TraceError> {
        Ok(self.bytes.take())
    }
}

/// Parses a `.json` or `.json.gz` profiler trace.
pub fn parse(bytes: &[u8]) -> Result<Warned<Trace>, TraceError> {
    parse_with_progress(bytes, &mut |_, _| {})
}

/// Parses like [`parse`], calling `progress(done, total)` as the input is
/// read (`total` is its length; `done` grows monotonically to `total`).
pub fn parse_with_progress(
    bytes: &[u8],
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Warned<Trace>, TraceError> {
    parse_with_limit(bytes, MAX_DECOMPRESSED_BYTES, progress)
}

/// Parses like [`parse_with_progress`] with another limit than
/// [`MAX_DECOMPRESSED_BYTES`] on what gzip input may expand to.
pub fn parse_with_limit(
    bytes: &[u8],
    max_decompressed_bytes: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Warned<Trace>, TraceError> {
    read_with_limit(
        &mut SliceSource::new(bytes),
        max_decompressed_bytes,
        progress,
    )
}

/// Bytes handed to the reader at a time: about a sixteenth of the input
/// within these bounds, so progress moves on input that arrives in one piece.
const READ_PIECE: (u64, u64) = (64 << 10, 4 << 20);

/// Reads a trace piece by piece from `source`, calling `progress(done,
/// total)` with the input bytes read so far (`total` is the source's size,
/// or `done` when it does not know it).
pub fn read(
    source: &mut dyn TraceSource,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Warned<Trace>, TraceError> {
    read_with_limit(source, MAX_DECOMPRESSED_BYTES, progress)
}

/// Reads like [`read`] with another limit than [`MAX_DECOMPRESSED_BYTES`].
pub fn read_with_limit(
    source: &mut dyn TraceSource,
    max_decompressed_bytes: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Warned<Trace>, TraceError> {
    if let Some(parsed) = source.parsed() {
        let total = source.size_hint().unwrap_or(0);
        progress(total, total);
        return parsed;
    }
    let mut reader = TraceReader::new(max_decompressed_bytes);
    let total = source.size_hint();
    let piece_len = total.map_or(READ_PIECE.1, |t| (t / 16).clamp(READ_PIECE.0, READ_PIECE.1));
    let piece_len = usize::try_from(piece_len).unwrap_or(usize::MAX);
    let mut done = 0u64;
    while let Some(chunk) = source.next_chunk()? {
        for piece in chunk.chunks(piece_len) {
            reader.push(piece)?;
            done += piece.len() as u64;
            progress(done, total.unwrap_or(done).max(done));
        }
    }
    let trace = reader.finish()?;
    progress(done, total.unwrap_or(done).max(done));
    Ok(trace)
}

/// Decompresses gzip input whole, refusing more than
/// [`MAX_DECOMPRESSED_BYTES`] of output; other input comes back as it is.
/// For formats that are read whole (the replay's snapshot pickles): traces
/// are read piece by piece with [`read`], which decompresses as it goes.
/// Both use the same decoder, [`Gunzip`].
pub fn gunzip(bytes: &[u8]) -> Result<Cow<'_, [u8]>, TraceError> {
    if !is_gzip(bytes) {
        return Ok(Cow::Borrowed(bytes));
    }
    let mut out = Vec::new();
    let mut decoder = Gunzip::new(MAX_DECOMPRESSED_BYTES);
    decoder.push(bytes, &mut |text| {
        out.extend_from_slice(text);
        Ok(())
    })?;
    decoder.finish(&mut |text| {
        out.extend_from_slice(text);
        Ok(())
    })?;
    Ok(Cow::Owned(out))
}

/// Helper for warnings about skipped or incomplete events.
pub(crate) fn count_warning(code: &str, count: usize, what: &str) -> Option<Warning> {
    (count > 0).then(|| Warning::new(code, format!("{count} {what}")))
}

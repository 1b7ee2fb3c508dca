//! The serde side of the trace reader: visitors that read one entry of
//! `traceEvents` that the fast path ([`super::plain`]) leaves to them (or one
//! header value), the field names and slots both readers share, and the
//! [`Builder`] that reduces each event to a typed record, without building a
//! `serde_json::Value` tree and without collecting the raw events first.
//! [`super::stream`] finds where each entry starts and ends in the bytes as
//! they arrive.
//!
//! Every visitor is tolerant: a field of an unexpected JSON type is treated as
//! missing (and counted for a warning) instead of failing the whole file.
//!
//! Long file: one hand-written serde visitor per kind of JSON value the
//! profiler writes (tolerant of each field's type), which only make sense
//! together; splitting them would spread one format over several files.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use serde_json::value::RawValue;

use super::args::{read_op_args, RawOpArgs, Scratch};
use super::{
    count_warning, AnnotationEvent, Device, FlowEvent, MemoryEvent, NameId, OpEvent, PythonEvent,
    Span, TensorInput, Trace, TraceError, ARGS_KEPT, MAX_EVENT_BYTES,
};
use crate::diag::{Warned, Warning};
use crate::units::Nanos;

/// Accumulates the typed events while the visitors walk the file.
#[derive(Default)]
pub(super) struct Builder {
    pub(super) trace: Trace,
    interner: HashMap<String, NameId>,
    pub(super) saw_trace_events: bool,
    /// The first top-level keys that are not trace fields, for the message
    /// when there is no `traceEvents`.
    pub(super) top_keys: Vec<String>,
    n_malformed: usize,
    n_memory_incomplete: usize,
    n_memory_no_addr: usize,
    n_memory_no_total: usize,
    n_memory_no_device: usize,
    n_spans_no_ts: usize,
    n_spans_no_dur: usize,
    n_flows_incomplete: usize,
    n_no_tid: usize,
    /// The first `[memory]` size beyond [`MAX_EVENT_BYTES`], if any.
    size_out_of_range: Option<i64>,
    /// The argument parser's reusable buffers.
    scratch: Scratch,
}

impl Builder {
    fn intern(&mut self, name: &str) -> NameId {
        if let Some(&id) = self.interner.get(name) {
            return id;
        }
        let id = NameId(u32::try_from(self.trace.names.len()).unwrap_or(u32::MAX));
        self.trace.names.push(name.to_owned());
        self.interner.insert(name.to_owned(), id);
        id
    }

    /// Appends what `tail` read from the part of the file after this one's:
    /// its names re-interned here, its events after these (file order kept),
    /// its counts added, its header fields where this part had none.
    pub(super) fn append(&mut self, tail: Builder) {
        let names: Vec<NameId> = tail.trace.names.iter().map(|n| self.intern(n)).collect();
        let map = |id: NameId| names.get(id.index()).copied().unwrap_or(id);
        let Trace {
            header,
            names: _,
            memory,
            ops,
            annotations,
            python,
            flows,
            op_args,
            tensor_args,
            n_gpu_events,
            n_events,
        } = tail.trace;
        let mine = &mut self.trace;
        mine.memory.extend(memory);
        let shift = |span: Span, by: usize| Span {
            start: span
                .start
                .saturating_add(u32::try_from(by).unwrap_or(u32::MAX)),
            len: span.len,
        };
        let (n_tensors, n_concrete, n_numbers) = (
            mine.op_args.tensors.len(),
            mine.op_args.concrete.len(),
            mine.op_args.numbers.len(),
        );
        mine.op_args
            .tensors
            .extend(op_args.tensors.into_iter().map(|mut t| {
                t.dtype = t.dtype.map(map);
                t.dims = shift(t.dims, n_numbers);
                t.strides = t.strides.map(|s| shift(s, n_numbers));
                t
            }));
        mine.op_args
            .concrete
            .extend(op_args.concrete.into_iter().map(|mut c| {
                c.values = shift(c.values, n_numbers);
                c
            }));
        mine.op_args.numbers.extend(op_args.numbers);
        let args_shift = u32::try_from(mine.tensor_args.len()).unwrap_or(u32::MAX);
        mine.tensor_args.extend(tensor_args);
        mine.ops.extend(ops.into_iter().map(|mut op| {
            op.name = map(op.name);
            op.tensors = shift(op.tensors, n_tensors);
            op.concrete = shift(op.concrete, n_concrete);
            op.tensor_args = op.tensor_args.start.saturating_add(args_shift)
                ..op.tensor_args.end.saturating_add(args_shift);
            op
        }));
        mine.annotations
            .extend(annotations.into_iter().map(|mut a| {
                a.name = map(a.name);
                a
            }));
        mine.python.extend(python.into_iter().map(|mut p| {
            p.name = map(p.name);
            p
        }));
        mine.flows.extend(flows);
        mine.n_gpu_events += n_gpu_events;
        mine.n_events += n_events;
        let h = &mut mine.header;
        h.schema_version = h.schema_version.or(header.schema_version);
        h.with_stack = h.with_stack.or(header.with_stack);
        h.profile_memory = h.profile_memory.or(header.profile_memory);
        h.record_shapes = h.record_shapes.or(header.record_shapes);
        h.base_time_ns = h.base_time_ns.or(header.base_time_ns);
        h.n_gpu_devices = h.n_gpu_devices.max(header.n_gpu_devices);
        if h.trace_name.is_none() {
            h.trace_name = header.trace_name;
        }
        if h.distributed.is_none() {
            h.distributed = header.distributed;
        }
        self.saw_trace_events |= tail.saw_trace_events;
        for key in tail.top_keys {
            if self.top_keys.len() < 8 {
                self.top_keys.push(key);
            }
        }
        self.n_malformed += tail.n_malformed;
        self.n_memory_incomplete += tail.n_memory_incomplete;
        self.n_memory_no_addr += tail.n_memory_no_addr;
        self.n_memory_no_total += tail.n_memory_no_total;
        self.n_memory_no_device += tail.n_memory_no_device;
        self.n_spans_no_ts += tail.n_spans_no_ts;
        self.n_spans_no_dur += tail.n_spans_no_dur;
        self.n_flows_incomplete += tail.n_flows_incomplete;
        self.n_no_tid += tail.n_no_tid;
        self.size_out_of_range = self.size_out_of_range.or(tail.size_out_of_range);
    }

    /// Ends the reading: refuses what is not a usable trace (no
    /// `traceEvents`, no `[memory]` events, a size out of range), sorts the
    /// memory events by time and turns the counts of skipped or incomplete
    /// events into warnings.
    pub(super) fn finish(mut self) -> Result<Warned<Trace>, TraceError> {
        if let Some(bytes) = self.size_out_of_range {
            return Err(TraceError::MemorySizeOutOfRange(bytes));
        }
        if !self.saw_trace_events {
            let keys = if self.top_keys.is_empty() {
                "an object without keys".to_owned()
            } else {
                format!("an object with keys {}", self.top_keys.join(", "))
            };
            return Err(TraceError::NotAProfilerTrace(keys));
        }
        if self.trace.memory.is_empty() {
            return Err(if self.n_memory_no_addr > 0 {
                TraceError::MemoryEventsWithoutAddress(self.n_memory_no_addr)
            } else {
                TraceError::NoMemoryEvents
            });
        }
        self.trace.memory.sort_by_key(|m| m.ts);
        let warnings: Vec<Warning> = [
            count_warning(
                "malformed_event",
                self.n_malformed,
                "entries of traceEvents were not JSON objects and were skipped",
            ),
            count_warning(
                "incomplete_memory_event",
                self.n_memory_incomplete,
                "[memory] events lacked ts, Addr or Bytes (or had Bytes 0) and were skipped; block sizes near them may be wrong",
            ),
            count_warning(
                "memory_event_without_total",
                self.n_memory_no_total,
                "[memory] events had no \"Total Allocated\"; the running total cannot be checked there",
            ),
            count_warning(
                "memory_event_without_device",
                self.n_memory_no_device,
                "[memory] events had no \"Device Type\" and were taken as CPU",
            ),
            count_warning(
                "span_without_ts",
                self.n_spans_no_ts,
                "spans (cpu_op, python_function, user_annotation) had no ts and were skipped",
            ),
            count_warning(
                "span_without_dur",
                self.n_spans_no_dur,
                "spans had no dur and were taken as instantaneous",
            ),
            count_warning(
                "incomplete_flow",
                self.n_flows_incomplete,
                "fwdbwd flow events lacked id or ts and were skipped",
            ),
            count_warning(
                "event_without_tid",
                self.n_no_tid,
                "kept events had no integer tid and were put on thread -1",
            ),
        ]
        .into_iter()
        .flatten()
        .collect();
        Ok(Warned {
            value: self.trace,
            warnings,
        })
    }

    /// Counts an entry of `traceEvents` that is not a JSON object.
    pub(super) fn add_malformed(&mut self) {
        self.trace.n_events += 1;
        self.n_malformed += 1;
    }

    pub(super) fn add_event(&mut self, ev: RawEvent<'_>) {
        self.trace.n_events += 1;
        let is_memory = ev.name.as_deref() == Some("[memory]");
        if is_memory {
            self.add_memory(&ev);
            return;
        }
        match (ev.ph, ev.cat) {
            (Ph::Complete, Cat::CpuOp | Cat::PythonFunction | Cat::UserAnnotation) => {
                self.add_span(ev);
            }
            (Ph::FlowStart | Ph::FlowEnd, Cat::FwdBwd) => {
                let (Some(id), Some(ts)) = (ev.id, ev.ts) else {
                    self.n_flows_incomplete += 1;
                    return;
                };
                let tid = self.tid(ev.tid);
                self.trace.flows.push(FlowEvent {
                    id,
                    tid,
                    ts: Nanos::from_micros_f64(ts),
                    is_start: ev.ph == Ph::FlowStart,
                });
            }
            (_, Cat::Gpu) => self.trace.n_gpu_events += 1,
            _ => {}
        }
    }

    fn tid(&mut self, tid: Option<i64>) -> i64 {
        match tid {
            Some(tid) => tid,
            None => {
                self.n_no_tid += 1;
                -1
            }
        }
    }

    fn add_memory(&mut self, ev: &RawEvent<'_>) {
        let args = &ev.args;
        if args.addr.is_none() && args.bytes.is_some() {
            self.n_memory_no_addr += 1;
        }
        let (Some(ts), Some(addr), Some(bytes)) = (ev.ts, args.addr, args.bytes) else {
            self.n_memory_incomplete += 1;
            return;
        };
        if bytes == 0 {
            self.n_memory_incomplete += 1;
            return;
        }
        if bytes.unsigned_abs() > MAX_EVENT_BYTES {
            self.size_out_of_range.get_or_insert(bytes);
            return;
        }
        if args.total_allocated.is_none() {
            self.n_memory_no_total += 1;
        }
        let device = match args.device_type {
            Some(code) => Device::from_code(code),
            None => {
                self.n_memory_no_device += 1;
                Device::Cpu
            }
        };
        let tid = self.tid(ev.tid);
        self.trace.memory.push(MemoryEvent {
            ts: Nanos::from_micros_f64(ts),
            tid,
            // Addresses are opaque keys: keep the bit pattern of any integer.
            addr: addr as u64,
            bytes,
            total_allocated: args.total_allocated,
            total_reserved: args.total_reserved,
            device,
            device_id: args.device_id,
        });
    }

    fn add_span(&mut self, ev: RawEvent<'_>) {
        let Some(ts) = ev.ts else {
            self.n_spans_no_ts += 1;
            return;
        };
        let dur = match ev.dur {
            Some(dur) if dur >= 0.0 => dur,
            _ => {
                self.n_spans_no_dur += 1;
                0.0
            }
        };
        let start = Nanos::from_micros_f64(ts);
        let dur = Nanos::from_micros_f64(dur);
        let op_name = ev.name.as_deref().unwrap_or("");
        let name = self.intern(op_name);
        let tid = self.tid(ev.tid);
        let args = ev.args;
        match ev.cat {
            Cat::CpuOp => {
                let keep_concrete = ARGS_KEPT.keeps_concrete(op_name);
                let mut scratch = std::mem::take(&mut self.scratch);
                let mut op_args = std::mem::take(&mut self.trace.op_args);
                let read = read_op_args(
                    args.op_args,
                    keep_concrete,
                    &mut op_args,
                    &mut scratch,
                    &mut |dtype| self.intern(dtype),
                );
                self.trace.op_args = op_args;
                self.scratch = scratch;
                // The autocast rules' view of the same arguments: element
                // count and coarse dtype of each tensor (list elements too).
                let first = u32::try_from(self.trace.tensor_args.len()).unwrap_or(u32::MAX);
                let (from, len) = (read.tensors.start as usize, read.tensors.len as usize);
                let parsed = self
                    .trace
                    .op_args
                    .tensors
                    .get(from..from.saturating_add(len))
                    .unwrap_or_default();
                for t in parsed {
                    let numel = self
                        .trace
                        .op_args
                        .slice(t.dims)
                        .iter()
                        .try_fold(1_u64, |acc, &d| acc.checked_mul(u64::try_from(d).ok()?))
                        .unwrap_or(0);
                    let dtype = t
                        .dtype
                        .and_then(|id| self.trace.names.get(id.index()))
                        .and_then(|n| super::Dtype::from_name(n));
                    if dtype.is_none() && t.list_index.is_none() {
                        continue;
                    }
                    self.trace.tensor_args.push(TensorInput {
                        numel,
                        dtype,
                        in_list: t.list_index.is_some(),
                    });
                }
                let last = u32::try_from(self.trace.tensor_args.len()).unwrap_or(u32::MAX);
                self.trace.ops.push(OpEvent {
                    name,
                    tid,
                    start,
                    dur,
                    external_id: args.external_id,
                    sequence_number: args.sequence_number,
                    fwd_thread_id: args.fwd_thread_id,
                    tensors: read.tensors,
                    concrete: read.concrete,
                    tensor_list_len: read.first_list_len,
                    tensor_args: first..last,
                });
            }
            Cat::PythonFunction => self.trace.python.push(PythonEvent {
                name,
                tid,
                start,
                dur,
                id: args.python_id,
                parent_id: args.python_parent_id,
                module_id: args.python_module_id,
            }),
            Cat::UserAnnotation => self.trace.annotations.push(AnnotationEvent {
                name,
                tid,
                start,
                dur,
            }),
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------
// One event.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ph {
    Complete,
    FlowStart,
    FlowEnd,
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cat {
    CpuOp,
    PythonFunction,
    UserAnnotation,
    FwdBwd,
    /// A GPU-side category: the trace was recorded with CUDA activity.
    Gpu,
    Other,
}

pub(super) fn classify_ph(ph: &[u8]) -> Ph {
    match ph {
        b"X" => Ph::Complete,
        b"s" => Ph::FlowStart,
        b"f" => Ph::FlowEnd,
        _ => Ph::Other,
    }
}

pub(super) fn classify_cat(cat: &[u8]) -> Cat {
    match cat {
        b"cpu_op" => Cat::CpuOp,
        b"python_function" => Cat::PythonFunction,
        b"user_annotation" => Cat::UserAnnotation,
        b"fwdbwd" => Cat::FwdBwd,
        b"kernel"
        | b"gpu_memcpy"
        | b"gpu_memset"
        | b"cuda_runtime"
        | b"cuda_driver"
        | b"gpu_user_annotation"
        | b"ac2g" => Cat::Gpu,
        _ => Cat::Other,
    }
}

#[derive(Debug, PartialEq)]
pub(super) struct RawEvent<'de> {
    pub(super) ph: Ph,
    pub(super) cat: Cat,
    pub(super) name: Option<Cow<'de, str>>,
    pub(super) tid: Option<i64>,
    pub(super) ts: Option<f64>,
    pub(super) dur: Option<f64>,
    pub(super) id: Option<i64>,
    pub(super) args: RawArgs<'de>,
}

impl RawEvent<'_> {
    /// An event with no fields yet.
    pub(super) fn empty() -> Self {
        RawEvent {
            ph: Ph::Other,
            cat: Cat::Other,
            name: None,
            tid: None,
            ts: None,
            dur: None,
            id: None,
            args: RawArgs::default(),
        }
    }
}

/// One entry of `traceEvents`: an event object, or anything else (counted as
/// malformed by the builder).
// One value per entry, on the stack and handed straight to the builder:
// boxing the event would cost an allocation per entry.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, PartialEq)]
pub(super) enum Entry<'de> {
    Event(RawEvent<'de>),
    Malformed,
}

impl<'de> de::Deserialize<'de> for Entry<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(EntryVisitor)
    }
}

struct EntryVisitor;

impl<'de> Visitor<'de> for EntryVisitor {
    type Value = Entry<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a trace event object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entry<'de>, A::Error> {
        let mut ev = RawEvent::empty();
        while let Some(key) = map.next_key::<EventKey>()? {
            match key {
                EventKey::Ph => {
                    ev.ph = map
                        .next_value::<LooseStr<'de>>()?
                        .0
                        .map_or(Ph::Other, |s| classify_ph(s.as_bytes()));
                }
                EventKey::Cat => {
                    ev.cat = map
                        .next_value::<LooseStr<'de>>()?
                        .0
                        .map_or(Cat::Other, |s| classify_cat(s.as_bytes()));
                }
                EventKey::Name => ev.name = map.next_value::<LooseStr<'de>>()?.0,
                EventKey::Tid => ev.tid = map.next_value::<LooseInt>()?.0,
                EventKey::Ts => ev.ts = map.next_value::<LooseF64>()?.0,
                EventKey::Dur => ev.dur = map.next_value::<LooseF64>()?.0,
                EventKey::Id => ev.id = map.next_value::<LooseInt>()?.0,
                EventKey::Args => {
                    // Only some ops' arguments are kept (ARGS_KEPT).
                    map.next_value_seed(ArgsSeed {
                        kept: ArgsKeptFor::event(ev.name.as_deref()),
                        args: &mut ev.args,
                    })?;
                }
                EventKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Entry::Event(ev))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Entry<'de>, A::Error> {
        drain_seq(seq)?;
        Ok(Entry::Malformed)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Entry<'de>, E> {
        Ok(Entry::Malformed)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Entry<'de>, E> {
        Ok(Entry::Malformed)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Entry<'de>, E> {
        Ok(Entry::Malformed)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Entry<'de>, E> {
        Ok(Entry::Malformed)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Entry<'de>, E> {
        Ok(Entry::Malformed)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Entry<'de>, E> {
        Ok(Entry::Malformed)
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) enum EventKey {
    Ph,
    Cat,
    Name,
    Tid,
    Ts,
    Dur,
    Id,
    Args,
    Other,
}

impl EventKey {
    /// The field an event key names.
    pub(super) fn of(key: &[u8]) -> EventKey {
        match key {
            b"ph" => EventKey::Ph,
            b"cat" => EventKey::Cat,
            b"name" => EventKey::Name,
            b"tid" => EventKey::Tid,
            b"ts" => EventKey::Ts,
            b"dur" => EventKey::Dur,
            b"id" => EventKey::Id,
            b"args" => EventKey::Args,
            _ => EventKey::Other,
        }
    }
}

impl<'de> de::Deserialize<'de> for EventKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = EventKey;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an event field name")
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<EventKey, E> {
                Ok(EventKey::of(key.as_bytes()))
            }
        }
        deserializer.deserialize_identifier(KeyVisitor)
    }
}

// ---------------------------------------------------------------------------
// `args`.

/// Which argument fields an event keeps ([`ARGS_KEPT`] for its name).
#[derive(Debug, Clone, Copy)]
pub(super) struct ArgsKeptFor {
    shapes: bool,
    concrete: bool,
}

impl ArgsKeptFor {
    /// For an event of this name. The exporter writes `name` before `args`;
    /// if it did not, everything is kept to be safe.
    pub(super) fn event(name: Option<&str>) -> Self {
        ArgsKeptFor {
            shapes: name.is_none_or(|name| ARGS_KEPT.keeps_shapes(name)),
            concrete: name.is_none_or(|name| ARGS_KEPT.keeps_concrete(name)),
        }
    }
}

impl RawArgs<'_> {
    /// The integer field an `args` key fills, if it is one.
    pub(super) fn int_slot(&mut self, key: ArgKey) -> Option<&mut Option<i64>> {
        Some(match key {
            ArgKey::Addr => &mut self.addr,
            ArgKey::Bytes => &mut self.bytes,
            ArgKey::TotalAllocated => &mut self.total_allocated,
            ArgKey::TotalReserved => &mut self.total_reserved,
            ArgKey::DeviceType => &mut self.device_type,
            ArgKey::DeviceId => &mut self.device_id,
            ArgKey::ExternalId => &mut self.external_id,
            ArgKey::SequenceNumber => &mut self.sequence_number,
            ArgKey::FwdThreadId => &mut self.fwd_thread_id,
            ArgKey::PythonId => &mut self.python_id,
            ArgKey::PythonParentId => &mut self.python_parent_id,
            ArgKey::PythonModuleId => &mut self.python_module_id,
            ArgKey::InputDims
            | ArgKey::InputType
            | ArgKey::InputStrides
            | ArgKey::ConcreteInputs
            | ArgKey::Other => return None,
        })
    }
}

impl<'de> RawOpArgs<'de> {
    /// The raw-text field an `args` key fills when `kept` keeps it.
    pub(super) fn raw_slot(
        &mut self,
        key: ArgKey,
        kept: ArgsKeptFor,
    ) -> Option<&mut Option<&'de [u8]>> {
        match key {
            ArgKey::InputDims if kept.shapes => Some(&mut self.dims),
            ArgKey::InputType if kept.shapes => Some(&mut self.types),
            ArgKey::InputStrides if kept.shapes => Some(&mut self.strides),
            ArgKey::ConcreteInputs if kept.concrete => Some(&mut self.concrete),
            _ => None,
        }
    }
}

#[derive(Debug, Default, PartialEq)]
pub(super) struct RawArgs<'de> {
    pub(super) addr: Option<i64>,
    pub(super) bytes: Option<i64>,
    pub(super) total_allocated: Option<i64>,
    pub(super) total_reserved: Option<i64>,
    pub(super) device_type: Option<i64>,
    pub(super) device_id: Option<i64>,
    pub(super) external_id: Option<i64>,
    pub(super) sequence_number: Option<i64>,
    pub(super) fwd_thread_id: Option<i64>,
    pub(super) python_id: Option<i64>,
    pub(super) python_parent_id: Option<i64>,
    pub(super) python_module_id: Option<i64>,
    pub(super) op_args: RawOpArgs<'de>,
}

/// Reads `args` into the event's record; anything but an object is ignored.
struct ArgsSeed<'a, 'de> {
    kept: ArgsKeptFor,
    args: &'a mut RawArgs<'de>,
}

impl<'de> DeserializeSeed<'de> for ArgsSeed<'_, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ArgsSeed<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an args object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let args = self.args;
        let kept = self.kept;
        while let Some(key) = map.next_key::<ArgKey>()? {
            if let Some(slot) = args.int_slot(key) {
                *slot = map.next_value::<LooseInt>()?.0;
            } else if let Some(slot) = args.op_args.raw_slot(key, kept) {
                *slot = Some(map.next_value::<&'de RawValue>()?.get().as_bytes());
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        drain_seq(seq)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) enum ArgKey {
    Addr,
    Bytes,
    TotalAllocated,
    TotalReserved,
    DeviceType,
    DeviceId,
    ExternalId,
    SequenceNumber,
    FwdThreadId,
    PythonId,
    PythonParentId,
    PythonModuleId,
    InputDims,
    InputType,
    InputStrides,
    ConcreteInputs,
    Other,
}

impl ArgKey {
    /// The field an `args` key names.
    pub(super) fn of(key: &[u8]) -> ArgKey {
        match key {
            b"Addr" => ArgKey::Addr,
            b"Bytes" => ArgKey::Bytes,
            b"Total Allocated" => ArgKey::TotalAllocated,
            b"Total Reserved" => ArgKey::TotalReserved,
            b"Device Type" => ArgKey::DeviceType,
            b"Device Id" => ArgKey::DeviceId,
            b"External id" => ArgKey::ExternalId,
            b"Sequence number" => ArgKey::SequenceNumber,
            b"Fwd thread id" => ArgKey::FwdThreadId,
            b"Python id" => ArgKey::PythonId,
            b"Python parent id" => ArgKey::PythonParentId,
            b"Python module id" => ArgKey::PythonModuleId,
            b"Input Dims" => ArgKey::InputDims,
            b"Input type" => ArgKey::InputType,
            b"Input Strides" => ArgKey::InputStrides,
            b"Concrete Inputs" => ArgKey::ConcreteInputs,
            _ => ArgKey::Other,
        }
    }
}

impl<'de> de::Deserialize<'de> for ArgKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = ArgKey;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an args field name")
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<ArgKey, E> {
                Ok(ArgKey::of(key.as_bytes()))
            }
        }
        deserializer.deserialize_identifier(KeyVisitor)
    }
}

// ---------------------------------------------------------------------------
// Tolerant scalar readers: a value of an unexpected type reads as `None`.

fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Implements the visit methods of a tolerant visitor that maps every JSON
/// type it does not list to `None`.
macro_rules! none_for_other_types {
    () => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            drain_seq(seq)?;
            Ok(Default::default())
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            drain_map(map)?;
            Ok(Default::default())
        }
    };
}

/// A string, borrowed from the input when it has no escapes.
#[derive(Default)]
pub(super) struct LooseStr<'de>(pub(super) Option<Cow<'de, str>>);

impl<'de> de::Deserialize<'de> for LooseStr<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LooseStr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(LooseStr(Some(Cow::Borrowed(s))))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(LooseStr(Some(Cow::Owned(s.to_owned()))))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
                Ok(LooseStr(Some(Cow::Owned(s))))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(LooseStr(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(LooseStr(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(LooseStr(None))
            }
            none_for_other_types!();
        }
        deserializer.deserialize_any(V)
    }
}

/// A float that is a whole number, as an integer (`as` saturates the
/// out-of-range ones).
pub(super) fn integral(v: f64) -> Option<i64> {
    (v.is_finite() && v.fract() == 0.0).then_some(v as i64)
}

/// An integer; integral floats, booleans and numeric strings are accepted too.
/// Integers above `i64::MAX` keep their bit pattern (addresses are opaque).
#[derive(Default)]
pub(super) struct LooseInt(pub(super) Option<i64>);

impl<'de> de::Deserialize<'de> for LooseInt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LooseInt;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an integer")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(LooseInt(Some(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(LooseInt(Some(v as i64)))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(LooseInt(integral(v)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(LooseInt(s.trim().parse().ok()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
                Ok(LooseInt(Some(i64::from(v))))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(LooseInt(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                drain_seq(seq)?;
                Ok(LooseInt(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                drain_map(map)?;
                Ok(LooseInt(None))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A finite number; numeric strings are accepted too.
#[derive(Default)]
pub(super) struct LooseF64(pub(super) Option<f64>);

impl<'de> de::Deserialize<'de> for LooseF64 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LooseF64;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(LooseF64(Some(v as f64)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(LooseF64(Some(v as f64)))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(LooseF64(v.is_finite().then_some(v)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(LooseF64(
                    s.trim().parse().ok().filter(|v: &f64| v.is_finite()),
                ))
            }
            none_for_other_types!();
        }
        deserializer.deserialize_any(V)
    }
}

/// Counts the entries of a list (for `deviceProperties`).
#[derive(Default)]
pub(super) struct CountSeq(pub(super) usize);

impl<'de> de::Deserialize<'de> for CountSeq {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CountSeq;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut n = 0;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(CountSeq(n))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                drain_map(map)?;
                Ok(CountSeq(0))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(CountSeq(0))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(CountSeq(0))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(CountSeq(0))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(CountSeq(0))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(CountSeq(0))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(CountSeq(0))
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The autocast rules' view of an op's arguments comes from the same
    /// parse: element counts and dtypes of tensors, list elements without a
    /// dtype, scalars and odd entries left out.
    #[test]
    fn tensor_args_count_elements_and_keep_list_elements() {
        let json = r#"{"traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": "aten::cat", "pid": 1, "tid": 1, "ts": 1, "dur": 1,
             "args": {"Input Dims": [[2, 3], [], [[1, 4], [2]], 5, "x", [[1], 2]],
                      "Input type": ["c10::BFloat16", "Scalar", "TensorList", "", "float", 3]}},
            {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 2,
             "args": {"Addr": 1, "Bytes": 8, "Total Allocated": 8, "Total Reserved": 8,
                      "Device Type": 0, "Device Id": -1}}]}"#;
        let trace = crate::trace::parse(json.as_bytes()).unwrap().value;
        let op = trace.ops.first().unwrap();
        assert_eq!(
            trace.tensor_args_of(op),
            [
                TensorInput {
                    numel: 6,
                    dtype: Some(crate::trace::Dtype::Bf16),
                    in_list: false
                },
                TensorInput {
                    numel: 4,
                    dtype: None,
                    in_list: true
                },
                TensorInput {
                    numel: 2,
                    dtype: None,
                    in_list: true
                },
            ]
        );
    }

    fn parse_one<T: de::DeserializeOwned>(json: &str) -> T {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn loose_numbers_accept_what_exporters_write() {
        assert_eq!(parse_one::<LooseInt>("12").0, Some(12));
        assert_eq!(parse_one::<LooseInt>("-3").0, Some(-3));
        assert_eq!(parse_one::<LooseInt>("4.0").0, Some(4));
        assert_eq!(parse_one::<LooseInt>("4.5").0, None);
        assert_eq!(parse_one::<LooseInt>("\"77\"").0, Some(77));
        assert_eq!(parse_one::<LooseInt>("true").0, Some(1));
        assert_eq!(parse_one::<LooseInt>("null").0, None);
        assert_eq!(parse_one::<LooseInt>("[1, 2]").0, None);
        assert_eq!(parse_one::<LooseInt>("18446744073709551615").0, Some(-1));
        assert_eq!(parse_one::<LooseF64>("\"1.5\"").0, Some(1.5));
        assert_eq!(parse_one::<LooseF64>("{}").0, None);
    }

    #[test]
    fn op_arguments_are_read_from_the_raw_json() {
        let json = r#"{"traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 1, "dur": 2,
             "args": {"Concrete Inputs": ["", "", ""], "Input type": ["float", "float", "float"],
                      "Input Strides": [[64, 1], [64, 1], [1]], "Input Dims": [[2, 64], [10, 64], [10]]}},
            {"ph": "X", "cat": "cpu_op", "name": "aten::view", "ts": 4, "dur": 1,
             "args": {"Concrete Inputs": ["", "[2, -1]"], "Input type": ["float", "ScalarList"],
                      "Input Strides": [[1], []], "Input Dims": [[20], []]}},
            {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": 6, "dur": 1,
             "args": {"Input type": ["ScalarList"], "Input Dims": [[]]}},
            {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 1, "args": {"Addr": 1, "Bytes": 8}}
        ]}"#;
        let trace = crate::trace::parse(json.as_bytes()).unwrap().value;
        let linear = &trace.ops[0];
        let args = trace.tensor_args(linear);
        assert_eq!(args.len(), 3);
        assert_eq!(trace.numbers(args[1].dims), &[10, 64]);
        assert_eq!(
            args[1].strides.map(|s| trace.numbers(s).to_vec()),
            Some(vec![64, 1])
        );
        assert_eq!(trace.name(args[2].dtype.unwrap()), "float");
        // concrete values only for view ops
        assert!(trace.concrete_args(linear).is_empty());
        let view = trace.concrete_args(&trace.ops[1]);
        assert_eq!(view.len(), 1);
        assert_eq!(trace.numbers(view[0].values), &[2, -1]);
        assert!(trace.tensor_args(&trace.ops[2]).is_empty());
    }

    #[test]
    fn sizes_beyond_the_limit_are_refused() {
        for bytes in ["1e30", "-1e30", "1125899906842625", "9223372036854775808"] {
            let json = format!(
                r#"{{"traceEvents": [{{"ph": "i", "name": "[memory]", "ts": 1, "args": {{"Addr": 1, "Bytes": {bytes}}}}}]}}"#
            );
            let err = crate::trace::parse(json.as_bytes()).unwrap_err();
            assert!(
                matches!(err, TraceError::MemorySizeOutOfRange(_)),
                "{bytes}: {err:?}"
            );
        }
        // Exactly at the limit is still a size.
        let json = format!(
            r#"{{"traceEvents": [{{"ph": "i", "name": "[memory]", "ts": 1, "args": {{"Addr": 1, "Bytes": {MAX_EVENT_BYTES}}}}}]}}"#
        );
        let parsed = crate::trace::parse(json.as_bytes());
        assert!(parsed.is_ok(), "{parsed:?}");
    }
}

/// `distributedInfo`: the process group's backend, rank and world size; any
/// other shape is ignored (`None`).
#[derive(Default)]
pub(super) struct LooseDistributed(pub(super) Option<super::DistributedInfo>);

impl<'de> de::Deserialize<'de> for LooseDistributed {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LooseDistributed;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut info = super::DistributedInfo::default();
                while let Some(key) = map.next_key::<LooseStr<'de>>()? {
                    match key.0.as_deref() {
                        Some("backend") => {
                            info.backend =
                                map.next_value::<LooseStr<'de>>()?.0.map(Cow::into_owned);
                        }
                        Some("rank") => info.rank = map.next_value::<LooseInt>()?.0,
                        Some("world_size") => info.world_size = map.next_value::<LooseInt>()?.0,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(LooseDistributed(Some(info)))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(LooseDistributed(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(LooseDistributed(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                drain_seq(seq)?;
                Ok(LooseDistributed(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(LooseDistributed(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(LooseDistributed(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(LooseDistributed(None))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(LooseDistributed(None))
            }
        }
        deserializer.deserialize_any(V)
    }
}

//! The builder of the typed [`Trace`]: each event the readers hand over (the
//! fast path, [`super::plain`], or the serde visitors, [`super::raw`]) is
//! reduced to a typed record as it arrives (names interned, arguments parsed
//! into the trace's arenas, [`ARGS_KEPT`] applied, malformed or incomplete
//! fields counted for warnings), without building a `serde_json::Value` tree
//! and without collecting the raw events first. [`Builder::append`] joins the
//! two halves of a split read; [`Builder::finish`] refuses what is not a
//! usable trace and turns the counts into warnings.

use rustc_hash::FxHashMap;

use super::args::{read_op_args, Scratch};
use super::raw::{Cat, Ph, RawEvent};
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
    interner: FxHashMap<String, NameId>,
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
        // A span ends within the range of a time: `start + dur` never
        // overflows downstream.
        let dur = Nanos(
            Nanos::from_micros_f64(dur)
                .get()
                .min(i64::MAX.saturating_sub(start.get())),
        );
        let op_name = ev.name.as_deref().unwrap_or("");
        let name = self.intern(op_name);
        let tid = self.tid(ev.tid);
        let args = ev.args;
        match ev.cat {
            Cat::CpuOp => {
                let keep_concrete = ARGS_KEPT.keeps_concrete(op_name);
                let keep_flags = ARGS_KEPT.keeps_flags(op_name);
                let mut scratch = std::mem::take(&mut self.scratch);
                let mut op_args = std::mem::take(&mut self.trace.op_args);
                let read = read_op_args(
                    args.op_args,
                    keep_concrete,
                    keep_flags,
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

    /// A span ends within the range of a time, however far the file puts
    /// it: every stage adds `dur` to `start` (issue 33).
    #[test]
    fn a_span_ends_within_the_range_of_a_time() {
        let json = r#"{"traceEvents": [
            {"ph": "i", "name": "[memory]", "ts": 1, "args": {"Addr": 1, "Bytes": 8}},
            {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 9e15, "dur": 9e15},
            {"ph": "X", "cat": "python_function", "name": "f", "ts": 1e300, "dur": 5},
            {"ph": "X", "cat": "user_annotation", "name": "a", "ts": -9e15, "dur": 1e300}
        ]}"#;
        let trace = crate::trace::parse(json.as_bytes()).unwrap().value;
        let ends = trace
            .ops
            .iter()
            .map(|o| (o.start, o.dur))
            .chain(trace.python.iter().map(|p| (p.start, p.dur)))
            .chain(trace.annotations.iter().map(|a| (a.start, a.dur)));
        for (start, dur) in ends {
            assert!(
                start.get().checked_add(dur.get()).is_some(),
                "{start:?} + {dur:?}"
            );
            assert!(dur.get() >= 0);
        }
        assert_eq!(trace.ops[0].dur, Nanos(i64::MAX - trace.ops[0].start.get()));
    }
}

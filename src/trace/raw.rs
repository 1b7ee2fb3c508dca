//! The serde side of the trace reader: the visitors that read one entry of
//! `traceEvents` that the fast path ([`super::plain`]) leaves to them, and
//! the key tables and slots both readers share (an event's fields,
//! [`EventKey`]; its `args`' fields, [`ArgKey`], and which of them an op
//! keeps, [`ArgsKeptFor`]). The [`super::build::Builder`] reduces the
//! [`RawEvent`] to a typed record; [`super::stream`] finds where each entry
//! starts and ends in the bytes as they arrive.
//!
//! Every visitor is tolerant: a field of an unexpected JSON type is treated as
//! missing (and counted for a warning) instead of failing the whole file; the
//! tolerant scalar readers are in [`super::loose`].

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use serde_json::value::RawValue;

use super::args::RawOpArgs;
use super::loose::{drain_seq, LooseF64, LooseInt, LooseStr};
use super::ARGS_KEPT;

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
        // Device-side events only. `cuda_runtime` / `cuda_driver` calls and
        // their `ac2g` flows are the host's: a job that ran on the CPU still
        // records `cudaGetDeviceCount` on a machine with a GPU.
        b"kernel" | b"gpu_memcpy" | b"gpu_memset" | b"gpu_user_annotation" => Cat::Gpu,
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

#[cfg(test)]
mod tests {

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
}

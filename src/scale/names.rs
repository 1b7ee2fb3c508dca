//! Names in a rebuilt trace: module frames numbered as the profiler numbers
//! a deeper model's (per class, in call order, the copies right after the
//! template's), autograd sequence numbers in call order, new names interned.

use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, BTreeSet};

use super::frames::{ModuleFrame, Stack};
use crate::trace::{NameId, OpEvent, Trace};

/// The rebuilt trace's name table: the id of a name, added when new (one
/// lookup per frame, not a scan of the table).
pub(super) struct Interner {
    lookup: FxHashMap<String, NameId>,
}

impl Interner {
    pub(super) fn new(trace: &Trace) -> Interner {
        let mut lookup = FxHashMap::with_capacity_and_hasher(trace.names.len(), Default::default());
        for (i, name) in trace.names.iter().enumerate() {
            lookup
                .entry(name.clone())
                .or_insert(NameId(u32::try_from(i).unwrap_or(u32::MAX)));
        }
        Interner { lookup }
    }

    /// The id of `name` in `trace`'s table, added when new.
    pub(super) fn id(&mut self, trace: &mut Trace, name: &str) -> NameId {
        if let Some(&id) = self.lookup.get(name) {
            return id;
        }
        let id = NameId(u32::try_from(trace.names.len()).unwrap_or(u32::MAX));
        trace.names.push(name.to_owned());
        self.lookup.insert(name.to_owned(), id);
        id
    }
}

/// Autograd sequence numbers in call order: each (number, copy) of a forward
/// op gets the next number when first called, and its backward nodes the same.
pub(super) fn renumber_sequences(ops: &mut [(OpEvent, u32, Option<i64>)]) {
    // Negative numbers are "none" (-1): left as they are.
    let Some(base) = ops
        .iter()
        .filter_map(|(_, _, s)| *s)
        .filter(|&s| s >= 0)
        .min()
    else {
        return;
    };
    let mut map: FxHashMap<(i64, u32), i64> = FxHashMap::default();
    let mut next = base;
    for (o, c, s) in ops.iter() {
        let Some(s) = s.filter(|&s| s >= 0) else {
            continue;
        };
        if o.fwd_thread_id.is_none_or(|t| t <= 0) && !map.contains_key(&(s, *c)) {
            map.insert((s, *c), next);
            next += 1;
        }
    }
    for (o, c, s) in ops.iter_mut() {
        let Some(s) = s.filter(|&s| s >= 0) else {
            continue;
        };
        let n = *map.entry((s, *c)).or_insert_with(|| {
            next += 1;
            next - 1
        });
        o.sequence_number = Some(n);
    }
}

/// Module frame names of the deeper model: per class, instances numbered
/// in call order, the copies right after the template's.
#[derive(Debug)]
pub(super) struct Renumber {
    /// Per stack and class: the template's first and last instance and count.
    ranges: Vec<BTreeMap<String, (u32, u32, u32)>>,
    shifted: FxHashMap<(String, u32), u32>,
    frame_of: FxHashMap<usize, (String, u32)>,
}

impl Renumber {
    pub(super) fn new(frames: &[ModuleFrame], stacks: &[Stack], copies: u32) -> Renumber {
        let mut ranges: Vec<BTreeMap<String, (u32, u32, u32)>> = Vec::new();
        for stack in stacks {
            let t = stack.last();
            let mut per: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
            for f in frames {
                let inside = (f.class == stack.class && f.k == t)
                    || f.ancestors
                        .iter()
                        .any(|(c, k)| c == &stack.class && *k == t);
                if inside {
                    per.entry(f.class.clone()).or_default().insert(f.k);
                }
            }
            ranges.push(
                per.into_iter()
                    .filter_map(|(c, ks)| {
                        let lo = *ks.first()?;
                        let hi = *ks.last()?;
                        Some((c, (lo, hi, u32::try_from(ks.len()).unwrap_or(0))))
                    })
                    .collect(),
            );
        }
        let mut shifted = FxHashMap::default();
        let mut frame_of = FxHashMap::default();
        for f in frames {
            let add: u32 = ranges
                .iter()
                .filter_map(|r| r.get(&f.class))
                .filter(|&&(_, hi, _)| f.k > hi)
                .map(|&(_, _, m)| m.saturating_mul(copies))
                .sum();
            shifted.insert((f.class.clone(), f.k), f.k.saturating_add(add));
            frame_of.insert(f.python, (f.class.clone(), f.k));
        }
        Renumber {
            ranges,
            shifted,
            frame_of,
        }
    }

    /// The new name and module id of the trace's own frame `python`.
    pub(super) fn original(&self, python: usize) -> Option<(String, Option<i64>)> {
        let (class, k) = self.frame_of.get(&python)?;
        let n = *self.shifted.get(&(class.clone(), *k))?;
        Some((format!("nn.Module: {class}_{n}"), Some(i64::from(n))))
    }

    /// The name and module id of copy `c` of frame `python` in `stack`.
    pub(super) fn copy(
        &self,
        python: usize,
        stack: usize,
        c: u32,
    ) -> Option<(String, Option<i64>)> {
        let (class, k) = self.frame_of.get(&python)?;
        let &(lo, hi, m) = self.ranges.get(stack)?.get(class)?;
        let last = *self.shifted.get(&(class.clone(), hi))?;
        let n = last
            .saturating_add(c.saturating_sub(1).saturating_mul(m))
            .saturating_add(k.saturating_sub(lo))
            .saturating_add(1);
        Some((format!("nn.Module: {class}_{n}"), Some(i64::from(n))))
    }
}

/// The stride of copied Python frames' ids: copy `c` of frame `id` is
/// `id + c × stride`, past every id the trace has.
pub(super) fn python_id_stride(trace: &Trace) -> i64 {
    trace
        .python
        .iter()
        .filter_map(|p| p.id)
        .max()
        .unwrap_or(0)
        .max(0)
        + 1
}

//! A pool's cached free blocks, ordered as PyTorch's `BlockComparatorSize`
//! orders them — by stream, then size, then address — so best fit is the
//! first block at or after `(stream, size, 0)`.
//!
//! The keys are the allocator's packed `(stream, size, address)` (see
//! `free_key`). Most blocks of a job are small-pool blocks of the default
//! stream, of a handful of sizes (multiples of 512 bytes up to a 2 MiB
//! segment): those are kept per size class, each class's blocks sorted by
//! address, with a bitmap of the classes that hold any, so best fit is a
//! bit scan and a binary search instead of a walk down an ordered map.
//! Every other block (another stream, an odd or larger size, a class grown
//! past [`CLASS_CAP`]) is kept in an ordered map. Each key lives in exactly
//! one of the two, and every query takes the lesser (or greater) of what
//! each holds (keys are unique, so the pair's order is its key's), so the
//! order seen is the one ordered map's.

use std::collections::BTreeMap;

/// The size step of the classes: the allocator's rounding.
const STEP: u64 = 512;
/// The largest class: a whole small segment.
const CLASSES: usize = (2 << 20) / STEP as usize;
/// A class holds at most this many blocks; more go to the ordered map (a
/// class is a sorted vector: its inserts move its tail).
const CLASS_CAP: usize = 256;

/// The free set of one pool.
#[derive(Debug, Clone, Default)]
pub(super) struct FreeSet {
    /// `classes[c]`: the stream-0 blocks of `c · 512` bytes, as (address,
    /// id) sorted by address (empty until the first block is kept).
    classes: Vec<Vec<(u64, u32)>>,
    /// Bit `c % 64` of word `c / 64`: class `c` holds a block.
    nonempty: Vec<u64>,
    /// Every block not in a class.
    rest: BTreeMap<u128, u32>,
    len: usize,
}

/// The parts of a packed key: stream, size, address.
fn parts(key: u128) -> (u128, u64, u64) {
    (
        key >> 112,
        ((key >> 64) as u64) & ((1 << 48) - 1),
        key as u64,
    )
}

/// The packed key of a stream-0 block of class `class` at `addr`.
fn class_key(class: usize, addr: u64) -> u128 {
    (u128::from(class as u64 * STEP) << 64) | u128::from(addr)
}

/// The class a stream-0 block of `size` bytes is kept in, if any.
fn class_of(stream: u128, size: u64) -> Option<usize> {
    let class = usize::try_from(size / STEP).ok()?;
    (stream == 0 && size % STEP == 0 && class <= CLASSES).then_some(class)
}

impl FreeSet {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Keeps block `id` under `key`.
    pub(super) fn insert(&mut self, key: u128, id: u32) {
        let (stream, size, addr) = parts(key);
        if let Some(class) = class_of(stream, size) {
            if self.classes.is_empty() {
                self.classes.resize_with(CLASSES + 1, Vec::new);
                self.nonempty.resize(CLASSES / 64 + 1, 0);
            }
            if let Some(list) = self.classes.get_mut(class) {
                match list.binary_search_by_key(&addr, |&(a, _)| a) {
                    Ok(i) => {
                        if let Some(slot) = list.get_mut(i) {
                            slot.1 = id;
                        }
                        return;
                    }
                    Err(i) if list.len() < CLASS_CAP && !self.rest.contains_key(&key) => {
                        list.insert(i, (addr, id));
                        if let Some(word) = self.nonempty.get_mut(class / 64) {
                            *word |= 1 << (class % 64);
                        }
                        self.len += 1;
                        return;
                    }
                    Err(_) => {}
                }
            }
        }
        if self.rest.insert(key, id).is_none() {
            self.len += 1;
        }
    }

    /// Forgets the block under `key`.
    pub(super) fn remove(&mut self, key: u128) {
        let (stream, size, addr) = parts(key);
        if let Some(class) = class_of(stream, size) {
            if let Some(list) = self.classes.get_mut(class) {
                if let Ok(i) = list.binary_search_by_key(&addr, |&(a, _)| a) {
                    list.remove(i);
                    if list.is_empty() {
                        if let Some(word) = self.nonempty.get_mut(class / 64) {
                            *word &= !(1 << (class % 64));
                        }
                    }
                    self.len -= 1;
                    return;
                }
            }
        }
        if self.rest.remove(&key).is_some() {
            self.len -= 1;
        }
    }

    /// The first nonempty class at or after `from`.
    fn class_at_or_after(&self, from: usize) -> Option<usize> {
        let mut word = from / 64;
        let mut bits = self.nonempty.get(word)? & (!0u64 << (from % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            bits = *self.nonempty.get(word)?;
        }
    }

    /// The last nonempty class before `to`.
    fn class_before(&self, to: usize) -> Option<usize> {
        let to = to.min(CLASSES + 1);
        if to == 0 {
            return None;
        }
        let last = to - 1;
        let mut word = last / 64;
        let keep = last % 64;
        let mask = if keep == 63 {
            !0
        } else {
            (1u64 << (keep + 1)) - 1
        };
        let mut bits = self.nonempty.get(word)? & mask;
        loop {
            if bits != 0 {
                return Some(word * 64 + 63 - bits.leading_zeros() as usize);
            }
            word = word.checked_sub(1)?;
            bits = *self.nonempty.get(word)?;
        }
    }

    /// The classes' first block at or after `key`.
    fn class_first(&self, key: u128) -> Option<(u128, u32)> {
        let (stream, size, addr) = parts(key);
        if stream != 0 || self.classes.is_empty() {
            return None;
        }
        let mut class = usize::try_from(size.div_ceil(STEP)).ok()?;
        if size % STEP == 0 {
            // Within the key's own class, from its address on.
            if let Some(list) = self.classes.get(class) {
                let i = list.partition_point(|&(a, _)| a < addr);
                if let Some(&(a, id)) = list.get(i) {
                    return Some((class_key(class, a), id));
                }
            }
            class += 1;
        }
        let class = self.class_at_or_after(class)?;
        let &(a, id) = self.classes.get(class)?.first()?;
        Some((class_key(class, a), id))
    }

    /// The classes' last block before `key`.
    fn class_last(&self, key: u128) -> Option<(u128, u32)> {
        if self.classes.is_empty() {
            return None;
        }
        let (stream, size, addr) = parts(key);
        let below = if stream != 0 {
            CLASSES + 1
        } else {
            if size % STEP == 0 {
                let class = usize::try_from(size / STEP).ok()?;
                if let Some(list) = self.classes.get(class) {
                    let i = list.partition_point(|&(a, _)| a < addr);
                    if let Some(&(a, id)) = i.checked_sub(1).and_then(|i| list.get(i)) {
                        return Some((class_key(class, a), id));
                    }
                }
            }
            usize::try_from(size.div_ceil(STEP)).unwrap_or(usize::MAX)
        };
        let class = self.class_before(below)?;
        let &(a, id) = self.classes.get(class)?.last()?;
        Some((class_key(class, a), id))
    }

    /// The first block at or after `key`, with its key.
    pub(super) fn first_from(&self, key: u128) -> Option<(u128, u32)> {
        let other = self.rest.range(key..).next().map(|(&k, &id)| (k, id));
        [self.class_first(key), other].into_iter().flatten().min()
    }

    /// The last block before `key`, with its key.
    pub(super) fn last_before(&self, key: u128) -> Option<(u128, u32)> {
        let other = self.rest.range(..key).next_back().map(|(&k, &id)| (k, id));
        [self.class_last(key), other].into_iter().flatten().max()
    }

    /// The blocks at or after `key`, in order.
    pub(super) fn from(&self, key: u128) -> Ascending<'_> {
        Ascending {
            set: self,
            next: Some(key),
        }
    }

    /// The blocks before `key`, last first.
    pub(super) fn before(&self, key: u128) -> Descending<'_> {
        Descending {
            set: self,
            next: Some(key),
        }
    }

    /// Every block's id, in order.
    pub(super) fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.from(0).map(|(_, id)| id)
    }

    /// The last block of all.
    pub(super) fn last(&self) -> Option<(u128, u32)> {
        let top = self.rest.iter().next_back().map(|(&k, &id)| (k, id));
        [self.class_last(u128::MAX), top]
            .into_iter()
            .flatten()
            .max()
    }
}

/// [`FreeSet::from`]'s blocks: `(key, id)` in key order.
pub(super) struct Ascending<'a> {
    set: &'a FreeSet,
    next: Option<u128>,
}

impl Iterator for Ascending<'_> {
    type Item = (u128, u32);

    fn next(&mut self) -> Option<(u128, u32)> {
        let found = self.set.first_from(self.next?)?;
        self.next = found.0.checked_add(1);
        Some(found)
    }
}

/// [`FreeSet::before`]'s blocks: `(key, id)`, the last first.
pub(super) struct Descending<'a> {
    set: &'a FreeSet,
    next: Option<u128>,
}

impl Iterator for Descending<'_> {
    type Item = (u128, u32);

    fn next(&mut self) -> Option<(u128, u32)> {
        let found = self.set.last_before(self.next?)?;
        self.next = Some(found.0);
        Some(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(stream: u32, size: u64, addr: u64) -> u128 {
        super::super::free_key(stream, size, addr)
    }

    /// A key the allocator could make: mostly small classes of stream 0,
    /// sometimes another stream, an odd or a large size.
    fn any_key() -> impl Strategy<Value = u128> {
        (
            prop_oneof![8 => Just(0u32), 1 => 1u32..3],
            prop_oneof![
                8 => (1u64..12).prop_map(|c| c * STEP),
                1 => 1u64..5000,
                1 => Just(2 << 20),
                1 => (2u64 << 20)..(64 << 20),
            ],
            0u64..40,
        )
            .prop_map(|(stream, size, addr)| key(stream, size, addr * 512))
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u128, u32),
        Remove(u128),
        First(u128),
        Last(u128),
    }

    fn any_op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (any_key(), any::<u32>()).prop_map(|(k, id)| Op::Insert(k, id)),
            2 => any_key().prop_map(Op::Remove),
            1 => any_key().prop_map(Op::First),
            1 => any_key().prop_map(Op::Last),
        ]
    }

    proptest! {
        /// The free set answers every query as one ordered map of the
        /// same keys does, whichever part holds each key.
        #[test]
        fn a_free_set_is_an_ordered_map(ops in proptest::collection::vec(any_op(), 0..400)) {
            let mut set = FreeSet::default();
            let mut map: BTreeMap<u128, u32> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, id) => {
                        set.insert(k, id);
                        map.insert(k, id);
                    }
                    Op::Remove(k) => {
                        set.remove(k);
                        map.remove(&k);
                    }
                    Op::First(k) => {
                        let want = map.range(k..).next().map(|(&k, &v)| (k, v));
                        prop_assert_eq!(set.first_from(k), want);
                        let all: Vec<_> = set.from(k).collect();
                        let want: Vec<_> = map.range(k..).map(|(&k, &v)| (k, v)).collect();
                        prop_assert_eq!(all, want);
                    }
                    Op::Last(k) => {
                        let want = map.range(..k).next_back().map(|(&k, &v)| (k, v));
                        prop_assert_eq!(set.last_before(k), want);
                        let all: Vec<_> = set.before(k).collect();
                        let want: Vec<_> = map.range(..k).rev().map(|(&k, &v)| (k, v)).collect();
                        prop_assert_eq!(all, want);
                    }
                }
                prop_assert_eq!(set.len(), map.len());
                prop_assert_eq!(set.last(), map.iter().next_back().map(|(&k, &v)| (k, v)));
            }
            let ids: Vec<u32> = set.ids().collect();
            let want: Vec<u32> = map.values().copied().collect();
            prop_assert_eq!(ids, want);
        }
    }

    /// A class grown past its cap keeps its blocks in the ordered map, in
    /// order with the class's own.
    #[test]
    fn a_full_class_overflows_in_order() {
        let mut set = FreeSet::default();
        let n = CLASS_CAP as u64 + 10;
        // Every other address first, then the ones between.
        for a in (0..2 * n).step_by(2).chain((1..2 * n).step_by(2)) {
            set.insert(key(0, 1024, a * 512), u32::try_from(a).unwrap_or(0));
        }
        let ids: Vec<u32> = set.ids().collect();
        let want: Vec<u32> = (0..2 * n).map(|a| u32::try_from(a).unwrap_or(0)).collect();
        assert_eq!(ids, want);
        assert_eq!(set.first_from(key(0, 600, 0)), Some((key(0, 1024, 0), 0)));
    }
}

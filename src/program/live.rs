//! The blocks live right after one event of a program: what the report
//! names at the peak.
//!
//! A walk from the first event to the one asked for, keeping the live
//! blocks (most live briefly: the recent ones in a ring by their
//! allocation's place, those that outlive it aside). A run of copies whose
//! body frees every block it allocates a fixed number of copies later is
//! not walked whole: a block of copy `c` is dead once copy `c + K` is
//! over, so only the first `K` copies (whose frees reach back before the
//! run) and the `K` copies before the event are walked, and the copies
//! between, whose blocks all die before it, are skipped. A long generation
//! whose peak is in its last step walks a few steps, not all of them.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use super::{build, walk_vars, with_copy, Dim, JobEvent, Leaf, Node, Program, Terms};
use crate::orchestrator::EventKind;

/// What [`Program::live_after`] gives: the live blocks as the events that
/// allocated them, by block, and the event asked for.
type Live = (Vec<JobEvent>, Option<JobEvent>);

impl Program {
    /// The blocks live right after event `index` and that event, in
    /// allocation order.
    pub(super) fn live_after(&self, index: u64) -> Live {
        self.live_walk(index, true, RING)
    }

    /// [`Program::live_after`], skipping the copies of a run whose blocks
    /// all die before the event where `skip` (else every event is walked:
    /// what the skipping is held to), with a ring of `ring` blocks.
    fn live_walk(&self, index: u64, skip: bool, ring: u64) -> Live {
        let mut walk = LiveWalk::new(index, ring.max(1));
        let vars = [0, self.extra[0], 0, self.extra[1]];
        let terms = Terms::of(vars);
        for node in &self.nodes {
            let flow = match node {
                Node::Leaf(i) => match self.leaves.get(*i as usize) {
                    Some(leaf) => walk.visit(self, *i, leaf, &terms),
                    None => ControlFlow::Continue(()),
                },
                Node::Run { dim, body } => self.live_run(&mut walk, *dim, body, vars, skip),
            };
            if flow.is_break() {
                break;
            }
        }
        walk.finish()
    }

    /// Walks the copies of one run (`body` per copy of `dim`), skipping
    /// those whose blocks all die before the event asked for where `skip`
    /// and the body allows it ([`Program::copy_reach`]).
    fn live_run(
        &self,
        walk: &mut LiveWalk,
        dim: Dim,
        body: &[Node],
        vars: [i64; 4],
        skip: bool,
    ) -> ControlFlow<()> {
        let (slot, copies) = dim.slot(vars);
        let copies = u64::try_from(copies).unwrap_or(0);
        let mut first = 0u64;
        if let Some((events, reach)) = skip.then(|| self.copy_reach(body, slot, vars)).flatten() {
            let start = walk.position;
            // The copy the event asked for is in (`copies`: after the run).
            let holding = (walk.index.saturating_sub(start) / events).min(copies);
            if holding > reach.saturating_mul(2) {
                for c in 0..reach {
                    self.live_copy(walk, body, with_copy(vars, slot, c as i64))?;
                }
                // The blocks of copies 0..reach are freed by copy 2·reach − 1,
                // before the event asked for (their frees among the copies
                // walked next find them gone).
                walk.forget(start, start + reach * events);
                first = holding - reach;
                walk.position = start + first * events;
            }
        }
        for c in first..copies {
            self.live_copy(walk, body, with_copy(vars, slot, c as i64))?;
        }
        ControlFlow::Continue(())
    }

    fn live_copy(&self, walk: &mut LiveWalk, body: &[Node], vars: [i64; 4]) -> ControlFlow<()> {
        walk_vars(body, &self.leaves, vars, &mut |item, leaf, terms| {
            walk.visit(self, item, leaf, terms)
        })
    }

    /// How the copies of a run's `body` free what they allocate: the events
    /// of a copy, and at most how many copies after its own one of its
    /// blocks is freed. `None` unless the body is events only (no inner
    /// run), every free frees the block made a fixed number of events
    /// before it, whatever the copy, and every block a copy makes is freed
    /// by a later copy's event (a block that outlives the run, as a
    /// training forward's activations do, would be lost by a skip).
    fn copy_reach(&self, body: &[Node], slot: usize, vars: [i64; 4]) -> Option<(u64, u64)> {
        let leaves: Vec<&Leaf> = body
            .iter()
            .map(|node| match node {
                Node::Leaf(i) => self.leaves.get(*i as usize),
                Node::Run { .. } => None,
            })
            .collect::<Option<_>>()?;
        let events = i64::try_from(leaves.len()).ok().filter(|&n| n > 0)?;
        let kinds: Vec<EventKind> = leaves
            .iter()
            .map(|leaf| self.key(leaf).map(|k| k.kind))
            .collect::<Option<_>>()?;
        let terms: Vec<Terms> = (0..3)
            .map(|c| Terms::of(with_copy(vars, slot, c)))
            .collect();
        let mut freed = vec![false; leaves.len()];
        let mut reach = 0i64;
        for (q, (leaf, kind)) in leaves.iter().zip(&kinds).enumerate() {
            if *kind != EventKind::Free {
                continue;
            }
            let back = leaf.attrs.get(build::SIZE_OR_BACK)?;
            let b = back.at(terms.first()?);
            if b <= 0 || terms.iter().any(|t| back.at(t) != b) {
                return None;
            }
            // The block is made `b` events before: `k` copies back, at `at`.
            let target = i64::try_from(q).ok()? - b;
            let k = if target >= 0 {
                0
            } else {
                (-target + events - 1) / events
            };
            let at = usize::try_from(target + k * events).ok()?;
            if kinds.get(at) != Some(&EventKind::Alloc) || freed.get(at) != Some(&false) {
                return None;
            }
            *freed.get_mut(at)? = true;
            reach = reach.max(k);
        }
        let all_freed = kinds
            .iter()
            .zip(&freed)
            .all(|(kind, &f)| *kind != EventKind::Alloc || f);
        all_freed.then_some((events as u64, reach as u64))
    }
}

/// The live blocks of a walk so far.
struct LiveWalk {
    index: u64,
    ring_len: u64,
    position: u64,
    ring: Vec<Option<JobEvent>>,
    aside: BTreeMap<u64, JobEvent>,
    at: Option<JobEvent>,
}

/// Blocks kept in the ring by their allocation's place.
const RING: u64 = 1 << 16;

impl LiveWalk {
    fn new(index: u64, ring: u64) -> LiveWalk {
        LiveWalk {
            index,
            ring_len: ring,
            position: 0,
            ring: vec![None; usize::try_from(ring).unwrap_or(1)],
            aside: BTreeMap::new(),
            at: None,
        }
    }

    /// One event; breaks after the one asked for.
    fn visit(
        &mut self,
        program: &Program,
        item: u32,
        leaf: &Leaf,
        terms: &Terms,
    ) -> ControlFlow<()> {
        let event = program.event(item, leaf, self.position, terms);
        if let Some(e) = event {
            let slot = (e.block % self.ring_len) as usize;
            match e.kind {
                EventKind::Alloc => {
                    if let Some(old) = self.ring.get_mut(slot).and_then(|s| s.replace(e)) {
                        self.aside.insert(old.block, old);
                    }
                }
                EventKind::Free => match self.ring.get_mut(slot) {
                    Some(s) if s.is_some_and(|l| l.block == e.block) => *s = None,
                    _ => {
                        self.aside.remove(&e.block);
                    }
                },
            }
        }
        if self.position == self.index {
            self.at = event;
            return ControlFlow::Break(());
        }
        self.position += 1;
        ControlFlow::Continue(())
    }

    /// Drops the blocks allocated by the events `from..to` (all dead).
    fn forget(&mut self, from: u64, to: u64) {
        for s in &mut self.ring {
            if s.is_some_and(|e| (from..to).contains(&e.block)) {
                *s = None;
            }
        }
        self.aside.retain(|block, _| !(from..to).contains(block));
    }

    fn finish(self) -> Live {
        let mut live: Vec<JobEvent> = self
            .aside
            .into_values()
            .chain(self.ring.into_iter().flatten())
            .collect();
        live.sort_unstable_by_key(|e| e.block);
        (live, self.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A generation-like program: `prefix` allocations never freed, then a
    /// run of `copies` copies of a body in which allocation `i` (at
    /// `slots[2i]`) is freed `lives[i]` copies later at `slots[2i + 1]`
    /// (the first free's distance growing by `growth` a copy), then two
    /// more allocations.
    fn program(order: &[usize], lives: &[i64], prefix: usize, copies: i64, growth: i64) -> Program {
        let events = 2 * lives.len();
        let mut body = vec![(EventKind::Alloc, 0, 0); events];
        for (i, &life) in lives.iter().enumerate() {
            let (a, f) = (order[2 * i], order[2 * i + 1]);
            let mut back = f as i64 - a as i64 + life * events as i64;
            if back <= 0 {
                back += events as i64;
            }
            body[a] = (EventKind::Alloc, 512 * (i as i64 + 1), 0);
            body[f] = (EventKind::Free, back, growth * i64::from(i == 0));
        }
        let alloc = |size| (EventKind::Alloc, size);
        Program::of_events(&vec![alloc(4096); prefix], &body, copies, &[alloc(1024); 2])
    }

    proptest! {
        /// Skipping the copies whose blocks die before the event finds the
        /// blocks a walk of every event finds, at every event.
        #[test]
        fn skipping_dead_copies_finds_the_live_blocks_a_full_walk_finds(
            seed in proptest::collection::vec(any::<u32>(), 8),
            lives in proptest::collection::vec(0i64..3, 1..5),
            prefix in 0usize..12,
            copies in 0i64..24,
            grows in any::<bool>(),
            ring in 1u64..6,
        ) {
            let events = 2 * lives.len();
            let mut order: Vec<usize> = (0..events).collect();
            for i in (1..events).rev() {
                let j = seed[i % seed.len()] as usize % (i + 1);
                order.swap(i, j);
            }
            let p = program(&order, &lives, prefix, copies, i64::from(grows));
            for index in 0..p.n_events {
                prop_assert_eq!(p.live_walk(index, true, ring), p.live_walk(index, false, ring + 3));
            }
        }
    }

    /// The skip is taken where the body allows it, and walks far fewer
    /// events: a free whose distance grows with the copy, or a block no
    /// later copy frees, allows none.
    #[test]
    fn a_run_is_skipped_only_where_every_block_dies_a_fixed_distance_later() {
        let vars = [0, 0, 0, 40];
        let body = |p: &Program| match p.nodes.iter().find(|n| matches!(n, Node::Run { .. })) {
            Some(Node::Run { body, .. }) => body.clone(),
            _ => Vec::new(),
        };
        let fixed = program(&[0, 3, 1, 2], &[1, 0], 3, 40, 0);
        assert_eq!(fixed.copy_reach(&body(&fixed), 2, vars), Some((4, 1)));
        let growing = program(&[0, 3, 1, 2], &[1, 0], 3, 40, 1);
        assert_eq!(growing.copy_reach(&body(&growing), 2, vars), None);
        let mut kept = program(&[0, 3, 1, 2], &[1, 0], 3, 40, 0);
        if let Some(Node::Run { body, .. }) = kept.nodes.get_mut(3) {
            body.pop();
        }
        assert_eq!(kept.copy_reach(&body(&kept), 2, vars), None);
    }
}

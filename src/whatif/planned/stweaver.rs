//! The STWeaver planner (§5.1 of the paper): HomoPhase groups planned
//! locally and fused, then HomoSize groups of the group plans laid out in
//! memory layers, larger sizes first. The module documentation of
//! [`super`] states every choice made where the paper is not precise.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use super::best_fit::AddressOrdered;
use super::{Plan, PlanRequest};
use crate::units::Nanos;

/// A computation phase of the sequence: the position of a moment among the
/// schedule's phase windows (see [`PhaseTimeline::slot`]).
pub type PhaseSlot = u32;

/// The phase windows of the schedule in time order, to name the phase of a
/// moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhaseTimeline {
    /// `(start, end)` of every window, sorted.
    windows: Vec<(Nanos, Nanos)>,
}

impl PhaseTimeline {
    /// The timeline of these windows (any order).
    pub fn new(windows: impl IntoIterator<Item = (Nanos, Nanos)>) -> PhaseTimeline {
        let mut windows: Vec<(Nanos, Nanos)> = windows.into_iter().collect();
        windows.sort_unstable();
        PhaseTimeline { windows }
    }

    /// The phase of a moment: `2k + 1` inside window `k` (`start ≤ time ≤
    /// end`), `2k` in the gap before window `k` (`0` before the first one,
    /// `2n` after the last). When windows overlap, the latest window that
    /// started at or before `time` decides.
    pub fn slot(&self, time: Nanos) -> PhaseSlot {
        let started = self.windows.partition_point(|&(start, _)| start <= time);
        let slot = match started.checked_sub(1).and_then(|k| self.windows.get(k)) {
            None => 0,
            Some(&(_, end)) if time <= end => 2 * started - 1,
            Some(_) => 2 * started,
        };
        PhaseSlot::try_from(slot).unwrap_or(PhaseSlot::MAX - 1)
    }
}

/// What the STWeaver planner found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StweaverPlan {
    pub plan: Plan,
    /// HomoPhase groups: distinct (start phase, end phase) pairs.
    pub phase_groups: u32,
    /// Groups left after fusion: the requests of the global planning.
    pub fused_groups: u32,
    /// Memory layers of the global plan.
    pub memory_layers: u32,
}

/// Plans `requests`, whose phases are `phases` (start, end; one pair per
/// request).
pub fn plan(requests: &[PlanRequest], phases: &[(PhaseSlot, PhaseSlot)]) -> StweaverPlan {
    // 1. HomoPhase groups, in phase order.
    let mut groups: BTreeMap<(PhaseSlot, PhaseSlot), Vec<usize>> = BTreeMap::new();
    for (index, request) in requests.iter().enumerate() {
        if request.size == 0 {
            continue;
        }
        let key = phases.get(index).copied().unwrap_or((0, 0));
        groups.entry(key).or_default().push(index);
    }
    let phase_groups = groups.len();
    // 2. Each group planned locally (HomoSize layers inside the group).
    let locals: Vec<Local> = groups
        .into_iter()
        .map(|(key, members)| Local::plan(requests, key, members))
        .collect();
    // 3. Adjacent groups fused while the time-memory product improves.
    let fused = fuse_adjacent(requests, locals);
    // 4. Global planning: every fused group is one request of its plan's
    //    size and span, laid out in memory layers.
    let boxes: Vec<PlanRequest> = fused
        .iter()
        .map(|local| PlanRequest {
            size: local.size,
            start: local.start,
            end: local.end,
        })
        .collect();
    let global = layered(&boxes);
    let mut offsets = vec![0u64; requests.len()];
    for (local, &base) in fused.iter().zip(&global.offsets) {
        for (&member, &relative) in local.members.iter().zip(&local.offsets) {
            if let Some(slot) = offsets.get_mut(member) {
                *slot = base.saturating_add(relative);
            }
        }
    }
    StweaverPlan {
        plan: Plan {
            offsets,
            top: global.top,
        },
        phase_groups: u32::try_from(phase_groups).unwrap_or(u32::MAX),
        fused_groups: u32::try_from(fused.len()).unwrap_or(u32::MAX),
        memory_layers: global.layers,
    }
}

/// The layout of some items in memory layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layered {
    /// One offset per item.
    pub offsets: Vec<u64>,
    /// The sum of the layer sizes.
    pub top: u64,
    pub layers: u32,
}

/// One memory layer: a band of addresses as wide as the requests that
/// created it.
struct Layer {
    size: u64,
    /// The requests that fill the whole band (Algorithm 1), by start; their
    /// lifetimes are disjoint, so their ends are sorted too.
    full: Vec<(usize, usize)>,
    /// Smaller requests inserted into the band's free intervals:
    /// `(offset in the band, size, start, end)`.
    inserted: Vec<(u64, u64, usize, usize)>,
}

impl Layer {
    /// The smallest free gap of the band that holds `request` over its
    /// whole lifetime, as `(gap width, offset in the band)`.
    fn best_gap(&self, request: &PlanRequest) -> Option<(u64, u64)> {
        if self.size < request.size {
            return None;
        }
        let after = self.full.partition_point(|&(_, end)| end <= request.start);
        if self
            .full
            .get(after)
            .is_some_and(|&(start, _)| start < request.end)
        {
            return None;
        }
        let mut busy: Vec<(u64, u64)> = self
            .inserted
            .iter()
            .filter(|&&(_, _, start, end)| start < request.end && request.start < end)
            .map(|&(offset, size, _, _)| (offset, offset.saturating_add(size)))
            .collect();
        busy.push((self.size, self.size));
        busy.sort_unstable();
        let mut best: Option<(u64, u64)> = None;
        let mut cursor = 0u64;
        for (begin, end) in busy {
            if begin > cursor {
                let gap = begin - cursor;
                if gap >= request.size && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, cursor));
                }
            }
            cursor = cursor.max(end);
        }
        best
    }
}

/// HomoSize planning with memory layers, larger sizes first (the paper's
/// global planning, used for the group-local plans too).
///
/// For each size `S`, in descending order, the requests of size `S` in
/// allocation order are first inserted into the free intervals of the
/// existing (larger) layers, at the tightest gap over all layers; the rest
/// get new layers by [`algorithm_1`]. The layers are then stacked in the
/// order they were made, so an item's address is its layer's base plus its
/// offset in the layer. Items of size 0 get offset 0 and no layer.
pub fn layered(items: &[PlanRequest]) -> Layered {
    let mut order: Vec<usize> = (0..items.len())
        .filter(|&i| items.get(i).is_some_and(|r| r.size > 0))
        .collect();
    order.sort_by_key(|&i| {
        let r = items.get(i).copied().unwrap_or_default();
        (Reverse(r.size), r.start, r.end, i)
    });
    let mut place: Vec<(usize, u64)> = vec![(usize::MAX, 0); items.len()];
    let mut layers: Vec<Layer> = Vec::new();
    for group in
        order.chunk_by(|&a, &b| items.get(a).map(|r| r.size) == items.get(b).map(|r| r.size))
    {
        let mut rest: Vec<usize> = Vec::new();
        for &index in group {
            let Some(request) = items.get(index) else {
                continue;
            };
            let mut best: Option<(u64, usize, u64)> = None;
            for (layer_idx, layer) in layers.iter().enumerate() {
                if let Some((gap, offset)) = layer.best_gap(request) {
                    if best.is_none_or(|(g, _, _)| gap < g) {
                        best = Some((gap, layer_idx, offset));
                    }
                }
            }
            match best.and_then(|(_, layer_idx, offset)| {
                layers.get_mut(layer_idx).map(|l| (layer_idx, offset, l))
            }) {
                Some((layer_idx, offset, layer)) => {
                    layer
                        .inserted
                        .push((offset, request.size, request.start, request.end));
                    if let Some(slot) = place.get_mut(index) {
                        *slot = (layer_idx, offset);
                    }
                }
                None => rest.push(index),
            }
        }
        let rest_requests: Vec<PlanRequest> = rest
            .iter()
            .map(|&i| items.get(i).copied().unwrap_or_default())
            .collect();
        for (layer_members, size) in algorithm_1(&rest_requests) {
            let mut full: Vec<(usize, usize)> = Vec::with_capacity(layer_members.len());
            for member in layer_members {
                let index = rest.get(member).copied().unwrap_or(usize::MAX);
                if let Some(slot) = place.get_mut(index) {
                    *slot = (layers.len(), 0);
                }
                if let Some(r) = rest_requests.get(member) {
                    full.push((r.start, r.end));
                }
            }
            layers.push(Layer {
                size,
                full,
                inserted: Vec::new(),
            });
        }
    }
    let mut bases: Vec<u64> = Vec::with_capacity(layers.len());
    let mut top = 0u64;
    for layer in &layers {
        bases.push(top);
        top = top.saturating_add(layer.size);
    }
    let offsets = place
        .iter()
        .map(|&(layer, offset)| {
            bases
                .get(layer)
                .map_or(0, |&base| base.saturating_add(offset))
        })
        .collect();
    Layered {
        offsets,
        top,
        layers: u32::try_from(layers.len()).unwrap_or(u32::MAX),
    }
}

/// Algorithm 1 of the paper: memory layers for requests of one size.
///
/// The requests are taken in allocation order (ties by free time, then
/// index); each is appended to the layer whose last request was freed
/// latest but no later than the request's allocation (the least idle time),
/// or opens a new layer when every layer is still busy. Returns each layer's
/// requests (indices into `requests`, in allocation order) and the layer
/// size (the largest of its requests; all are equal for a HomoSize group).
///
/// For requests of one size this uses exactly as many layers as the most
/// requests live at one moment, the least any plan can use (see the module
/// documentation of [`super`] for the proof).
pub fn algorithm_1(requests: &[PlanRequest]) -> Vec<(Vec<usize>, u64)> {
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&i| {
        let r = requests.get(i).copied().unwrap_or_default();
        (r.start, r.end, i)
    });
    let mut layers: Vec<(Vec<usize>, u64)> = Vec::new();
    // (last free time, Reverse(layer)): the free time closest to but not
    // after an allocation, the lowest layer among equals.
    let mut ends: BTreeSet<(usize, Reverse<usize>)> = BTreeSet::new();
    for index in order {
        let Some(request) = requests.get(index) else {
            continue;
        };
        let found = ends
            .range(..=(request.start, Reverse(0)))
            .next_back()
            .copied();
        let layer_idx = match found {
            Some(key) => {
                ends.remove(&key);
                key.1 .0
            }
            None => {
                layers.push((Vec::new(), 0));
                layers.len() - 1
            }
        };
        if let Some((members, size)) = layers.get_mut(layer_idx) {
            members.push(index);
            *size = (*size).max(request.size);
        }
        ends.insert((request.end.max(request.start), Reverse(layer_idx)));
    }
    layers
}

/// A (possibly fused) HomoPhase group and its local plan.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Local {
    /// (start phase, end phase) of the group; a fused group spans from the
    /// first one's start phase to the last one's end phase.
    phases: (PhaseSlot, PhaseSlot),
    /// PlanRequest indices.
    members: Vec<usize>,
    /// Offsets relative to the group, one per member.
    offsets: Vec<u64>,
    /// `max(offset + size)`: the group plan's size.
    size: u64,
    /// The earliest allocation and the latest free of the members.
    start: usize,
    end: usize,
}

impl Local {
    /// A group's local plan: its requests laid out by [`layered`].
    fn plan(
        requests: &[PlanRequest],
        phases: (PhaseSlot, PhaseSlot),
        members: Vec<usize>,
    ) -> Local {
        let items: Vec<PlanRequest> = members
            .iter()
            .map(|&m| requests.get(m).copied().unwrap_or_default())
            .collect();
        let layout = layered(&items);
        Local::from_parts(requests, phases, members, layout.offsets)
    }

    fn from_parts(
        requests: &[PlanRequest],
        phases: (PhaseSlot, PhaseSlot),
        members: Vec<usize>,
        offsets: Vec<u64>,
    ) -> Local {
        let mut size = 0u64;
        let mut start = usize::MAX;
        let mut end = 0usize;
        for (&member, &offset) in members.iter().zip(&offsets) {
            if let Some(r) = requests.get(member) {
                size = size.max(offset.saturating_add(r.size));
                start = start.min(r.start);
                end = end.max(r.end);
            }
        }
        Local {
            phases,
            members,
            offsets,
            size,
            start: start.min(end),
            end,
        }
    }

    /// The reserved time-memory area: the denominator of the paper's TMP.
    fn box_area(&self) -> u128 {
        u128::from(self.size) * (self.end.saturating_sub(self.start) as u128)
    }
}

/// Fuses adjacent HomoPhase groups (the end phase of one is the start phase
/// of the other), keeping a fusion only when it improves the time-memory
/// product.
///
/// Groups are taken in phase order; each one not yet absorbed starts a
/// chain and absorbs, in phase order, the first later group whose start
/// phase is the chain's end phase and whose fusion is accepted, then looks
/// again from the new end phase, until no candidate is accepted.
fn fuse_adjacent(requests: &[PlanRequest], locals: Vec<Local>) -> Vec<Local> {
    let mut slots: Vec<Option<Local>> = locals.into_iter().map(Some).collect();
    let mut out: Vec<Local> = Vec::new();
    for first in 0..slots.len() {
        let Some(mut chain) = slots.get_mut(first).and_then(Option::take) else {
            continue;
        };
        'grow: loop {
            for candidate in first + 1..slots.len() {
                let Some(other) = slots.get(candidate).and_then(Option::as_ref) else {
                    continue;
                };
                if other.phases.0 != chain.phases.1 {
                    continue;
                }
                let fused = fuse(requests, &chain, other);
                // TMP = used / box; the used areas add up, so with the boxes
                // as weights the fused TMP beats the weighted average exactly
                // when its box is smaller than the two boxes together.
                if fused.box_area() < chain.box_area().saturating_add(other.box_area()) {
                    chain = fused;
                    if let Some(slot) = slots.get_mut(candidate) {
                        *slot = None;
                    }
                    continue 'grow;
                }
            }
            break;
        }
        out.push(chain);
    }
    out
}

/// Fuses two local plans by inserting the smaller into the larger: the
/// larger plan keeps its addresses, and each request of the smaller plan,
/// earliest start first, goes to the lowest address, from the larger plan's
/// lowest one, at which it is free over its whole lifetime (our reading of
/// the paper's cursor walk; see the module documentation of [`super`]).
fn fuse(requests: &[PlanRequest], a: &Local, b: &Local) -> Local {
    // The paper assumes different sizes; on a tie the plan with the larger
    // box hosts.
    let (host, guest) = if (b.size, b.box_area()) > (a.size, a.box_area()) {
        (b, a)
    } else {
        (a, b)
    };
    let request_of = |m: usize| requests.get(m).copied().unwrap_or_default();
    let mut placed = AddressOrdered::default();
    for (&member, &offset) in host.members.iter().zip(&host.offsets) {
        placed.insert(offset, &request_of(member));
    }
    let lowest = host.offsets.iter().copied().min().unwrap_or(0);
    let mut pending: Vec<usize> = (0..guest.members.len()).collect();
    pending.sort_by_key(|&g| {
        let r = guest
            .members
            .get(g)
            .map_or_else(PlanRequest::default, |&m| request_of(m));
        (r.start, r.end, g)
    });
    let mut guest_offsets = vec![0u64; guest.members.len()];
    for g in pending {
        let Some(r) = guest.members.get(g).map(|&m| request_of(m)) else {
            continue;
        };
        let offset = placed.first_fit(&r, lowest);
        placed.insert(offset, &r);
        if let Some(slot) = guest_offsets.get_mut(g) {
            *slot = offset;
        }
    }
    let offsets: Vec<u64> = host.offsets.iter().chain(&guest_offsets).copied().collect();
    let members: Vec<usize> = host.members.iter().chain(&guest.members).copied().collect();
    let phases = (a.phases.0.min(b.phases.0), a.phases.1.max(b.phases.1));
    Local::from_parts(requests, phases, members, offsets)
}

#[cfg(test)]
mod tests {
    use super::super::{check, live_lower_bound};
    use super::*;
    use proptest::prelude::*;

    fn req(size: u64, start: usize, end: usize) -> PlanRequest {
        PlanRequest { size, start, end }
    }

    /// The most requests live at one moment.
    fn max_overlap(requests: &[PlanRequest]) -> usize {
        let mut events: Vec<(usize, i32)> = Vec::new();
        for r in requests {
            events.push((r.start, 1));
            events.push((r.end, -1));
        }
        events.sort_unstable();
        let (mut live, mut most) = (0i32, 0i32);
        for (_, delta) in events {
            live += delta;
            most = most.max(live);
        }
        most as usize
    }

    #[test]
    fn phase_slots_number_windows_and_the_gaps_between_them() {
        let timeline = PhaseTimeline::new([(Nanos(30), Nanos(40)), (Nanos(10), Nanos(20))]);
        let slots: Vec<PhaseSlot> = [0, 10, 15, 20, 21, 30, 40, 41]
            .map(|t| timeline.slot(Nanos(t)))
            .to_vec();
        assert_eq!(slots, [0, 1, 1, 1, 2, 3, 3, 4]);
        assert_eq!(PhaseTimeline::new([]).slot(Nanos(5)), 0);
    }

    #[test]
    fn algorithm_1_appends_to_the_layer_freed_closest_before() {
        // Layers: A = [0, 2), B = [0, 5). The request at 3 goes to A (B is
        // busy), so A is freed at 4; the request at 6 may go to either and
        // goes to B, freed at 5, closer to 6.
        let requests = [req(8, 0, 2), req(8, 0, 5), req(8, 3, 4), req(8, 6, 9)];
        let layers = algorithm_1(&requests);
        assert_eq!(layers, [(vec![0, 2], 8), (vec![1, 3], 8)]);
    }

    #[test]
    fn algorithm_1_opens_a_layer_only_when_every_layer_is_busy() {
        // A staircase: at most two requests live at once.
        let requests = [
            req(8, 0, 2),
            req(8, 1, 3),
            req(8, 2, 4),
            req(8, 3, 5),
            req(8, 4, 6),
        ];
        let layers = algorithm_1(&requests);
        assert_eq!(layers.len(), 2);
        assert_eq!(layers[0].0, [0, 2, 4]);
        assert_eq!(layers[1].0, [1, 3]);
        // A request freed at 2 and one allocated at 2 share a layer
        // (lifetimes are half-open).
        assert_eq!(algorithm_1(&[req(8, 0, 2), req(8, 2, 3)]).len(), 1);
    }

    #[test]
    fn smaller_requests_go_into_free_intervals_of_larger_layers() {
        // A 1000-byte layer is idle during [4, 10); two 400-byte requests
        // live then fit side by side in it, a third one on top of them does
        // not fit and gets its own layer.
        let requests = [
            req(1000, 0, 4),
            req(1000, 10, 12),
            req(400, 5, 9),
            req(400, 5, 9),
            req(400, 5, 9),
        ];
        let layout = layered(&requests);
        assert_eq!(layout.layers, 2);
        assert_eq!(layout.offsets, [0, 0, 0, 400, 1000]);
        assert_eq!(layout.top, 1400);
        let plan = Plan {
            offsets: layout.offsets,
            top: layout.top,
        };
        assert_eq!(check::validate(&requests, &plan), Ok(()));
    }

    #[test]
    fn groups_follow_phase_pairs_and_adjacent_groups_fuse() {
        // Phase 1 (ops 0..10): forward. Activations (1, 3) live across it and
        // are freed in the backward (3); forward temporaries (1, 1) live
        // while the activations are not yet allocated at the top addresses,
        // so the fused plan is no bigger than the activations' one.
        let requests = [
            // Activations, allocated in order, freed in reverse order.
            req(1000, 0, 30),
            req(1000, 5, 25),
            // Forward temporaries, before the second activation exists.
            req(1000, 1, 3),
            req(1000, 3, 5),
        ];
        let phases = [(1, 3), (1, 3), (1, 1), (1, 1)];
        let planned = plan(&requests, &phases);
        assert_eq!(planned.phase_groups, 2);
        assert_eq!(planned.fused_groups, 1);
        assert_eq!(planned.memory_layers, 1);
        assert_eq!(planned.plan.top, 2000);
        assert_eq!(live_lower_bound(&requests), 2000);
        assert_eq!(check::validate(&requests, &planned.plan), Ok(()));
    }

    #[test]
    fn a_fusion_that_widens_the_plan_over_a_long_span_is_rejected() {
        // The temporaries (2, 2) overlap every activation, so fused they would
        // widen the activations' plan over the activations' whole lifetime;
        // kept apart, the temporaries' short box is cheaper.
        let requests = [req(1000, 0, 100), req(500, 40, 50)];
        let phases = [(1, 2), (2, 2)];
        let planned = plan(&requests, &phases);
        assert_eq!(planned.phase_groups, 2);
        assert_eq!(planned.fused_groups, 2);
        assert_eq!(planned.plan.top, 1500);
        assert_eq!(check::validate(&requests, &planned.plan), Ok(()));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// For one size, Algorithm 1 uses exactly as many layers as the most
        /// requests live at one moment (the interval-graph colouring bound),
        /// its layers hold disjoint lifetimes, and the layered plan needs
        /// exactly the live lower bound.
        #[test]
        fn algorithm_1_is_optimal_for_one_size(
            spans in proptest::collection::vec((0usize..200, 1usize..40), 0..120),
            size in 1u64..10_000,
        ) {
            let requests: Vec<PlanRequest> = spans
                .iter()
                .map(|&(start, len)| req(size, start, start + len))
                .collect();
            let layers = algorithm_1(&requests);
            prop_assert_eq!(layers.len(), max_overlap(&requests));
            for (members, layer_size) in &layers {
                prop_assert_eq!(*layer_size, size);
                for pair in members.windows(2) {
                    prop_assert!(requests[pair[0]].end <= requests[pair[1]].start);
                }
            }
            let mut all: Vec<usize> = layers.iter().flat_map(|(m, _)| m.clone()).collect();
            all.sort_unstable();
            prop_assert_eq!(all, (0..requests.len()).collect::<Vec<_>>());
            let layout = layered(&requests);
            prop_assert_eq!(layout.top, live_lower_bound(&requests));
            let plan = Plan { offsets: layout.offsets, top: layout.top };
            prop_assert_eq!(check::validate(&requests, &plan), Ok(()));
        }

        /// Any sequence and any phases give a valid plan at or above the
        /// lower bound, and the same plan twice.
        #[test]
        fn plans_are_valid_and_deterministic(
            spans in proptest::collection::vec((0usize..300, 1usize..60, 1u64..6, 0u32..4), 0..150),
        ) {
            let requests: Vec<PlanRequest> = spans
                .iter()
                .map(|&(start, len, size, _)| req(size * 512, start, start + len))
                .collect();
            let phases: Vec<(PhaseSlot, PhaseSlot)> = spans
                .iter()
                .map(|&(start, len, _, extra)| {
                    let first = (start / 50) as PhaseSlot;
                    (first, ((start + len) / 50) as PhaseSlot + extra.min(1))
                })
                .collect();
            let planned = plan(&requests, &phases);
            prop_assert_eq!(check::validate(&requests, &planned.plan), Ok(()));
            prop_assert!(planned.plan.top >= live_lower_bound(&requests));
            prop_assert!(planned.fused_groups <= planned.phase_groups);
            prop_assert_eq!(plan(&requests, &phases), planned);
        }
    }
}

//! What-if 4 — **planned allocation** (STWeaver §5): how much memory a
//! lifetime-aware allocator that knows the whole sequence in advance would
//! need, against PyTorch's caching allocator and the live-tensor lower bound.
//!
//! The sequence is the orchestrated one as the simulator sees it (workspace
//! blocks at the reference GPU's size, every request rounded like the caching
//! allocator rounds it, 512 bytes by default). Each request has a lifetime
//! `[start, end)` in op indices (one allocation or free per index; a request
//! never freed lives past the last op). Two planners place the requests in
//! one address space, each plan is checked ([`check::validate`]: no two
//! requests overlap in both time and address), and the smaller one is the
//! result's `planned_bytes` (`winner` names it; STWeaver on a tie).
//!
//! # The STWeaver planner ([`stweaver`])
//!
//! 1. **HomoPhase groups.** A request's phases are those of the moments it
//!    is allocated and freed. The phases are the paper's computation phases,
//!    the forward and the backward of every simulated iteration, read from
//!    the schedule's phase windows: numbered in time order, a moment inside
//!    window `k` (`start ≤ t ≤ end`) has phase `2k + 1`. A moment in no such
//!    window has the "between" phase of the gap it falls in: `2k` for the gap
//!    before window `k` (`0` is the setup before the first forward, `2n` what
//!    follows the last backward), so data loading, `zero_grad` and the
//!    optimizer step of one iteration share the phase between its backward
//!    and the next forward. A request never freed ends with the sequence, in
//!    the phase of the last op. A phase is one occurrence (the forward of
//!    iteration 2, not every forward), as the paper's phases are per
//!    micro-batch. A group holds the requests with equal (start phase, end
//!    phase).
//! 2. **Local plans.** The paper packs a group's requests contiguously, which
//!    is optimal when all their lifetimes overlap; groups such as the forward
//!    temporaries of an iteration do not all overlap, so each group is laid
//!    out by the same HomoSize layering as the global step below (which gives
//!    the contiguous packing when every lifetime overlaps).
//! 3. **Fusion.** Groups are taken in phase order; each group not yet
//!    absorbed starts a chain that absorbs, in phase order, a later group whose
//!    start phase is the chain's end phase, then continues from the absorbed
//!    group's end phase (the paper does not say whether fused groups fuse
//!    again; chaining lets one iteration's groups become one plan). A fusion
//!    inserts the smaller plan into the larger one, which keeps its
//!    addresses. The paper walks one address cursor upwards from the larger
//!    plan's lowest address, placing at each step the earliest-starting
//!    request that fits there and moving past it; it also says each request
//!    goes "at the lowest available address". We implement the latter: each
//!    request of the smaller plan, earliest start first, goes to the lowest
//!    address (from the larger plan's lowest) at which it is free over its
//!    whole lifetime. A single upward walk never comes back down, so it
//!    stacks short-lived requests on top of each other; on the fixtures it
//!    left almost every fusion rejected. The fusion is kept when the
//!    time-memory product (used area over the plan's size × span) beats the
//!    weighted average of the two; with the plans' box areas as the weights
//!    (our choice: the paper leaves them open) and the used areas adding up,
//!    that is exactly "the fused box is smaller than the two boxes
//!    together", an integer test.
//! 4. **Global planning.** Every fused group becomes one request (its plan's
//!    size over its span, reserved as a whole, as in the paper). In descending size, the requests of size `S` (in
//!    allocation order) first go into the free intervals of the existing,
//!    larger layers — the tightest gap, over all layers, that is free over
//!    the whole lifetime — and the rest get new layers by Algorithm 1. The
//!    layers are stacked in the order they were made; a request's address is
//!    its group's address plus its offset in the group.
//!
//! **Algorithm 1 is optimal for one size** ([`stweaver::algorithm_1`]).
//! Requests of one size are intervals; a layer is a set of pairwise disjoint
//! intervals, so any plan needs at least ω layers, ω the most requests live
//! at one moment. The greedy takes requests by allocation time and opens a new
//! layer for `m` only when every existing layer's last request is freed
//! after `m.start`. Each such last request started no later than `m.start`
//! (allocation order), so it is live at `m.start`, as is `m`: when the greedy
//! opens its `k`-th layer, `k` requests are live at one moment, so `k ≤ ω`.
//! Hence it uses exactly ω layers (the interval-graph colouring argument;
//! which free layer is picked — the paper's "closest free time" — does not
//! change the count, only the idle time). A HomoSize group on its own is
//! therefore laid out optimally; the global plan as a whole has no proven
//! ratio (the problem is NP-hard), which is why a second planner runs too.
//!
//! # The best-fit planner ([`best_fit`])
//!
//! No grouping: larger requests first, each at the smallest gap of the
//! address range free over its whole lifetime, or on top.
//!
//! # Bounds, all exact for this sequence
//!
//! - `live_lower_bound_bytes` — the most bytes of (rounded) requests live at
//!   once: no allocator can do with less. This is the issue's "peak
//!   allocated".
//! - `planned_bytes` — the highest address of the better plan: a feasible
//!   plan, so the optimum lies between the two.
//! - `pytorch_reserved_bytes` — the caching allocator's peak reserved, whose
//!   layout is itself a feasible plan, so the optimum is also below it.
//! - `pytorch_allocated_bytes` — the caching allocator's peak allocated. It
//!   counts whole blocks, including the remainders the allocator leaves
//!   unsplit (a block is split only when the rest is large enough to reuse),
//!   so it is at least the live lower bound and may exceed a plan.
//!
//! The tests check `lower bound ≤ each plan ≤ PyTorch reserved` and that
//! both plans are valid on every fixture.

pub mod best_fit;
pub mod check;
pub mod stweaver;

use serde::{Deserialize, Serialize};

use super::WhatIfError;
use crate::orchestrator::Phase;
use crate::pipeline::{Config, Prepared};
use crate::simulator::{self, AllocatorConfig, GpuMemory, SimOp};
use crate::units::{Bytes, Nanos};

/// The version tag of [`PlanResult`].
pub const SCHEMA: &str = "memcast.whatif.plan/1";

/// Which planner gave `planned_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Planner {
    /// [`stweaver::plan`]: HomoPhase groups, fusion, HomoSize memory layers.
    Stweaver,
    /// [`best_fit::plan`]: best fit, larger requests first.
    BestFit,
}

/// The planned allocation against the caching allocator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanResult {
    /// Always [`SCHEMA`].
    pub schema: String,
    pub reference_gpu: String,
    /// Requests planned (non-empty allocations of the sequence).
    pub requests: u32,
    /// Distinct request sizes (HomoSize groups of the requests).
    pub size_groups: u32,
    /// HomoPhase groups: distinct (start phase, end phase) pairs.
    pub phase_groups: u32,
    /// Groups left after fusing adjacent HomoPhase groups.
    pub fused_groups: u32,
    /// Memory layers of the STWeaver plan's global step.
    pub memory_layers: u32,
    /// The most bytes live at once (rounded requests): the lower bound, the
    /// issue's "peak allocated".
    pub live_lower_bound_bytes: Bytes,
    /// The memory the STWeaver plan needs.
    pub stweaver_bytes: Bytes,
    /// The memory the best-fit plan needs.
    pub best_fit_bytes: Bytes,
    /// The smaller of the two plans.
    pub planned_bytes: Bytes,
    /// The planner that gave `planned_bytes`.
    pub winner: Planner,
    /// The caching allocator's peak reserved on the same sequence.
    pub pytorch_reserved_bytes: Bytes,
    /// The caching allocator's peak allocated: whole blocks, so it counts
    /// unsplit remainders and can exceed both the lower bound and the plan.
    pub pytorch_allocated_bytes: Bytes,
    /// PyTorch's fragmentation against the plan: reserved / planned, in
    /// thousandths (1166 = 116.6 %).
    pub reserved_per_planned_permille: u64,
    /// The plan against the lower bound: planned / live lower bound, in
    /// thousandths (at least 1000).
    pub planned_per_lower_bound_permille: u64,
    /// The reference GPU's CUDA context, to add for a total.
    pub context_bytes: Bytes,
    pub notes: Vec<String>,
}

/// One request of the plan: rounded size and lifetime in op indices
/// `[start, end)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanRequest {
    pub size: u64,
    pub start: usize,
    pub end: usize,
}

/// A placement of requests: one offset per request (in request order) and
/// the memory the plan needs (the highest address used).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub offsets: Vec<u64>,
    pub top: u64,
}

/// The requests of an op sequence, rounded with `allocator`'s rules.
pub fn requests(ops: &[SimOp], allocator: &AllocatorConfig) -> Vec<PlanRequest> {
    let mut open: std::collections::BTreeMap<u64, usize> = std::collections::BTreeMap::new();
    let mut out: Vec<PlanRequest> = Vec::new();
    for (index, op) in ops.iter().enumerate() {
        match *op {
            SimOp::Alloc { block, size, .. } if size.get() > 0 => {
                open.insert(block, out.len());
                out.push(PlanRequest {
                    size: allocator.round_size(size.get()),
                    start: index,
                    end: ops.len() + 1,
                });
            }
            SimOp::Free { block } => {
                if let Some(slot) = open.remove(&block).and_then(|i| out.get_mut(i)) {
                    slot.end = index;
                }
            }
            _ => {}
        }
    }
    out
}

/// The (start, end) phase of every request: the phase of its allocation and
/// free ops (`op_times` gives each op's time); a request never freed ends
/// with the sequence, in the phase of its last op.
pub fn request_phases(
    requests: &[PlanRequest],
    op_times: &[Nanos],
    timeline: &stweaver::PhaseTimeline,
) -> Vec<(stweaver::PhaseSlot, stweaver::PhaseSlot)> {
    let slot_at = |index: usize| op_times.get(index).map(|&t| timeline.slot(t));
    let last = op_times.last().map_or(0, |&t| timeline.slot(t));
    requests
        .iter()
        .map(|r| {
            let start = slot_at(r.start).unwrap_or(0);
            let end = slot_at(r.end).unwrap_or(last);
            (start, end)
        })
        .collect()
}

/// The most bytes live at once.
pub fn live_lower_bound(requests: &[PlanRequest]) -> u64 {
    let mut deltas: Vec<(usize, i128)> = Vec::with_capacity(requests.len() * 2);
    for r in requests {
        deltas.push((r.start, i128::from(r.size)));
        deltas.push((r.end, -i128::from(r.size)));
    }
    // Frees sort before allocations at the same index (lifetimes are
    // half-open); with one op per index they never share one anyway.
    deltas.sort_unstable();
    let mut live = 0i128;
    let mut peak = 0i128;
    for (_, delta) in deltas {
        live += delta;
        peak = peak.max(live);
    }
    u64::try_from(peak).unwrap_or(u64::MAX)
}

/// `part / whole` in thousandths, rounded; 0 when `whole` is 0.
fn permille(part: u64, whole: u64) -> u64 {
    if whole == 0 {
        return 0;
    }
    let value = (u128::from(part) * 1000 + u128::from(whole) / 2) / u128::from(whole);
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// Both plans of a prepared sequence, with what they were made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plans {
    /// The requests of the sequence (rounded sizes, op-index lifetimes).
    pub requests: Vec<PlanRequest>,
    /// The (start, end) phase of every request.
    pub phases: Vec<(stweaver::PhaseSlot, stweaver::PhaseSlot)>,
    pub stweaver: stweaver::StweaverPlan,
    pub best_fit: Plan,
    /// The caching allocator's peaks on the same sequence.
    pub pytorch: simulator::Stats,
}

/// Makes both plans of the prepared sequence (the orchestrated schedule on
/// `config`'s reference GPU) and checks that each is valid.
pub fn plan_sequence(prepared: &Prepared, config: &Config) -> Result<Plans, WhatIfError> {
    let allocator = if config.alloc_conf.trim().is_empty() {
        AllocatorConfig::pytorch_defaults()
    } else {
        AllocatorConfig::parse(&config.alloc_conf, simulator::RuleVersion::New)
            .map_err(crate::pipeline::Error::from)?
    };
    let schedule = &prepared.orchestrated.schedule;
    let (ops, ops_through) = crate::pipeline::schedule_ops(schedule, &config.reference);
    // The time of each op: that of the event that issued it.
    let mut op_times: Vec<Nanos> = Vec::with_capacity(ops.len());
    for (event, &through) in schedule.events.iter().zip(&ops_through) {
        op_times.resize(through.max(op_times.len()), event.time);
    }
    let simulation = simulator::simulate(&ops, &allocator, &GpuMemory::unlimited());
    let requests = requests(&ops, &allocator);
    // The paper's computation phases: forward and backward of each
    // iteration; the rest (data loading, zero_grad, optimizer step) lies in
    // the gaps between them.
    let timeline = stweaver::PhaseTimeline::new(
        schedule
            .phases
            .iter()
            .filter(|w| matches!(w.phase, Phase::Forward | Phase::Backward))
            .map(|w| (w.start, w.end)),
    );
    let phases = request_phases(&requests, &op_times, &timeline);
    let grouped = stweaver::plan(&requests, &phases);
    let fitted = best_fit::plan(&requests);
    for (name, plan) in [("STWeaver", &grouped.plan), ("best-fit", &fitted)] {
        check::validate(&requests, plan).map_err(|invalid| {
            WhatIfError::Inconsistent(format!(
                "the {name} allocation plan is not valid: {invalid}"
            ))
        })?;
    }
    Ok(Plans {
        requests,
        phases,
        stweaver: grouped,
        best_fit: fitted,
        pytorch: simulation.peak,
    })
}

/// Plans the prepared sequence with both planners and compares the better
/// plan with the caching allocator.
pub fn compare(prepared: &Prepared, config: &Config) -> Result<PlanResult, WhatIfError> {
    let plans = plan_sequence(prepared, config)?;
    let lower = live_lower_bound(&plans.requests);
    let grouped = &plans.stweaver;
    let (winner, planned) = if plans.best_fit.top < grouped.plan.top {
        (Planner::BestFit, plans.best_fit.top)
    } else {
        (Planner::Stweaver, grouped.plan.top)
    };
    let mut sizes: Vec<u64> = plans.requests.iter().map(|r| r.size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let reserved = plans.pytorch.reserved;
    let winner_name = match winner {
        Planner::Stweaver => "STWeaver",
        Planner::BestFit => "best fit",
    };
    Ok(PlanResult {
        schema: SCHEMA.to_owned(),
        reference_gpu: config.reference.name.clone(),
        requests: u32::try_from(plans.requests.len()).unwrap_or(u32::MAX),
        size_groups: u32::try_from(sizes.len()).unwrap_or(u32::MAX),
        phase_groups: grouped.phase_groups,
        fused_groups: grouped.fused_groups,
        memory_layers: grouped.memory_layers,
        live_lower_bound_bytes: Bytes(lower),
        stweaver_bytes: Bytes(grouped.plan.top),
        best_fit_bytes: Bytes(plans.best_fit.top),
        planned_bytes: Bytes(planned),
        winner,
        pytorch_reserved_bytes: reserved,
        pytorch_allocated_bytes: plans.pytorch.allocated,
        reserved_per_planned_permille: permille(reserved.get(), planned),
        planned_per_lower_bound_permille: permille(planned, lower),
        context_bytes: config.reference.overheads.context_bytes,
        notes: vec![
            "the plans are offline: they know every request's size and lifetime in advance (the whole simulated sequence)".to_owned(),
            format!("two planners: STWeaver (HomoPhase groups planned locally and fused, then HomoSize memory layers, larger sizes first) and best fit (no grouping); the smaller plan is kept: {winner_name}"),
            "fragmentation of PyTorch's allocator = reserved / planned; the optimum lies between the live lower bound and the plan".to_owned(),
            "the live lower bound is the issue's \"peak allocated\": the most bytes of requests live at once; PyTorch's own peak allocated counts whole blocks, unsplit remainders included, so it can exceed the plan".to_owned(),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(size: u64, start: usize, end: usize) -> PlanRequest {
        PlanRequest { size, start, end }
    }

    #[test]
    fn requests_come_from_ops_rounded_and_freed() {
        let ops = [
            SimOp::Alloc {
                block: 1,
                size: Bytes(1),
                stream: 0,
            },
            SimOp::Alloc {
                block: 2,
                size: Bytes(1000),
                stream: 0,
            },
            SimOp::Free { block: 1 },
            SimOp::Alloc {
                block: 3,
                size: Bytes(0),
                stream: 0,
            },
        ];
        let r = requests(&ops, &AllocatorConfig::pytorch_defaults());
        assert_eq!(r, [req(512, 0, 2), req(1024, 1, 5)]);
        assert_eq!(live_lower_bound(&r), 1536);
    }

    #[test]
    fn phases_of_requests_follow_the_windows_and_the_end_of_the_sequence() {
        // Windows [10, 20] and [30, 40]: phases 0 (before), 1, 2, 3, 4 (after).
        let timeline =
            stweaver::PhaseTimeline::new([(Nanos(30), Nanos(40)), (Nanos(10), Nanos(20))]);
        let op_times = [5, 10, 20, 25, 35, 45].map(Nanos);
        let requests = [
            req(512, 0, 1),
            req(512, 2, 4),
            req(512, 3, 7),
            req(512, 5, 7),
        ];
        assert_eq!(
            request_phases(&requests, &op_times, &timeline),
            [(0, 1), (1, 3), (2, 4), (4, 4)]
        );
    }

    #[test]
    fn permille_rounds_and_survives_zero() {
        assert_eq!(permille(1166, 1000), 1166);
        assert_eq!(permille(2, 3), 667);
        assert_eq!(permille(5, 0), 0);
    }

    #[test]
    fn both_planners_give_valid_plans_above_the_bound_on_random_sequences() {
        // A fixed linear congruential sequence: deterministic, no dependency.
        let mut state = 12345u64;
        let mut next = |m: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % m
        };
        for _ in 0..40 {
            let n = 60;
            let requests: Vec<PlanRequest> = (0..n)
                .map(|i| {
                    let len = 1 + next(15) as usize;
                    req(512 * (1 + next(8)), i, i + len)
                })
                .collect();
            // Phases: windows of 10 ops.
            let phases: Vec<(u32, u32)> = requests
                .iter()
                .map(|r| ((r.start / 10) as u32, (r.end / 10) as u32))
                .collect();
            let lower = live_lower_bound(&requests);
            let grouped = stweaver::plan(&requests, &phases);
            let fitted = best_fit::plan(&requests);
            for plan in [&grouped.plan, &fitted] {
                assert_eq!(check::validate(&requests, plan), Ok(()));
                assert!(plan.top >= lower);
            }
        }
    }
}

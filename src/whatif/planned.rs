//! What-if 4 — **planned allocation** (STWeaver §5): how much memory a
//! lifetime-aware allocator that knows the whole sequence in advance would
//! need, against PyTorch's caching allocator and the live-tensor lower bound.
//!
//! The sequence is the orchestrated one as the simulator sees it (workspace
//! blocks at the reference GPU's size, every request rounded like the caching
//! allocator rounds it, 512 bytes by default). The plan places requests in one
//! address space, HomoSize order: larger requests first (requests of one size
//! in allocation order), each at the best-fitting gap of the address range
//! that is free over its whole lifetime, or on top when no gap fits. Requests
//! of one size whose lifetimes do not overlap so share a memory layer.
//!
//! Bounds, all exact for this sequence:
//! - `live_lower_bound_bytes` — the most bytes live at once (the simulator's
//!   peak allocated): no allocator can do with less;
//! - `planned_bytes` — the highest address of the plan: a feasible plan, so
//!   the optimum lies between the two;
//! - `pytorch_reserved_bytes` — the caching allocator's peak reserved, whose
//!   layout is itself a feasible plan, so the optimum is also below it.
//!
//! The heuristic has no proven ratio; the result reports the plan it found,
//! and the tests check `lower bound ≤ plan ≤ PyTorch reserved` on every
//! fixture.

use serde::{Deserialize, Serialize};

use super::WhatIfError;
use crate::simulator::{self, AllocatorConfig, Device, SimOp};
use crate::units::Bytes;
use crate::{Config, Prepared};

/// The version tag of [`PlanResult`].
pub const SCHEMA: &str = "memcast.whatif.plan/1";

/// The planned allocation against the caching allocator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanResult {
    /// Always [`SCHEMA`].
    pub schema: String,
    pub reference_gpu: String,
    /// Requests planned (non-empty allocations of the sequence).
    pub requests: u32,
    /// Distinct request sizes (HomoSize groups).
    pub size_groups: u32,
    /// The most bytes live at once (rounded requests): the lower bound.
    pub live_lower_bound_bytes: Bytes,
    /// The memory the offline plan needs.
    pub planned_bytes: Bytes,
    /// The caching allocator's peak reserved and allocated on the same sequence.
    pub pytorch_reserved_bytes: Bytes,
    pub pytorch_allocated_bytes: Bytes,
    /// The reference GPU's CUDA context, to add for a total.
    pub context_bytes: Bytes,
    pub notes: Vec<String>,
}

/// One request of the plan: rounded size and lifetime in op indices
/// `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub size: u64,
    pub start: usize,
    pub end: usize,
}

/// The requests of an op sequence, rounded with `allocator`'s rules.
pub fn requests(ops: &[SimOp], allocator: &AllocatorConfig) -> Vec<Request> {
    let mut open: std::collections::BTreeMap<u64, usize> = std::collections::BTreeMap::new();
    let mut out: Vec<Request> = Vec::new();
    for (index, op) in ops.iter().enumerate() {
        match *op {
            SimOp::Alloc { block, size, .. } if size.get() > 0 => {
                open.insert(block, out.len());
                out.push(Request {
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

/// The most bytes live at once.
pub fn live_lower_bound(requests: &[Request]) -> u64 {
    let mut deltas: Vec<(usize, i128)> = Vec::with_capacity(requests.len() * 2);
    for r in requests {
        deltas.push((r.start, i128::from(r.size)));
        deltas.push((r.end, -i128::from(r.size)));
    }
    // Frees at an index happen before allocations at a later index only;
    // starts and ends never share an index (one op per index).
    deltas.sort_unstable();
    let mut live = 0i128;
    let mut peak = 0i128;
    for (_, delta) in deltas {
        live += delta;
        peak = peak.max(live);
    }
    u64::try_from(peak).unwrap_or(u64::MAX)
}

/// Places every request; returns the offsets (in request order) and the
/// highest address used.
pub fn plan(requests: &[Request]) -> (Vec<u64>, u64) {
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&i| {
        let r = requests.get(i).copied().unwrap_or(Request {
            size: 0,
            start: 0,
            end: 0,
        });
        (std::cmp::Reverse(r.size), r.start, i)
    });
    let mut offsets: Vec<Option<u64>> = vec![None; requests.len()];
    let mut placed: Vec<(usize, usize, u64, u64)> = Vec::with_capacity(requests.len());
    let mut top = 0u64;
    let mut busy: Vec<(u64, u64)> = Vec::new();
    for index in order {
        let Some(r) = requests.get(index) else {
            continue;
        };
        busy.clear();
        busy.extend(
            placed
                .iter()
                .filter(|p| p.0 < r.end && r.start < p.1)
                .map(|p| (p.2, p.3)),
        );
        busy.sort_unstable();
        // Best fit: the smallest gap between busy ranges that holds `size`.
        let mut best: Option<(u64, u64)> = None;
        let mut cursor = 0u64;
        for &(begin, end) in &busy {
            if begin > cursor {
                let gap = begin - cursor;
                if gap >= r.size && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, cursor));
                }
            }
            cursor = cursor.max(end);
        }
        let offset = best.map_or(cursor, |(_, at)| at);
        let end = offset.saturating_add(r.size);
        top = top.max(end);
        placed.push((r.start, r.end, offset, end));
        if let Some(slot) = offsets.get_mut(index) {
            *slot = Some(offset);
        }
    }
    (
        offsets.into_iter().map(Option::unwrap_or_default).collect(),
        top,
    )
}

/// Plans the prepared sequence and compares it with the caching allocator.
pub fn compare(prepared: &Prepared, config: &Config) -> Result<PlanResult, WhatIfError> {
    let allocator = if config.alloc_conf.trim().is_empty() {
        AllocatorConfig::pytorch_defaults()
    } else {
        AllocatorConfig::parse(&config.alloc_conf, simulator::RuleVersion::New)
            .map_err(crate::Error::from)?
    };
    let (ops, _) = crate::schedule_ops(&prepared.orchestrated.schedule, &config.reference);
    let simulation = simulator::simulate(&ops, &allocator, &Device::unlimited());
    let requests = requests(&ops, &allocator);
    let lower = live_lower_bound(&requests);
    let (_, planned) = plan(&requests);
    let mut sizes: Vec<u64> = requests.iter().map(|r| r.size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    Ok(PlanResult {
        schema: SCHEMA.to_owned(),
        reference_gpu: config.reference.name.clone(),
        requests: u32::try_from(requests.len()).unwrap_or(u32::MAX),
        size_groups: u32::try_from(sizes.len()).unwrap_or(u32::MAX),
        live_lower_bound_bytes: Bytes(lower),
        planned_bytes: Bytes(planned),
        pytorch_reserved_bytes: simulation.peak.reserved,
        pytorch_allocated_bytes: simulation.peak.allocated,
        context_bytes: config.reference.overheads.context_bytes,
        notes: vec![
            "the plan is offline: it knows every request's size and lifetime in advance (the whole simulated sequence)".to_owned(),
            "fragmentation of PyTorch's allocator = reserved / planned; the optimum lies between the live lower bound and the plan".to_owned(),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(size: u64, start: usize, end: usize) -> Request {
        Request { size, start, end }
    }

    /// No two requests that overlap in time overlap in memory.
    fn assert_valid(requests: &[Request], offsets: &[u64]) {
        for (i, a) in requests.iter().enumerate() {
            for (j, b) in requests.iter().enumerate().skip(i + 1) {
                let in_time = a.start < b.end && b.start < a.end;
                let in_space = offsets[i] < offsets[j] + b.size && offsets[j] < offsets[i] + a.size;
                assert!(!(in_time && in_space), "requests {i} and {j} collide");
            }
        }
    }

    #[test]
    fn disjoint_lifetimes_share_one_layer() {
        let requests = [req(100, 0, 2), req(100, 2, 4), req(100, 4, 6)];
        let (offsets, top) = plan(&requests);
        assert_eq!(top, 100);
        assert_eq!(live_lower_bound(&requests), 100);
        assert_valid(&requests, &offsets);
    }

    #[test]
    fn smaller_requests_fill_gaps_of_larger_ones() {
        // A big block with a hole in time at offset 0..300 is reused by two
        // small blocks stacked in it.
        let requests = [
            req(300, 0, 2),
            req(500, 0, 10),
            req(100, 3, 8),
            req(200, 4, 9),
            req(300, 9, 12),
        ];
        let (offsets, top) = plan(&requests);
        assert_valid(&requests, &offsets);
        assert_eq!(live_lower_bound(&requests), 800);
        assert_eq!(top, 800);
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
    fn random_sequences_give_valid_plans_above_the_bound() {
        // A fixed linear congruential sequence: deterministic, no dependency.
        let mut state = 12345u64;
        let mut next = |m: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % m
        };
        for _ in 0..20 {
            let n = 40;
            let requests: Vec<Request> = (0..n)
                .map(|i| {
                    let len = 1 + next(15) as usize;
                    req(512 * (1 + next(8)), i, i + len)
                })
                .collect();
            let (offsets, top) = plan(&requests);
            assert_valid(&requests, &offsets);
            assert!(top >= live_lower_bound(&requests));
        }
    }
}

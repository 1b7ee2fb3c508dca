//! The best-fit planner, the second opinion next to [`super::stweaver`]: no
//! grouping, larger requests first (requests of one size in allocation
//! order), each placed at the smallest gap of the address range that is free
//! over its whole lifetime, or on top when no gap fits.
//!
//! It has no proven ratio; it is kept because it often beats the grouped
//! planner (the result names the winner). Cost: the placed requests are kept
//! in address order (`AddressOrdered`), so each placement is one pass over
//! them with no sorting: `O(n²)` simple comparisons in all, about 30 ms for
//! the largest fixture's 7 749 requests in a release build.

use super::{Plan, PlanRequest};

/// Places every request by best fit.
pub fn plan(requests: &[PlanRequest]) -> Plan {
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&i| {
        let r = requests.get(i).copied().unwrap_or_default();
        (std::cmp::Reverse(r.size), r.start, i)
    });
    let mut placed = AddressOrdered::default();
    let mut offsets = vec![0u64; requests.len()];
    for request_idx in order {
        let Some(r) = requests.get(request_idx) else {
            continue;
        };
        let offset = placed.best_fit(r);
        placed.insert(offset, r);
        if let Some(slot) = offsets.get_mut(request_idx) {
            *slot = offset;
        }
    }
    Plan {
        offsets,
        top: placed.top(),
    }
}

/// Placed requests in address order: `(offset, end address, start, end)`.
#[derive(Debug, Clone, Default)]
pub(super) struct AddressOrdered {
    items: Vec<(u64, u64, usize, usize)>,
    top: u64,
}

impl AddressOrdered {
    /// The highest address used.
    pub(super) fn top(&self) -> u64 {
        self.top
    }

    pub(super) fn insert(&mut self, offset: u64, request: &PlanRequest) {
        let end = offset.saturating_add(request.size);
        let item = (offset, end, request.start, request.end);
        let at = self.items.partition_point(|probe| *probe < item);
        self.items.insert(at, item);
        self.top = self.top.max(end);
    }

    /// The address ranges busy during the request's lifetime, in address
    /// order (they may overlap each other).
    fn busy<'a>(&'a self, request: &'a PlanRequest) -> impl Iterator<Item = (u64, u64)> + 'a {
        self.items
            .iter()
            .filter(|item| item.2 < request.end && request.start < item.3)
            .map(|item| (item.0, item.1))
    }

    /// The start of the smallest gap that holds the request over its whole
    /// lifetime, or the top of what is busy then.
    pub(super) fn best_fit(&self, request: &PlanRequest) -> u64 {
        let mut best: Option<(u64, u64)> = None;
        let mut cursor = 0u64;
        for (begin, end) in self.busy(request) {
            if begin > cursor {
                let gap = begin - cursor;
                if gap >= request.size && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, cursor));
                }
            }
            cursor = cursor.max(end);
        }
        best.map_or(cursor, |(_, at)| at)
    }

    /// The lowest address from `from` at which the request is free over its
    /// whole lifetime.
    pub(super) fn first_fit(&self, request: &PlanRequest, from: u64) -> u64 {
        let mut cursor = from;
        for (begin, end) in self.busy(request) {
            if begin >= cursor.saturating_add(request.size) {
                break;
            }
            cursor = cursor.max(end);
        }
        cursor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(size: u64, start: usize, end: usize) -> PlanRequest {
        PlanRequest { size, start, end }
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
        let plan = plan(&requests);
        assert_eq!(super::super::check::validate(&requests, &plan), Ok(()));
        assert_eq!(plan.top, 800);
    }
}

//! The validity checker of an allocation plan: no two requests that are live
//! at the same time share an address, and every request lies below the
//! plan's top.
//!
//! A sweep over time in `O(n log n)`: the live requests are kept in an
//! address-ordered map, and since the live set is disjoint as long as no
//! collision was found, a new request only needs to be compared with its two
//! neighbours in address order. Cheap enough for a debug assertion on every
//! plan and for the tests over every fixture.

use std::collections::BTreeMap;

use super::{Plan, PlanRequest};

/// Why a plan is not valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// The plan does not give one offset per request.
    #[error("the plan has {offsets} offsets for {requests} requests")]
    Length { offsets: usize, requests: usize },
    /// Two requests are live at the same time at overlapping addresses.
    #[error("requests {first} and {second} overlap in both time and address")]
    Collision { first: usize, second: usize },
    /// A request ends above the plan's top (or past the address space).
    #[error("request {0} ends above the plan's top")]
    AboveTop(usize),
}

/// Checks that `plan` places `requests` without two live requests sharing an
/// address. Lifetimes are half-open `[start, end)`: a request freed at an
/// index may share its address with one allocated at that index. Requests of
/// size 0 occupy nothing.
pub fn validate(requests: &[PlanRequest], plan: &Plan) -> Result<(), Invalid> {
    if plan.offsets.len() != requests.len() {
        return Err(Invalid::Length {
            offsets: plan.offsets.len(),
            requests: requests.len(),
        });
    }
    // (time, 0 = free before 1 = alloc, request)
    let mut events: Vec<(usize, u8, usize)> = Vec::with_capacity(requests.len() * 2);
    for (index, (request, &offset)) in requests.iter().zip(&plan.offsets).enumerate() {
        let end = offset
            .checked_add(request.size)
            .ok_or(Invalid::AboveTop(index))?;
        if end > plan.top {
            return Err(Invalid::AboveTop(index));
        }
        if request.size > 0 && request.start < request.end {
            events.push((request.start, 1, index));
            events.push((request.end, 0, index));
        }
    }
    events.sort_unstable();
    // Live requests by offset: offset -> (end address, request).
    let mut live: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
    for (_, kind, index) in events {
        let (Some(request), Some(&offset)) = (requests.get(index), plan.offsets.get(index)) else {
            continue;
        };
        if kind == 0 {
            live.remove(&offset);
            continue;
        }
        let end = offset.saturating_add(request.size);
        if let Some((_, &(below_end, other))) = live.range(..=offset).next_back() {
            if below_end > offset {
                return Err(collision(index, other));
            }
        }
        if let Some((&above, &(_, other))) = live.range(offset..).next() {
            if above < end {
                return Err(collision(index, other));
            }
        }
        live.insert(offset, (end, index));
    }
    Ok(())
}

fn collision(a: usize, b: usize) -> Invalid {
    Invalid::Collision {
        first: a.min(b),
        second: a.max(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(size: u64, start: usize, end: usize) -> PlanRequest {
        PlanRequest { size, start, end }
    }

    fn plan(offsets: &[u64], top: u64) -> Plan {
        Plan {
            offsets: offsets.to_vec(),
            top,
        }
    }

    /// The quadratic definition, to compare the sweep with.
    fn brute_force(requests: &[PlanRequest], offsets: &[u64]) -> bool {
        requests.iter().enumerate().all(|(i, a)| {
            requests.iter().enumerate().skip(i + 1).all(|(j, b)| {
                let in_time = a.start < b.end && b.start < a.end;
                let in_space = offsets[i] < offsets[j] + b.size && offsets[j] < offsets[i] + a.size;
                a.size == 0 || b.size == 0 || !(in_time && in_space)
            })
        })
    }

    #[test]
    fn finds_collisions_in_time_and_space_only() {
        let requests = [req(100, 0, 4), req(100, 2, 6), req(100, 4, 8)];
        // 0 and 2 share an address but not a moment; 1 sits above.
        assert_eq!(validate(&requests, &plan(&[0, 100, 0], 200)), Ok(()));
        // 0 and 1 are live together at overlapping addresses.
        assert_eq!(
            validate(&requests, &plan(&[0, 50, 0], 200)),
            Err(Invalid::Collision {
                first: 0,
                second: 1
            })
        );
        // Touching address ranges do not collide.
        assert_eq!(validate(&requests, &plan(&[100, 0, 100], 200)), Ok(()));
        assert_eq!(
            validate(&requests, &plan(&[0, 100, 0], 199)),
            Err(Invalid::AboveTop(1))
        );
        assert_eq!(
            validate(&requests, &plan(&[0, 100], 200)),
            Err(Invalid::Length {
                offsets: 2,
                requests: 3
            })
        );
        // A request nested inside a bigger live one.
        let nested = [req(1000, 0, 10), req(10, 3, 4)];
        assert!(validate(&nested, &plan(&[0, 500], 1000)).is_err());
    }

    #[test]
    fn agrees_with_the_pairwise_definition() {
        let mut state = 99u64;
        let mut next = |m: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % m
        };
        for _ in 0..300 {
            let n = 1 + next(12) as usize;
            let requests: Vec<PlanRequest> = (0..n)
                .map(|_| {
                    let start = next(10) as usize;
                    req(next(4) * 8, start, start + 1 + next(6) as usize)
                })
                .collect();
            let offsets: Vec<u64> = (0..n).map(|_| next(5) * 8).collect();
            let expected = brute_force(&requests, &offsets);
            assert_eq!(
                validate(&requests, &plan(&offsets, 1 << 20)).is_ok(),
                expected,
                "{requests:?} at {offsets:?}"
            );
        }
    }
}

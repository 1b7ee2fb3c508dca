//! A program's leaves in the form the stream reads them fastest: each
//! leaf's key and its two leading numbers (time, size or how far back)
//! with their few terms inline, so streaming a job touches one small
//! record per event instead of a leaf's polynomials on the heap.

use super::{build, EventKey, FactsRef, JobEvent, Leaf, Poly, Terms};
use crate::kernels::{ArchSet, PerGpu};
use crate::orchestrator::{Category, EventKind};
use crate::units::{Bytes, Nanos};

/// A leaf's key and its two leading numbers with their few terms inline,
/// evaluated as [`Poly::at`] evaluates them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FastLeaf {
    head: Head,
    time: FastPoly,
    second: FastPoly,
}

/// What an event's key says of the event it makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Head {
    kind: EventKind,
    category: Category,
    on: ArchSet,
    per_gpu: Option<PerGpu>,
}

impl Head {
    pub(super) fn of(key: &EventKey) -> Head {
        Head {
            kind: key.kind,
            category: key.category,
            on: key.on,
            per_gpu: key.per_gpu,
        }
    }

    /// The event of leaf `item`, the `index`-th of the job, at `terms`,
    /// whose time and second number (size, or how far back its block was
    /// made) are `time` and `second`.
    #[inline]
    pub(super) fn event(
        &self,
        [time, second]: [i64; 2],
        item: u32,
        index: u64,
        terms: &Terms,
    ) -> JobEvent {
        let (block, size) = match self.kind {
            EventKind::Alloc => (index, Bytes(u64::try_from(second).unwrap_or(0))),
            EventKind::Free => (
                index.saturating_sub(u64::try_from(second).unwrap_or(0)),
                Bytes::ZERO,
            ),
        };
        let copy = |v: i64| u32::try_from(v).unwrap_or(u32::MAX);
        JobEvent {
            time: Nanos(time),
            kind: self.kind,
            block,
            size,
            category: self.category,
            on: self.on,
            per_gpu: self.per_gpu,
            facts: FactsRef {
                item,
                copy: [copy(terms.vars[0]), copy(terms.vars[2])],
            },
        }
    }
}

/// A [`Poly`] of at most four terms, in the order of their masks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FastPoly {
    n: u8,
    masks: [u8; 4],
    coefs: [i64; 4],
}

impl FastPoly {
    fn of(poly: &Poly) -> Option<FastPoly> {
        let mut fast = FastPoly {
            n: 0,
            masks: [0; 4],
            coefs: [0; 4],
        };
        let mut left = poly.terms;
        while left != 0 {
            let mask = left.trailing_zeros() as usize;
            left &= left - 1;
            let i = usize::from(fast.n);
            *fast.masks.get_mut(i)? = u8::try_from(mask).ok()?;
            *fast.coefs.get_mut(i)? = *poly.c.get(mask)?;
            fast.n += 1;
        }
        Some(fast)
    }

    /// The value at `terms`: [`Poly::at`]'s sum, term by term.
    #[inline]
    fn at(&self, terms: &Terms) -> i64 {
        let mut sum = 0i64;
        for i in 0..usize::from(self.n.min(4)) {
            let (Some(&mask), Some(&c)) = (self.masks.get(i), self.coefs.get(i)) else {
                continue;
            };
            let Some(&t) = terms.t.get(usize::from(mask)) else {
                continue;
            };
            sum = sum.saturating_add(c.saturating_mul(t));
        }
        sum
    }
}

impl FastLeaf {
    pub(super) fn of(leaf: &Leaf, keys: &[EventKey]) -> Option<FastLeaf> {
        Some(FastLeaf {
            head: Head::of(keys.get(leaf.key as usize)?),
            time: FastPoly::of(leaf.attrs.get(build::TIME)?)?,
            second: FastPoly::of(leaf.attrs.get(build::SIZE_OR_BACK)?)?,
        })
    }

    /// [`super::Program::event`] of a leaf read fast: the same event.
    #[inline]
    pub(super) fn event(&self, item: u32, index: u64, terms: &Terms) -> JobEvent {
        let numbers = [self.time.at(terms), self.second.at(terms)];
        self.head.event(numbers, item, index, terms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A poly of at most four terms reads as the poly does, saturation
        /// included.
        #[test]
        fn a_fast_poly_is_its_poly(
            terms in proptest::collection::vec((0usize..16, any::<i64>()), 0..5),
            vars in proptest::array::uniform4(-5i64..1_000_000),
            big in any::<bool>(),
        ) {
            let mut poly = Poly::default();
            for (mask, coef) in terms {
                poly.add(mask, if big { coef } else { coef % 1_000_000 });
            }
            let terms = Terms::of(vars);
            match FastPoly::of(&poly) {
                Some(fast) => prop_assert_eq!(fast.at(&terms), poly.at(&terms)),
                None => prop_assert!(poly.terms.count_ones() > 4),
            }
        }
    }
}

//! Where the runs at capacity that share an unlimited simulation are handed
//! from it to their own jobs ([`super::simulate::simulate_from`]).

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use super::simulate::Parted;
use crate::report::SimulatedRun;
use crate::units::Bytes;

/// Where the runs at capacity that share an unlimited run are handed from
/// that run to their own jobs: one slot per device sharing it, filled as
/// each parts (or is left to run alone) and, when the unlimited run ends,
/// with the run for every device it never took past its room. A job for a
/// device takes its slot, waiting while the unlimited run has not decided
/// it: shells that run jobs side by side go on with a run at capacity as
/// soon as it parts; shells that run them in turn find every slot decided.
pub struct Handoffs {
    slots: Mutex<Vec<Slot>>,
    decided: Condvar,
    /// What the runs set aside and not yet taken may hold.
    keep: u64,
    /// The unlimited run is wanted only for what it hands on: it stops once
    /// it has decided every slot ([`Handoffs::sharing_only`]).
    sharing_only: bool,
}

/// One device's slot in [`Handoffs`].
pub(super) enum Slot {
    /// The unlimited run has not yet decided it.
    Open,
    /// Its run set aside, to go on from there.
    Parted(Box<Parted>),
    /// Its run starts from the first event.
    Alone,
    /// The unlimited run ended without taking it past its room: that run
    /// (without its detail) is its run.
    Shared(Box<SimulatedRun>),
    /// Its job took it.
    Taken,
}

/// What a device's job finds in its slot ([`Handoffs::take`]).
pub enum Handed {
    /// Go on from where it parted.
    Parted(Box<Parted>),
    /// Run from the first event.
    Alone,
    /// The unlimited run never took it past its room; here it is, capped.
    Shared(SimulatedRun),
}

impl Handoffs {
    /// Slots for `devices` devices; the runs set aside hold at most `keep`
    /// bytes together.
    pub fn new(devices: usize, keep: Bytes) -> Handoffs {
        Handoffs {
            slots: Mutex::new((0..devices).map(|_| Slot::Open).collect()),
            decided: Condvar::new(),
            keep: keep.get(),
            sharing_only: false,
        }
    }

    /// The same slots, for an unlimited run wanted only for the runs at
    /// capacity it hands on (their verdicts, without a report): it stops
    /// as soon as it has decided every slot, since nothing reads the rest.
    pub fn sharing_only(self) -> Handoffs {
        Handoffs {
            sharing_only: true,
            ..self
        }
    }

    /// Whether the run stops once every slot is decided.
    pub(super) fn stops_when_decided(&self) -> bool {
        self.sharing_only
    }

    /// No device shares the run.
    pub fn none() -> Handoffs {
        Handoffs::new(0, Bytes::ZERO)
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Decides device `i`'s slot (once: a decided slot is kept).
    pub(super) fn decide(&self, i: usize, slot: Slot) {
        let mut slots = self.lock();
        let parted = matches!(slot, Slot::Parted(_));
        if let Some(open @ Slot::Open) = slots.get_mut(i) {
            *open = slot;
        }
        if parted {
            held_within(&mut slots, self.keep);
        }
        drop(slots);
        self.decided.notify_all();
    }

    /// Decides every open slot: the unlimited run ended as `run` (`None`:
    /// it did not finish).
    pub(super) fn end(&self, run: Option<&SimulatedRun>) {
        let mut slots = self.lock();
        for slot in slots.iter_mut().filter(|s| matches!(s, Slot::Open)) {
            *slot = match run {
                Some(run) => Slot::Shared(Box::new(SimulatedRun {
                    detail: None,
                    ..run.clone()
                })),
                None => Slot::Alone,
            };
        }
        drop(slots);
        self.decided.notify_all();
    }

    /// Once the unlimited run is done: the event device `i`'s run at
    /// capacity goes on alone from (0: from the first), or `None` where
    /// the unlimited run is its run (it never left it, and `shares`: no
    /// memory fraction makes the allocator collect garbage against the
    /// capacity) or its slot was taken.
    pub(super) fn left_from(&self, i: usize, shares: bool) -> Option<u64> {
        match self.lock().get(i)? {
            Slot::Parted(parted) => Some(parted.at as u64),
            Slot::Shared(_) if shares => None,
            Slot::Shared(_) | Slot::Alone | Slot::Open => Some(0),
            Slot::Taken => None,
        }
    }

    /// Device `i`'s run at capacity is made elsewhere: what its slot holds
    /// is dropped.
    pub(super) fn forget(&self, i: usize) {
        if let Some(slot) = self.lock().get_mut(i) {
            *slot = Slot::Taken;
        }
    }

    /// Device `i`'s slot, once the unlimited run has decided it.
    pub fn take(&self, i: usize) -> Handed {
        let mut slots = self.lock();
        while matches!(slots.get(i), Some(Slot::Open)) {
            slots = self
                .decided
                .wait(slots)
                .unwrap_or_else(PoisonError::into_inner);
        }
        match slots
            .get_mut(i)
            .map(|slot| std::mem::replace(slot, Slot::Taken))
        {
            Some(Slot::Parted(parted)) => Handed::Parted(parted),
            Some(Slot::Shared(run)) => Handed::Shared(*run),
            _ => Handed::Alone,
        }
    }

    /// The runs set aside and not taken, per device (tests).
    #[cfg(test)]
    pub(super) fn into_parts(self) -> Vec<Option<Parted>> {
        self.slots
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
            .into_iter()
            .map(|slot| match slot {
                Slot::Parted(parted) => Some(*parted),
                _ => None,
            })
            .collect()
    }
}

/// Ends a run's handoffs however the run stops: a slot left open would
/// keep its job waiting.
pub(super) struct EndOnDrop<'h>(pub(super) &'h Handoffs);

impl Drop for EndOnDrop<'_> {
    fn drop(&mut self) {
        self.0.end(None);
    }
}

/// Leaves to run alone the runs set aside (and not taken) that parted
/// first, until those held take at most `keep` bytes.
fn held_within(slots: &mut [Slot], keep: u64) {
    loop {
        let mut held = 0u64;
        let mut first: Option<(usize, usize)> = None;
        for (i, slot) in slots.iter().enumerate() {
            if let Slot::Parted(p) = slot {
                held = held.saturating_add(p.runner.footprint().get());
                if first.is_none_or(|(_, at)| p.at < at) {
                    first = Some((i, p.at));
                }
            }
        }
        match first.and_then(|(i, _)| slots.get_mut(i)) {
            Some(slot) if held > keep => *slot = Slot::Alone,
            _ => return,
        }
    }
}

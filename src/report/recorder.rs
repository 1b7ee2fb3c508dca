//! A simulation's figures, gathered as its events stream past: the peak,
//! the maxima, the downsampled timeline and the peak inside each window
//! (an iteration, a generation's prompt call and decode steps), so no
//! simulation keeps a sample per event.

use super::timeline::{Downsampler, TimelinePoint};
use crate::program::JobEvent;
use crate::simulator::Sample;
use crate::units::{Bytes, Nanos};

/// One simulation of the job, reduced to what the report needs: its
/// figures, gathered as the events streamed past ([`Recorder`]). Its
/// figures without the detail travel between a shell's workers as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct SimulatedRun {
    /// Events simulated: the job's, or up to and including the one that
    /// ran out of memory.
    pub events: u64,
    /// The event at which the allocator ran out of memory (after releasing
    /// its cache and retrying), if it did.
    pub oom_at: Option<u64>,
    /// The first event at which reserved memory reached its highest.
    pub peak_index: u64,
    /// Highest reserved and allocated bytes (maybe at other events).
    pub max_reserved: Bytes,
    pub max_allocated: Bytes,
    /// The timeline and the windows' peaks, for the run the report is
    /// about (the reference GPU's without a capacity limit).
    #[serde(skip)]
    pub detail: Option<RunDetail>,
}

/// What the report shows of its headline run besides the peak.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunDetail {
    /// Allocated and reserved over time, downsampled.
    pub timeline: Vec<TimelinePoint>,
    /// Per window asked for ([`Recorder::new`]): the highest allocated and
    /// reserved bytes after an event inside it (`None`: no event was).
    pub windows: Vec<Option<Sample>>,
    /// The blocks live right after the peak event, and that event
    /// ([`crate::program::JobRef::live_after`] at the run's `peak_index`),
    /// where the run's job found them (beside the other runs); `None`: the
    /// report finds them.
    pub live_at_peak: Option<LiveAtPeak>,
}

/// What [`crate::program::JobRef::live_after`] returns.
pub type LiveAtPeak = (Vec<JobEvent>, Option<JobEvent>);

/// `n` consecutive samples whose reserved bytes are all `reserved` (small
/// events let go by, `pipeline/cycles.rs`): the allocated bytes first
/// highest after the `max_at`-th and first lowest after the `min_at`-th.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stretch {
    pub n: u64,
    pub reserved: Bytes,
    pub max_at: u64,
    pub min_at: u64,
}

/// Gathers a run's figures from its samples, one per event in order.
#[derive(Debug, Clone)]
pub struct Recorder {
    run: SimulatedRun,
    timeline: Option<Downsampler>,
    /// Inclusive time windows by start, each with its place in the
    /// windows asked for, and the peak in each.
    windows: Vec<(Nanos, Nanos, usize)>,
    peaks: Vec<Option<Sample>>,
    /// Windows before this one end before the current time.
    open_from: usize,
}

impl Recorder {
    /// A recorder of the maxima only (a verdict's run).
    pub fn maxima() -> Recorder {
        Recorder {
            run: SimulatedRun::default(),
            timeline: None,
            windows: Vec::new(),
            peaks: Vec::new(),
            open_from: 0,
        }
    }

    /// A recorder of the maxima only that has seen what this one has (a
    /// run at capacity that took the same decisions so far).
    pub fn maxima_so_far(&self) -> Recorder {
        Recorder {
            run: SimulatedRun {
                detail: None,
                ..self.run.clone()
            },
            ..Recorder::maxima()
        }
    }

    /// A recorder of the headline run: its timeline (`n` events from
    /// `times.0` to `times.1`, kept to `max_points`) and the peak inside
    /// each of `windows` (inclusive time ranges).
    pub fn detailed(
        n: u64,
        times: (Nanos, Nanos),
        max_points: usize,
        windows: Vec<(Nanos, Nanos)>,
    ) -> Recorder {
        let peaks = vec![None; windows.len()];
        let mut windows: Vec<(Nanos, Nanos, usize)> = windows
            .into_iter()
            .enumerate()
            .map(|(i, (from, to))| (from, to, i))
            .collect();
        windows.sort_unstable();
        Recorder {
            run: SimulatedRun::default(),
            timeline: Some(Downsampler::new(n, times, max_points)),
            windows,
            peaks,
            open_from: 0,
        }
    }

    /// The sample after the next event, at `time`.
    pub fn record(&mut self, time: Nanos, sample: Sample) {
        let index = self.run.events;
        self.run.events += 1;
        if index == 0 || sample.reserved > self.run.max_reserved {
            self.run.max_reserved = sample.reserved;
            self.run.peak_index = index;
        }
        self.run.max_allocated = self.run.max_allocated.max(sample.allocated);
        if let Some(timeline) = self.timeline.as_mut() {
            timeline.push(TimelinePoint {
                time_ns: time,
                allocated_bytes: sample.allocated,
                reserved_bytes: sample.reserved,
            });
        }
        self.record_windows(time, sample);
    }

    /// The windows' peaks after a sample at `time`.
    fn record_windows(&mut self, time: Nanos, sample: Sample) {
        // Windows by start: skip those that ended (they stay ended), look
        // at those begun (a time may lie in several).
        while self
            .windows
            .get(self.open_from)
            .is_some_and(|&(_, end, _)| end < time)
        {
            self.open_from += 1;
        }
        for &(from, to, i) in self.windows.iter().skip(self.open_from) {
            if from > time {
                break;
            }
            if time <= to {
                if let Some(slot) = self.peaks.get_mut(i) {
                    let peak = slot.get_or_insert(Sample::default());
                    peak.allocated = peak.allocated.max(sample.allocated);
                    peak.reserved = peak.reserved.max(sample.reserved);
                }
            }
        }
    }

    /// The samples of a [`Stretch`], the `i`-th's allocated bytes
    /// `allocated(i)` at `time(i)` (times in order): the same figures as
    /// recording each, from the few samples that can change them where
    /// every sample falls in the same timeline bucket and windows.
    pub fn record_stretch(
        &mut self,
        stretch: &Stretch,
        allocated: impl Fn(u64) -> Bytes,
        time: impl Fn(u64) -> Nanos,
    ) {
        let n = stretch.n;
        let Some(last) = n.checked_sub(1) else {
            return;
        };
        let (first_time, last_time) = (time(0), time(last));
        let whole = self.run.events > 0
            && self.windows_alike(first_time, last_time)
            && self
                .timeline
                .as_ref()
                .is_none_or(|t| t.takes_all(first_time, last_time));
        if !whole {
            for i in 0..n {
                let sample = Sample {
                    allocated: allocated(i),
                    reserved: stretch.reserved,
                };
                self.record(time(i), sample);
            }
            return;
        }
        let first = self.run.events;
        self.run.events = first.saturating_add(n);
        if stretch.reserved > self.run.max_reserved {
            self.run.max_reserved = stretch.reserved;
            self.run.peak_index = first;
        }
        let (most, least) = (allocated(stretch.max_at), allocated(stretch.min_at));
        self.run.max_allocated = self.run.max_allocated.max(most);
        if let Some(timeline) = self.timeline.as_mut() {
            let point = |i: u64, allocated: Bytes| TimelinePoint {
                time_ns: time(i),
                allocated_bytes: allocated,
                reserved_bytes: stretch.reserved,
            };
            timeline.push_stretch(
                n,
                point(0, allocated(0)),
                point(last, allocated(last)),
                (stretch.max_at, point(stretch.max_at, most)),
                (stretch.min_at, point(stretch.min_at, least)),
            );
        }
        self.record_windows(
            last_time,
            Sample {
                allocated: most,
                reserved: stretch.reserved,
            },
        );
    }

    /// Whether every time from `from` to `to` lies in the same windows,
    /// each begun or not and ended or not alike.
    fn windows_alike(&self, from: Nanos, to: Nanos) -> bool {
        self.windows
            .iter()
            .all(|&(start, end, _)| (start <= from) == (start <= to) && (end < from) == (end < to))
    }

    /// The run ran out of memory at its last event.
    pub fn out_of_memory(&mut self) {
        self.run.oom_at = self.run.events.checked_sub(1);
    }

    /// The figures gathered.
    pub fn finish(self) -> SimulatedRun {
        let mut run = self.run;
        if let Some(timeline) = self.timeline {
            run.detail = Some(RunDetail {
                timeline: timeline.finish(),
                windows: self.peaks,
                live_at_peak: None,
            });
        }
        run
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Samples recorded a stretch at a time (each stretch's reserved
        /// bytes alike) give the figures of the same samples recorded one
        /// by one: the peak, the maxima, the timeline's buckets and the
        /// windows' peaks, stretches across buckets and windows included.
        #[test]
        fn a_stretch_records_as_its_samples(
            chunks in proptest::collection::vec(
                (1u64..40, 0u64..4, proptest::collection::vec((0i64..6, 0u64..1000), 40)),
                1..12,
            ),
            windows in proptest::collection::vec((0i64..400, 0i64..200), 0..4),
            max_points in 6usize..60,
        ) {
            // Each chunk: its length, its reserved bytes, and per sample the
            // time step and allocated bytes.
            let mut samples: Vec<(Nanos, Sample)> = Vec::new();
            let mut bounds = Vec::new();
            let mut time = 0i64;
            for (n, reserved, points) in &chunks {
                let from = samples.len();
                for &(dt, allocated) in points.iter().take(*n as usize) {
                    time += dt;
                    samples.push((Nanos(time), Sample {
                        allocated: Bytes(allocated),
                        reserved: Bytes(1000 + reserved * 7),
                    }));
                }
                bounds.push((from, samples.len()));
            }
            let times = (samples[0].0, samples[samples.len() - 1].0);
            let windows: Vec<(Nanos, Nanos)> = windows
                .iter()
                .map(|&(from, len)| (Nanos(from), Nanos(from + len)))
                .collect();
            let n = samples.len() as u64;
            let mut one_by_one = Recorder::detailed(n, times, max_points, windows.clone());
            for &(t, s) in &samples {
                one_by_one.record(t, s);
            }
            let mut stretched = Recorder::detailed(n, times, max_points, windows);
            for (from, to) in bounds {
                let part = &samples[from..to];
                let first_of = |better: &dyn Fn(Bytes, Bytes) -> bool| {
                    let mut at = 0;
                    for (i, (_, s)) in part.iter().enumerate() {
                        if better(s.allocated, part[at].1.allocated) {
                            at = i;
                        }
                    }
                    at as u64
                };
                let stretch = Stretch {
                    n: part.len() as u64,
                    reserved: part[0].1.reserved,
                    max_at: first_of(&|a, b| a > b),
                    min_at: first_of(&|a, b| a < b),
                };
                stretched.record_stretch(
                    &stretch,
                    |i| part[i as usize].1.allocated,
                    |i| part[i as usize].0,
                );
            }
            prop_assert_eq!(stretched.finish(), one_by_one.finish());
        }
    }
}

//! A simulation's figures, gathered as its events stream past: the peak,
//! the maxima, the downsampled timeline and the peak inside each window
//! (an iteration, a generation's prompt call and decode steps), so no
//! simulation keeps a sample per event.

use super::timeline::{Downsampler, TimelinePoint};
use crate::program::JobEvent;
use crate::simulator::Sample;
use crate::units::{Bytes, Nanos};

/// One simulation of the job, reduced to what the report needs: its
/// figures, gathered as the events streamed past ([`Recorder`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
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

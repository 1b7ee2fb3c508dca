//! The memory timeline and its downsampling for drawing.
//!
//! A simulation yields one sample per schedule event, which is far more points
//! than a chart has pixel columns. [`downsample`] splits the time axis into
//! equal buckets and keeps, per bucket, the first and last point and the points
//! where allocated and reserved are highest and lowest. So every bucket's
//! maximum of either series survives — in particular the global peak and every
//! local maximum that is the highest point of its bucket; a local maximum that
//! is not is lower than a kept point of the same bucket, i.e. of the same pixel
//! column.

use serde::{Deserialize, Serialize};

use crate::units::{Bytes, Nanos};

/// Memory in use right after a point in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelinePoint {
    /// Nanoseconds since the start of the schedule.
    pub time_ns: Nanos,
    /// Bytes held by live blocks (the allocator's rounded block sizes).
    pub allocated_bytes: Bytes,
    /// Bytes of device segments the allocator holds.
    pub reserved_bytes: Bytes,
}

/// The default number of points a drawn timeline keeps at most.
pub const DEFAULT_MAX_POINTS: usize = 2048;

/// Points kept per bucket at most: first, last, max and min of both series.
const POINTS_PER_BUCKET: usize = 6;

/// Reduces `points` (sorted by time) to at most `max_points` points (at least
/// one bucket's worth), keeping each bucket's extremes. Returns the input
/// unchanged when it is already small enough.
pub fn downsample(points: &[TimelinePoint], max_points: usize) -> Vec<TimelinePoint> {
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return Vec::new();
    };
    let mut timeline = Downsampler::new(
        points.len() as u64,
        (first.time_ns, last.time_ns),
        max_points,
    );
    for point in points {
        timeline.push(*point);
    }
    timeline.finish()
}

/// [`downsample`] fed one point at a time: what a simulation streaming its
/// events keeps, given beforehand how many points come and the times of
/// the first and the last.
#[derive(Debug, Clone)]
pub struct Downsampler {
    /// Every point is kept (there are few enough).
    all: bool,
    buckets: usize,
    start: i128,
    span: i128,
    kept: Vec<TimelinePoint>,
    /// The bucket being filled and its candidates.
    bucket: Option<Bucket>,
    /// The offsets from `start` that fall in the bucket being filled
    /// (from, to: exclusive), so most points find their bucket without a
    /// division.
    span_of_bucket: (i128, i128),
}

/// One bucket's candidates, as (index in the bucket, point).
#[derive(Debug, Clone, Copy)]
struct Bucket {
    index: usize,
    len: usize,
    first: TimelinePoint,
    last: (usize, TimelinePoint),
    max_allocated: (usize, TimelinePoint),
    max_reserved: (usize, TimelinePoint),
    min_allocated: (usize, TimelinePoint),
    min_reserved: (usize, TimelinePoint),
}

impl Bucket {
    fn new(index: usize, point: TimelinePoint) -> Bucket {
        Bucket {
            index,
            len: 1,
            first: point,
            last: (0, point),
            max_allocated: (0, point),
            max_reserved: (0, point),
            min_allocated: (0, point),
            min_reserved: (0, point),
        }
    }

    /// Adds a point: each extreme is the first point no later one beats.
    fn push(&mut self, point: TimelinePoint) {
        let i = self.len;
        self.len += 1;
        self.last = (i, point);
        self.see(i, point);
    }

    /// The extremes after the `i`-th point (the points seen in order).
    fn see(&mut self, i: usize, point: TimelinePoint) {
        if point.allocated_bytes > self.max_allocated.1.allocated_bytes {
            self.max_allocated = (i, point);
        }
        if point.reserved_bytes > self.max_reserved.1.reserved_bytes {
            self.max_reserved = (i, point);
        }
        if point.allocated_bytes < self.min_allocated.1.allocated_bytes {
            self.min_allocated = (i, point);
        }
        if point.reserved_bytes < self.min_reserved.1.reserved_bytes {
            self.min_reserved = (i, point);
        }
    }

    /// The kept points in order, each once.
    fn flush(self, kept: &mut Vec<TimelinePoint>) {
        let mut picks = [
            (0, self.first),
            self.last,
            self.max_allocated,
            self.max_reserved,
            self.min_allocated,
            self.min_reserved,
        ];
        picks.sort_unstable_by_key(|&(i, _)| i);
        let mut previous = None;
        for (i, point) in picks {
            if previous == Some(i) {
                continue;
            }
            previous = Some(i);
            kept.push(point);
        }
    }
}

impl Downsampler {
    /// A timeline of `n` points from `first` to `last` (times), reduced to
    /// at most `max_points`.
    pub fn new(n: u64, (first, last): (Nanos, Nanos), max_points: usize) -> Downsampler {
        let all = n <= max_points.max(POINTS_PER_BUCKET) as u64;
        let start = i128::from(first.get());
        Downsampler {
            all,
            buckets: (max_points / POINTS_PER_BUCKET).max(1),
            start,
            span: (i128::from(last.get()) - start).max(1),
            kept: Vec::new(),
            bucket: None,
            span_of_bucket: (0, 0),
        }
    }

    fn bucket_of(&self, point: &TimelinePoint) -> usize {
        let offset = (i128::from(point.time_ns.get()) - self.start).max(0);
        let index = offset * self.buckets as i128 / (self.span + 1);
        usize::try_from(index)
            .unwrap_or(self.buckets - 1)
            .min(self.buckets - 1)
    }

    /// The offsets from `start` whose points [`Downsampler::bucket_of`]
    /// puts in bucket `index`: from the first offset `o` with `o · buckets
    /// / (span + 1) ≥ index` (the first bucket from any offset, the
    /// negative ones clamped into it) to the next bucket's first (the last
    /// bucket to any offset).
    fn offsets_of(&self, index: usize) -> (i128, i128) {
        let (width, buckets) = (self.span + 1, self.buckets as i128);
        let first = |k: i128| (k * width + buckets - 1) / buckets;
        let k = index as i128;
        let from = if k == 0 { i128::MIN } else { first(k) };
        let to = if k + 1 >= buckets {
            i128::MAX
        } else {
            first(k + 1)
        };
        (from, to)
    }

    /// The next point (in time order).
    pub fn push(&mut self, point: TimelinePoint) {
        if self.all {
            self.kept.push(point);
            return;
        }
        // Most points fall in the bucket of the point before them.
        let offset = i128::from(point.time_ns.get()) - self.start;
        let (from, to) = self.span_of_bucket;
        if let Some(bucket) = self
            .bucket
            .as_mut()
            .filter(|_| from <= offset && offset < to)
        {
            bucket.push(point);
            return;
        }
        let index = self.bucket_of(&point);
        match &mut self.bucket {
            Some(bucket) if bucket.index == index => bucket.push(point),
            _ => {
                self.span_of_bucket = self.offsets_of(index);
                if let Some(done) = self.bucket.replace(Bucket::new(index, point)) {
                    done.flush(&mut self.kept);
                }
            }
        }
    }

    /// Whether every point from time `from` to time `to` falls in the
    /// bucket being filled ([`Downsampler::push_stretch`] can take them).
    pub fn takes_all(&self, from: Nanos, to: Nanos) -> bool {
        let (lo, hi) = self.span_of_bucket;
        let offset = |t: Nanos| i128::from(t.get()) - self.start;
        !self.all && self.bucket.is_some() && lo <= offset(from) && offset(to) < hi
    }

    /// `n` points that all fall in the bucket being filled
    /// ([`Downsampler::takes_all`]), as [`Downsampler::push`] would take
    /// them one by one: their reserved bytes all alike, given by the
    /// first, the last, and the first highest and first lowest allocated
    /// bytes with their places among them.
    pub fn push_stretch(
        &mut self,
        n: u64,
        first: TimelinePoint,
        last: TimelinePoint,
        max_allocated: (u64, TimelinePoint),
        min_allocated: (u64, TimelinePoint),
    ) {
        let Some(bucket) = self.bucket.as_mut() else {
            return;
        };
        let Some(n) = usize::try_from(n).ok().filter(|&n| n > 0) else {
            return;
        };
        // The stretch's points that can change an extreme, in their order
        // (its reserved bytes are all the first's).
        let start = bucket.len;
        let at = |i: u64| start.saturating_add(usize::try_from(i).unwrap_or(usize::MAX));
        let mut seen = [
            (start, first),
            (at(max_allocated.0), max_allocated.1),
            (at(min_allocated.0), min_allocated.1),
        ];
        seen.sort_by_key(|&(i, _)| i);
        for (i, point) in seen {
            bucket.see(i, point);
        }
        bucket.len = start.saturating_add(n);
        bucket.last = (bucket.len - 1, last);
    }

    /// The points kept.
    pub fn finish(mut self) -> Vec<TimelinePoint> {
        if let Some(done) = self.bucket.take() {
            done.flush(&mut self.kept);
        }
        self.kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn point(time: i64, allocated: u64, reserved: u64) -> TimelinePoint {
        TimelinePoint {
            time_ns: Nanos(time),
            allocated_bytes: Bytes(allocated),
            reserved_bytes: Bytes(reserved),
        }
    }

    proptest! {
        /// A point lies in the offsets of the bucket `bucket_of` divides
        /// out for it, at the ends of every bucket too: the offsets of
        /// consecutive buckets meet, so a point in the current bucket's
        /// offsets is in that bucket.
        #[test]
        fn a_buckets_offsets_are_the_points_it_takes(
            span in 0i64..5_000_000,
            max_points in 6usize..5000,
            probes in proptest::collection::vec(-10i64..5_000_010, 1..50),
        ) {
            let timeline = Downsampler::new(u64::MAX, (Nanos(0), Nanos(span)), max_points);
            let mut times = probes;
            for k in 0..timeline.buckets {
                let (from, to) = timeline.offsets_of(k);
                if k + 1 < timeline.buckets {
                    prop_assert_eq!(to, timeline.offsets_of(k + 1).0);
                }
                if let Ok(from) = i64::try_from(from) {
                    times.extend([from - 1, from]);
                }
            }
            for time in times {
                let index = timeline.bucket_of(&point(time, 0, 0));
                let (from, to) = timeline.offsets_of(index);
                let offset = i128::from(time);
                prop_assert!(from <= offset && offset < to, "{time} in bucket {index}: {from}..{to}");
            }
        }
    }

    #[test]
    fn short_timelines_are_unchanged() {
        let points = vec![point(0, 1, 2), point(5, 3, 4)];
        assert_eq!(downsample(&points, 100), points);
    }

    #[test]
    fn a_single_spike_among_many_points_is_kept() {
        let mut points: Vec<TimelinePoint> = (0..10_000).map(|t| point(t, 10, 20)).collect();
        points[7_777] = point(7_777, 999, 1_000);
        let kept = downsample(&points, 60);
        assert!(kept.len() <= 60, "{}", kept.len());
        assert!(kept.contains(&point(7_777, 999, 1_000)));
        assert_eq!(kept.first(), points.first());
        assert_eq!(kept.last(), points.last());
    }

    #[test]
    fn a_dip_is_kept_too() {
        let mut points: Vec<TimelinePoint> = (0..5_000).map(|t| point(t, 50, 60)).collect();
        points[2_500] = point(2_500, 1, 60);
        let kept = downsample(&points, 30);
        assert!(kept.contains(&point(2_500, 1, 60)));
    }

    #[test]
    fn equal_times_do_not_break_bucketing() {
        let points: Vec<TimelinePoint> = (0..1_000).map(|i| point(0, i, i)).collect();
        let kept = downsample(&points, 12);
        assert!(kept.len() <= 12);
        assert!(kept.contains(&point(0, 999, 999)));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        #[test]
        fn every_bucket_maximum_and_the_peak_survive(
            values in proptest::collection::vec((0u64..1_000, 0u64..1_000, 0i64..50), 1..3_000),
            max_points in 6usize..300,
        ) {
            let mut time = 0i64;
            let points: Vec<TimelinePoint> = values
                .iter()
                .map(|&(a, r, dt)| {
                    time += dt;
                    point(time, a, a + r)
                })
                .collect();
            let kept = downsample(&points, max_points);
            prop_assert!(kept.len() <= max_points.max(POINTS_PER_BUCKET));
            // Kept points are a time-ordered subsequence of the input.
            prop_assert!(kept.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
            let peak_allocated = points.iter().map(|p| p.allocated_bytes).max();
            let peak_reserved = points.iter().map(|p| p.reserved_bytes).max();
            prop_assert_eq!(kept.iter().map(|p| p.allocated_bytes).max(), peak_allocated);
            prop_assert_eq!(kept.iter().map(|p| p.reserved_bytes).max(), peak_reserved);
            // Every local maximum is matched or beaten by a kept point within
            // one bucket width of it.
            if points.len() > max_points.max(POINTS_PER_BUCKET) {
                let buckets = (max_points / POINTS_PER_BUCKET).max(1) as i64;
                let width = (time / buckets) + 1;
                for (i, p) in points.iter().enumerate() {
                    let left = i == 0 || points[i - 1].allocated_bytes <= p.allocated_bytes;
                    let right = i + 1 == points.len() || points[i + 1].allocated_bytes <= p.allocated_bytes;
                    if left && right {
                        prop_assert!(kept.iter().any(|k| (k.time_ns.get() - p.time_ns.get()).abs() <= width
                            && k.allocated_bytes >= p.allocated_bytes));
                    }
                }
            }
        }
    }
}

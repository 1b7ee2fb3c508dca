//! Unit newtypes shared by every stage.
//!
//! Bytes are unsigned integers and times are signed integer nanoseconds, so that
//! every stage computes with exact integers and output is identical on every
//! platform, WebAssembly included. Trace timestamps arrive as fractional
//! microseconds and are converted once, at the edge, by [`Nanos::from_micros_f64`].

use serde::{Deserialize, Serialize};

/// A byte count.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Bytes(pub u64);

impl Bytes {
    pub const ZERO: Bytes = Bytes(0);
    pub const KIB: u64 = 1024;
    pub const MIB: u64 = 1024 * 1024;
    pub const GIB: u64 = 1024 * 1024 * 1024;

    /// The raw byte count.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// Whether it is zero (for fields left out of the JSON when empty).
    pub const fn is_zero(&self) -> bool {
        self.0 == 0
    }

    /// `self + other`, saturating at `u64::MAX`.
    #[must_use]
    pub const fn saturating_add(self, other: Bytes) -> Bytes {
        Bytes(self.0.saturating_add(other.0))
    }

    /// `self - other`, saturating at zero.
    #[must_use]
    pub const fn saturating_sub(self, other: Bytes) -> Bytes {
        Bytes(self.0.saturating_sub(other.0))
    }
}

impl std::ops::Add for Bytes {
    type Output = Bytes;
    fn add(self, rhs: Bytes) -> Bytes {
        Bytes(self.0.saturating_add(rhs.0))
    }
}

impl std::ops::AddAssign for Bytes {
    fn add_assign(&mut self, rhs: Bytes) {
        self.0 = self.0.saturating_add(rhs.0);
    }
}

impl std::iter::Sum for Bytes {
    fn sum<I: Iterator<Item = Bytes>>(iter: I) -> Bytes {
        iter.fold(Bytes::ZERO, |acc, b| acc + b)
    }
}

impl std::fmt::Display for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} B", self.0)
    }
}

/// A point in time or a duration, in integer nanoseconds.
///
/// Trace times are relative to the trace's `baseTimeNanoseconds`; the analyzer
/// rebases them so that the first event of interest is at zero.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Nanos(pub i64);

impl Nanos {
    pub const ZERO: Nanos = Nanos(0);

    /// Converts a Chrome-trace timestamp (microseconds as a float with three
    /// decimals) to nanoseconds, rounding to the nearest nanosecond.
    ///
    /// Non-finite or out-of-range inputs saturate instead of panicking.
    pub fn from_micros_f64(micros: f64) -> Nanos {
        let nanos = (micros * 1000.0).round();
        if nanos.is_nan() {
            Nanos(0)
        } else {
            // `as` saturates for out-of-range floats.
            Nanos(nanos as i64)
        }
    }

    /// The raw nanosecond count.
    pub const fn get(self) -> i64 {
        self.0
    }

    /// `self - other`, saturating.
    #[must_use]
    pub const fn saturating_sub(self, other: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(other.0))
    }

    /// `self + other`, saturating.
    #[must_use]
    pub const fn saturating_add(self, other: Nanos) -> Nanos {
        Nanos(self.0.saturating_add(other.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_micros_keep_nanosecond_resolution() {
        assert_eq!(
            Nanos::from_micros_f64(4_460_788_921_093.841),
            Nanos(4_460_788_921_093_841)
        );
        assert_eq!(Nanos::from_micros_f64(0.001), Nanos(1));
    }

    #[test]
    fn hostile_floats_saturate() {
        assert_eq!(Nanos::from_micros_f64(f64::NAN), Nanos(0));
        assert_eq!(Nanos::from_micros_f64(f64::INFINITY), Nanos(i64::MAX));
        assert_eq!(Nanos::from_micros_f64(-1e300), Nanos(i64::MIN));
    }

    #[test]
    fn byte_arithmetic_saturates() {
        assert_eq!(Bytes(u64::MAX) + Bytes(1), Bytes(u64::MAX));
        assert_eq!(Bytes(1).saturating_sub(Bytes(2)), Bytes(0));
    }
}

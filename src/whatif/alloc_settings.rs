//! What-if 1 — **allocator settings**: the same orchestrated sequence under
//! several `PYTORCH_CUDA_ALLOC_CONF` settings (a transformation of the
//! allocator configuration only), with peak, fragmentation and segment counts
//! per setting and the best one named.
//!
//! The peak of each row is the estimate's `peak.total_bytes` under that
//! setting (the unlimited run on the reference GPU); `fits` comes from the
//! capacity-limited runs on every GPU of the config. Garbage collection only
//! acts under a memory-fraction limit (allocator.md §3), so its row sets one
//! and differs from the default only in the capacity-limited runs.

use serde::{Deserialize, Serialize};

use super::{estimate_schedule, fits_of, simulate_stats, Fit, PeakFigures, WhatIfError};
use crate::pipeline::{Config, Prepared};
use crate::simulator::{AllocatorConfig, RuleVersion};
use crate::units::Bytes;

/// The version tag of [`AllocComparison`].
pub const SCHEMA: &str = "memcast.whatif.alloc/1";

/// The settings compared by [`compare`], default first.
pub const STANDARD_SETTINGS: &[&str] = &[
    "",
    "expandable_segments:True",
    "max_split_size_mb:64",
    "max_split_size_mb:128",
    "max_split_size_mb:256",
    "max_split_size_mb:512",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:8",
    "garbage_collection_threshold:0.8,per_process_memory_fraction:0.95",
];

/// The job under one allocator setting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingRow {
    /// The `PYTORCH_CUDA_ALLOC_CONF` string; empty for PyTorch's defaults.
    pub conf: String,
    pub peak: PeakFigures,
    /// Peak total minus the default's (negative: the setting saves memory).
    pub delta_total_bytes: i64,
    /// Reserved minus allocated at the moment reserved memory peaks: memory
    /// the caching allocator holds but the job does not use.
    pub fragmentation_bytes: Bytes,
    /// The most segments (expandable: mapped ranges) held at once.
    pub peak_segments: u64,
    /// `cudaMalloc` calls (expandable: page mappings).
    pub device_allocs: u64,
    /// Whether the job completes at each GPU's capacity, in config order.
    pub fits: Vec<Fit>,
}

/// The comparison of allocator settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocComparison {
    /// Always [`SCHEMA`].
    pub schema: String,
    pub reference_gpu: String,
    pub rows: Vec<SettingRow>,
    /// Index in `rows` of the best setting: fits the most GPUs, then the
    /// lowest peak total, then the earliest row (the default wins ties).
    pub best: usize,
    /// The exact `PYTORCH_CUDA_ALLOC_CONF` value to use (empty: leave it unset).
    pub recommended_conf: String,
    pub notes: Vec<String>,
}

/// Compares [`STANDARD_SETTINGS`] plus `extra` settings.
pub fn compare(
    prepared: &Prepared,
    config: &Config,
    extra: &[String],
) -> Result<AllocComparison, WhatIfError> {
    let mut settings: Vec<String> = STANDARD_SETTINGS.iter().map(|s| (*s).to_owned()).collect();
    for conf in extra {
        if !settings.contains(conf) {
            settings.push(conf.clone());
        }
    }
    compare_settings(prepared, config, &settings)
}

/// Compares exactly these settings (the first is the baseline of `delta_total_bytes`).
pub fn compare_settings(
    prepared: &Prepared,
    config: &Config,
    settings: &[String],
) -> Result<AllocComparison, WhatIfError> {
    let schedule = &prepared.orchestrated.schedule;
    let mut rows: Vec<SettingRow> = Vec::with_capacity(settings.len());
    for conf in settings {
        let allocator = if conf.trim().is_empty() {
            AllocatorConfig::pytorch_defaults()
        } else {
            AllocatorConfig::parse(conf, RuleVersion::New).map_err(crate::pipeline::Error::from)?
        };
        let mut variant = config.clone();
        variant.alloc_conf = conf.clone();
        let report = estimate_schedule(prepared, schedule.clone(), &variant)?;
        let stats = simulate_stats(schedule, config, &allocator);
        let mut at_peak = (Bytes::ZERO, Bytes::ZERO);
        for sample in &stats.after_event {
            if sample.reserved > at_peak.0 {
                at_peak = (sample.reserved, sample.allocated);
            }
        }
        let peak = PeakFigures::of(&report);
        let baseline = rows
            .first()
            .map_or(peak.total_bytes, |r| r.peak.total_bytes);
        rows.push(SettingRow {
            conf: conf.clone(),
            peak,
            delta_total_bytes: signed_delta(peak.total_bytes, baseline),
            fragmentation_bytes: at_peak.0.saturating_sub(at_peak.1),
            peak_segments: stats.peak.segments,
            device_allocs: stats.final_stats.num_device_alloc,
            fits: fits_of(&report),
        });
    }
    let best = rows
        .iter()
        .enumerate()
        .min_by_key(|(index, row)| {
            let misses = row.fits.iter().filter(|f| !f.fits).count();
            (misses, row.peak.total_bytes, *index)
        })
        .map_or(0, |(index, _)| index);
    let recommended_conf = rows.get(best).map(|r| r.conf.clone()).unwrap_or_default();
    Ok(AllocComparison {
        schema: SCHEMA.to_owned(),
        reference_gpu: config.reference.name.clone(),
        rows,
        best,
        recommended_conf,
        notes: vec![
            "peaks are the unlimited simulation on the reference GPU's overheads, like memcast estimate".to_owned(),
            "garbage_collection_threshold only acts under a memory-fraction limit, so its row sets per_process_memory_fraction:0.95 and can differ from the default only in the per-GPU fits".to_owned(),
            "fragmentation is reserved minus allocated when reserved memory peaks".to_owned(),
        ],
    })
}

/// `a - b` as a signed byte count (saturating).
pub(crate) fn signed_delta(a: Bytes, b: Bytes) -> i64 {
    if a >= b {
        i64::try_from(a.get() - b.get()).unwrap_or(i64::MAX)
    } else {
        i64::try_from(b.get() - a.get()).map_or(i64::MIN, |d| -d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_delta_has_the_right_sign() {
        assert_eq!(signed_delta(Bytes(5), Bytes(3)), 2);
        assert_eq!(signed_delta(Bytes(3), Bytes(5)), -2);
        assert_eq!(signed_delta(Bytes(3), Bytes(3)), 0);
    }

    #[test]
    fn every_standard_setting_parses() {
        for conf in STANDARD_SETTINGS.iter().filter(|c| !c.is_empty()) {
            AllocatorConfig::parse(conf, RuleVersion::New).unwrap();
        }
    }
}

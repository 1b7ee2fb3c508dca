//! Allocator configuration: the `PYTORCH_CUDA_ALLOC_CONF` options that change
//! reserved memory (allocator.md §3), the size computations that depend on them
//! (§4) and the version differences between them (§15).

use serde::{Deserialize, Serialize};

use crate::units::Bytes;

const MIB: u64 = Bytes::MIB;

/// Every request is rounded up to a multiple of this (`kMinBlockSize`).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Largest rounded size served by the small pool (`kSmallSize`).
pub const SMALL_SIZE: u64 = MIB;
/// Size of every small-pool segment (`kSmallBuffer`).
pub const SMALL_BUFFER: u64 = 2 * MIB;
/// Default segment size for 1–10 MiB requests (`kLargeBuffer`).
pub const LARGE_BUFFER: u64 = 20 * MIB;
/// Requests at least this large get their own segment (`kMinLargeAlloc`).
pub const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Rounding granularity of large segments (`kRoundLarge`).
pub const ROUND_LARGE: u64 = 2 * MIB;
/// Number of power-of-two intervals in the `roundup_power2_divisions` table.
pub const DIVISION_INTERVALS: usize = 16;

/// Which revision of PyTorch's allocator rules to follow (allocator.md §15).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum RuleVersion {
    /// ≈ PyTorch 2.2–2.3: `roundup_power2_divisions:1` leaves requests unrounded,
    /// a 0 inside a division list is rejected, `>` fills from the last key
    /// inclusive, `max_split_size_mb` must be > 20, no `max_non_split_rounding_mb`.
    Old,
    /// ≈ PyTorch 2.4–2.8: divisions == 1 means plain 512-byte rounding, 0 is
    /// accepted in lists, `>` still fills from the last key inclusive,
    /// `max_split_size_mb` must be > 20; `max_non_split_rounding_mb` is accepted
    /// (it appeared in ≈ 2.6).
    Mid,
    /// Late-2025 `main`: `>` fills from the key after the last one,
    /// `max_split_size_mb` ≥ 20, `large_segment_size_mb` and
    /// `per_process_memory_fraction` keys, garbage collection and the oversize
    /// release skip expandable segments.
    New,
}

/// A parsed allocator configuration. [`AllocatorConfig::pytorch_defaults`] is
/// PyTorch's behaviour with no option set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocatorConfig {
    /// The rule revision this configuration was parsed for.
    pub version: RuleVersion,
    /// `max_split_size_mb` in bytes; `None` = unlimited (the default).
    pub max_split_size: Option<Bytes>,
    /// `max_non_split_rounding_mb` in bytes (default 20 MiB).
    pub max_non_split_rounding: Bytes,
    /// `roundup_power2_divisions` per power-of-two interval; 0 = off.
    pub roundup_power2_divisions: [u32; DIVISION_INTERVALS],
    /// `garbage_collection_threshold` in (0, 1); `None` = off. Only active when
    /// the device has a memory-fraction limit.
    pub garbage_collection_threshold: Option<f64>,
    /// `expandable_segments`.
    pub expandable_segments: bool,
    /// `large_segment_size_mb` in bytes (R-new only; 20 MiB otherwise).
    pub large_segment_size: Bytes,
    /// `per_process_memory_fraction` (R-new only); `None` = not set. The
    /// simulator applies it as `fraction × device capacity` unless the device
    /// carries an explicit [`crate::simulator::GpuMemory::memory_limit`].
    pub per_process_memory_fraction: Option<f64>,
}

/// A configuration string that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("allocator option is not `key:value`; write options as `key:value` separated by commas, got {0:?}")]
    NotKeyValue(String),
    #[error("unknown allocator option for this pytorch version; use one of max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, garbage_collection_threshold, expandable_segments, large_segment_size_mb, per_process_memory_fraction, got {0:?}")]
    UnknownKey(String),
    #[error("invalid value for allocator option {key}: {reason}; fix the value, got {value:?}")]
    BadValue {
        key: &'static str,
        reason: &'static str,
        value: String,
    },
    #[error("the cudaMallocAsync backend does not use the caching allocator, so memcast cannot simulate it; remove `backend:cudaMallocAsync`, got {0:?}")]
    AsyncBackend(String),
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        Self::pytorch_defaults()
    }
}

impl AllocatorConfig {
    /// PyTorch's defaults under the newest rules (no option set).
    pub fn pytorch_defaults() -> Self {
        Self::defaults_for(RuleVersion::New)
    }

    /// The defaults (no option set) under the given rule revision.
    pub fn defaults_for(version: RuleVersion) -> Self {
        AllocatorConfig {
            version,
            max_split_size: None,
            max_non_split_rounding: Bytes(LARGE_BUFFER),
            roundup_power2_divisions: [0; DIVISION_INTERVALS],
            garbage_collection_threshold: None,
            expandable_segments: false,
            large_segment_size: Bytes(LARGE_BUFFER),
            per_process_memory_fraction: None,
        }
    }

    /// Parses a `PYTORCH_CUDA_ALLOC_CONF`-style string, e.g.
    /// `max_split_size_mb:128,roundup_power2_divisions:[256:1,>:4]`.
    ///
    /// Options without an effect on reserved memory (`pinned_*`,
    /// `release_lock_on_cudamalloc`, `graph_capture_record_stream_reuse`,
    /// `backend:native`) are accepted and ignored.
    pub fn parse(conf: &str, version: RuleVersion) -> Result<Self, ConfigError> {
        let mut config = Self::defaults_for(version);
        let compact: String = conf.chars().filter(|c| !c.is_whitespace()).collect();
        for entry in split_top_level(&compact) {
            if entry.is_empty() {
                continue;
            }
            let Some((key, value)) = entry.split_once(':') else {
                return Err(ConfigError::NotKeyValue(entry.to_owned()));
            };
            config.apply(key, value, entry)?;
        }
        Ok(config)
    }

    /// Applies one `key:value` entry of a `PYTORCH_CUDA_ALLOC_CONF` string,
    /// with the validation and the version differences of allocator.md §15
    /// (which keys exist, which values are accepted, how each is rounded).
    /// One match over the keys, as PyTorch's own parser is.
    fn apply(&mut self, key: &str, value: &str, entry: &str) -> Result<(), ConfigError> {
        let new = self.version == RuleVersion::New;
        match key {
            "max_split_size_mb" => {
                let mb = parse_u64(value)
                    .ok_or_else(|| bad("max_split_size_mb", "not an integer", value))?;
                let ok = if new { mb >= 20 } else { mb > 20 };
                if !ok {
                    return Err(bad(
                        "max_split_size_mb",
                        if new {
                            "must be at least 20"
                        } else {
                            "must be greater than 20"
                        },
                        value,
                    ));
                }
                self.max_split_size = Some(Bytes(mb.saturating_mul(MIB)));
            }
            "max_non_split_rounding_mb" if self.version != RuleVersion::Old => {
                let mb = parse_u64(value)
                    .ok_or_else(|| bad("max_non_split_rounding_mb", "not an integer", value))?;
                if mb < 20 {
                    return Err(bad(
                        "max_non_split_rounding_mb",
                        "must be at least 20",
                        value,
                    ));
                }
                self.max_non_split_rounding = Bytes(mb.saturating_mul(MIB));
            }
            "roundup_power2_divisions" => {
                self.roundup_power2_divisions = parse_divisions(value, self.version)?;
            }
            "garbage_collection_threshold" => {
                let t: f64 = value
                    .parse()
                    .map_err(|_| bad("garbage_collection_threshold", "not a number", value))?;
                if !(t > 0.0 && t < 1.0) {
                    return Err(bad(
                        "garbage_collection_threshold",
                        "must be strictly between 0 and 1",
                        value,
                    ));
                }
                self.garbage_collection_threshold = Some(t);
            }
            "expandable_segments" => {
                self.expandable_segments = match value {
                    "True" | "true" | "1" => true,
                    "False" | "false" | "0" => false,
                    _ => return Err(bad("expandable_segments", "must be True or False", value)),
                };
            }
            "large_segment_size_mb" if new => {
                let mb = parse_u64(value)
                    .ok_or_else(|| bad("large_segment_size_mb", "not an integer", value))?;
                if mb == 0 || mb % 2 != 0 || mb > 1 << 20 {
                    return Err(bad(
                        "large_segment_size_mb",
                        "must be a positive multiple of 2, at most 1048576",
                        value,
                    ));
                }
                self.large_segment_size = Bytes(mb.saturating_mul(MIB));
            }
            "per_process_memory_fraction" if new => {
                let f: f64 = value
                    .parse()
                    .map_err(|_| bad("per_process_memory_fraction", "not a number", value))?;
                if !(f > 0.0 && f <= 1.0) {
                    return Err(bad(
                        "per_process_memory_fraction",
                        "must be in (0, 1]",
                        value,
                    ));
                }
                // R-new only sets a limit for fractions below 1.
                self.per_process_memory_fraction = (f < 1.0).then_some(f);
            }
            "backend" => {
                if value != "native" {
                    return Err(ConfigError::AsyncBackend(entry.to_owned()));
                }
            }
            "release_lock_on_cudamalloc"
            | "pinned_use_cuda_host_register"
            | "pinned_num_register_threads"
            | "pinned_use_background_threads"
            | "pinned_reserve_segment_size_mb"
            | "graph_capture_record_stream_reuse" => {}
            _ => return Err(ConfigError::UnknownKey(key.to_owned())),
        }
        Ok(())
    }

    /// The canonical configuration string: only options that differ from the
    /// defaults, in a fixed order; `""` for the defaults.
    pub fn to_conf_string(&self) -> String {
        let mut parts = Vec::new();
        if let Some(m) = self.max_split_size {
            parts.push(format!("max_split_size_mb:{}", mib_text(m)));
        }
        if self.max_non_split_rounding.get() != LARGE_BUFFER {
            parts.push(format!(
                "max_non_split_rounding_mb:{}",
                mib_text(self.max_non_split_rounding)
            ));
        }
        let d = &self.roundup_power2_divisions;
        if d.iter().any(|&v| v != 0) {
            if d.iter().all(|&v| v == d[0]) {
                parts.push(format!("roundup_power2_divisions:{}", d[0]));
            } else {
                // One key per interval, which every version parses back the
                // same; the old rules reject a 0 in a list, and a 0 there can
                // only come from an interval no key set, so it is left out.
                let list: Vec<String> = d
                    .iter()
                    .enumerate()
                    .filter(|&(_, &v)| v != 0 || self.version != RuleVersion::Old)
                    .map(|(i, v)| format!("{}:{v}", 1u64 << i))
                    .collect();
                parts.push(format!("roundup_power2_divisions:[{}]", list.join(",")));
            }
        }
        if let Some(t) = self.garbage_collection_threshold {
            parts.push(format!("garbage_collection_threshold:{t}"));
        }
        if self.expandable_segments {
            parts.push("expandable_segments:True".to_owned());
        }
        if self.large_segment_size.get() != LARGE_BUFFER {
            parts.push(format!(
                "large_segment_size_mb:{}",
                mib_text(self.large_segment_size)
            ));
        }
        if let Some(f) = self.per_process_memory_fraction {
            parts.push(format!("per_process_memory_fraction:{f}"));
        }
        parts.join(",")
    }

    /// `round_size` (allocator.md §4.1): the block size a request gets.
    pub fn round_size(&self, request: u64) -> u64 {
        if request < MIN_BLOCK_SIZE {
            return MIN_BLOCK_SIZE;
        }
        let d = u64::from(self.divisions_for(request));
        let eligible = match self.version {
            RuleVersion::Old => d > 0,
            RuleVersion::Mid | RuleVersion::New => d > 1,
        };
        if eligible && request > MIN_BLOCK_SIZE.saturating_mul(d) {
            if d == 1 {
                // R-old: the helper returned the request unchanged.
                return request;
            }
            return pow2_division_ceil(request, d);
        }
        round_up(request, MIN_BLOCK_SIZE)
    }

    /// The division count that applies to a size (§4.1.1).
    pub fn divisions_for(&self, size: u64) -> u32 {
        let log2 = 63 - u64::from(size.max(1).leading_zeros());
        let idx = log2.saturating_sub(20).min(DIVISION_INTERVALS as u64 - 1);
        self.roundup_power2_divisions
            .get(idx as usize)
            .copied()
            .unwrap_or(0)
    }

    /// `get_allocation_size` (§4.3): the segment size for a rounded size.
    pub fn segment_size(&self, rounded: u64) -> u64 {
        if rounded <= SMALL_SIZE {
            SMALL_BUFFER
        } else if rounded < MIN_LARGE_ALLOC {
            self.large_segment_size.get()
        } else {
            round_up(rounded, ROUND_LARGE)
        }
    }
}

fn bad(key: &'static str, reason: &'static str, value: &str) -> ConfigError {
    ConfigError::BadValue {
        key,
        reason,
        value: value.to_owned(),
    }
}

fn parse_u64(s: &str) -> Option<u64> {
    s.parse().ok()
}

/// A size as the whole MiB the options take. A size the parser saturated to
/// `u64::MAX` prints as a number of MiB that saturates again, so it parses back.
fn mib_text(size: Bytes) -> u64 {
    if size.get() == u64::MAX {
        u64::MAX / MIB + 1
    } else {
        size.get() / MIB
    }
}

/// Rounds up to a multiple of `to` (saturating).
pub(crate) fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to).saturating_mul(to)
}

fn pow2_division_ceil(n: u64, divisions: u64) -> u64 {
    if n.is_power_of_two() {
        return n;
    }
    let lo = 1u64 << (63 - n.leading_zeros());
    let step = lo >> (63 - divisions.leading_zeros());
    if step == 0 {
        return lo.saturating_mul(2);
    }
    let floor = n - n % step;
    if floor == n {
        n
    } else {
        floor.saturating_add(step)
    }
}

/// Splits on commas that are not inside brackets.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_division_value(v: &str, version: RuleVersion) -> Result<u32, ConfigError> {
    let n: u32 = v
        .parse()
        .map_err(|_| bad("roundup_power2_divisions", "not an integer", v))?;
    if n == 0 {
        if version == RuleVersion::Old {
            return Err(bad(
                "roundup_power2_divisions",
                "0 is only accepted from pytorch 2.4 on",
                v,
            ));
        }
        return Ok(0);
    }
    if !n.is_power_of_two() {
        return Err(bad("roundup_power2_divisions", "must be a power of two", v));
    }
    Ok(n)
}

/// Parses `roundup_power2_divisions`: a single count or a `[size:count,...]`
/// list (`>` for the rest), per the version's rules (§15): powers of two
/// only, 1 allowed or not, intervals from 1 MiB doubling.
fn parse_divisions(
    value: &str,
    version: RuleVersion,
) -> Result<[u32; DIVISION_INTERVALS], ConfigError> {
    let mut table = [0u32; DIVISION_INTERVALS];
    let Some(inner) = value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) else {
        let n = parse_division_value(value, version)?;
        if n == 0 && version == RuleVersion::Old {
            return Err(bad("roundup_power2_divisions", "must be positive", value));
        }
        return Ok([n; DIVISION_INTERVALS]);
    };
    let mut last: Option<usize> = None;
    for item in inner.split(',').filter(|s| !s.is_empty()) {
        let Some((k, v)) = item.split_once(':') else {
            return Err(bad(
                "roundup_power2_divisions",
                "list entries must be `MiB:divisions`",
                item,
            ));
        };
        let n = parse_division_value(v, version)?;
        if k == ">" {
            let start = match (last, version) {
                (None, _) => 0,
                (Some(l), RuleVersion::New) => l + 1,
                (Some(l), _) => l,
            };
            for slot in table.iter_mut().skip(start) {
                *slot = n;
            }
            continue;
        }
        let mb: u64 = k.parse().map_err(|_| {
            bad(
                "roundup_power2_divisions",
                "list keys must be integers (MiB)",
                item,
            )
        })?;
        if !mb.is_power_of_two() {
            return Err(bad(
                "roundup_power2_divisions",
                "list keys must be powers of two",
                item,
            ));
        }
        let idx = (63 - mb.leading_zeros()) as usize;
        let idx = idx.min(DIVISION_INTERVALS - 1);
        if last.is_none() {
            for slot in table.iter_mut().take(idx) {
                *slot = n;
            }
        }
        if let Some(slot) = table.get_mut(idx) {
            *slot = n;
        }
        last = Some(idx);
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_size_basics() {
        let c = AllocatorConfig::pytorch_defaults();
        assert_eq!(c.round_size(1), 512);
        assert_eq!(c.round_size(512), 512);
        assert_eq!(c.round_size(513), 1024);
        assert_eq!(c.segment_size(MIB), 2 * MIB);
        assert_eq!(c.segment_size(MIB + 512), 20 * MIB);
        assert_eq!(c.segment_size(10 * MIB - 512), 20 * MIB);
        assert_eq!(c.segment_size(10 * MIB), 10 * MIB);
        assert_eq!(c.segment_size(10 * MIB + 512), 12 * MIB);
    }

    #[test]
    fn division_list_semantics_differ_by_version() {
        let conf = "roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]";
        let new = AllocatorConfig::parse(conf, RuleVersion::New).unwrap();
        for (mb, want) in [
            (32, 8),
            (64, 8),
            (128, 2),
            (256, 4),
            (512, 2),
            (1024, 4),
            (2048, 1),
            (1 << 20, 1),
        ] {
            assert_eq!(new.divisions_for(mb * MIB), want, "{mb} MiB");
        }
        let mid = AllocatorConfig::parse(conf, RuleVersion::Mid).unwrap();
        assert_eq!(mid.divisions_for(1024 * MIB), 1);
        assert_eq!(mid.divisions_for(512 * MIB), 2);
    }

    #[test]
    fn small_requests_are_not_power2_rounded() {
        let c = AllocatorConfig::parse("roundup_power2_divisions:4", RuleVersion::New).unwrap();
        assert_eq!(c.round_size(1200), 1536);
        assert_eq!(c.round_size(70_000), 81_920);
    }

    #[test]
    fn validation_follows_version() {
        assert!(AllocatorConfig::parse("max_split_size_mb:20", RuleVersion::Mid).is_err());
        assert!(AllocatorConfig::parse("max_split_size_mb:20", RuleVersion::New).is_ok());
        assert!(
            AllocatorConfig::parse("roundup_power2_divisions:[256:0]", RuleVersion::Old).is_err()
        );
        assert!(
            AllocatorConfig::parse("roundup_power2_divisions:[256:0]", RuleVersion::Mid).is_ok()
        );
        assert!(AllocatorConfig::parse("large_segment_size_mb:40", RuleVersion::Mid).is_err());
        assert!(AllocatorConfig::parse("roundup_power2_divisions:3", RuleVersion::New).is_err());
        assert!(AllocatorConfig::parse("bogus:1", RuleVersion::New).is_err());
        assert!(AllocatorConfig::parse("backend:cudaMallocAsync", RuleVersion::New).is_err());
        assert!(AllocatorConfig::parse("expandable_segments", RuleVersion::New).is_err());
    }

    #[test]
    fn conf_string_round_trips() {
        assert_eq!(AllocatorConfig::pytorch_defaults().to_conf_string(), "");
        for conf in [
            "max_split_size_mb:128",
            "expandable_segments:True",
            "roundup_power2_divisions:4",
            "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
            "garbage_collection_threshold:0.6,max_split_size_mb:200",
            "max_non_split_rounding_mb:64,large_segment_size_mb:64",
        ] {
            for version in [RuleVersion::Mid, RuleVersion::New] {
                let Ok(a) = AllocatorConfig::parse(conf, version) else {
                    assert!(conf.contains("large_segment"));
                    continue;
                };
                let b = AllocatorConfig::parse(&a.to_conf_string(), version).unwrap();
                assert_eq!(a, b, "{conf}");
            }
        }
    }

    #[test]
    fn old_rule_lists_with_unset_intervals_print_and_parse_back() {
        // Found by the alloc_conf fuzzer: the printed list had `8:0`, which
        // the old rules reject.
        let conf = "max_split_size_mb:66,roundup_power2_divisions:[,2:2,4:4]";
        let parsed = AllocatorConfig::parse(conf, RuleVersion::Old).unwrap();
        let printed = parsed.to_conf_string();
        assert!(!printed.contains(":0"), "{printed}");
        assert_eq!(
            AllocatorConfig::parse(&printed, RuleVersion::Old).unwrap(),
            parsed
        );
    }

    #[test]
    fn saturated_sizes_print_and_parse_back() {
        // Found by the alloc_conf fuzzer: 677777738888888 MiB saturates to
        // u64::MAX bytes, which printed as a smaller number of MiB.
        let mut checked = 0;
        for conf in [
            "max_split_size_mb:677777738888888",
            "large_segment_size_mb:677777738888888",
        ] {
            let Ok(parsed) = AllocatorConfig::parse(conf, RuleVersion::New) else {
                continue;
            };
            checked += 1;
            let printed = parsed.to_conf_string();
            assert_eq!(
                AllocatorConfig::parse(&printed, RuleVersion::New).unwrap(),
                parsed,
                "{conf} printed as {printed}"
            );
        }
        assert!(checked > 0, "no saturating size parsed");
    }
}

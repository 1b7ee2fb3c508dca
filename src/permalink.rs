//! Permalinks: a shared estimate in a URL fragment — never the trace.
//!
//! A permalink carries a [`Shared`] value: the report with its timeline
//! downsampled for drawing (every local maximum kept), the [`Settings`] it
//! was computed with (the GPUs, the target first, allocator settings, run
//! options), the what-if answered on it if any, and the trace's name, size
//! and SHA-256, so a reader can tell which trace it came from. The fragment
//! is `#e=v2.<base64url(deflate(json))>`: versioned, compressed, and
//! URL-safe. The page and the CLI (`--link`) make it with [`link`], so the
//! same estimate gives the same link byte for byte in both.
//!
//! Extending it: a new field of [`Shared`], [`Settings`] or the report is
//! read from older links by `#[serde(default)]` (and written only when it is
//! not the default, so existing links keep their bytes); unknown fields are
//! ignored, so an older page still opens a newer link of the same version.
//! `v1` links (no settings or what-if: the GPU list and, in the report, the
//! allocator settings) still open: [`decode`] reads them into a [`Shared`].
//!
//! Decoding is bounded in input size and inflated size, so a hostile fragment
//! costs at most a few milliseconds and a few MiB, and every failure is a
//! [`PermalinkError`] that says what to do.

use std::io::{Read, Write};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use flate2::read::DeflateDecoder;
use flate2::write::DeflateEncoder;
use flate2::Compression;
use serde::{Deserialize, Serialize};

use crate::pipeline::Settings;
use crate::report::{self, Report};
use crate::units::Bytes;
use crate::whatif::WhatIfResult;

/// The fragment key: a permalink fragment starts with `#e=`.
pub const FRAGMENT_KEY: &str = "e=";
/// The version tag of the encoding this code writes.
pub const VERSION: &str = "v2";
/// The first version, still read.
pub const VERSION_1: &str = "v1";
/// Timeline points a permalink keeps at most.
pub const MAX_TIMELINE_POINTS: usize = 160;
/// Longest fragment decoded; longer ones are refused before any work.
pub const MAX_FRAGMENT_CHARS: usize = 256 * 1024;
/// Largest inflated JSON accepted.
pub const MAX_JSON_BYTES: u64 = 4 * 1024 * 1024;

/// Which trace an estimate came from (the trace itself is never shared).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceIdentity {
    /// The file name as the user's browser or shell gave it.
    pub name: String,
    pub size_bytes: Bytes,
    /// Lowercase hex SHA-256 of the file's bytes as given (before gunzip).
    pub sha256: String,
}

impl TraceIdentity {
    /// Names and fingerprints a trace's bytes.
    pub fn of(name: &str, bytes: &[u8]) -> TraceIdentity {
        let mut fingerprint = Fingerprint::default();
        fingerprint.update(bytes);
        fingerprint.finish(name)
    }
}

impl TraceIdentity {
    /// The identity of several traces given together (one job at several
    /// sequence lengths): the names joined with ` + `, the sizes added, the
    /// SHA-256 of their hashes in order. One trace is its own identity.
    pub fn joined(ids: &[TraceIdentity]) -> TraceIdentity {
        if let [one] = ids {
            return one.clone();
        }
        let mut fingerprint = Fingerprint::default();
        for id in ids {
            fingerprint.update(id.sha256.as_bytes());
        }
        let name = ids
            .iter()
            .map(|i| i.name.as_str())
            .collect::<Vec<_>>()
            .join(" + ");
        let mut joined = fingerprint.finish(&name);
        joined.size_bytes = ids
            .iter()
            .map(|i| i.size_bytes)
            .fold(Bytes::ZERO, |a, b| a + b);
        joined
    }
}

/// A [`TraceIdentity`] computed piece by piece as a file streams past.
#[derive(Debug, Clone, Default)]
pub struct Fingerprint {
    hasher: sha2::Sha256,
    size: u64,
}

impl Fingerprint {
    /// Adds the next piece of the file.
    pub fn update(&mut self, bytes: &[u8]) {
        use sha2::Digest;
        self.hasher.update(bytes);
        self.size += bytes.len() as u64;
    }

    /// The identity of the bytes seen, under `name`.
    pub fn finish(self, name: &str) -> TraceIdentity {
        use sha2::Digest;
        let digest = self.hasher.finalize();
        let mut sha256 = String::with_capacity(64);
        for byte in digest {
            sha256.push(char::from_digit(u32::from(byte >> 4), 16).unwrap_or('0'));
            sha256.push(char::from_digit(u32::from(byte & 0xf), 16).unwrap_or('0'));
        }
        TraceIdentity {
            name: name.to_owned(),
            size_bytes: Bytes(self.size),
            sha256,
        }
    }
}

/// Everything a permalink carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shared {
    pub trace: TraceIdentity,
    /// What the estimate was computed with; opening the link restores it.
    #[serde(default)]
    pub settings: Settings,
    /// The report, its timeline downsampled to [`MAX_TIMELINE_POINTS`].
    pub report: Report,
    /// The what-if answered on this estimate, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub whatif: Option<WhatIfResult>,
}

impl Shared {
    /// Builds the shared form of a report (downsampling its timeline). The
    /// settings take the trace's capture figures the estimate took
    /// ([`Settings::adopt_capture`]), so the link says what it answers.
    pub fn new(trace: TraceIdentity, mut settings: Settings, report: &Report) -> Shared {
        settings.adopt_capture(report.summary.capture.as_deref());
        let mut report = report.clone();
        report.timeline = report::downsample(&report.timeline, MAX_TIMELINE_POINTS);
        Shared {
            trace,
            settings,
            report,
            whatif: None,
        }
    }

    /// The same estimate with the answer to a what-if asked on it.
    pub fn with_whatif(mut self, whatif: Option<WhatIfResult>) -> Shared {
        self.whatif = whatif;
        self
    }
}

/// What a `v1` link carried.
#[derive(Deserialize)]
struct SharedV1 {
    trace: TraceIdentity,
    gpus: Vec<String>,
    report: Report,
}

impl From<SharedV1> for Shared {
    fn from(v1: SharedV1) -> Shared {
        // v1 listed the GPUs as chosen, the reference not necessarily first:
        // put the report's reference first so that it is the target again.
        let reference = v1.report.reference_gpu.clone();
        let mut gpus: Vec<String> = v1.gpus.into_iter().filter(|g| *g != reference).collect();
        gpus.insert(0, reference);
        Shared {
            trace: v1.trace,
            settings: Settings {
                gpus,
                alloc_conf: v1.report.summary.alloc_conf.clone(),
                ..Settings::default()
            },
            report: v1.report,
            whatif: None,
        }
    }
}

/// Why a permalink could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PermalinkError {
    #[error("this link holds no memcast estimate (its fragment does not start with \"#e=\"); open the page without a fragment to start over")]
    NotAPermalink,
    #[error(
        "this link was made by a newer memcast ({0:?}); open it with the version that made it"
    )]
    UnknownVersion(String),
    #[error(
        "this link is too long to be a memcast estimate ({0} characters); it was probably altered"
    )]
    TooLong(usize),
    #[error("this link is damaged ({0}); copy the whole link again")]
    Damaged(String),
}

/// Encodes a shared estimate as a URL fragment, without the leading `#`.
pub fn encode(shared: &Shared) -> String {
    let json = serde_json::to_vec(shared).unwrap_or_default();
    let mut encoder = DeflateEncoder::new(Vec::new(), Compression::best());
    // Writing into a Vec cannot fail.
    let _ = encoder.write_all(&json);
    let compressed = encoder.finish().unwrap_or_default();
    format!(
        "{FRAGMENT_KEY}{VERSION}.{}",
        URL_SAFE_NO_PAD.encode(compressed)
    )
}

/// The permalink of `shared` on the page at `base` (a URL; any fragment it
/// has is replaced): what the page puts in its address bar and the CLI's
/// `--link` prints.
pub fn link(base: &str, shared: &Shared) -> String {
    let page = base.split_once('#').map_or(base, |(page, _)| page);
    format!("{page}#{}", encode(shared))
}

/// Decodes a URL fragment (with or without the leading `#`), or a whole
/// permalink.
pub fn decode(fragment: &str) -> Result<Shared, PermalinkError> {
    let fragment = fragment
        .split_once('#')
        .map_or(fragment, |(_, after)| after);
    if fragment.len() > MAX_FRAGMENT_CHARS {
        return Err(PermalinkError::TooLong(fragment.len()));
    }
    let body = fragment
        .strip_prefix(FRAGMENT_KEY)
        .ok_or(PermalinkError::NotAPermalink)?;
    let (version, payload) = body
        .split_once('.')
        .ok_or_else(|| PermalinkError::Damaged("no version tag".into()))?;
    if version != VERSION && version != VERSION_1 {
        return Err(PermalinkError::UnknownVersion(
            version.chars().take(16).collect(),
        ));
    }
    let compressed = URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .map_err(|err| PermalinkError::Damaged(format!("not base64url: {err}")))?;
    let mut json = Vec::new();
    DeflateDecoder::new(compressed.as_slice())
        .take(MAX_JSON_BYTES + 1)
        .read_to_end(&mut json)
        .map_err(|err| PermalinkError::Damaged(format!("not compressed data: {err}")))?;
    if json.len() as u64 > MAX_JSON_BYTES {
        return Err(PermalinkError::Damaged(
            "it inflates to more than 4 MiB".into(),
        ));
    }
    let damaged =
        |err: serde_json::Error| PermalinkError::Damaged(format!("unexpected content: {err}"));
    let shared: Shared = if version == VERSION_1 {
        serde_json::from_slice::<SharedV1>(&json)
            .map_err(damaged)?
            .into()
    } else {
        serde_json::from_slice(&json).map_err(damaged)?
    };
    if shared.report.schema != report::SCHEMA {
        return Err(PermalinkError::UnknownVersion(shared.report.schema));
    }
    Ok(shared)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_matches_the_standard_test_vector() {
        let identity = TraceIdentity::of("abc.json", b"abc");
        assert_eq!(
            identity.sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(identity.size_bytes, Bytes(3));
    }

    #[test]
    fn several_traces_are_one_identity_and_one_trace_its_own() {
        let a = TraceIdentity::of("a.json", b"abc");
        let b = TraceIdentity::of("b.json", b"defg");
        assert_eq!(TraceIdentity::joined(std::slice::from_ref(&a)), a);
        let ab = TraceIdentity::joined(&[a.clone(), b.clone()]);
        assert_eq!(ab.name, "a.json + b.json");
        assert_eq!(ab.size_bytes, Bytes(7));
        assert_ne!(ab.sha256, TraceIdentity::joined(&[b, a]).sha256);
        // The depth and length settings travel only when set: older links
        // keep their bytes.
        let plain = serde_json::to_string(&Settings::default()).unwrap();
        assert!(!plain.contains("layers") && !plain.contains("seq_len"));
        let scaled = Settings {
            layers: Some(32),
            seq_len: Some(4096),
            ..Settings::default()
        };
        let text = serde_json::to_string(&scaled).unwrap();
        assert!(text.contains("\"layers\":32") && text.contains("\"seq_len\":4096"));
        assert_eq!(serde_json::from_str::<Settings>(&text).unwrap(), scaled);
    }

    #[test]
    fn foreign_and_damaged_fragments_are_refused_with_a_reason() {
        assert_eq!(decode("#section-2"), Err(PermalinkError::NotAPermalink));
        assert_eq!(
            decode("#e=v9.AAAA"),
            Err(PermalinkError::UnknownVersion("v9".into()))
        );
        assert!(matches!(
            decode("#e=v1.%%%"),
            Err(PermalinkError::Damaged(_))
        ));
        assert!(matches!(
            decode("#e=v1.AAAA"),
            Err(PermalinkError::Damaged(_))
        ));
        assert!(matches!(decode("#e=v1"), Err(PermalinkError::Damaged(_))));
        let long = format!("e=v1.{}", "A".repeat(MAX_FRAGMENT_CHARS));
        assert!(matches!(decode(&long), Err(PermalinkError::TooLong(_))));
    }

    /// A permalink the page made before settings and what-ifs were shared
    /// (the demo trace, the page's default GPUs).
    const V1_LINK: &str = include_str!("../tests/data/permalink-v1.txt");

    #[test]
    fn a_v1_link_still_opens_with_its_reference_as_the_target() {
        let shared = decode(V1_LINK.trim()).unwrap();
        assert_eq!(shared.trace.name, "resnet18_sgd_bs16_pos1.json.gz");
        assert_eq!(shared.report.reference_gpu, "a100-80gb");
        assert_eq!(
            shared.settings.gpus.first().map(String::as_str),
            Some("a100-80gb")
        );
        assert_eq!(shared.settings.gpus.len(), 6);
        assert_eq!(shared.settings.alloc_conf, shared.report.summary.alloc_conf);
        assert_eq!(shared.whatif, None);
        assert!(shared.report.peak.total_bytes > Bytes::ZERO);
    }

    fn sample() -> Shared {
        let v1 = decode(V1_LINK.trim()).unwrap();
        let settings = Settings {
            gpus: vec!["t4".into(), "300MiB".into()],
            alloc_conf: "expandable_segments:True".into(),
            ..Settings::default()
        };
        Shared::new(v1.trace, settings, &v1.report)
    }

    #[test]
    fn a_link_round_trips_and_replaces_the_base_fragment() {
        let shared = sample();
        let url = link("https://example.test/memcast/?x=1#old", &shared);
        let (page, fragment) = url.split_once('#').unwrap();
        assert_eq!(page, "https://example.test/memcast/?x=1");
        assert!(fragment.starts_with("e=v2."), "{fragment}");
        assert_eq!(decode(&url).unwrap(), shared);
        assert_eq!(decode(fragment).unwrap(), shared);
        assert_eq!(
            link("https://example.test/memcast/", &shared),
            link("https://example.test/memcast/#", &shared)
        );
    }

    fn encode_json(json: &serde_json::Value) -> String {
        let mut encoder = DeflateEncoder::new(Vec::new(), Compression::best());
        encoder.write_all(json.to_string().as_bytes()).unwrap();
        format!("e=v2.{}", URL_SAFE_NO_PAD.encode(encoder.finish().unwrap()))
    }

    #[test]
    fn fields_added_later_are_ignored_and_fields_missing_take_their_defaults() {
        let shared = sample();
        let mut json = serde_json::to_value(&shared).unwrap();
        json["settings"]["a_later_option"] = serde_json::json!(true);
        json["a_later_part"] = serde_json::json!({"n": 1});
        assert_eq!(decode(&encode_json(&json)).unwrap(), shared);
        let mut json = serde_json::to_value(&shared).unwrap();
        json.as_object_mut().unwrap().remove("settings");
        assert_eq!(
            decode(&encode_json(&json)).unwrap().settings,
            Settings::default()
        );
    }

    #[test]
    fn default_options_are_not_written() {
        let json = serde_json::to_value(sample()).unwrap();
        assert!(json.get("whatif").is_none());
        let settings = json["settings"].as_object().unwrap();
        assert!(!settings.contains_key("context"), "{settings:?}");
        assert!(!settings.contains_key("captured_optimizer"), "{settings:?}");
    }

    #[test]
    fn a_deflate_bomb_is_refused() {
        let zeros = vec![b' '; (MAX_JSON_BYTES + 10) as usize];
        let mut encoder = DeflateEncoder::new(Vec::new(), Compression::best());
        encoder.write_all(&zeros).unwrap();
        let fragment = format!("e=v1.{}", URL_SAFE_NO_PAD.encode(encoder.finish().unwrap()));
        assert!(fragment.len() < MAX_FRAGMENT_CHARS);
        assert_eq!(
            decode(&fragment),
            Err(PermalinkError::Damaged(
                "it inflates to more than 4 MiB".into()
            ))
        );
    }
}

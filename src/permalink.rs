//! Permalinks: a shared estimate in a URL fragment — never the trace.
//!
//! A permalink carries a [`Shared`] value: the report with its timeline
//! downsampled for drawing (every local maximum kept), the GPUs and allocator
//! settings it was computed with, and the trace's name, size and SHA-256, so a
//! reader can tell which trace it came from. The fragment is
//! `#e=v1.<base64url(deflate(json))>`: versioned, compressed, and URL-safe.
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

use crate::report::{self, Report};
use crate::Bytes;

/// The fragment key: a permalink fragment starts with `#e=`.
pub const FRAGMENT_KEY: &str = "e=";
/// The version tag of the encoding this code writes.
pub const VERSION: &str = "v1";
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
    /// The GPUs as the user chose them (`NAME|SIZE` strings).
    pub gpus: Vec<String>,
    /// The report, its timeline downsampled to [`MAX_TIMELINE_POINTS`].
    pub report: Report,
}

impl Shared {
    /// Builds the shared form of a report (downsampling its timeline).
    pub fn new(trace: TraceIdentity, gpus: Vec<String>, report: &Report) -> Shared {
        let mut report = report.clone();
        report.timeline = report::downsample(&report.timeline, MAX_TIMELINE_POINTS);
        Shared {
            trace,
            gpus,
            report,
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

/// Decodes a URL fragment (with or without the leading `#`).
pub fn decode(fragment: &str) -> Result<Shared, PermalinkError> {
    let fragment = fragment.strip_prefix('#').unwrap_or(fragment);
    if fragment.len() > MAX_FRAGMENT_CHARS {
        return Err(PermalinkError::TooLong(fragment.len()));
    }
    let body = fragment
        .strip_prefix(FRAGMENT_KEY)
        .ok_or(PermalinkError::NotAPermalink)?;
    let (version, payload) = body
        .split_once('.')
        .ok_or_else(|| PermalinkError::Damaged("no version tag".into()))?;
    if version != VERSION {
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
    let shared: Shared = serde_json::from_slice(&json)
        .map_err(|err| PermalinkError::Damaged(format!("unexpected content: {err}")))?;
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

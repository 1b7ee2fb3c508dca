//! How far memcast's estimate has been from real GPU peaks, per kind of job,
//! and the verdict's margin made of it.
//!
//! The figures are measured, not chosen: `accuracy.json` beside this file is
//! written by `python3 benches/accuracy.py --write`, which runs memcast on
//! every real-GPU pair the repository and `../shared` hold (each source's
//! command is in the file) and groups the errors by the [`JobKind`] memcast's
//! report gives each run. The README's accuracy table is made from the same
//! file (`tests/integration/readme.rs` keeps it in step).
//!
//! **The thin-margin rule.** A GPU the job fits on has a thin margin when its
//! headroom is smaller than the error measured for this kind of job applied
//! to the estimate: the worst underestimate seen (the most a real run of this
//! kind has needed above memcast's peak reserved bytes, as a fraction of the
//! real peak), times the peak reserved bytes. Within that margin a real run
//! has needed more than estimated before; the verdict says "fits with a thin
//! margin" and names the error's source. Overestimates do not threaten a fit
//! and do not widen the margin (the mean absolute error, which they dominate
//! when a recipe is estimated far too high, is reported beside it).

use serde::{Deserialize, Serialize};

use super::RunSummary;
use crate::analyzer::RunKind;
use crate::units::Bytes;

/// The kind of job an error figure is measured for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    /// Every parameter trained.
    Training,
    /// Some parameters frozen (LoRA, QLoRA, a frozen backbone).
    FineTuning,
    /// A forward pass without an optimizer (no_grad, inference_mode, eval
    /// with autograd).
    Inference,
    /// `generate()`: prefill and decode steps with a KV cache.
    Generation,
}

impl JobKind {
    /// The kind of the job a report describes.
    pub fn of(summary: &RunSummary) -> JobKind {
        // A generation keeps a KV cache (calls of a model with no backward
        // and no cache are repeated forwards, i.e. inference).
        if summary.generation.as_ref().is_some_and(|g| g.kv_blocks > 0) {
            return JobKind::Generation;
        }
        match summary.run_kind {
            RunKind::Training => JobKind::Training,
            RunKind::FineTuning => JobKind::FineTuning,
            RunKind::ForwardWithAutograd | RunKind::Inference => JobKind::Inference,
        }
    }

    /// The kind in the user's words ("training jobs").
    pub fn label(self) -> &'static str {
        match self {
            JobKind::Training => "training",
            JobKind::FineTuning => "fine-tuning",
            JobKind::Inference => "inference",
            JobKind::Generation => "generation",
        }
    }
}

/// Where error figures come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Source {
    pub id: String,
    pub name: String,
    /// The command that measures it again.
    pub command: String,
}

/// The error of memcast's peak against real runs of one group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorFigures {
    pub kind: JobKind,
    /// The source's id ([`Source::id`]); empty for a kind's total.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// The sources a kind's total is made of.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<String>,
    pub runs: u32,
    /// Mean absolute error, in basis points (hundredths of a percent).
    pub mean_abs_bp: u32,
    /// The largest amount a real peak was above the estimate, in basis points.
    pub worst_under_bp: u32,
    /// The largest amount the estimate was above a real peak, in basis points.
    pub worst_over_bp: u32,
}

/// The measured errors (`accuracy.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accuracy {
    pub schema: String,
    /// The command that writes the file again.
    pub regenerate: String,
    pub sources: Vec<Source>,
    /// One row per source and kind.
    pub rows: Vec<ErrorFigures>,
    /// Every source together, per kind.
    pub kinds: Vec<ErrorFigures>,
}

/// The measured errors shipped with this build.
const DATA: &str = include_str!("accuracy.json");

impl Accuracy {
    /// The errors measured for this build (`None` only if the shipped file
    /// does not parse, which a unit test rules out).
    pub fn shipped() -> Option<Accuracy> {
        serde_json::from_str(DATA).ok()
    }

    /// The figures of a kind, every source together.
    pub fn of(&self, kind: JobKind) -> Option<&ErrorFigures> {
        self.kinds.iter().find(|k| k.kind == kind && k.runs > 0)
    }
}

/// The error band a report's verdicts are judged with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBand {
    /// The kind of job the figures are for.
    pub kind: JobKind,
    /// Runs they were measured on.
    pub runs: u32,
    pub mean_abs_bp: u32,
    pub worst_under_bp: u32,
    /// The rule's figure: the worst underestimate.
    pub margin_bp: u32,
    /// The margin in bytes: `margin_bp` of the peak reserved bytes, rounded up.
    pub margin_bytes: Bytes,
    /// Where the figures come from: the sources' commands.
    pub source: String,
}

impl ErrorBand {
    /// The band for a job of `kind` peaking at `reserved` bytes.
    pub fn new(accuracy: &Accuracy, kind: JobKind, reserved: Bytes) -> Option<ErrorBand> {
        let figures = accuracy.of(kind)?;
        let margin_bp = figures.worst_under_bp;
        let bytes = (u128::from(reserved.get()) * u128::from(margin_bp)).div_ceil(10_000);
        let source = figures
            .sources
            .iter()
            .filter_map(|id| accuracy.sources.iter().find(|s| &s.id == id))
            .map(|s| s.command.clone())
            .collect::<Vec<_>>()
            .join("; ");
        Some(ErrorBand {
            kind,
            runs: figures.runs,
            mean_abs_bp: figures.mean_abs_bp,
            worst_under_bp: figures.worst_under_bp,
            margin_bp,
            margin_bytes: Bytes(u64::try_from(bytes).unwrap_or(u64::MAX)),
            source,
        })
    }
}

/// A GPU's verdict in three words: it fits, it fits within the measured
/// error (a thin margin), or it does not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Margin {
    #[default]
    Fits,
    Thin,
    DoesNotFit,
}

impl Margin {
    /// The margin of a GPU with `headroom` left (`None`: out of memory).
    pub fn of(headroom: Option<Bytes>, band: Option<&ErrorBand>) -> Margin {
        match (headroom, band) {
            (None, _) => Margin::DoesNotFit,
            (Some(h), Some(b)) if h < b.margin_bytes => Margin::Thin,
            (Some(_), _) => Margin::Fits,
        }
    }

    /// The verdict's words: "fits", "fits with a thin margin", "does not fit".
    pub fn label(self) -> &'static str {
        match self {
            Margin::Fits => "fits",
            Margin::Thin => "fits with a thin margin",
            Margin::DoesNotFit => "does not fit",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_figures_parse_and_cover_every_kind_they_name() {
        let accuracy = Accuracy::shipped().expect("src/report/accuracy.json parses");
        assert_eq!(accuracy.schema, "memcast.accuracy/1");
        assert!(!accuracy.kinds.is_empty());
        for kind in &accuracy.kinds {
            assert!(kind.runs > 0, "{kind:?}");
            for source in &kind.sources {
                assert!(accuracy.sources.iter().any(|s| &s.id == source), "{source}");
            }
            let rows: u32 = accuracy
                .rows
                .iter()
                .filter(|r| r.kind == kind.kind)
                .map(|r| r.runs)
                .sum();
            assert_eq!(
                rows, kind.runs,
                "the rows of {:?} add up to its total",
                kind.kind
            );
        }
    }

    #[test]
    fn a_headroom_within_the_measured_error_is_a_thin_margin() {
        let accuracy = Accuracy {
            schema: "memcast.accuracy/1".into(),
            regenerate: String::new(),
            sources: vec![Source {
                id: "a".into(),
                name: "a".into(),
                command: "python3 a.py".into(),
            }],
            rows: Vec::new(),
            kinds: vec![ErrorFigures {
                kind: JobKind::Training,
                source: String::new(),
                sources: vec!["a".into()],
                runs: 4,
                mean_abs_bp: 120,
                worst_under_bp: 250,
                worst_over_bp: 900,
            }],
        };
        let band = ErrorBand::new(&accuracy, JobKind::Training, Bytes(40 * Bytes::GIB)).unwrap();
        // 2.5 % of 40 GiB, rounded up: 1 GiB.
        assert_eq!(band.margin_bp, 250);
        assert_eq!(band.margin_bytes, Bytes(Bytes::GIB));
        assert_eq!(band.source, "python3 a.py");
        assert_eq!(
            Margin::of(Some(Bytes(663 * Bytes::MIB)), Some(&band)),
            Margin::Thin
        );
        assert_eq!(
            Margin::of(Some(Bytes(2 * Bytes::GIB)), Some(&band)),
            Margin::Fits
        );
        assert_eq!(Margin::of(None, Some(&band)), Margin::DoesNotFit);
        // No figures for a kind: no band, and a fit is a fit.
        assert!(ErrorBand::new(&accuracy, JobKind::Generation, Bytes(1)).is_none());
        assert_eq!(Margin::of(Some(Bytes(1)), None), Margin::Fits);
    }
}

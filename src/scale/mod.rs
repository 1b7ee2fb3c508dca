//! Stage 0½ — **scale**: the trace of the job the user will run, rebuilt
//! from a trace of a smaller one (issue 24, "trace small, run big").
//!
//! Input: one parsed [`Trace`] (or several of the same job at other sequence
//! lengths) and a [`Target`]: the number of repeated blocks (`--layers`) and
//! the sequence length (`--seq-len`). Output: a [`Trace`] as the profiler
//! would have written it for that job, and [`ScaleFacts`] saying what was
//! rebuilt. Everything downstream — analyzer, orchestrator rules, simulator —
//! sees the rebuilt trace exactly as if it had been traced, so the allocator
//! replays the full sequence (the peak moves between phases as depth and
//! length grow: it is found again, never scaled).
//!
//! Invariants:
//! - Pure and deterministic, like every stage.
//! - The identity target (the traced depth and length) returns the trace as
//!   it is.
//! - What cannot be rebuilt is refused with its reason ([`ScaleError`]),
//!   never guessed.

mod align;
mod copy;
mod depth;
mod events;
mod fit;
mod frames;
mod length;
mod names;
mod parts;
mod rescale;
mod shape;
mod step;
mod tokens;
pub mod work;

pub use tokens::TokenFacts;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::diag::{Warned, Warning};
use crate::trace::Trace;
use crate::units::Bytes;

/// The most repeated blocks a rebuild makes.
pub const MAX_LAYERS: u32 = 1000;
/// The longest sequence a rebuild makes.
pub const MAX_SEQ_LEN: u32 = 1 << 24;
/// The most new tokens a rebuild makes: 131,072, the position limit of
/// the longest-context models people generate with (Llama 3.1 and later's
/// `max_position_embeddings`), so `whatif context` can reach it. A
/// generation streams in the memory of its short rebuilds at any length
/// (`program::derive`); one built whole is held to the memory budget first.
pub const MAX_NEW_TOKENS: u32 = 1 << 17;

/// The job to estimate, when it differs from the traced one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// Repeated blocks per stack (`None`: as traced).
    pub layers: Option<u32>,
    /// Sequence length (`None`: as traced).
    pub seq_len: Option<u32>,
    /// New tokens a `generate()` run makes (`None`: as traced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_tokens: Option<u32>,
}

impl Target {
    /// Nothing to rebuild.
    pub fn is_identity(&self) -> bool {
        self.layers.is_none() && self.seq_len.is_none() && self.new_tokens.is_none()
    }
}

/// One stack of repeated blocks found in the trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackFacts {
    /// The block's module class (`LlamaDecoderLayer`).
    pub block: String,
    /// The module the blocks are called from (`LlamaModel_0`).
    pub parent: String,
    /// The traced block that was copied (`LlamaDecoderLayer_1`).
    pub template: String,
    /// Bytes the template allocated in its first forward call.
    pub bytes_per_call: Bytes,
}

/// What `--layers` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepthFacts {
    /// Blocks per stack in the trace.
    pub traced: u32,
    /// Blocks per stack estimated.
    pub estimated: u32,
    pub stacks: Vec<StackFacts>,
}

/// What `--seq-len` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LengthFacts {
    /// The traced sequence lengths (one per trace, ascending).
    pub traced: Vec<u32>,
    pub estimated: u32,
    /// How the sizes were found: `shapes` (one trace: from the recorded
    /// shapes) or `fit` (several traces: each size fitted across them).
    pub method: String,
    /// Allocations whose size grows with the length, as T and as T².
    pub linear: usize,
    pub quadratic: usize,
}

/// The traced job's repeated blocks and sequence length, as the page shows
/// them before the user asks for another depth or length.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Traced {
    /// The repeated block's module class (`LlamaDecoderLayer`), if found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<String>,
    /// Blocks per stack in the trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<u32>,
    /// Stacks of blocks (2 for an encoder–decoder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stacks: Option<u32>,
    /// The sequence length (the token ids' last dim), if found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_len: Option<u32>,
    /// The batch (the token ids' first dim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u32>,
}

impl Traced {
    /// Nothing was found.
    pub fn is_empty(&self) -> bool {
        self.block.is_none() && self.seq_len.is_none()
    }
}

/// What the trace shows of its depth and length (no rebuilding).
pub fn inspect(trace: &Trace) -> Traced {
    let frames = frames::module_frames(trace);
    let stacks = frames::find_stacks(trace, &frames);
    let shape = shape::traced_shape(trace);
    Traced {
        block: stacks.first().map(|s| s.class.clone()),
        layers: stacks
            .first()
            .and_then(|s| u32::try_from(s.instances.len()).ok()),
        stacks: (!stacks.is_empty()).then(|| u32::try_from(stacks.len()).unwrap_or(u32::MAX)),
        seq_len: shape.map(|(t, _)| t),
        batch: shape.map(|(_, b)| b),
    }
}

/// What was rebuilt, for the report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleFacts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<DepthFacts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<LengthFacts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenFacts>,
}

impl ScaleFacts {
    /// Nothing was rebuilt.
    pub fn is_empty(&self) -> bool {
        self.depth.is_none() && self.length.is_none() && self.tokens.is_none()
    }
}

impl ScaleError {
    /// The setting the message asks for, if any.
    pub fn setting(&self) -> Option<crate::diag::Setting> {
        match self {
            ScaleError::SeveralWithoutLength => Some(crate::diag::Setting::SequenceLength),
            ScaleError::OverBudget { .. } => Some(crate::diag::Setting::MemoryBudget),
            _ => None,
        }
    }
}

/// Why a trace could not be rebuilt for the target.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScaleError {
    #[error("the trace has no nn.Module frames, so its repeated blocks cannot be found: profile with torch.profiler.profile(with_stack=True) to estimate another number of layers")]
    NoModuleFrames,
    #[error("no repeated block was found: the layers are found as two or more calls of one module class under one parent (e.g. LlamaDecoderLayer_0, LlamaDecoderLayer_1); trace the model with at least two of its blocks")]
    NoRepeatedBlock,
    #[error("the blocks of {block} cannot be repeated: {reason}; trace the model at a depth where its blocks are alike, or estimate the traced depth")]
    BlocksDiffer { block: String, reason: String },
    #[error("the trace has {first_count} blocks of {first} but {other_count} of {other}: the number of layers is ambiguous; trace both stacks at the same depth")]
    StacksDiffer {
        first: String,
        first_count: usize,
        other: String,
        other_count: usize,
    },
    #[error("the trace has {traced} blocks and {layers} were asked for: give a number of layers of at least {traced} (trace fewer blocks to estimate fewer)")]
    FewerLayers { traced: u32, layers: u32 },
    #[error("the number of layers must be at least 1")]
    ZeroLayers,
    #[error(
        "{0} layers is more than memcast rebuilds (at most {MAX_LAYERS}, more than any model has)"
    )]
    TooManyLayers(u32),
    #[error(
        "a sequence length of {0} is more than memcast rebuilds (at most {MAX_SEQ_LEN} tokens)"
    )]
    TooLong(u32),
    #[error("at that sequence length one tensor would hold more than 2^50 bytes (1 PiB): give a shorter length")]
    TensorTooLarge,
    #[error("the sequence length must be at least 1")]
    ZeroLength,
    #[error("the sequence length of the trace could not be found: it is read from the token ids of the first embedding (aten::embedding) or from the samples the data loader stacks, and the trace shows neither with shapes; profile with record_shapes=True and feed the model token ids through an nn.Embedding or a DataLoader")]
    LengthNotFound,
    #[error("the traces are not the same job: {0}; give traces of one job that differ only in the sequence length")]
    NotTheSameJob(String),
    #[error("the traces have the same sequence length ({0}): give traces at different lengths")]
    SameLength(u32),
    #[error("the trace shows no generate() run of three calls of the model or more (the prompt and two new tokens at least): only a generation can be estimated at more new tokens; trace one that makes at least 2 new tokens, or leave the number of new tokens empty")]
    NoGeneration,
    #[error(
        "the generation cannot be extended: {0}; trace a generation whose decode steps are alike"
    )]
    StepsDiffer(String),
    #[error("the trace makes {traced} new tokens and {asked} were asked for: give at least {traced} (trace fewer tokens to estimate fewer)")]
    FewerTokens { traced: u32, asked: u32 },
    #[error("the number of new tokens must be at least 1")]
    ZeroTokens,
    #[error("{0} new tokens is more than memcast rebuilds (at most {max}): give fewer", max = MAX_NEW_TOKENS)]
    TooManyTokens(u32),
    #[error("the trace is a generate() run with a {traced}-token prompt, and another prompt length was asked for ({asked}): its decode steps' KV cache holds the prompt plus one position a step, which rebuilding at another length would scale with the prompt and overstate; trace the prompt length to estimate (the number of new tokens can still be raised)")]
    GenerationLength { traced: u32, asked: u32 },
    #[error("several traces were given, which estimate their job at another sequence length: set the sequence length to estimate")]
    SeveralWithoutLength,
    #[error("the trace's times or ids are too large to make {0}: the copies would carry them past the largest number a trace holds (2^63); the file is not a trace as torch.profiler writes it, or its ts values are not microseconds")]
    OutOfRange(String),
    #[error("{asked} would need about {} of memory to rebuild and simulate, more than this estimate may use ({}): {fits} in that budget", work::size(*needed), work::size(*budget))]
    OverBudget {
        /// The request in words ("32 layers and 8,192 new tokens").
        asked: String,
        /// The memory it would need.
        needed: Bytes,
        /// The memory budget.
        budget: Bytes,
        /// The largest request that fits, in words.
        fits: String,
    },
}

/// The work `target` implies on `traces` ([`count`]), or the error that
/// refuses it: a target out of range, more memory than `budget`, or times
/// the copies would carry past the range of a time ([`work::check`]).
/// [`scale_within`] calls it before it builds anything.
pub fn check_work(
    traces: &[Trace],
    target: &Target,
    budget: work::Budget,
) -> Result<work::Work, ScaleError> {
    validate(target)?;
    let Some(first) = traces.first() else {
        return Err(ScaleError::SeveralWithoutLength);
    };
    let counts = if target.layers.is_some() || target.new_tokens.is_some() {
        count(traces, target)
    } else {
        work::Counts {
            traced: work::Counts::traced_of(first),
            ..work::Counts::default()
        }
    };
    work::check(&counts, target, budget)
}

/// The events of the trace the copies of `target` are made from, and what
/// each copy adds ([`work::Counts::of`]): the first of `traces`, or where a
/// length is asked too, the job made at that length. Lengthening adds no
/// event, but it can change what repeats: each free takes the size of its
/// allocation there, so blocks whose recorded frees differed (a cut or
/// corrupted trace) are copies of one block only at the new length, and
/// the depth rebuild copies them (a fuzzed trace counted 107 events and
/// rebuilt 531). A length the rebuild refuses counts the first trace:
/// nothing is built.
pub fn count(traces: &[Trace], target: &Target) -> work::Counts {
    match at_length(traces, target, &mut Vec::new()) {
        Ok(Some((trace, _))) => work::Counts::of(&trace),
        Ok(None) | Err(_) => traces.first().map(work::Counts::of).unwrap_or_default(),
    }
}

/// The job of `traces` at the length `target` asks for (one trace's shapes
/// rescaled, or several traces fitted), with its facts; `None` where no
/// length is asked. Refuses a generation asked at another length than its
/// own and a length whose blocks would pass the largest event.
fn at_length(
    traces: &[Trace],
    target: &Target,
    warnings: &mut Vec<Warning>,
) -> Result<Option<(Trace, LengthFacts)>, ScaleError> {
    let Some((first, rest)) = traces.split_first() else {
        return Err(ScaleError::SeveralWithoutLength);
    };
    let Some(len) = target.seq_len else {
        return if rest.is_empty() {
            Ok(None)
        } else {
            Err(ScaleError::SeveralWithoutLength)
        };
    };
    let traced = shape::traced_length(first);
    if traced.is_some_and(|t| t != len) && tokens::is_generation(first) {
        return Err(ScaleError::GenerationLength {
            traced: traced.unwrap_or(0),
            asked: len,
        });
    }
    let (trace, facts) = if rest.is_empty() {
        length::lengthen(first, len, warnings)?
    } else {
        fit::fit(traces, len, warnings)?
    };
    let limit = i64::try_from(crate::trace::MAX_EVENT_BYTES).unwrap_or(i64::MAX);
    if trace
        .memory
        .iter()
        .any(|m| m.bytes.unsigned_abs() > limit.unsigned_abs())
    {
        return Err(ScaleError::TensorTooLarge);
    }
    Ok(Some((trace, facts)))
}

/// The most new tokens the job `target` asks for (its layers; its new
/// tokens left aside) can generate within `budget`, counted on the first of
/// `traces`: what a search over generation lengths may simulate. `None`
/// when the trace is no generation or not even its traced length fits.
pub fn most_new_tokens(traces: &[Trace], target: &Target, budget: work::Budget) -> Option<u32> {
    let counts = work::Counts::of(traces.first()?);
    let layers = target.layers.unwrap_or(counts.layers);
    work::most_tokens(&counts, layers, budget)
}

/// Refuses a target out of range before any work: zero or too many
/// layers, tokens or positions.
pub fn validate(target: &Target) -> Result<(), ScaleError> {
    if target.layers == Some(0) {
        return Err(ScaleError::ZeroLayers);
    }
    if target.seq_len == Some(0) {
        return Err(ScaleError::ZeroLength);
    }
    if target.new_tokens == Some(0) {
        return Err(ScaleError::ZeroTokens);
    }
    if let Some(layers) = target.layers.filter(|&l| l > MAX_LAYERS) {
        return Err(ScaleError::TooManyLayers(layers));
    }
    if let Some(len) = target.seq_len.filter(|&l| l > MAX_SEQ_LEN) {
        return Err(ScaleError::TooLong(len));
    }
    if let Some(n) = target.new_tokens.filter(|&n| n > MAX_NEW_TOKENS) {
        return Err(ScaleError::TooManyTokens(n));
    }
    Ok(())
}

/// The new tokens each generation of the trace makes (its calls of the
/// model), if it is a generation.
pub fn traced_new_tokens(trace: &Trace) -> Option<u32> {
    tokens::traced_calls(trace)
}

/// The trace of the target job: `trace` itself for the identity target,
/// else rebuilt to the target's length and then depth.
pub fn scale(trace: &Trace, target: &Target) -> Result<Warned<(Trace, ScaleFacts)>, ScaleError> {
    scale_many(std::slice::from_ref(trace), target)
}

/// Like [`scale`] for one or more traces of the same job at different
/// sequence lengths (two or three: each size is fitted across them).
pub fn scale_many(
    traces: &[Trace],
    target: &Target,
) -> Result<Warned<(Trace, ScaleFacts)>, ScaleError> {
    scale_within(traces, target, work::Budget::UNLIMITED)
}

/// Like [`scale_many`], refusing at once a target whose rebuild would need
/// more memory than `budget` ([`check_work`]: the one place the work is
/// checked, before anything is built). What the pipeline calls.
pub fn scale_within(
    traces: &[Trace],
    target: &Target,
    budget: work::Budget,
) -> Result<Warned<(Trace, ScaleFacts)>, ScaleError> {
    check_work(traces, target, budget)?;
    rebuild_checked(traces, target)
}

/// Rebuilds of one job at several small targets whose work was counted
/// already ([`count`]), each a [`scale_within`]: for a caller that derives
/// a job from them. What the targets share is made once — the job at the
/// length asked for, each depth's deeper trace and its calls of the model —
/// so a grid of four token counts by four depths deepens four times, not
/// sixteen.
#[derive(Clone)]
pub struct Rebuilds<'a> {
    traces: &'a [Trace],
    /// The traced generation's calls of the model (a token target's deeper
    /// rebuild is checked against them).
    traced_calls: Option<Vec<u32>>,
    /// At a sequence length: the lengthened trace, with its warnings.
    lengthened: BTreeMap<u32, Made<LengthFacts>>,
    /// At a (length, depth): the deeper trace, its warnings and its calls.
    deep: BTreeMap<(Option<u32>, u32), Deep>,
    /// Whether what it makes is kept for later targets; else the trace
    /// asked for is handed over, not copied.
    keep: bool,
}

/// A deeper trace made once, and its generations (found when a token
/// target first asks: what its calls of the model are checked by, and what
/// each of its token rebuilds extends).
type Deep = (Made<DepthFacts>, Option<Vec<(tokens::Gen, u32)>>);

/// A deeper trace [`Rebuilds::warm`] needs: made on its own, on any
/// thread ([`Deepening::make`]), and handed back to `warm`.
#[derive(Clone)]
pub struct Deepening<'a> {
    /// (length, blocks per stack).
    key: (Option<u32>, u32),
    /// The trace deepened: the lengthened one, or else `first`.
    base: Option<Arc<Trace>>,
    first: &'a Trace,
    /// Whether a token target asks for its generations.
    generations: bool,
}

/// What a [`Deepening`] made.
pub struct Deepened {
    key: (Option<u32>, u32),
    made: Result<Deep, ScaleError>,
}

impl Deepening<'_> {
    /// The deeper trace (and its generations where asked for).
    pub fn make(&self) -> Deepened {
        let made = (|| {
            let mut w = Vec::new();
            let base = self.base.as_deref().unwrap_or(self.first);
            let (trace, f) = depth::deepen(base, self.key.1, &mut w)?;
            let gens = match self.generations {
                true => Some(tokens::generations(&trace)?),
                false => None,
            };
            Ok(((Arc::new(trace), f, w), gens))
        })();
        Deepened {
            key: self.key,
            made,
        }
    }
}

/// A trace made once, its facts and the warnings making it gave (shared
/// by the clones of its [`Rebuilds`]).
type Made<F> = (Arc<Trace>, F, Vec<Warning>);

impl<'a> Rebuilds<'a> {
    /// Rebuilds of `traces`.
    pub fn new(traces: &'a [Trace]) -> Rebuilds<'a> {
        Rebuilds {
            traces,
            traced_calls: None,
            lengthened: BTreeMap::new(),
            deep: BTreeMap::new(),
            keep: true,
        }
    }

    /// One rebuild of `traces`: nothing is kept, so a job rebuilt whole is
    /// never held twice.
    pub fn once(traces: &'a [Trace]) -> Rebuilds<'a> {
        Rebuilds {
            keep: false,
            ..Rebuilds::new(traces)
        }
    }

    /// The trace made for a depth (`deep`) or else a length (`len`): a copy
    /// where it is kept, else the trace itself.
    fn take(&mut self, deep: Option<(Option<u32>, u32)>, len: Option<u32>) -> Option<Trace> {
        let shared = match deep {
            Some(key) if self.keep => self.deep.get(&key).map(|((trace, _, _), _)| trace.clone()),
            Some(key) => self.deep.remove(&key).map(|((trace, _, _), _)| trace),
            None if self.keep => self
                .lengthened
                .get(&len?)
                .map(|(trace, _, _)| trace.clone()),
            None => self.lengthened.remove(&len?).map(|(trace, _, _)| trace),
        }?;
        Some(Arc::try_unwrap(shared).unwrap_or_else(|shared| Trace::clone(&shared)))
    }

    /// Makes what the jobs at `targets` share (the lengthened trace, each
    /// depth's deeper trace and its calls of the model), each target's work
    /// checked: the clones made after share it.
    ///
    /// Every target is checked before anything is made; the deeper traces
    /// are made by `make_all` (each [`Deepening::make`], in any order or
    /// side by side; one it does not hand back is made here), and an error
    /// is the first target's in order.
    pub fn warm(
        &mut self,
        targets: &[Target],
        budget: work::Budget,
        counts: &work::Counts,
        make_all: impl FnOnce(&[Deepening<'a>]) -> Vec<Deepened>,
    ) -> Result<(), ScaleError> {
        for target in targets {
            validate(target)?;
            work::check(counts, target, budget)?;
        }
        let mut wanted: Vec<Deepening<'a>> = Vec::new();
        for target in targets {
            let base = self.base(target, &mut Vec::new(), &mut ScaleFacts::default())?;
            let (Some(layers), Some(first)) = (target.layers, self.traces.first()) else {
                continue;
            };
            let key = (target.seq_len, layers);
            let generations = target.new_tokens.is_some();
            if self.deep.contains_key(&key) {
                continue;
            }
            match wanted.iter_mut().find(|d| d.key == key) {
                Some(d) => d.generations |= generations,
                None => wanted.push(Deepening {
                    key,
                    base,
                    first,
                    generations,
                }),
            }
        }
        let mut made = make_all(&wanted);
        for d in &wanted {
            if !made.iter().any(|m| m.key == d.key) {
                made.push(d.make());
            }
        }
        let mut failed = BTreeMap::new();
        for Deepened { key, made } in made {
            match made {
                Ok(deep) => {
                    self.deep.entry(key).or_insert(deep);
                }
                Err(e) => {
                    failed.entry(key).or_insert(e);
                }
            }
        }
        for target in targets {
            let key = target.layers.map(|layers| (target.seq_len, layers));
            if let Some(e) = key.and_then(|key| failed.remove(&key)) {
                return Err(e);
            }
            self.shared(target, &mut Vec::new(), &mut ScaleFacts::default())?;
        }
        Ok(())
    }

    /// The traces it rebuilds.
    pub fn traces(&self) -> &'a [Trace] {
        self.traces
    }

    /// The job at `target` within `budget`, the work of `traces` counted
    /// as `counts` ([`count`]): what [`scale_within`] gives.
    pub fn rebuild(
        &mut self,
        target: &Target,
        budget: work::Budget,
        counts: &work::Counts,
    ) -> Result<Warned<(Trace, ScaleFacts)>, ScaleError> {
        validate(target)?;
        work::check(counts, target, budget)?;
        self.make(target)
    }

    /// The job at `target`, its work checked.
    fn make(&mut self, target: &Target) -> Result<Warned<(Trace, ScaleFacts)>, ScaleError> {
        let Some(first) = self.traces.first() else {
            return Err(ScaleError::SeveralWithoutLength);
        };
        let mut warnings = Vec::new();
        let mut facts = ScaleFacts::default();
        let base = self.shared(target, &mut warnings, &mut facts)?;
        let out = match target.new_tokens {
            Some(n) => {
                let base = base.as_deref().unwrap_or(first);
                let gens = target
                    .layers
                    .and_then(|layers| self.deep.get(&(target.seq_len, layers)))
                    .and_then(|(_, gens)| gens.as_deref());
                let (trace, f) = tokens::extend(base, gens, n)?;
                facts.tokens = Some(f);
                trace
            }
            None => {
                drop(base);
                let deep = target.layers.map(|layers| (target.seq_len, layers));
                self.take(deep, target.seq_len)
                    .unwrap_or_else(|| first.clone())
            }
        };
        if !facts.is_empty() {
            warnings.push(Warning::new("scaled", describe(&facts)));
        }
        Ok(Warned {
            value: (out, facts),
            warnings,
        })
    }

    /// The trace the job at `target` grows its decode steps from: the
    /// traced one (`None`), lengthened, deepened, each made once; its
    /// facts and warnings added to `facts` and `warnings`.
    fn shared(
        &mut self,
        target: &Target,
        warnings: &mut Vec<Warning>,
        facts: &mut ScaleFacts,
    ) -> Result<Option<Arc<Trace>>, ScaleError> {
        let Some(first) = self.traces.first() else {
            return Err(ScaleError::SeveralWithoutLength);
        };
        let base = self.base(target, warnings, facts)?;
        let Some(layers) = target.layers else {
            return Ok(base);
        };
        let ((trace, f, w), gens) = match self.deep.entry((target.seq_len, layers)) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => {
                let mut w = Vec::new();
                let (trace, f) = depth::deepen(base.as_deref().unwrap_or(first), layers, &mut w)?;
                v.insert(((Arc::new(trace), f, w), None))
            }
        };
        facts.depth = Some(f.clone());
        warnings.extend(w.iter().cloned());
        if let Some(traced) = self
            .traced_calls
            .as_ref()
            .filter(|_| target.new_tokens.is_some())
        {
            // Nor change it: more blocks add ops inside each call,
            // never calls (a frame whose parent is missing read as
            // a call of the model, and the deeper rebuild,
            // renumbering frames, read the calls around it instead:
            // a fuzzed trace predicted 5,294 events and rebuilt
            // 27,702).
            let gens = match gens {
                Some(g) => g,
                None => gens.insert(tokens::generations(trace)?),
            };
            let rebuilt: Vec<u32> = gens.iter().map(|(_, calls)| *calls).collect();
            if &rebuilt != traced {
                return Err(ScaleError::StepsDiffer(format!(
                    "with more blocks its calls of the model are not the traced ones ({traced:?} per generation traced, {rebuilt:?} rebuilt: a module frame whose parent is missing reads as a call)"
                )));
            }
        }
        Ok(Some(Arc::clone(trace)))
    }

    /// The trace a target's depth is made from: the traced one (`None`)
    /// or lengthened, made once; the traced calls of the model found where
    /// a token target first asks.
    fn base(
        &mut self,
        target: &Target,
        warnings: &mut Vec<Warning>,
        facts: &mut ScaleFacts,
    ) -> Result<Option<Arc<Trace>>, ScaleError> {
        let Some(first) = self.traces.first() else {
            return Err(ScaleError::SeveralWithoutLength);
        };
        // The generation lengthened is the traced one, as the work check
        // counted it: a deeper rebuild must not make one (a cut trace's
        // block frames without a parent read as calls of the model).
        if target.new_tokens.is_some() && self.traced_calls.is_none() {
            self.traced_calls = Some(calls_per_generation(first)?);
        }
        // Several traces are of one job at several lengths: refused
        // without a length to fit them at (as `at_length` refuses).
        if target.seq_len.is_none() && self.traces.len() > 1 {
            return Err(ScaleError::SeveralWithoutLength);
        }
        if let Some(len) = target.seq_len {
            if !self.lengthened.contains_key(&len) {
                let mut w = Vec::new();
                if let Some((trace, f)) = at_length(self.traces, target, &mut w)? {
                    self.lengthened.insert(len, (Arc::new(trace), f, w));
                }
            }
        }
        let lengthened = target.seq_len.and_then(|len| self.lengthened.get(&len));
        if let Some((_, f, w)) = lengthened {
            facts.length = Some(f.clone());
            warnings.extend(w.iter().cloned());
        }
        Ok(lengthened.map(|(trace, _, _)| Arc::clone(trace)))
    }
}

/// The calls of the model each generation of `trace` makes.
fn calls_per_generation(trace: &Trace) -> Result<Vec<u32>, ScaleError> {
    Ok(tokens::generations(trace)?
        .iter()
        .map(|(_, calls)| *calls)
        .collect())
}

/// The rebuild of a target whose work was checked.
fn rebuild_checked(
    traces: &[Trace],
    target: &Target,
) -> Result<Warned<(Trace, ScaleFacts)>, ScaleError> {
    Rebuilds::once(traces).make(target)
}

/// One sentence on what was rebuilt, for the report's warnings.
pub fn describe(facts: &ScaleFacts) -> String {
    let mut parts = Vec::new();
    if let Some(d) = &facts.depth {
        let blocks: Vec<String> = d
            .stacks
            .iter()
            .map(|s| format!("{} (in {})", s.block, s.parent))
            .collect();
        parts.push(format!(
            "estimated with {} blocks of {} per stack from a trace of {}",
            d.estimated,
            blocks.join(" and "),
            d.traced
        ));
    }
    if let Some(l) = &facts.length {
        let traced: Vec<String> = l.traced.iter().map(u32::to_string).collect();
        parts.push(format!(
            "at sequence length {} derived from {} ({} allocations growing as T, {} as T², {})",
            l.estimated,
            if traced.len() == 1 {
                format!("one trace at length {}", traced.join(""))
            } else {
                format!("traces at lengths {}", traced.join(", "))
            },
            l.linear,
            l.quadratic,
            if l.method == "fit" {
                "each size fitted across the traces"
            } else {
                "found from the recorded shapes"
            }
        ));
    }
    if let Some(t) = &facts.tokens {
        parts.push(format!(
            "generating {} new tokens from a trace of {} ({} generation(s): the last decode step copied {} times, {} allocations growing a position per step{})",
            t.estimated,
            t.traced,
            t.generations,
            t.estimated.saturating_sub(t.traced),
            t.growing,
            if t.static_cache > 0 {
                format!(", {} StaticCache blocks made for the longer generation", t.static_cache)
            } else {
                String::new()
            }
        ));
    }
    format!(
        "this is not the traced job: {}; the rebuilt sequence was simulated in full",
        parts.join(", ")
    )
}

#[cfg(test)]
mod tests;

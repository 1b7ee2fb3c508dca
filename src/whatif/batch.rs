//! What-if 3 — **batch size**: a model of the orchestrated sequence as a
//! function of the batch size, fitted on two or more traces of the same job,
//! re-simulated at any batch size, and the largest batch that fits each GPU.
//!
//! Blocks are matched across traces by their position in the sequence and
//! must agree on op and category. Each block's size is fitted as
//! `a + b·batch`:
//! - *fixed* when every trace has the same size (`b = 0`);
//! - *proportional* when the sizes lie exactly on one line with integer `a`
//!   and `b` (the common case: a tensor with a batch dimension);
//! - *approximate* otherwise: the line through the smallest and largest batch,
//!   rounded up to whole bytes.
//!
//! The sequence at batch `N` takes its event order from the input trace whose
//! batch is nearest to `N` (the smaller one on ties) and its sizes from the
//! model, so at an input's batch size the synthesised sequence is that
//! input's sequence, byte for byte, and reproduces its peak exactly.
//!
//! With a single trace the model is assumed rather than fitted (see
//! [`BatchModel::assume`]) and the result says so (`single_trace`).
//!
//! The largest batch that fits is found by doubling and bisection, assuming
//! the peak does not shrink when the batch grows (stated in the result).

use serde::{Deserialize, Serialize};

use super::{estimate_schedule, peak_only, WhatIfError};
use crate::orchestrator::{Category, Phase, Schedule};
use crate::pipeline::{Config, Prepared};
use crate::units::Bytes;

/// The version tag of [`BatchSweep`].
pub const SCHEMA: &str = "memcast.batch/1";

/// The largest batch the search tries.
pub const MAX_SEARCH_BATCH: u32 = 1 << 20;

/// How a block's size depends on the batch size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SizeKind {
    Fixed,
    Proportional,
    Approximate,
    /// Single-trace model: assumed proportional to the batch from its
    /// category (less certain).
    Assumed,
}

/// `size = intercept + slope·(batch − anchor)` bytes, for one block; the
/// slope is `slope / slope_den` (1 except for approximate fits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeFit {
    pub kind: SizeKind,
    /// The size at `batch == anchor`.
    pub intercept: i64,
    pub anchor: u32,
    pub slope: i64,
    pub slope_den: i64,
}

impl SizeFit {
    /// The size at `batch` (never negative; rounded up when approximate).
    pub fn at(&self, batch: u32) -> Bytes {
        let num = i128::from(self.slope) * (i128::from(batch) - i128::from(self.anchor));
        let den = i128::from(self.slope_den.max(1));
        // Ceiling division for either sign of the numerator.
        let scaled = if num >= 0 {
            (num + den - 1) / den
        } else {
            num / den
        };
        let size = i128::from(self.intercept) + scaled;
        Bytes(u64::try_from(size.max(0)).unwrap_or(u64::MAX))
    }
}

/// One input trace of the model.
#[derive(Debug, Clone, Copy)]
pub struct BatchInput<'a> {
    pub batch: u32,
    pub prepared: &'a Prepared,
}

/// The fitted batch model: the input sequences and one size fit per block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchModel {
    /// The inputs' batch sizes (ascending) with their schedules.
    inputs: Vec<(u32, Schedule)>,
    fits: Vec<SizeFit>,
}

/// Counts of the model's blocks by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ModelSummary {
    pub blocks: u32,
    pub fixed: u32,
    pub proportional: u32,
    pub approximate: u32,
    /// Single-trace model: blocks assumed proportional from their category.
    pub assumed: u32,
    /// Sum of the fixed blocks' sizes (over the whole sequence).
    pub fixed_bytes: Bytes,
    /// Sum of the proportional blocks' slopes: bytes allocated per sample
    /// over the whole sequence (not a peak).
    pub bytes_per_sample: Bytes,
}

fn fit_sizes(points: &[(u32, Bytes)]) -> SizeFit {
    let (Some(&(b0, s0)), Some(&(b1, s1))) = (points.first(), points.last()) else {
        return SizeFit {
            kind: SizeKind::Fixed,
            intercept: 0,
            anchor: 0,
            slope: 0,
            slope_den: 1,
        };
    };
    let s0 = i64::try_from(s0.get()).unwrap_or(i64::MAX);
    let s1 = i64::try_from(s1.get()).unwrap_or(i64::MAX);
    if points.iter().all(|&(_, s)| s.get() == s0.unsigned_abs()) {
        return SizeFit {
            kind: SizeKind::Fixed,
            intercept: s0,
            anchor: 0,
            slope: 0,
            slope_den: 1,
        };
    }
    let db = i64::from(b1) - i64::from(b0);
    let ds = s1.saturating_sub(s0);
    if db > 0 && ds % db == 0 {
        let slope = ds / db;
        let intercept = s0.saturating_sub(slope.saturating_mul(i64::from(b0)));
        let exact = points.iter().all(|&(b, s)| {
            intercept.saturating_add(slope.saturating_mul(i64::from(b)))
                == i64::try_from(s.get()).unwrap_or(i64::MAX)
        });
        if exact {
            return SizeFit {
                kind: SizeKind::Proportional,
                intercept,
                anchor: 0,
                slope,
                slope_den: 1,
            };
        }
    }
    // The line through the smallest and largest batch, anchored at the
    // smallest so that both inputs are reproduced exactly.
    SizeFit {
        kind: SizeKind::Approximate,
        intercept: s0,
        anchor: b0,
        slope: ds,
        slope_den: db.max(1),
    }
}

impl BatchModel {
    /// Fits the model on two or more traces of the same job; with one trace,
    /// see [`BatchModel::assume`].
    pub fn fit(inputs: &[BatchInput<'_>]) -> Result<BatchModel, WhatIfError> {
        if let [single] = inputs {
            return BatchModel::assume(*single);
        }
        if inputs.len() < 2 {
            return Err(WhatIfError::TooFewTraces(inputs.len()));
        }
        let mut sorted: Vec<BatchInput<'_>> = inputs.to_vec();
        sorted.sort_by_key(|input| input.batch);
        let batches: Vec<u32> = sorted.iter().map(|i| i.batch).collect();
        if let Some(&zero) = batches.iter().find(|&&b| b == 0) {
            return Err(WhatIfError::ZeroBatch(zero));
        }
        if batches.windows(2).any(|w| w.first() == w.get(1)) {
            return Err(WhatIfError::SameBatch(batches));
        }
        let schedules: Vec<&Schedule> = sorted
            .iter()
            .map(|i| &i.prepared.orchestrated.schedule)
            .collect();
        let Some(first) = schedules.first() else {
            return Err(WhatIfError::TooFewTraces(0));
        };
        let same_blocks = schedules.iter().all(|s| {
            s.blocks.len() == first.blocks.len()
                && s.events.len() == first.events.len()
                && s.blocks
                    .iter()
                    .zip(&first.blocks)
                    .all(|(a, b)| a.category == b.category && a.op == b.op && a.phase == b.phase)
        });
        if !same_blocks {
            return Err(WhatIfError::DifferentJobs(
                schedules.iter().map(|s| s.blocks.len()).collect(),
            ));
        }
        let fits = (0..first.blocks.len())
            .map(|index| {
                let points: Vec<(u32, Bytes)> = batches
                    .iter()
                    .zip(&schedules)
                    .map(|(&b, s)| (b, s.blocks.get(index).map_or(Bytes::ZERO, |x| x.size)))
                    .collect();
                fit_sizes(&points)
            })
            .collect();
        Ok(BatchModel {
            inputs: batches
                .into_iter()
                .zip(schedules)
                .map(|(b, s)| (b, s.clone()))
                .collect(),
            fits,
        })
    }

    /// The single-trace model (less certain): activations, batch tensors and
    /// temporaries made in forward or backward are assumed proportional to
    /// the batch size (`size·N/batch`, rounded up); parameters, buffers,
    /// gradients, optimizer state, workspaces and every block made outside
    /// forward and backward are fixed.
    pub fn assume(input: BatchInput<'_>) -> Result<BatchModel, WhatIfError> {
        if input.batch == 0 {
            return Err(WhatIfError::ZeroBatch(0));
        }
        let schedule = &input.prepared.orchestrated.schedule;
        let fits = schedule
            .blocks
            .iter()
            .map(|block| {
                let size = i64::try_from(block.size.get()).unwrap_or(i64::MAX);
                let scales = matches!(
                    block.category,
                    Category::Activation
                        | Category::Batch
                        | Category::Temporary
                        | Category::KvCache
                ) && matches!(
                    block.phase,
                    Phase::Forward | Phase::Backward | Phase::DataLoading
                );
                if scales {
                    SizeFit {
                        kind: SizeKind::Assumed,
                        intercept: 0,
                        anchor: 0,
                        slope: size,
                        slope_den: i64::from(input.batch),
                    }
                } else {
                    SizeFit {
                        kind: SizeKind::Fixed,
                        intercept: size,
                        anchor: 0,
                        slope: 0,
                        slope_den: 1,
                    }
                }
            })
            .collect();
        Ok(BatchModel {
            inputs: vec![(input.batch, schedule.clone())],
            fits,
        })
    }

    /// The batch sizes the model was fitted on, ascending.
    pub fn input_batches(&self) -> Vec<u32> {
        self.inputs.iter().map(|(b, _)| *b).collect()
    }

    /// The per-block fits, in block order.
    pub fn fits(&self) -> &[SizeFit] {
        &self.fits
    }

    /// Block counts by kind.
    pub fn summary(&self) -> ModelSummary {
        let mut summary = ModelSummary {
            blocks: u32::try_from(self.fits.len()).unwrap_or(u32::MAX),
            ..ModelSummary::default()
        };
        for fit in &self.fits {
            match fit.kind {
                SizeKind::Fixed => {
                    summary.fixed += 1;
                    summary.fixed_bytes += Bytes(fit.intercept.unsigned_abs());
                }
                SizeKind::Proportional => {
                    summary.proportional += 1;
                    summary.bytes_per_sample += Bytes(fit.slope.max(0).unsigned_abs());
                }
                SizeKind::Approximate => summary.approximate += 1,
                SizeKind::Assumed => {
                    summary.assumed += 1;
                    let per_sample = fit.slope.max(0) / fit.slope_den.max(1);
                    summary.bytes_per_sample += Bytes(per_sample.unsigned_abs());
                }
            }
        }
        summary
    }

    /// The orchestrated sequence at `batch`: the event order of the nearest
    /// input, the sizes of the model.
    pub fn synthesize(&self, batch: u32) -> Schedule {
        let nearest = self
            .inputs
            .iter()
            .min_by_key(|(b, _)| (b.abs_diff(batch), *b))
            .map(|(_, s)| s);
        let Some(template) = nearest else {
            return Schedule::default();
        };
        let mut schedule = template.clone();
        for (block, fit) in schedule.blocks.iter_mut().zip(&self.fits) {
            block.size = fit.at(batch);
        }
        schedule
    }
}

/// One simulated batch size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchPoint {
    pub batch: u32,
    /// Means the same as `peak.total_bytes` of `memcast estimate`.
    pub peak_total_bytes: Bytes,
    pub peak_reserved_bytes: Bytes,
    pub peak_allocated_bytes: Bytes,
}

/// The largest batch that fits one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MaxBatch {
    pub preset: String,
    pub capacity_bytes: Bytes,
    /// 0 when not even batch 1 fits; [`MAX_SEARCH_BATCH`] when the search
    /// stopped there.
    pub batch: u32,
    /// Peak total at that batch in the simulation at this GPU's capacity
    /// (the allocator releases its cache and retries before it fails, so this
    /// can be below the unlimited peak of the same batch).
    pub peak_total_bytes: Bytes,
}

/// The batch-size what-if.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchSweep {
    /// Always [`SCHEMA`].
    pub schema: String,
    pub reference_gpu: String,
    /// `fitted` (two or more traces) or `single_trace` (one trace: which
    /// blocks scale is assumed from their category; less certain).
    pub certainty: String,
    /// The input traces' batch sizes and their own peaks.
    pub inputs: Vec<BatchPoint>,
    pub model: ModelSummary,
    /// The requested batch sizes, ascending.
    pub points: Vec<BatchPoint>,
    /// One entry per GPU of the config, in config order.
    pub max_batch: Vec<MaxBatch>,
    pub notes: Vec<String>,
}

fn point(
    prepared: &Prepared,
    model: &BatchModel,
    batch: u32,
    config: &Config,
) -> Result<BatchPoint, WhatIfError> {
    let report = estimate_schedule(prepared, model.synthesize(batch), config)?;
    Ok(BatchPoint {
        batch,
        peak_total_bytes: report.peak.total_bytes,
        peak_reserved_bytes: report.peak.reserved_bytes,
        peak_allocated_bytes: report.peak.allocated_bytes,
    })
}

/// The default batch sizes to simulate: powers of two up to four times the
/// largest input, and the inputs.
pub fn default_points(model: &BatchModel) -> Vec<u32> {
    let top = model
        .input_batches()
        .last()
        .copied()
        .unwrap_or(1)
        .saturating_mul(4);
    let mut points: Vec<u32> = std::iter::successors(Some(1u32), |b| b.checked_mul(2))
        .take_while(|&b| b <= top)
        .collect();
    points.extend(model.input_batches());
    points.sort_unstable();
    points.dedup();
    points
}

/// [`sweep`] at the default batch sizes, extended up to the largest batch
/// that fits any of the config's GPUs, so that a chart shows the whole range
/// up to the capacity lines (what `memcast batch` without `--at` and the
/// page's batch what-if both show).
pub fn sweep_to_capacity(
    inputs: &[BatchInput<'_>],
    config: &Config,
) -> Result<BatchSweep, WhatIfError> {
    let first = sweep(inputs, &[], config)?;
    let largest = first.max_batch.iter().map(|m| m.batch).max().unwrap_or(0);
    let mut at: Vec<u32> = first.points.iter().map(|p| p.batch).collect();
    if largest <= at.last().copied().unwrap_or(0) {
        return Ok(first);
    }
    at.extend(
        (1..=16u32)
            .map(|k| u32::try_from(u64::from(largest) * u64::from(k) / 16).unwrap_or(largest))
            .filter(|&b| b > 0),
    );
    sweep(inputs, &at, config)
}

/// Fits the model on `inputs`, simulates it at each of `at` (the
/// [`default_points`] when empty) on the reference GPU, and searches the
/// largest batch that fits each GPU of `config`.
pub fn sweep(
    inputs: &[BatchInput<'_>],
    at: &[u32],
    config: &Config,
) -> Result<BatchSweep, WhatIfError> {
    let model = BatchModel::fit(inputs)?;
    let Some(base) = inputs.iter().min_by_key(|i| i.batch).map(|i| i.prepared) else {
        return Err(WhatIfError::TooFewTraces(0));
    };
    let peak_config = peak_only(config);
    let mut at: Vec<u32> = if at.is_empty() {
        default_points(&model)
    } else {
        at.to_vec()
    };
    if let Some(&zero) = at.iter().find(|&&b| b == 0) {
        return Err(WhatIfError::ZeroBatch(zero));
    }
    at.sort_unstable();
    at.dedup();
    let mut input_points = Vec::with_capacity(inputs.len());
    let mut sorted = inputs.to_vec();
    sorted.sort_by_key(|i| i.batch);
    for input in &sorted {
        let report = crate::pipeline::estimate(input.prepared, &peak_config, &mut |_| {})?.value;
        input_points.push(BatchPoint {
            batch: input.batch,
            peak_total_bytes: report.peak.total_bytes,
            peak_reserved_bytes: report.peak.reserved_bytes,
            peak_allocated_bytes: report.peak.allocated_bytes,
        });
    }
    let points = at
        .iter()
        .map(|&batch| point(base, &model, batch, &peak_config))
        .collect::<Result<Vec<_>, _>>()?;
    let max_batch = config
        .gpus
        .iter()
        .map(|target| {
            let mut one = config.clone();
            one.reference = target.clone();
            one.gpus = vec![target.clone()];
            max_batch_for(base, &model, &one)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let summary = model.summary();
    let mut notes = vec![
        "blocks are matched across traces by position and op; sizes are fitted as a + b*batch".to_owned(),
        "the largest batch is searched by doubling and bisection, assuming the peak grows with the batch".to_owned(),
    ];
    if inputs.len() == 1 {
        notes.push("one trace only: activations, batch tensors and temporaries of forward and backward are assumed proportional to the batch and everything else fixed; profile a second batch size for a fitted model".to_owned());
    }
    if let Some(k) = base.recipe.micro_batches_per_step.filter(|&k| k > 1) {
        notes.push(format!(
            "the job accumulates gradients over {k} micro-batches per optimizer step: every batch size here is the micro-batch (the data loader's batch); the effective batch per step is {k} times it"
        ));
    }
    if summary.approximate > 0 {
        notes.push(format!(
            "{} blocks do not lie exactly on a line in the batch size; their sizes are interpolated and rounded up",
            summary.approximate
        ));
    }
    Ok(BatchSweep {
        schema: SCHEMA.to_owned(),
        reference_gpu: config.reference.name.clone(),
        certainty: if inputs.len() == 1 {
            "single_trace"
        } else {
            "fitted"
        }
        .to_owned(),
        inputs: input_points,
        model: summary,
        points,
        max_batch,
        notes,
    })
}

/// The largest batch that fits the one GPU of `config` (its reference).
fn max_batch_for(
    prepared: &Prepared,
    model: &BatchModel,
    config: &Config,
) -> Result<MaxBatch, WhatIfError> {
    let fits = |batch: u32| -> Result<(bool, Bytes), WhatIfError> {
        let report = estimate_schedule(prepared, model.synthesize(batch), config)?;
        let verdict = report.gpus.first();
        Ok((
            verdict.is_some_and(|g| g.fits),
            verdict.map_or(report.peak.total_bytes, |g| g.peak_total_bytes),
        ))
    };
    let (fits_one, peak_one) = fits(1)?;
    let mut best = (0u32, Bytes::ZERO);
    if fits_one {
        best = (1, peak_one);
        // Doubling: `best` fits, `high` does not (or the search cap).
        let mut high = None;
        while best.0 < MAX_SEARCH_BATCH {
            let next = best.0.saturating_mul(2).min(MAX_SEARCH_BATCH);
            let (ok, peak) = fits(next)?;
            if ok {
                best = (next, peak);
            } else {
                high = Some(next);
                break;
            }
        }
        if let Some(mut high) = high {
            while high - best.0 > 1 {
                let mid = best.0 + (high - best.0) / 2;
                let (ok, peak) = fits(mid)?;
                if ok {
                    best = (mid, peak);
                } else {
                    high = mid;
                }
            }
        }
    }
    Ok(MaxBatch {
        preset: config.reference.name.clone(),
        capacity_bytes: config.reference.capacity,
        batch: best.0,
        peak_total_bytes: best.1,
    })
}

/// The bytes of the first simulated iteration's batch tensors.
fn batch_bytes(prepared: &Prepared) -> Bytes {
    let schedule = &prepared.orchestrated.schedule;
    let first = schedule.blocks.iter().filter_map(|b| b.iteration).min();
    schedule
        .blocks
        .iter()
        .filter(|b| b.category == Category::Batch && b.iteration == first)
        .map(|b| b.size)
        .sum()
}

/// Completes the batch sizes of traces of one job: a trace whose batch size
/// is unknown (`None`; the profiler leaves long tensor lists out of
/// `Input Dims`) gets it from a known one by the ratio of their batch-tensor
/// bytes, which must be exact.
pub fn complete_batch_sizes(
    known: &[Option<u32>],
    prepared: &[&Prepared],
    names: &[String],
) -> Result<Vec<u32>, WhatIfError> {
    let reference = known
        .iter()
        .zip(prepared)
        .find_map(|(batch, p)| batch.map(|b| (b, batch_bytes(p))));
    known
        .iter()
        .zip(prepared)
        .enumerate()
        .map(|(index, (batch, p))| {
            if let Some(batch) = batch {
                return Ok(*batch);
            }
            let unknown =
                || WhatIfError::UnknownBatch(names.get(index).cloned().unwrap_or_default());
            let (ref_batch, ref_bytes) = reference.ok_or_else(unknown)?;
            let bytes = u128::from(batch_bytes(p).get()) * u128::from(ref_batch);
            let per = u128::from(ref_bytes.get());
            if per == 0 || bytes % per != 0 {
                return Err(unknown());
            }
            u32::try_from(bytes / per)
                .ok()
                .filter(|&b| b > 0)
                .ok_or_else(unknown)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_proportional_and_approximate_fits() {
        let fixed = fit_sizes(&[(16, Bytes(100)), (32, Bytes(100))]);
        assert_eq!(fixed.kind, SizeKind::Fixed);
        assert_eq!(fixed.at(7), Bytes(100));
        let prop = fit_sizes(&[(16, Bytes(1024 + 16 * 512)), (32, Bytes(1024 + 32 * 512))]);
        assert_eq!(prop.kind, SizeKind::Proportional);
        assert_eq!((prop.intercept, prop.slope), (1024, 512));
        assert_eq!(prop.at(1), Bytes(1536));
        let approx = fit_sizes(&[(2, Bytes(10)), (5, Bytes(21))]);
        assert_eq!(approx.kind, SizeKind::Approximate);
        // Both inputs reproduced exactly, in between rounded up.
        assert_eq!(approx.at(2), Bytes(10));
        assert_eq!(approx.at(5), Bytes(21));
        assert_eq!(approx.at(3), Bytes(14));
        // Three points off one line are approximate.
        let bent = fit_sizes(&[(1, Bytes(10)), (2, Bytes(20)), (4, Bytes(50))]);
        assert_eq!(bent.kind, SizeKind::Approximate);
    }

    #[test]
    fn sizes_never_go_negative() {
        let shrinking = fit_sizes(&[(16, Bytes(100)), (32, Bytes(50))]);
        assert_eq!(shrinking.at(1000), Bytes(0));
    }
}

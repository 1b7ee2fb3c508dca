//! A `generate()` run and its KV cache.
//!
//! Generation calls the model once for the prompt (the prefill) and once
//! per new token after it (the decode steps), with no backward: an
//! iteration that calls the outermost module two times or more and runs no
//! backward is one. Hugging Face's caches keep each layer's keys and values
//! between the calls: `DynamicCache` makes them by `torch.cat` of the past
//! and the new positions in every step (`DynamicLayer.update`: a larger
//! block, the old one freed in the next step), `StaticCache` by
//! `torch.zeros` once, sized for the whole generation
//! (`StaticLayer.lazy_initialization`), then written in place. So a block
//! made by `aten::cat` or a zero-filled factory inside one call of the
//! model that outlives the call (freed in a later call or after the last,
//! or never) is the KV cache; what else outlives a call (the logits
//! `generate` reads) is made by other ops. The cache holds one position per
//! prompt token after the prefill and one more per decode step, so at the
//! end of the last call it holds `prompt + calls - 1` positions (the last
//! token is never fed back).

use serde::{Deserialize, Serialize};

use super::lifecycle::Life;
use super::spans::SpanIndex;
use super::{BlockRole, Iteration, Names, Phase};
use crate::trace::Trace;
use crate::units::{Bytes, Nanos};

/// What a generation run shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Generation {
    /// Calls of the model in the first generating iteration: the prefill
    /// and the decode steps.
    pub calls: u32,
    /// `dynamic` (concatenated every step) or `static` (made once).
    pub cache: String,
    /// KV-cache blocks over the trace.
    pub kv_blocks: u32,
    /// KV-cache bytes live when the first generating iteration's last call
    /// returns.
    pub kv_bytes_at_end: Bytes,
    /// Prompt tokens (the first call's `aten::embedding` ids), if seen.
    pub prompt_tokens: Option<u64>,
    /// Cache positions at the end: prompt tokens + calls - 1.
    pub positions: Option<u64>,
    /// `kv_bytes_at_end / positions`: every layer's keys and values of one
    /// position for the whole batch.
    pub bytes_per_token: Option<Bytes>,
    /// The first generation's prompt call and its decode steps (first to
    /// last call), in the analysis clock.
    pub prefill_window: (Nanos, Nanos),
    pub decode_window: (Nanos, Nanos),
    /// Peak allocated (live) bytes the simulation reaches in each window
    /// (set by the report; absent in the analysis).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_peak_allocated_bytes: Option<Bytes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_peak_allocated_bytes: Option<Bytes>,
}

/// Ops whose output, kept past a call, is the KV cache.
const CACHE_OPS: &[&str] = &[
    "aten::cat",
    "aten::zeros",
    "aten::zeros_like",
    "aten::new_zeros",
];

/// Finds generation iterations, gives their KV-cache blocks the role
/// [`BlockRole::KvCache`] and returns what the first one shows.
pub(crate) fn find(
    trace: &Trace,
    life: &mut Life,
    index: &SpanIndex,
    iterations: &[Iteration],
    names: &Names,
) -> Option<Generation> {
    let mut calls: Vec<(Nanos, Nanos)> = index
        .frames
        .spans
        .iter()
        .filter(|f| f.top_module)
        .map(|f| (f.start, f.end))
        .collect();
    calls.sort_unstable();
    // Calls per iteration without backward, two or more.
    let mut runs: Vec<Vec<(Nanos, Nanos)>> = Vec::new();
    for it in iterations {
        if it.phases.iter().any(|p| p.phase == Phase::Backward) {
            continue;
        }
        let inside: Vec<(Nanos, Nanos)> = calls
            .iter()
            .copied()
            .filter(|&(s, _)| it.start <= s && s <= it.end)
            .collect();
        if inside.len() >= 2 {
            runs.push(inside);
        }
    }
    let first = runs.first()?.clone();
    let made_by = |op: Option<usize>| -> Option<&'static str> {
        let op = op?;
        index
            .ops
            .chain(op)
            .filter_map(|i| index.ops.spans.get(i))
            .find_map(|s| {
                let name = names.get(s.name);
                CACHE_OPS.iter().copied().find(|&c| c == name)
            })
    };
    let mut kv_blocks = 0u32;
    let mut dynamic = false;
    for run in &runs {
        let last_end = run.last().map_or(Nanos::ZERO, |c| c.1);
        for block in &mut life.blocks {
            if block.role != BlockRole::Other {
                continue;
            }
            let Some(&(_, end)) = run
                .iter()
                .find(|&&(s, e)| s <= block.alloc_ts && block.alloc_ts <= e)
            else {
                continue;
            };
            let outlives = block.free_ts.is_none_or(|f| f > end);
            // freed in a later call, or after the last one, or never
            let until = block.free_ts.is_none_or(|f| {
                f > last_end || run.iter().any(|&(s, e)| s > end && s <= f && f <= e)
            });
            let Some(op) = made_by(block.alloc_op) else {
                continue;
            };
            if outlives && until {
                block.role = BlockRole::KvCache;
                kv_blocks += 1;
                dynamic |= op == "aten::cat";
            }
        }
    }
    let end = first.last().map_or(Nanos::ZERO, |c| c.1);
    let start = first.first().map_or(Nanos::ZERO, |c| c.0);
    let kv_bytes_at_end = life
        .blocks
        .iter()
        .filter(|b| b.role == BlockRole::KvCache)
        .filter(|b| start <= b.alloc_ts && b.alloc_ts <= end)
        .filter(|b| b.free_ts.is_none_or(|f| f > end))
        .fold(Bytes::ZERO, |acc, b| acc + b.size);
    let prompt_tokens = prompt_tokens(trace, index, names, first.first().copied());
    let n = u64::try_from(first.len()).unwrap_or(u64::MAX);
    let positions = prompt_tokens.map(|t| t.saturating_add(n).saturating_sub(1));
    let bytes_per_token = positions
        .filter(|&p| p > 0)
        .map(|p| Bytes(kv_bytes_at_end.get() / p));
    let prefill_window = first.first().copied().unwrap_or((start, start));
    let decode_window = (first.get(1).map_or(end, |c| c.0), end);
    Some(Generation {
        prefill_window,
        decode_window,
        prefill_peak_allocated_bytes: None,
        decode_peak_allocated_bytes: None,
        calls: u32::try_from(first.len()).unwrap_or(u32::MAX),
        cache: if dynamic { "dynamic" } else { "static" }.to_owned(),
        kv_blocks,
        kv_bytes_at_end,
        prompt_tokens,
        positions,
        bytes_per_token,
    })
}

/// The length of the ids the first `aten::embedding` of the first call
/// reads (its last dim).
fn prompt_tokens(
    trace: &Trace,
    index: &SpanIndex,
    names: &Names,
    call: Option<(Nanos, Nanos)>,
) -> Option<u64> {
    let (s, e) = call?;
    index
        .ops
        .spans
        .iter()
        .enumerate()
        .filter(|(_, o)| s <= o.start && o.start <= e && names.get(o.name) == "aten::embedding")
        .min_by_key(|(_, o)| o.start)
        .and_then(|(i, _)| index.ops.source_in(i, &trace.ops))
        .and_then(|op| {
            trace
                .tensor_args(op)
                .iter()
                .find(|a| a.position == 1)
                .and_then(|a| trace.numbers(a.dims).last().copied())
        })
        .and_then(|t| u64::try_from(t).ok())
}

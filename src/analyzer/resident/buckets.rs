//! DistributedDataParallel's gradient buckets (`gradient_as_bucket_view=False`,
//! the default): the reducer keeps a second copy of every gradient in flat
//! buckets it allocates when the model is wrapped, so a trace started later
//! never allocates them; its all-reduce reads them in every backward pass.

use std::collections::BTreeMap;

use super::{dtype_info, Inputs, StateItem, StateKind, StateSource, MODULE_PREFIX};
use crate::analyzer::lifecycle::Life;
use crate::analyzer::BlockRole;
use crate::diag::Warning;
use crate::units::{Bytes, Nanos};

/// DDP's default `bucket_cap_mb` (25 MiB).
pub const BUCKET_BYTES: u64 = 25 * Bytes::MIB;
/// DDP's first bucket (`dist._DEFAULT_FIRST_BUCKET_BYTES`, 1 MiB).
pub const FIRST_BUCKET_BYTES: u64 = Bytes::MIB;

/// DDP's gradient buckets for `bytes` of gradients, as the reducer splits
/// them: a first bucket of [`FIRST_BUCKET_BYTES`], then buckets of
/// [`BUCKET_BYTES`]. The orchestrator's `ddp_buckets` rule places them for a
/// trace without shapes; the distributed what-if adds them for its DDP rows.
pub fn bucket_sizes(bytes: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut left = bytes;
    let mut cap = FIRST_BUCKET_BYTES;
    while left > 0 {
        let size = left.min(cap);
        out.push(size);
        left -= size;
        cap = BUCKET_BYTES;
    }
    out
}

/// A DistributedDataParallel run: its module frame, or `c10d::` collectives.
pub(super) fn is_distributed(input: &Inputs<'_>) -> bool {
    input.index.frames.spans.iter().any(|f| {
        input
            .names
            .get(f.name)
            .strip_prefix(MODULE_PREFIX)
            .is_some_and(|m| m.starts_with("DistributedDataParallel_"))
    }) || input
        .index
        .ops
        .spans
        .iter()
        .any(|o| input.names.get(o.name).starts_with("c10d::"))
}

/// DistributedDataParallel's gradient buckets: the tensors its reducer's
/// collectives read in backward that were never allocated in the trace were
/// made when the model was wrapped; resident from the start. When the
/// reducer rebuilds its buckets inside the trace (after the first
/// iteration), those blocks are marked as buckets and the pre-trace ones end
/// there. Without shapes, the buckets are the trainable bytes.
pub(super) fn buckets(
    input: &Inputs<'_>,
    life: &mut Life,
    distributed: bool,
    passes: &[(Nanos, Nanos)],
    warnings: &mut Vec<Warning>,
) -> Vec<StateItem> {
    if !distributed {
        return Vec::new();
    }
    let trace = input.trace;
    // Per backward pass, the sizes of the bucket tensors its collectives
    // read that no block of the trace holds.
    let mut per_pass: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    let mut rebuilt: Vec<usize> = Vec::new();
    let mut saw_sizes = false;
    for (idx, span) in input.index.ops.spans.iter().enumerate() {
        if !input.names.get(span.name).starts_with("c10d::all") {
            continue;
        }
        let pass = passes.partition_point(|&(s, _)| s <= span.start);
        let Some(&(_, end)) = pass.checked_sub(1).and_then(|p| passes.get(p)) else {
            continue;
        };
        if span.start > end {
            continue;
        }
        let Some(source) = input.index.ops.source_in(idx, &trace.ops) else {
            continue;
        };
        for a in trace.tensor_args(source) {
            saw_sizes = true;
            let dims = trace.numbers(a.dims);
            let elem = a
                .dtype
                .and_then(|d| dtype_info(trace.name(d)))
                .map_or(4, |d| d.0);
            let size = dims
                .iter()
                .map(|&d| u64::try_from(d).unwrap_or(0))
                .fold(1, u64::saturating_mul)
                .saturating_mul(elem);
            let holder = life.blocks.iter().position(|b| {
                b.size.get() == size
                    && b.alloc_ts <= span.start
                    && b.free_ts.is_none_or(|f| f >= span.start)
            });
            match holder {
                Some(b) => rebuilt.push(b),
                None => per_pass.entry(pass).or_default().push(size),
            }
        }
    }
    let mut rebuilt_at: Option<Nanos> = None;
    rebuilt.sort_unstable();
    rebuilt.dedup();
    for b in rebuilt {
        if let Some(block) = life.blocks.get_mut(b) {
            if block.role == BlockRole::Other {
                block.role = BlockRole::Bucket;
                rebuilt_at = Some(rebuilt_at.map_or(block.alloc_ts, |t| t.min(block.alloc_ts)));
            }
        }
    }
    // The pass that read the most: each bucket is all-reduced once per pass.
    let pre_trace: Vec<u64> = per_pass
        .into_values()
        .max_by_key(|v| (v.iter().fold(0_u64, |s, &x| s.saturating_add(x)), v.len()))
        .unwrap_or_default();
    let trainable = input
        .parameters
        .iter()
        .map(|p| p.bytes.get())
        .fold(0, u64::saturating_add);
    let (sizes, source) = if saw_sizes {
        (pre_trace, StateSource::Collective)
    } else {
        warnings.push(Warning::new(
            "ddp_buckets_from_trainable_bytes",
            "the trace has no shapes, so DistributedDataParallel's gradient buckets were taken as the trainable parameter bytes (gradient_as_bucket_view=False, the default)",
        ));
        (vec![trainable], StateSource::TrainableBytes)
    };
    sizes
        .into_iter()
        .filter(|&bytes| bytes > 0)
        .map(|bytes| StateItem {
            kind: StateKind::Bucket,
            trainable: false,
            bytes: Bytes(bytes),
            shape: Vec::new(),
            dtype: None,
            layer: None,
            source: source.clone(),
            first_read: None,
            last_read: rebuilt_at,
            block: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_the_parameters() {
        assert_eq!(bucket_sizes(0), Vec::<u64>::new());
        assert_eq!(bucket_sizes(100), [100]);
        let b = bucket_sizes(60 * Bytes::MIB);
        assert_eq!(
            b,
            [Bytes::MIB, 25 * Bytes::MIB, 25 * Bytes::MIB, 9 * Bytes::MIB]
        );
    }
}

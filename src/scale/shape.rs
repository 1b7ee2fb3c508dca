//! What a trace shows of its sequence length and batch: the token ids of
//! its first embedding, or the samples its data loader stacks.

use crate::trace::Trace;

/// The sequence length of a trace and its batch: the token ids `[B, T]` of
/// its first `aten::embedding` (their last and first dims), or else — a
/// model that indexes its table (`weight[token_ids]`, whose indices the
/// profiler does not record) — the samples the data loader stacks: `B`
/// tensors of `T` tokens.
pub(super) fn traced_shape(trace: &Trace) -> Option<(u32, u32)> {
    embedding_ids(trace).or_else(|| loader_samples(trace))
}

/// The dims of the token ids the first `aten::embedding` starting within
/// `from..=to` reads.
pub(super) fn embedding_ids_dims(trace: &Trace, from: i64, to: i64) -> Option<&[i64]> {
    let op = trace
        .ops
        .iter()
        .filter(|o| from <= o.start.get() && o.start.get() <= to)
        .filter(|o| trace.name(o.name) == "aten::embedding")
        .min_by_key(|o| o.start)?;
    let indices = trace.tensor_args(op).iter().find(|a| a.position == 1)?;
    Some(trace.numbers(indices.dims))
}

fn embedding_ids(trace: &Trace) -> Option<(u32, u32)> {
    let dims = embedding_ids_dims(trace, i64::MIN, i64::MAX)?;
    let t = u32::try_from(*dims.last()?).ok().filter(|&t| t > 1)?;
    let b = if dims.len() >= 2 {
        dims.first()
            .and_then(|&b| u32::try_from(b).ok())
            .unwrap_or(1)
    } else {
        1
    };
    Some((t, b.max(1)))
}

/// The k of a mixture of experts' router: the largest `topk(logits, k)`
/// over `[B·T, experts]` (or `[T, experts]`) logits, where k > 1. Each token
/// is sent to k experts, so the rows gathered by expert number k·B·T: they
/// grow with the length as the tokens do (0 where no router shows).
pub(super) fn router_top_k(trace: &Trace, t: u32, batch: u32) -> u32 {
    let tokens = [i64::from(t) * i64::from(batch), i64::from(t)];
    trace
        .ops
        .iter()
        .filter(|o| trace.name(o.name) == "aten::topk")
        .filter(|o| {
            trace.tensor_args(o).first().is_some_and(|a| {
                let dims = trace.numbers(a.dims);
                dims.len() == 2 && dims.first().is_some_and(|d| tokens.contains(d))
            })
        })
        .filter_map(|o| {
            let k = trace.concrete_args(o).iter().find(|c| c.position == 1)?;
            let k = *trace.numbers(k.values).first()?;
            u32::try_from(k).ok().filter(|&k| (2..=64).contains(&k))
        })
        .max()
        .unwrap_or(0)
}

/// The spans of the data loader's `__next__` annotations.
pub(super) fn loader_spans(trace: &Trace) -> Vec<(i64, i64)> {
    trace
        .annotations
        .iter()
        .filter(|a| {
            let n = trace.name(a.name);
            n.contains("DataLoader") && n.contains("__next__")
        })
        .map(|a| (a.start.get(), a.start.get() + a.dur.get()))
        .collect()
}

/// The spans of the optimizer steps, in time order: the
/// `Optimizer.step#<class>.step` annotation `torch.optim.Optimizer` wraps
/// every subclass's `step` in (its `profile_hook_step`).
pub(super) fn optimizer_steps(trace: &Trace) -> Vec<(i64, i64)> {
    let mut steps: Vec<(i64, i64)> = trace
        .annotations
        .iter()
        .filter(|a| trace.name(a.name).starts_with("Optimizer.step#"))
        .map(|a| (a.start.get(), a.start.get().saturating_add(a.dur.get())))
        .collect();
    steps.sort_unstable();
    steps
}

fn loader_samples(trace: &Trace) -> Option<(u32, u32)> {
    let loader = loader_spans(trace);
    trace
        .ops
        .iter()
        .filter(|o| trace.name(o.name) == "aten::stack")
        .filter(|o| {
            let t = o.start.get();
            loader.iter().any(|&(s, e)| s <= t && t <= e)
        })
        .min_by_key(|o| o.start)
        .and_then(|o| {
            let samples: Vec<&[i64]> = trace
                .tensor_args(o)
                .iter()
                .filter(|a| a.list_index.is_some())
                .map(|a| trace.numbers(a.dims))
                .collect();
            let first = *samples.first()?;
            let [t] = first else { return None };
            let t = u32::try_from(*t).ok().filter(|&t| t > 1)?;
            let b = u32::try_from(samples.len()).ok()?;
            samples.iter().all(|d| *d == first).then_some((t, b))
        })
}

/// The sequence length of a trace (see [`traced_shape`]).
pub(super) fn traced_length(trace: &Trace) -> Option<u32> {
    traced_shape(trace).map(|(t, _)| t)
}

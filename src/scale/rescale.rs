//! Rescaling a trace's recorded shapes from the traced length to another
//! (`--seq-len` from one trace, `length.rs`): the dims of a tensor argument
//! and the strides above them, the size lists of view ops, and the autocast
//! view of the inputs made again from them.

use crate::trace::{Dtype, TensorArg, TensorInput, Trace};

/// The traced length and the dims that hold it: T itself, the batch
/// flattened with it (B·T) and, where a router sends each token to its
/// top `k` experts, the routed rows gathered by expert (k·B·T: the
/// grouped-GEMM path of a mixture of experts).
#[derive(Debug, Clone, Copy)]
pub(super) struct Traced {
    pub t: u32,
    pub batch: u32,
    /// The router's k (0 or 1: no routed rows beyond B·T).
    pub top_k: u32,
}

impl Traced {
    /// The flattened dims that hold the length once, longest first:
    /// k·B·T, then B·T (with a batch).
    fn flattened(self) -> impl Iterator<Item = i64> {
        let bt = i64::from(self.t) * i64::from(self.batch);
        let routed = (self.top_k > 1).then(|| bt * i64::from(self.top_k));
        routed.into_iter().chain((self.batch > 1).then_some(bt))
    }

    /// Whether `d` holds the length.
    fn holds(self, d: i64) -> bool {
        d == i64::from(self.t) || self.flattened().any(|f| f == d)
    }
}

/// From the traced length (and batch, and routing) to `len`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rescale {
    pub traced: Traced,
    pub len: u32,
}

impl Rescale {
    /// `d · len / t`, rounded.
    fn scale(self, d: i64) -> i64 {
        i64::try_from(div_round(
            i128::from(d) * i128::from(self.len),
            i128::from(self.traced.t),
        ))
        .unwrap_or(d)
    }

    /// The positions of the `k` dims to rescale (see [`length_dims`]).
    fn dims(self, dims: &[i64], k: u32) -> Vec<usize> {
        length_dims(dims, k, self.traced)
    }

    /// Rescales the first `k` length dims of a tensor argument and the
    /// strides above them.
    pub(super) fn arg(self, out: &mut Trace, arg: &TensorArg, k: u32) {
        if k == 0 {
            return;
        }
        let dims: Vec<i64> = out.numbers(arg.dims).to_vec();
        let strides: Option<Vec<i64>> = arg.strides.map(|s| out.numbers(s).to_vec());
        let mut new_dims = dims.clone();
        let mut new_strides = strides.clone();
        for j in self.dims(&dims, k) {
            let (Some(d), Some(slot)) = (dims.get(j), new_dims.get_mut(j)) else {
                continue;
            };
            *slot = self.scale(*d);
            if let (Some(old), Some(new)) = (&strides, &mut new_strides) {
                let Some(&sj) = old.get(j) else { continue };
                for (i, s) in old.iter().enumerate() {
                    if *s > sj && sj > 0 {
                        if let Some(slot) = new.get_mut(i) {
                            *slot = self.scale(*slot);
                        }
                    }
                }
            }
        }
        for (i, d) in arg.dims.range().zip(new_dims) {
            if let Some(slot) = out.op_args.numbers.get_mut(i) {
                *slot = d;
            }
        }
        if let (Some(span), Some(new)) = (arg.strides, new_strides) {
            for (i, s) in span.range().zip(new) {
                if let Some(slot) = out.op_args.numbers.get_mut(i) {
                    *slot = s;
                }
            }
        }
    }

    /// Rescales the integers of a view op read with power `k`: the size list
    /// of `view`/`reshape`/`expand`/`unflatten`, and the start, end or sizes
    /// of `slice`/`narrow`/`split` along a length dim of their input.
    pub(super) fn view(
        self,
        trace: &Trace,
        numbers: &mut [i64],
        op: &crate::trace::OpEvent,
        k: u32,
    ) {
        if k == 0 {
            return;
        }
        let concrete = trace.concrete_args(op);
        let at = |pos: u16| concrete.iter().find(|c| c.position == pos);
        let value = |pos: u16| at(pos).and_then(|c| trace.numbers(c.values).first().copied());
        let list = match trace.name(op.name) {
            "aten::view" | "aten::_unsafe_view" | "aten::reshape" | "aten::expand" => at(1),
            "aten::unflatten" => at(2),
            name @ ("aten::slice" | "aten::narrow" | "aten::split" | "aten::split_with_sizes") => {
                let Some(input) = trace.tensor_args(op).first() else {
                    return;
                };
                let dims = trace.numbers(input.dims);
                let (dim_pos, sized) = match name {
                    "aten::slice" | "aten::narrow" => (1, [2u16, 3]),
                    _ => (2, [1, 1]),
                };
                let Some(dim) = value(dim_pos) else { return };
                let rank = i64::try_from(dims.len()).unwrap_or(0);
                let dim = if dim < 0 { dim + rank } else { dim };
                let along = usize::try_from(dim)
                    .ok()
                    .is_some_and(|d| self.dims(dims, k).contains(&d));
                if !along {
                    return;
                }
                let longest = self
                    .traced
                    .flattened()
                    .max()
                    .unwrap_or(i64::from(self.traced.t));
                for c in sized.iter().filter_map(|&pos| at(pos)) {
                    for i in c.values.range() {
                        if let Some(slot) = numbers.get_mut(i) {
                            if *slot > 0 && *slot <= longest {
                                *slot = self.scale(*slot);
                            }
                        }
                    }
                }
                None
            }
            _ => None,
        };
        // A size list: its first `k` length values.
        if let Some(c) = list {
            let range = c.values.range();
            let values: Vec<i64> = numbers.get(range.clone()).unwrap_or_default().to_vec();
            for j in self.dims(&values, k) {
                if let Some(slot) = numbers.get_mut(range.start + j) {
                    *slot = self.scale(*slot);
                }
            }
        }
    }
}

/// The positions of the `k` dims to rescale: flattened dims first (routed
/// rows, then batch × T), then dims equal to T from the left (the length
/// comes before a head's width in every layout PyTorch's attention uses).
pub(super) fn length_dims(dims: &[i64], k: u32, traced: Traced) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    for f in traced.flattened() {
        out.extend(
            dims.iter()
                .enumerate()
                .filter(|(_, &d)| d == f)
                .map(|(i, _)| i),
        );
    }
    let t = i64::from(traced.t);
    out.extend(
        dims.iter()
            .enumerate()
            .filter(|(_, &d)| d == t)
            .map(|(i, _)| i),
    );
    out.truncate(k as usize);
    out
}

/// How many of `dims` are the length's.
pub(super) fn length_count(dims: &[i64], traced: Traced) -> u32 {
    let n = dims.iter().filter(|&&d| traced.holds(d)).count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The autocast view ([`Trace::tensor_args`]) made again from the
/// rescaled dims, as the reader makes it.
pub(super) fn rebuild_inputs(trace: &mut Trace) {
    let mut inputs = Vec::with_capacity(trace.tensor_args.len());
    let mut ranges = Vec::with_capacity(trace.ops.len());
    for o in &trace.ops {
        let first = u32::try_from(inputs.len()).unwrap_or(u32::MAX);
        for t in trace
            .op_args
            .tensors
            .get(o.tensors.range())
            .unwrap_or_default()
        {
            let numel = trace
                .numbers(t.dims)
                .iter()
                .try_fold(1_u64, |acc, &d| acc.checked_mul(u64::try_from(d).ok()?))
                .unwrap_or(0);
            let dtype = t.dtype.and_then(|id| Dtype::from_name(trace.name(id)));
            if dtype.is_none() && t.list_index.is_none() {
                continue;
            }
            inputs.push(TensorInput {
                numel,
                dtype,
                in_list: t.list_index.is_some(),
            });
        }
        ranges.push(first..u32::try_from(inputs.len()).unwrap_or(u32::MAX));
    }
    for (o, r) in trace.ops.iter_mut().zip(ranges) {
        o.tensor_args = r;
    }
    trace.tensor_args = inputs;
}

/// `a / b` rounded to the nearest integer (`b != 0`).
pub(super) fn div_round(a: i128, b: i128) -> i128 {
    if b == 0 {
        return a;
    }
    let (a, b) = if b < 0 { (-a, -b) } else { (a, b) };
    if a >= 0 {
        (a + b / 2) / b
    } else {
        -((-a + b / 2) / b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn division_rounds_to_nearest() {
        assert_eq!(div_round(7, 2), 4);
        assert_eq!(div_round(-7, 2), -4);
        assert_eq!(div_round(6, -4), -2);
    }

    #[test]
    fn length_dims_prefer_the_flattened_batch_then_the_left() {
        let traced = Traced {
            t: 32,
            batch: 4,
            top_k: 0,
        };
        // [B, H, T, D/2] at T = 32 = D/2: the length is the left 32.
        assert_eq!(length_dims(&[4, 12, 32, 32], 1, traced), [2]);
        assert_eq!(length_dims(&[4, 12, 32, 32], 2, traced), [2, 3]);
        // [B·T, d]
        assert_eq!(length_dims(&[128, 768], 1, traced), [0]);
        assert_eq!(length_count(&[4, 32, 768], traced), 1);
        assert_eq!(length_count(&[768, 768], traced), 0);
        // Routed rows: k·B·T with a top-2 router, not without one.
        assert_eq!(length_count(&[256, 768], traced), 0);
        let routed = Traced { top_k: 2, ..traced };
        assert_eq!(length_dims(&[256, 768], 1, routed), [0]);
        assert_eq!(length_count(&[256, 768], routed), 1);
    }
}

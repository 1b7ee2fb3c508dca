//! The tensors a view op returns, computed from its input's dims and strides
//! and its `Concrete Inputs`: the trace records inputs only, so a view of a
//! weight (a transpose, a slice of a cached buffer) is recognised when it is
//! read again by comparing its dims and strides with these.

use crate::trace::{ConcreteArg, OpArgs, VIEW_OPS};

/// A concrete (non-tensor) argument as the profiler wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Concrete {
    /// An integer (`"1"`, `"-2"`).
    Int(i64),
    /// A list of integers (`"[8, 64, -1, 64]"`).
    Ints(Vec<i64>),
    /// Anything else (`""` for a tensor, `"True"`, a float).
    Other,
}

impl Concrete {
    /// The concrete values of an op, by argument position (`Other` where the
    /// trace kept none).
    pub fn of_op(args: &OpArgs, concrete: &[ConcreteArg]) -> Vec<Concrete> {
        let n = concrete
            .iter()
            .map(|c| usize::from(c.position) + 1)
            .max()
            .unwrap_or(0);
        let mut out = vec![Concrete::Other; n];
        for c in concrete {
            let values = args.slice(c.values);
            if let Some(slot) = out.get_mut(usize::from(c.position)) {
                *slot = match (c.list, values) {
                    (false, [v]) => Concrete::Int(*v),
                    (true, v) => Concrete::Ints(v.to_vec()),
                    _ => Concrete::Other,
                };
            }
        }
        out
    }

    /// Parses one `Concrete Inputs` string (the trace reader parses its own).
    #[cfg(test)]
    pub fn parse(text: &str) -> Concrete {
        let text = text.trim();
        if let Ok(v) = text.parse::<i64>() {
            return Concrete::Int(v);
        }
        let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) else {
            return Concrete::Other;
        };
        if inner.trim().is_empty() {
            return Concrete::Ints(Vec::new());
        }
        inner
            .split(',')
            .map(|p| p.trim().parse::<i64>().ok())
            .collect::<Option<Vec<i64>>>()
            .map_or(Concrete::Other, Concrete::Ints)
    }

    fn int(&self) -> Option<i64> {
        match self {
            Concrete::Int(v) => Some(*v),
            _ => None,
        }
    }

    fn ints(&self) -> Option<Vec<i64>> {
        match self {
            Concrete::Int(v) => Some(vec![*v]),
            Concrete::Ints(v) => Some(v.clone()),
            Concrete::Other => None,
        }
    }
}

/// Dims and strides of one tensor.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Layout {
    pub dims: Vec<i64>,
    pub strides: Vec<i64>,
}

/// Row-major strides of `dims`.
pub fn contiguous_strides(dims: &[i64]) -> Vec<i64> {
    let mut strides = vec![0; dims.len()];
    let mut acc: i64 = 1;
    for (slot, &d) in strides.iter_mut().zip(dims).rev() {
        *slot = acc;
        acc = acc.saturating_mul(d.max(1));
    }
    strides
}

/// The storage a tensor spans, in elements: `1 + Σ (dim - 1) × stride`
/// (0 for an empty tensor). Equals the element count of a dense tensor.
pub fn extent(dims: &[i64], strides: &[i64]) -> u64 {
    if dims.iter().any(|&d| d <= 0) {
        return 0;
    }
    if strides.len() != dims.len() {
        return dims
            .iter()
            .map(|&d| d.unsigned_abs())
            .fold(1, u64::saturating_mul);
    }
    dims.iter()
        .zip(strides)
        .map(|(&d, &s)| (d as u64 - 1).saturating_mul(s.unsigned_abs()))
        .fold(1_u64, u64::saturating_add)
}

fn norm(dim: i64, rank: usize) -> Option<usize> {
    let rank = i64::try_from(rank).ok()?;
    let d = if dim < 0 { dim + rank } else { dim };
    usize::try_from(d).ok().filter(|&d| (d as i64) < rank)
}

/// ATen's `computeStride`: the strides of `new` viewed on (`dims`, `strides`),
/// or `None` when the view needs a copy.
pub fn view_strides(dims: &[i64], strides: &[i64], new: &[i64]) -> Option<Vec<i64>> {
    if dims.is_empty() {
        return Some(vec![1; new.len()]);
    }
    if dims.contains(&0) {
        return Some(contiguous_strides(new));
    }
    let mut out = vec![0_i64; new.len()];
    let mut view_d = new.len() as i64 - 1;
    let mut chunk_base = *strides.last()?;
    let mut tensor_numel: i64 = 1;
    let mut view_numel: i64 = 1;
    for tensor_d in (0..dims.len()).rev() {
        tensor_numel = tensor_numel.checked_mul(*dims.get(tensor_d)?)?;
        let boundary = tensor_d == 0 || {
            let prev_dim = *dims.get(tensor_d - 1)?;
            let prev_stride = *strides.get(tensor_d - 1)?;
            prev_dim != 1 && prev_stride != tensor_numel.checked_mul(chunk_base)?
        };
        if boundary {
            while view_d >= 0 {
                let size = *new.get(view_d as usize)?;
                if !(view_numel < tensor_numel || size == 1) {
                    break;
                }
                *out.get_mut(view_d as usize)? = view_numel.checked_mul(chunk_base)?;
                view_numel = view_numel.checked_mul(size)?;
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if tensor_d > 0 {
                chunk_base = *strides.get(tensor_d - 1)?;
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    (view_d == -1).then_some(out)
}

/// Fills one `-1` in a view's size from the element count.
fn infer_size(numel: i64, size: &[i64]) -> Option<Vec<i64>> {
    let mut size = size.to_vec();
    if let Some(k) = size.iter().position(|&s| s == -1) {
        let rest: i64 = size
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != k)
            .map(|(_, &s)| s)
            .fold(1_i64, i64::saturating_mul);
        *size.get_mut(k)? = numel.checked_div(rest).unwrap_or(0);
    }
    Some(size)
}

/// Whether `name` is one of [`VIEW_OPS`] (the trace reader's list: it keeps
/// their integer concrete values, and these are the ops whose outputs
/// [`view_outputs`] computes).
pub fn is_view_op(name: &str) -> bool {
    VIEW_OPS.contains(&name)
}

/// What a view op returns for its first argument `input`: one layout per
/// output, or `None` when it is not a view op, copied (`copied`: the op had
/// an allocating child, e.g. `aten::to` that converted) or the arguments do
/// not say. `other` is the second tensor argument's dims (`view_as`,
/// `expand_as`, `reshape_as`).
pub fn view_outputs(
    name: &str,
    input: &Layout,
    concrete: &[Concrete],
    other: Option<&[i64]>,
    copied: bool,
) -> Option<Vec<Layout>> {
    if !is_view_op(name) || copied {
        return None;
    }
    let dims = &input.dims;
    let strides = &input.strides;
    let rank = dims.len();
    let arg = |k: usize| concrete.get(k);
    let one = |dims: Vec<i64>, strides: Vec<i64>| Some(vec![Layout { dims, strides }]);
    // Argument `k` as a list of dimensions, negative ones counted from the end.
    let dims_arg = |k: usize| -> Option<Vec<usize>> {
        arg(k)?.ints()?.iter().map(|&p| norm(p, rank)).collect()
    };
    // The input's dimensions (and their strides) in the order `order` names.
    let reordered = |order: &[usize]| {
        let pick = |of: &[i64]| -> Option<Vec<i64>> {
            order.iter().map(|&i| of.get(i).copied()).collect()
        };
        one(pick(dims)?, pick(strides)?)
    };
    match name {
        "aten::alias"
        | "aten::detach"
        | "aten::detach_"
        | "aten::lift_fresh"
        | "aten::to"
        | "aten::type_as"
        | "aten::contiguous"
        | "aten::requires_grad_" => one(dims.clone(), strides.clone()),
        "aten::t" | "aten::mT" => {
            if rank < 2 {
                return one(dims.clone(), strides.clone());
            }
            let (mut d, mut s) = (dims.clone(), strides.clone());
            d.swap(rank - 1, rank - 2);
            s.swap(rank - 1, rank - 2);
            one(d, s)
        }
        "aten::numpy_T" => one(
            dims.iter().rev().copied().collect(),
            strides.iter().rev().copied().collect(),
        ),
        "aten::transpose" | "aten::swapaxes" => {
            let a = norm(arg(1)?.int()?, rank)?;
            let b = norm(arg(2)?.int()?, rank)?;
            let (mut d, mut s) = (dims.clone(), strides.clone());
            d.swap(a, b);
            s.swap(a, b);
            one(d, s)
        }
        "aten::permute" => reordered(&dims_arg(1)?),
        "aten::movedim" => {
            let src = dims_arg(1)?;
            let dst = dims_arg(2)?;
            let mut order: Vec<Option<usize>> = vec![None; rank];
            for (&s, &d) in src.iter().zip(&dst) {
                *order.get_mut(d)? = Some(s);
            }
            let mut rest = (0..rank).filter(|i| !src.contains(i));
            let order: Vec<usize> = order
                .into_iter()
                .map(|o| o.or_else(|| rest.next()))
                .collect::<Option<_>>()?;
            reordered(&order)
        }
        "aten::view" | "aten::_unsafe_view" | "aten::reshape" | "aten::view_as"
        | "aten::reshape_as" => {
            let size = match name {
                "aten::view_as" | "aten::reshape_as" => other?.to_vec(),
                _ => arg(1)?.ints()?,
            };
            let size = infer_size(dims.iter().fold(1, |n, &d| n.saturating_mul(d)), &size)?;
            let st = view_strides(dims, strides, &size)?;
            one(size, st)
        }
        "aten::flatten" => {
            if rank == 0 {
                return one(vec![1], vec![1]);
            }
            let start = norm(arg(1).and_then(Concrete::int).unwrap_or(0), rank)?;
            let end = norm(arg(2).and_then(Concrete::int).unwrap_or(-1), rank)?;
            let mut size: Vec<i64> = dims.get(..start)?.to_vec();
            size.push(
                dims.get(start..=end)?
                    .iter()
                    .fold(1, |n, &d| n.saturating_mul(d)),
            );
            size.extend_from_slice(dims.get(end + 1..)?);
            let st = view_strides(dims, strides, &size)?;
            one(size, st)
        }
        "aten::unflatten" => {
            let d = norm(arg(1)?.int()?, rank)?;
            let sizes = infer_size(*dims.get(d)?, &arg(2)?.ints()?)?;
            let inner: Vec<i64> = contiguous_strides(&sizes)
                .iter()
                .map(|&s| s.saturating_mul(*strides.get(d).unwrap_or(&1)))
                .collect();
            let mut nd = dims.get(..d)?.to_vec();
            nd.extend_from_slice(&sizes);
            nd.extend_from_slice(dims.get(d + 1..)?);
            let mut ns = strides.get(..d)?.to_vec();
            ns.extend_from_slice(&inner);
            ns.extend_from_slice(strides.get(d + 1..)?);
            one(nd, ns)
        }
        "aten::expand" | "aten::expand_as" => {
            let size = match name {
                "aten::expand_as" => other?.to_vec(),
                _ => arg(1)?.ints()?,
            };
            let lead = size.len().checked_sub(rank)?;
            let mut nd = Vec::with_capacity(size.len());
            let mut ns = Vec::with_capacity(size.len());
            for (i, &x) in size.iter().enumerate() {
                match i.checked_sub(lead) {
                    None => {
                        nd.push(x);
                        ns.push(0);
                    }
                    Some(j) => {
                        let orig = *dims.get(j)?;
                        if x == -1 || x == orig {
                            nd.push(orig);
                            ns.push(*strides.get(j)?);
                        } else {
                            nd.push(x);
                            ns.push(0);
                        }
                    }
                }
            }
            one(nd, ns)
        }
        "aten::unsqueeze" => {
            let d = norm(arg(1)?.int()?, rank + 1)?;
            let new_stride = match (dims.get(d), strides.get(d)) {
                (Some(&size), Some(&stride)) => size.saturating_mul(stride),
                _ => 1,
            };
            let (mut nd, mut ns) = (dims.clone(), strides.clone());
            nd.insert(d, 1);
            ns.insert(d, new_stride);
            one(nd, ns)
        }
        "aten::squeeze" => {
            let which: Option<Vec<usize>> = match arg(1) {
                Some(c @ (Concrete::Int(_) | Concrete::Ints(_))) => Some(
                    c.ints()?
                        .iter()
                        .map(|&p| norm(p, rank))
                        .collect::<Option<_>>()?,
                ),
                _ => None,
            };
            let keep = |i: usize| {
                let is_one = dims.get(i) == Some(&1);
                !(is_one && which.as_ref().is_none_or(|w| w.contains(&i)))
            };
            one(
                (0..rank)
                    .filter(|&i| keep(i))
                    .filter_map(|i| dims.get(i).copied())
                    .collect(),
                (0..rank)
                    .filter(|&i| keep(i))
                    .filter_map(|i| strides.get(i).copied())
                    .collect(),
            )
        }
        "aten::slice" => {
            let d = norm(arg(1).and_then(Concrete::int).unwrap_or(0), rank)?;
            let len = *dims.get(d)?;
            let step = arg(4).and_then(Concrete::int).unwrap_or(1).max(1);
            let clamp = |v: i64| {
                let v = if v < 0 { v.saturating_add(len) } else { v };
                v.clamp(0, len)
            };
            let start = clamp(arg(2).and_then(Concrete::int).unwrap_or(0));
            let end = clamp(arg(3).and_then(Concrete::int).unwrap_or(len)).max(start);
            let (mut nd, mut ns) = (dims.clone(), strides.clone());
            *nd.get_mut(d)? = (end - start + step - 1) / step;
            *ns.get_mut(d)? = strides.get(d)?.saturating_mul(step);
            one(nd, ns)
        }
        "aten::narrow" => {
            let d = norm(arg(1)?.int()?, rank)?;
            let mut nd = dims.clone();
            *nd.get_mut(d)? = arg(3)?.int()?;
            one(nd, strides.clone())
        }
        "aten::select" | "aten::unbind" => {
            let d = norm(arg(1).and_then(Concrete::int).unwrap_or(0), rank)?;
            let (mut nd, mut ns) = (dims.clone(), strides.clone());
            nd.remove(d);
            ns.remove(d);
            let n = if name == "aten::unbind" {
                *dims.get(d)?
            } else {
                1
            };
            Some(vec![
                Layout {
                    dims: nd,
                    strides: ns
                };
                usize::try_from(n.clamp(1, 1 << 16)).ok()?
            ])
        }
        "aten::split" | "aten::split_with_sizes" | "aten::chunk" => {
            let d = norm(arg(2).and_then(Concrete::int).unwrap_or(0), rank)?;
            let len = *dims.get(d)?;
            let sizes: Vec<i64> = match (name, arg(1)?) {
                ("aten::split_with_sizes", c) | ("aten::split", c @ Concrete::Ints(_)) => {
                    c.ints()?
                }
                ("aten::chunk", c) => {
                    let k = c.int()?.max(1);
                    let size = (len + k - 1) / k;
                    pieces(len, size)
                }
                (_, c) => pieces(len, c.int()?),
            };
            Some(
                sizes
                    .into_iter()
                    .take(1 << 16)
                    .map(|s| {
                        let mut nd = dims.clone();
                        if let Some(slot) = nd.get_mut(d) {
                            *slot = s;
                        }
                        Layout {
                            dims: nd,
                            strides: strides.clone(),
                        }
                    })
                    .collect(),
            )
        }
        _ => None,
    }
}

/// `len` cut into pieces of `size` (the last one shorter).
fn pieces(len: i64, size: i64) -> Vec<i64> {
    if size <= 0 {
        return Vec::new();
    }
    (0..len)
        .step_by(usize::try_from(size).unwrap_or(1))
        .take(1 << 16)
        .map(|start| size.min(len - start))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lay(dims: &[i64], strides: &[i64]) -> Layout {
        Layout {
            dims: dims.to_vec(),
            strides: strides.to_vec(),
        }
    }

    fn c(texts: &[&str]) -> Vec<Concrete> {
        texts.iter().map(|t| Concrete::parse(t)).collect()
    }

    #[test]
    fn concrete_inputs_parse() {
        assert_eq!(
            Concrete::parse("[8, 64, -1, 64]"),
            Concrete::Ints(vec![8, 64, -1, 64])
        );
        assert_eq!(Concrete::parse("-2"), Concrete::Int(-2));
        assert_eq!(Concrete::parse(""), Concrete::Other);
        assert_eq!(Concrete::parse("True"), Concrete::Other);
        assert_eq!(Concrete::parse("[]"), Concrete::Ints(vec![]));
        assert_eq!(Concrete::parse("0.5"), Concrete::Other);
    }

    #[test]
    fn a_view_of_a_split_keeps_the_parent_strides() {
        // GPT-2: qkv.split(768, dim=2) then .view(8, 64, -1, 64)
        let q = lay(&[8, 64, 768], &[147456, 2304, 1]);
        let out = view_outputs("aten::view", &q, &c(&["", "[8, 64, -1, 64]"]), None, false);
        assert_eq!(
            out,
            Some(vec![lay(&[8, 64, 12, 64], &[147456, 2304, 64, 1])])
        );
        // A view across non-mergeable dims needs a copy.
        assert_eq!(view_strides(&[3, 2], &[1, 3], &[6]), None);
    }

    #[test]
    fn transposes_slices_and_unbind() {
        let w = lay(&[768, 3072], &[3072, 1]);
        assert_eq!(
            view_outputs("aten::t", &w, &c(&[""]), None, false),
            Some(vec![lay(&[3072, 768], &[1, 3072])])
        );
        let cache = lay(&[2, 128, 32], &[4096, 32, 1]);
        let sliced = view_outputs(
            "aten::slice",
            &cache,
            &c(&["", "1", "0", "32", "1"]),
            None,
            false,
        )
        .unwrap();
        assert_eq!(sliced, vec![lay(&[2, 32, 32], &[4096, 32, 1])]);
        let halves = view_outputs("aten::unbind", &sliced[0], &c(&["", "0"]), None, false).unwrap();
        assert_eq!(halves, vec![lay(&[32, 32], &[32, 1]); 2]);
        // slice to the end: INT64_MAX
        let q = lay(&[2, 12, 32, 64], &[24576, 64, 768, 1]);
        let x2 = view_outputs(
            "aten::slice",
            &q,
            &c(&["", "3", "32", "9223372036854775807", "1"]),
            None,
            false,
        );
        assert_eq!(x2, Some(vec![lay(&[2, 12, 32, 32], &[24576, 64, 768, 1])]));
    }

    #[test]
    fn expand_unsqueeze_movedim_split() {
        let inv = lay(&[32], &[1]);
        let u = view_outputs("aten::unsqueeze", &inv, &c(&["", "0"]), None, false).unwrap();
        assert_eq!(u, vec![lay(&[1, 32], &[32, 1])]);
        let e = view_outputs(
            "aten::expand",
            &u[0],
            &c(&["", "[4, -1]", "False"]),
            None,
            false,
        );
        assert_eq!(e, Some(vec![lay(&[4, 32], &[0, 1])]));
        let x = lay(&[2, 12, 32, 32, 2], &[24576, 64, 768, 2, 1]);
        let m = view_outputs("aten::movedim", &x, &c(&["", "-1", "0"]), None, false);
        assert_eq!(
            m,
            Some(vec![lay(&[2, 2, 12, 32, 32], &[1, 24576, 64, 768, 2])])
        );
        let qkv = lay(&[8, 64, 2304], &[147456, 2304, 1]);
        let s = view_outputs("aten::split", &qkv, &c(&["", "768", "2"]), None, false).unwrap();
        assert_eq!(s, vec![lay(&[8, 64, 768], &[147456, 2304, 1]); 3]);
        assert_eq!(view_outputs("aten::to", &qkv, &c(&[""]), None, true), None);
    }

    #[test]
    fn extents_count_the_storage_a_view_spans() {
        assert_eq!(extent(&[768, 3072], &[1, 768]), 768 * 3072);
        assert_eq!(extent(&[2, 12, 32, 32], &[24576, 64, 768, 1]), 49120);
        assert_eq!(extent(&[4, 32], &[0, 1]), 32);
        assert_eq!(extent(&[0, 3], &[3, 1]), 0);
        assert_eq!(extent(&[], &[]), 1);
    }

    /// Sizes a hostile trace writes saturate or give no view; none panics
    /// (issue 33): `i64::MIN / -1` overflows even without overflow checks.
    #[test]
    fn hostile_sizes_never_panic() {
        assert_eq!(infer_size(i64::MIN, &[-1, -1]), Some(vec![0, -1]));
        assert_eq!(infer_size(i64::MAX, &[-1, 0]), Some(vec![0, 0]));
        let huge = [i64::MAX, i64::MAX, 3];
        assert_eq!(extent(&huge, &[]), u64::MAX);
        assert_eq!(extent(&huge, &[i64::MAX, 1, 1]), u64::MAX);
        let big = lay(&huge, &[i64::MAX, 3, 1]);
        let _ = view_outputs("aten::view", &big, &c(&["", "[-1]"]), None, false);
        let _ = view_outputs("aten::flatten", &big, &c(&["", "0", "-1"]), None, false);
        assert_eq!(view_strides(&huge, &[i64::MAX, 3, 1], &[-1]), None);
    }
}

//! Tensor-list elements' types: the profiler records no dtype for the
//! elements of a `TensorList` argument (`cat`'s, `stack`'s, `einsum`'s
//! operands), so the op's children tell them. One rule, for every reader
//! that sizes an element (`analyzer::resident`, `scale::length`).

/// Ops whose output is their tensor-list operands laid end to end.
pub const CONCATENATIONS: [&str; 6] = [
    "aten::cat",
    "aten::_cat",
    "aten::concat",
    "aten::concatenate",
    "aten::stack",
    "aten::hstack",
];

/// The type of each element of an op's tensor list (`elements`: their dims,
/// `None` where the profiler recorded one itself), from the typed arguments
/// of the op's children in call order (`children`: dims and type):
/// - the op hands each element to a view, a `bmm` or a copy whose type is
///   kept: the first child argument of the same dims (each taken once), else
///   of the same element count (under autocast an `einsum` reads bf16
///   probabilities in an fp32 trace);
/// - a concatenation (`concatenates`) writes each element into a view of its
///   output (`narrow`), so where no child shows an element, the view of the
///   whole output does: it holds every element's values in the type they
///   share (`cat`'s result type; under autocast a bf16 `rotate_half` in an
///   fp32 trace, a bf16 key appended to a cache).
pub fn list_element_types<T: Copy>(
    elements: &[Option<&[i64]>],
    children: &[(&[i64], T)],
    concatenates: bool,
) -> Vec<Option<T>> {
    let numel = |dims: &[i64]| dims.iter().fold(1_i64, |n, &d| n.saturating_mul(d));
    let mut used = vec![false; children.len()];
    let mut out: Vec<Option<T>> = elements
        .iter()
        .map(|element| {
            let dims = (*element)?;
            let n = numel(dims);
            let pick = (0..children.len())
                .find(|&k| !used[k] && children[k].0 == dims)
                .or_else(|| {
                    (0..children.len()).find(|&k| !used[k] && numel(children[k].0) == n && n > 0)
                })?;
            used[pick] = true;
            Some(children[pick].1)
        })
        .collect();
    if concatenates {
        let total = elements
            .iter()
            .flatten()
            .map(|d| numel(d))
            .fold(0_i64, i64::saturating_add);
        let output = children
            .iter()
            .find(|(dims, _)| numel(dims) == total && total > 0)
            .map(|c| c.1);
        if let Some(output) = output {
            for (slot, element) in out.iter_mut().zip(elements) {
                if slot.is_none() && element.is_some() {
                    *slot = Some(output);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_element_takes_its_childs_type_else_the_outputs() {
        let (q, k): (&[i64], &[i64]) = (&[2, 4], &[2, 8]);
        // einsum: each operand reaches a typed child of its dims.
        assert_eq!(
            list_element_types(&[Some(q), Some(k)], &[(k, 'b'), (q, 'f')], false),
            [Some('f'), Some('b')]
        );
        // cat((empty, key)) whose only child is the view of its output.
        let (empty, key, out): (&[i64], &[i64], &[i64]) = (&[0], &[2, 3], &[2, 3]);
        assert_eq!(
            list_element_types(&[Some(empty), Some(key)], &[(out, 'b')], true),
            [Some('b'), Some('b')]
        );
        // Not a concatenation: nothing to go by.
        assert_eq!(list_element_types(&[Some(q)], &[(out, 'b')], false), [None]);
        // An element with its own type is left out.
        assert_eq!(
            list_element_types(&[None, Some(q)], &[(q, 'b')], true),
            [None, Some('b')]
        );
    }
}

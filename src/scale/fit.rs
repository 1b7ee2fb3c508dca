//! `--seq-len L` from two or three traces of one job at different lengths:
//! every number that can depend on the length — each `[memory]` size, each
//! recorded dim, stride and view size — is fitted across the traces, event by
//! event, and evaluated at `L`. No shape is read: a size that doubles when the
//! length doubles grows as T, one that quadruples as T².
//!
//! Rule for one number seen as `v_i` at lengths `T_i`: constant when equal;
//! `v_0 · (L / T_0)^k` when every point fits that power exactly (k = 1, 2);
//! else the line (two traces) or parabola (three) through the points. The
//! traces must be the same job: the same events in the same order.

use super::events::{base_total, retotal};
use super::rescale::div_round;
use super::shape::traced_length;
use super::{LengthFacts, ScaleError};
use crate::diag::Warning;
use crate::trace::Trace;

/// The trace at length `len` fitted from `traces`.
pub(super) fn fit(
    traces: &[Trace],
    len: u32,
    warnings: &mut Vec<Warning>,
) -> Result<(Trace, LengthFacts), ScaleError> {
    let mut at: Vec<(u32, &Trace)> = Vec::new();
    for trace in traces {
        let t = traced_length(trace).ok_or(ScaleError::LengthNotFound)?;
        if let Some((_, _)) = at.iter().find(|(u, _)| *u == t) {
            return Err(ScaleError::SameLength(t));
        }
        at.push((t, trace));
    }
    at.sort_by_key(|(t, _)| *t);
    if at.len() > 3 {
        warnings.push(Warning::new(
            "seq_len_traces",
            format!(
                "{} traces were given; the sizes are fitted through the three shortest",
                at.len()
            ),
        ));
        at.truncate(3);
    }
    let Some(&(_, base)) = at.first() else {
        return Err(ScaleError::SeveralWithoutLength);
    };
    for &(t, other) in at.iter().skip(1) {
        same_job(base, other, t)?;
    }
    let xs: Vec<i128> = at.iter().map(|(t, _)| i128::from(*t)).collect();
    let target = i128::from(len);
    let mut out = base.clone();
    let (mut linear, mut quadratic) = (0, 0);
    for (i, m) in out.memory.iter_mut().enumerate() {
        let ys: Vec<i128> = at
            .iter()
            .map(|(_, tr)| tr.memory.get(i).map_or(0, |m| i128::from(m.bytes)))
            .collect();
        let (v, k) = fit_one(&xs, &ys, target);
        if m.bytes > 0 {
            match k {
                1 => linear += 1,
                2 => quadratic += 1,
                _ => {}
            }
        }
        m.bytes = clamp(v);
    }
    retotal(&mut out.memory, base_total(&base.memory));
    for (j, n) in out.op_args.numbers.iter_mut().enumerate() {
        let ys: Vec<i128> = at
            .iter()
            .map(|(_, tr)| tr.op_args.numbers.get(j).map_or(0, |x| i128::from(*x)))
            .collect();
        *n = clamp(fit_one(&xs, &ys, target).0);
    }
    for (j, input) in out.tensor_args.iter_mut().enumerate() {
        let ys: Vec<i128> = at
            .iter()
            .map(|(_, tr)| tr.tensor_args.get(j).map_or(0, |x| i128::from(x.numel)))
            .collect();
        input.numel = u64::try_from(fit_one(&xs, &ys, target).0.max(0)).unwrap_or(u64::MAX);
    }
    Ok((
        out,
        LengthFacts {
            traced: at.iter().map(|(t, _)| *t).collect(),
            estimated: len,
            method: "fit".to_owned(),
            linear,
            quadratic,
        },
    ))
}

fn clamp(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

/// Checks that two traces record the same events in the same order.
fn same_job(a: &Trace, b: &Trace, len: u32) -> Result<(), ScaleError> {
    let differ = |what: &str, x: usize, y: usize| {
        ScaleError::NotTheSameJob(format!(
            "the trace at length {len} has {y} {what} where the shortest has {x}"
        ))
    };
    if a.memory.len() != b.memory.len() {
        return Err(differ("[memory] events", a.memory.len(), b.memory.len()));
    }
    if a.ops.len() != b.ops.len() {
        return Err(differ("operators", a.ops.len(), b.ops.len()));
    }
    if a.op_args.numbers.len() != b.op_args.numbers.len()
        || a.tensor_args.len() != b.tensor_args.len()
    {
        return Err(ScaleError::NotTheSameJob(format!(
            "the trace at length {len} records other tensor arguments"
        )));
    }
    if let Some((i, (x, y))) = a
        .ops
        .iter()
        .zip(&b.ops)
        .enumerate()
        .find(|(_, (x, y))| a.name(x.name) != b.name(y.name))
    {
        return Err(ScaleError::NotTheSameJob(format!(
            "operator {i} is {} in one trace and {} in the other",
            a.name(x.name),
            b.name(y.name)
        )));
    }
    let sign = |t: &Trace| t.memory.iter().map(|m| m.bytes > 0).collect::<Vec<bool>>();
    if sign(a) != sign(b) {
        return Err(ScaleError::NotTheSameJob(
            "their allocations and frees come in another order".to_owned(),
        ));
    }
    Ok(())
}

/// One number at `x` from its values `ys` at `xs` (ascending, distinct),
/// and the power it grows with (0, 1, 2; 3 for a polynomial fit).
pub(super) fn fit_one(xs: &[i128], ys: &[i128], x: i128) -> (i128, u32) {
    let (Some(&x0), Some(&y0)) = (xs.first(), ys.first()) else {
        return (0, 0);
    };
    if ys.iter().all(|&y| y == y0) {
        return (y0, 0);
    }
    for k in 1..=2u32 {
        let fits = xs
            .iter()
            .zip(ys)
            .all(|(&xi, &yi)| yi * x0.pow(k) == y0 * xi.pow(k));
        if fits {
            return (div_round(y0 * x.pow(k), x0.pow(k)), k);
        }
    }
    match (xs, ys) {
        ([x0, x1], [y0, y1]) => (y0 + div_round((y1 - y0) * (x - x0), x1 - x0), 3),
        ([x0, x1, x2, ..], [y0, y1, y2, ..]) => {
            // Lagrange through three points, over one common denominator.
            let d0 = (x0 - x1) * (x0 - x2);
            let d1 = (x1 - x0) * (x1 - x2);
            let d2 = (x2 - x0) * (x2 - x1);
            let den = d0 * d1 * d2;
            let num = y0 * (x - x1) * (x - x2) * d1 * d2
                + y1 * (x - x0) * (x - x2) * d0 * d2
                + y2 * (x - x0) * (x - x1) * d0 * d1;
            (div_round(num, den), 3)
        }
        _ => (y0, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn powers_are_found_exactly_and_other_shapes_fitted() {
        // constant, T, T²
        assert_eq!(fit_one(&[32, 64], &[7, 7], 512), (7, 0));
        assert_eq!(fit_one(&[32, 64], &[100, 200], 512), (1600, 1));
        assert_eq!(fit_one(&[32, 64], &[100, 400], 128), (1600, 2));
        // a constant part plus a T part: the line through two points
        assert_eq!(fit_one(&[32, 64], &[110, 210], 128), (410, 3));
        // a T and a T² part: the parabola through three points
        let y = |t: i128| 5 + 3 * t + 2 * t * t;
        assert_eq!(
            fit_one(&[32, 64, 128], &[y(32), y(64), y(128)], 1000).0,
            y(1000)
        );
        // frees are negative sizes
        assert_eq!(fit_one(&[32, 64], &[-100, -200], 512), (-1600, 1));
    }
}

//! Unit tests of the pre-trace read engine (`reads.rs`).

use super::*;

const F32: Dtype = Dtype {
    size: 4,
    name: 1,
    floating: true,
};

fn arg(pos: u16, dims: &[i64], strides: Option<&[i64]>) -> Arg {
    Arg {
        pos,
        list: None,
        dtype: Some(F32),
        layout: Layout {
            dims: dims.to_vec(),
            strides: strides.map_or_else(|| contiguous_strides(dims), <[i64]>::to_vec),
        },
    }
}

fn op(name: &str, start: i64, call: usize, iteration: usize, args: Vec<Arg>) -> Op {
    Op {
        name: name.to_owned(),
        start,
        call: Some(call),
        iteration,
        pass: iteration,
        args,
        concrete: Vec::new(),
        copied: false,
    }
}

fn call(instance: u32, class: u32, start: i64) -> Call {
    Call {
        instance,
        class,
        start,
        wrapper: false,
        conv1d: false,
    }
}

/// A batch `x` [2, 8] allocated in the trace goes through a Linear (weight
/// [4, 8], bias [4]) in two iterations, then a custom module multiplies it
/// by the transpose of its own [4, 8] weight.
#[test]
fn each_pre_trace_tensor_counts_once_and_views_are_not_new() {
    let calls = vec![
        call(0, 0, 5),
        call(0, 0, 105),
        call(1, 1, 40),
        call(1, 1, 140),
    ];
    let mut ops = Vec::new();
    for (it, base) in [(0_usize, 0_i64), (1, 100)] {
        let linear = vec![
            arg(0, &[2, 8], None),
            arg(1, &[4, 8], None),
            arg(2, &[4], None),
        ];
        ops.push(op("aten::linear", base + 10, it, it, linear));
        ops.push(op(
            "aten::t",
            base + 41,
            2 + it,
            it,
            vec![arg(0, &[4, 8], None)],
        ));
        let mm = vec![arg(0, &[2, 8], None), arg(1, &[8, 4], Some(&[1, 8]))];
        ops.push(op("aten::mm", base + 42, 2 + it, it, mm));
    }
    let x = |alloc: i64| Blk {
        alloc,
        free: Some(alloc + 90),
        size: 64,
        usage: BlockUse::Live,
        bound_dims: None,
        source: None,
    };
    let found = pre_trace_reads(&ops, &calls, &[x(1), x(101)], 4, Some(1));
    let mut got: Vec<(Option<u32>, Vec<i64>, ReadKind)> = found
        .iter()
        .map(|f| (f.instance, f.dims.clone(), f.kind))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            (Some(0), vec![4], ReadKind::Parameter),
            (Some(0), vec![4, 8], ReadKind::Parameter),
            (Some(1), vec![4, 8], ReadKind::Parameter),
        ]
    );
    assert!(found
        .iter()
        .all(|f| !f.in_trace && f.bytes == f.dims.iter().product::<i64>() as u64 * 4));
}

//! Rule `cublas_workspaces`: the cuBLAS workspaces a CUDA run allocates
//! through the caching allocator.

use super::order::Key;
use super::{first_start, Item};
use crate::orchestrator::schedule::{Category, Phase, PhaseWindow};
use crate::units::{Bytes, Nanos};

/// CPU ops whose CUDA counterparts call cuBLAS (matrix products). The
/// allocation of their output marks the first cuBLAS call of a thread.
pub const CUBLAS_OPS: &[&str] = &[
    "aten::addmm",
    "aten::mm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::addbmm",
    "aten::addmv",
    "aten::mv",
    "aten::dot",
    "aten::_addmm_activation",
];

/// Rule `cublas_workspaces`: one workspace block (sized per GPU at simulation
/// time) for the main thread, at the first allocation of a matrix-product op in
/// the forward pass of the first iteration, and one for the autograd thread at
/// the first one in its backward pass. Without a matrix product in a pass, the
/// workspace goes to the pass's start (the forward's, else the first
/// iteration's start: cuBLAS is still loaded by the first `Linear` or `matmul`
/// of most models). Items sort after the op's output allocation at the same key.
pub(super) fn rule_cublas_workspaces(
    items: &[Item],
    windows: &[PhaseWindow],
    start_of_first_iteration: Option<Nanos>,
) -> Vec<Item> {
    let passes = [
        first_start(windows, Phase::Forward).or(start_of_first_iteration),
        first_start(windows, Phase::Backward),
    ];
    let mut out = Vec::new();
    for (index, (phase, start)) in [Phase::Forward, Phase::Backward]
        .into_iter()
        .zip(passes)
        .enumerate()
    {
        let products = || {
            items.iter().filter(|i| {
                i.iteration == Some(0)
                    && i.phase == phase
                    && i.op.as_deref().is_some_and(|op| CUBLAS_OPS.contains(&op))
            })
        };
        // The op's output is allocated before its kernel runs and asks for
        // the handle's workspace (a structured op's `set_output`, then
        // `getCurrentCUDABlasHandle` in the gemm call): the workspace goes
        // after every block the first product allocates at that moment (a
        // block a rule re-made there included).
        let first_product = products()
            .filter(|i| i.source.is_some())
            .map(|i| i.alloc)
            .min()
            .map(|first| {
                products()
                    .map(|i| i.alloc)
                    .filter(|alloc| alloc.time == first.time)
                    .max()
                    .unwrap_or(first)
            });
        let fallback = start.map(|time| Key::before_trace(time, index as u64));
        let Some(alloc) = first_product.or(fallback) else {
            continue;
        };
        out.push(Item {
            size: Bytes::ZERO,
            category: Category::Workspace,
            iteration: Some(0),
            phase,
            op: Some("cuBLAS workspace".to_owned()),
            layer: None,
            alloc,
            free: None,
            source: None,
            rule: None,
            on: crate::kernels::ArchSet::ALL,
            per_gpu: None,
        });
    }
    out
}

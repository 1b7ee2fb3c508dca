//! Rule `cpu_lowp_matmul_copies`: the contiguous copy a CPU matrix-product
//! kernel makes of a transposed bf16/fp16 operand (`aten::contiguous`
//! inside `aten::bmm` and kin, freed before the product returns) has no CUDA
//! counterpart: cuBLAS reads a transposed operand in place. In an fp32 trace
//! of the same products the copy does not appear.

use super::{op_chain, Plan};
use crate::analyzer::Analysis;
use crate::orchestrator::rules::RuleId;

/// The CPU matrix products whose lower-precision kernels copy an operand.
const CPU_MATMULS: &[&str] = &[
    "aten::bmm",
    "aten::mm",
    "aten::baddbmm",
    "aten::addmm",
    "aten::addbmm",
];

pub(super) fn rule_cpu_lowp_matmul_copies(analysis: &Analysis, plan: &mut Plan) {
    for block in &analysis.blocks {
        let mut saw_contiguous = false;
        for op in op_chain(analysis, block.alloc_op) {
            let name = analysis.name(op.name);
            if name == "aten::contiguous" {
                saw_contiguous = true;
            } else if name == "aten::_to_copy" {
                break;
            } else if CPU_MATMULS.contains(&name) {
                let lower = analysis
                    .inputs_of(op)
                    .iter()
                    .any(|i| i.dtype.is_some_and(|d| d.is_lower()));
                let inside = block.free_ts.is_some_and(|f| f <= op.end);
                if saw_contiguous && lower && inside {
                    plan.dropped
                        .entry(block.id)
                        .or_insert(RuleId::CpuLowpMatmulCopies);
                }
                break;
            }
        }
    }
}

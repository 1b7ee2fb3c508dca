//! Rule `autocast_backward`: a gradient has the type of the tensor it is
//! the gradient of, so the blocks the backward node of a forward op makes
//! change type with that op's outputs (fp32 where CUDA ran the op in fp32).
//! A guess at the block level: every block the node makes is taken to be
//! such a gradient (parameter gradients excepted: a parameter's gradient
//! has the parameter's type, fp32).

use std::collections::BTreeMap;

use super::{op_chain, top_of, Plan};
use crate::analyzer::{Analysis, BlockRole};
use crate::orchestrator::rules::RuleId;
use crate::units::Bytes;

/// `factors`: per top-level forward op whose outputs changed type, the
/// (CPU, CUDA) element sizes.
pub(super) fn rule_backward_dtypes(
    analysis: &Analysis,
    factors: &BTreeMap<usize, (u64, u64)>,
    plan: &mut Plan,
) {
    if factors.is_empty() {
        return;
    }
    for block in &analysis.blocks {
        if matches!(block.role, BlockRole::Gradient { .. })
            || plan.resized.contains_key(&block.id)
            || plan.dropped.contains_key(&block.id)
        {
            continue;
        }
        let Some(forward) = op_chain(analysis, block.alloc_op)
            .take_while(|o| o.backward)
            .find_map(|o| o.forward_op)
        else {
            continue;
        };
        let Some(&(cpu, cuda)) = top_of(analysis, Some(forward)).and_then(|t| factors.get(&t))
        else {
            continue;
        };
        if cpu == 0 || block.size.get() % cpu != 0 {
            continue;
        }
        let new = Bytes(block.size.get() / cpu * cuda);
        plan.resized
            .insert(block.id, (new, RuleId::AutocastBackward));
    }
}

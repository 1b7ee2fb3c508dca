//! Rules `other_device`, `cpu_scratch`, `cpu_collective_temporaries`,
//! `host_data_loading` and `host_step_counters`: captured blocks that a CUDA run of the same script
//! does not allocate through the caching allocator, dropped from the schedule.

use super::RuleId;
use crate::analyzer::{self, Analysis, Block, BlockRole};
use crate::units::Bytes;

/// torch.optim optimizers whose step counter is a host scalar by default.
const HOST_STEP_OPTIMIZERS: &[&str] = &[
    "Adam",
    "AdamW",
    "Adagrad",
    "RMSprop",
    "NAdam",
    "RAdam",
    "Adamax",
    "ASGD",
    "Adadelta",
    "Adafactor",
    "Rprop",
];

/// The rules that drop a captured block, in the order they are tried: a
/// block dropped by several counts for the first.
const DROP_RULES: [RuleId; 5] = [
    RuleId::OtherDevice,
    RuleId::CpuCollectiveTemporaries,
    RuleId::CpuScratch,
    RuleId::HostDataLoading,
    RuleId::HostStepCounters,
];

/// The rule that drops a captured block, if one does.
pub(super) fn dropped_by(analysis: &Analysis, block: &Block) -> Option<RuleId> {
    DROP_RULES
        .into_iter()
        .find(|&rule| drops(rule, analysis, block))
}

/// Whether `rule` drops `block`; rules that do not drop blocks never do.
fn drops(rule: RuleId, analysis: &Analysis, block: &Block) -> bool {
    match rule {
        RuleId::OtherDevice => rule_other_device(analysis, block),
        RuleId::CpuScratch => rule_cpu_scratch(block),
        RuleId::CpuCollectiveTemporaries => rule_cpu_collective_temporaries(analysis, block),
        RuleId::HostDataLoading => rule_host_data_loading(block),
        RuleId::HostStepCounters => rule_host_step_counters(analysis, block),
        RuleId::Parameters
        | RuleId::BatchnormBuffers
        | RuleId::ModelBuffers
        | RuleId::QuantState
        | RuleId::ConstructorOptimizerState
        | RuleId::ActivationsBeforeTrace
        | RuleId::DdpBuckets
        | RuleId::Activations
        | RuleId::AutocastFp32Ops
        | RuleId::AutocastLowerOps
        | RuleId::AutocastPromotion
        | RuleId::AutocastInputCasts
        | RuleId::AutocastCpuOnlyCasts
        | RuleId::AutocastCastCache
        | RuleId::CpuLowpMatmulCopies
        | RuleId::AutocastBackward
        | RuleId::BnbCudaKernels
        | RuleId::SdpaCudaKernels
        | RuleId::DropoutCudaMask
        | RuleId::CudaReduceBuffers
        | RuleId::CudnnConvWorkspaces
        | RuleId::CudaSoftmaxBackward
        | RuleId::GradScalerState
        | RuleId::Gradients
        | RuleId::BatchHandover
        | RuleId::ForeachOptimizer
        | RuleId::Iterations
        | RuleId::CublasWorkspaces => false,
    }
}

/// Rule `other_device`: a GPU trace's CPU blocks are host memory; a CPU
/// trace's blocks stand for the GPU run's. GPU blocks are CUDA or HIP (ROCm
/// builds use the same caching allocator).
fn rule_other_device(analysis: &Analysis, block: &Block) -> bool {
    if analysis.devices.recorded_on_cuda {
        !block.device.is_gpu()
    } else {
        block.device != crate::trace::Device::Cpu
    }
}

/// Rule `cpu_scratch`: a CPU kernel's private scratch, and the
/// operator-internal blocks of oneDNN ops, have no CUDA counterpart (the
/// analyzer flags them: `Block::cpu_scratch`).
fn rule_cpu_scratch(block: &Block) -> bool {
    block.cpu_scratch
}

/// What rule `cpu_scratch` drops, per op the scratch is internal to (each
/// traced block once), largest first.
pub(super) fn scratch_by_op(analysis: &Analysis) -> Vec<crate::orchestrator::OpBytes> {
    let mut per: std::collections::BTreeMap<&str, (u32, u64)> = std::collections::BTreeMap::new();
    for block in &analysis.blocks {
        if dropped_by(analysis, block) != Some(RuleId::CpuScratch) {
            continue;
        }
        let op = block
            .internal_to
            .and_then(|o| analysis.ops.get(o))
            .map_or("", |o| analysis.name(o.name));
        let slot = per.entry(op).or_default();
        slot.0 = slot.0.saturating_add(1);
        slot.1 = slot.1.saturating_add(block.size.get());
    }
    let mut out: Vec<crate::orchestrator::OpBytes> = per
        .into_iter()
        .map(|(op, (blocks, bytes))| crate::orchestrator::OpBytes {
            op: op.to_owned(),
            blocks,
            bytes: Bytes(bytes),
        })
        .collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.op.cmp(&b.op)));
    out
}

/// Rule `cpu_collective_temporaries`: in a distributed trace recorded on the
/// CPU (gloo, or a backend the trace does not name), a block allocated inside
/// a `c10d::` collective op and freed in the trace is gloo's staging memory;
/// a CUDA run's NCCL collectives make no such block through the caching
/// allocator (NCCL's own buffers are outside it).
fn rule_cpu_collective_temporaries(analysis: &Analysis, block: &Block) -> bool {
    let cpu_backend = !analysis.devices.recorded_on_cuda
        && analysis
            .recipe
            .distributed
            .as_ref()
            .is_some_and(|d| d.backend.as_deref().is_none_or(|b| b == "gloo"));
    cpu_backend
        && block.free_ts.is_some()
        && std::iter::successors(block.alloc_op, |&i| {
            analysis.ops.get(i).and_then(|o| o.parent)
        })
        .filter_map(|i| analysis.ops.get(i))
        .any(|o| analysis.name(o.name).starts_with("c10d::"))
}

/// Rule `host_data_loading`: everything the DataLoader's `__next__` allocates
/// except the batch is host memory on a CUDA run.
fn rule_host_data_loading(block: &Block) -> bool {
    block.alloc_phase == analyzer::Phase::DataLoading && block.role != BlockRole::Batch
}

/// Rule `host_step_counters`: `torch.optim` optimizers keep `state["step"]`
/// as a host scalar unless `capturable` or `fused` is set.
fn rule_host_step_counters(analysis: &Analysis, block: &Block) -> bool {
    let torch_optim = analysis.optimizer.torch_optim != Some(false);
    let host_step = analysis
        .optimizer
        .class_name
        .as_deref()
        .is_some_and(|class| HOST_STEP_OPTIMIZERS.contains(&class));
    torch_optim && host_step && block.role == BlockRole::OptimizerState && block.size <= Bytes(8)
}

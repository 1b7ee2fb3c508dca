//! The orchestrator → simulator glue: a [`Schedule`] becomes simulator ops
//! for one GPU, and the simulation's samples come back per schedule event.
//! The estimate and the what-ifs share it.

use crate::orchestrator::{Category, EventKind, Schedule};
use crate::presets::GpuTarget;
use crate::report::SimulatedRun;
use crate::simulator::{self, AllocatorConfig, GpuMemory, SimOp};
use crate::units::Bytes;

/// The simulator ops of a schedule on `target`: workspace blocks at the
/// target's cuBLAS workspace size (the first `cublas_workspaces` of them
/// only), blocks another architecture's kernels make and zero-byte blocks
/// skipped with their frees. Also returns, for each schedule event, the
/// number of ops issued up to and including it.
pub fn schedule_ops(schedule: &Schedule, target: &GpuTarget) -> (Vec<SimOp>, Vec<usize>) {
    let workspace = target.overheads.cublas_workspace_bytes;
    let mut workspaces_left = target.overheads.cublas_workspaces;
    let mut issued = vec![false; schedule.blocks.len()];
    let mut ops: Vec<SimOp> = Vec::with_capacity(schedule.events.len());
    let mut ops_through: Vec<usize> = Vec::with_capacity(schedule.events.len());
    for event in &schedule.events {
        let id = event.block.index();
        match event.kind {
            EventKind::Alloc => {
                let size = match schedule.blocks.get(id) {
                    Some(block) if !block.on.contains(target.kernel_sm()) => Bytes::ZERO,
                    Some(block) if block.category == Category::Workspace => {
                        if workspaces_left > 0 {
                            workspaces_left -= 1;
                            workspace
                        } else {
                            Bytes::ZERO
                        }
                    }
                    Some(block) => block.size_on(target),
                    None => Bytes::ZERO,
                };
                if size > Bytes::ZERO {
                    if let Some(slot) = issued.get_mut(id) {
                        *slot = true;
                    }
                    ops.push(SimOp::Alloc {
                        block: id as u64,
                        size,
                        stream: 0,
                    });
                }
            }
            EventKind::Free => {
                if issued.get(id).copied().unwrap_or(false) {
                    ops.push(SimOp::Free { block: id as u64 });
                }
            }
        }
        ops_through.push(ops.len());
    }
    (ops, ops_through)
}

/// Replays a schedule through the simulated allocator on one device, with
/// the target's cuBLAS workspace size, and returns one sample per schedule
/// event (fewer when the run ran out of memory).
pub fn simulate_schedule(
    schedule: &Schedule,
    target: &GpuTarget,
    allocator: &AllocatorConfig,
    device: &GpuMemory,
) -> SimulatedRun {
    let (ops, ops_through) = schedule_ops(schedule, target);
    let simulation = simulator::simulate(&ops, allocator, device);
    let op_samples = &simulation.after_event;
    let oom_op = simulation.oom.map(|oom| oom.event_index);
    let mut samples = Vec::with_capacity(schedule.events.len());
    let mut oom_at = None;
    for (event_index, &through) in ops_through.iter().enumerate() {
        if let Some(op) = oom_op {
            if through > op {
                oom_at = Some(event_index);
                if let Some(sample) = op_samples.get(op) {
                    samples.push(*sample);
                }
                break;
            }
        }
        let sample = through
            .checked_sub(1)
            .and_then(|last| op_samples.get(last))
            .copied()
            .unwrap_or_default();
        samples.push(sample);
    }
    SimulatedRun { samples, oom_at }
}

//! The orchestrator → simulator glue: a [`Schedule`] becomes simulator ops
//! for one GPU, and the simulation's samples come back per schedule event.
//! The estimate and the what-ifs share it.

use std::collections::HashSet;
use std::ops::ControlFlow;

use crate::orchestrator::{Category, EventKind, Schedule};
use crate::presets::GpuTarget;
use crate::program::{JobEvent, JobRef};
use crate::report::{Recorder, SimulatedRun};
use crate::simulator::{AllocatorConfig, GpuMemory, Runner, SimOp};
use crate::units::Bytes;

/// The simulator ops of a schedule on `target`: workspace blocks at the
/// target's cuBLAS workspace size (the first `cublas_workspaces` of them
/// only), blocks another architecture's kernels make and zero-byte blocks
/// skipped with their frees. Also returns, for each schedule event, the
/// number of ops issued up to and including it.
pub fn schedule_ops(schedule: &Schedule, target: &GpuTarget) -> (Vec<SimOp>, Vec<usize>) {
    let mut issued_size = Issued::on(target);
    let mut issued = vec![false; schedule.blocks.len()];
    let mut ops: Vec<SimOp> = Vec::with_capacity(schedule.events.len());
    let mut ops_through: Vec<usize> = Vec::with_capacity(schedule.events.len());
    for event in &schedule.events {
        let id = event.block.index();
        match event.kind {
            EventKind::Alloc => {
                let size = match schedule.blocks.get(id) {
                    Some(block) => issued_size.of(block.category, block.size_on(target)),
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

/// The sizes a simulation on one GPU issues its blocks at: each block's
/// size there, but only the first `cublas_workspaces` workspace blocks the
/// target makes (a handle per thread and stream), the others none.
struct Issued {
    workspaces_left: u32,
}

impl Issued {
    fn on(target: &GpuTarget) -> Issued {
        Issued {
            workspaces_left: target.overheads.cublas_workspaces,
        }
    }

    /// The size a block of `category` whose size on the target is `size`
    /// is issued at.
    fn of(&mut self, category: Category, size: Bytes) -> Bytes {
        if category != Category::Workspace || size == Bytes::ZERO {
            return size;
        }
        if self.workspaces_left == 0 {
            return Bytes::ZERO;
        }
        self.workspaces_left -= 1;
        size
    }
}

/// Replays a job through the simulated allocator on one device, with the
/// target's cuBLAS workspace size (the first `cublas_workspaces` workspace
/// blocks at it, the others and zero-byte blocks skipped with their frees),
/// handing the sample after each event to `recorder`; stops at an
/// out-of-memory error. `tick(n)` says every [`TICK`] events that `n` more
/// were simulated (at the end, the rest of the job's, simulated or not).
pub fn simulate_job(
    job: JobRef<'_>,
    target: &GpuTarget,
    allocator: &AllocatorConfig,
    device: &GpuMemory,
    mut recorder: Recorder,
    tick: &mut dyn FnMut(u64),
) -> SimulatedRun {
    let mut issued_size = Issued::on(target);
    let mut runner = Runner::new(
        allocator,
        device,
        usize::try_from(job.n_events()).unwrap_or(usize::MAX),
    );
    // Blocks never issued (zero bytes, workspaces past the count): their
    // frees are skipped too.
    let mut skipped: HashSet<u64> = HashSet::new();
    let mut index = 0usize;
    job.for_each(|e: &JobEvent| {
        let op = match e.kind {
            EventKind::Alloc => {
                let size = issued_size.of(e.category, e.size_on(target));
                if size > Bytes::ZERO {
                    Some(SimOp::Alloc {
                        block: e.block,
                        size,
                        stream: 0,
                    })
                } else {
                    skipped.insert(e.block);
                    None
                }
            }
            EventKind::Free => {
                let was_skipped = !skipped.is_empty() && skipped.remove(&e.block);
                (!was_skipped).then_some(SimOp::Free { block: e.block })
            }
        };
        let oom = op.is_some_and(|op| runner.step(index, &op).is_err());
        index += 1;
        if index as u64 % TICK == 0 {
            tick(TICK);
        }
        recorder.record(e.time, runner.sample());
        if oom {
            recorder.out_of_memory();
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    });
    tick(job.n_events().saturating_sub(index as u64 / TICK * TICK));
    recorder.finish()
}

/// Events between two progress ticks of a simulation.
pub const TICK: u64 = 1 << 16;

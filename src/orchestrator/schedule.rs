//! The orchestrator's output: the allocations and frees a CUDA run would make,
//! in order, each block tagged with what it is and where it comes from.

use serde::{Deserialize, Serialize};

pub use crate::analyzer::Phase;
use crate::units::{Bytes, Nanos};

/// What a block of device memory holds. The report's breakdown has one entry
/// per category (plus the allocator's cache and the CUDA context).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Model parameters (`model.to(device)`), persistent.
    Parameter,
    /// Model buffers such as BatchNorm running statistics, persistent.
    Buffer,
    /// Parameter gradients (`p.grad`).
    Gradient,
    /// Optimizer state (momentum, `exp_avg`, ...), persistent from the first step.
    OptimizerState,
    /// Tensors made in forward or backward that outlive the op that made them.
    Activation,
    /// The batch tensors from the data loader.
    Batch,
    /// Short-lived tensors: freed inside the op or optimizer step that made them.
    Temporary,
    /// cuBLAS workspaces: device overhead that goes through the allocator.
    Workspace,
    /// DistributedDataParallel's gradient buckets, persistent.
    Bucket,
    /// A generation's KV cache: keys and values kept from one call of the
    /// model to the next.
    KvCache,
    /// The quantized weights' quantisation state (bitsandbytes' absmax,
    /// code tables, `SCB`), persistent.
    QuantState,
}

impl Category {
    /// Every category, in breakdown order.
    pub const ALL: [Category; 11] = [
        Category::Parameter,
        Category::QuantState,
        Category::Buffer,
        Category::Gradient,
        Category::OptimizerState,
        Category::Bucket,
        Category::KvCache,
        Category::Activation,
        Category::Batch,
        Category::Temporary,
        Category::Workspace,
    ];
}

/// The index of a block in [`Schedule::blocks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BlockId(pub u32);

impl BlockId {
    /// The position of the block in [`Schedule::blocks`].
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// One block of device memory a CUDA run would request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledBlock {
    /// Requested size. For [`Category::Workspace`] blocks this is a placeholder
    /// replaced by the target GPU's workspace size at simulation time.
    pub size: Bytes,
    pub category: Category,
    /// The simulated iteration that allocates it; `None` for setup.
    pub iteration: Option<u32>,
    pub phase: Phase,
    /// The innermost op that allocated it, when known.
    pub op: Option<String>,
    /// The model layer (module path) that allocated it, when known.
    pub layer: Option<String>,
    /// The GPU architectures whose run makes it: a block of one kernel's
    /// (an attention backend's) is made only where that kernel runs.
    #[serde(default, skip_serializing_if = "crate::kernels::ArchSet::is_all")]
    pub on: crate::kernels::ArchSet,
    /// A block sized per GPU (a CUDA reduction's buffer): `size` is then a
    /// placeholder, as for workspaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_gpu: Option<crate::kernels::PerGpu>,
}

impl ScheduledBlock {
    /// The bytes the block has on `target` ([`bytes_on`]).
    pub fn size_on(&self, target: &crate::presets::GpuTarget) -> crate::units::Bytes {
        bytes_on(self.size, self.category, self.on, self.per_gpu, target)
    }
}

/// The bytes a block of `size`, `category`, made by the kernels of `on`
/// and sized `per_gpu` where that depends on the GPU, has on `target`:
/// zero when the target's architecture does not make it, the target's
/// cuBLAS workspace for a [`Category::Workspace`] block (how many of them
/// are made is the simulation's), the target's figure for a block sized per
/// GPU, else its size.
pub fn bytes_on(
    size: crate::units::Bytes,
    category: Category,
    on: crate::kernels::ArchSet,
    per_gpu: Option<crate::kernels::PerGpu>,
    target: &crate::presets::GpuTarget,
) -> crate::units::Bytes {
    if !on.contains(target.kernel_sm()) {
        crate::units::Bytes::ZERO
    } else if category == Category::Workspace {
        target.overheads.cublas_workspace_bytes
    } else {
        match per_gpu {
            Some(per_gpu) => crate::units::Bytes(per_gpu.bytes(target.device_limits())),
            None => size,
        }
    }
}

/// Whether an event allocates or frees its block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Alloc,
    Free,
}

/// One allocation or free, at a time on the schedule's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleEvent {
    /// Nanoseconds since the start of the schedule.
    pub time: Nanos,
    pub kind: EventKind,
    pub block: BlockId,
}

/// The time span of one simulated iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IterationSpan {
    pub index: u32,
    /// The captured iteration it was taken from (differs when iterations are
    /// repeated beyond the captured ones).
    pub source: u32,
    pub start: Nanos,
    pub end: Nanos,
}

/// One phase of one simulated iteration, on the schedule's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseWindow {
    /// The simulated iteration ([`IterationSpan::index`]).
    pub iteration: u32,
    pub phase: Phase,
    pub start: Nanos,
    pub end: Nanos,
}

/// The orchestrated allocation sequence.
///
/// Invariants: `events` is sorted by time (ties keep rule order); every block
/// is allocated exactly once and freed at most once, never before it is
/// allocated. Blocks never freed live to the end of the run.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Schedule {
    pub blocks: Vec<ScheduledBlock>,
    pub events: Vec<ScheduleEvent>,
    pub iterations: Vec<IterationSpan>,
    /// The phases of every simulated iteration, in time order.
    #[serde(default)]
    pub phases: Vec<PhaseWindow>,
    /// The kernels the schedule assumes, per architecture (an attention
    /// backend): what the report names for each GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<crate::kernels::KernelNote>,
}

impl Schedule {
    /// The block an id names.
    pub fn block(&self, id: BlockId) -> Option<&ScheduledBlock> {
        self.blocks.get(id.index())
    }

    /// Checks the invariants; returns a description of the first violation.
    pub fn check(&self) -> Result<(), String> {
        let mut state = vec![0u8; self.blocks.len()];
        let mut previous = None;
        for (index, event) in self.events.iter().enumerate() {
            if previous.is_some_and(|time| event.time < time) {
                return Err(format!("event {index} goes back in time"));
            }
            previous = Some(event.time);
            let Some(slot) = state.get_mut(event.block.index()) else {
                return Err(format!("event {index} names an unknown block"));
            };
            match (event.kind, *slot) {
                (EventKind::Alloc, 0) => *slot = 1,
                (EventKind::Free, 1) => *slot = 2,
                (kind, _) => {
                    return Err(format!(
                        "event {index} ({kind:?}) is out of order for block {}",
                        event.block.0
                    ))
                }
            }
        }
        if let Some(missing) = state.iter().position(|&s| s == 0) {
            return Err(format!("block {missing} is never allocated"));
        }
        Ok(())
    }
}

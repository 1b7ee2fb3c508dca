//! CUDA kernels as data: which kernel a CUDA run of an op picks on a GPU,
//! and what that kernel allocates through the caching allocator beside its
//! outputs (issue 32). No trace reading: the analyzer finds the calls
//! (`analyzer::kernels`), the orchestrator's kernel rules replace what the
//! CPU kernels allocated with this (`orchestrator::rules::kernels`).
//!
//! A kernel choice depends on the GPU's compute capability, so the
//! orchestrated schedule holds every architecture's blocks, each marked with
//! the set of architectures that make it ([`ArchSet`]); a simulation on one
//! GPU keeps the blocks of its architecture. GPUs of one architecture share
//! a schedule and a simulation; changing GPUs re-simulates, never
//! re-orchestrates.
//!
//! - [`attention`]: `scaled_dot_product_attention`'s backends (cuDNN,
//!   flash, memory-efficient, math), their selection and allocations;
//! - [`conv`]: cuDNN convolution workspaces under the default heuristics
//!   (an assumption: PyTorch cannot say which plan cuDNN picks);
//! - [`reduce`]: the global buffer a CUDA reduction (`sum`, `mean`) splits
//!   across thread blocks through, sized by the GPU's multiprocessors;
//! - [`softmax`]: the temporary a CUDA softmax backward multiplies the
//!   gradient by the output into.

pub mod attention;
pub mod conv;
pub mod reduce;
pub mod softmax;

use serde::{Deserialize, Serialize};

/// A GPU's compute capability (major, minor) as kernel selection reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Sm(pub u8, pub u8);

impl Sm {
    /// The architectures memcast tells apart, one bit each of an [`ArchSet`]:
    /// Volta, Turing, Ampere (data-centre, consumer), Ada, Hopper, Blackwell
    /// (data-centre, consumer).
    pub const KNOWN: [Sm; 8] = [
        Sm(7, 0),
        Sm(7, 5),
        Sm(8, 0),
        Sm(8, 6),
        Sm(8, 9),
        Sm(9, 0),
        Sm(10, 0),
        Sm(12, 0),
    ];

    /// The architecture assumed for a GPU given by its capacity alone: the
    /// A100's (sm80), the most common GPU for training and serving.
    pub const UNKNOWN_AS: Sm = Sm(8, 0);

    /// The known architecture this compute capability is counted with: the
    /// nearest known one at or below it (sm87 → sm86, sm121 → sm120, sm103 →
    /// sm100), or the oldest.
    pub fn known(self) -> Sm {
        Sm::KNOWN
            .iter()
            .rev()
            .copied()
            .find(|k| *k <= self)
            .unwrap_or(Sm(7, 0))
    }

    fn bit(self) -> u16 {
        let known = self.known();
        let index = Sm::KNOWN.iter().position(|&k| k == known).unwrap_or(0);
        1 << index
    }

    /// `sm90` for (9, 0).
    pub fn label(self) -> String {
        format!("sm{}{}", self.0, self.1)
    }
}

/// A set of architectures (of [`Sm::KNOWN`]): where a block of the schedule
/// is made. Every architecture by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ArchSet(u16);

impl ArchSet {
    /// Every architecture.
    pub const ALL: ArchSet = ArchSet((1 << Sm::KNOWN.len()) - 1);
    /// None.
    pub const NONE: ArchSet = ArchSet(0);

    /// The set of one architecture.
    pub fn of(sm: Sm) -> ArchSet {
        ArchSet(sm.bit())
    }

    /// Whether a GPU of compute capability `sm` is in the set.
    pub fn contains(self, sm: Sm) -> bool {
        self.0 & sm.bit() != 0
    }

    pub fn is_all(&self) -> bool {
        *self == ArchSet::ALL
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn union(self, other: ArchSet) -> ArchSet {
        ArchSet(self.0 | other.0)
    }

    pub fn minus(self, other: ArchSet) -> ArchSet {
        ArchSet(self.0 & !other.0)
    }

    /// The known architectures in the set, oldest first.
    pub fn members(self) -> impl Iterator<Item = Sm> {
        Sm::KNOWN.into_iter().filter(move |&sm| self.contains(sm))
    }
}

impl Default for ArchSet {
    fn default() -> ArchSet {
        ArchSet::ALL
    }
}

/// What a GPU's kernels size their launches by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLimits {
    pub multiprocessors: u32,
    pub max_threads_per_multiprocessor: u32,
}

/// `maxThreadsPerMultiProcessor` by compute capability (CUDA C Programming
/// Guide, compute capabilities table): 1,024 on Turing, 1,536 on sm86, sm89
/// and sm120, 2,048 elsewhere.
pub fn max_threads_per_multiprocessor(sm: Sm) -> u32 {
    match sm.known() {
        Sm(7, 5) => 1024,
        Sm(8, 6) | Sm(8, 9) | Sm(12, 0) => 1536,
        _ => 2048,
    }
}

/// A block whose size depends on the GPU it runs on beyond its architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PerGpu {
    /// A CUDA reduction's global buffer ([`reduce::global_buffer`]).
    ReduceBuffer(reduce::Shape),
    /// Its semaphores.
    ReduceSemaphores(reduce::Shape),
}

impl PerGpu {
    /// Its bytes on a GPU with these limits.
    pub fn bytes(self, gpu: DeviceLimits) -> u64 {
        match self {
            PerGpu::ReduceBuffer(shape) => reduce::global_buffer(shape, gpu).0,
            PerGpu::ReduceSemaphores(shape) => reduce::global_buffer(shape, gpu).1,
        }
    }
}

/// What the report says a kernel rule assumed on some GPUs: "attention:
/// cuDNN", with why, for the architectures in `on`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KernelNote {
    pub on: ArchSet,
    /// The op family: `attention`, `convolution`, ...
    pub family: String,
    /// The kernel and the reason it is picked there.
    pub choice: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_count_with_the_nearest_known_one_below() {
        assert_eq!(Sm(8, 7).known(), Sm(8, 6));
        assert_eq!(Sm(12, 1).known(), Sm(12, 0));
        assert_eq!(Sm(10, 3).known(), Sm(10, 0));
        assert_eq!(Sm(6, 1).known(), Sm(7, 0));
        let hopper = ArchSet::of(Sm(9, 0));
        assert!(hopper.contains(Sm(9, 0)) && !hopper.contains(Sm(8, 0)));
        assert!(ArchSet::ALL.contains(Sm(12, 1)));
        assert_eq!(
            ArchSet::of(Sm(7, 5))
                .union(hopper)
                .members()
                .collect::<Vec<_>>(),
            vec![Sm(7, 5), Sm(9, 0)]
        );
    }
}

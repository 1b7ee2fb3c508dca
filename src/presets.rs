//! GPU presets and the device memory that lives outside the caching allocator.
//!
//! Input: a GPU name (a lowercase slug such as `a100-80gb`) or a capacity
//! (`24GiB`, `80000MiB`, `12884377600`). Output: a [`GpuTarget`] with the
//! CUDA-visible capacity in exact bytes and the [`DeviceOverheads`] a CUDA
//! process pays on that architecture (CUDA context, cuBLAS workspaces).
//!
//! Every number here comes from `shared/docs/gpu-presets.md` and
//! `shared/docs/allocator.md` §12, and each row names its source. Capacities are
//! what `torch.cuda.get_device_properties(0).total_memory` reports (CUDA's
//! `totalGlobalMem`), not the marketing size and not the `nvidia-smi` total.
//! They vary with driver, ECC, OS and attached displays, so any capacity can also
//! be given directly.
//!
//! Invariants: pure data and parsing; no float arithmetic (decimal sizes are
//! parsed with integers and must come to a whole number of bytes).

use serde::{Deserialize, Serialize};

use crate::units::Bytes;

const MIB: u64 = Bytes::MIB;

/// A GPU architecture, as far as memory overheads depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    /// Compute capability 7.0.
    Volta,
    /// Compute capability 7.5.
    Turing,
    /// Compute capability 8.0 and 8.6.
    Ampere,
    /// Compute capability 8.9.
    Ada,
    /// Compute capability 9.0.
    Hopper,
    /// Compute capability 10.x and 12.x.
    Blackwell,
}

/// Where a GPU model is sold, to group GPUs for people choosing one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Segment {
    /// Server GPUs (Tesla, A/H/B/L-series data-centre parts).
    DataCentre,
    /// Professional workstation cards (RTX A/Ada professional line).
    Workstation,
    /// GeForce cards.
    Consumer,
}

impl Segment {
    /// Every segment, in the order the page lists them.
    pub const ALL: [Segment; 3] = [Segment::DataCentre, Segment::Workstation, Segment::Consumer];

    /// The segment's name as people say it.
    pub fn label(self) -> &'static str {
        match self {
            Segment::DataCentre => "data centre",
            Segment::Workstation => "workstation",
            Segment::Consumer => "consumer",
        }
    }
}

/// One GPU model as a CUDA process sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuPreset {
    /// Lowercase name used on the command line, e.g. `a100-80gb`.
    pub slug: &'static str,
    /// The name `nvidia-smi` prints.
    pub name: &'static str,
    pub arch: Arch,
    /// Where it is sold (groups the page's GPU chooser).
    pub segment: Segment,
    /// Compute capability, major and minor.
    pub compute_capability: (u8, u8),
    /// Streaming multiprocessors (`multiProcessorCount`): CUDA reductions
    /// size their grid, and their global buffers, by it (NVIDIA's product
    /// specifications).
    pub multiprocessors: u32,
    /// `nvidia-smi` total memory.
    pub nvidia_smi_total: Bytes,
    /// CUDA-visible memory (`totalGlobalMem` = torch `total_memory`): the
    /// capacity the simulation runs against.
    pub cuda_visible: Bytes,
    /// Where the numbers come from (gpu-presets.md; `[idx]` = public files whose
    /// repository was not recorded).
    pub source: &'static str,
}

/// Every preset, smallest capacity first. Capacities in exact bytes as reported
/// by deviceQuery where known; where only torch's `total_memory` print was found
/// (it prints whole MiB, rounded down) the value is that many MiB.
pub const PRESETS: &[GpuPreset] = &[
    GpuPreset {
        slug: "rtx-3060",
        name: "NVIDIA GeForce RTX 3060 12GB",
        arch: Arch::Ampere,
        segment: Segment::Consumer,
        compute_capability: (8, 6),
        multiprocessors: 28,
        nvidia_smi_total: Bytes(12_288 * MIB),
        cuda_visible: Bytes(12_884_377_600),
        source: "deviceQuery dumps, drivers 12.0-12.8, headless [idx]; nvidia-smi total typical, unverified",
    },
    GpuPreset {
        slug: "t4",
        name: "Tesla T4",
        arch: Arch::Turing,
        segment: Segment::DataCentre,
        compute_capability: (7, 5),
        multiprocessors: 40,
        nvidia_smi_total: Bytes(15_360 * MIB),
        cuda_visible: Bytes(15_843_721_216),
        source: "deviceQuery drv 11.2 [idx]; nvidia-smi total from modal-labs/modal-client#2797",
    },
    GpuPreset {
        slug: "rtx-4060-ti-16gb",
        name: "NVIDIA GeForce RTX 4060 Ti 16GB",
        arch: Arch::Ada,
        segment: Segment::Consumer,
        compute_capability: (8, 9),
        multiprocessors: 34,
        nvidia_smi_total: Bytes(16_380 * MIB),
        cuda_visible: Bytes(16_857_038_848),
        source: "thamada/nvidia-smi gls/RTX4060Ti_smi.py and RTX4060Ti_deviceQuery.py (drv 12.4)",
    },
    GpuPreset {
        slug: "v100-16gb",
        name: "Tesla V100-SXM2-16GB",
        arch: Arch::Volta,
        segment: Segment::DataCentre,
        compute_capability: (7, 0),
        multiprocessors: 80,
        nvidia_smi_total: Bytes(16_160 * MIB),
        cuda_visible: Bytes(16_928_342_016),
        source: "deviceQuery drv 12.4 [idx]; nvidia-smi total typical, unverified",
    },
    GpuPreset {
        slug: "l4",
        name: "NVIDIA L4",
        arch: Arch::Ada,
        segment: Segment::DataCentre,
        compute_capability: (8, 9),
        multiprocessors: 58,
        nvidia_smi_total: Bytes(23_034 * MIB),
        cuda_visible: Bytes(23_570_219_008),
        source: "thamada/nvidia-smi gls/L4_*.py (drv 12.4); modal-labs/modal-client#2797",
    },
    GpuPreset {
        slug: "a10",
        name: "NVIDIA A10",
        arch: Arch::Ampere,
        segment: Segment::DataCentre,
        compute_capability: (8, 6),
        multiprocessors: 72,
        nvidia_smi_total: Bytes(23_028 * MIB),
        cuda_visible: Bytes(23_609_475_072),
        source: "deviceQuery drv 12.2 [idx]; nvidia-smi total from modal-labs/modal-client#2797",
    },
    GpuPreset {
        slug: "a10g",
        name: "NVIDIA A10G",
        arch: Arch::Ampere,
        segment: Segment::DataCentre,
        compute_capability: (8, 6),
        multiprocessors: 80,
        nvidia_smi_total: Bytes(23_028 * MIB),
        cuda_visible: Bytes(22_587 * MIB),
        source: "torch total_memory=22587MB (cu130 nightly) [idx]; nvidia-smi total assumed same as A10, unverified",
    },
    GpuPreset {
        slug: "rtx-3090",
        name: "NVIDIA GeForce RTX 3090",
        arch: Arch::Ampere,
        segment: Segment::Consumer,
        compute_capability: (8, 6),
        multiprocessors: 82,
        nvidia_smi_total: Bytes(24_576 * MIB),
        cuda_visible: Bytes(25_327_697_920),
        source: "thamada/nvidia-smi gls/RTX3090_*.py (drv 12.6)",
    },
    GpuPreset {
        slug: "rtx-4090",
        name: "NVIDIA GeForce RTX 4090",
        arch: Arch::Ada,
        segment: Segment::Consumer,
        compute_capability: (8, 9),
        multiprocessors: 128,
        nvidia_smi_total: Bytes(24_564 * MIB),
        cuda_visible: Bytes(25_386_352_640),
        source: "thamada/nvidia-smi gls/RTX4090_*.py (drv 12.4, Linux; Windows reports 23028 MiB)",
    },
    GpuPreset {
        slug: "rtx-5090",
        name: "NVIDIA GeForce RTX 5090",
        arch: Arch::Blackwell,
        segment: Segment::Consumer,
        compute_capability: (12, 0),
        multiprocessors: 170,
        nvidia_smi_total: Bytes(32_607 * MIB),
        cuda_visible: Bytes(33_660_534_784),
        source: "deviceQuery dumps [idx]; nvidia-smi total typical, unverified",
    },
    GpuPreset {
        slug: "v100-32gb",
        name: "Tesla V100-SXM2-32GB",
        arch: Arch::Volta,
        segment: Segment::DataCentre,
        compute_capability: (7, 0),
        multiprocessors: 80,
        nvidia_smi_total: Bytes(32_510 * MIB),
        cuda_visible: Bytes(34_089_730_048),
        source: "deviceQuery drv 11.2/11.4 [idx]; nvidia-smi total typical, unverified",
    },
    GpuPreset {
        slug: "a100-40gb",
        name: "NVIDIA A100-SXM4-40GB",
        arch: Arch::Ampere,
        segment: Segment::DataCentre,
        compute_capability: (8, 0),
        multiprocessors: 108,
        nvidia_smi_total: Bytes(40_960 * MIB),
        cuda_visible: Bytes(42_298_834_944),
        source: "bottlerocket-os/bottlerocket#3873 (drv 12.2, same on PCIe); modal-labs/modal-client#2797",
    },
    GpuPreset {
        slug: "a40",
        name: "NVIDIA A40",
        arch: Arch::Ampere,
        segment: Segment::DataCentre,
        compute_capability: (8, 6),
        multiprocessors: 84,
        nvidia_smi_total: Bytes(46_068 * MIB),
        cuda_visible: Bytes(47_608_692_736),
        source: "thamada/nvidia-smi gls/A40x10_*.py",
    },
    GpuPreset {
        slug: "l40s",
        name: "NVIDIA L40S",
        arch: Arch::Ada,
        segment: Segment::DataCentre,
        compute_capability: (8, 9),
        multiprocessors: 142,
        nvidia_smi_total: Bytes(46_068 * MIB),
        cuda_visible: Bytes(47_803_596_800),
        source: "thamada/nvidia-smi gls/L40S_*.py (drv 12.4); modal-labs/modal-client#2797",
    },
    GpuPreset {
        slug: "rtx-6000-ada",
        name: "NVIDIA RTX 6000 Ada Generation",
        arch: Arch::Ada,
        segment: Segment::Workstation,
        compute_capability: (8, 9),
        multiprocessors: 142,
        nvidia_smi_total: Bytes(49_140 * MIB),
        cuda_visible: Bytes(51_002_867_712),
        source: "thamada/nvidia-smi gls/RTX6000Ada_x8_*.py",
    },
    GpuPreset {
        slug: "h100-pcie",
        name: "NVIDIA H100 PCIe",
        arch: Arch::Hopper,
        segment: Segment::DataCentre,
        compute_capability: (9, 0),
        multiprocessors: 114,
        nvidia_smi_total: Bytes(81_559 * MIB),
        cuda_visible: Bytes(81_008 * MIB),
        source: "torch total_memory=81008MB [idx]; nvidia-smi total assumed same as SXM, unverified",
    },
    GpuPreset {
        slug: "a100-80gb-pcie",
        name: "NVIDIA A100 80GB PCIe",
        arch: Arch::Ampere,
        segment: Segment::DataCentre,
        compute_capability: (8, 0),
        multiprocessors: 108,
        nvidia_smi_total: Bytes(81_920 * MIB),
        cuda_visible: Bytes(81_049 * MIB),
        source: "ekondis/mixbench#47 (Total global mem, drv 12.3)",
    },
    GpuPreset {
        slug: "h100-80gb",
        name: "NVIDIA H100 80GB HBM3",
        arch: Arch::Hopper,
        segment: Segment::DataCentre,
        compute_capability: (9, 0),
        multiprocessors: 132,
        nvidia_smi_total: Bytes(85_520_809_984),
        cuda_visible: Bytes(85_045_477_376),
        source: "thamada/nvidia-smi gls/H100SXMx8_*.py (drv 12.7); modal-labs/modal-client#2797",
    },
    GpuPreset {
        slug: "a100-80gb",
        name: "NVIDIA A100-SXM4-80GB",
        arch: Arch::Ampere,
        segment: Segment::DataCentre,
        compute_capability: (8, 0),
        multiprocessors: 108,
        nvidia_smi_total: Bytes(81_920 * MIB),
        cuda_visible: Bytes(85_100_068_864),
        source: "thamada/nvidia-smi gls/A100SXMx4_*.py (drv 12.5)",
    },
    GpuPreset {
        slug: "h100-nvl",
        name: "NVIDIA H100 NVL",
        arch: Arch::Hopper,
        segment: Segment::DataCentre,
        compute_capability: (9, 0),
        multiprocessors: 132,
        nvidia_smi_total: Bytes(95_830 * MIB),
        cuda_visible: Bytes(99_861_594_112),
        source: "thamada/nvidia-smi gls/H100NVLx2_*.py (drv 12.4)",
    },
    GpuPreset {
        slug: "h200",
        name: "NVIDIA H200",
        arch: Arch::Hopper,
        segment: Segment::DataCentre,
        compute_capability: (9, 0),
        multiprocessors: 132,
        nvidia_smi_total: Bytes(143_771 * MIB),
        cuda_visible: Bytes(143_156 * MIB),
        source: "torch total_memory=143156MB [idx]",
    },
    GpuPreset {
        slug: "b200",
        name: "NVIDIA B200",
        arch: Arch::Blackwell,
        segment: Segment::DataCentre,
        compute_capability: (10, 0),
        multiprocessors: 148,
        nvidia_smi_total: Bytes(183_359 * MIB),
        cuda_visible: Bytes(182_631 * MIB),
        source: "torch total_memory=182642MB / 182631MB [idx] (the lower value)",
    },
];

/// What an overhead row is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overhead {
    /// The CUDA context: outside the caching allocator.
    Context,
    /// One cuBLAS workspace: requested from the caching allocator.
    CublasWorkspace,
}

/// One row of the overhead table: a value and where it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverheadRow {
    pub kind: Overhead,
    /// What the value is.
    pub item: &'static str,
    /// The architectures it applies to.
    pub archs: &'static [Arch],
    pub bytes: Bytes,
    pub source: &'static str,
}

const PRE_HOPPER: &[Arch] = &[Arch::Volta, Arch::Turing, Arch::Ampere];
const ADA: &[Arch] = &[Arch::Ada];
const HOPPER_ON: &[Arch] = &[Arch::Hopper, Arch::Blackwell];
const NOT_HOPPER: &[Arch] = &[Arch::Volta, Arch::Turing, Arch::Ampere, Arch::Ada];

/// Device memory outside the tensors, per architecture: the CUDA context
/// (outside the caching allocator, allocator.md §12.1) and one cuBLAS
/// workspace (through the caching allocator, allocator.md §12.2), with sources.
pub const OVERHEADS: &[OverheadRow] = &[
    OverheadRow {
        kind: Overhead::Context,
        item: "cuda context (lazy module loading)",
        archs: PRE_HOPPER,
        bytes: Bytes(256 * MIB),
        source: "RTX 3090, torch 2.7.1+cu128, bare context 256 MiB: invoke-ai/InvokeAI#9413",
    },
    OverheadRow {
        kind: Overhead::Context,
        item: "cuda context (lazy module loading)",
        archs: ADA,
        bytes: Bytes(426 * MIB),
        source: "RTX 6000 Ada, torch 2.10.0+cu130, mem_get_info with allocator 0/0: 426 MiB: unslothai/unsloth-zoo PR #1053",
    },
    OverheadRow {
        kind: Overhead::Context,
        item: "cuda context (lazy module loading)",
        archs: HOPPER_ON,
        bytes: Bytes(512 * MIB),
        source: "planning figure 0.4-0.6 GiB for CUDA 12 + lazy loading (allocator.md 12.1); no sourced bare-context measurement on Hopper or Blackwell",
    },
    OverheadRow {
        kind: Overhead::CublasWorkspace,
        item: "cublas workspace per (thread, stream), default :4096:2:16:8",
        archs: NOT_HOPPER,
        bytes: Bytes(8_519_680),
        source: "CUBLAS_WORKSPACE_CONFIG default = 2 x 4 MiB + 8 x 16 KiB: pytorch/pytorch#89027, #91564",
    },
    OverheadRow {
        kind: Overhead::CublasWorkspace,
        item: "cublas workspace per (thread, stream), sm_90 and later",
        archs: HOPPER_ON,
        bytes: Bytes(32 * MIB),
        source: "32 MiB on Hopper: pytorch/pytorch#120925; Blackwell (10.x/12.x) re-enabled in #175344",
    },
];

/// Workspaces a training step holds: the main thread (forward) and the
/// autograd device thread (backward), each with its own handle (allocator.md
/// §12.2; seen as two 32 MiB segments in Hopper snapshots).
pub const CUBLAS_WORKSPACES_PER_TRAINING_RUN: u32 = 2;

/// What a CUDA process pays on one device besides its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceOverheads {
    /// CUDA context and loaded kernels: outside the caching allocator.
    pub context_bytes: Bytes,
    /// Size of one cuBLAS workspace: requested from the caching allocator.
    pub cublas_workspace_bytes: Bytes,
    /// How many workspaces the run allocates (one per thread and stream).
    pub cublas_workspaces: u32,
}

impl DeviceOverheads {
    /// The overheads for an architecture, from [`OVERHEADS`].
    pub fn for_arch(arch: Arch) -> DeviceOverheads {
        let lookup = |kind: Overhead| {
            OVERHEADS
                .iter()
                .find(|row| row.kind == kind && row.archs.contains(&arch))
                .map_or(Bytes::ZERO, |row| row.bytes)
        };
        DeviceOverheads {
            context_bytes: lookup(Overhead::Context),
            cublas_workspace_bytes: lookup(Overhead::CublasWorkspace),
            cublas_workspaces: CUBLAS_WORKSPACES_PER_TRAINING_RUN,
        }
    }

    /// Overheads for a device given only by its capacity: the architecture is
    /// unknown, so this assumes the pre-Hopper values (Ampere).
    pub fn for_unknown_arch() -> DeviceOverheads {
        DeviceOverheads::for_arch(Arch::Ampere)
    }
}

/// A GPU to evaluate: a preset or a custom capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuTarget {
    /// The preset slug, or the capacity as the user wrote it.
    pub name: String,
    /// Whether `name` is a preset slug.
    pub is_preset: bool,
    /// The architecture, when known.
    pub arch: Option<Arch>,
    /// The compute capability, when known (a preset's).
    #[serde(default)]
    pub sm: Option<crate::kernels::Sm>,
    /// Streaming multiprocessors, when known (a preset's).
    #[serde(default)]
    pub multiprocessors: Option<u32>,
    /// CUDA-visible capacity.
    pub capacity: Bytes,
    pub overheads: DeviceOverheads,
}

impl GpuTarget {
    /// The target for a preset.
    pub fn from_preset(preset: &GpuPreset) -> GpuTarget {
        let (major, minor) = preset.compute_capability;
        GpuTarget {
            name: preset.slug.to_owned(),
            is_preset: true,
            arch: Some(preset.arch),
            sm: Some(crate::kernels::Sm(major, minor)),
            multiprocessors: Some(preset.multiprocessors),
            capacity: preset.cuda_visible,
            overheads: DeviceOverheads::for_arch(preset.arch),
        }
    }

    /// The architecture whose kernels the simulation of this GPU assumes:
    /// its own, or [`crate::kernels::Sm::UNKNOWN_AS`] for a capacity given
    /// alone.
    pub fn kernel_sm(&self) -> crate::kernels::Sm {
        self.sm.unwrap_or(crate::kernels::Sm::UNKNOWN_AS).known()
    }

    /// What CUDA kernels size their grids by on this GPU: its
    /// multiprocessors (an A100's 108 for a capacity given alone) and the
    /// threads each runs at most (by compute capability).
    pub fn device_limits(&self) -> crate::kernels::DeviceLimits {
        crate::kernels::DeviceLimits {
            multiprocessors: self.multiprocessors.unwrap_or(108),
            max_threads_per_multiprocessor: crate::kernels::max_threads_per_multiprocessor(
                self.kernel_sm(),
            ),
        }
    }
}

/// A GPU name or size that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PresetError {
    #[error("unknown gpu: use a preset name listed by `memcast presets` or a capacity such as 24GiB, 80000MiB or 12884377600, got {0:?}")]
    Unknown(String),
    #[error("gpu capacity must be more than zero bytes, got {0:?}")]
    Zero(String),
    #[error("gpu capacity must be a whole number of bytes below 16 EiB, got {0:?}")]
    NotWholeBytes(String),
}

/// The preset with this slug (case-insensitive).
pub fn find(slug: &str) -> Option<&'static GpuPreset> {
    PRESETS
        .iter()
        .find(|preset| preset.slug.eq_ignore_ascii_case(slug.trim()))
}

/// Parses `NAME|SIZE`: a preset slug (`a100-80gb`), or a capacity in bytes
/// (`12884377600`, `12884377600B`), binary units (`KiB`, `MiB`, `GiB`, `TiB`)
/// or decimal units (`KB`, `MB`, `GB`, `TB`), with an optional decimal
/// fraction (`23.5GiB`). Units are case-insensitive. A custom capacity has an
/// unknown architecture and gets [`DeviceOverheads::for_unknown_arch`].
pub fn parse_gpu(spec: &str) -> Result<GpuTarget, PresetError> {
    let text = spec.trim();
    if let Some(preset) = find(text) {
        return Ok(GpuTarget::from_preset(preset));
    }
    let capacity = parse_size(text)?;
    Ok(GpuTarget {
        name: text.to_owned(),
        is_preset: false,
        arch: None,
        sm: None,
        multiprocessors: None,
        capacity,
        overheads: DeviceOverheads::for_unknown_arch(),
    })
}

/// Parses a byte size such as `24GiB`, `80000MiB`, `1.5GB` or `12884377600`.
pub fn parse_size(text: &str) -> Result<Bytes, PresetError> {
    let unknown = || PresetError::Unknown(text.to_owned());
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => Bytes::KIB,
        "mib" => Bytes::MIB,
        "gib" => Bytes::GIB,
        "tib" => Bytes::GIB * 1024,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(unknown()),
    };
    let (whole, fraction) = match number.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (number, ""),
    };
    if whole.is_empty() && fraction.is_empty() {
        return Err(unknown());
    }
    if !whole.chars().all(|c| c.is_ascii_digit()) || !fraction.chars().all(|c| c.is_ascii_digit()) {
        return Err(unknown());
    }
    let not_whole = || PresetError::NotWholeBytes(text.to_owned());
    let parse = |digits: &str| -> Result<u128, PresetError> {
        if digits.is_empty() {
            Ok(0)
        } else {
            digits.parse::<u128>().map_err(|_| not_whole())
        }
    };
    if fraction.len() > 18 {
        return Err(not_whole());
    }
    let scale = 10u128.pow(fraction.len() as u32);
    let numerator = parse(whole)?
        .checked_mul(scale)
        .and_then(|value| value.checked_add(parse(fraction).ok()?))
        .and_then(|value| value.checked_mul(u128::from(multiplier)))
        .ok_or_else(not_whole)?;
    if numerator % scale != 0 {
        return Err(not_whole());
    }
    let bytes = u64::try_from(numerator / scale).map_err(|_| not_whole())?;
    if bytes == 0 {
        return Err(PresetError::Zero(text.to_owned()));
    }
    Ok(Bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_unique_lowercase_and_capacities_below_the_smi_total() {
        let mut slugs: Vec<&str> = PRESETS.iter().map(|p| p.slug).collect();
        slugs.sort_unstable();
        slugs.dedup();
        assert_eq!(slugs.len(), PRESETS.len());
        for preset in PRESETS {
            assert_eq!(preset.slug, preset.slug.to_ascii_lowercase());
            // nvidia-smi rounds to whole MiB.
            assert!(
                preset.cuda_visible.get() <= preset.nvidia_smi_total.get() + MIB,
                "{preset:?}"
            );
            assert!(!preset.source.is_empty());
        }
    }

    #[test]
    fn the_issue_presets_exist_with_exact_bytes() {
        for slug in [
            "a100-40gb",
            "a100-80gb",
            "h100-80gb",
            "h200",
            "l4",
            "t4",
            "rtx-3060",
            "rtx-4090",
        ] {
            assert!(find(slug).is_some(), "{slug}");
        }
        assert_eq!(
            parse_gpu("h100-80gb").unwrap().capacity,
            Bytes(85_045_477_376)
        );
        assert_eq!(
            parse_gpu("A100-80GB").unwrap().capacity,
            Bytes(85_100_068_864)
        );
        assert_eq!(
            parse_gpu("rtx-3060").unwrap().capacity,
            Bytes(12_884_377_600)
        );
    }

    #[test]
    fn presets_are_sorted_by_capacity() {
        let capacities: Vec<Bytes> = PRESETS.iter().map(|p| p.cuda_visible).collect();
        let mut sorted = capacities.clone();
        sorted.sort();
        assert_eq!(capacities, sorted);
    }

    #[test]
    fn sizes_parse_exactly() {
        assert_eq!(parse_size("24GiB"), Ok(Bytes(24 * Bytes::GIB)));
        assert_eq!(parse_size("80000MiB"), Ok(Bytes(80_000 * Bytes::MIB)));
        assert_eq!(parse_size("12884377600"), Ok(Bytes(12_884_377_600)));
        assert_eq!(parse_size("12884377600B"), Ok(Bytes(12_884_377_600)));
        assert_eq!(parse_size("1.5gib"), Ok(Bytes(3 * Bytes::GIB / 2)));
        assert_eq!(parse_size("16GB"), Ok(Bytes(16_000_000_000)));
        assert_eq!(parse_size(".5KiB"), Ok(Bytes(512)));
    }

    #[test]
    fn bad_sizes_are_errors_that_quote_the_input() {
        assert_eq!(
            parse_gpu("a100"),
            Err(PresetError::Unknown("a100".to_owned()))
        );
        assert!(matches!(parse_size("0GiB"), Err(PresetError::Zero(_))));
        assert!(matches!(
            parse_size("1.0000001KiB"),
            Err(PresetError::NotWholeBytes(_))
        ));
        assert!(matches!(
            parse_size("99999999999TiB"),
            Err(PresetError::NotWholeBytes(_))
        ));
        assert!(matches!(parse_size("GiB"), Err(PresetError::Unknown(_))));
        assert!(matches!(
            parse_size("1.2.3GiB"),
            Err(PresetError::Unknown(_))
        ));
        assert!(matches!(parse_size(""), Err(PresetError::Unknown(_))));
        let message = parse_gpu("a100").unwrap_err().to_string();
        assert!(message.ends_with("\"a100\""), "{message}");
    }

    #[test]
    fn every_architecture_has_exactly_one_row_of_each_overhead() {
        for arch in [
            Arch::Volta,
            Arch::Turing,
            Arch::Ampere,
            Arch::Ada,
            Arch::Hopper,
            Arch::Blackwell,
        ] {
            for kind in [Overhead::Context, Overhead::CublasWorkspace] {
                let rows = OVERHEADS
                    .iter()
                    .filter(|row| row.kind == kind && row.archs.contains(&arch))
                    .count();
                assert_eq!(rows, 1, "{arch:?} {kind:?}");
            }
        }
        assert!(OVERHEADS.iter().all(|row| !row.source.is_empty()));
    }

    #[test]
    fn overheads_follow_the_architecture() {
        let hopper = DeviceOverheads::for_arch(Arch::Hopper);
        assert_eq!(hopper.cublas_workspace_bytes, Bytes(32 * MIB));
        let ampere = DeviceOverheads::for_arch(Arch::Ampere);
        assert_eq!(ampere.cublas_workspace_bytes, Bytes(8_519_680));
        assert_eq!(ampere.context_bytes, Bytes(256 * MIB));
        assert_eq!(ampere.cublas_workspaces, 2);
        for arch in [
            Arch::Volta,
            Arch::Turing,
            Arch::Ampere,
            Arch::Ada,
            Arch::Hopper,
            Arch::Blackwell,
        ] {
            let overheads = DeviceOverheads::for_arch(arch);
            assert!(overheads.context_bytes > Bytes::ZERO, "{arch:?}");
            assert!(overheads.cublas_workspace_bytes > Bytes::ZERO, "{arch:?}");
        }
        let custom = parse_gpu("24GiB").unwrap();
        assert_eq!(custom.arch, None);
        assert_eq!(custom.overheads, ampere);
    }
}

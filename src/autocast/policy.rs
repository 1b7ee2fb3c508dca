//! PyTorch's autocast policy as data: which ops each device's autocast runs
//! in lower precision, in fp32 or in the widest input type, and which casts
//! it caches, for the PyTorch versions in [`VERSIONS`].
//!
//! Sources (read, then written out here as data; no code was copied):
//! - `pytorch/pytorch` `aten/src/ATen/autocast_mode.h` at commit
//!   `d70fe7f33910bbe8bc8b6027388a84bb102a453d`: the op lists the CUDA
//!   registrations expand (`AT_FORALL_LOWER_PRECISION_FP`, `AT_FORALL_FP32`,
//!   `AT_FORALL_FP32_SET_OPT_DTYPE`, `AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE`,
//!   `AT_FORALL_PROMOTE`) and the `CastPolicy` wrappers: `lower_precision_fp`
//!   and `fp32` cast every floating input, `fp32_set_opt_dtype` only sets the
//!   op's output dtype (no input copy), `promote` casts to the widest input.
//! - `pytorch/pytorch` `aten/src/ATen/autocast_mode.cpp` at commit
//!   `008ec6b1840c94ff6d0f685bc10fbf585167c673`: the `AutocastCPU` list
//!   (`KERNEL_CPU` statements), `cached_cast` (a lower-precision cast of an
//!   fp32 leaf that requires grad and is not a view is cached, keyed by the
//!   source tensor; every other cast is made anew) and `clear_cache`.
//! - `torch/amp/autocast_mode.py` of torch 2.15.0: `__exit__` clears the cache
//!   when the outermost autocast region exits (`autocast_decrement_nesting()
//!   == 0`); the nesting counter and the cache are shared by all devices.
//! - pytorch/pytorch PR #165068 (merged December 2025): no caching under
//!   `inference_mode` (`!c10::InferenceMode::is_enabled()`), caching under
//!   `no_grad` kept. pytorch/pytorch PR #174824 (released in 2.12): `rms_norm`
//!   joins the CUDA fp32 list (absent from 2.6 to 2.11, per the
//!   `torch._C._dispatch_dump` bisection in huggingface/diffusers PR #14160).
//! - A runtime check of the installed torch 2.15.0+cu132 (git d0f2af8b66b2):
//!   the ops with an `AutocastCUDA` / `AutocastCPU` kernel
//!   (`torch._C._dispatch_has_kernel_for_dispatch_key`) are exactly the ones
//!   listed here for [`TORCH_2_12`]; the output dtype of the 81 CUDA ops for
//!   which OpInfo has a sample, run on fake CUDA tensors under CUDA autocast,
//!   is the one their list implies; and the cache is hit for a parameter with
//!   grad and under `no_grad`, missed for a frozen weight and under
//!   `inference_mode`, and never involved in `einsum` on the CPU (not listed:
//!   its inner `bmm` casts views). Of the 81 CUDA ops with a sample, 51 gave
//!   fp32, 20 the lower type and 10 kept their input's type (promote), as listed.

use serde::{Deserialize, Serialize};

/// The device whose autocast policy applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    Cpu,
    Cuda,
}

/// What autocast does to an op's floating inputs (`at::autocast::CastPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CastPolicy {
    /// `lower_precision_fp`: every fp32 input is cast to the autocast dtype
    /// (a new tensor; cached for fp32 leaves that require grad); the output
    /// is in the autocast dtype.
    Lower,
    /// `fp32`: every lower-precision input is cast to fp32 (a new tensor);
    /// the output is fp32.
    Fp32,
    /// `fp32_set_opt_dtype`: the op is asked for an fp32 output through its
    /// `dtype` argument; inputs are not copied.
    Fp32SetOptDtype,
    /// `fp32_append_dtype` (`norm`): like [`CastPolicy::Fp32SetOptDtype`],
    /// through the overload that takes a dtype.
    Fp32AppendDtype,
    /// `promote`: inputs are cast to the widest floating input type.
    Promote,
    /// Refused under CUDA autocast (`binary_cross_entropy` raises).
    Banned,
}

impl CastPolicy {
    /// The output is fp32 whatever the inputs.
    pub const fn outputs_fp32(self) -> bool {
        matches!(
            self,
            CastPolicy::Fp32 | CastPolicy::Fp32SetOptDtype | CastPolicy::Fp32AppendDtype
        )
    }
}

/// Where a fact of this module comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    pub repository: &'static str,
    pub path: &'static str,
    /// A commit, a pull request or a version.
    pub at: &'static str,
    pub what: &'static str,
}

/// The sources of the tables, as the version table cites them.
pub const SOURCES: &[Source] = &[
    Source {
        repository: "pytorch/pytorch",
        path: "aten/src/ATen/autocast_mode.h",
        at: "d70fe7f33910bbe8bc8b6027388a84bb102a453d",
        what: "AT_FORALL_* op lists of the CUDA policy; the CastPolicy wrappers",
    },
    Source {
        repository: "pytorch/pytorch",
        path: "aten/src/ATen/autocast_mode.cpp",
        at: "008ec6b1840c94ff6d0f685bc10fbf585167c673",
        what: "the AutocastCPU list; cached_cast, clear_cache",
    },
    Source {
        repository: "pytorch/pytorch",
        path: "torch/amp/autocast_mode.py",
        at: "2.15.0",
        what: "the cache is cleared when the outermost region exits",
    },
    Source {
        repository: "pytorch/pytorch",
        path: "aten/src/ATen/autocast_mode.cpp",
        at: "PR #165068",
        what: "no cast caching under inference_mode",
    },
    Source {
        repository: "pytorch/pytorch",
        path: "aten/src/ATen/autocast_mode.h",
        at: "PR #174824 (2.12)",
        what: "rms_norm in the CUDA fp32 list",
    },
    Source {
        repository: "local",
        path: "torch 2.15.0+cu132 (git d0f2af8b66b2), dispatcher and fake CUDA tensors",
        at: "2.15.0",
        what: "runtime check of the lists, of 81 CUDA output dtypes and of the cache",
    },
];

/// One PyTorch version range with the same autocast behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyVersion {
    /// The name a user picks it by.
    pub name: &'static str,
    /// The PyTorch releases it covers.
    pub torch: &'static str,
    /// `rms_norm` is in the CUDA fp32 list.
    pub rms_norm_fp32: bool,
    /// Casts are cached under `torch.inference_mode` too.
    pub caches_in_inference_mode: bool,
    /// CUDA's memory-efficient attention takes fewer key/value heads than
    /// query heads (grouped-query attention); before, such an fp32 call
    /// falls to the math backend ([`crate::kernels::attention`]).
    pub efficient_attention_gqa: bool,
    /// How the entry was established.
    pub evidence: &'static str,
}

/// The supported versions, newest first; the first is the default.
pub const VERSIONS: &[PolicyVersion] = &[
    PolicyVersion {
        name: "2.12",
        torch: "2.12 to 2.15",
        rms_norm_fp32: true,
        caches_in_inference_mode: false,
        efficient_attention_gqa: true,
        evidence: "source lists checked at run time on torch 2.15.0; grouped-query attention in the memory-efficient kernel from the 2.13 and 2.14 sources (2.12 assumed)",
    },
    PolicyVersion {
        name: "2.10",
        torch: "2.10 and 2.11",
        rms_norm_fp32: false,
        caches_in_inference_mode: false,
        efficient_attention_gqa: false,
        evidence: "the 2.12 lists without rms_norm (PR #174824); no inference_mode caching (PR #165068) seen on torch 2.11 on an H200 (casts under inference_mode freed at once, under no_grad kept to the region's exit), its presence in 2.10 assumed; the memory-efficient attention kernel refuses grouped-query attention on 2.11 (_fused_sdp_choice on the H200)",
    },
    PolicyVersion {
        name: "2.9",
        torch: "2.6 to 2.9",
        rms_norm_fp32: false,
        caches_in_inference_mode: true,
        efficient_attention_gqa: false,
        evidence: "the 2.12 lists without rms_norm; cached_cast before PR #165068",
    },
];

impl PolicyVersion {
    /// The version named `name` (`"2.12"`, `"2.10"`, `"2.9"`).
    pub fn named(name: &str) -> Option<&'static PolicyVersion> {
        VERSIONS.iter().find(|v| v.name == name)
    }

    /// The newest version, the default when the trace does not say.
    pub fn latest() -> &'static PolicyVersion {
        &VERSIONS[0]
    }
}

/// The policy `device`'s autocast applies to the op named `op` (as the
/// profiler names it, `aten::exp`, or bare, `exp`), `None` when the op is not
/// listed (autocast lets it run on whatever types it gets).
pub fn policy_of(version: &PolicyVersion, device: Device, op: &str) -> Option<CastPolicy> {
    let name = op.strip_prefix("aten::").unwrap_or(op);
    if device == Device::Cuda && name == "rms_norm" && !version.rms_norm_fp32 {
        return None;
    }
    let table = match device {
        Device::Cuda => CUDA_OPS,
        Device::Cpu => CPU_OPS,
    };
    table
        .binary_search_by(|(n, _)| (*n).cmp(name))
        .ok()
        .and_then(|i| table.get(i))
        .map(|&(_, policy)| policy)
}

use CastPolicy as Policy;

/// The CUDA list (`AutocastCUDA`): `AT_FORALL_*` of autocast_mode.h plus
/// `_cudnn_rnn` (registered in `aten/src/ATen/native/cudnn/AutocastRNN.cpp`,
/// lower precision) and `rms_norm` (fp32 from 2.12). Sorted by name.
const CUDA_OPS: &[(&str, Policy)] = &[
    ("_convolution", Policy::Lower),
    ("_cudnn_rnn", Policy::Lower),
    ("_scaled_dot_product_flash_attention", Policy::Lower),
    ("_thnn_fused_gru_cell", Policy::Lower),
    ("_thnn_fused_lstm_cell", Policy::Lower),
    ("_upsample_bicubic2d_aa", Policy::Fp32),
    ("_upsample_bilinear2d_aa", Policy::Fp32),
    ("_upsample_nearest_exact1d", Policy::Fp32),
    ("_upsample_nearest_exact2d", Policy::Fp32),
    ("_upsample_nearest_exact3d", Policy::Fp32),
    ("acos", Policy::Fp32),
    ("addbmm", Policy::Lower),
    ("addcdiv", Policy::Promote),
    ("addcmul", Policy::Promote),
    ("addmm", Policy::Lower),
    ("addmv", Policy::Lower),
    ("addr", Policy::Lower),
    ("asin", Policy::Fp32),
    ("atan2", Policy::Promote),
    ("baddbmm", Policy::Lower),
    ("bilinear", Policy::Promote),
    ("binary_cross_entropy", Policy::Banned),
    ("binary_cross_entropy_with_logits", Policy::Fp32),
    ("bmm", Policy::Lower),
    ("cdist", Policy::Fp32),
    ("chain_matmul", Policy::Lower),
    ("conv1d", Policy::Lower),
    ("conv2d", Policy::Lower),
    ("conv3d", Policy::Lower),
    ("conv_tbc", Policy::Lower),
    ("conv_transpose1d", Policy::Lower),
    ("conv_transpose2d", Policy::Lower),
    ("conv_transpose3d", Policy::Lower),
    ("convolution", Policy::Lower),
    ("cosh", Policy::Fp32),
    ("cosine_embedding_loss", Policy::Fp32),
    ("cosine_similarity", Policy::Fp32),
    ("cross", Policy::Promote),
    ("cudnn_convolution", Policy::Lower),
    ("cudnn_convolution_transpose", Policy::Lower),
    ("cumprod", Policy::Fp32SetOptDtype),
    ("cumsum", Policy::Fp32SetOptDtype),
    ("dist", Policy::Fp32),
    ("dot", Policy::Promote),
    ("einsum", Policy::Lower),
    ("erfinv", Policy::Fp32),
    ("exp", Policy::Fp32),
    ("expm1", Policy::Fp32),
    ("frobenius_norm", Policy::Fp32),
    ("grid_sampler", Policy::Promote),
    ("group_norm", Policy::Fp32),
    ("gru_cell", Policy::Lower),
    ("hinge_embedding_loss", Policy::Fp32),
    ("huber_loss", Policy::Fp32),
    ("index_put", Policy::Promote),
    ("kl_div", Policy::Fp32),
    ("l1_loss", Policy::Fp32),
    ("layer_norm", Policy::Fp32),
    ("linalg_matrix_norm", Policy::Fp32SetOptDtype),
    ("linalg_matrix_sqrth", Policy::Fp32),
    ("linalg_multi_dot", Policy::Lower),
    ("linalg_vecdot", Policy::Lower),
    ("linalg_vector_norm", Policy::Fp32SetOptDtype),
    ("linear", Policy::Lower),
    ("log", Policy::Fp32),
    ("log10", Policy::Fp32),
    ("log1p", Policy::Fp32),
    ("log2", Policy::Fp32),
    ("log_softmax", Policy::Fp32SetOptDtype),
    ("logsumexp", Policy::Fp32),
    ("lstm_cell", Policy::Lower),
    ("margin_ranking_loss", Policy::Fp32),
    ("matmul", Policy::Lower),
    ("mm", Policy::Lower),
    ("mse_loss", Policy::Fp32),
    ("multi_margin_loss", Policy::Fp32),
    ("multilabel_margin_loss", Policy::Fp32),
    ("mv", Policy::Lower),
    ("native_layer_norm", Policy::Fp32),
    ("nll_loss", Policy::Fp32),
    ("nll_loss2d", Policy::Fp32),
    ("norm", Policy::Fp32AppendDtype),
    ("nuclear_norm", Policy::Fp32),
    ("pdist", Policy::Fp32),
    ("poisson_nll_loss", Policy::Fp32),
    ("pow", Policy::Fp32),
    ("prelu", Policy::Lower),
    ("prod", Policy::Fp32SetOptDtype),
    ("reciprocal", Policy::Fp32),
    ("renorm", Policy::Fp32),
    ("rms_norm", Policy::Fp32),
    ("rnn_relu_cell", Policy::Lower),
    ("rnn_tanh_cell", Policy::Lower),
    ("rsqrt", Policy::Fp32),
    ("scaled_dot_product_attention", Policy::Lower),
    ("scatter_add", Policy::Promote),
    ("sinh", Policy::Fp32),
    ("smooth_l1_loss", Policy::Fp32),
    ("soft_margin_loss", Policy::Fp32),
    ("softmax", Policy::Fp32SetOptDtype),
    ("softplus", Policy::Fp32),
    ("sum", Policy::Fp32SetOptDtype),
    ("tan", Policy::Fp32),
    ("tensordot", Policy::Promote),
    ("triplet_margin_loss", Policy::Fp32),
    ("upsample_bicubic2d", Policy::Fp32),
    ("upsample_bilinear2d", Policy::Fp32),
    ("upsample_linear1d", Policy::Fp32),
    ("upsample_nearest1d", Policy::Fp32),
    ("upsample_nearest2d", Policy::Fp32),
    ("upsample_nearest3d", Policy::Fp32),
    ("upsample_trilinear3d", Policy::Fp32),
    ("vdot", Policy::Promote),
];

/// The CPU list (`AutocastCPU`, the `KERNEL_CPU` statements of
/// autocast_mode.cpp as torch 2.15.0 registers them). Sorted by name.
const CPU_OPS: &[(&str, Policy)] = &[
    ("_addmm_activation", Policy::Lower),
    ("_convolution", Policy::Lower),
    ("_grid_sampler_2d_cpu_fallback", Policy::Fp32),
    ("_lu_with_info", Policy::Fp32),
    ("_native_multi_head_attention", Policy::Lower),
    ("adaptive_avg_pool3d", Policy::Fp32),
    ("adaptive_max_pool3d", Policy::Fp32),
    ("addbmm", Policy::Lower),
    ("addmm", Policy::Lower),
    ("avg_pool3d", Policy::Fp32),
    ("baddbmm", Policy::Lower),
    ("binary_cross_entropy", Policy::Fp32),
    ("binary_cross_entropy_with_logits", Policy::Fp32),
    ("bmm", Policy::Lower),
    ("cat", Policy::Promote),
    ("cdist", Policy::Fp32),
    ("cholesky_inverse", Policy::Fp32),
    ("cholesky_solve", Policy::Fp32),
    ("conv1d", Policy::Lower),
    ("conv2d", Policy::Lower),
    ("conv3d", Policy::Lower),
    ("conv_tbc", Policy::Lower),
    ("conv_transpose1d", Policy::Lower),
    ("conv_transpose2d", Policy::Lower),
    ("conv_transpose3d", Policy::Lower),
    ("cosine_embedding_loss", Policy::Fp32),
    ("cross_entropy_loss", Policy::Fp32),
    ("ctc_loss", Policy::Fp32),
    ("fake_quantize_per_tensor_affine", Policy::Fp32),
    ("fft_fft", Policy::Fp32),
    ("fft_fft2", Policy::Fp32),
    ("fft_fftn", Policy::Fp32),
    ("fft_hfft", Policy::Fp32),
    ("fft_ifft", Policy::Fp32),
    ("fft_ifft2", Policy::Fp32),
    ("fft_ifftn", Policy::Fp32),
    ("fft_ihfft", Policy::Fp32),
    ("fft_irfft", Policy::Fp32),
    ("fft_irfft2", Policy::Fp32),
    ("fft_irfftn", Policy::Fp32),
    ("fft_rfft", Policy::Fp32),
    ("fft_rfft2", Policy::Fp32),
    ("fft_rfftn", Policy::Fp32),
    ("fractional_max_pool2d", Policy::Fp32),
    ("fractional_max_pool3d", Policy::Fp32),
    ("geqrf", Policy::Fp32),
    ("grid_sampler", Policy::Fp32),
    ("grid_sampler_2d", Policy::Fp32),
    ("grid_sampler_3d", Policy::Fp32),
    ("hinge_embedding_loss", Policy::Fp32),
    ("huber_loss", Policy::Fp32),
    ("index_copy", Policy::Promote),
    ("inverse", Policy::Fp32),
    ("kl_div", Policy::Fp32),
    ("l1_loss", Policy::Fp32),
    ("linalg_cholesky", Policy::Fp32),
    ("linalg_cholesky_ex", Policy::Fp32),
    ("linalg_cond", Policy::Fp32),
    ("linalg_eig", Policy::Fp32),
    ("linalg_eigh", Policy::Fp32),
    ("linalg_eigvals", Policy::Fp32),
    ("linalg_eigvalsh", Policy::Fp32),
    ("linalg_householder_product", Policy::Fp32),
    ("linalg_inv", Policy::Fp32),
    ("linalg_inv_ex", Policy::Fp32),
    ("linalg_lstsq", Policy::Fp32),
    ("linalg_matrix_rank", Policy::Fp32),
    ("linalg_matrix_sqrth", Policy::Fp32),
    ("linalg_qr", Policy::Fp32),
    ("linalg_solve", Policy::Fp32),
    ("linalg_svd", Policy::Fp32),
    ("linalg_svdvals", Policy::Fp32),
    ("linalg_tensorinv", Policy::Fp32),
    ("linalg_tensorsolve", Policy::Fp32),
    ("linalg_vecdot", Policy::Lower),
    ("linear", Policy::Lower),
    ("lu_solve", Policy::Fp32),
    ("margin_ranking_loss", Policy::Fp32),
    ("matmul", Policy::Lower),
    ("max_pool3d", Policy::Fp32),
    ("max_unpool2d", Policy::Fp32),
    ("max_unpool3d", Policy::Fp32),
    ("mkldnn_rnn_layer", Policy::Lower),
    ("mm", Policy::Lower),
    ("mse_loss", Policy::Fp32),
    ("multi_margin_loss", Policy::Fp32),
    ("multilabel_margin_loss", Policy::Fp32),
    ("multilabel_margin_loss_forward", Policy::Fp32),
    ("nanquantile", Policy::Fp32),
    ("nll_loss", Policy::Fp32),
    ("nll_loss2d", Policy::Fp32),
    ("orgqr", Policy::Fp32),
    ("ormqr", Policy::Fp32),
    ("pinverse", Policy::Fp32),
    ("poisson_nll_loss", Policy::Fp32),
    ("polar", Policy::Fp32),
    ("prelu", Policy::Lower),
    ("prod", Policy::Fp32),
    ("quantile", Policy::Fp32),
    ("reflection_pad1d", Policy::Fp32),
    ("reflection_pad2d", Policy::Fp32),
    ("replication_pad1d", Policy::Fp32),
    ("replication_pad2d", Policy::Fp32),
    ("replication_pad3d", Policy::Fp32),
    ("scaled_dot_product_attention", Policy::Lower),
    ("smooth_l1_loss", Policy::Fp32),
    ("soft_margin_loss", Policy::Fp32),
    ("stack", Policy::Promote),
    ("stft", Policy::Fp32),
    ("svd", Policy::Fp32),
    ("trace", Policy::Fp32),
    ("triangular_solve", Policy::Fp32),
    ("triplet_margin_loss", Policy::Fp32),
    ("view_as_complex", Policy::Fp32),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_sorted_for_binary_search() {
        for table in [CUDA_OPS, CPU_OPS] {
            assert!(table.windows(2).all(|w| w[0].0 < w[1].0));
        }
    }

    #[test]
    fn cuda_and_cpu_differ_where_pytorch_lists_them_differently() {
        let v = PolicyVersion::latest();
        // CUDA runs these in fp32; CPU autocast does not list them.
        for op in [
            "aten::exp",
            "aten::log",
            "aten::pow",
            "aten::rsqrt",
            "aten::layer_norm",
        ] {
            assert_eq!(
                policy_of(v, Device::Cuda, op),
                Some(CastPolicy::Fp32),
                "{op}"
            );
            assert_eq!(policy_of(v, Device::Cpu, op), None, "{op}");
        }
        for op in ["softmax", "log_softmax", "sum", "cumsum"] {
            assert_eq!(
                policy_of(v, Device::Cuda, op),
                Some(CastPolicy::Fp32SetOptDtype)
            );
        }
        // einsum is lower precision on CUDA only; bmm and linear on both.
        assert_eq!(
            policy_of(v, Device::Cuda, "einsum"),
            Some(CastPolicy::Lower)
        );
        assert_eq!(policy_of(v, Device::Cpu, "einsum"), None);
        for op in ["bmm", "mm", "linear", "conv2d", "addmm", "matmul"] {
            assert_eq!(policy_of(v, Device::Cuda, op), Some(CastPolicy::Lower));
            assert_eq!(policy_of(v, Device::Cpu, op), Some(CastPolicy::Lower));
        }
        // CPU runs the cross-entropy loss and cat in fp32 / promoted; CUDA does not list them.
        assert_eq!(
            policy_of(v, Device::Cpu, "cross_entropy_loss"),
            Some(CastPolicy::Fp32)
        );
        assert_eq!(policy_of(v, Device::Cuda, "cross_entropy_loss"), None);
        assert_eq!(policy_of(v, Device::Cpu, "cat"), Some(CastPolicy::Promote));
        assert_eq!(policy_of(v, Device::Cuda, "cat"), None);
        assert_eq!(policy_of(v, Device::Cuda, "mean"), None);
        assert_eq!(
            policy_of(v, Device::Cuda, "norm"),
            Some(CastPolicy::Fp32AppendDtype)
        );
        assert_eq!(
            policy_of(v, Device::Cuda, "binary_cross_entropy"),
            Some(CastPolicy::Banned)
        );
    }

    #[test]
    fn rms_norm_is_fp32_on_cuda_from_2_12() {
        let new = PolicyVersion::named("2.12").unwrap();
        let old = PolicyVersion::named("2.9").unwrap();
        assert_eq!(
            policy_of(new, Device::Cuda, "aten::rms_norm"),
            Some(CastPolicy::Fp32)
        );
        assert_eq!(policy_of(old, Device::Cuda, "aten::rms_norm"), None);
        assert!(old.caches_in_inference_mode && !new.caches_in_inference_mode);
        assert_eq!(PolicyVersion::latest().name, "2.12");
    }
}

//! `scaled_dot_product_attention` on CUDA: which backend runs a call on a
//! GPU, and what it allocates beside its output (and, in backward, beside
//! the gradients of query, key and value).
//!
//! **Selection** (`aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`,
//! `select_sdp_backend`, PyTorch 2.11; checked with `_fused_sdp_choice` on
//! an H200, torch 2.11.0+cu130, cuDNN 9.19): the backends are tried in
//! priority order and the first whose checks pass runs. The order is flash,
//! memory-efficient, math (cuDNN last, never reached: math always passes),
//! and cuDNN, flash, memory-efficient, math when
//! `check_prefer_cudnn_attention` holds: a cuDNN above 9.15 (the CUDA 13
//! builds bundle 9.19) on compute capability 9.0 or 10.0.
//! - cuDNN: fp16/bf16, sm80 to sm121, equal query and value head dims, head
//!   dim at most 128 and a multiple of 8; grouped-query attention, masks and
//!   dropout allowed.
//! - flash: fp16/bf16, sm80 to sm121, no attention mask, equal head dims at
//!   most 256 and a multiple of 8, causal only with as many queries as keys;
//!   on sm86, sm89 and sm120 with autograd, not a head dim in (192, 224] nor
//!   above 224 with dropout; grouped-query attention and dropout allowed.
//! - memory-efficient: sm50 to sm121, fp32 or fp16 (bf16 from sm80), head
//!   dims a multiple of 4 (fp32) or 8; masks and dropout allowed; grouped-query
//!   attention not before PyTorch 2.12 ("both fused kernels require query,
//!   key and value to have the same num_heads" on 2.11; the 2.13 and 2.14
//!   sources set `supports_gqa`; 2.12 is assumed to have it, not checked).
//! - math: everything else (fp32 with grouped-query attention before 2.12,
//!   bf16 on Volta and Turing, ...).
//!
//! The CPU runs `_scaled_dot_product_flash_attention_for_cpu` when there is
//! no dropout and the math composite otherwise (`sdp_utils_cpp.cpp`:
//! `check_for_dropout`), so a CPU trace rarely shows the CUDA backend's
//! allocations; [`allocations`] gives them.

use serde::{Deserialize, Serialize};

use super::Sm;

/// A CUDA attention backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Backend {
    Cudnn,
    Flash,
    Efficient,
    Math,
}

impl Backend {
    /// The backend as the report names it.
    pub fn label(self) -> &'static str {
        match self {
            Backend::Cudnn => "cuDNN attention",
            Backend::Flash => "flash attention",
            Backend::Efficient => "memory-efficient attention",
            Backend::Math => "math (scores materialized)",
        }
    }
}

/// One attention call, as selection and allocation read it. Sizes in
/// elements; `elem` is the bytes of one element of query on CUDA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Call {
    pub batch: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub q_len: u64,
    pub kv_len: u64,
    pub head_dim: u64,
    pub v_head_dim: u64,
    pub elem: u64,
    /// The 16-bit type is fp16 (else bf16).
    pub fp16: bool,
    pub mask: bool,
    pub causal: bool,
    pub dropout: bool,
    /// Autograd records it (a backward will run).
    pub grad: bool,
}

impl Call {
    fn low_precision(&self) -> bool {
        self.elem == 2
    }

    fn gqa(&self) -> bool {
        self.kv_heads != self.heads
    }
}

/// What the PyTorch version changes in selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// The memory-efficient kernel takes fewer key/value heads than query
    /// heads (from 2.12).
    pub efficient_gqa: bool,
}

fn in_range(sm: Sm, lo: Sm, hi: Sm) -> bool {
    lo <= sm && sm <= hi
}

fn cudnn_ok(c: &Call, sm: Sm) -> bool {
    c.low_precision()
        && in_range(sm, Sm(8, 0), Sm(12, 1))
        && c.head_dim == c.v_head_dim
        && c.head_dim <= 128
        && c.head_dim % 8 == 0
}

fn flash_ok(c: &Call, sm: Sm) -> bool {
    let consumer = matches!(sm.known(), Sm(8, 6) | Sm(8, 9) | Sm(12, 0));
    let big_head_training = c.grad
        && consumer
        && ((192 < c.head_dim && c.head_dim <= 224) || (c.head_dim > 224 && c.dropout));
    c.low_precision()
        && in_range(sm, Sm(8, 0), Sm(12, 1))
        && !c.mask
        && c.head_dim == c.v_head_dim
        && c.head_dim <= 256
        && c.head_dim % 8 == 0
        && !(c.causal && c.q_len != c.kv_len)
        && !big_head_training
}

fn efficient_ok(c: &Call, sm: Sm, rules: Rules) -> bool {
    let dtype_ok = match c.elem {
        4 => true,
        2 => sm >= Sm(8, 0) || c.fp16,
        _ => false,
    };
    let align = if c.low_precision() { 8 } else { 4 };
    in_range(sm, Sm(5, 0), Sm(12, 1))
        && dtype_ok
        && c.head_dim % align == 0
        && c.v_head_dim % align == 0
        && (rules.efficient_gqa || !c.gqa())
}

/// The backend a call runs on a GPU of compute capability `sm`.
pub fn select(c: &Call, sm: Sm, rules: Rules) -> Backend {
    let prefer_cudnn = matches!(sm, Sm(9, 0) | Sm(10, 0));
    let fused: &[Backend] = if prefer_cudnn {
        &[Backend::Cudnn, Backend::Flash, Backend::Efficient]
    } else {
        &[Backend::Flash, Backend::Efficient]
    };
    fused
        .iter()
        .copied()
        .find(|&b| match b {
            Backend::Cudnn => cudnn_ok(c, sm),
            Backend::Flash => flash_ok(c, sm),
            Backend::Efficient => efficient_ok(c, sm, rules),
            Backend::Math => true,
        })
        .unwrap_or(Backend::Math)
}

/// One step of a kernel's allocations, in the order it makes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A block of this many bytes.
    Alloc(u64),
    /// Frees the block of the `n`-th `Alloc` of the same list.
    Free(usize),
}

/// What a backend allocates beside the call's output (forward) and the
/// gradients of query, key and value (backward), in order. A block the
/// forward does not free is kept for the backward (freed when the call's
/// backward ends); one the backward does not free is freed when it ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocations {
    pub forward: Vec<Step>,
    pub backward: Vec<Step>,
}

/// Builds a step list: `alloc` returns the block's number for `free`.
#[derive(Default)]
struct Steps(Vec<Step>, usize);

impl Steps {
    fn alloc(&mut self, bytes: u64) -> usize {
        self.0.push(Step::Alloc(bytes));
        self.1 += 1;
        self.1 - 1
    }
    fn free(&mut self, block: usize) {
        self.0.push(Step::Free(block));
    }
}

fn round_up(x: u64, m: u64) -> u64 {
    x.div_ceil(m).saturating_mul(m)
}

fn product(factors: &[u64]) -> u64 {
    factors.iter().fold(1_u64, |acc, &f| acc.saturating_mul(f))
}

/// The allocations of `backend` for call `c` (see [`Allocations`]). The
/// sizes, per backend:
/// - cuDNN (`MHA.cpp`; measured on an H200, cuDNN 9.19): the softmax
///   statistics, fp32 `[B, H, Lq, 1]`, and the philox seed and offset (two
///   int64 CUDA scalars, made even without dropout) are saved; a 256-byte
///   forward workspace; the backward's workspace,
///   `4·B·H·Lq·D·(1 + [grouped-query]) + 4·B·H·Lq + 256` bytes, measured
///   (its size is an fp32 accumulator for the query's gradient, one more for
///   the expanded key/value heads, and fp32 row sums: a reading of the
///   figures, not of cuDNN's code).
/// - flash (`flash_api.cpp`, `mha_fwd`/`mha_bwd`): the log-sum-exp, fp32
///   `[B, H, Lq]`, is saved (the philox state is a CPU tensor outside CUDA
///   graph capture); the backward makes `softmax_d`, fp32 `[B, H, Lq↑128]`,
///   `dq_accum`, fp32 `[B, Lq↑128, H, D↑32]` (D above 192: 256), and with
///   grouped-query attention the key and value gradients at the query's
///   head count before they are summed. Not exercised on the H200 (cuDNN
///   ran there): from the source.
/// - memory-efficient (`attention.cu`, `_efficient_attention_forward`/
///   `_backward`): the log-sum-exp, fp32 `[B, H, ⌈Lq/32⌉·32]`, is saved when
///   autograd records the call; the backward makes two fp32 `[B, H, Lq]`
///   and a workspace of `4·B·H·Lq·D + 4·B·H·32` bytes (measured on the
///   H200).
/// - math (`attention.cpp`, `_scaled_dot_product_attention_math`, the
///   composite), in the order the H200 made them: the causal mask (bool
///   `[Lq, Lk]`, its `tril`, then an additive mask in the query's dtype);
///   key and value repeated to the query's heads under grouped-query
///   attention; query and key scaled by √scale (saved by autograd; without
///   it freed once the scores' product returns, as the H200 freed them
///   before the probabilities, `llama-small_nograd_seq2048_L2.cuda.json.gz`);
///   the scores `[B, H, Lq, Lk]`; `_safe_softmax`'s probabilities (saved) with its bool
///   masks; with dropout `native_dropout`'s bool mask and output (saved).
///   The backward makes three `[B, H, Lq, Lk]` blocks (the probabilities'
///   gradient, the scores' from the softmax backward, and that backward's
///   temporary `grad * output`, [`super::softmax`]), then the gradients of
///   the scaled query and key (and of the repeated heads).
pub fn allocations(backend: Backend, c: &Call) -> Allocations {
    let (b, h, lq, lk, d, dv, e) = (
        c.batch,
        c.heads,
        c.q_len,
        c.kv_len,
        c.head_dim,
        c.v_head_dim,
        c.elem,
    );
    let rows = product(&[b, h, lq]);
    let (mut fwd, mut bwd) = (Steps::default(), Steps::default());
    match backend {
        Backend::Cudnn => {
            let stats = product(&[4, rows]);
            let saved = [fwd.alloc(stats), fwd.alloc(8), fwd.alloc(8)];
            let ws = fwd.alloc(256);
            fwd.free(ws);
            if c.grad {
                let gqa = u64::from(c.gqa());
                let ws = bwd.alloc(
                    product(&[4, rows, d, 1 + gqa])
                        .saturating_add(stats)
                        .saturating_add(256),
                );
                bwd.free(ws);
            } else {
                saved.into_iter().for_each(|s| fwd.free(s));
            }
        }
        Backend::Flash => {
            let lse = fwd.alloc(product(&[4, rows]));
            if c.grad {
                let lq_r = round_up(lq, 128);
                let d_r = if d <= 192 { round_up(d, 32) } else { 256 };
                let softmax_d = bwd.alloc(product(&[4, b, h, lq_r]));
                let dq_accum = bwd.alloc(product(&[4, b, lq_r, h, d_r]));
                if c.gqa() {
                    let dk = bwd.alloc(product(&[e, b, lk, h, d]));
                    let dv_ = bwd.alloc(product(&[e, b, lk, h, dv]));
                    bwd.free(dk);
                    bwd.free(dv_);
                }
                bwd.free(dq_accum);
                bwd.free(softmax_d);
            } else {
                fwd.free(lse);
            }
        }
        Backend::Efficient => {
            if c.grad {
                fwd.alloc(product(&[4, b, h, round_up(lq, 32)]));
                let delta = [
                    bwd.alloc(product(&[4, rows])),
                    bwd.alloc(product(&[4, rows])),
                ];
                let ws = bwd.alloc(product(&[4, rows, d]).saturating_add(product(&[4, b, h, 32])));
                bwd.free(ws);
                delta.into_iter().rev().for_each(|x| bwd.free(x));
            }
        }
        Backend::Math => {
            let scores = product(&[e, b, h, lq, lk]);
            let q = product(&[e, b, h, lq, d]);
            let k = product(&[e, b, h, lk, d]);
            let v = product(&[e, b, h, lk, dv]);
            let mask = c.causal.then(|| {
                let ones = fwd.alloc(product(&[lq, lk]));
                let tril = fwd.alloc(product(&[lq, lk]));
                fwd.free(ones);
                let additive = fwd.alloc(product(&[e, lq, lk]));
                fwd.free(tril);
                additive
            });
            let expanded = c.gqa().then(|| (fwd.alloc(k), fwd.alloc(v)));
            let mut saved = vec![fwd.alloc(q), fwd.alloc(k)];
            let s = fwd.alloc(scores);
            if !c.grad {
                // Nothing keeps the scaled query and key past the scores'
                // product without autograd.
                saved.drain(..).for_each(|x| fwd.free(x));
            }
            saved.push(fwd.alloc(scores));
            let masks = [
                fwd.alloc(product(&[b, h, lq, lk])),
                fwd.alloc(product(&[b, h, lq])),
            ];
            masks.into_iter().rev().for_each(|m| fwd.free(m));
            fwd.free(s);
            if c.dropout {
                saved.push(fwd.alloc(product(&[b, h, lq, lk])));
                saved.push(fwd.alloc(scores));
            }
            if let Some((kx, vx)) = expanded {
                fwd.free(kx);
                saved.push(vx);
            }
            if let Some(m) = mask {
                fwd.free(m);
            }
            if c.grad {
                let g = [bwd.alloc(scores), bwd.alloc(scores), bwd.alloc(scores)];
                bwd.free(g[2]);
                bwd.free(g[0]);
                let (gq, gk) = (bwd.alloc(q), bwd.alloc(k));
                bwd.free(g[1]);
                if c.gqa() {
                    let (gkx, gvx) = (bwd.alloc(k), bwd.alloc(v));
                    bwd.free(gkx);
                    bwd.free(gvx);
                }
                bwd.free(gq);
                bwd.free(gk);
            } else {
                saved.into_iter().for_each(|x| fwd.free(x));
            }
        }
    }
    Allocations {
        forward: fwd.0,
        backward: bwd.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama-small's attention: 12 query heads, 4 key/value heads, head dim 64.
    fn llama(elem: u64, grad: bool) -> Call {
        Call {
            batch: 2,
            heads: 12,
            kv_heads: 4,
            q_len: 1024,
            kv_len: 1024,
            head_dim: 64,
            v_head_dim: 64,
            elem,
            fp16: false,
            mask: false,
            causal: true,
            dropout: false,
            grad,
        }
    }

    const V2_11: Rules = Rules {
        efficient_gqa: false,
    };

    #[test]
    fn the_h200_choices_are_the_ones_pytorch_2_11_made() {
        // _fused_sdp_choice on the H200 (torch 2.11, cuDNN 9.19)
        let hopper = Sm(9, 0);
        assert_eq!(select(&llama(2, true), hopper, V2_11), Backend::Cudnn);
        assert_eq!(select(&llama(4, true), hopper, V2_11), Backend::Math);
        let bert = Call {
            kv_heads: 12,
            causal: false,
            dropout: true,
            ..llama(4, true)
        };
        assert_eq!(select(&bert, hopper, V2_11), Backend::Efficient);
        assert_eq!(
            select(&Call { elem: 2, ..bert }, hopper, V2_11),
            Backend::Cudnn
        );
        // From 2.12 the memory-efficient kernel takes grouped-query attention.
        let later = Rules {
            efficient_gqa: true,
        };
        assert_eq!(select(&llama(4, true), hopper, later), Backend::Efficient);
    }

    #[test]
    fn other_architectures_follow_the_default_order() {
        let call = llama(2, true);
        assert_eq!(select(&call, Sm(8, 0), V2_11), Backend::Flash);
        assert_eq!(select(&call, Sm(12, 0), V2_11), Backend::Flash);
        // bf16 before sm80: no fused kernel takes it
        assert_eq!(select(&call, Sm(7, 5), V2_11), Backend::Math);
        // a mask rules flash out
        let masked = Call { mask: true, ..call };
        assert_eq!(select(&masked, Sm(8, 0), V2_11), Backend::Math);
        let masked_mha = Call {
            kv_heads: 12,
            ..masked
        };
        assert_eq!(select(&masked_mha, Sm(8, 0), V2_11), Backend::Efficient);
    }

    /// The sizes a step list allocates.
    fn allocs(steps: &[Step]) -> Vec<u64> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::Alloc(n) => Some(*n),
                Step::Free(_) => None,
            })
            .collect()
    }

    /// The most bytes a step list holds at once.
    fn peak(steps: &[Step]) -> u64 {
        let sizes = allocs(steps);
        let (mut now, mut most) = (0_u64, 0_u64);
        for s in steps {
            match s {
                Step::Alloc(n) => now += n,
                Step::Free(i) => now -= sizes[*i],
            }
            most = most.max(now);
        }
        most
    }

    /// The blocks a step list allocates and does not free.
    fn kept(steps: &[Step]) -> Vec<u64> {
        let sizes = allocs(steps);
        let freed: Vec<usize> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Free(i) => Some(*i),
                Step::Alloc(_) => None,
            })
            .collect();
        (0..sizes.len())
            .filter(|i| !freed.contains(i))
            .map(|i| sizes[i])
            .collect()
    }

    #[test]
    fn measured_workspaces_come_out_to_the_byte() {
        // llama bf16 backward workspace on the H200: 12,681,472 bytes
        let a = allocations(Backend::Cudnn, &llama(2, true));
        assert_eq!(kept(&a.forward), vec![98_304, 8, 8]);
        assert_eq!(allocs(&a.backward), vec![12_681_472]);
        assert!(kept(&a.backward).is_empty());
        // bert-base fp32 (8 × 12 heads × 512, no grouped-query attention)
        let bert = Call {
            batch: 8,
            kv_heads: 12,
            q_len: 512,
            kv_len: 512,
            causal: false,
            dropout: true,
            ..llama(4, true)
        };
        let a = allocations(Backend::Efficient, &bert);
        assert_eq!(kept(&a.forward), vec![196_608]);
        assert_eq!(allocs(&a.backward)[2], 12_595_200);
        let a = allocations(Backend::Cudnn, &Call { elem: 2, ..bert });
        assert_eq!(allocs(&a.backward), vec![12_779_776]);
        // math without grad: everything freed in the forward; two score-sized
        // blocks, 4·B·H·S²
        let a = allocations(Backend::Math, &llama(4, false));
        assert!(kept(&a.forward).is_empty() && a.backward.is_empty());
        // ... and the scaled query and key gone before the probabilities
        // (the H200's order): at most the scores, probabilities, the
        // softmax's masks, the repeated key and value and the causal mask.
        let masks = 2 * 12 * 1024 * 1024 + 2 * 12 * 1024;
        let most = 2 * 100_663_296 + masks + 2 * 6_291_456 + 4 * 1024 * 1024;
        assert_eq!(peak(&a.forward), most);
        assert_eq!(
            allocs(&a.forward)
                .iter()
                .filter(|&&s| s == 100_663_296)
                .count(),
            2
        );
        // with grad the repeated value, the scaled query, the key (repeated
        // to the query's 12 heads, then scaled) and the probabilities stay
        let a = allocations(Backend::Math, &llama(4, true));
        assert_eq!(
            kept(&a.forward),
            vec![6_291_456, 6_291_456, 6_291_456, 100_663_296]
        );
    }
}

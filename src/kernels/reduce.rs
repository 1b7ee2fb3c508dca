//! The global buffer of a CUDA reduction.
//!
//! PyTorch's CUDA reductions (`sum`, `mean`, ...: `aten/src/ATen/native/cuda/
//! Reduce.cuh`, `gpu_reduce_kernel`) split a long reduction across thread
//! blocks when each thread would otherwise sum too many values; the blocks
//! then combine their partial results through a buffer that
//! `gpu_reduce_kernel` allocates from the caching allocator for the call
//! (`allocator.allocate(config.global_memory_size())`, and
//! `config.semaphore_size()` bytes of semaphores) and frees when it returns.
//! The CPU's reductions use per-thread buffers instead (its kernel scratch).
//! The size comes from `setReduceConfig`, which this module follows for a
//! contiguous input reduced over its leading dims (a column sum: a linear
//! layer's bias gradient, `grad.sum(0)` over `[rows, C]`) or its trailing
//! dims (row sums, a whole-tensor sum). The grid it targets is
//! `multiprocessors × (max threads per multiprocessor / threads per block)`,
//! so the buffer depends on the GPU. Checked on an H200 (132
//! multiprocessors): a bias gradient over `[4096, 768]` fp32 makes a
//! 25,165,824-byte buffer, over `[4096, 3072]` 100,663,296 and over
//! `[2048, 768]` 12,582,912, as its allocator recorded.

use super::DeviceLimits;

/// A reduction as `setReduceConfig` sees it after `TensorIterator` has
/// coalesced the contiguous dims: `outputs` results, each of `inputs`
/// values.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct Shape {
    pub outputs: u64,
    pub inputs: u64,
    /// Reducing the innermost (fastest-striding) dim: row sums; else the
    /// outer dims (column sums).
    pub fastest: bool,
    /// Bytes of an input element and of the accumulator (`arg_t`: fp32 for
    /// fp32, fp16 and bf16 inputs, fp64 for fp64).
    pub in_elem: u64,
    pub acc_elem: u64,
}

const WARP: u64 = 32;
/// `mnt_wrapper<T>::MAX_NUM_THREADS` (256 for complex double only).
const MAX_NUM_THREADS: u64 = 512;
const MIN_VALUES_PER_THREAD: u64 = 16;
const MAX_VALUES_PER_THREAD: u64 = 256;
/// `vt0` = `input_vec_size` of `gpu_reduce_kernel` for sum and mean.
const INPUT_VEC_SIZE: u64 = 4;

fn last_pow2(n: u64) -> u64 {
    if n == 0 {
        0
    } else {
        1 << (63 - n.leading_zeros())
    }
}

/// The bytes of the global buffer and of the semaphores the reduction
/// allocates on a GPU (0 and 0 when one thread block per output suffices).
pub fn global_buffer(shape: Shape, gpu: DeviceLimits) -> (u64, u64) {
    let (outputs, inputs) = (shape.outputs.max(1), shape.inputs.max(1));
    let (mut dim0, dim1) = if shape.fastest {
        (inputs, outputs)
    } else {
        (outputs, inputs)
    };
    // Vectorizing: along the input for row sums of at least 128 values,
    // along the output for column sums (as many of 4 elements as the row
    // length divides into).
    let mut output_vec: u64 = 1;
    if shape.fastest {
        if dim0 >= 128 {
            dim0 /= INPUT_VEC_SIZE;
        }
    } else {
        while output_vec < 4 && outputs % (output_vec * 2) == 0 {
            output_vec *= 2;
        }
        dim0 /= output_vec;
    }
    // set_block_dimension
    let max_threads = MAX_NUM_THREADS / output_vec;
    let pow2 = |d: u64| {
        if d < max_threads {
            last_pow2(d)
        } else {
            max_threads
        }
    };
    let (dim0_pow2, dim1_pow2) = (pow2(dim0).max(1), pow2(dim1).max(1));
    let mut block_width = dim0_pow2.min(WARP);
    let block_height = dim1_pow2.min((max_threads / block_width).max(1));
    block_width = dim0_pow2.min((max_threads / block_height).max(1));
    let num_threads = block_width * block_height;

    let (mut step_input, mut step_output) = (1_u64, 1_u64);
    let block_x_reduce = shape.fastest;
    if block_x_reduce {
        step_input *= block_width;
    } else {
        step_output *= block_width;
    }
    let values_per_thread = |step: u64| inputs.div_ceil(step);
    let warp_split_threshold = (block_height * 16).min(MAX_VALUES_PER_THREAD);
    let split_across_warps = values_per_thread(step_input) >= warp_split_threshold;
    if split_across_warps {
        step_input *= block_height;
    } else {
        step_output *= block_height;
    }
    let blocks_per_sm = u64::from(gpu.max_threads_per_multiprocessor) / num_threads;
    let target_grid = u64::from(gpu.multiprocessors).saturating_mul(blocks_per_sm);
    let grid_x = (outputs / output_vec).div_ceil(step_output).max(1);
    let per_thread = values_per_thread(step_input);
    let mut ctas_per_output = 1;
    if split_across_warps && per_thread >= MAX_VALUES_PER_THREAD && grid_x <= target_grid {
        let c1 = target_grid.div_ceil(grid_x);
        let c2 = per_thread.div_ceil(MIN_VALUES_PER_THREAD);
        let c3 = per_thread.div_ceil(MAX_VALUES_PER_THREAD);
        ctas_per_output = c1.min(c2).max(c3);
    }
    if ctas_per_output <= 1 {
        return (0, 0);
    }
    let mut buffer = shape
        .acc_elem
        .saturating_mul(outputs)
        .saturating_mul(ctas_per_output);
    if !block_x_reduce {
        buffer = buffer.saturating_mul(block_width * output_vec);
    }
    (buffer, 4 * grid_x)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H200: DeviceLimits = DeviceLimits {
        multiprocessors: 132,
        max_threads_per_multiprocessor: 2048,
    };

    fn column_sum(rows: u64, columns: u64) -> Shape {
        Shape {
            outputs: columns,
            inputs: rows,
            fastest: false,
            in_elem: 4,
            acc_elem: 4,
        }
    }

    #[test]
    fn bias_gradients_make_the_buffers_the_h200_made() {
        assert_eq!(global_buffer(column_sum(4096, 768), H200).0, 25_165_824);
        assert_eq!(global_buffer(column_sum(4096, 3072), H200).0, 100_663_296);
        assert_eq!(global_buffer(column_sum(2048, 768), H200).0, 12_582_912);
        // a bf16 gradient accumulates in fp32: the same buffer
        let bf16 = Shape {
            in_elem: 2,
            ..column_sum(4096, 2304)
        };
        assert_eq!(global_buffer(bf16, H200).0, 75_497_472);
    }

    #[test]
    fn short_reductions_need_no_buffer_and_the_grid_follows_the_gpu() {
        // 64 rows: one block per output
        assert_eq!(global_buffer(column_sum(64, 768), H200), (0, 0));
        // a tall column sum fills the grid: fewer multiprocessors, fewer
        // blocks per output, a smaller buffer
        let tall = column_sum(65_536, 3072);
        let t4 = DeviceLimits {
            multiprocessors: 40,
            max_threads_per_multiprocessor: 1024,
        };
        assert!(global_buffer(tall, t4).0 < global_buffer(tall, H200).0);
    }
}

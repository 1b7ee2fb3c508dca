//! Rule `grad_scaler_state`: an fp16 run scales its loss with
//! `torch.amp.GradScaler`, which keeps on the GPU its scale (one fp32) and
//! growth tracker (one int32), made at the first `scale()` and kept, and per
//! step the inverse scale and the found-inf flag (one fp32 each) that
//! `unscale_` makes before the optimizer step (`torch/amp/grad_scaler.py`).
//! Each is a separate allocation; the allocator rounds it to 512 bytes.

use super::super::order::Key;
use super::super::{first_start, windows_of, Item};
use crate::analyzer::Phase;
use crate::orchestrator::schedule::{Category, PhaseWindow};
use crate::units::Bytes;

/// The scaler's blocks over the simulated iterations.
pub(crate) fn grad_scaler_items(windows: &[PhaseWindow]) -> Vec<Item> {
    let mut out = Vec::new();
    let Some(first) = first_start(windows, Phase::Backward) else {
        return out;
    };
    for (rank, name) in [(0, "GradScaler._scale"), (1, "GradScaler._growth_tracker")] {
        out.push(item(
            name,
            0,
            Key::before_trace(first, rank),
            None,
            Phase::Backward,
        ));
    }
    for (k, step) in windows_of(windows, Phase::OptimizerStep).enumerate() {
        for (rank, name) in [(0, "GradScaler inv_scale"), (1, "GradScaler found_inf")] {
            let rank = 2 + 2 * k as u64 + rank;
            out.push(item(
                name,
                step.iteration,
                Key::before_trace(step.start, rank),
                Some(Key::after_trace(step.end, rank)),
                Phase::OptimizerStep,
            ));
        }
    }
    out
}

fn item(name: &str, iteration: u32, alloc: Key, free: Option<Key>, phase: Phase) -> Item {
    Item {
        size: Bytes(4),
        category: if free.is_some() {
            Category::Temporary
        } else {
            Category::OptimizerState
        },
        iteration: Some(iteration),
        phase,
        op: Some(name.to_owned()),
        layer: None,
        alloc,
        free,
        source: None,
        rule: None,
        on: crate::kernels::ArchSet::ALL,
        per_gpu: None,
    }
}

//! One case of the `scale` fuzz target, shared with the always-on property
//! test and the regression tests (`tests/integration/budget.rs` includes
//! this file): a request (`--layers`, `--seq-len`, `--new-tokens`, one trace
//! or two of one job, an estimate or the longest-generation search) and the
//! trace bytes, driven through the pipeline under a small memory budget.
//!
//! Layout of the bytes: a 13-byte header — flags (bit 0: layers, 1:
//! sequence length, 2: new tokens, 3: two traces split at the first NUL, 4:
//! the longest-generation search), then the three values as little-endian
//! `u32` — and the trace (plain JSON or gzip). `make_scale_seeds.py` writes
//! seeds in this layout.
//!
//! Invariants checked (a panic is a finding): no stage panics, aborts or
//! allocates out of proportion; a request the work check accepts rebuilds
//! into no more than twice the events it predicted (the check is what keeps
//! memory bounded, so it must not undercount); a request it refuses is
//! refused with the largest that fits.

use memcast::scale::{self, work::Counts, ScaleError, Target};
use memcast::{Bytes, Config};

/// The budget every case runs under: room for about 9,000 events, so a
/// case stays small and a larger request exercises the refusal.
pub const BUDGET: Bytes = Bytes(scale::work::BASE_BYTES + (2 << 20));

/// The decoded case.
#[derive(Debug)]
pub struct Case<'a> {
    pub target: Target,
    pub traces: Vec<&'a [u8]>,
    pub longest: bool,
}

/// Bit of the flags that asks for `--layers`.
pub const LAYERS: u8 = 1;
/// Bit of the flags that asks for `--seq-len`.
pub const SEQ_LEN: u8 = 1 << 1;
/// Bit of the flags that asks for `--new-tokens`.
pub const NEW_TOKENS: u8 = 1 << 2;

/// The case `data` holds, or `None` when it is shorter than the header.
pub fn decode(data: &[u8]) -> Option<Case<'_>> {
    decode_forcing(data, 0)
}

/// Like [`decode`], with the flags of `force` set whatever the header says
/// (a target that always asks for one of the three).
pub fn decode_forcing(data: &[u8], force: u8) -> Option<Case<'_>> {
    let (head, rest) = data.split_at_checked(13)?;
    let flags = *head.first()? | force;
    let value = |i: usize| -> Option<u32> {
        let bytes: [u8; 4] = head.get(1 + 4 * i..5 + 4 * i)?.try_into().ok()?;
        Some(u32::from_le_bytes(bytes))
    };
    let pick = |bit: u8, i: usize| (flags & (1 << bit) != 0).then(|| value(i)).flatten();
    let target = Target {
        layers: pick(0, 0),
        seq_len: pick(1, 1),
        new_tokens: pick(2, 2),
    };
    let traces = match rest.iter().position(|&b| b == 0) {
        Some(at) if flags & (1 << 3) != 0 => {
            vec![
                rest.get(..at).unwrap_or_default(),
                rest.get(at + 1..).unwrap_or_default(),
            ]
        }
        _ => vec![rest],
    };
    Some(Case {
        target,
        traces,
        longest: flags & (1 << 4) != 0,
    })
}

/// Runs `case`; panics where an invariant breaks.
pub fn run(case: &Case) {
    let mut parsed = Vec::new();
    for bytes in &case.traces {
        // A small limit keeps a fuzzed gzip bomb cheap; the code path is the same.
        match memcast::trace::parse_with_limit(bytes, 1 << 20, &mut |_, _| {}) {
            Ok(trace) => parsed.push(trace.value),
            Err(_) => return,
        }
    }
    let Ok(mut config) = Config::for_gpus("a100-80gb", &["a100-80gb".to_owned()]) else {
        return;
    };
    config.scale = case.target;
    config.memory_budget = BUDGET;
    // The check, then the rebuild it allows: never more than twice the
    // events it predicted.
    match scale::check_work(&parsed, &case.target, config.work_budget()) {
        Ok(work) => {
            if let Ok(scaled) = scale::scale_many(&parsed, &case.target) {
                let events = Counts::traced_of(&scaled.value.0);
                assert!(
                    events <= work.events.saturating_mul(2).saturating_add(64),
                    "{:?}: predicted {} events, rebuilt {events}",
                    case.target,
                    work.events
                );
            }
        }
        Err(ScaleError::OverBudget { fits, .. }) => assert!(fits.contains("fit"), "{fits}"),
        Err(_) => {}
    }
    if case.longest {
        let _ = memcast::whatif::context::longest(&parsed, &config, 64, &memcast::InTurn);
        return;
    }
    if let Ok(prepared) = memcast::prepare_parsed(&parsed, Vec::new(), &config, &mut |_| {}) {
        let _ = memcast::estimate(&prepared, &config, &mut |_| {});
    }
}

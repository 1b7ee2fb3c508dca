//! The push reader against itself: the same bytes fed whole, in pieces cut
//! where the fuzzer says, and (for plain JSON) split in two at a guessed
//! event boundary and read as two parts, must give the same trace or the
//! same kind of error. No piece boundary may change a result.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memcast::trace::{self, TracePart, TraceReader};

fuzz_target!(|input: (Vec<u16>, Vec<u8>)| {
    let (cuts, data) = input;
    let limit = 1 << 20;
    let whole = trace::parse_with_limit(&data, limit, &mut |_, _| {});

    // In pieces: the cuts, taken modulo the length, sorted.
    let mut cuts: Vec<usize> = cuts
        .iter()
        .map(|&c| usize::from(c) % (data.len() + 1))
        .collect();
    cuts.sort_unstable();
    let mut reader = TraceReader::new(limit);
    let mut from = 0;
    let mut pushed = Ok(());
    for cut in cuts.into_iter().chain([data.len()]) {
        if pushed.is_ok() && cut > from {
            pushed = reader.push(&data[from..cut]);
            from = cut;
        }
    }
    let pieces = pushed.and_then(|()| reader.finish());
    match (&whole, &pieces) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(a), Err(b)) => assert_eq!(std::mem::discriminant(a), std::mem::discriminant(b)),
        _ => panic!("whole {whole:?} vs pieces {pieces:?}"),
    }

    // Split in two at the first guessed boundary past the middle.
    if trace::is_gzip(&data) {
        return;
    }
    let middle = data.len() / 2;
    let Some(split) = trace::split_candidate(&data[middle..], middle as u64) else {
        return;
    };
    let split = split as usize;
    let Some(bare) = trace::is_bare_list(&data) else {
        return;
    };
    let mut head = TraceReader::new(limit);
    if head.push(&data[..split]).is_err() {
        return;
    }
    let Some(head) = head.finish_head() else {
        return;
    };
    let mut tail = TraceReader::continuing(bare);
    let tail = tail.push(&data[split..]).and_then(|()| tail.finish_tail());
    let Ok(tail) = tail else {
        return;
    };
    let joined = TracePart::join(head, tail);
    match (&whole, &joined) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(a), Err(b)) => assert_eq!(std::mem::discriminant(a), std::mem::discriminant(b)),
        _ => panic!("whole {whole:?} vs two parts {joined:?}"),
    }
});

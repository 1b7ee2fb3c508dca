//! Number formatting for the page (display only: the report keeps exact
//! bytes), and the open state of the page's lazily built `<details>`.

use leptos::html::Details;
use leptos::prelude::*;

use crate::Bytes;

/// Whether a `<details>` is open, following the element itself: a new
/// estimate may be drawn into the same element, left open, so the state is
/// read from it when it is mounted and on every toggle. Its content can then
/// be built only while it is open.
pub fn open_state(
    details: NodeRef<Details>,
) -> (RwSignal<bool>, impl Fn(leptos::ev::Event) + Copy) {
    let open = RwSignal::new(false);
    Effect::new(move |_| {
        if let Some(element) = details.get() {
            open.set(element.open());
        }
    });
    let on_toggle = move |_| open.set(details.get_untracked().is_some_and(|d| d.open()));
    (open, on_toggle)
}

/// `1234567` → `"1,234,567"`.
pub fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (idx, ch) in digits.chars().enumerate() {
        if idx > 0 && (digits.len() - idx) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// Bytes as GiB with two decimals.
pub fn gib(bytes: Bytes) -> String {
    format!("{:.2} GiB", bytes.get() as f64 / Bytes::GIB as f64)
}

/// Bytes as GiB or MiB, whichever reads better.
pub fn short(bytes: Bytes) -> String {
    if bytes.get() >= Bytes::GIB {
        gib(bytes)
    } else {
        format!("{:.1} MiB", bytes.get() as f64 / Bytes::MIB as f64)
    }
}

/// Exact bytes with thousands separators.
pub fn exact(bytes: Bytes) -> String {
    format!("{} B", thousands(bytes.get()))
}

/// Nanoseconds as seconds with three decimals.
pub fn seconds(nanos: i64) -> String {
    format!("{:.3} s", nanos as f64 / 1e9)
}

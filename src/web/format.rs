//! Number formatting for the page — the core's ([`crate::present`]), so the
//! page and the CLI print the same figures — and the open state of the
//! page's lazily built `<details>`.

use leptos::html::Details;
use leptos::prelude::*;

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

pub use crate::present::{exact, gib, short, thousands};

/// Nanoseconds as seconds with three decimals.
pub fn seconds(nanos: i64) -> String {
    format!("{:.3} s", nanos as f64 / 1e9)
}

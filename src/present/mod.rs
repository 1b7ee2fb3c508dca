//! Presentation: the words and numbers both shells show, made once here so
//! that the page and the CLI say the same thing (the report keeps exact
//! bytes; these are its readable forms). Pure functions of the report and
//! the what-if results: no I/O, no locale, integer arithmetic for every
//! rounding.

mod bytes;
mod capture;

pub use bytes::{exact, gib, gib_number, mib, mib_number, percent, short, signed, thousands};
pub use capture::captured;

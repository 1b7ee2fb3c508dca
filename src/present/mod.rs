//! Presentation: the words and numbers both shells show, made once here so
//! that the page and the CLI say the same thing (the report keeps exact
//! bytes; these are its readable forms). Pure functions of the report and
//! the what-if results: no I/O, no locale, integer arithmetic for every
//! rounding.

mod accuracy;
mod bytes;
mod capture;
mod command;
mod settings;
mod summary;
mod verdict;
pub mod whatif;

pub use accuracy::accuracy_table;
pub use bytes::{
    exact, gib, gib_number, mib, mib_number, percent, percent_bp, short, signed, thousands,
};
pub use capture::captured;
pub use command::{capture_command, install_command, CaptureAsk, HELPER};
pub use settings::{changed, Changed};
pub use summary::{model_line, recipe_line, run_line};
pub use verdict::{margin_note, target_verdict, verdict};

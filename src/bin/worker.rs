//! The Web Worker's entry point (built by Trunk for wasm32).
fn main() {
    console_error_panic_hook::set_once();
    memcast::web::worker::register();
}

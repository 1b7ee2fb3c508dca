//! The page's entry point (built by Trunk for wasm32).
fn main() {
    memcast::web::mount();
}

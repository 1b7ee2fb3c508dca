//! The README's accuracy table is the one `src/report/accuracy.json` gives
//! (the file `python3 benches/accuracy.py --write` measures), so prose and
//! verdicts never drift apart. `MEMCAST_UPDATE_README=1` rewrites it.

use std::path::PathBuf;

const BEGIN: &str = "<!-- accuracy:begin (made from src/report/accuracy.json; MEMCAST_UPDATE_README=1 cargo test --test integration readme_accuracy) -->";
const END: &str = "<!-- accuracy:end -->";

#[test]
fn readme_accuracy_table_is_the_data_files() {
    let accuracy = memcast::report::accuracy::Accuracy::shipped().expect("accuracy.json parses");
    let table = memcast::present::accuracy_table(&accuracy);
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let (Some(start), Some(end)) = (readme.find(BEGIN), readme.find(END)) else {
        panic!("README.md has no accuracy table between {BEGIN:?} and {END:?}");
    };
    let shown = readme[start + BEGIN.len()..end].trim();
    if shown != table {
        if std::env::var_os("MEMCAST_UPDATE_README").is_some() {
            let updated = format!("{}{BEGIN}\n{table}\n{}", &readme[..start], &readme[end..]);
            std::fs::write(&path, updated).unwrap();
            return;
        }
        panic!(
            "README.md's accuracy table is not the one src/report/accuracy.json gives; run MEMCAST_UPDATE_README=1 cargo test --test integration readme_accuracy\n--- expected ---\n{table}"
        );
    }
}

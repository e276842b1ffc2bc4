//! The READMEs' Rust examples are the crate's examples, verbatim, so they compile (and
//! `cargo run --example` runs them) against the real API.

use std::path::Path;

/// The first ```rust block after the heading `heading` in the file at `path`.
fn example_under(path: &Path, heading: &str) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let section = text
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("{}: no heading `{heading}`", path.display()))
        .1;
    let block = section
        .split_once("```rust\n")
        .unwrap_or_else(|| panic!("{}: no rust block under `{heading}`", path.display()))
        .1;
    block.split_once("```").unwrap().0.to_owned()
}

fn example(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name);
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn readme_examples_are_the_crate_examples() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    for readme in [manifest.join("README.md"), manifest.join("../README.md")] {
        assert_eq!(
            example_under(&readme, "## Publish from Rust"),
            example("publish.rs"),
            "{}: `Publish from Rust` differs from client/examples/publish.rs",
            readme.display()
        );
        assert_eq!(
            example_under(&readme, "## Kafka in a dozen lines"),
            example("kafka.rs"),
            "{}: `Kafka in a dozen lines` differs from client/examples/kafka.rs",
            readme.display()
        );
    }
}

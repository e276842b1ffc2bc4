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
    let places = [
        ("README.md", "## Publish from Rust", "publish.rs"),
        ("README.md", "## Kafka in a dozen lines", "kafka.rs"),
        ("../README.md", "## Publish from Rust", "publish.rs"),
        (
            "../docs/brokers.md",
            "## Kafka in a dozen lines",
            "kafka.rs",
        ),
    ];
    for (file, heading, name) in places {
        let path = manifest.join(file);
        assert_eq!(
            example_under(&path, heading),
            example(name),
            "{}: `{heading}` differs from client/examples/{name}",
            path.display()
        );
    }
}

/// Every feature of the crate is in its README's table of features, which docs.rs and
/// crates.io show: a feature nobody documented is one nobody finds.
#[test]
fn every_feature_is_documented() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cargo = std::fs::read_to_string(manifest.join("Cargo.toml")).unwrap();
    let features = cargo
        .split_once("\n[features]\n")
        .expect("a [features] table")
        .1
        .split("\n[")
        .next()
        .unwrap();
    let readme = std::fs::read_to_string(manifest.join("README.md")).unwrap();
    let names: Vec<&str> = features
        .lines()
        .filter(|line| !line.starts_with('#') && line.contains(" = "))
        .map(|line| line.split(" = ").next().unwrap().trim())
        .filter(|name| *name != "default")
        .collect();
    assert!(names.len() > 5, "{names:?}");
    for name in names {
        assert!(
            readme.contains(&format!("\n| `{name}` | ")),
            "feature `{name}` has no row in client/README.md's table"
        );
    }
}

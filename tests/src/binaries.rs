//! The programs a tool of this crate starts (`txoutboxd`, `fault-subscriber`), found
//! next to the tool's own binary, of the same profile. Under `cargo run` they are
//! (re)built first, so a measurement is always of the current code; `TXOUTBOXD_BIN` is
//! pointed at the server for [`crate::server::binary`].

use std::path::PathBuf;

/// Builds (under `cargo run`) and finds `binaries`, `(package, binary)` pairs, in the
/// directory of the running executable; returns that directory. `tool` prefixes the
/// messages. A `TXOUTBOXD_BIN` already set is kept and not rebuilt.
pub fn build_beside_self(tool: &str, binaries: &[(&str, &str)]) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    let server_given = std::env::var_os("TXOUTBOXD_BIN").is_some();
    let wanted: Vec<&(&str, &str)> = binaries
        .iter()
        .filter(|(_, binary)| !(server_given && *binary == "txoutboxd"))
        .collect();
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    if let Some(cargo) = std::env::var_os("CARGO") {
        for (package, binary) in &wanted {
            let mut build = std::process::Command::new(&cargo);
            build.args(["build", "-p", package, "--bin", binary]);
            if !cfg!(debug_assertions) {
                build.arg("--release");
            }
            eprintln!("[{tool}] building {binary} ({profile})");
            let status = build.status()?;
            anyhow::ensure!(status.success(), "building {binary} failed");
        }
    }
    for (package, binary) in &wanted {
        anyhow::ensure!(
            dir.join(binary).exists(),
            "{} is missing: build it with `cargo build --release -p {package} --bin {binary}`{}",
            dir.join(binary).display(),
            if *binary == "txoutboxd" {
                ", or point TXOUTBOXD_BIN at a txoutboxd"
            } else {
                ""
            }
        );
    }
    if cfg!(debug_assertions) {
        eprintln!("[{tool}] WARNING: a debug build measures nothing worth quoting; use --release");
    }
    if !server_given {
        std::env::set_var("TXOUTBOXD_BIN", dir.join("txoutboxd"));
    }
    Ok(dir)
}

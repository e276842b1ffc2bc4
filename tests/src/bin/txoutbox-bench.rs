//! `txoutbox-bench`: drain throughput, the SQL-only ceiling, the Python original,
//! commit-to-receive latency, claim cost against backlog and server memory, in one run
//! against the local PostgreSQL; prints one table. See `BENCHMARKS.md`, and
//! `txoutbox-bench --help` for the knobs. The logic lives in `txoutbox_tests::bench`.
//!
//! Full run: `cargo run --release -p txoutbox-tests --bin txoutbox-bench`.
//! Quick run (what the test suite does): add `-- --quick`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use txoutbox_tests::bench::{self, Options, Plan};

fn main() -> ExitCode {
    let options = Options::parse();
    let plan = match Plan::from_options(options) {
        Ok(plan) => plan,
        Err(error) => {
            eprintln!("txoutbox-bench: {error:#}");
            return ExitCode::from(2);
        }
    };
    if let Err(error) = locate_server() {
        eprintln!("txoutbox-bench: {error:#}");
        return ExitCode::from(2);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(run(&plan)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("txoutbox-bench: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(plan: &Plan) -> anyhow::Result<()> {
    let report = bench::run(plan).await?;
    let rendered = report.render();
    println!("{rendered}");
    if let Some(path) = &plan.markdown {
        std::fs::write(path, &rendered)?;
    }
    if let Some(path) = &plan.json {
        std::fs::write(path, serde_json::to_string_pretty(&report.json())?)?;
    }
    Ok(())
}

/// Points the harness at the `txoutboxd` to measure (`TXOUTBOXD_BIN`), before any thread
/// starts. Without it: the `txoutboxd` next to this binary, of the same profile; under
/// `cargo run` it is (re)built first, so the numbers are always of the current code.
fn locate_server() -> anyhow::Result<()> {
    if std::env::var_os("TXOUTBOXD_BIN").is_some() {
        return Ok(());
    }
    let exe = std::env::current_exe()?;
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    let server = dir.join("txoutboxd");
    if let Some(cargo) = std::env::var_os("CARGO") {
        let mut build = std::process::Command::new(cargo);
        build.args(["build", "-p", "txoutbox-server", "--bin", "txoutboxd"]);
        if !cfg!(debug_assertions) {
            build.arg("--release");
        }
        eprintln!(
            "[bench] building txoutboxd ({})",
            if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
        );
        let status = build.status()?;
        anyhow::ensure!(status.success(), "building txoutboxd failed");
    }
    anyhow::ensure!(
        server.exists(),
        "{} is missing: build it with `cargo build --release -p txoutbox-server --bin txoutboxd`, \
         or point TXOUTBOXD_BIN at a txoutboxd",
        server.display()
    );
    if cfg!(debug_assertions) {
        eprintln!("[bench] WARNING: a debug build measures nothing worth quoting; use --release");
    }
    std::env::set_var("TXOUTBOXD_BIN", &server);
    Ok(())
}

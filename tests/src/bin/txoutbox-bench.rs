//! `txoutbox-bench`: drain throughput, the SQL-only ceiling, the Python original,
//! commit-to-receive latency, claim cost against backlog and server memory, in one run
//! against the local PostgreSQL; prints one table. See `BENCHMARKS.md`, and
//! `txoutbox-bench --help` for the knobs. The logic lives in `txoutbox_tests::bench`.
//!
//! Full run: `cargo run --release -p txoutbox-tests --bin txoutbox-bench`.
//! Quick run (what the test suite does): add `-- --quick`.

use std::process::ExitCode;

use clap::Parser;
use txoutbox_tests::bench::{self, Options, Plan};
use txoutbox_tests::binaries::build_beside_self;

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
/// starts: the one next to this binary, (re)built first under `cargo run`.
fn locate_server() -> anyhow::Result<()> {
    build_beside_self("bench", &[("txoutbox-server", "txoutboxd")]).map(drop)
}

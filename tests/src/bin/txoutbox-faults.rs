//! `txoutbox-faults`: the fault-injection soak. Two replicas, four subscriber
//! processes and a steady producer on one outbox table while replicas, subscribers,
//! database sessions and links are killed, paused or cut, one fault at a time; then the
//! history checker's report. Exits 1 on a loss, an order violation or a duplicate no
//! fault explains. The logic lives in `txoutbox_tests::faults`; docs/guarantees.md, "Proof".
//!
//! `cargo run --release -p txoutbox-tests --bin txoutbox-faults -- --backend postgres --duration 10m [--seed N]`

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use txoutbox_tests::binaries::build_beside_self;
use txoutbox_tests::faults::database::Backend;
use txoutbox_tests::faults::{self, report, Plan};

#[derive(Debug, Parser)]
#[command(about = "Fault-injection soak of txoutboxd: faults, then the history checker's report")]
struct Options {
    #[arg(long, value_enum, default_value = "postgres")]
    backend: Backend,
    /// How long to inject faults (at least one round of every kind is injected).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Seed of the fault schedule and the producer's keys; random when not given.
    #[arg(long)]
    seed: Option<u64>,
    /// Producer rows per second.
    #[arg(long, default_value_t = 400)]
    rate: u32,
    /// Keep the journals and subscriber logs even when the run passes.
    #[arg(long)]
    keep_files: bool,
}

fn main() -> ExitCode {
    let options = Options::parse();
    let dir = match build_beside_self(
        "faults",
        &[
            ("txoutbox-server", "txoutboxd"),
            ("txoutbox-tests", "fault-subscriber"),
        ],
    ) {
        Ok(dir) => dir,
        Err(error) => {
            eprintln!("txoutbox-faults: {error:#}");
            return ExitCode::from(2);
        }
    };
    let seed = options.seed.unwrap_or_else(rand::random);
    println!("txoutbox-faults: seed {seed} (rerun with --seed {seed})");
    let mut plan = Plan::new(
        options.backend,
        seed,
        options.duration,
        dir.join("fault-subscriber"),
    );
    plan.workload.rate = options.rate;
    plan.keep_files = options.keep_files;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(faults::run(plan)) {
        Ok(outcome) => {
            println!("{}", report::render(&outcome));
            if outcome.failures().is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("txoutbox-faults: {error:#}");
            ExitCode::from(2)
        }
    }
}

//! `txoutbox`: the command line of txoutboxd's clients. See `client/src/cli/mod.rs`.

#[path = "../cli/mod.rs"]
mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}

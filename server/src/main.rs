//! The `txoutboxd` binary; everything lives in the library.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    txoutbox_server::cli::main().await
}

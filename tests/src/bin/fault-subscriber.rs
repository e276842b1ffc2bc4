//! A subscriber process of the fault-injection suite (`txoutbox_tests::faults`): the Rust
//! client runtime, publishing each message by appending one line to a journal file, so a
//! `kill -9` loses nothing it published. Runs until SIGTERM or SIGINT (graceful stop).
//!
//! Usage: fault-subscriber SERVER_URL OUTBOX NAME JOURNAL_FILE LEASE_MS
//!
//! A journal line is `unix_micros<TAB>NAME<TAB>id<TAB>key<TAB>seq<TAB>attempt`, key `-`
//! for a keyless row; payloads are `key:seq` (see `txoutbox_tests::faults::journal`).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use txoutbox_client::{Message, PublishError, Subscriber};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, outbox, name, journal, lease_ms] = args.as_slice() else {
        anyhow::bail!("usage: fault-subscriber SERVER_URL OUTBOX NAME JOURNAL_FILE LEASE_MS");
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(journal)?;
    let file = Arc::new(Mutex::new(file));
    let publisher = {
        let name = name.clone();
        move |message: Message| {
            let (file, name) = (Arc::clone(&file), name.clone());
            async move {
                let seq = message
                    .payload_str()?
                    .rsplit_once(':')
                    .map(|(_, seq)| seq.to_owned())
                    .unwrap_or_default();
                let key = message.key.as_deref().unwrap_or("-");
                // One write per line, the time taken under the lock: the file's lines are
                // in publish order, and a line is whole or absent after a kill.
                let mut file = file.lock().expect("journal lock");
                let micros = SystemTime::now().duration_since(UNIX_EPOCH)?.as_micros();
                let line = format!(
                    "{micros}\t{name}\t{}\t{key}\t{seq}\t{}\n",
                    message.id, message.attempts
                );
                file.write_all(line.as_bytes())?;
                Ok::<_, PublishError>(())
            }
        }
    };
    Subscriber::builder([url.clone()], outbox.clone())
        .name(name.clone())
        .lease(Duration::from_millis(lease_ms.parse()?))
        .max_in_flight(200)
        .concurrency(16)
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(2))
        .stop_timeout(Duration::from_secs(5))
        .build(publisher)?
        .run_until_signal()
        .await?;
    Ok(())
}

//! A subscriber process of the fault-injection suite (`txoutbox_tests::faults`): the Rust
//! client runtime, publishing each message by appending one line to a journal file, so a
//! `kill -9` loses nothing it published. Runs until SIGTERM or SIGINT (graceful stop).
//!
//! Usage: fault-subscriber SERVER_URL OUTBOX NAME JOURNAL_FILE LEASE_MS [GROUP,GROUP...]
//!
//! A journal line is `unix_micros<TAB>NAME<TAB>id<TAB>key<TAB>seq<TAB>attempt`, key `-`
//! for a keyless row; payloads are `key:seq` (see `txoutbox_tests::faults::history`).
//! With groups, the process joins each of them (one stream each, sharing the journal)
//! and every line ends with `<TAB>group`.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use txoutbox_client::{Message, PublishError, Subscriber};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (url, outbox, name, journal, lease_ms, groups) = match args.as_slice() {
        [_, url, outbox, name, journal, lease_ms] => (url, outbox, name, journal, lease_ms, None),
        [_, url, outbox, name, journal, lease_ms, groups] => {
            (url, outbox, name, journal, lease_ms, Some(groups))
        }
        _ => anyhow::bail!(
            "usage: fault-subscriber SERVER_URL OUTBOX NAME JOURNAL_FILE LEASE_MS [GROUP,GROUP...]"
        ),
    };
    let lease = Duration::from_millis(lease_ms.parse()?);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(journal)?;
    let file = Arc::new(Mutex::new(file));
    let groups: Vec<Option<String>> = match groups {
        None => vec![None],
        Some(groups) => groups.split(',').map(|g| Some(g.to_owned())).collect(),
    };
    let subscribers = groups.into_iter().map(|group| {
        let publisher = publisher(Arc::clone(&file), name.clone(), group.clone());
        let mut builder = Subscriber::builder([url.clone()], outbox.clone())
            .name(name.clone())
            .lease(lease)
            .max_in_flight(200)
            .concurrency(16)
            .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
            .connect_timeout(Duration::from_secs(2))
            .stop_timeout(Duration::from_secs(5));
        if let Some(group) = group {
            builder = builder.group(group);
        }
        async move { builder.build(publisher)?.run_until_signal().await }
    });
    // Every stream gets the signal (each installs its handler) and stops gracefully.
    futures::future::try_join_all(subscribers).await?;
    Ok(())
}

fn publisher(
    file: Arc<Mutex<std::fs::File>>,
    name: String,
    group: Option<String>,
) -> impl Fn(Message) -> BoxFuture<'static, Result<(), PublishError>> + Send + Sync + 'static {
    let suffix = group.map(|g| format!("\t{g}")).unwrap_or_default();
    move |message: Message| {
        let (file, name, suffix) = (Arc::clone(&file), name.clone(), suffix.clone());
        Box::pin(async move {
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
                "{micros}\t{name}\t{}\t{key}\t{seq}\t{}{suffix}\n",
                message.id, message.attempts
            );
            file.write_all(line.as_bytes())?;
            Ok::<_, PublishError>(())
        })
    }
}

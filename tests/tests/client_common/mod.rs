//! Helpers shared by the `client_*` tests: a journal of what publishers did, the rows
//! they publish, and servers on ports chosen up front (so a restarted server can come back
//! where the client expects it).

#![allow(dead_code)] // each test binary uses a part

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};

use txoutbox_client::Message;
use txoutbox_tests::TestDb;

/// `keys` keys with `per_key` messages each, interleaved (k0:0, k1:0, ..., k0:1, ...),
/// payloads `key:seq`.
pub fn rows(keys: usize, per_key: u32) -> Vec<(Option<String>, Vec<u8>)> {
    (0..per_key)
        .flat_map(|seq| {
            (0..keys).map(move |k| (Some(format!("k{k}")), format!("k{k}:{seq}").into_bytes()))
        })
        .collect()
}

/// Payloads are `key:seq`.
pub fn parse(message: &Message) -> (String, u32) {
    let text = message.payload_str().unwrap();
    let (key, seq) = text.rsplit_once(':').unwrap();
    (key.to_owned(), seq.parse().unwrap())
}

/// What publishers did, across every subscriber of a test.
#[derive(Clone, Default)]
pub struct Journal(Arc<Mutex<JournalInner>>);

#[derive(Default)]
struct JournalInner {
    /// (key, seq) of each successful publish, in the order they happened.
    published: Vec<(String, u32)>,
    /// Keys with a publish running right now.
    running: HashSet<String>,
    /// Keys that had two publishes running at once.
    overlaps: Vec<String>,
}

impl Journal {
    /// A publish of `message` starts.
    pub fn start(&self, message: &Message) {
        let (key, _) = parse(message);
        let mut inner = self.0.lock().unwrap();
        if !inner.running.insert(key.clone()) {
            inner.overlaps.push(key);
        }
    }

    /// The publish of `message` ends; `ok` if it succeeded.
    pub fn finish(&self, message: &Message, ok: bool) {
        let (key, seq) = parse(message);
        let mut inner = self.0.lock().unwrap();
        inner.running.remove(&key);
        if ok {
            inner.published.push((key, seq));
        }
    }

    pub fn published(&self) -> usize {
        self.0.lock().unwrap().published.len()
    }

    /// The sequence numbers of `key` successfully published, in the order they were.
    pub fn sequence(&self, key: &str) -> Vec<u32> {
        let inner = self.0.lock().unwrap();
        inner
            .published
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, seq)| *seq)
            .collect()
    }

    fn by_key(&self) -> BTreeMap<String, Vec<u32>> {
        let inner = self.0.lock().unwrap();
        assert!(
            inner.overlaps.is_empty(),
            "two publishes of one key ran at once: {:?}",
            inner.overlaps
        );
        let mut by_key: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for (key, seq) in &inner.published {
            by_key.entry(key.clone()).or_default().push(*seq);
        }
        by_key
    }

    /// Every key published exactly `0..per_key`, in order, once each.
    pub fn assert_exactly_in_order(&self, keys: usize, per_key: u32) {
        let by_key = self.by_key();
        assert_eq!(by_key.len(), keys);
        let expected: Vec<u32> = (0..per_key).collect();
        for (key, seqs) in by_key {
            assert_eq!(seqs, expected, "key {key} published out of order or twice");
        }
    }

    /// Every key published all of `0..per_key` and never skipped ahead: each publish is
    /// the key's next message, or a redelivery going back to an earlier one and going on
    /// from there (at-least-once: a key whose acks were lost comes back from the first
    /// message not acked, and the runtime publishes a key's next message before the
    /// previous ack is settled, so the repeated run may be longer than one message).
    pub fn assert_in_order_at_least_once(&self, keys: usize, per_key: u32) {
        let by_key = self.by_key();
        assert_eq!(by_key.len(), keys);
        for (key, seqs) in by_key {
            assert_eq!(
                seqs.first(),
                Some(&0),
                "key {key} did not start at 0: {seqs:?}"
            );
            assert!(
                seqs.windows(2).all(|w| w[1] <= w[0] + 1),
                "key {key} skipped ahead: {seqs:?}"
            );
            let distinct: BTreeSet<u32> = seqs.iter().copied().collect();
            assert_eq!(
                distinct,
                (0..per_key).collect::<BTreeSet<_>>(),
                "key {key} is missing messages"
            );
        }
    }
}

pub use txoutbox_tests::free_port;

/// `db.config(extra)`, listening on `port` instead of a port the kernel picks.
pub fn config_on_port(db: &TestDb, extra: &str, port: u16) -> String {
    let config = db.config(extra);
    assert!(config.contains("listen = \"127.0.0.1:0\""));
    config.replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{port}\""),
    )
}

/// `command` run in `dir` with stdin closed, stdout and stderr piped, killed when dropped.
pub fn spawn_piped(
    command: &mut tokio::process::Command,
    dir: &std::path::Path,
) -> tokio::process::Child {
    command
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {command:?}: {e}"))
}

/// The rows the packages' user programs (Python, Node) run on: `first` and `second` of
/// key `customer-1`, whose first attempts the programs nack; `poison`, which they
/// dead-letter; `keyless`, which they publish.
pub struct PackageRows {
    pub first: i64,
    pub second: i64,
    pub poison: i64,
    pub keyless: i64,
}

impl PackageRows {
    pub async fn insert(db: &TestDb) -> Self {
        let topic = "orders.created";
        Self {
            first: db.insert(topic, Some("customer-1"), b"first").await,
            second: db.insert(topic, Some("customer-1"), b"second").await,
            poison: db.insert(topic, None, b"poison").await,
            keyless: db.insert(topic, None, b"fine").await,
        }
    }

    /// What became of them, in the table and in `stdout`, where the program printed a line
    /// `WORD ID ATTEMPTS ...` per publish: the poison dead, `first` published on its second
    /// attempt with the nack's error kept, and before `second` (its key waited for the
    /// retry), `keyless` published.
    pub async fn check(&self, db: &TestDb, stdout: &str) {
        let line_of = |id: i64, attempts: Option<u32>| {
            stdout.lines().position(|line| {
                let words: Vec<&str> = line.split_whitespace().collect();
                words.get(1) == Some(&id.to_string().as_str())
                    && attempts.is_none_or(|a| words.get(2) == Some(&a.to_string().as_str()))
            })
        };
        assert_eq!(db.row(self.poison).await.0, "dead");
        let (status, attempts, error) = db.row(self.first).await;
        assert_eq!((status.as_str(), attempts), ("done", 2));
        assert_eq!(error.as_deref(), Some("broker busy"));
        let (first, second) = (line_of(self.first, Some(2)), line_of(self.second, None));
        assert!(
            first.is_some() && second.is_some() && first < second,
            "the key's second message after the first one's retry: {stdout}"
        );
        for id in [self.second, self.keyless] {
            assert_eq!(db.row(id).await.0, "done", "row {id}");
        }
    }
}

/// When the row's lease runs out (or, not leased, when it becomes claimable), in epoch
/// seconds: a lease extension moves it on.
pub async fn lease_end(db: &TestDb, id: i64) -> f64 {
    let query = format!(
        "SELECT extract(epoch FROM available_at)::float8 FROM {}.outbox WHERE id = $1",
        db.schema
    );
    sqlx::query_scalar(&query)
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// `kill SIGNAL PID`, e.g. `-TERM`.
pub fn signal(pid: &str, signal: &str) {
    let kill = std::process::Command::new("kill")
        .args([signal, pid])
        .status()
        .unwrap();
    assert!(kill.success(), "kill {signal} {pid}");
}

/// `count` rows of key `k`, payloads `held 0`, `held 1`...
pub async fn insert_one_key(db: &TestDb, count: usize) -> Vec<i64> {
    let mut ids = Vec::new();
    for n in 0..count {
        let payload = format!("held {n}");
        ids.push(
            db.insert("orders.created", Some("k"), payload.as_bytes())
                .await,
        );
    }
    ids
}

/// The JSON lines a package's `txoutbox-subscribe` printed for one subscription group:
/// every row of `ids` (inserted as `rows`) exactly once, acked on its first attempt, and
/// each key's rows in id order (a group keeps key order, not the order across keys).
pub fn assert_every_row_once_in_key_order(
    lines: &[serde_json::Value],
    ids: &[i64],
    rows: &[(Option<&str>, &str)],
    group: &str,
) {
    let got: Vec<i64> = lines.iter().map(|l| l["id"].as_i64().unwrap()).collect();
    let mut sorted = got.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ids, "group {group}: every row once; got {got:?}");
    for line in lines {
        let at = ids.iter().position(|id| line["id"] == *id).unwrap();
        let (key, payload) = rows[at];
        assert_eq!(line["key"], serde_json::json!(key), "group {group}: {line}");
        assert_eq!(line["payload"], payload, "group {group}: {line}");
        assert_eq!(line["attempts"], 1, "group {group}: {line}");
        assert_eq!(line["answer"], "ack", "group {group}: {line}");
    }
    let mut per_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for line in lines.iter().filter(|l| !l["key"].is_null()) {
        let key = line["key"].as_str().unwrap().to_owned();
        per_key
            .entry(key)
            .or_default()
            .push(line["id"].as_i64().unwrap());
    }
    for (key, got) in per_key {
        assert!(
            got.is_sorted(),
            "group {group}: key {key} out of order: {got:?}"
        );
    }
}

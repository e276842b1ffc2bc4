//! What a fault run records, and how the subscribers' journals are read back: every
//! insert the producer committed (with its latency), every publish of every subscriber,
//! and every fault with its start and end. Times are Unix microseconds from the one clock
//! of the machine, so the journals of separate processes merge into one history.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in Unix microseconds.
pub fn now_us() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(since.as_micros()).expect("microseconds fit")
}

/// The payload of a row: `key:seq`, `-:n` for the n-th keyless row.
pub fn payload(key: Option<&str>, seq: u64) -> String {
    format!("{}:{seq}", key.unwrap_or("-"))
}

/// One insert of the producer.
#[derive(Debug, Clone)]
pub struct Insert {
    /// When the transaction began.
    pub at_us: i64,
    /// From its start to its commit's confirmation (or its failure).
    pub latency_us: i64,
    /// From its start to the INSERT's answer, before the commit: where a wait for a lock
    /// the relay holds would show. The commit adds the database's flush to disk, which
    /// is the machine's (other programs' writes), not the relay's.
    pub statement_us: i64,
    pub key: Option<String>,
    pub seq: u64,
    /// The row's id once committed; `None` when the insert failed (its commit may or
    /// may not have happened: the checker does not count on it either way).
    pub id: Option<i64>,
}

/// One publish by one subscriber.
#[derive(Debug, Clone)]
pub struct Publish {
    pub at_us: i64,
    pub subscriber: String,
    /// The subscription group it was delivered to; `None` with per-row claims.
    pub group: Option<String>,
    pub id: i64,
    pub key: Option<String>,
    pub seq: u64,
    pub attempt: u32,
}

#[derive(Debug, Default)]
pub struct Journals {
    pub publishes: Vec<Publish>,
    /// Lines that were not a whole publish record (a process killed mid-write). Empty
    /// lines are not counted: each process starts its journal with a newline (see
    /// `processes::start_journal_line`).
    pub torn_lines: usize,
}

impl Journals {
    /// Reads a Rust subscriber's journal (tab-separated, see `fault-subscriber`).
    pub fn read_rust(&mut self, path: &Path) -> std::io::Result<()> {
        for line in std::fs::read_to_string(path)?
            .lines()
            .filter(|l| !l.is_empty())
        {
            match parse_rust_line(line) {
                Some(publish) => self.publishes.push(publish),
                None => self.torn_lines += 1,
            }
        }
        Ok(())
    }

    /// Reads the Python example's stdout (`--timestamps` JSON lines) of subscriber `name`,
    /// a member of `group` when given (its lines do not say: one process joins one group).
    pub fn read_python(
        &mut self,
        path: &Path,
        name: &str,
        group: Option<&str>,
    ) -> std::io::Result<()> {
        for line in std::fs::read_to_string(path)?
            .lines()
            .filter(|l| !l.is_empty())
        {
            match parse_python_line(line, name, group) {
                Some(Some(publish)) => self.publishes.push(publish),
                Some(None) => {}
                None => self.torn_lines += 1,
            }
        }
        Ok(())
    }

    /// Every publish in the order it happened.
    pub fn sorted(mut self) -> Self {
        self.publishes.sort_by_key(|p| p.at_us);
        self
    }
}

fn parse_rust_line(line: &str) -> Option<Publish> {
    let mut fields = line.split('\t');
    let at_us = fields.next()?.parse().ok()?;
    let subscriber = fields.next()?.to_owned();
    let id = fields.next()?.parse().ok()?;
    let key = match fields.next()? {
        "-" => None,
        key => Some(key.to_owned()),
    };
    let seq = fields.next()?.parse().ok()?;
    let attempt = fields.next()?.parse().ok()?;
    // A seventh field, with groups: the group it was delivered to.
    let group = match fields.next() {
        None => None,
        Some("") => return None,
        Some(group) => Some(group.to_owned()),
    };
    if fields.next().is_some() {
        return None;
    }
    Some(Publish {
        at_us,
        subscriber,
        group,
        id,
        key,
        seq,
        attempt,
    })
}

/// `Some(None)` for a line that is whole but no publish (an answer other than ack).
fn parse_python_line(line: &str, name: &str, group: Option<&str>) -> Option<Option<Publish>> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    if value["answer"].as_str()? != "ack" {
        return Some(None);
    }
    let (key, seq) = value["payload"].as_str()?.rsplit_once(':')?;
    Some(Some(Publish {
        at_us: value["published_at_us"].as_i64()?,
        subscriber: name.to_owned(),
        group: group.map(str::to_owned),
        id: value["id"].as_i64()?,
        key: (key != "-").then(|| key.to_owned()),
        seq: seq.parse().ok()?,
        attempt: u32::try_from(value["attempts"].as_u64()?).ok()?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_journal_formats() {
        let rust = parse_rust_line("1700000000000001\trust-1\t42\tk7\t3\t2").unwrap();
        assert_eq!(
            (rust.id, rust.key.as_deref(), rust.seq, rust.attempt),
            (42, Some("k7"), 3, 2)
        );
        let keyless = parse_rust_line("1\trust-1\t43\t-\t9\t1").unwrap();
        assert_eq!(keyless.key, None);
        assert!(parse_rust_line("1\trust-1\t4").is_none());
        assert_eq!(rust.group, None);
        let grouped = parse_rust_line("1\trust-1\t42\tk7\t3\t2\ta").unwrap();
        assert_eq!(grouped.group.as_deref(), Some("a"));
        // Torn inside the group field: a line of six fields and a dangling tab.
        assert!(parse_rust_line("1\trust-1\t42\tk7\t3\t2\t").is_none());

        let line = r#"{"id": 5, "key": "k1", "payload": "k1:8", "attempts": 1, "answer": "ack", "published_at_us": 17}"#;
        let python = parse_python_line(line, "py-1", None).unwrap().unwrap();
        assert_eq!((python.at_us, python.id, python.seq), (17, 5, 8));
        let nack = r#"{"id": 5, "payload": "k1:8", "answer": "nack"}"#;
        assert!(parse_python_line(nack, "py-1", None).unwrap().is_none());
        assert!(parse_python_line(r#"{"id": 5, "pay"#, "py-1", None).is_none());
        let grouped = parse_python_line(line, "py-1-b", Some("b"))
            .unwrap()
            .unwrap();
        assert_eq!(grouped.group.as_deref(), Some("b"));
    }

    /// A line cut by `kill -9` must not take the next process's first publish with it.
    #[test]
    fn a_torn_line_loses_no_publish_of_the_next_process() -> std::io::Result<()> {
        use crate::faults::processes::start_journal_line;
        use std::io::Write;

        let dir = tempfile::tempdir()?;
        let append = |path: &Path, text: &str| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?
                .write_all(text.as_bytes())
        };

        let rust = dir.path().join("rust-1.journal");
        start_journal_line(&rust)?;
        append(&rust, "1\trust-1\t42\tk7\t3\t1\n2\trust-1\t43\tk")?;
        start_journal_line(&rust)?;
        append(&rust, "3\trust-1\t44\tk7\t4\t1\n")?;

        let python = dir.path().join("py-1.journal");
        start_journal_line(&python)?;
        append(
            &python,
            r#"{"id": 5, "payload": "k1:8", "answer": "ack", "attem"#,
        )?;
        start_journal_line(&python)?;
        append(
            &python,
            "{\"id\": 6, \"payload\": \"k1:9\", \"attempts\": 1, \"answer\": \"ack\", \"published_at_us\": 18}\n",
        )?;

        let mut journals = Journals::default();
        journals.read_rust(&rust)?;
        journals.read_python(&python, "py-1", None)?;
        let ids: Vec<i64> = journals.publishes.iter().map(|p| p.id).collect();
        assert_eq!(ids, [42, 44, 6]);
        assert_eq!(journals.torn_lines, 2);
        Ok(())
    }
}

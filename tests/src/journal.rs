//! The journal of the per-key order tests: what every subscriber published, in the order
//! it happened, checked afterwards for keys out of order, duplicates and double leases.
//! Backend-neutral: the subscribers only see the gRPC stream.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use rand::Rng;

use crate::Subscriber;

/// What a publisher saw, in the order things happened (across every subscriber).
#[derive(Default)]
pub struct Journal {
    /// (key, sequence number within the key) of each successful publish.
    pub published: Vec<(String, u32)>,
    /// Ids handed to some subscriber and not yet answered: must never hold an id twice.
    pub outstanding: HashSet<i64>,
    pub double_leases: Vec<i64>,
}

/// Payloads are `key:seq`.
pub fn parse(payload: &[u8]) -> (String, u32) {
    let text = std::str::from_utf8(payload).unwrap();
    let (key, seq) = text.rsplit_once(':').unwrap();
    (key.to_owned(), seq.parse().unwrap())
}

/// Publishes sequentially what arrives, failing at random; stops once the journal holds
/// `total` successful publishes across all subscribers.
pub async fn publish_loop(
    mut sub: Subscriber,
    journal: Arc<Mutex<Journal>>,
    failure_rate: f64,
    total: usize,
) {
    let mut released: HashSet<i64> = HashSet::new();
    loop {
        if journal.lock().unwrap().published.len() >= total {
            return;
        }
        let Ok(batch) =
            tokio::time::timeout(std::time::Duration::from_millis(200), sub.take(1)).await
        else {
            continue;
        };
        for message in batch {
            // A copy this subscriber still had queued when its lease was given back (the
            // later messages of a nacked key): not held any more, and once its retry time
            // has come another subscriber may rightly hold it, so it is neither counted
            // nor taken out of `outstanding`.
            if released.remove(&message.id) {
                continue;
            }
            {
                let mut journal = journal.lock().unwrap();
                if !journal.outstanding.insert(message.id) {
                    journal.double_leases.push(message.id);
                }
            }
            let fail = rand::rng().random_bool(failure_rate);
            if fail {
                let settled = sub.nack(message.id, "injected failure", Some(300)).await;
                let mut journal = journal.lock().unwrap();
                journal.outstanding.remove(&message.id);
                for id in settled.released {
                    journal.outstanding.remove(&id);
                    released.insert(id);
                }
            } else {
                let (key, seq) = parse(&message.payload);
                // Record before acking: the publish happened before the answer.
                journal.lock().unwrap().published.push((key, seq));
                let settled = sub.ack(&[message.id]).await;
                assert_eq!(settled.acked, [message.id], "ack fenced: lease was lost");
                journal.lock().unwrap().outstanding.remove(&message.id);
            }
        }
    }
}

pub fn assert_per_key_order(journal: &Journal, keys: usize, per_key: u32) {
    assert!(
        journal.double_leases.is_empty(),
        "leased twice at once: {:?}",
        journal.double_leases
    );
    let mut by_key: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for (key, seq) in &journal.published {
        by_key.entry(key).or_default().push(*seq);
    }
    assert_eq!(by_key.len(), keys);
    for (key, seqs) in by_key {
        let expected: Vec<u32> = (0..per_key).collect();
        assert_eq!(seqs, expected, "key {key} published out of order or twice");
    }
}

pub fn rows(keys: usize, per_key: u32) -> Vec<(Option<String>, Vec<u8>)> {
    // Interleaved: k0:0, k1:0, ..., k0:1, k1:1, ...
    (0..per_key)
        .flat_map(|seq| {
            (0..keys).map(move |k| (Some(format!("k{k}")), format!("k{k}:{seq}").into_bytes()))
        })
        .collect()
}

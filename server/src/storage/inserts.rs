//! What a storage's insert signal carries: which topics were inserted since a reader last
//! looked, as far as the backend can tell.
//!
//! A reader keeps the [`Inserts::seq`] it last saw and asks [`Inserts::since`] whether
//! anything its topic filter matches came after it. The answer is never a false "no": a
//! signal of unknown topic (PostgreSQL's trigger of an earlier version, whose payload is
//! empty; the wake-up after the listener reconnected; a statement that inserted too many
//! topics to list) matches every filter, and so does anything the bounded record of topics
//! had to forget. Many inserts of one topic between two looks are one answer, however many.

use std::collections::HashMap;

/// Topics remembered at most; past this the record forgets them all at once and counts
/// as a signal of unknown topic (one wake-up of every reader, then precise again).
const MAX_TOPICS: usize = 4096;

/// The inserts signalled so far (see the module doc). Lives in a `watch` channel.
#[derive(Debug, Default, Clone)]
pub struct Inserts {
    /// Moves with every signal.
    seq: u64,
    /// The `seq` of the latest signal of each topic, since the record last forgot.
    topics: HashMap<String, u64>,
    /// The `seq` of the latest signal that matches every filter.
    any: u64,
}

impl Inserts {
    /// Records a signal: rows of `topic`, or of unknown topic (`None`).
    pub fn record(&mut self, topic: Option<&str>) {
        self.seq += 1;
        match topic {
            Some(topic) if self.topics.len() < MAX_TOPICS || self.topics.contains_key(topic) => {
                self.topics.insert(topic.to_owned(), self.seq);
            }
            _ => {
                self.topics.clear();
                self.any = self.seq;
            }
        }
    }

    /// Where the signals stand: what a reader keeps to ask [`Inserts::since`] next time.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Whether a signal after `seen` may concern the streams filtering on `filter` (empty:
    /// every topic).
    pub fn since(&self, seen: u64, filter: &[String]) -> bool {
        if self.any > seen || (filter.is_empty() && self.seq > seen) {
            return true;
        }
        filter
            .iter()
            .any(|topic| self.topics.get(topic).is_some_and(|&at| at > seen))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(topics: &[&str]) -> Vec<String> {
        topics.iter().map(|t| (*t).to_owned()).collect()
    }

    #[test]
    fn a_topic_matches_the_filters_that_name_it_and_the_empty_one() {
        let mut inserts = Inserts::default();
        let seen = inserts.seq();
        inserts.record(Some("orders"));
        inserts.record(Some("orders"));
        assert!(inserts.since(seen, &filter(&["orders", "users"])));
        assert!(inserts.since(seen, &[]));
        assert!(!inserts.since(seen, &filter(&["users"])));
        assert!(!inserts.since(inserts.seq(), &filter(&["orders"])), "seen");
    }

    #[test]
    fn an_unknown_topic_matches_every_filter() {
        let mut inserts = Inserts::default();
        inserts.record(Some("orders"));
        let seen = inserts.seq();
        inserts.record(None);
        assert!(inserts.since(seen, &filter(&["users"])));
        inserts.record(Some("orders"));
        assert!(
            inserts.since(seen, &filter(&["users"])),
            "still unseen by this reader"
        );
        assert!(!inserts.since(inserts.seq(), &filter(&["users"])));
    }

    #[test]
    fn a_full_record_forgets_its_topics_as_one_unknown_signal() {
        let mut inserts = Inserts::default();
        for i in 0..MAX_TOPICS {
            inserts.record(Some(&format!("t{i}")));
        }
        let seen = inserts.seq();
        inserts.record(Some("t0"));
        assert!(
            !inserts.since(seen, &filter(&["t1"])),
            "a known topic again"
        );
        inserts.record(Some("one more"));
        assert!(inserts.since(seen, &filter(&["t1"])));
        assert_eq!(inserts.topics.len(), 0);
    }
}

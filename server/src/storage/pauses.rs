//! An operator's pauses of an outbox: of the whole outbox, or of some of its topics. Each
//! is a row of the outbox's pauses table (`<table>_pauses`, created with the outbox's
//! table): `target` is the paused topic, or `''` for the whole outbox. Held in the
//! database, so every replica sharing it obeys the pause, and it outlives restarts.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::ClaimRequest;
use crate::config::columns::TopicSource;

/// The `target` of the whole outbox's pause.
pub const WHOLE_OUTBOX: &str = "";

/// What is paused, and since when.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pauses {
    /// The whole outbox.
    pub outbox: Option<DateTime<Utc>>,
    /// Topics, by name.
    pub topics: BTreeMap<String, DateTime<Utc>>,
    /// Subscription groups, by name: held in the group tables, beside each group's
    /// partitions (a topic's pause does not apply within a group).
    pub groups: BTreeMap<String, DateTime<Utc>>,
}

impl Pauses {
    /// From the rows of the pauses table.
    pub fn from_rows(rows: impl IntoIterator<Item = (String, DateTime<Utc>)>) -> Self {
        let mut pauses = Self::default();
        for (target, since) in rows {
            if target == WHOLE_OUTBOX {
                pauses.outbox = Some(since);
            } else {
                pauses.topics.insert(target, since);
            }
        }
        pauses
    }

    /// The targets a pause or resume of `topics` writes (empty: the whole outbox).
    pub fn targets(topics: &[String]) -> Vec<&str> {
        match topics {
            [] => vec![WHOLE_OUTBOX],
            topics => topics.iter().map(String::as_str).collect(),
        }
    }

    /// The paused topics, by name.
    pub fn topic_names(&self) -> Vec<String> {
        self.topics.keys().cloned().collect()
    }
}

/// How a claim statement filters on topics; each backend renders one statement per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicClause {
    /// Every topic.
    Any,
    /// Only the topics bound.
    Only,
    /// Every topic but the ones bound (paused topics, for a claim without a filter).
    Except,
}

/// The topics a claim takes, after the fixed topic of a table without a topic column
/// was accounted for: `None` when nothing can be claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicFilter<'a> {
    Any,
    Only(&'a [String]),
    Except(&'a [String]),
}

impl<'a> TopicFilter<'a> {
    /// The filter of `request` on a table whose topic comes from `source`: `None` when it
    /// excludes every row (a fixed topic outside the filter, or paused). Every row of a
    /// fixed topic has it: a filter takes all of them or none.
    pub fn of(request: &ClaimRequest<'a>, source: &TopicSource) -> Option<Self> {
        let filter = Self::requested(request);
        let TopicSource::Fixed(fixed) = source else {
            return Some(filter);
        };
        match filter {
            Self::Only(topics) if !topics.contains(fixed) => None,
            Self::Except(paused) if paused.contains(fixed) => None,
            _ => Some(Self::Any),
        }
    }

    /// The filter as requested, whatever the table's topic (a backend that renders a
    /// fixed topic as a literal lets the statement decide).
    pub fn requested(request: &ClaimRequest<'a>) -> Self {
        match (request.topics, request.paused_topics) {
            ([], []) => Self::Any,
            ([], paused) => Self::Except(paused),
            (topics, _) => Self::Only(topics),
        }
    }

    pub fn clause(&self) -> TopicClause {
        match self {
            Self::Any => TopicClause::Any,
            Self::Only(_) => TopicClause::Only,
            Self::Except(_) => TopicClause::Except,
        }
    }

    /// The topics bound, if any.
    pub fn topics(&self) -> &'a [String] {
        match self {
            Self::Any => &[],
            Self::Only(topics) | Self::Except(topics) => topics,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ident::Ident;
    use std::time::Duration;

    fn request<'a>(topics: &'a [String], paused: &'a [String]) -> ClaimRequest<'a> {
        ClaimRequest {
            owner: "w",
            batch_size: 1,
            lease: Duration::from_secs(1),
            topics,
            paused_topics: paused,
            max_attempts: 1,
        }
    }

    #[test]
    fn a_filter_wins_over_paused_topics_and_a_fixed_topic_is_all_or_nothing() {
        let (a, b) = (vec!["a".to_owned()], vec!["b".to_owned()]);
        let column = TopicSource::Column(Ident::new("topic").unwrap());
        let of = |topics, paused| TopicFilter::of(&request(topics, paused), &column);
        assert_eq!(of(&[], &[]), Some(TopicFilter::Any));
        assert_eq!(of(&[], &b), Some(TopicFilter::Except(&b)));
        assert_eq!(of(&a, &b), Some(TopicFilter::Only(&a)));
        let fixed = TopicSource::Fixed("a".to_owned());
        let of = |topics, paused| TopicFilter::of(&request(topics, paused), &fixed);
        assert_eq!(of(&a, &[]), Some(TopicFilter::Any));
        assert_eq!(of(&b, &[]), None);
        assert_eq!(of(&[], &b), Some(TopicFilter::Any));
        assert_eq!(of(&[], &a), None);
    }

    #[test]
    fn rows_of_the_pauses_table_split_into_the_outbox_and_its_topics() {
        let now = Utc::now();
        let pauses = Pauses::from_rows([("".to_owned(), now), ("t".to_owned(), now)]);
        assert_eq!(pauses.outbox, Some(now));
        assert_eq!(pauses.topic_names(), ["t"]);
        assert_eq!(Pauses::targets(&[]), [WHOLE_OUTBOX]);
    }
}

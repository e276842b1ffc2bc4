use super::*;
use crate::storage::TopicStats;

fn topic(name: &str, pending: u64) -> TopicStats {
    TopicStats {
        topic: name.into(),
        pending,
        ..TopicStats::default()
    }
}

#[test]
fn a_topic_gone_from_the_counts_leaves_the_scrape() {
    let metrics = Metrics::new();
    metrics.set_depth("o", &Stats::from_topics(vec![topic("a", 3), topic("b", 1)]));
    let text = metrics.encode();
    assert!(
        text.contains(r#"txoutbox_outbox_pending_rows{outbox="o",topic="a"} 3"#),
        "{text}"
    );
    assert!(
        text.contains(r#"txoutbox_outbox_pending_rows{outbox="o",topic="b"} 1"#),
        "{text}"
    );
    metrics.set_depth("o", &Stats::from_topics(vec![topic("a", 2)]));
    let text = metrics.encode();
    assert!(
        text.contains(r#"txoutbox_outbox_pending_rows{outbox="o",topic="a"} 2"#),
        "{text}"
    );
    assert!(!text.contains(r#"topic="b""#), "{text}");
}

#[test]
fn a_subscriber_leaves_the_scrape_with_its_last_stream() {
    let metrics = Metrics::new();
    let outbox = metrics.outbox("o");
    let first = outbox.stream_opened("billing");
    let second = outbox.stream_opened("billing");
    let series = r#"txoutbox_subscriber_streams{outbox="o",subscriber="billing"}"#;
    assert!(metrics.encode().contains(&format!("{series} 2")));
    drop(first);
    assert!(metrics.encode().contains(&format!("{series} 1")));
    drop(second);
    let text = metrics.encode();
    assert!(!text.contains(series), "{text}");
    assert!(
        text.contains(r#"txoutbox_streams_open{outbox="o"} 0"#),
        "{text}"
    );
}

#[test]
fn an_outbox_counters_are_scraped_before_they_move() {
    let metrics = Metrics::new();
    let _ = metrics.outbox("o");
    let text = metrics.encode();
    for series in [
        r#"txoutbox_acked_rows_total{outbox="o"} 0"#,
        r#"txoutbox_dead_lettered_rows_total{outbox="o",reason="max_claims"} 0"#,
        r#"txoutbox_fenced_answers_total{answer="ack",outbox="o"} 0"#,
        "txoutbox_draining 0",
    ] {
        assert!(text.contains(series), "{series} missing from:\n{text}");
    }
}

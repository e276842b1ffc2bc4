//! Idle streams: how often they poll, alone and together, and what wakes them.

use super::*;

/// Claims made by `streams` idle streams of one outbox over 30 s, after their first.
async fn idle_claims(streams: usize) -> usize {
    let h = Harness::new(false, BACKOFF);
    let mut open = Vec::new();
    for _ in 0..streams {
        open.push(h.open(10).await);
    }
    // Opening streams claims through their group: a claim or so, not one per stream.
    h.storage
        .until("the first claim", |s| s.finished(Op::Claim) >= 1)
        .await;
    sleep(Duration::from_millis(10)).await;
    let before = h.storage.started(Op::Claim);
    sleep(Duration::from_secs(30)).await;
    h.storage.started(Op::Claim) - before
}

#[tokio::test(start_paused = true)]
async fn idle_streams_of_an_outbox_poll_as_often_as_one() {
    let one = idle_claims(1).await;
    let fifty = idle_claims(50).await;
    assert!(one > 10, "a lone stream polls ({one} claims)");
    assert!(
        fifty <= one + 1,
        "50 idle streams made {fifty} claims where one made {one}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lone_idle_stream_backs_off_as_configured() {
    let h = Harness::new(false, BACKOFF);
    let _stream = h.open(10).await;
    h.storage
        .until("eight claims", |s| s.started(Op::Claim) >= 8)
        .await;
    let at = h.storage.claims_at();
    let waits: Vec<u128> = at.windows(2).map(|w| (w[1] - w[0]).as_millis()).collect();
    assert_eq!(waits[..7], [50, 100, 200, 400, 800, 1000, 1000]);
}

#[tokio::test(start_paused = true)]
async fn a_poll_that_finds_a_full_batch_wakes_the_other_idle_streams() {
    let poll = PollConfig {
        min: Duration::from_secs(10),
        max: Duration::from_secs(10),
        factor: 1.0,
    };
    let h = Harness::new(false, poll);
    let mut streams = Vec::new();
    for _ in 0..3 {
        streams.push(h.open(2).await);
    }
    h.storage
        .until("every stream's first claim", |s| s.finished(Op::Claim) == 3)
        .await;
    let start = Instant::now();
    for _ in 0..6 {
        h.storage.add(None);
    }
    // One poll turn finds a full batch; the other two streams claim at once rather than
    // at the next turns, 10 and 20 s later.
    for stream in &mut streams {
        assert_eq!(stream.batch().await.len(), 2);
    }
    assert!(Instant::now() - start < Duration::from_secs(15));
    assert_eq!(h.storage.started(Op::Claim), 6);
}

#[tokio::test(start_paused = true)]
async fn a_stream_claims_again_only_once_its_batch_was_taken() {
    let h = Harness::new(true, NO_POLLING);
    let a = h.storage.add(None);
    let mut stream = h.open(10).await;
    h.storage
        .until("the first claim", |s| s.finished(Op::Claim) == 1)
        .await;
    // The batch waits in the channel, untaken: new rows and signals start no claim.
    h.storage.add(None);
    h.storage.wake();
    sleep(Duration::from_secs(5)).await;
    assert_eq!(
        h.storage.started(Op::Claim),
        1,
        "claimed past a batch not taken"
    );
    assert_eq!(stream.batch().await, [a]);
    h.storage
        .until("the claim after the batch was taken", |s| {
            s.started(Op::Claim) == 2
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn opening_streams_and_an_insert_signal_cost_a_claim_however_many_streams_idle() {
    let h = Harness::new(true, NO_POLLING);
    let mut streams = Vec::new();
    for _ in 0..50 {
        streams.push(h.open(10).await);
    }
    sleep(Duration::from_secs(1)).await;
    let opened = h.storage.started(Op::Claim);
    assert!(opened <= 3, "opening 50 streams made {opened} claims");
    let a = h.storage.add(None);
    h.storage.wake();
    h.storage
        .until("the insert's claim", |s| {
            s.finished(Op::Claim) == opened + 1
        })
        .await;
    sleep(Duration::from_secs(5)).await;
    assert_eq!(
        h.storage.started(Op::Claim),
        opened + 1,
        "one claim for one insert"
    );
    let mut got = Vec::new();
    for stream in &mut streams {
        if let Ok(Ok(Event::Batch(batch))) = stream.events.try_recv() {
            got.extend(batch.claimed.messages.iter().map(|m| m.id));
        }
    }
    assert_eq!(got, [a]);
}

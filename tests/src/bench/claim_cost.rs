//! One claim's cost against the backlog: the median time of a claim of one batch with
//! N pending rows, for each shape of keys, with the hot key's head free, leased by
//! another owner, or waiting for its retry. In-process through the [`Storage`] trait.
//!
//! Each (shape, size) loads one table; the states are set up one after the other on it:
//! - free: nothing held; each timed claim's rows are released (untried) right after, so
//!   every claim sees the same table;
//! - leased: another owner claimed the oldest row (row 1, the hot key's head);
//! - retry: that owner nacked row 1 with a retry an hour away.
//!
//! Row 1 belongs to "the hot key" in every shape (for uniform keys, to key `k1`).

use std::time::{Duration, Instant};

use txoutbox_server::storage::postgres::PostgresStorage;
use txoutbox_server::storage::{ClaimRequest, FailureDecision, RetryPolicy, Storage};

use super::stats::Measurements;
use super::workload::BenchSchema;
use super::Plan;

const OWNER: &str = "bench-claimer";
const BLOCKER: &str = "bench-blocker";
const LEASE: Duration = Duration::from_secs(3600);

/// How keys are spread over the backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// 1,000 keys round-robin (`--keys`).
    Uniform,
    /// One key holding every row.
    HotKey,
    /// One key holding the first half, then a distinct key per row.
    HotHalf,
    /// No keys, strict ordering off (the head states do not apply).
    Keyless,
}

impl Shape {
    pub const ALL: [Shape; 4] = [Self::Uniform, Self::HotKey, Self::HotHalf, Self::Keyless];

    pub fn label(self) -> &'static str {
        match self {
            Self::Uniform => "uniform",
            Self::HotKey => "hot-key",
            Self::HotHalf => "hot-half",
            Self::Keyless => "keyless",
        }
    }

    pub fn describe(self, keys: u64) -> String {
        match self {
            Self::Uniform => format!("{keys} keys"),
            Self::HotKey => "one hot key".to_owned(),
            Self::HotHalf => "hot key for the first half, then distinct keys".to_owned(),
            Self::Keyless => "keyless, not strict".to_owned(),
        }
    }

    fn key_sql(self, keys: u64, rows: u64) -> String {
        match self {
            // Row 1 gets key k1, and so does every `keys`-th row after it.
            Self::Uniform => format!("'k' || (g % {})", keys.max(1)),
            Self::HotKey => "'hot'".to_owned(),
            Self::HotHalf => format!("CASE WHEN g <= {} THEN 'hot' ELSE 'k' || g END", rows / 2),
            Self::Keyless => "NULL".to_owned(),
        }
    }

    pub fn states(self) -> &'static [HeadState] {
        match self {
            Self::Keyless => &[HeadState::Free],
            _ => &HeadState::ALL,
        }
    }
}

/// What holds the hot key's head while the claims are timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadState {
    Free,
    Leased,
    Retrying,
}

impl HeadState {
    pub const ALL: [HeadState; 3] = [Self::Free, Self::Leased, Self::Retrying];

    pub fn label(self) -> &'static str {
        match self {
            Self::Free => "free",
            Self::Leased => "head leased",
            Self::Retrying => "head retrying",
        }
    }

    pub fn key(self) -> &'static str {
        match self {
            Self::Free => "free",
            Self::Leased => "leased",
            Self::Retrying => "retrying",
        }
    }
}

/// Key of a claim-cost figure in [`Measurements`].
pub fn key(shape: Shape, state: HeadState, rows: u64) -> String {
    format!("claim/{}/{}/{rows}", shape.label(), state.key())
}

/// Always retries an hour later: the head waits for its retry.
struct RetryInAnHour;

impl RetryPolicy for RetryInAnHour {
    fn on_failure(&self, _attempts: u32, _requested: Option<Duration>) -> FailureDecision {
        FailureDecision::RetryAfter(LEASE)
    }
}

/// Times every (shape, size, state) cell; each sample is recorded under [`key`], so
/// the figure is the median of the samples, with their spread.
pub async fn measure(plan: &Plan, m: &mut Measurements) -> anyhow::Result<()> {
    for &rows in &plan.claim_sizes {
        for shape in Shape::ALL {
            eprintln!(
                "[bench] claim cost: {} pending rows, {}",
                rows,
                shape.label()
            );
            let schema = BenchSchema::create(&plan.database_url, "claim").await?;
            let result = measure_table(plan, &schema, shape, rows, m).await;
            schema.drop().await;
            if let Err(error) = result {
                eprintln!(
                    "[bench] claim cost {rows} {} failed: {error:#}",
                    shape.label()
                );
                m.note(format!(
                    "claim cost at {rows} rows, {}: failed: {error:#}",
                    shape.label()
                ));
            }
        }
    }
    Ok(())
}

async fn measure_table(
    plan: &Plan,
    schema: &BenchSchema,
    shape: Shape,
    rows: u64,
    m: &mut Measurements,
) -> anyhow::Result<()> {
    let strict = shape != Shape::Keyless;
    let storage = schema.create_outbox(&plan.relay_url, strict, 2).await?;
    schema
        .load_with_key(&schema.table(), &shape.key_sql(plan.keys, rows), rows)
        .await?;
    for &state in shape.states() {
        match state {
            HeadState::Free => {}
            HeadState::Leased => {
                let held = claim(&storage, BLOCKER, 1).await?.0;
                anyhow::ensure!(held == [1], "the blocker should hold row 1, holds {held:?}");
            }
            HeadState::Retrying => {
                storage
                    .nack(1, BLOCKER, "bench: retry in an hour", None, &RetryInAnHour)
                    .await?;
            }
        }
        // One untimed claim first: plans cached, pages in memory.
        for sample in 0..=plan.claim_samples {
            let (ids, took) = claim(&storage, OWNER, plan.batch_size).await?;
            storage.release(&ids.into(), OWNER, Duration::ZERO).await?;
            if sample > 0 {
                m.record(key(shape, state, rows), sample, took.as_secs_f64() * 1000.0);
            }
        }
    }
    Ok(())
}

/// One claim: the ids it leased and how long it took.
async fn claim(
    storage: &PostgresStorage,
    owner: &str,
    batch_size: u32,
) -> anyhow::Result<(Vec<i64>, Duration)> {
    let started = Instant::now();
    let claimed = storage
        .claim(ClaimRequest {
            owner,
            batch_size,
            lease: LEASE,
            topics: &[],
            paused_topics: &[],
            max_attempts: u32::MAX,
        })
        .await?;
    let took = started.elapsed();
    Ok((claimed.messages.iter().map(|m| m.id).collect(), took))
}

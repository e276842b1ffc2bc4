//! What this backend's locking reads keep locked, on a real MariaDB (the server at
//! `TXOUTBOX_TEST_MYSQL_URL`, default `mysql://root@127.0.0.1:3306/test`; a database of
//! its own per test). A transaction stopped right after its locking read (its replica
//! paused, its database link cut) must hold only the rows it matched: never rows another
//! owner leased meanwhile, whose acks would wait on it. Here in the backend
//! rather than in the contract suite: it runs the backend's own statements.

use sqlx::{Connection, Executor, MySqlConnection};

use super::super::*;
use crate::storage::{ClaimRequest, FailureDecision, NackResult, RetryPolicy};

fn url() -> String {
    std::env::var("TXOUTBOX_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// A database of its own, dropped at the end of the test.
struct Database(String);

impl Database {
    async fn create() -> Self {
        let name = format!("locks_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let mut conn = MySqlConnection::connect(&url())
            .await
            .expect("MariaDB running");
        conn.execute(format!("CREATE DATABASE `{name}`").as_str())
            .await
            .unwrap();
        Self(name)
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let name = self.0.clone();
        let _ = std::thread::spawn(move || {
            tokio::runtime::Runtime::new().unwrap().block_on(async {
                if let Ok(mut conn) = MySqlConnection::connect(&url()).await {
                    let _ = conn
                        .execute(format!("DROP DATABASE IF EXISTS `{name}`").as_str())
                        .await;
                }
            })
        })
        .join();
    }
}

struct RetryLater;

impl RetryPolicy for RetryLater {
    fn on_failure(&self, _attempts: u32, _delay: Option<Duration>) -> FailureDecision {
        FailureDecision::RetryAfter(Duration::from_secs(60))
    }
}

fn request(owner: &str, batch_size: u32) -> ClaimRequest<'_> {
    ClaimRequest {
        owner,
        batch_size,
        lease: Duration::from_secs(60),
        topics: &[],
        paused_topics: &[],
        max_attempts: 100,
    }
}

/// Replica 1 leases rows 1-10 to `w1`. Replica 2 is stopped inside transactions that ran
/// its locking reads over those rows: a claim whose candidates it read before `w1` took
/// them, an answer and a nack of an owner that holds none of them. `w1`'s ack and nack
/// still land at once; with a secondary-index or single-row lookup they waited for the
/// lock until it timed out (1205, then `Unavailable`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_rows_of_others_stay_unlocked() {
    let database = Database::create().await;
    let storage =
        MySqlStorage::connect(&url(), 4, TableOptions::default(), Some(database.0.clone()))
            .unwrap();
    storage.ensure_table().await.unwrap();
    let mut ids = Vec::new();
    for n in 0..20 {
        let message = NewMessage::new("t", "p").with_key(format!("k{n}"));
        ids.push(storage.insert(message).await.unwrap());
    }
    let leased = storage.claim(request("w1", 10)).await.unwrap();
    let leased: Vec<MessageId> = leased.messages.iter().map(|m| m.id).collect();
    assert_eq!(leased, ids[..10]);

    let sql = &storage.sql;
    let mut claim = storage.conn.pool.begin().await.unwrap();
    let now = super::super::convert::now(&mut claim).await.unwrap();
    let statement = sql.claim_lock(ids.len());
    let mut query = sqlx::query(&statement);
    for id in &ids {
        query = query.bind(id);
    }
    let locked = query
        .bind(now)
        .bind(ids.len() as i64)
        .fetch_all(&mut *claim)
        .await
        .unwrap();
    assert_eq!(locked.len(), 10, "the rows nobody leased");
    let mut answer = storage.conn.pool.begin().await.unwrap();
    let statement = sql.held(leased.len(), false);
    let mut query = sqlx::query_scalar::<_, i64>(&statement);
    for id in &leased {
        query = query.bind(id);
    }
    assert!(query
        .bind("w9")
        .fetch_all(&mut *answer)
        .await
        .unwrap()
        .is_empty());
    let mut nack = storage.conn.pool.begin().await.unwrap();
    let held = sqlx::query(&sql.nack_select())
        .bind(leased[9])
        .bind("w9")
        .fetch_optional(&mut *nack)
        .await
        .unwrap();
    assert!(held.is_none());

    let nacked = storage
        .nack(leased[9], "w1", "broker down", None, &RetryLater)
        .await;
    assert!(
        matches!(nacked, Ok(NackResult::Retried { .. })),
        "{nacked:?}"
    );
    let acked = storage.ack(&leased[..9].into(), "w1").await;
    assert_eq!(acked.as_deref().ok(), Some(&leased[..9]), "{acked:?}");
    for tx in [claim, answer, nack] {
        tx.rollback().await.unwrap();
    }
}

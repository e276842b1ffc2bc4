//! A subscription group on a team's own table ("bring your own table", the columns mapped
//! in `[outboxes.NAME.columns]`), on PostgreSQL and SQLite: the group's statements read
//! the table by its own column names (id, key, creation time), so delivery, stats, seeks,
//! blocked keys, dead letters and the purge work on it as on the relay's own table.

use std::time::{Duration, SystemTime};

use txoutbox_proto::v1::{self, seek_group_request::To};
use txoutbox_tests::outbox_db::TEAM_MAPPING;
use txoutbox_tests::{eventually, MappedPgDb, OutboxDb, Server, SqliteDb, DEADLINE};

use super::{by_key, drain, in_order, join};

/// One group on the outbox `orders`, as dotted keys of `[outboxes.orders]`: the mapping's
/// keys that follow stay in the outbox's table.
const GROUP: &str = "partitions = 2\ngroups.kafka.lease = \"2s\"\n";

/// The team's table of [`TEAM_MAPPING`] (none of its columns has the relay's name), on
/// one backend, and the producer's inserts into it.
enum TeamTable {
    Postgres(MappedPgDb),
    Sqlite(SqliteDb),
}

impl TeamTable {
    /// The server's configuration: the server adds the bookkeeping columns and the
    /// groups' tables (`create_schema`); on SQLite it creates the mapped table first.
    fn config(&self) -> String {
        match self {
            Self::Postgres(db) => db.config(&format!("create_schema = true\n{GROUP}")),
            Self::Sqlite(db) => {
                db.config(&format!("{GROUP}{TEAM_MAPPING}"))
                    .replacen("table = \"outbox\"\n", "", 1)
            }
        }
    }

    /// Inserts a row of `key` as a producer would, created `minutes_ago`; returns its id.
    async fn insert(&self, key: &str, minutes_ago: i32) -> i64 {
        let payload = key_payload(key, minutes_ago);
        match self {
            Self::Postgres(db) => {
                let id: i32 = sqlx::query_scalar(&format!(
                    "INSERT INTO {}.order_events (event_type, aggregate_id, body, occurred_at) \
                     VALUES ('orders.created', $1, $2, now() - make_interval(mins => $3)) \
                     RETURNING event_id",
                    db.schema()
                ))
                .bind(key)
                .bind(payload)
                .bind(minutes_ago)
                .fetch_one(db.pool())
                .await
                .unwrap();
                i64::from(id)
            }
            Self::Sqlite(db) => sqlx::query_scalar(
                "INSERT INTO order_events (event_type, aggregate_id, body, occurred_at) \
                 VALUES ('orders.created', ?1, ?2, \
                         CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) - ?3 * 60000) \
                 RETURNING event_id",
            )
            .bind(key)
            .bind(payload)
            .bind(minutes_ago)
            .fetch_one(db.pool())
            .await
            .unwrap(),
        }
    }

    async fn drop(self) {
        match self {
            Self::Postgres(db) => db.drop().await,
            Self::Sqlite(db) => db.drop().await,
        }
    }
}

/// Payloads sort in insertion order within a key: `key:minutes_ago` with older first.
fn key_payload(key: &str, minutes_ago: i32) -> Vec<u8> {
    format!("{key}:{:03}", 100 - minutes_ago).into_bytes()
}

async fn group_stats(server: &Server) -> v1::GroupStats {
    let stats = server
        .admin()
        .await
        .stats(v1::StatsRequest {
            outbox: "orders".into(),
        })
        .await
        .unwrap()
        .into_inner();
    stats
        .groups
        .into_iter()
        .find(|g| g.group == "kafka")
        .expect("the group in the stats")
}

/// Rows created an hour ago and rows created now; a group delivers them all in key order,
/// a seek to half an hour ago replays the new ones, their failures show in the stats, the
/// blocked keys and the dead letters, and a purge takes the old ones.
async fn a_group_works_on_a_mapped_table(table: TeamTable) {
    let server = Server::start_serving(&table.config()).await;
    let mut ids = Vec::new();
    for (key, minutes_ago) in [
        ("a", 60),
        ("a", 59),
        ("b", 60),
        ("a", 0),
        ("b", 0),
        ("c", 0),
    ] {
        ids.push(table.insert(key, minutes_ago).await);
    }
    let (old, new) = ids.split_at(3);

    let mut sub = join(&server, "kafka", "k", 10).await;
    let got = drain(&mut sub, ids.len()).await;
    let mut seen: Vec<i64> = got.iter().map(|m| m.id).collect();
    seen.sort_unstable();
    assert_eq!(seen, ids, "the group gets every row once");
    in_order(&by_key(&got));
    eventually("the group's positions at the end", DEADLINE, || async {
        (group_stats(&server).await.lag_rows == 0).then_some(())
    })
    .await;

    let mut admin = server.admin().await;
    let half_an_hour_ago = SystemTime::now() - Duration::from_secs(30 * 60);
    let seek = |to: To, dry_run: bool| v1::SeekGroupRequest {
        outbox: "orders".into(),
        group: "kafka".into(),
        to: Some(to),
        dry_run,
    };
    let by_id = admin
        .seek_group(seek(To::ToId(new[0]), true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_id.rows_ahead, new.len() as u64);
    let by_time = admin
        .seek_group(seek(To::ToTime(half_an_hour_ago.into()), false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_time.rows_ahead, new.len() as u64);

    // Every group has passed the old rows, and they are older than half an hour.
    let purged = admin
        .purge(v1::PurgeRequest {
            outbox: "orders".into(),
            older_than: Some(prost_types::Duration {
                seconds: 30 * 60,
                nanos: 0,
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(purged.deleted, old.len() as u64);

    // The replay: a's row waits for a retry, b's is acked, c's dies.
    let replay = sub.take(new.len()).await;
    let mut replayed: Vec<i64> = replay.iter().map(|m| m.id).collect();
    replayed.sort_unstable();
    assert_eq!(replayed, new);
    let [a, b, c] = [new[0], new[1], new[2]];
    assert_eq!(sub.nack(a, "broker down", Some(60_000)).await.retried, [a]);
    assert_eq!(sub.ack(&[b]).await.acked, [b]);
    assert_eq!(sub.dead_letter(c, "poison").await.dead_lettered, [c]);
    // A later row of a is held behind the retry.
    table.insert("a", 0).await;

    let stats = eventually("a held behind its retry, c dead", DEADLINE, || async {
        let stats = group_stats(&server).await;
        (stats.held == 1 && stats.dead == 1).then_some(stats)
    })
    .await;
    assert_eq!((stats.retrying, stats.held_keys), (1, 1), "{stats:?}");
    let keys = admin
        .list_blocked_keys(v1::ListBlockedKeysRequest {
            outbox: "orders".into(),
            group: "kafka".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .keys;
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!((keys[0].key.as_str(), keys[0].head_id), ("a", a));
    assert_eq!(keys[0].waiting_behind, 1);
    let created = SystemTime::try_from(keys[0].head_created_at.unwrap()).unwrap();
    assert!(created > half_an_hour_ago, "{keys:?}");
    let dead_letters = admin
        .list_dead_letters(v1::ListDeadLettersRequest {
            outbox: "orders".into(),
            group: "kafka".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .dead_letters;
    let listed: Vec<(i64, &str, &[u8])> = dead_letters
        .iter()
        .map(|d| (d.id, d.last_error.as_str(), d.payload.as_slice()))
        .collect();
    assert_eq!(listed, [(c, "poison", key_payload("c", 0).as_slice())]);
    table.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_on_a_mapped_postgres_table_reads_it_by_its_column_names() {
    a_group_works_on_a_mapped_table(TeamTable::Postgres(MappedPgDb::unprepared().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_on_a_mapped_sqlite_table_reads_it_by_its_column_names() {
    a_group_works_on_a_mapped_table(TeamTable::Sqlite(SqliteDb::new().await)).await;
}

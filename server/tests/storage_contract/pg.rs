//! The cases only PostgreSQL has (its backend of the contract is in `pg_backend.rs`).

use super::keyless::claims_until_claimed;
use super::pg_backend::*;
use super::*;
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{Connection, Executor};
use txoutbox_server::config::SynchronousCommit;
use txoutbox_server::storage::postgres::{lazy_pool, PostgresStorage};
use txoutbox_server::storage::StorageError;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_reconnects_after_its_connection_is_killed() {
    let backend = PgBackend::new().await;
    let storage = backend
        .open(Setup {
            notify: true,
            ..Setup::default()
        })
        .await;
    let settle = Duration::from_millis(100);
    let mut signal = listening_signal(&backend, &*storage, settle)
        .await
        .expect("notify");

    let killed = backend
        .execute(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = 'txoutboxd-listener' AND query LIKE '%{}%'",
            backend.channel()
        ))
        .await;
    assert_eq!(killed, 1, "one listener connection");
    next_signal(&mut signal).await; // reconnected: callers catch up

    insert(&*storage, "t", "p", None).await;
    next_signal(&mut signal).await;
}

/// The trigger's notifications name the topics a statement inserted, one each; a
/// statement of more than 16 topics, or of a topic longer than a filter can name, sends
/// one empty payload (every stream claims), as the trigger of earlier versions did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_insert_trigger_names_each_topic_of_a_statement_within_bounds() {
    let backend = PgBackend::new().await;
    let _storage = backend
        .open(Setup {
            notify: true,
            ..Setup::default()
        })
        .await;
    let mut listener = sqlx::postgres::PgListener::connect(&url()).await.unwrap();
    listener.listen(&backend.channel()).await.unwrap();
    let table = backend.qualified();
    let insert = |topics: &str| {
        format!(
            "INSERT INTO {table} (topic, payload) SELECT t, 'p' FROM unnest(ARRAY[{topics}]) AS t"
        )
    };
    let mut payloads = Vec::new();
    let mut next = async || {
        let notification = tokio::time::timeout(DEADLINE, listener.recv())
            .await
            .expect("a notification within the deadline")
            .unwrap();
        notification.payload().to_owned()
    };
    backend.execute(&insert("'a', 'b', 'a'")).await;
    payloads.push(next().await);
    payloads.push(next().await);
    payloads.sort();
    assert_eq!(payloads, ["topic:a", "topic:b"]);

    let many: Vec<String> = (0..17).map(|i| format!("'t{i}'")).collect();
    backend.execute(&insert(&many.join(", "))).await;
    assert_eq!(next().await, "", "17 topics");
    let long = format!("'{}'", "x".repeat(256));
    backend.execute(&insert(&long)).await;
    assert_eq!(next().await, "", "a topic no filter can name");
    // Nothing was left over: the next notification is the next statement's.
    backend.execute(&insert("'c'")).await;
    assert_eq!(next().await, "topic:c");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_starting_together_create_the_schema_once() {
    let backend = PgBackend::new().await;
    let setup = Setup {
        notify: true,
        ..Setup::default()
    };
    let mut storages = Vec::new();
    for _ in 0..3 {
        storages.push(
            PostgresStorage::connect(&url(), 2, backend.options(&setup), backend.extras(&setup))
                .await
                .unwrap(),
        );
    }
    let created = futures::future::join_all(storages.iter().map(|s| s.ensure_table())).await;
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    storages[0].verify_table().await.unwrap();
    let sql = storages[0].schema_sql();
    assert!(
        sql.contains(&format!("\"{}\".\"outbox\"", backend.schema)),
        "{sql}"
    );
}

#[tokio::test]
async fn pools_run_without_jit() {
    let pool = lazy_pool(&url(), 1, SynchronousCommit::default()).unwrap();
    let jit: String = sqlx::query_scalar("SHOW jit")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(jit, "off");
}

/// `databases.NAME.synchronous_commit` reaches the relay's sessions: `off` by default,
/// what is configured otherwise, whatever the URL's own options say.
#[tokio::test]
async fn pools_run_with_the_configured_synchronous_commit() {
    let with_url_option = format!("{}?options=-c%20synchronous_commit%3Dlocal", url());
    for (url, setting, expected) in [
        (url(), SynchronousCommit::default(), "off"),
        (url(), SynchronousCommit::On, "on"),
        (
            with_url_option,
            SynchronousCommit::RemoteWrite,
            "remote_write",
        ),
    ] {
        let pool = lazy_pool(&url, 1, setting).unwrap();
        let shown: String = sqlx::query_scalar("SHOW synchronous_commit")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(shown, expected, "{setting:?}");
        pool.close().await;
    }
}

/// The race the key-heads locks exist for: a producer inserts a row of a key inside a
/// transaction that is still open while the relay acks the key's last pending row. The
/// relay must not declare the key empty behind the producer's back, or the new row would
/// never be claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_inserted_while_its_key_drains_is_still_claimed() {
    let backend = PgBackend::new().await;
    let storage = backend.open(Setup::default()).await;
    let table = format!("\"{}\".outbox", backend.schema);
    for round in 0..10 {
        let first = insert(&*storage, "t", "first", Some("k")).await;
        assert_eq!(
            ids(&claim(&*storage, "w", 10, LEASE).await),
            [first],
            "round {round}"
        );

        let mut producer = PgConnection::connect(&url()).await.unwrap();
        producer.execute("BEGIN").await.unwrap();
        let second: MessageId = sqlx::query_scalar(&format!(
            "INSERT INTO {table} (topic, key, payload) VALUES ('t', 'k', 'second') RETURNING id"
        ))
        .fetch_one(&mut producer)
        .await
        .unwrap();
        // The ack runs while the producer's transaction is open; it may wait for it.
        let acking = {
            let storage = Arc::clone(&storage);
            tokio::spawn(async move { storage.ack(&[first].into(), "w").await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        producer.execute("COMMIT").await.unwrap();
        assert_eq!(acking.await.unwrap(), [first]);

        let got = claim_eventually(&*storage, "w", 1).await;
        assert_eq!(
            ids(&got),
            [second],
            "round {round}: the new row was orphaned"
        );
        storage.ack(&[second].into(), "w").await.unwrap();
    }
}

/// An ack skips the head of a key whose producer transaction is open (neither waits for
/// the other), leaving the head behind on a finished row. The next claim looks past it to
/// the key's first pending row, and moves it on, so claims do not keep walking finished
/// rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_left_behind_by_an_ack_is_moved_on_by_the_next_claim() {
    let backend = PgBackend::new().await;
    let storage = backend.open(Setup::default()).await;
    let table = format!("\"{}\".outbox", backend.schema);
    let heads = format!("\"{}\".outbox_heads", backend.schema);
    let head = || async {
        let mut conn = PgConnection::connect(&url()).await.unwrap();
        sqlx::query_scalar::<_, Option<i64>>(&format!(
            "SELECT head_id FROM {heads} WHERE key = 'k'"
        ))
        .fetch_one(&mut conn)
        .await
        .unwrap()
    };
    let first = insert(&*storage, "t", "first", Some("k")).await;
    assert_eq!(ids(&claim(&*storage, "w", 10, LEASE).await), [first]);

    let mut producer = PgConnection::connect(&url()).await.unwrap();
    producer.execute("BEGIN").await.unwrap();
    let second: MessageId = sqlx::query_scalar(&format!(
        "INSERT INTO {table} (topic, key, payload) VALUES ('t', 'k', 'second') RETURNING id"
    ))
    .fetch_one(&mut producer)
    .await
    .unwrap();
    // Does not wait for the producer: the head stays on the acked row.
    assert_eq!(storage.ack(&[first].into(), "w").await.unwrap(), [first]);
    assert_eq!(
        head().await,
        Some(first),
        "the ack skipped the producer's head"
    );
    producer.execute("COMMIT").await.unwrap();

    assert_eq!(ids(&claim(&*storage, "w", 10, LEASE).await), [second]);
    assert_eq!(head().await, Some(second), "the claim moved the head on");
}

/// A replica restarting with `create_schema` on a table whose schema is current runs no
/// DDL, so it takes no lock a producer's insert needs: `DROP TRIGGER` and
/// `CREATE INDEX` would wait here for the producer's open transaction, and every other
/// producer's insert would queue behind them. A missing object is still put back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensuring_a_current_schema_takes_no_lock_an_insert_needs() {
    let backend = PgBackend::new().await;
    let setup = Setup {
        notify: true,
        ..Setup::default()
    };
    let _first = backend.open(setup.clone()).await;
    let mut producer = PgConnection::connect(&url()).await.unwrap();
    producer.execute("BEGIN").await.unwrap();
    producer
        .execute(
            format!(
                "INSERT INTO {} (topic, key, payload) VALUES ('t', 'k', 'p')",
                backend.qualified()
            )
            .as_str(),
        )
        .await
        .unwrap();
    let restarted =
        PostgresStorage::connect(&url(), 2, backend.options(&setup), backend.extras(&setup))
            .await
            .unwrap();
    restarted
        .ensure_table()
        .await
        .expect("no DDL, so no wait for the producer's open transaction");
    producer.execute("COMMIT").await.unwrap();

    // Objects dropped by hand come back on the next start.
    backend
        .execute(&format!(
            "DROP TRIGGER outbox_heads_on_insert ON {}; DROP INDEX \"{}\".outbox_dead_idx",
            backend.qualified(),
            backend.schema
        ))
        .await;
    restarted.ensure_table().await.unwrap();
    let present: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM pg_trigger WHERE tgrelid = to_regclass($1) \
           AND tgname = 'outbox_heads_on_insert') \
         + (SELECT count(*) FROM pg_class WHERE oid = to_regclass($2))",
    )
    .bind(backend.qualified())
    .bind(format!("\"{}\".outbox_dead_idx", backend.schema))
    .fetch_one(&mut producer)
    .await
    .unwrap();
    assert_eq!(present, 2, "the trigger and the index were put back");
}

/// A relay statement waits at most its session's `lock_timeout` for a lock, then fails as
/// `Unavailable` (retried), whatever holds it: here another session holds the table's
/// claim lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_waiting_past_the_lock_timeout_is_unavailable() {
    let backend = PgBackend::new().await;
    let storage = backend.open(Setup::default()).await;
    insert(&*storage, "t", "p", Some("k")).await;
    let mut holder = PgConnection::connect(&url()).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1, hashtext($2))")
        .bind(0x7478_6f62_i32)
        .bind(format!("txoutbox:{}.outbox", backend.schema))
        .execute(&mut holder)
        .await
        .unwrap();
    let err = storage.claim(request("w")).await.unwrap_err();
    assert!(matches!(err, StorageError::Unavailable(_)), "{err:?}");
    assert!(err.to_string().contains("lock timeout"), "{err}");
}

/// With a hot key's head leased, a claim still finds every other key's head (through the
/// key-heads table) and nothing of the hot key. What it costs is the benchmark's business.
#[tokio::test]
async fn a_blocked_hot_key_does_not_hide_other_keys() {
    let backend = PgBackend::new().await;
    let storage = backend.open(Setup::default()).await;
    let table = format!("\"{}\".outbox", backend.schema);
    backend
        .execute(&format!(
            "INSERT INTO {table} (topic, key, payload) SELECT 't', 'hot', 'x' FROM generate_series(1, 20000); \
             INSERT INTO {table} (topic, key, payload) SELECT 't', 'k' || g, 'y' FROM generate_series(1, 10) g"
        ))
        .await;
    let hot = claim(&*storage, "w1", 5, LEASE).await;
    assert!(hot.iter().all(|m| m.key.as_deref() == Some("hot")));
    let others = claim(&*storage, "w2", 100, LEASE).await;
    let keys: Vec<&str> = others.iter().filter_map(|m| m.key.as_deref()).collect();
    assert_eq!(keys.len(), 10, "{keys:?}");
    assert!(keys.iter().all(|k| *k != "hot"));
}

/// The strict claim function has a statement per batch size bound (`heads.rs`,
/// `CLAIM_CAPS`: 16, 128, 1024, then the batch size itself): each takes the batch asked
/// for, the oldest rows first, on either side of every bound, across keys and along one
/// key's run, and again once the session has cached its plans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_claim_takes_the_batch_asked_for_at_every_size() {
    let backend = PgBackend::new().await;
    let storage = backend.open(Setup::default()).await;
    let table = backend.qualified();
    let sizes = [1_u32, 16, 17, 128, 129, 1024, 1025, 3, 3, 3, 3, 3, 3, 3];
    let rows: u32 = sizes.iter().sum();
    // A key per row (every tenth row keyless), then as many rows of one key.
    backend
        .execute(&format!(
            "INSERT INTO {table} (topic, key, payload) \
             SELECT 't', CASE WHEN g % 10 = 0 THEN NULL ELSE 'k' || g END, 'x' \
             FROM generate_series(1, {rows}) g; \
             INSERT INTO {table} (topic, key, payload) \
             SELECT 't', 'hot', 'x' FROM generate_series(1, {rows}) g"
        ))
        .await;
    let mut next = 1;
    for round in ["a key per row", "one key"] {
        for size in sizes {
            let taken = ids(&claim(&*storage, "w", size, LEASE).await);
            assert_eq!(taken.len(), size as usize, "{round}: batch of {size}");
            let expected: Vec<MessageId> = (next..next + MessageId::from(size)).collect();
            assert_eq!(taken, expected, "{round}: batch of {size}");
            next += MessageId::from(size);
            // Acked, so the hot key's next rows are free for the next claim.
            storage.ack(&taken.into(), "w").await.unwrap();
        }
    }
}

/// A strict table's blocked keys come from its key-heads table: the same keys as the scan
/// of a table without heads, oldest head first, paged by head id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_keys_of_a_strict_table_match_those_of_the_scan() {
    for strict_ordering in [true, false] {
        let backend = PgBackend::new().await;
        let storage = backend
            .open(Setup {
                strict_ordering,
                ..Setup::default()
            })
            .await;
        let table = backend.qualified();
        backend
            .execute(&format!(
                "INSERT INTO {table} (topic, key, payload) \
                 SELECT 't', 'k' || (g % 20), 'x' FROM generate_series(1, 200) g"
            ))
            .await;
        // Every third key's head is leased, every fifth (not third) waits for a retry.
        backend
            .execute(&format!(
                "UPDATE {table} SET leased_by = 'w' || id, available_at = now() + interval '1 hour' \
                 WHERE id IN (SELECT min(id) FROM {table} GROUP BY key) AND id % 3 = 0; \
                 UPDATE {table} SET available_at = now() + interval '1 hour', last_error = 'e' \
                 WHERE id IN (SELECT min(id) FROM {table} GROUP BY key) AND id % 5 = 0 \
                   AND id % 3 <> 0"
            ))
            .await;
        let all = storage.blocked_keys(0, 100).await.unwrap();
        let heads: Vec<MessageId> = all.iter().map(|b| b.head_id).collect();
        assert_eq!(
            heads,
            [3, 5, 6, 9, 10, 12, 15, 18, 20],
            "strict: {strict_ordering}"
        );
        assert!(all.iter().all(|b| b.waiting_behind == 9));
        assert_eq!(all[0].owner.as_deref(), Some("w3"));
        let page = storage.blocked_keys(9, 2).await.unwrap();
        let heads: Vec<MessageId> = page.iter().map(|b| b.head_id).collect();
        assert_eq!(heads, [10, 12]);
    }
}

/// Measures `blocked_keys` on 1,000,000 pending rows over 10,000 keys, 200 heads leased
/// at the lowest ids, pages of 50, on a strict table (through its key-heads table) and
/// on one without strict ordering (the scan of pending rows): BENCHMARKS.md, "Blocked
/// keys". A measurement, not a check:
/// `cargo nextest run -p txoutbox-server --run-ignored only blocked_keys_cost --no-capture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement of about a minute, not a check: see BENCHMARKS.md"]
async fn blocked_keys_cost_on_a_million_pending_rows() {
    for strict_ordering in [false, true] {
        let backend = PgBackend::new().await;
        let storage = backend
            .open(Setup {
                strict_ordering,
                ..Setup::default()
            })
            .await;
        let table = backend.qualified();
        backend
            .execute(&format!(
                "INSERT INTO {table} (topic, key, payload) \
                 SELECT 't', 'k' || (g % 10000), 'x' FROM generate_series(1, 1000000) g; \
                 UPDATE {table} SET leased_by = 'w', available_at = now() + interval '1 hour' \
                 WHERE id IN (SELECT min(id) FROM {table} GROUP BY key ORDER BY 1 LIMIT 200); \
                 ANALYZE {table}"
            ))
            .await;
        let first = storage.blocked_keys(0, 50).await.unwrap();
        assert_eq!(first.len(), 50);
        let last_blocked = storage.blocked_keys(0, 1000).await.unwrap();
        assert_eq!(last_blocked.len(), 200);
        let past = last_blocked[199].head_id;
        for (page, after_id) in [("first page", 0), ("past the last blocked key", past)] {
            let mut best = Duration::MAX;
            for _ in 0..5 {
                let start = Instant::now();
                storage.blocked_keys(after_id, 50).await.unwrap();
                best = best.min(start.elapsed());
            }
            println!(
                "blocked_keys, strict_ordering = {strict_ordering}, {page}: best of 5 {best:?}"
            );
        }
    }
}

/// A producer whose id was drawn before a higher one that committed first, and was
/// claimed (the floor passed it), commits later: its row is still claimed although newer
/// rows would fill every batch (within the floor's interval, `storage/postgres/floor.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyless_row_committed_after_a_higher_id_was_claimed_is_claimed_while_newer_rows_keep_coming(
) {
    let backend = PgBackend::new().await;
    let storage = backend
        .open(Setup {
            strict_ordering: false,
            ..Setup::default()
        })
        .await;
    let mut producer = PgConnection::connect(&url()).await.expect("connect");
    producer.execute("BEGIN").await.unwrap();
    let late: MessageId = sqlx::query_scalar(&format!(
        "INSERT INTO {} (topic, payload) VALUES ('t', 'late') RETURNING id",
        backend.qualified()
    ))
    .fetch_one(&mut producer)
    .await
    .unwrap();
    for _ in 0..3 {
        insert(&*storage, "t", "newer", None).await;
    }
    let got = claim(&*storage, "w1", 3, LEASE).await;
    assert!(ids(&got).iter().all(|id| *id > late), "{got:?}");
    producer.execute("COMMIT").await.unwrap();
    claims_until_claimed(&*storage, late).await;
}

/// A storage on a pool of one connection, its table made: every statement runs in one
/// session, so a test can read that session's plan counts and statistics through `pool`.
async fn one_session_storage(backend: &PgBackend, setup: &Setup) -> (PgPool, PostgresStorage) {
    let pool = lazy_pool(&url(), 1, SynchronousCommit::default()).unwrap();
    let storage = PostgresStorage::from_pool(
        pool.clone(),
        None,
        backend.options(setup),
        backend.extras(setup),
    )
    .unwrap();
    storage.ensure_table().await.unwrap();
    (pool, storage)
}

/// The keyless claim is planned once per connection, not at every call: from the sixth
/// call on, PostgreSQL runs its cached generic plan (`sql::claim`: planning it cost
/// 0.25 ms a claim, 2-3 µs a message, when its only limit was the batch parameter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keyless_claim_runs_a_cached_generic_plan() {
    let backend = PgBackend::new().await;
    let setup = Setup {
        strict_ordering: false,
        ..Setup::default()
    };
    // One connection: the test reads the plan counts of the claim's own session.
    let (pool, storage) = one_session_storage(&backend, &setup).await;
    backend
        .execute(&format!(
            "INSERT INTO {} (topic, payload) SELECT 't', 'p' FROM generate_series(1, 50000)",
            backend.qualified()
        ))
        .await;
    // A backlog as the planner sees it: a tenth of it is far more than a batch.
    backend
        .execute(&format!("ANALYZE {}", backend.qualified()))
        .await;
    for _ in 0..20 {
        assert_eq!(claim(&storage, "w1", 100, LEASE).await.len(), 100);
    }
    let (generic, custom): (i64, i64) = sqlx::query_as(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements \
         WHERE statement LIKE 'WITH above AS%'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (generic, custom),
        (15, 5),
        "(generic, custom) plans of 20 claims"
    );
}

/// A session's cached plans outlive the table size they were made for: the claims, reads
/// and acks of a session that began on a table of a few rows still probe the indexes
/// once the table is large (20,000 delivered rows kept, and on a strict table 20,000
/// pending rows of a key leased elsewhere, which hold the key back). Before the relay's
/// sessions ran with `enable_seqscan = off`, the lock, the update and the read of every
/// strict claim scanned the whole table from then on.
/// Counted by the table's statistics: no sequential scan, and index reads near the rows
/// handed out, not near the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_made_on_a_small_table_probe_its_indexes_once_it_is_large() {
    for strict_ordering in [true, false] {
        let backend = PgBackend::new().await;
        let setup = Setup {
            strict_ordering,
            ..Setup::default()
        };
        // One connection: every statement of the relay runs in the session whose plans
        // were made early, and the test flushes that session's statistics.
        let (pool, storage) = one_session_storage(&backend, &setup).await;
        let table = backend.qualified();
        let round = async |n: usize| {
            backend
                .execute(&format!(
                    "INSERT INTO {table} (topic, key, payload) \
                     SELECT 't', 'k{n}_' || g, 'x' FROM generate_series(1, 3) g"
                ))
                .await;
            let claimed = claim(&storage, "w", 100, LEASE).await;
            assert_eq!(claimed.len(), 3, "strict: {strict_ordering}, round {n}");
            storage.ack(&ids(&claimed).into(), "w").await.unwrap();
        };
        // More than the five calls after which PostgreSQL may settle on a generic plan.
        for n in 0..10 {
            round(n).await;
        }
        // Without strict ordering a claim that finds less than its batch walks the rows
        // leased elsewhere (`postgres/floor.rs`), so only the strict table gets them.
        let stuck = if strict_ordering { 20_000 } else { 0 };
        backend
            .execute(&format!(
                "INSERT INTO {table} (topic, key, payload, status, processed_at) \
                 SELECT 't', 'd' || g, 'x', 'done', now() FROM generate_series(1, 20000) g; \
                 INSERT INTO {table} (topic, key, payload) \
                 SELECT 't', 'stuck', 'x' FROM generate_series(1, {stuck}) g; \
                 UPDATE {table} SET leased_by = 'other', available_at = now() + interval '1 hour' \
                 WHERE key = 'stuck'; \
                 SELECT pg_stat_force_next_flush()"
            ))
            .await;
        // The statistics count every session's scans: this setup's own (its update may
        // scan) are flushed before the count starts, or they could land inside it.
        let before = scans_of(&pool, &backend).await;
        for n in 10..15 {
            round(n).await;
        }
        let after = scans_of(&pool, &backend).await;
        assert_eq!(
            after.0, before.0,
            "strict: {strict_ordering}: sequential scans of the table by the relay's session"
        );
        let fetched = after.1 - before.1;
        assert!(
            fetched < 1_000,
            "strict: {strict_ordering}: {fetched} rows read through indexes for 15 rows claimed"
        );
    }
}

/// Sequential scans and rows fetched by index scans of the test's table, with the pool's
/// session's own counts flushed first.
async fn scans_of(pool: &PgPool, backend: &PgBackend) -> (i64, i64) {
    let mut conn = pool.acquire().await.unwrap();
    // Flushed when the session next goes idle, that is before the query after it.
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_as(
        "SELECT seq_scan, coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables \
         WHERE schemaname = $1 AND relname = $2",
    )
    .bind(&backend.schema)
    .bind(&backend.table)
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

/// PostgreSQL's claim ahead does follow its owner's own rows: what lets a stream hold two
/// batches of a hot key (the contract allows a backend not to).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_ahead_follows_the_owners_own_rows() {
    let backend = PgBackend::new().await;
    let got = cases::claim_ahead_goes_on_only_past_the_owners_own_rows(&backend).await;
    assert_eq!(
        got.len(),
        3,
        "the key's two rows after the owner's, and the keyless row: {got:?}"
    );
}

/// `databases.NAME.statement_timeout` is the sessions' own `statement_timeout`: the
/// database ends a statement past it, and the relay reads that as UNAVAILABLE.
#[tokio::test]
async fn sessions_end_a_statement_past_the_configured_statement_timeout() {
    let timeouts = txoutbox_server::config::Timeouts {
        acquire: Duration::from_secs(3),
        statement: Duration::from_millis(300),
    };
    let pool = txoutbox_server::storage::postgres::lazy_pool_with(
        &url(),
        1,
        SynchronousCommit::default(),
        timeouts,
    )
    .unwrap();
    let shown: String = sqlx::query_scalar("SHOW statement_timeout")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(shown, "300ms");
    let error = sqlx::query("SELECT pg_sleep(5)")
        .execute(&pool)
        .await
        .unwrap_err();
    let code = error.as_database_error().and_then(|e| e.code());
    assert_eq!(code.as_deref(), Some("57014"), "{error}");
    pool.close().await;
}

//! The end-to-end suite, once for every backend: a real `txoutboxd` process on a fresh
//! database, real gRPC subscribers. `e2e_suite!(name, database)` expands to one test per
//! case of `e2e/cases.rs`, each with its own database from the expression (which may
//! `.await`): PostgreSQL, SQLite, MariaDB, and a team's own PostgreSQL table with a
//! column mapping. What only one backend has lives in its own file (`subscribe.rs` for
//! PostgreSQL's NOTIFY, kill and drain cases, `sqlite.rs`, `mariadb.rs`).

#[path = "e2e/cases.rs"]
mod cases;

use txoutbox_tests::{MappedPgDb, MariaDb, SqliteDb, TestDb};

macro_rules! e2e_suite {
    ($backend:ident, $database:expr) => {
        mod $backend {
            use super::*;

            e2e_suite!(@cases $database;
                subscriber_receives_in_order_and_acks,
                nack_retries_with_backoff_then_dead_letters_at_max_attempts,
                nack_holds_back_the_rest_of_the_key_and_releases_it_untried,
                acks_sent_back_to_back_are_each_confirmed,
                a_zero_window_stops_batches_until_reopened,
                per_key_order_holds_with_four_subscribers_and_random_nacks,
                two_server_processes_on_one_table_never_lease_a_row_twice,
                rows_and_dead_letter_pages_stay_within_max_message_bytes,
            );
        }
    };
    (@cases $database:expr; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                cases::$case($database).await;
            }
        )+
    };
}

e2e_suite!(postgres, TestDb::new().await);
e2e_suite!(postgres_mapped, MappedPgDb::new().await);
e2e_suite!(sqlite, SqliteDb::new().await);
e2e_suite!(mariadb, MariaDb::new().await);

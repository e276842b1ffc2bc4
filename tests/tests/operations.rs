//! Operations against a real `txoutboxd` on every backend: dead letters listed,
//! counted, re-driven in id order per key (checked through a real streaming subscriber)
//! and discarded; an outbox paused and resumed across two replicas and a restart; through
//! the Admin RPCs and the `txoutbox` command line; the subscribers of two replicas.
//! `operations_suite!(name, database)` expands to one test per case of
//! `operations/dead_letters.rs`, each on its own fresh database.

#[path = "operations/blocked.rs"]
mod blocked;
#[path = "operations/dead_holds.rs"]
mod dead_holds;
#[path = "operations/dead_letters.rs"]
mod dead_letters;
#[path = "operations/pause.rs"]
mod pause;
#[path = "operations/stats.rs"]
mod stats;
#[path = "operations/subscribers.rs"]
mod subscribers;

use txoutbox_tests::{MappedPgDb, MariaDb, SqliteDb, TestDb};

macro_rules! operations_suite {
    ($backend:ident, $database:expr) => {
        mod $backend {
            use super::*;

            operations_suite!(@cases $database;
                dead_letters::dead_letters_are_listed_counted_and_discarded,
                dead_letters::redriven_rows_arrive_in_id_order_per_key,
                dead_letters::the_command_line_acts_only_with_yes,
                dead_holds::a_dead_row_holds_its_key_until_redriven_or_discarded,
                pause::a_pause_holds_on_every_replica_and_across_a_restart,
                pause::the_command_line_pauses_shows_it_and_resumes,
                pause::a_topic_pause_holds_on_every_replica_and_across_a_restart,
                pause::the_command_line_pauses_a_topic_and_resumes_it,
                stats::stats_count_retry_waiting_throughput_and_fenced_answers,
                blocked::a_stuck_key_is_found_with_its_holder,
                subscribers::each_replica_lists_its_streams_and_every_lease_holder,
                subscribers::the_command_line_lists_subscribers,
            );
        }
    };
    (@cases $database:expr; $($module:ident :: $case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $module::$case($database).await;
            }
        )+
    };
}

operations_suite!(postgres, TestDb::new().await);
operations_suite!(postgres_mapped, MappedPgDb::new().await);
operations_suite!(sqlite, SqliteDb::new().await);
operations_suite!(mariadb, MariaDb::new().await);

//! A PostgreSQL schema of a test's own, in the database the contract suites share, dropped
//! when the test ends, pass or fail.

use sqlx::postgres::PgConnection;
use sqlx::{Connection, Executor};

pub fn url() -> String {
    std::env::var("TXOUTBOX_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A schema name no other test uses, so tests run in parallel without seeing each other.
pub fn fresh_schema() -> String {
    format!(
        "contract_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// Drops the schema when the test ends, pass or fail, on a thread of its own since
/// `Drop` cannot await.
pub struct DropSchema(pub String);

impl Drop for DropSchema {
    fn drop(&mut self) {
        let sql = format!(
            "SET lock_timeout = '5s'; DROP SCHEMA IF EXISTS \"{}\" CASCADE",
            self.0
        );
        let dropper = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                if let Ok(mut conn) = PgConnection::connect(&url()).await {
                    let _ = conn.execute(sql.as_str()).await;
                }
            });
        });
        let _ = dropper.join();
    }
}

//! The groups' DDL, run once per outbox by the server that starts first, and the check of
//! what an earlier start created.

use sqlx::{Executor, Postgres};

use super::{GroupSql, PostgresGroups, LOCK_CLASS_GROUPS};
use crate::config::ident::quote;
use crate::config::GroupStart;
use crate::storage::groups::sql::{groups_missing, partitions_changed, GroupDb};
use crate::storage::groups::OutboxGroups;
use crate::storage::names::Names;
use crate::storage::StorageResult;

impl PostgresGroups {
    /// See [`crate::storage::groups::GroupStore::schema_sql`].
    pub(super) fn schema_sql(&self) -> String {
        self.sql.ddl.clone()
    }

    pub(super) async fn ensure(&self, outbox: OutboxGroups<'_>, create: bool) -> StorageResult<()> {
        let OutboxGroups { groups, partitions } = outbox;
        let s = &self.sql;
        if create {
            // Refused before the DDL, which would add the new count's index for nothing;
            // the check under the groups' lock below still decides a race.
            let created: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
                .bind(&s.groups)
                .fetch_one(&self.pool)
                .await
                .map_err(self.error("check groups"))?;
            if created.is_some() {
                self.refuse_other_partitions(&self.pool, partitions).await?;
            }
            // One simple query, one transaction; servers starting together wait for each
            // other on the advisory lock.
            let run = format!(
                "BEGIN; SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0; \
                 SELECT pg_advisory_xact_lock({LOCK_CLASS_GROUPS}, hashtext({lock})); {ddl} COMMIT;",
                lock = super::super::shape::literal(&s.lock_key),
                ddl = s.ddl
            );
            self.pool
                .execute(run.as_str())
                .await
                .map_err(self.error("create groups"))?;
        }
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(self.error("create groups"))?;
        sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
            .bind(LOCK_CLASS_GROUPS)
            .bind(&s.lock_key)
            .execute(&mut *tx)
            .await
            .map_err(self.error("create groups"))?;
        if !create {
            let present: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
                .bind(&s.messages)
                .fetch_one(&mut *tx)
                .await
                .map_err(self.error("check groups"))?;
            if present.is_none() {
                return Err(groups_missing(&self.display_table, "column and tables"));
            }
        }
        self.refuse_other_partitions(&mut *tx, partitions).await?;
        self.create_groups(&mut tx, groups, partitions).await?;
        tx.commit().await.map_err(self.error("create groups"))
    }

    /// The groups' partition count is fixed when the first group is created: a start
    /// with another is refused.
    async fn refuse_other_partitions<'e>(
        &self,
        executor: impl sqlx::Executor<'e, Database = Postgres>,
        partitions: u32,
    ) -> StorageResult<()> {
        let mismatched = Postgres::other_partitions(executor, &self.sql.groups, partitions)
            .await
            .map_err(self.error("create groups"))?;
        match mismatched {
            Some((group, was)) => Err(partitions_changed(
                &self.display_table,
                &group,
                was,
                partitions,
            )),
            None => Ok(()),
        }
    }
    /// The groups not created yet, each with its partitions at its start, in the
    /// transaction that holds the groups' lock.
    async fn create_groups(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        groups: &[(String, GroupStart)],
        partitions: u32,
    ) -> StorageResult<()> {
        let s = &self.sql;
        for (group, start) in groups {
            let created: Option<String> = sqlx::query_scalar(&format!(
                "INSERT INTO {} (name, partitions) VALUES ($1, $2) ON CONFLICT DO NOTHING \
                 RETURNING name",
                s.groups
            ))
            .bind(group)
            .bind(partitions as i32)
            .fetch_optional(&mut **tx)
            .await
            .map_err(self.error("create groups"))?;
            if created.is_none() {
                continue;
            }
            let (txid, id) = match start {
                GroupStart::Oldest => ("0".to_owned(), "0".to_owned()),
                GroupStart::Now => (
                    "pg_snapshot_xmin(pg_current_snapshot())::text::int8 - 1".to_owned(),
                    i64::MAX.to_string(),
                ),
            };
            sqlx::query(&format!(
                "INSERT INTO {} (group_name, partition, pos_txid, pos_id) \
                 SELECT $1, p, {txid}, {id} FROM generate_series(0, $2 - 1) AS p \
                 ON CONFLICT DO NOTHING",
                s.partitions
            ))
            .bind(group)
            .bind(partitions as i32)
            .execute(&mut **tx)
            .await
            .map_err(self.error("create groups"))?;
        }
        Ok(())
    }
}

impl GroupSql {
    /// The groups' DDL for `table` (its bare name).
    pub(super) fn render_ddl(&self, table: &str, partitions: u32) -> String {
        ddl(self, &self.names, table, partitions)
    }
}

fn ddl(s: &GroupSql, n: &Names, table: &str, partitions: u32) -> String {
    // Unqualified: PostgreSQL creates an index in its table's schema.
    let index = quote(&format!("{table}_log_p{partitions}_idx"));
    // The index expression is the read's, without the alias.
    let part = s.part.replace("o.", "");
    format!(
        "-- Subscription groups: the inserting transaction of each row (log order), an index
-- per partition in that order, and the relay's own tables. Adding the column to a
-- table that has rows rewrites it once.
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS txid xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX IF NOT EXISTS {index} ON {t} ({part}, txid, {id});
CREATE TABLE IF NOT EXISTS {groups} (
    name       TEXT        PRIMARY KEY,
    partitions INT4        NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    paused_at  TIMESTAMPTZ
);
ALTER TABLE {groups} ADD COLUMN IF NOT EXISTS paused_at TIMESTAMPTZ;
CREATE TABLE IF NOT EXISTS {parts} (
    group_name       TEXT        NOT NULL,
    partition        INT4        NOT NULL,
    owner            TEXT,
    epoch            INT8        NOT NULL DEFAULT 0,
    lease_expires_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    pos_txid         INT8        NOT NULL,
    pos_id           INT8        NOT NULL,
    PRIMARY KEY (group_name, partition)
);
CREATE TABLE IF NOT EXISTS {members} (
    group_name TEXT        NOT NULL,
    member     TEXT        NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (group_name, member)
);
CREATE TABLE IF NOT EXISTS {messages} (
    group_name TEXT        NOT NULL,
    id         INT8        NOT NULL,
    partition  INT4        NOT NULL,
    key        TEXT,
    pos_txid   INT8        NOT NULL,
    kind       TEXT        NOT NULL CHECK (kind IN ('retry', 'held', 'dead')),
    attempts   INT4        NOT NULL,
    due_at     TIMESTAMPTZ NOT NULL,
    error      TEXT,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (group_name, id)
);
CREATE INDEX IF NOT EXISTS {messages_key_idx} ON {messages} (group_name, key);
",
        t = s.table,
        id = n.id,
        groups = s.groups,
        parts = s.partitions,
        members = s.members,
        messages = s.messages,
        messages_key_idx = quote(&format!("{table}_group_messages_key_idx")),
    )
}

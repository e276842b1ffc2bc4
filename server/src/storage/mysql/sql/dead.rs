//! The dead-letter statements of this backend (see `storage/dead.rs`).

use super::{placeholders, Statements};
use crate::storage::dead::FilterDialect;
use crate::storage::names::Names;

/// The dead-letter statements (see `dead.rs`), rendered per call: the selector's
/// `conditions` vary. Placeholders are `?` in the order the statement reads.
impl Statements {
    /// Dead rows in id order: `?` after this id, the selector, `?` at most.
    pub fn dead_list(&self, conditions: &str) -> String {
        let c = &self.names;
        let Names {
            id,
            status,
            last_error,
            processed_at,
            ..
        } = c;
        format!(
            "SELECT {message}, \
               COALESCE(o.{last_error}, '') AS last_error, o.{processed_at} AS died_at \
             FROM {t} o WHERE o.{status} = 'dead' AND o.{id} > ?{conditions} \
             ORDER BY o.{id} LIMIT ?",
            message = self.message(),
            t = self.table,
        )
    }

    /// Dead rows by topic and error, largest groups first, each with the total of every
    /// group: the selector, then `?` groups at most.
    pub fn dead_count(&self, conditions: &str) -> String {
        let c = &self.names;
        format!(
            "SELECT {topic} AS topic, COALESCE(o.{last_error}, '') AS error, \
               CAST(COUNT(*) AS SIGNED) AS count, \
               CAST(SUM(COUNT(*)) OVER () AS SIGNED) AS total \
             FROM {t} o WHERE o.{status} = 'dead'{conditions} \
             GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2 LIMIT ?",
            topic = c.topic("o."),
            last_error = c.last_error,
            status = c.status,
            t = self.table,
        )
    }

    /// Locks the first `?` selected dead rows (the selector first), in id order, for a
    /// re-drive or a discard in the same transaction.
    pub fn dead_lock(&self, conditions: &str) -> String {
        let Names { id, status, .. } = &self.names;
        format!(
            "SELECT CAST(o.{id} AS SIGNED) FROM {t} o WHERE o.{status} = 'dead'{conditions} \
             ORDER BY o.{id} LIMIT ? FOR UPDATE SKIP LOCKED",
            t = self.table,
        )
    }

    /// Makes `n` locked dead rows pending again: `?` delay in microseconds, then the ids.
    pub fn dead_redrive(&self, n: usize) -> String {
        let Names {
            id,
            status,
            attempts,
            available_at,
            leased_by,
            processed_at,
            ..
        } = &self.names;
        format!(
            "UPDATE {t} SET {status} = 'pending', {attempts} = 0, \
             {available_at} = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, {leased_by} = NULL, \
             {processed_at} = NULL WHERE {id} IN ({ids})",
            t = self.table,
            ids = placeholders(n)
        )
    }

    /// Deletes `n` locked dead rows.
    pub fn dead_discard(&self, n: usize) -> String {
        let id = &self.names.id;
        format!(
            "DELETE FROM {t} WHERE {id} IN ({ids})",
            t = self.table,
            ids = placeholders(n)
        )
    }
}

/// How the dead-letter selector is written here: `?` in reading order, one per id.
pub(crate) const FILTER: FilterDialect = FilterDialect {
    placeholder: |_| "?".to_owned(),
    in_ids: |column, next, count| {
        let list: Vec<String> = (0..count).map(|_| next()).collect();
        format!("{column} IN ({})", list.join(", "))
    },
    contains: |column, placeholder| format!("LOCATE({placeholder}, {column}) > 0"),
};

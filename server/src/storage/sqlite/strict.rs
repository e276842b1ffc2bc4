//! Strict ordering: a row is claimed only when no earlier pending row of its key holds it
//! back ([`Statements::held_back`]). Sound because a claim runs under `BEGIN IMMEDIATE`:
//! claims on a file run one at a time, each seeing what the one before it leased (see the
//! module docs of the backend).

use super::shape::Statements;

impl Statements {
    /// The filter of a claim's candidates under strict ordering, with the parameters of
    /// the visibility cutoff and the topics (`except`: paused ones) where the claim has
    /// them. As in PostgreSQL: an earlier pending row of the key holds this one back
    /// unless this very claim can take it (it then comes first in id order). Not
    /// claimable: leased or waiting for a retry, not visible yet, or outside the topic
    /// filter.
    pub fn held_back(
        &self,
        cutoff_param: Option<&str>,
        topics_param: Option<&str>,
        except: bool,
    ) -> String {
        let topic = self.names.topic("");
        let mut blocked = self.fill("p.{available_at} > ?1", &[]);
        if let Some(p) = cutoff_param {
            blocked += &self.fill(" OR p.{created_at} > {p}", &[("p", &p)]);
        }
        if let Some(p) = topics_param {
            let not = if except { "" } else { "NOT " };
            blocked += &format!(" OR p.{topic} {not}IN (SELECT value FROM json_each({p}))");
        }
        let mut filters = self.fill(
            " AND (o.{key} IS NULL OR NOT EXISTS (SELECT 1 FROM {t} p \
             WHERE p.{key} = o.{key} AND p.{id} < o.{id} AND p.{status} = 'pending' \
             AND ({blocked})))",
            &[("blocked", &blocked)],
        );
        if self.dead_holds_key {
            // `dead_letter_holds_key`: an earlier dead row of the key holds it back too,
            // found through the `(key, id)` index of dead rows.
            filters += &self.fill(
                " AND (o.{key} IS NULL OR NOT {dead_before})",
                &[("dead_before", &self.dead_before("o"))],
            );
        }
        filters
    }
}

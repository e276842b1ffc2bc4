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
        let topic = self.table.names.topic("");
        let mut blocked = self.fill("p.{available_at} > ?1", &[]);
        if let Some(p) = cutoff_param {
            blocked += &self.fill(" OR p.{created_at} > {p}", &[("p", &p)]);
        }
        if let Some(p) = topics_param {
            let not = if except { "" } else { "NOT " };
            blocked += &format!(" OR p.{topic} {not}IN (SELECT value FROM json_each({p}))");
        }
        self.table
            .no_earlier_blocking(&blocked, self.dead_holds_key)
    }
}

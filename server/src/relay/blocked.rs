//! `Admin.ListBlockedKeys`: keys whose head is leased or waiting for a retry (or dead,
//! under `dead_letter_holds_key`), oldest head first, a page at a time (see
//! [`crate::storage::blocked`] for what it costs).

use super::dead_letters::limit;
use super::groups::no_groups_argument;
use super::{Admin, Outbox, RelayError, RelayResult};
use crate::storage::{BlockedKey, MessageId};

impl Admin {
    /// Blocked keys whose head id is above `after_id`; `page` 0 means the default size.
    pub async fn blocked_keys(
        &self,
        after_id: MessageId,
        page: u32,
    ) -> RelayResult<Vec<BlockedKey>> {
        Ok(self.storage.blocked_keys(after_id, limit(page)?).await?)
    }
}

impl Outbox {
    /// The keys held back in `group` (empty: the outbox's per-row state), by head id
    /// above `after_id`.
    pub async fn blocked_keys(
        &self,
        group: &str,
        after_id: MessageId,
        page: u32,
    ) -> RelayResult<Vec<BlockedKey>> {
        if group.is_empty() {
            self.per_row_blocked()?;
            return self.admin.blocked_keys(after_id, page).await;
        }
        let groups = self.groups().map_err(no_groups_argument)?;
        let settings = groups.settings(group)?;
        let page = limit(page)?;
        let holds = settings.dead_letter_holds_key;
        Ok(groups
            .store
            .blocked_keys(group, holds, after_id, page)
            .await?)
    }

    /// The per-row blocked keys of an outbox delivered by groups would always be none.
    fn per_row_blocked(&self) -> RelayResult<()> {
        let Ok(groups) = self.groups() else {
            return Ok(());
        };
        let names: Vec<&str> = groups.names().collect();
        Err(RelayError::InvalidArgument(format!(
            "outbox {} is delivered by subscription groups ({}): name one in `group` \
             (txoutbox blocked --group NAME)",
            self.name,
            names.join(", ")
        )))
    }
}

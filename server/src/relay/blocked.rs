//! `Admin.ListBlockedKeys`: keys whose head is leased or waiting for a retry (or dead,
//! under `dead_letter_holds_key`), oldest head first, a page at a time (see
//! [`crate::storage::blocked`] for what it costs).

use super::dead_letters::limit;
use super::{Admin, RelayResult};
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

//! What a session does when a publish fails or a message is lost: retry, release or
//! dead-letter it, hold back the rest of its key, give back what was published behind it.

use super::{Sent, Session};
use crate::events::{Count, Event};
use crate::proto::v1::{self, subscribe_request::Request};
use crate::subscriber::dispatch::Blocked;
use crate::PublishError;

impl Session {
    /// The publish of an orphaned message ended: give it back (it counts as blocked).
    pub(super) fn give_back_orphan(&mut self, id: i64) {
        if let Some((behind, blocked)) = self.dispatch.orphan_done(id) {
            tracing::info!(owner = %self.owner, id, behind, "giving back a message published behind a lost one");
            self.block(behind, blocked, true);
        }
    }

    /// A publish failed: nack it (or dead-letter it), and hold back the rest of its key.
    pub(super) fn on_failure(&mut self, id: i64, error: PublishError) {
        let blocked = self.dispatch.fail(id).unwrap_or_default();
        // The server refuses a NUL in an error text (the database cannot store one).
        let text = error.text().replace('\0', "\u{FFFD}");
        tracing::info!(owner = %self.owner, id, error = %text, blocked = blocked.ids.len(), permanent = error.is_permanent(), "publish failed");
        let lease_token = self.lease_tokens.remove(&id).unwrap_or_default();
        if error.is_permanent() {
            self.send(
                Request::DeadLetter(v1::DeadLetterMessage {
                    id,
                    error: text.clone(),
                    lease_token,
                }),
                Sent::DeadLetter {
                    id,
                    key: blocked.key.clone(),
                    error: text,
                },
            );
            self.block(id, blocked, true);
            return;
        }
        self.send(
            Request::Nack(v1::NackMessage {
                id,
                error: text.clone(),
                retry_delay_ms: error.retry_delay().map(|d| d.as_millis() as u64),
                lease_token,
            }),
            Sent::Nack {
                id,
                key: blocked.key.clone(),
                error: text,
                blocked: blocked.ids.clone(),
            },
        );
        // The server releases the rest of the key with the nack.
        self.block(id, blocked, false);
    }

    /// The lease of `id` is gone (ran out, or its answer came back fenced): stop its
    /// publish, hold back the rest of its key. When `id` was acking, the later message of
    /// its key that may be publishing is given back once it ends (`dispatch::fail`).
    pub(super) fn lose(&mut self, id: i64) {
        let Some(blocked) = self.dispatch.fail(id) else {
            return;
        };
        if let Some(handle) = self.running.remove(&id) {
            handle.abort();
        }
        self.shared.reporter.add(Count::LeaseLost, 1);
        self.shared.reporter.emit(Event::LeaseLost { id });
        self.block(id, blocked, true);
    }

    /// Reports the messages held back behind `behind`, and gives them back if asked.
    pub(super) fn block(&mut self, behind: i64, blocked: Blocked, give_back: bool) {
        if blocked.ids.is_empty() {
            return;
        }
        self.shared.reporter.add(Count::Blocked, blocked.ids.len());
        for id in &blocked.ids {
            self.shared.reporter.emit(Event::Blocked {
                id: *id,
                key: blocked.key.clone(),
                behind,
            });
        }
        if give_back {
            self.release(blocked.ids, false);
        }
    }

    pub(super) fn release(&mut self, ids: Vec<i64>, untried: bool) {
        if ids.is_empty() {
            return;
        }
        let lease_tokens = self.tokens_of(&ids, true);
        self.send(
            Request::Release(v1::ReleaseMessages {
                ids,
                retry_delay_ms: None,
                lease_tokens,
            }),
            Sent::Release { untried },
        );
    }
}

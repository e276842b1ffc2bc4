//! `txoutbox.v1.Admin`: what is configured, queue depth and lag, housekeeping, and the
//! operator's calls (dead letters in `dead_letters.rs`, pause and resume, blocked keys).

use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};
use txoutbox_proto::v1;

use super::{convert, dead_letters};
use crate::config::Scope;
use crate::relay::Relay;
use crate::security::{audit, Caller};
use crate::storage::NewMessage;

pub struct AdminService {
    relay: Arc<Relay>,
}

impl AdminService {
    pub fn new(relay: Arc<Relay>) -> Self {
        Self { relay }
    }
}

#[tonic::async_trait]
impl v1::admin_server::Admin for AdminService {
    async fn list_outboxes(
        &self,
        request: Request<v1::ListOutboxesRequest>,
    ) -> Result<Response<v1::ListOutboxesResponse>, Status> {
        let caller = Caller::of(&request)?;
        let mut outboxes = Vec::new();
        for outbox in self.relay.outboxes().filter(|o| caller.sees(&o.name)) {
            // An outbox whose database is down is still listed: with this replica's
            // last view of its pauses.
            let pauses = match outbox.admin.pauses_now().await {
                Ok(pauses) => pauses,
                Err(_) => outbox.pauses().await,
            };
            outboxes.push(convert::outbox_info(outbox, pauses));
        }
        Ok(Response::new(v1::ListOutboxesResponse { outboxes }))
    }

    async fn stats(
        &self,
        request: Request<v1::StatsRequest>,
    ) -> Result<Response<v1::StatsResponse>, Status> {
        let caller = Caller::of(&request)?;
        let outbox = caller.outbox(&self.relay, Scope::Read, &request.get_ref().outbox)?;
        let stats = outbox.admin.stats().await?;
        let pauses = match outbox.admin.pauses_now().await {
            Ok(pauses) => pauses,
            Err(_) => outbox.pauses().await,
        };
        let (groups, frontier_delay) = super::groups::stats(outbox, &pauses).await?;
        let extras = convert::StatsExtras {
            pauses,
            delivered_last_minute: match outbox.has_groups() {
                true => None,
                false => outbox.admin.delivered_last_minute().await?,
            },
            fenced_answers: outbox.answers.fenced_count(),
            groups,
            frontier_delay,
        };
        Ok(Response::new(convert::stats(stats, extras)))
    }

    async fn purge(
        &self,
        request: Request<v1::PurgeRequest>,
    ) -> Result<Response<v1::PurgeResponse>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let arguments = match &request.older_than {
            Some(older_than) => format!("older_than={}s", older_than.seconds),
            None => "older_than=none".to_owned(),
        };
        let outcome = async {
            let outbox = caller.outbox(&self.relay, Scope::Admin, &request.outbox)?;
            let older_than = request.older_than.ok_or_else(|| {
                Status::invalid_argument("older_than is required, for example 7 days")
            })?;
            let older_than = Duration::try_from(older_than)
                .map_err(|_| Status::invalid_argument("older_than must not be negative"))?;
            // With groups, only what every group has passed goes.
            let deleted = match outbox.groups() {
                Ok(groups) => groups
                    .store
                    .purge(older_than)
                    .await
                    .map_err(crate::relay::RelayError::from)?,
                Err(_) => outbox.admin.purge(older_than).await?,
            };
            tracing::info!(outbox = %outbox.name, deleted, older_than = %humantime::format_duration(older_than), "purged delivered rows");
            Ok(v1::PurgeResponse { deleted })
        }
        .await;
        audit::record(&caller, "purge", &request.outbox, &arguments, &outcome);
        outcome.map(Response::new)
    }

    async fn schema(
        &self,
        request: Request<v1::SchemaRequest>,
    ) -> Result<Response<v1::SchemaResponse>, Status> {
        let caller = Caller::of(&request)?;
        let name = &request.get_ref().outbox;
        let outcome =
            caller
                .outbox(&self.relay, Scope::Read, name)
                .map(|outbox| v1::SchemaResponse {
                    sql: outbox.storage().schema_sql(),
                });
        audit::record(&caller, "schema", name, "", &outcome);
        outcome.map(Response::new)
    }

    async fn insert_message(
        &self,
        request: Request<v1::InsertMessageRequest>,
    ) -> Result<Response<v1::InsertMessageResponse>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let arguments = format!(
            "topic={} key={} payload_bytes={} headers={}",
            crate::relay::limits::echo(&request.topic),
            request
                .key
                .as_deref()
                .map_or_else(|| "-".to_owned(), crate::relay::limits::echo),
            request.payload.len(),
            request.headers.len()
        );
        let outbox_name = request.outbox.clone();
        let outcome = async {
            let outbox = caller.outbox(&self.relay, Scope::Insert, &request.outbox)?;
            let message = NewMessage {
                topic: request.topic,
                key: request.key,
                payload: request.payload,
                headers: request.headers.into_iter().collect(),
            };
            let id = outbox.admin.insert(message).await?;
            Ok(v1::InsertMessageResponse { id })
        }
        .await;
        audit::record(&caller, "insert", &outbox_name, &arguments, &outcome);
        outcome.map(Response::new)
    }

    async fn list_dead_letters(
        &self,
        request: Request<v1::ListDeadLettersRequest>,
    ) -> Result<Response<v1::ListDeadLettersResponse>, Status> {
        let caller = Caller::of(&request)?;
        dead_letters::list(&self.relay, &caller, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn count_dead_letters(
        &self,
        request: Request<v1::CountDeadLettersRequest>,
    ) -> Result<Response<v1::CountDeadLettersResponse>, Status> {
        let caller = Caller::of(&request)?;
        dead_letters::count(&self.relay, &caller, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn redrive_dead_letters(
        &self,
        request: Request<v1::RedriveDeadLettersRequest>,
    ) -> Result<Response<v1::DeadLetterActionResponse>, Status> {
        let caller = Caller::of(&request)?;
        dead_letters::redrive(&self.relay, &caller, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn discard_dead_letters(
        &self,
        request: Request<v1::DiscardDeadLettersRequest>,
    ) -> Result<Response<v1::DeadLetterActionResponse>, Status> {
        let caller = Caller::of(&request)?;
        dead_letters::discard(&self.relay, &caller, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn pause(
        &self,
        request: Request<v1::PauseRequest>,
    ) -> Result<Response<v1::PauseResponse>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let target = (request.topics.as_slice(), request.group.as_str());
        self.set_paused(&caller, &request.outbox, target, true)
            .await
    }

    async fn resume(
        &self,
        request: Request<v1::ResumeRequest>,
    ) -> Result<Response<v1::PauseResponse>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let target = (request.topics.as_slice(), request.group.as_str());
        self.set_paused(&caller, &request.outbox, target, false)
            .await
    }

    async fn list_blocked_keys(
        &self,
        request: Request<v1::ListBlockedKeysRequest>,
    ) -> Result<Response<v1::ListBlockedKeysResponse>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let outbox = caller.outbox(&self.relay, Scope::Read, &request.outbox)?;
        let keys = outbox
            .blocked_keys(&request.group, request.after_id, request.limit)
            .await?;
        let page = crate::relay::dead_letters::limit(request.limit)?;
        let next_after_id = match keys.last() {
            Some(last) if keys.len() == page as usize => last.head_id,
            _ => 0,
        };
        Ok(Response::new(v1::ListBlockedKeysResponse {
            keys: keys.into_iter().map(convert::blocked_key).collect(),
            next_after_id,
        }))
    }

    async fn seek_group(
        &self,
        request: Request<v1::SeekGroupRequest>,
    ) -> Result<Response<v1::SeekGroupResponse>, Status> {
        let caller = Caller::of(&request)?;
        super::groups::seek(&self.relay, &caller, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn list_subscribers(
        &self,
        request: Request<v1::ListSubscribersRequest>,
    ) -> Result<Response<v1::ListSubscribersResponse>, Status> {
        let caller = Caller::of(&request)?;
        let name = request.into_inner().outbox;
        self.subscribers(&caller, &name).await.map(Response::new)
    }
}

impl AdminService {
    /// `ListSubscribers`: this replica's streams and every replica's lease holders.
    async fn subscribers(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<v1::ListSubscribersResponse, Status> {
        let outbox = caller.outbox(&self.relay, Scope::Read, name)?;
        let lease_holders = outbox.admin.lease_holders().await?;
        Ok(v1::ListSubscribersResponse {
            connected: outbox
                .admin
                .connected()
                .into_iter()
                .map(convert::connected_subscriber)
                .collect(),
            lease_holders: lease_holders
                .into_iter()
                .map(convert::lease_holder)
                .collect(),
        })
    }

    /// `Pause` and `Resume`, audited.
    async fn set_paused(
        &self,
        caller: &Caller,
        name: &str,
        (topics, group): (&[String], &str),
        paused: bool,
    ) -> Result<Response<v1::PauseResponse>, Status> {
        let outcome = async {
            let outbox = caller.outbox(&self.relay, Scope::Admin, name)?;
            let pauses = match PauseTarget::of(topics, group)? {
                PauseTarget::Topics(topics) => outbox.admin.set_paused(topics, paused).await?,
                PauseTarget::Group(group) => outbox.set_group_paused(group, paused).await?,
            };
            Ok(v1::PauseResponse {
                paused_since: pauses.outbox.map(convert::timestamp),
                paused_topics: convert::paused_topics(&pauses),
                paused_groups: convert::paused_groups(&pauses),
            })
        }
        .await;
        let action = if paused { "pause" } else { "resume" };
        let echoed: Vec<String> = topics
            .iter()
            .map(|t| crate::relay::limits::echo(t))
            .collect();
        let arguments = match (echoed.as_slice(), group) {
            ([], "") => String::new(),
            (topics, "") => format!("topics={}", topics.join(",")),
            ([], group) => format!("group={}", crate::relay::limits::echo(group)),
            (topics, group) => format!(
                "topics={} group={}",
                topics.join(","),
                crate::relay::limits::echo(group)
            ),
        };
        audit::record(caller, action, name, &arguments, &outcome);
        outcome.map(Response::new)
    }
}

/// What a `Pause` or `Resume` applies to.
#[derive(Debug, Clone, Copy)]
enum PauseTarget<'a> {
    /// The whole outbox (none) or these topics.
    Topics(&'a [String]),
    Group(&'a str),
}

impl<'a> PauseTarget<'a> {
    fn of(topics: &'a [String], group: &'a str) -> Result<Self, Status> {
        match (topics, group) {
            (topics, "") => Ok(Self::Topics(topics)),
            ([], group) => Ok(Self::Group(group)),
            _ => Err(Status::invalid_argument(
                "a topic's pause does not apply within a subscription group (a key's order \
                 spans topics): pause the group (topics empty), or the topics (group empty) \
                 for per-row claims",
            )),
        }
    }
}

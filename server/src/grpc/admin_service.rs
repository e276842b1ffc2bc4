//! `txoutbox.v1.Admin`: what is configured, queue depth and lag, housekeeping.

use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};
use txoutbox_proto::v1;

use super::convert;
use crate::relay::Relay;
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
        _request: Request<v1::ListOutboxesRequest>,
    ) -> Result<Response<v1::ListOutboxesResponse>, Status> {
        let outboxes = self
            .relay
            .outboxes()
            .map(|outbox| convert::outbox_info(outbox))
            .collect();
        Ok(Response::new(v1::ListOutboxesResponse { outboxes }))
    }

    async fn stats(
        &self,
        request: Request<v1::StatsRequest>,
    ) -> Result<Response<v1::StatsResponse>, Status> {
        let outbox = self.relay.outbox(&request.get_ref().outbox)?;
        Ok(Response::new(convert::stats(outbox.stats().await?)))
    }

    async fn purge(
        &self,
        request: Request<v1::PurgeRequest>,
    ) -> Result<Response<v1::PurgeResponse>, Status> {
        let request = request.into_inner();
        let outbox = self.relay.outbox(&request.outbox)?;
        let older_than = request.older_than.ok_or_else(|| {
            Status::invalid_argument("older_than is required, for example 7 days")
        })?;
        let older_than = Duration::try_from(older_than)
            .map_err(|_| Status::invalid_argument("older_than must not be negative"))?;
        let deleted = outbox.purge(older_than).await?;
        tracing::info!(outbox = %outbox.name, deleted, older_than = %humantime::format_duration(older_than), "purged delivered rows");
        Ok(Response::new(v1::PurgeResponse { deleted }))
    }

    async fn schema(
        &self,
        request: Request<v1::SchemaRequest>,
    ) -> Result<Response<v1::SchemaResponse>, Status> {
        let outbox = self.relay.outbox(&request.get_ref().outbox)?;
        Ok(Response::new(v1::SchemaResponse {
            sql: outbox.storage().schema_sql(),
        }))
    }

    async fn insert_message(
        &self,
        request: Request<v1::InsertMessageRequest>,
    ) -> Result<Response<v1::InsertMessageResponse>, Status> {
        let request = request.into_inner();
        let outbox = self.relay.outbox(&request.outbox)?;
        let message = NewMessage {
            topic: request.topic,
            key: request.key,
            payload: request.payload,
            headers: request.headers.into_iter().collect(),
        };
        let id = outbox.insert(message).await?;
        Ok(Response::new(v1::InsertMessageResponse { id }))
    }
}

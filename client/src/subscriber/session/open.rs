//! Opening a `Subscribe` stream: the `open` request, its `subscribed` answer, a fresh
//! [`Session`] for it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Endpoint;
use tonic::Streaming;

use super::{Dispatch, End, Session, Shared};
use crate::connect::{error_chain, BearerToken};
use crate::error::is_permanent;
use crate::proto::v1::relay_client::RelayClient;
use crate::proto::v1::subscribe_request::Request;
use crate::proto::v1::subscribe_response::Response;
use crate::proto::v1::{self, SubscribeRequest};

/// Opens a stream on `endpoint`, its calls carrying `token`. `Err` carries the end to
/// report.
pub(in crate::subscriber) async fn open(
    shared: &Arc<Shared>,
    address: String,
    endpoint: Endpoint,
    token: BearerToken,
) -> Result<(Session, Streaming<v1::SubscribeResponse>), End> {
    let config = &shared.config;
    let channel = endpoint
        .connect()
        .await
        .map_err(|error| End::Lost(error_chain(&error)))?;
    let mut client = RelayClient::new(InterceptedService::new(channel, token))
        .max_decoding_message_size(usize::MAX);
    let (requests, outgoing) = mpsc::unbounded_channel();
    let open = v1::OpenSubscription {
        outbox: config.outbox.clone(),
        subscriber: config.name.clone(),
        topics: config.topics.clone(),
        max_in_flight: config.max_in_flight,
        lease_ms: config.lease.map_or(0, |lease| lease.as_millis() as u64),
    };
    let _ = requests.send(SubscribeRequest {
        request: Some(Request::Open(open)),
    });
    let opening = async {
        let mut inbound = client
            .subscribe(UnboundedReceiverStream::new(outgoing))
            .await?
            .into_inner();
        let first = inbound.message().await?;
        Ok::<_, tonic::Status>((inbound, first))
    };
    let (inbound, first) = tokio::time::timeout(config.connect_timeout * 2, opening)
        .await
        .map_err(|_| End::Lost("no answer to `open` in time".to_owned()))?
        .map_err(ended_by)?;
    let subscribed = match first.and_then(|r| r.response) {
        Some(Response::Subscribed(subscribed)) => subscribed,
        other => {
            return Err(End::Lost(format!(
                "expected `subscribed` first, got {other:?}"
            )))
        }
    };
    let session = Session {
        shared: Arc::clone(shared),
        address,
        owner: subscribed.owner,
        lease: Duration::from_millis(subscribed.lease_ms.max(100)),
        requests: Some(requests),
        dispatch: Dispatch::default(),
        sent: VecDeque::new(),
        tasks: JoinSet::new(),
        running: HashMap::new(),
        task_ids: HashMap::new(),
        pending_acks: Vec::new(),
        lease_tokens: HashMap::new(),
        draining: false,
        stopping: false,
    };
    Ok((session, inbound))
}

/// The end a failed call or broken stream means.
pub(super) fn ended_by(status: tonic::Status) -> End {
    if is_permanent(&status) {
        End::Refused(status)
    } else {
        End::Lost(format!("{}: {}", status.code(), status.message()))
    }
}

//! `txoutbox.v1.Relay`: translates between protobuf and the relay; no rules live here.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;
use txoutbox_proto::v1::{self, subscribe_request};

use super::convert::{self, timestamp};
use super::status::to_status;
use crate::config::Scope;
use crate::config::MAX_WINDOW;
use crate::relay::drain::Drain;
use crate::relay::groups;
use crate::relay::lease_token;
use crate::relay::pause::ClaimScope;
use crate::relay::subscription::queue::SendError;
use crate::relay::subscription::{self, answer_queue, Answer, AnswerSender, SubscriptionSpec};
use crate::relay::{
    limits, validate_subscriber, validate_topics, Outbox, Relay, RelayError, RelayResult,
};
use crate::security::quotas::WindowReservation;
use crate::security::Caller;
use crate::storage::NackResult;
use crate::telemetry::metrics::AnswerKind;

/// How long a new stream may take to send its `open` message.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// Events buffered towards the subscriber (batches among them are bounded by the
/// subscription itself: it claims only once the previous batch was taken).
const EVENT_BUFFER: usize = 32;

/// How a stream is served: per-row claims (with the outbox's idle poll for its topic
/// filter), or as a member of a subscription group.
enum Delivery {
    Rows(Arc<crate::relay::idle::PollGroup>),
    Group(Arc<groups::Groups>, String),
}

pub struct RelayService {
    relay: Arc<Relay>,
    drain: Drain,
}

impl RelayService {
    pub fn new(relay: Arc<Relay>, drain: Drain) -> Self {
        Self { relay, drain }
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<v1::SubscribeResponse, Status>> + Send>>;

#[tonic::async_trait]
impl v1::relay_server::Relay for RelayService {
    type SubscribeStream = EventStream;

    async fn subscribe(
        &self,
        request: Request<Streaming<v1::SubscribeRequest>>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let caller = Caller::of(&request)?;
        let peer = request.remote_addr().map(|addr| addr.to_string());
        let mut inbound = request.into_inner();
        let open = first_open(&mut inbound).await?;
        if self.drain.is_started() {
            return Err(to_status(RelayError::ShuttingDown));
        }
        let outbox = Arc::clone(caller.outbox(&self.relay, Scope::Subscribe, &open.outbox)?);
        validate_subscriber(&open.subscriber)?;
        validate_topics(&open.topics)?;
        if open.max_in_flight == 0 || open.max_in_flight > MAX_WINDOW {
            return Err(Status::invalid_argument(format!(
                "max_in_flight = {}: must be within 1..={MAX_WINDOW}",
                open.max_in_flight
            )));
        }
        let group = group_of(&outbox, &open)?;
        let lease = match (&group, open.lease_ms) {
            (Some((groups, name)), 0) => groups.settings(name)?.lease,
            _ => outbox.claims.lease(Duration::from_millis(open.lease_ms))?,
        };
        let spec = SubscriptionSpec {
            lease,
            subscriber: open.subscriber,
            topics: open.topics,
            max_in_flight: open.max_in_flight,
            peer,
            identity: caller.identity().map(|identity| identity.name.clone()),
            bytes: caller
                .identity()
                .and_then(|identity| identity.budget.bytes.clone()),
        };
        // The identity's share first, so an identity at its own limit makes no new group;
        // then before the window is reserved, a new filter past the outbox's
        // max_topic_filters is refused.
        let filter_slot = caller
            .identity()
            .map(|identity| {
                identity
                    .budget
                    .hold_filter(&identity.name, &outbox.name, &spec.topics)
            })
            .transpose()?;
        let delivery = match group {
            None => Delivery::Rows(outbox.claims.idle_poll(&spec.topics)?),
            Some((groups, name)) => Delivery::Group(groups, name),
        };
        let window = match caller.identity() {
            Some(identity) => Some(Arc::new(
                identity
                    .budget
                    .reserve_window(&identity.name, spec.max_in_flight)?,
            )),
            None => None,
        };
        let (answers_tx, answers_rx) = answer_queue();
        let (events_tx, events_rx) = mpsc::channel(EVENT_BUFFER);
        let require_tokens = outbox
            .config
            .require_lease_tokens
            .then(|| outbox.name.clone());
        tokio::spawn(read_answers(
            inbound,
            answers_tx,
            window.clone(),
            require_tokens,
        ));
        let span =
            tracing::info_span!("subscribe", outbox = %outbox.name, subscriber = ?spec.subscriber);
        let drain = self.drain.clone();
        let subscription = async move {
            match delivery {
                Delivery::Group(groups, name) => {
                    groups::runner::run(outbox, groups, name, spec, answers_rx, events_tx, drain)
                        .await
                }
                Delivery::Rows(idle) => {
                    subscription::run(outbox, spec, idle, answers_rx, events_tx, drain).await
                }
            }
        };
        self.drain.spawn(
            async move {
                subscription.await;
                // The window's and the filter's places in the identity's budget last as
                // long as the stream.
                drop((window, filter_slot));
            }
            .instrument(span),
        );
        let events = ReceiverStream::new(events_rx)
            .map(|event| event.map(convert::event).map_err(to_status));
        Ok(Response::new(Box::pin(events)))
    }

    async fn claim(
        &self,
        request: Request<v1::ClaimRequest>,
    ) -> Result<Response<v1::ClaimResponse>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let (outbox, lease) = self.leasing(&caller, &request.outbox, request.lease_ms)?;
        // An identity's max_bytes_in_flight: the claim gets what its streams leave (see
        // `IdentityLimits::max_bytes_in_flight`), and is not counted once it returns.
        let bytes = caller
            .identity()
            .and_then(|identity| identity.budget.bytes.as_ref());
        let room = bytes.map_or(usize::MAX, |bytes| bytes.unary_room());
        if room == 0 {
            let budget = bytes.expect("a budget: room is bounded");
            return Err(Status::resource_exhausted(budget.exhausted(None)));
        }
        let holder = unary_holder(&caller, &request.worker_id)?;
        let (claimed, left_out) = outbox
            .claims
            .claim_within(
                &holder,
                request.batch_size,
                lease,
                &request.topics,
                room,
                None,
            )
            .await?;
        if let (true, Some(budget)) = (claimed.messages.is_empty(), bytes) {
            if left_out.is_some() {
                return Err(Status::resource_exhausted(budget.exhausted(left_out)));
            }
        }
        // The view the claim just used (fresh within a second): says why it came back empty.
        let pauses = outbox.pauses().await;
        let paused = claimed.messages.is_empty()
            && ClaimScope::of(&request.topics, &pauses) == ClaimScope::Paused;
        Ok(Response::new(v1::ClaimResponse {
            messages: claimed
                .messages
                .into_iter()
                .map(|message| convert::message(message, &holder))
                .collect(),
            lease_expires_at: Some(timestamp(claimed.lease_expires_at)),
            paused,
            paused_topics: pauses.topic_names(),
        }))
    }

    async fn ack(
        &self,
        request: Request<v1::AckRequest>,
    ) -> Result<Response<v1::AckResponse>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let (outbox, holder) = self.answering(&caller, &request.outbox, &request.worker_id)?;
        let named = (&request.ids[..], &request.lease_tokens[..]);
        let (ids, stale) = current(outbox, AnswerKind::Ack, &holder, named).await?;
        let (acked, fenced) = outbox.answers.ack(&holder, &ids).await?;
        Ok(Response::new(v1::AckResponse {
            acked,
            fenced: merged(fenced, stale),
        }))
    }

    async fn nack(
        &self,
        request: Request<v1::NackRequest>,
    ) -> Result<Response<v1::NackResponse>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let (outbox, holder) = self.answering(&caller, &request.outbox, &request.worker_id)?;
        let delay = request.retry_delay_ms.map(Duration::from_millis);
        let (ids, tokens) = lease_token::one(request.id, &request.lease_token);
        let (ids, _) = current(outbox, AnswerKind::Nack, &holder, (&ids, &tokens)).await?;
        let result = match ids[..] {
            [id] => {
                outbox
                    .answers
                    .nack(&holder, id, &request.error, delay)
                    .await?
            }
            _ => NackResult::Fenced,
        };
        let response = match result {
            NackResult::Retried { retry_at, released } => v1::NackResponse {
                outcome: v1::NackOutcome::RetryScheduled.into(),
                retry_at: Some(timestamp(retry_at)),
                released,
            },
            NackResult::DeadLettered { released } => v1::NackResponse {
                outcome: v1::NackOutcome::DeadLettered.into(),
                retry_at: None,
                released,
            },
            NackResult::Fenced => v1::NackResponse {
                outcome: v1::NackOutcome::Fenced.into(),
                retry_at: None,
                released: Vec::new(),
            },
        };
        Ok(Response::new(response))
    }

    async fn release(
        &self,
        request: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseResponse>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let (outbox, holder) = self.answering(&caller, &request.outbox, &request.worker_id)?;
        let delay = Duration::from_millis(request.retry_delay_ms.unwrap_or(0));
        let named = (&request.ids[..], &request.lease_tokens[..]);
        let (ids, stale) = current(outbox, AnswerKind::Release, &holder, named).await?;
        let (released, fenced) = outbox.answers.release(&holder, &ids, delay).await?;
        Ok(Response::new(v1::ReleaseResponse {
            released,
            fenced: merged(fenced, stale),
        }))
    }

    async fn dead_letter(
        &self,
        request: Request<v1::DeadLetterRequest>,
    ) -> Result<Response<v1::DeadLetterResponse>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let (outbox, holder) = self.answering(&caller, &request.outbox, &request.worker_id)?;
        let (ids, tokens) = lease_token::one(request.id, &request.lease_token);
        let (ids, _) = current(outbox, AnswerKind::DeadLetter, &holder, (&ids, &tokens)).await?;
        let dead_lettered = match ids[..] {
            [id] => {
                outbox
                    .answers
                    .dead_letter(&holder, id, &request.error)
                    .await?
            }
            _ => false,
        };
        Ok(Response::new(v1::DeadLetterResponse { dead_lettered }))
    }

    async fn extend_lease(
        &self,
        request: Request<v1::ExtendLeaseRequest>,
    ) -> Result<Response<v1::ExtendLeaseResponse>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let (outbox, lease) = self.leasing(&caller, &request.outbox, request.lease_ms)?;
        let holder = unary_holder(&caller, &request.worker_id)?;
        let named = (&request.ids[..], &request.lease_tokens[..]);
        let (ids, stale) = current(outbox, AnswerKind::ExtendLease, &holder, named).await?;
        let (extended, fenced) = outbox.answers.extend_lease(&holder, &ids, lease).await?;
        Ok(Response::new(v1::ExtendLeaseResponse {
            extended: extended.ids.into_vec(),
            fenced: merged(fenced, stale),
            lease_expires_at: Some(timestamp(extended.lease_expires_at)),
        }))
    }
}

impl RelayService {
    /// The outbox of a unary call, refused on an outbox delivered by groups.
    fn per_row(&self, caller: &Caller, outbox: &str) -> Result<&Arc<Outbox>, Status> {
        let outbox = caller.outbox(&self.relay, Scope::Subscribe, outbox)?;
        outbox.per_row()?;
        Ok(outbox)
    }

    /// The outbox of a unary answer ([`Self::per_row`]) and the lease holder answering.
    fn answering(
        &self,
        caller: &Caller,
        outbox: &str,
        worker_id: &str,
    ) -> Result<(&Arc<Outbox>, String), Status> {
        let outbox = self.per_row(caller, outbox)?;
        Ok((outbox, unary_holder(caller, worker_id)?))
    }

    /// The outbox of a claim or a lease extension ([`Self::per_row`]) and the lease
    /// `lease_ms` asks for (0: the outbox's), within the outbox's bounds.
    fn leasing(
        &self,
        caller: &Caller,
        outbox: &str,
        lease_ms: u64,
    ) -> Result<(&Arc<Outbox>, Duration), Status> {
        let outbox = self.per_row(caller, outbox)?;
        Ok((
            outbox,
            outbox.claims.lease(Duration::from_millis(lease_ms))?,
        ))
    }
}

/// The lease holder a unary call claims and answers for: its `worker_id`, namespaced by
/// the caller's identity so that no identity reaches another's leases
/// (docs/lease-tokens.md).
fn unary_holder(caller: &Caller, worker_id: &str) -> RelayResult<String> {
    limits::name("worker_id", worker_id)?;
    let identity = caller.identity().map(|identity| identity.name.as_str());
    let holder = lease_token::holder(identity, worker_id);
    limits::holder(&holder)?;
    Ok(holder)
}

/// The ids a unary answer (its `ids` and `lease_tokens`) applies to, and those fenced
/// already because their token names a delivery the holder no longer has. Refused without
/// tokens where the outbox requires them.
async fn current(
    outbox: &Outbox,
    kind: AnswerKind,
    holder: &str,
    (ids, tokens): (&[i64], &[String]),
) -> Result<(Vec<i64>, Vec<i64>), Status> {
    let required = outbox
        .config
        .require_lease_tokens
        .then_some(outbox.name.as_str());
    match lease_token::checked_answer_ids(ids, tokens, required)? {
        (ids, None) => Ok((ids, Vec::new())),
        (_, Some(tokens)) => Ok(outbox
            .answers
            .current_deliveries(kind, holder, &tokens)
            .await?),
    }
}

/// Fenced ids of the storage and of the token check, in id order.
fn merged(mut fenced: Vec<i64>, stale: Vec<i64>) -> Vec<i64> {
    fenced.extend(stale);
    fenced.sort_unstable();
    fenced
}

/// Forwards the subscriber's answers to its subscription as soon as they arrive, however
/// long the subscription takes to apply them (see [`subscription::queue`]: answers left
/// unread count against HTTP/2's flood guard, which closes the whole connection). A
/// malformed or undecodable request ends the subscription with INVALID_ARGUMENT, answers
/// past the queue's bound with RESOURCE_EXHAUSTED; a broken or closed stream just ends it.
///
/// A `set_window` past what the caller's identity may hold (its `max_messages_in_flight`)
/// ends the subscription with RESOURCE_EXHAUSTED.
async fn read_answers(
    mut inbound: Streaming<v1::SubscribeRequest>,
    answers: AnswerSender,
    window: Option<Arc<WindowReservation>>,
    require_tokens: Option<String>,
) {
    loop {
        // Stop reading once the subscription has ended, so the request stream is dropped
        // and the RPC completes (a graceful server shutdown waits for it).
        let next = tokio::select! {
            next = inbound.message() => next,
            () = answers.closed() => return,
        };
        let request = match next {
            Ok(Some(request)) => request,
            Ok(None) => return,
            // The servers' codec marks a request it cannot decode (see txoutbox_proto).
            Err(status) if status.code() == tonic::Code::InvalidArgument => {
                let error = RelayError::InvalidArgument(status.message().to_owned());
                let _ = answers.send(Err(error));
                return;
            }
            Err(status) => {
                tracing::debug!(%status, "subscriber stream broke");
                return;
            }
        };
        let answer = answer(request, require_tokens.as_deref()).and_then(|answer| {
            match (&answer, &window) {
                (Answer::SetWindow(size), Some(window)) => window
                    .resize(*size)
                    .map(|()| answer)
                    .map_err(|status| RelayError::ResourceExhausted(status.message().to_owned())),
                _ => Ok(answer),
            }
        });
        let malformed = answer.is_err();
        match answers.send(answer) {
            Ok(()) if !malformed => {}
            Ok(()) | Err(SendError::Closed) => return,
            Err(SendError::Full) => {
                // Drop the request stream first: HTTP/2 then discards what it buffered.
                drop(inbound);
                answers.overflow();
                return;
            }
        }
    }
}

/// A stream's answer as the subscription takes it. Its lease tokens (one per id, in
/// order, or instead of the ids) name deliveries: the subscription fences those of an
/// earlier delivery than it holds ([`Answer::Tokened`]), and the table fences by the
/// stream's holder. A stream of an outbox with `require_lease_tokens` must send them.
fn answer(request: v1::SubscribeRequest, require_tokens: Option<&str>) -> RelayResult<Answer> {
    let mut attempts = None;
    let answer = plain_answer(request, require_tokens, &mut attempts)?;
    Ok(match attempts {
        Some(attempts) => Answer::Tokened {
            answer: Box::new(answer),
            attempts,
        },
        None => answer,
    })
}

/// [`answer`] without its tokens, which go to `attempts` as `(id, attempt)`.
fn plain_answer(
    request: v1::SubscribeRequest,
    require_tokens: Option<&str>,
    attempts: &mut Option<Vec<(i64, u32)>>,
) -> RelayResult<Answer> {
    use subscribe_request::Request as R;
    let invalid = |text: &str| Err(RelayError::InvalidArgument(text.to_owned()));
    let mut ids = |(ids, tokens): (Vec<i64>, Vec<String>)| -> RelayResult<Vec<i64>> {
        let (ids, tokens) = lease_token::checked_answer_ids(&ids, &tokens, require_tokens)?;
        *attempts = tokens.map(|tokens| tokens.iter().map(|t| (t.id, t.attempt)).collect());
        Ok(ids)
    };
    match request.request {
        Some(R::Ack(ack)) => Ok(Answer::Ack(ids((ack.ids, ack.lease_tokens))?)),
        Some(R::Nack(nack)) => Ok(Answer::Nack {
            id: ids(lease_token::one(nack.id, &nack.lease_token))?[0],
            error: nack.error,
            delay: nack.retry_delay_ms.map(Duration::from_millis),
        }),
        Some(R::Release(release)) => Ok(Answer::Release {
            ids: ids((release.ids, release.lease_tokens))?,
            delay: Duration::from_millis(release.retry_delay_ms.unwrap_or(0)),
        }),
        Some(R::DeadLetter(dead)) => Ok(Answer::DeadLetter {
            id: ids(lease_token::one(dead.id, &dead.lease_token))?[0],
            error: dead.error,
        }),
        Some(R::ExtendLease(extend)) => Ok(Answer::ExtendLease {
            ids: ids((extend.ids, extend.lease_tokens))?,
            lease: Duration::from_millis(extend.lease_ms),
        }),
        Some(R::SetWindow(window)) => Ok(Answer::SetWindow(window.max_in_flight)),
        Some(R::Open(_)) => invalid("`open` may only be sent once, as the first message"),
        None => invalid(
            "empty SubscribeRequest: set one of ack, nack, release, dead_letter, extend_lease, set_window",
        ),
    }
}

/// The stream's first message, which must be `open`, within [`OPEN_TIMEOUT`].
async fn first_open(
    inbound: &mut Streaming<v1::SubscribeRequest>,
) -> Result<v1::OpenSubscription, Status> {
    let first = tokio::time::timeout(OPEN_TIMEOUT, inbound.message())
        .await
        .map_err(|_| {
            Status::deadline_exceeded("no `open` message within 30s of opening the stream")
        })??;
    match first.and_then(|r| r.request) {
        Some(subscribe_request::Request::Open(open)) => Ok(open),
        Some(_) => Err(Status::invalid_argument(
            "the first message of Subscribe must be `open`",
        )),
        None => Err(Status::invalid_argument("the stream ended before `open`")),
    }
}

/// The group an `open` names (none: the outbox's per-row claims), checked against what
/// the outbox declares.
fn group_of(
    outbox: &Outbox,
    open: &v1::OpenSubscription,
) -> Result<Option<(Arc<groups::Groups>, String)>, Status> {
    match open.group.as_str() {
        "" => {
            outbox.per_row()?;
            Ok(None)
        }
        name => {
            let groups = Arc::clone(outbox.groups()?);
            groups.settings(name)?;
            if !open.topics.is_empty() {
                return Err(Status::invalid_argument(
                    "topics: a group receives every row of its outbox; subscribe without a \
                     topic filter and filter in the publisher",
                ));
            }
            Ok(Some((groups, name.to_owned())))
        }
    }
}

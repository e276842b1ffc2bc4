//! `txoutbox tail`: subscribe and print each message as a JSON line.
//!
//! Without `--ack` it only looks: what it printed stays leased to it while it runs (so it
//! is not printed twice) and is given back untried at exit, attempt refunded. With `--ack`
//! it consumes: each message is acked once printed. It speaks the `Subscribe` stream
//! directly, not through the subscriber runtime, so `--count` is exact and a message is
//! never half-handled: one stream, messages printed in the order delivered (id order, so
//! per key in order), and at exit the window is closed (`set_window(0)`) before the rest
//! is given back, so the exit burns no attempt.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::{interval_at, Instant};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Streaming;
use txoutbox_client::proto::v1::relay_client::RelayClient;
use txoutbox_client::proto::v1::subscribe_request::Request;
use txoutbox_client::proto::v1::subscribe_response::Response;
use txoutbox_client::proto::v1::{self, SubscribeRequest};

use super::exit::output_error;
use super::output::Format;
use super::{CliError, Context};

/// How long the exit waits for the server to confirm the last answers.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

const EXAMPLES: &str = "\
Examples:
  txoutbox --outbox orders tail --count 10            (look at the next 10; they stay pending)
  txoutbox --outbox orders tail --ack                 (consume until Ctrl-C)
  txoutbox tail --topic orders.paid --count 1 | jq .payload

Each line: {\"id\", \"topic\", \"key\", \"payload\" (or \"payload_base64\" when not UTF-8),
\"headers\", \"attempts\", \"created_at\"}. Exits 0 after --count messages or on
SIGINT/SIGTERM, 3 if the server goes away.";

#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// Ack each message once printed (consume it). Without it, messages are only looked
    /// at: given back untried at exit, their attempt refunded.
    #[arg(long)]
    ack: bool,
    /// Exit after this many messages.
    #[arg(long, short = 'n', value_name = "N")]
    count: Option<u64>,
    /// Only these topics (repeatable; default: every topic).
    #[arg(long = "topic", value_name = "TOPIC")]
    topics: Vec<String>,
    /// Subscriber name, in the server's logs.
    #[arg(long, default_value = "txoutbox-tail")]
    name: String,
    /// Most messages held at once (default: --count up to 1000, else 100). Without --ack,
    /// tail holds everything it printed, so it prints at most this many.
    #[arg(long, value_name = "N")]
    window: Option<u32>,
}

pub async fn run(context: &mut Context, args: Args) -> Result<(), CliError> {
    if args.count == Some(0) {
        return Ok(());
    }
    let mut signals = Signals::install()?;
    let outbox = context.outbox().await?;
    let format = context.format_or(Format::Json);
    let window = args
        .window
        .unwrap_or_else(|| args.count.map_or(100, |count| count.min(1000) as u32));
    let channel = context.channel().await?;
    let (requests, outgoing) = mpsc::unbounded_channel();
    let open = v1::OpenSubscription {
        outbox,
        subscriber: args.name,
        topics: args.topics,
        max_in_flight: window,
        lease_ms: 0,
    };
    let _ = requests.send(SubscribeRequest {
        request: Some(Request::Open(open)),
    });
    let mut inbound = RelayClient::new(channel)
        .max_decoding_message_size(usize::MAX)
        .subscribe(UnboundedReceiverStream::new(outgoing))
        .await?
        .into_inner();
    let lease = match inbound.message().await?.and_then(|r| r.response) {
        Some(Response::Subscribed(subscribed)) => Duration::from_millis(subscribed.lease_ms),
        other => {
            return Err(CliError::Failed(format!(
                "expected `subscribed` from the server, got {other:?}"
            )))
        }
    };
    let mut tail = Tail {
        requests: Some(requests),
        unsettled: 0,
        held: BTreeSet::new(),
        untried: Vec::new(),
        lease_tokens: HashMap::new(),
        printed: 0,
        ack: args.ack,
        count: args.count,
        format,
    };
    let followed = tail.follow(&mut inbound, lease, &mut signals).await;
    if matches!(followed, Ok(()) | Err(Ended::Output(_))) {
        tail.close(&mut inbound).await;
    }
    match followed {
        Ok(()) => Ok(()),
        // A closed pipe (`| head`): the reader has what it wanted.
        Err(Ended::Output(error)) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(Ended::Output(error)) => Err(output_error(error)),
        Err(Ended::Stream(error)) => Err(error),
    }
}

/// Why following stopped early.
enum Ended {
    /// Writing to stdout failed; the stream is fine.
    Output(std::io::Error),
    /// The stream failed or the server went away.
    Stream(CliError),
}

struct Tail {
    /// `None` once the client side is closed.
    requests: Option<mpsc::UnboundedSender<SubscribeRequest>>,
    /// Answers sent and not yet settled (the server settles them in order).
    unsettled: usize,
    /// Printed and not acked: held until exit (without --ack).
    held: BTreeSet<i64>,
    /// Received but not printed (past --count): given back at exit.
    untried: Vec<i64>,
    /// The lease token of every message not answered yet, sent back with its answer.
    lease_tokens: HashMap<i64, String>,
    printed: u64,
    ack: bool,
    count: Option<u64>,
    format: Format,
}

impl Tail {
    fn done(&self) -> bool {
        self.count.is_some_and(|count| self.printed >= count)
    }

    async fn follow(
        &mut self,
        inbound: &mut Streaming<v1::SubscribeResponse>,
        lease: Duration,
        signals: &mut Signals,
    ) -> Result<(), Ended> {
        // Keep what we hold leased while we run (without --ack), well before it runs out.
        let period = (lease / 3).max(Duration::from_millis(50));
        let mut ticker = interval_at(Instant::now() + period, period);
        loop {
            if self.done() {
                return Ok(());
            }
            tokio::select! {
                _ = signals.next() => return Ok(()),
                _ = ticker.tick(), if !self.held.is_empty() => {
                    let ids: Vec<i64> = self.held.iter().copied().collect();
                    let lease_tokens = self.tokens_of(&ids, false);
                    self.send(Request::ExtendLease(v1::ExtendLeases {
                        ids,
                        lease_ms: 0,
                        lease_tokens,
                    }));
                }
                response = inbound.message() => match response {
                    Ok(Some(v1::SubscribeResponse { response: Some(response) })) => {
                        self.on_response(response)?;
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        return Err(Ended::Stream(CliError::Unreachable(
                            "the server ended the stream".to_owned(),
                        )))
                    }
                    Err(status) => return Err(Ended::Stream(status.into())),
                },
            }
        }
    }

    /// The lease tokens of `ids`, one per id in order (forgotten with `done`); none at
    /// all when one is missing, since the server takes one per id or none.
    fn tokens_of(&mut self, ids: &[i64], done: bool) -> Vec<String> {
        ids.iter()
            .map(|id| match done {
                true => self.lease_tokens.remove(id),
                false => self.lease_tokens.get(id).cloned(),
            })
            .map(|token| token.filter(|t| !t.is_empty()))
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default()
    }

    fn on_response(&mut self, response: Response) -> Result<(), Ended> {
        match response {
            Response::Batch(batch) => {
                let mut acks = Vec::new();
                let mut written = Ok(());
                for message in batch.messages {
                    self.lease_tokens
                        .insert(message.id, message.lease_token.clone());
                    if self.done() || written.is_err() {
                        self.untried.push(message.id);
                        continue;
                    }
                    written = self.print(&message);
                    if written.is_err() {
                        self.untried.push(message.id);
                        continue;
                    }
                    self.printed += 1;
                    if self.ack {
                        acks.push(message.id);
                    } else {
                        self.held.insert(message.id);
                    }
                }
                if !acks.is_empty() {
                    let lease_tokens = self.tokens_of(&acks, true);
                    self.send(Request::Ack(v1::AckMessages {
                        ids: acks,
                        lease_tokens,
                    }));
                }
                written.map_err(Ended::Output)
            }
            Response::Settled(settled) => {
                self.unsettled = self.unsettled.saturating_sub(1);
                for id in settled.fenced {
                    self.held.remove(&id);
                }
                Ok(())
            }
            Response::LeasesExpired(expired) => {
                for id in expired.ids {
                    self.held.remove(&id);
                }
                Ok(())
            }
            Response::Draining(_) => Err(Ended::Stream(CliError::Unreachable(
                "the server is shutting down".to_owned(),
            ))),
            Response::Subscribed(_) => Ok(()),
        }
    }

    fn print(&self, message: &v1::Message) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        match self.format {
            Format::Json => {
                serde_json::to_writer(&mut out, &line(message))?;
                writeln!(out)?;
            }
            Format::Table => writeln!(
                out,
                "{}\t{}\t{}\t{}",
                message.id,
                message.topic,
                message.key.as_deref().unwrap_or("-"),
                String::from_utf8_lossy(&message.payload)
            )?,
        }
        out.flush()
    }

    fn send(&mut self, request: Request) {
        let Some(requests) = &self.requests else {
            return;
        };
        if requests
            .send(SubscribeRequest {
                request: Some(request),
            })
            .is_ok()
        {
            self.unsettled += 1;
        }
    }

    /// Closes the window, gives back everything held or not printed (untried: attempt
    /// refunded), then closes the stream. Best effort, bounded by `CLOSE_TIMEOUT`: what
    /// is not confirmed by then the server gives back as the stream ends.
    async fn close(&mut self, inbound: &mut Streaming<v1::SubscribeResponse>) {
        let closing = async {
            self.send(Request::SetWindow(v1::SetWindow { max_in_flight: 0 }));
            self.settle(inbound).await;
            let mut ids: Vec<i64> = std::mem::take(&mut self.held).into_iter().collect();
            ids.append(&mut self.untried);
            if !ids.is_empty() {
                let lease_tokens = self.tokens_of(&ids, true);
                self.send(Request::Release(v1::ReleaseMessages {
                    ids,
                    retry_delay_ms: None,
                    lease_tokens,
                }));
                self.settle(inbound).await;
            }
        };
        if tokio::time::timeout(CLOSE_TIMEOUT, closing).await.is_err() {
            tracing::warn!("the server did not confirm the last answers in time");
        }
        self.requests = None;
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while let Ok(Some(_)) = inbound.message().await {}
        })
        .await;
    }

    /// Reads until every answer sent is settled; messages still arriving are not printed.
    async fn settle(&mut self, inbound: &mut Streaming<v1::SubscribeResponse>) {
        while self.unsettled > 0 {
            let Ok(Some(response)) = inbound.message().await else {
                return;
            };
            match response.response {
                Some(Response::Batch(batch)) => {
                    self.untried.extend(batch.messages.iter().map(|m| m.id));
                }
                Some(Response::Settled(settled)) => {
                    self.unsettled -= 1;
                    for id in settled.fenced {
                        self.held.remove(&id);
                    }
                }
                Some(Response::LeasesExpired(expired)) => {
                    for id in expired.ids {
                        self.held.remove(&id);
                    }
                }
                _ => {}
            }
        }
    }
}

/// One message as a JSON object; the payload as text when it is UTF-8, else base64.
fn line(message: &v1::Message) -> serde_json::Value {
    let headers: BTreeMap<&String, &String> = message.headers.iter().collect();
    let mut line = json!({
        "id": message.id,
        "topic": message.topic,
        "key": message.key,
    });
    match std::str::from_utf8(&message.payload) {
        Ok(text) => line["payload"] = json!(text),
        Err(_) => {
            line["payload_base64"] =
                json!(base64::engine::general_purpose::STANDARD.encode(&message.payload))
        }
    }
    line["headers"] = json!(headers);
    line["attempts"] = json!(message.attempts);
    line["created_at"] = json!(message.created_at.as_ref().and_then(rfc3339));
    line
}

fn rfc3339(timestamp: &txoutbox_client::proto::prost_types::Timestamp) -> Option<String> {
    let seconds = u64::try_from(timestamp.seconds).ok()?;
    let nanos = u32::try_from(timestamp.nanos).ok()?;
    let time: SystemTime = UNIX_EPOCH.checked_add(Duration::new(seconds, nanos))?;
    Some(humantime::format_rfc3339_millis(time).to_string())
}

/// SIGINT and SIGTERM, handled from the moment this is made (a signal that arrives
/// before then kills the process, which would burn the attempts of what it holds).
struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Self, CliError> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let failed =
                |error: std::io::Error| CliError::Failed(format!("cannot handle signals: {error}"));
            Ok(Self {
                interrupt: signal(SignalKind::interrupt()).map_err(failed)?,
                terminate: signal(SignalKind::terminate()).map_err(failed)?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_carry_text_or_base64_payloads() {
        let mut message = v1::Message {
            id: 7,
            topic: "t".into(),
            key: Some("k".into()),
            payload: b"{\"a\":1}".to_vec(),
            headers: [("h".to_owned(), "v".to_owned())].into_iter().collect(),
            attempts: 1,
            created_at: Some(txoutbox_client::proto::prost_types::Timestamp {
                seconds: 0,
                nanos: 0,
            }),
            lease_token: Default::default(),
        };
        let value = line(&message);
        assert_eq!(value["payload"], "{\"a\":1}");
        assert_eq!(value["key"], "k");
        assert_eq!(value["headers"]["h"], "v");
        assert_eq!(value["created_at"], "1970-01-01T00:00:00.000Z");
        message.payload = vec![0xff, 0x00];
        let value = line(&message);
        assert_eq!(value["payload_base64"], "/wA=");
        assert!(value.get("payload").is_none());
    }
}

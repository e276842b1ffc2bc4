//! A minimal streaming subscriber over the generated stubs: what any language's client
//! does, written out plainly so tests can drive each step.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;
use txoutbox_proto::v1::relay_client::RelayClient;
use txoutbox_proto::v1::subscribe_request::Request as Req;
use txoutbox_proto::v1::subscribe_response::Response as Resp;
use txoutbox_proto::v1::{self, Message};

use crate::{Server, DEADLINE};

pub struct Subscriber {
    requests: Option<mpsc::Sender<v1::SubscribeRequest>>,
    responses: Streaming<v1::SubscribeResponse>,
    /// Messages received and not yet taken by the test.
    pub inbox: VecDeque<Message>,
    /// Answers confirmed by the server, in order.
    pub settled: VecDeque<v1::Settled>,
    pub expired: Vec<i64>,
    pub draining: bool,
    pub subscribed: v1::Subscribed,
}

impl Subscriber {
    pub async fn open(server: &Server, name: &str, window: u32, lease_ms: u64) -> Self {
        Self::open_with(
            server,
            v1::OpenSubscription {
                group: String::new(),
                outbox: "orders".into(),
                subscriber: name.into(),
                topics: vec![],
                max_in_flight: window,
                lease_ms,
            },
        )
        .await
        .expect("subscribe")
    }

    pub async fn open_with(
        server: &Server,
        open: v1::OpenSubscription,
    ) -> Result<Self, tonic::Status> {
        Self::open_on(server.channel().await, open).await
    }

    /// Opens a stream on `channel`, a connection other streams may share.
    pub async fn open_on(
        channel: Channel,
        open: v1::OpenSubscription,
    ) -> Result<Self, tonic::Status> {
        let (tx, rx) = mpsc::channel(64);
        tx.send(v1::SubscribeRequest {
            request: Some(Req::Open(open)),
        })
        .await
        .unwrap();
        let mut client = RelayClient::new(channel);
        let responses = client
            .subscribe(ReceiverStream::new(rx))
            .await?
            .into_inner();
        let mut subscriber = Self {
            requests: Some(tx),
            responses,
            inbox: VecDeque::new(),
            settled: VecDeque::new(),
            expired: Vec::new(),
            draining: false,
            subscribed: v1::Subscribed::default(),
        };
        match subscriber.responses.message().await? {
            Some(v1::SubscribeResponse {
                response: Some(Resp::Subscribed(s)),
            }) => {
                subscriber.subscribed = s;
                Ok(subscriber)
            }
            other => panic!("expected `subscribed`, got {other:?}"),
        }
    }

    /// Reads one response and files it; `Ok(false)` when the stream ended.
    pub async fn pump(&mut self) -> Result<bool, tonic::Status> {
        let Some(response) = self.responses.message().await? else {
            return Ok(false);
        };
        match response.response {
            Some(Resp::Batch(batch)) => self.inbox.extend(batch.messages),
            Some(Resp::Settled(settled)) => self.settled.push_back(settled),
            Some(Resp::LeasesExpired(expired)) => self.expired.extend(expired.ids),
            Some(Resp::Draining(_)) => self.draining = true,
            Some(Resp::Subscribed(_)) | None => panic!("unexpected response {response:?}"),
        }
        Ok(true)
    }

    /// Waits until at least `n` messages are in the inbox and takes `n` of them.
    pub async fn take(&mut self, n: usize) -> Vec<Message> {
        self.take_within(n, DEADLINE).await
    }

    pub async fn take_within(&mut self, n: usize, deadline: Duration) -> Vec<Message> {
        let wait = async {
            while self.inbox.len() < n {
                assert!(self.pump().await.expect("stream error"), "stream ended");
            }
        };
        if tokio::time::timeout(deadline, wait).await.is_err() {
            panic!(
                "timed out waiting for {n} messages; have {}",
                self.inbox.len()
            );
        }
        self.inbox.drain(..n).collect()
    }

    /// True if no message arrives within `wait` (use only to check that nothing more comes,
    /// after the condition under test has been reached).
    pub async fn nothing_within(&mut self, wait: Duration) -> bool {
        let _ = tokio::time::timeout(wait, async {
            while self.inbox.is_empty() {
                if !self.pump().await.unwrap_or(false) {
                    return;
                }
            }
        })
        .await;
        self.inbox.is_empty()
    }

    pub async fn send(&self, request: Req) {
        let sender = self.requests.as_ref().expect("stream still open");
        sender
            .send(v1::SubscribeRequest {
                request: Some(request),
            })
            .await
            .expect("stream open");
    }

    /// Sends an answer and waits for its settlement.
    pub async fn answer(&mut self, request: Req) -> v1::Settled {
        self.send(request).await;
        let wait = async {
            while self.settled.is_empty() {
                assert!(self.pump().await.expect("stream error"), "stream ended");
            }
        };
        tokio::time::timeout(DEADLINE, wait)
            .await
            .expect("no settlement in time");
        self.settled.pop_front().unwrap()
    }

    pub async fn ack(&mut self, ids: &[i64]) -> v1::Settled {
        self.answer(Req::Ack(v1::AckMessages {
            ids: ids.to_vec(),
            lease_tokens: Default::default(),
        }))
        .await
    }

    pub async fn nack(&mut self, id: i64, error: &str, delay_ms: Option<u64>) -> v1::Settled {
        self.answer(Req::Nack(v1::NackMessage {
            id,
            error: error.into(),
            retry_delay_ms: delay_ms,
            lease_token: Default::default(),
        }))
        .await
    }

    pub async fn dead_letter(&mut self, id: i64, error: &str) -> v1::Settled {
        self.answer(Req::DeadLetter(v1::DeadLetterMessage {
            id,
            error: error.into(),
            ..Default::default()
        }))
        .await
    }

    /// Ends the stream from the client side (a clean close).
    pub fn close(&mut self) {
        self.requests = None;
    }

    /// Reads until the server ends the stream; returns the final status, if any.
    pub async fn wait_end(&mut self, deadline: Duration) -> Result<(), tonic::Status> {
        tokio::time::timeout(deadline, async {
            loop {
                if !self.pump().await? {
                    return Ok(());
                }
            }
        })
        .await
        .expect("stream did not end in time")
    }
}

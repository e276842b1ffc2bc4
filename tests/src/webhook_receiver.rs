//! The HTTP server the webhook tests POST to (axum on a port of its own): it checks each
//! request's signature with the HMAC crates, as a receiver would (not with the client's
//! own code), reads the message (or, for a batch, the JSON array of messages) back, answers
//! as the test says, and records every request.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

use crate::brokers::Delivered;

/// The shared secret the tests sign with.
pub const SECRET: &str = "whsec-test";

/// What the receiver answers a request with, given its messages (one, or a batch's): a
/// status and a `Retry-After`, if any.
pub type Answer = Arc<dyn Fn(&[Delivered]) -> (StatusCode, Option<&'static str>) + Send + Sync>;

/// Answers 204 to everything.
pub fn always_ok() -> Answer {
    Arc::new(|_| (StatusCode::NO_CONTENT, None))
}

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Post {
    /// When it arrived.
    pub at: Instant,
    /// Whether its body was a batch (a JSON array).
    pub batch: bool,
    /// Its messages, in the request's order.
    pub messages: Vec<Delivered>,
    /// What the receiver answered.
    pub status: StatusCode,
}

/// An HTTP server recording every request; stopped when dropped.
pub struct Receiver {
    pub address: String,
    posts: Arc<Mutex<Vec<Post>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    pub async fn start(answer: Answer) -> Self {
        let posts = Arc::new(Mutex::new(Vec::new()));
        let handler = {
            let posts = Arc::clone(&posts);
            move |headers: HeaderMap, body: Bytes| {
                let posts = Arc::clone(&posts);
                let answer = Arc::clone(&answer);
                async move {
                    let (batch, messages) = check(&headers, &body);
                    let (status, retry_after) = answer(&messages);
                    posts.lock().unwrap().push(Post {
                        at: Instant::now(),
                        batch,
                        messages,
                        status,
                    });
                    let mut reply = HeaderMap::new();
                    if let Some(delay) = retry_after {
                        reply.insert("retry-after", delay.parse().unwrap());
                    }
                    (status, reply, "answer from the test")
                }
            }
        };
        let app = axum::Router::new().route("/hook", axum::routing::post(handler));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            address,
            posts,
            task,
        }
    }

    /// `http://ADDRESS/hook`.
    pub fn url(&self) -> String {
        format!("http://{}/hook", self.address)
    }

    /// Every request so far, in arrival order.
    pub fn posts(&self) -> Vec<Post> {
        self.posts.lock().unwrap().clone()
    }

    /// The messages of the requests answered 2xx, in arrival order.
    pub fn accepted(&self) -> Vec<Delivered> {
        self.posts()
            .into_iter()
            .filter(|post| post.status.is_success())
            .flat_map(|post| post.messages)
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The request's messages, after checking its signature the way the client's README tells
/// receivers to: HMAC-SHA256 of `t.body`, hex, and a timestamp close to now. A batch
/// (`content-type: application/json` with `txoutbox-batch-size`) is a JSON array.
fn check(headers: &HeaderMap, body: &[u8]) -> (bool, Vec<Delivered>) {
    let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
    let signature = header("txoutbox-signature").expect("signed");
    let fields: BTreeMap<&str, &str> = signature
        .split(',')
        .map(|part| part.split_once('=').unwrap())
        .collect();
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(format!("{}.", fields["t"]).as_bytes());
    mac.update(body);
    mac.verify_slice(&hex::decode(fields["v1"]).unwrap())
        .expect("the signature matches the body");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        now.abs_diff(fields["t"].parse().unwrap()) < 300,
        "{signature}"
    );
    if let Some(size) = header("txoutbox-batch-size") {
        assert_eq!(header("content-type").as_deref(), Some("application/json"));
        let elements: Vec<Value> = serde_json::from_slice(body).expect("a JSON array");
        assert_eq!(size, elements.len().to_string(), "txoutbox-batch-size");
        return (true, elements.iter().map(element).collect());
    }
    assert_eq!(
        header("content-type").as_deref(),
        Some("application/octet-stream")
    );
    let message = Delivered {
        id: header("txoutbox-id").unwrap().parse().unwrap(),
        topic: header("txoutbox-topic").unwrap(),
        key: header("txoutbox-key"),
        payload: String::from_utf8(body.to_vec()).unwrap(),
        headers: header("traceparent")
            .map(|v| ("traceparent".to_owned(), v))
            .into_iter()
            .collect(),
    };
    (false, vec![message])
}

/// One element of a batch: `{"id", "topic", "key", "headers", "payload"}`.
fn element(value: &Value) -> Delivered {
    let text = |field: &str| value[field].as_str().map(str::to_owned);
    Delivered {
        id: value["id"].as_i64().expect("id"),
        topic: text("topic").expect("topic"),
        key: text("key"),
        payload: text("payload").expect("a UTF-8 payload as text"),
        headers: serde_json::from_value(value["headers"].clone()).expect("headers"),
    }
}

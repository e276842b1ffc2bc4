//! Security against a real `txoutboxd`: every RPC refused without a credential
//! and outside its scope, TLS and mutual TLS with certificates made at test time (an
//! untrusted and an expired one refused), a rotated certificate picked up without a
//! restart, limits per identity, audit events, and the refusal to serve other machines
//! without TLS and credentials.

#[path = "security/audit.rs"]
mod audit;
#[path = "security/caps.rs"]
mod caps;
#[path = "security/limits.rs"]
mod limits;
#[path = "security/refusals.rs"]
mod refusals;
#[path = "security/reload.rs"]
mod reload;
#[path = "security/scopes.rs"]
mod scopes;
#[path = "security/tls.rs"]
mod tls;

use std::collections::BTreeSet;
use std::path::Path;

use prost::Message as _;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use txoutbox_client::{Connection, Credentials, Message, PublishError, Subscriber};
use txoutbox_proto::v1::admin_client::AdminClient;
use txoutbox_proto::v1::relay_client::RelayClient;
use txoutbox_proto::v1::subscribe_request::Request as Req;
use txoutbox_proto::v1::{self};
use txoutbox_tests::pki::{token_identity, Ca, TlsFiles};
use txoutbox_tests::server::run_to_exit;
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

const SUBSCRIBER_TOKEN: &str = "sub-3f9a1c";
const INSERTER_TOKEN: &str = "ins-77b2e0";
const OPERATOR_TOKEN: &str = "ops-c41d9a";
const ORDERS_ADMIN_TOKEN: &str = "orders-ops-5e0b27";
const READER_TOKEN: &str = "read-9d2e41";

/// Two outboxes, `orders` and `payments`, and `server_extra` appended (TOML tables).
fn config(db: &TestDb, server_extra: &str) -> String {
    format!(
        r#"{base}
[outboxes.payments]
database = "main"
schema = "{schema}"
table = "payments"
create_schema = true

{server_extra}
"#,
        base = db.config(""),
        schema = db.schema,
    )
}

/// Five identities by token: a subscriber of `orders`, an inserter into `orders`, an
/// operator with `admin` on every outbox, one with `insert` and `admin` on `orders`, and
/// a watcher with `read` on `orders`.
fn identities() -> String {
    [
        token_identity(
            "orders-relay",
            SUBSCRIBER_TOKEN,
            r#"{ orders = ["subscribe"] }"#,
        ),
        token_identity("checkout", INSERTER_TOKEN, r#"{ orders = ["insert"] }"#),
        token_identity("ops", OPERATOR_TOKEN, r#"{ "*" = ["admin"] }"#),
        token_identity(
            "orders-ops",
            ORDERS_ADMIN_TOKEN,
            r#"{ orders = ["insert", "admin"] }"#,
        ),
        token_identity("watcher", READER_TOKEN, r#"{ orders = ["read"] }"#),
    ]
    .concat()
}

fn with_token<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(token) = token {
        let value: MetadataValue<_> = format!("Bearer {token}").parse().unwrap();
        request.metadata_mut().insert("authorization", value);
    }
    request
}

fn code<T>(result: Result<T, Status>) -> (Code, String) {
    match result {
        Ok(_) => (Code::Ok, String::new()),
        Err(status) => (status.code(), status.message().to_owned()),
    }
}

/// The outboxes `ListOutboxes` shows to the holder of `token`.
async fn listed(channel: &Channel, token: &str) -> Vec<String> {
    AdminClient::new(channel.clone())
        .list_outboxes(with_token(v1::ListOutboxesRequest {}, Some(token)))
        .await
        .unwrap()
        .into_inner()
        .outboxes
        .into_iter()
        .map(|o| o.name)
        .collect()
}

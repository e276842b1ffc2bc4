//! The server-wide caps against a real server with low settings: a stream past
//! `server.max_streams` (health watchers count) is RESOURCE_EXHAUSTED naming it, a
//! connection past `server.max_connections` waits until one closes, and a connection past
//! `server.max_pending_handshakes` is closed before its TLS handshake.

use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tonic::transport::Endpoint;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use txoutbox_tests::Subscriber;

use super::*;

/// `config` with `settings` added to its `[server]` table.
fn with_server(config: String, settings: &str) -> String {
    config.replacen("[server]\n", &format!("[server]\n{settings}\n"), 1)
}

fn open(name: &str) -> v1::OpenSubscription {
    v1::OpenSubscription {
        group: String::new(),
        outbox: "orders".into(),
        subscriber: name.into(),
        topics: vec![],
        max_in_flight: 10,
        lease_ms: 0,
    }
}

#[tokio::test]
async fn a_stream_past_server_max_streams_is_resource_exhausted_naming_it() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&with_server(db.config(""), "max_streams = 2")).await;
    let _first = Subscriber::open_with(&server, open("first")).await.unwrap();
    // An anonymous health watcher takes a place like any stream.
    let mut health = HealthClient::new(server.channel().await);
    let watch = health
        .watch(HealthCheckRequest {
            service: "orders".into(),
        })
        .await
        .unwrap()
        .into_inner();

    let refused = Subscriber::open_with(&server, open("third"))
        .await
        .err()
        .expect("a third stream");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("server.max_streams = 2"),
        "{refused:?}"
    );

    drop(watch);
    eventually("a place freed by the watcher", DEADLINE, || async {
        Subscriber::open_with(&server, open("third")).await.ok()
    })
    .await;
    db.drop().await;
}

/// Whether a health check on `channel` is answered within a second.
async fn answered(channel: &tonic::transport::Channel) -> bool {
    let mut client = HealthClient::new(channel.clone());
    let check = client.check(HealthCheckRequest {
        service: String::new(),
    });
    matches!(
        tokio::time::timeout(Duration::from_secs(1), check).await,
        Ok(Ok(_))
    )
}

#[tokio::test]
async fn a_connection_past_server_max_connections_waits_until_one_closes() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&with_server(db.config(""), "max_connections = 1")).await;
    let endpoint = Endpoint::from_shared(server.url()).unwrap();
    let first = endpoint.connect().await.unwrap();
    assert!(answered(&first).await);

    let second = endpoint.connect_lazy();
    assert!(!answered(&second).await, "a second connection was served");
    // Logged when the accept loop comes back for a place, which answering the first
    // connection does not wait for.
    server.wait_for_log("server.max_connections reached").await;

    drop(first);
    eventually("the second connection served", DEADLINE, || async {
        answered(&second).await.then_some(())
    })
    .await;
    db.drop().await;
}

/// Whether the server closed `stream` (it reads the end, or a reset, within 100ms).
async fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_millis(100), stream.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn a_connection_past_server_max_pending_handshakes_is_closed_before_its_handshake() {
    let db = TestDb::new().await;
    let setup = TlsFiles::new();
    let config = with_server(
        config(&db, &format!("{}\n{}", setup.config(false), identities())),
        "max_pending_handshakes = 1",
    );
    let server = Server::start(&config).await;
    let ca = setup.dir.path().join("ca.pem");
    let credentials = || {
        Credentials::from_files(Some(&ca), None, None)
            .unwrap()
            .bearer_token(OPERATOR_TOKEN)
            .unwrap()
    };
    let url = format!("https://{}", server.address);

    // Two clients that never start their handshakes: one holds the only place, the
    // other is closed at once.
    let mut silent = [
        TcpStream::connect(&server.address).await.unwrap(),
        TcpStream::connect(&server.address).await.unwrap(),
    ];
    let started = tokio::time::Instant::now();
    let closed = 'found: loop {
        for (i, stream) in silent.iter_mut().enumerate() {
            if closed_by_server(stream).await {
                break 'found i;
            }
        }
        assert!(started.elapsed() < DEADLINE, "no silent client closed");
    };
    let [first, second] = silent;
    let holder = if closed == 0 { second } else { first };
    server
        .wait_for_log("server.max_pending_handshakes reached")
        .await;
    let refused = txoutbox_client::connect_with([url.clone()], credentials()).await;
    let listed = match refused {
        Ok(connection) => AdminClient::new(connection)
            .list_outboxes(v1::ListOutboxesRequest {})
            .await
            .map(drop)
            .map_err(|status| status.to_string()),
        Err(error) => Err(error.to_string()),
    };
    assert!(listed.is_err(), "served past the handshake cap");

    drop(holder);
    eventually(
        "a TLS client served once the place is free",
        DEADLINE,
        || {
            let (url, credentials) = (url.clone(), credentials());
            async move {
                let connection = txoutbox_client::connect_with([url], credentials)
                    .await
                    .ok()?;
                AdminClient::new(connection)
                    .list_outboxes(v1::ListOutboxesRequest {})
                    .await
                    .ok()
            }
        },
    )
    .await;
    db.drop().await;
}

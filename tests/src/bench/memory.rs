//! `txoutboxd`'s memory with many idle subscriber streams: a fresh server on an empty
//! outbox, then `--idle-streams` streams opened over the generated stubs, each on a
//! connection of its own (as many publisher processes would), left idle; RSS is read
//! from `/proc/PID/status` once they are all subscribed and have settled.

use std::time::Duration;

use futures::stream::{self, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;
use txoutbox_proto::v1::relay_client::RelayClient;
use txoutbox_proto::v1::subscribe_request::Request;
use txoutbox_proto::v1::subscribe_response::Response;
use txoutbox_proto::v1::{OpenSubscription, SubscribeRequest, SubscribeResponse};

use super::drain::{server_config, start_server, stop_server, OUTBOX};
use super::procfs;
use super::workload::BenchSchema;
use super::Plan;

/// Streams opened at once while connecting.
const OPENING_CONCURRENCY: usize = 32;

#[derive(Debug, Clone, Copy)]
pub struct IdleMemory {
    /// RSS of the server before any stream was opened.
    pub baseline_kib: u64,
    /// RSS with every stream open and idle.
    pub rss_kib: u64,
    /// Peak RSS (`VmHWM`) so far, opening the streams included.
    pub peak_kib: u64,
}

/// An open stream: dropping it ends the call.
struct IdleStream {
    _requests: mpsc::Sender<SubscribeRequest>,
    _responses: tonic::Streaming<SubscribeResponse>,
}

pub async fn idle_streams(plan: &Plan) -> anyhow::Result<IdleMemory> {
    let schema = BenchSchema::create(&plan.database_url, "memory").await?;
    let result = measure_in(plan, &schema).await;
    schema.drop().await;
    result
}

async fn measure_in(plan: &Plan, schema: &BenchSchema) -> anyhow::Result<IdleMemory> {
    let channel = format!("{}_wake", schema.name);
    let config = server_config(plan, &schema.name, true, Some(&channel));
    let server = start_server(plan, &format!("{config}create_schema = true\n")).await;
    let pid = server
        .pid()
        .ok_or_else(|| anyhow::anyhow!("txoutboxd exited"))?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let baseline_kib = procfs::status_kib(pid, "VmRSS").unwrap_or(0);

    let url = server.url();
    let opened: Vec<anyhow::Result<IdleStream>> = stream::iter(0..plan.idle_streams)
        .map(|i| open(url.clone(), i))
        .buffer_unordered(OPENING_CONCURRENCY)
        .collect()
        .await;
    let streams = opened.into_iter().collect::<anyhow::Result<Vec<_>>>();
    let result = match streams {
        Ok(streams) => {
            // Let every stream's first claims and the idle pollers settle.
            tokio::time::sleep(if plan.quick {
                Duration::from_secs(1)
            } else {
                Duration::from_secs(5)
            })
            .await;
            let rss_kib = procfs::status_kib(pid, "VmRSS").unwrap_or(0);
            let peak_kib = procfs::status_kib(pid, "VmHWM").unwrap_or(0);
            drop(streams);
            Ok(IdleMemory {
                baseline_kib,
                rss_kib,
                peak_kib,
            })
        }
        Err(error) => Err(error),
    };
    stop_server(plan, server, "memory").await;
    result
}

async fn open(url: String, i: usize) -> anyhow::Result<IdleStream> {
    let channel = Endpoint::from_shared(url)?.connect().await?;
    let mut client = RelayClient::new(channel);
    let (requests, rx) = mpsc::channel(4);
    requests
        .send(SubscribeRequest {
            request: Some(Request::Open(OpenSubscription {
                group: String::new(),
                outbox: OUTBOX.to_owned(),
                subscriber: format!("idle-{i}"),
                topics: vec![],
                max_in_flight: 100,
                lease_ms: 0,
            })),
        })
        .await?;
    let mut responses = client
        .subscribe(ReceiverStream::new(rx))
        .await?
        .into_inner();
    match responses.message().await? {
        Some(SubscribeResponse {
            response: Some(Response::Subscribed(_)),
        }) => Ok(IdleStream {
            _requests: requests,
            _responses: responses,
        }),
        other => anyhow::bail!("stream {i}: expected `subscribed`, got {other:?}"),
    }
}

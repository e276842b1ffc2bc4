//! `txoutbox subscribers`: the streams connected to the replica that answers (name,
//! owner, address, identity, topics, window, in flight, answers counted, since when, last
//! answer), and, from the database, the owners holding leases now on every replica. What
//! an operator looks at for "who holds this key" (the `OWNER` of `blocked`) and "is
//! anyone consuming".

use std::time::SystemTime;

use serde_json::json;
use txoutbox_client::proto::prost_types;
use txoutbox_client::proto::v1::{ConnectedSubscriber, LeaseHolder, ListSubscribersRequest};

use super::output::{print_json, print_table, Format};
use super::{CliError, Context};

pub async fn run(context: &mut Context) -> Result<(), CliError> {
    let outbox = context.outbox().await?;
    let listed = context
        .admin()
        .await?
        .list_subscribers(ListSubscribersRequest {
            outbox: outbox.clone(),
        })
        .await?
        .into_inner();
    match context.format_or(Format::Table) {
        Format::Json => print_json(&json!({
            "outbox": outbox,
            "connected": listed.connected.iter().map(connected_json).collect::<Vec<_>>(),
            "lease_holders": listed.lease_holders.iter().map(holder_json).collect::<Vec<_>>(),
        })),
        Format::Table => {
            println!("streams connected to this replica:");
            let rows: Vec<Vec<String>> = listed.connected.iter().map(connected_cells).collect();
            print_table(
                &[
                    "NAME",
                    "OWNER",
                    "PEER",
                    "IDENTITY",
                    "TOPICS",
                    "WINDOW",
                    "IN FLIGHT",
                    "ACKED",
                    "NACKED",
                    "FENCED",
                    "SINCE",
                    "LAST ANSWER",
                ],
                &rows,
            )?;
            println!("lease holders on every replica:");
            let rows: Vec<Vec<String>> = listed.lease_holders.iter().map(holder_cells).collect();
            print_table(&["OWNER", "ROWS", "EARLIEST EXPIRY"], &rows)
        }
    }
}

fn time(at: &Option<prost_types::Timestamp>) -> Option<String> {
    let at = SystemTime::try_from((*at)?).ok()?;
    Some(humantime::format_rfc3339_seconds(at).to_string())
}

fn connected_json(stream: &ConnectedSubscriber) -> serde_json::Value {
    json!({
        "name": stream.name,
        "owner": stream.owner,
        "peer": (!stream.peer.is_empty()).then_some(&stream.peer),
        "identity": stream.identity,
        "topics": stream.topics,
        "window": stream.window,
        "in_flight": stream.in_flight,
        "acked": stream.acked,
        "nacked": stream.nacked,
        "fenced": stream.fenced,
        "connected_since": time(&stream.connected_since),
        "last_answer": time(&stream.last_answer),
    })
}

fn connected_cells(stream: &ConnectedSubscriber) -> Vec<String> {
    let dash = || "-".to_owned();
    let or_dash = |text: &str| {
        if text.is_empty() {
            dash()
        } else {
            text.to_owned()
        }
    };
    vec![
        stream.name.clone(),
        stream.owner.clone(),
        or_dash(&stream.peer),
        stream.identity.clone().unwrap_or_else(dash),
        if stream.topics.is_empty() {
            "(all)".to_owned()
        } else {
            stream.topics.join(",")
        },
        stream.window.to_string(),
        stream.in_flight.to_string(),
        stream.acked.to_string(),
        stream.nacked.to_string(),
        stream.fenced.to_string(),
        time(&stream.connected_since).unwrap_or_else(dash),
        time(&stream.last_answer).unwrap_or_else(dash),
    ]
}

fn holder_json(holder: &LeaseHolder) -> serde_json::Value {
    json!({
        "owner": holder.owner,
        "rows": holder.rows,
        "earliest_expiry": time(&holder.earliest_expiry),
    })
}

fn holder_cells(holder: &LeaseHolder) -> Vec<String> {
    vec![
        holder.owner.clone(),
        holder.rows.to_string(),
        time(&holder.earliest_expiry).unwrap_or_else(|| "-".to_owned()),
    ]
}

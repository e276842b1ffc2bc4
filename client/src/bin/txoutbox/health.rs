//! `txoutbox health`: grpc.health.v1 of the server and of each outbox. Exits 0 only when
//! every one checked is SERVING.

use serde_json::json;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use super::output::{print_json, print_table, Format};
use super::{CliError, Context};

pub async fn run(context: &mut Context) -> Result<(), CliError> {
    // The outbox asked for, or every configured one.
    let outboxes = match context.outbox.clone() {
        Some(outbox) => vec![outbox],
        None => context.outbox_names().await?,
    };
    let mut client = HealthClient::new(context.channel().await?);
    let server = check(&mut client, "").await?;
    let mut statuses = Vec::new();
    for outbox in &outboxes {
        let status = match check(&mut client, outbox).await {
            Err(CliError::NotFound(_)) => {
                let configured = context.outbox_names().await?;
                if !configured.contains(outbox) {
                    return Err(CliError::NotFound(format!(
                        "outbox `{outbox}` is not configured; configured: {}",
                        configured.join(", ")
                    )));
                }
                // Configured, but the server has not reported on it yet (starting up).
                ServingStatus::Unknown
            }
            other => other?,
        };
        statuses.push((outbox.clone(), status));
    }
    match context.format_or(Format::Table) {
        Format::Json => print_json(&json!({
            "server": server.as_str_name(),
            "outboxes": statuses
                .iter()
                .map(|(name, status)| (name.clone(), json!(status.as_str_name())))
                .collect::<serde_json::Map<_, _>>(),
        }))?,
        Format::Table => {
            let mut rows = vec![vec!["(server)".to_owned(), server.as_str_name().to_owned()]];
            rows.extend(
                statuses
                    .iter()
                    .map(|(name, status)| vec![name.clone(), status.as_str_name().to_owned()]),
            );
            print_table(&["SERVICE", "STATUS"], &rows)?;
        }
    }
    let unhealthy: Vec<&str> = std::iter::once(("(server)", server))
        .chain(
            statuses
                .iter()
                .map(|(name, status)| (name.as_str(), *status)),
        )
        .filter(|(_, status)| *status != ServingStatus::Serving)
        .map(|(name, _)| name)
        .collect();
    if unhealthy.is_empty() {
        Ok(())
    } else {
        Err(CliError::Failed(format!(
            "not serving: {}",
            unhealthy.join(", ")
        )))
    }
}

async fn check(
    client: &mut HealthClient<txoutbox_client::Connection>,
    service: &str,
) -> Result<ServingStatus, CliError> {
    let response = client
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await?;
    Ok(response.into_inner().status())
}

//! The services' refusals sorted into permanent (dead-letter the message) and retried, and
//! each entry's outcome from a batch's answer.

use std::fmt;

use crate::PublishError;

/// What a refusal of the whole request means for its messages.
pub(crate) enum RequestFailure {
    /// A parameter of some entry was refused: send each message on its own, so that only
    /// the one at fault is dead-lettered.
    SendAlone(String),
    /// Anything else: every message of the request is retried.
    Retry(PublishError),
}

/// The last part of an error code (`AWS.SimpleQueueService.NonExistentQueue` →
/// `NonExistentQueue`).
fn short_code(code: &str) -> &str {
    code.rsplit('.').next().unwrap_or(code)
}

/// Codes that refuse something in the message itself (its body, attributes or ids).
fn is_content_fault(code: &str) -> bool {
    matches!(
        short_code(code),
        "InvalidParameterValue"
            | "InvalidParameter"
            | "ParameterValueInvalid"
            | "InvalidMessageContents"
            | "InvalidAttributeName"
            | "InvalidAttributeValue"
            | "ValidationError"
            | "ValidationException"
    )
}

/// Codes an operator or time fixes, even when the service calls them the sender's fault:
/// throttling, KMS keys, permissions, a missing queue or topic.
fn is_fixable(code: &str) -> bool {
    let code = short_code(code);
    code.contains("Throttl")
        || code.starts_with("KMS")
        || code.starts_with("Kms")
        || code.contains("AccessDenied")
        || code.contains("Authorization")
        || code.contains("NotFound")
        || code.contains("NonExistent")
        || code.contains("DoesNotExist")
        || code == "OverLimit"
}

/// A batch entry the service failed: permanent when the service says it was the sender's
/// fault and nothing an operator does would change it.
pub(crate) fn entry_failure(
    service: &str,
    destination: &str,
    sender_fault: bool,
    code: &str,
    text: Option<&str>,
) -> PublishError {
    let error = PublishError::new(format!(
        "{service} {destination}: refused the message: {code}: {}",
        text.unwrap_or("no message")
    ));
    if sender_fault && !is_fixable(code) {
        error.into_permanent()
    } else {
        error
    }
}

/// A failed request, from the SDK's error: its code and message when the service
/// answered, else the transport's failure.
pub(crate) fn request_failure<E, R>(
    service: &str,
    destination: &str,
    error: &aws_smithy_runtime_api::client::result::SdkError<E, R>,
) -> RequestFailure
where
    E: aws_smithy_types::error::metadata::ProvideErrorMetadata + std::error::Error + 'static,
    R: fmt::Debug,
{
    use aws_smithy_runtime_api::client::result::SdkError;
    match error {
        SdkError::ServiceError(context) => {
            let code = context.err().code().unwrap_or("unknown");
            let message = context.err().message().unwrap_or("no message");
            let text = format!("{service} {destination}: {code}: {message}");
            if is_content_fault(code) {
                RequestFailure::SendAlone(text)
            } else {
                RequestFailure::Retry(PublishError::new(text))
            }
        }
        other => RequestFailure::Retry(PublishError::new(format!(
            "{service} {destination}: {}",
            aws_smithy_types::error::display::DisplayErrorContext(other)
        ))),
    }
}

/// Each entry's outcome from a batch's answer: the ids (positions) it confirmed and
/// those it failed; an entry the answer does not mention is retried.
pub(crate) fn batch_outcomes<'a>(
    service: &str,
    destination: &str,
    count: usize,
    confirmed: impl IntoIterator<Item = &'a str>,
    failed: impl IntoIterator<Item = (&'a str, PublishError)>,
) -> Vec<Result<(), PublishError>> {
    let mut outcomes: Vec<Option<Result<(), PublishError>>> = (0..count).map(|_| None).collect();
    let answers = confirmed
        .into_iter()
        .map(|id| (id, Ok(())))
        .chain(failed.into_iter().map(|(id, error)| (id, Err(error))));
    for (id, outcome) in answers {
        if let Some(slot) = id.parse::<usize>().ok().and_then(|i| outcomes.get_mut(i)) {
            *slot = Some(outcome);
        }
    }
    outcomes
        .into_iter()
        .map(|outcome| {
            outcome.unwrap_or_else(|| {
                Err(PublishError::new(format!(
                    "{service} {destination}: the answer to the batch did not mention this message"
                )))
            })
        })
        .collect()
}

/// The outcome of a message sent alone, from its request's result.
pub(crate) fn alone_outcome<T, E, R>(
    service: &str,
    destination: &str,
    result: Result<T, aws_smithy_runtime_api::client::result::SdkError<E, R>>,
) -> Result<(), PublishError>
where
    E: aws_smithy_types::error::metadata::ProvideErrorMetadata + std::error::Error + 'static,
    R: fmt::Debug,
{
    match result {
        Ok(_) => Ok(()),
        Err(error) => match request_failure(service, destination, &error) {
            RequestFailure::SendAlone(text) => Err(PublishError::permanent(format!(
                "{text} (the service refused this message)"
            ))),
            RequestFailure::Retry(error) => Err(error),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_failures_are_permanent_only_for_the_senders_own_fault() {
        let refused = entry_failure("sqs", "q", true, "InvalidParameterValue", Some("too long"));
        assert!(refused.is_permanent());
        assert_eq!(
            refused.text(),
            "sqs q: refused the message: InvalidParameterValue: too long"
        );
        assert!(!entry_failure("sqs", "q", false, "InternalError", None).is_permanent());
        assert!(!entry_failure("sns", "t", true, "KMSThrottling", None).is_permanent());
        assert!(!entry_failure(
            "sqs",
            "q",
            true,
            "AWS.SimpleQueueService.NonExistentQueue",
            None
        )
        .is_permanent());
    }
}

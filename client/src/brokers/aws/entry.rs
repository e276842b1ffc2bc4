//! A message as an SQS or SNS entry, within the services' limits (the rules are listed in
//! `aws/mod.rs`).

use sha2::{Digest, Sha256};

use super::{CONTENT_TYPE, MAX_ATTRIBUTES, MAX_BYTES};
use crate::brokers::{carried_headers, Binding, CloudEvents};
use crate::{Message, PublishError};

/// One message as either service takes it.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub body: String,
    /// String attributes, in order.
    pub attributes: Vec<(String, String)>,
    /// FIFO only.
    pub group_id: Option<String>,
    pub deduplication_id: Option<String>,
    /// What the service counts against its limits.
    pub size: usize,
}

/// How a publisher turns messages into entries.
#[derive(Debug, Clone)]
pub(crate) struct EntryRules {
    /// `sqs` or `sns`, in error texts.
    pub service: &'static str,
    pub fifo: bool,
    pub deduplication_prefix: String,
    pub cloudevents: Option<CloudEvents>,
}

impl EntryRules {
    /// `message` as an entry, or why the service could never take it (permanent).
    pub(crate) fn entry(&self, message: &Message) -> Result<Entry, PublishError> {
        let service = self.service;
        let (attributes, body) = match &self.cloudevents {
            Some(events) => {
                let envelope = events.envelope(message, Binding::Aws);
                let mut attributes = envelope.headers;
                attributes.push((CONTENT_TYPE.to_owned(), envelope.content_type));
                (attributes, envelope.body)
            }
            None => {
                let attributes = carried_headers(message)
                    .map(|(name, value)| (name.to_owned(), value.into_owned()))
                    .collect();
                (attributes, message.payload.clone())
            }
        };
        let body = String::from_utf8(body.to_vec()).map_err(|_| {
            PublishError::permanent(format!(
                "{service}: message {} has a payload that is not UTF-8 text, which {service} \
                 bodies must be; encode it at the producer (base64) or use CloudEvents \
                 structured mode (data_base64)",
                message.id
            ))
        })?;
        let mut kept: Vec<(String, String)> = Vec::with_capacity(attributes.len());
        for (name, value) in attributes {
            if value.is_empty() || kept.iter().any(|(taken, _)| *taken == name) {
                continue;
            }
            if let Some(why) = invalid_attribute_name(&name) {
                return Err(PublishError::permanent(format!(
                    "{service}: header `{name}` of message {} cannot be a message attribute \
                     ({why}); rename it at the producer",
                    message.id
                )));
            }
            kept.push((name, value));
        }
        if kept.len() > MAX_ATTRIBUTES {
            let names: Vec<&str> = kept.iter().map(|(name, _)| name.as_str()).collect();
            return Err(PublishError::permanent(format!(
                "{service}: message {} would carry {} message attributes ({}), over the \
                 {MAX_ATTRIBUTES} {service} takes; send fewer headers, or use CloudEvents \
                 structured mode, which carries them in the body",
                message.id,
                kept.len(),
                names.join(", ")
            )));
        }
        let size = body.len()
            + kept
                .iter()
                .map(|(name, value)| name.len() + "String".len() + value.len())
                .sum::<usize>();
        if size > MAX_BYTES {
            return Err(PublishError::permanent(format!(
                "{service}: message {} is {size} bytes with its attributes, over the \
                 {MAX_BYTES} {service} takes; keep large payloads elsewhere (S3) and send a \
                 reference",
                message.id
            )));
        }
        let (group_id, deduplication_id) = if self.fifo {
            let group = match &message.key {
                Some(key) => group_id(key),
                None => message.id.to_string(),
            };
            (
                Some(group),
                Some(format!("{}{}", self.deduplication_prefix, message.id)),
            )
        } else {
            (None, None)
        };
        Ok(Entry {
            body,
            attributes: kept,
            group_id,
            deduplication_id,
            size,
        })
    }
}

/// The FIFO message group of `key`: the key itself when the services take it (1 to 128
/// characters of printable ASCII), else `sha256-` and the key's hex SHA-256.
pub fn group_id(key: &str) -> String {
    let usable = !key.is_empty() && key.len() <= 128 && key.bytes().all(|b| b.is_ascii_graphic());
    if usable {
        return key.to_owned();
    }
    let digest = Sha256::digest(key.as_bytes());
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("sha256-{hex}")
}

/// Why `name` is not a message attribute name, if it is not one.
fn invalid_attribute_name(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    if name.is_empty() || name.len() > 256 {
        Some("a name has 1 to 256 characters")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        Some("only letters, digits, -, _ and . are allowed")
    } else if name.starts_with('.') || name.ends_with('.') || name.contains("..") {
        Some("no leading, trailing or doubled .")
    } else if lower.starts_with("aws.") || lower.starts_with("amazon.") {
        Some("AWS. and Amazon. are reserved")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(fifo: bool) -> EntryRules {
        EntryRules {
            service: "sqs",
            fifo,
            deduplication_prefix: String::new(),
            cloudevents: None,
        }
    }

    #[test]
    fn fifo_entries_group_by_key_and_deduplicate_on_the_id() {
        let keyed = Message::new(7, "orders.paid", "{}").with_key("customer-1");
        let entry = rules(true).entry(&keyed).unwrap();
        assert_eq!(entry.group_id.as_deref(), Some("customer-1"));
        assert_eq!(entry.deduplication_id.as_deref(), Some("7"));
        let keyless = Message::new(8, "orders.paid", "{}");
        assert_eq!(
            rules(true).entry(&keyless).unwrap().group_id.as_deref(),
            Some("8")
        );
        let standard = rules(false).entry(&keyed).unwrap();
        assert!(standard.group_id.is_none() && standard.deduplication_id.is_none());
        let prefixed = EntryRules {
            deduplication_prefix: "billing-".into(),
            ..rules(true)
        };
        assert_eq!(
            prefixed.entry(&keyed).unwrap().deduplication_id.as_deref(),
            Some("billing-7")
        );
    }

    #[test]
    fn keys_the_services_refuse_become_a_hash_that_still_orders() {
        assert_eq!(group_id("c-1/eu"), "c-1/eu");
        let spaced = group_id("customer one");
        assert!(
            spaced.starts_with("sha256-") && spaced.len() == 7 + 64,
            "{spaced}"
        );
        assert_eq!(spaced, group_id("customer one"));
        assert!(group_id(&"k".repeat(129)).starts_with("sha256-"));
        assert!(group_id("clé").starts_with("sha256-"));
    }

    #[test]
    fn headers_become_attributes_within_the_limits() {
        let message = Message::new(7, "orders.paid", "{}")
            .with_key("c-1")
            .with_header("traceparent", "00-abc")
            .with_header("empty", "");
        let entry = rules(false).entry(&message).unwrap();
        let names: Vec<&str> = entry.attributes.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "traceparent",
                "txoutbox-id",
                "txoutbox-topic",
                "txoutbox-key"
            ]
        );

        let mut crowded = Message::new(9, "t", "{}");
        for n in 0..9 {
            crowded = crowded.with_header(format!("h{n}"), "v");
        }
        let error = rules(false).entry(&crowded).unwrap_err();
        assert!(error.is_permanent());
        assert!(
            error.text().contains("11 message attributes"),
            "{}",
            error.text()
        );

        let spaced = Message::new(10, "t", "{}").with_header("x tenant", "t1");
        let error = rules(false).entry(&spaced).unwrap_err();
        assert!(error.is_permanent() && error.text().contains("`x tenant`"));
    }

    #[test]
    fn bodies_must_be_text_and_fit() {
        let binary = Message::new(1, "t", vec![0xffu8, 0xfe]);
        assert!(rules(false).entry(&binary).unwrap_err().is_permanent());
        let large = Message::new(2, "t", "x".repeat(MAX_BYTES));
        let error = rules(false).entry(&large).unwrap_err();
        assert!(
            error.is_permanent() && error.text().contains("262144"),
            "{}",
            error.text()
        );
        let fits = Message::new(3, "t", "x".repeat(MAX_BYTES - 200));
        assert!(rules(false).entry(&fits).is_ok());
    }
}

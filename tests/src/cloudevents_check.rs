//! The CloudEvents reference SDK for Python reading back an event as a transport delivered
//! it (`tests/cloudevents/check.py`, in a venv of its own that `scripts/test` makes first):
//! the receiving side of the CloudEvents tests is another language's implementation of
//! the bindings, not this crate's.

use std::io::Write;
use std::process::{Command, Stdio};

use base64::Engine;

/// What the SDK made of the event: `{"attributes": {...}, "data": ...}` (or
/// `data_base64`). `binding` is `http`, `kafka`, `amqp`, `nats`, `mqtt` or `redis`.
pub fn read_back(
    binding: &str,
    headers: &[(String, String)],
    key: Option<&str>,
    body: &[u8],
) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/cloudevents/check");
    let input = serde_json::json!({
        "binding": binding,
        "headers": headers,
        "key": key,
        "body_base64": base64::engine::general_purpose::STANDARD.encode(body),
    });
    let mut child = Command::new(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{script}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "the CloudEvents SDK refused the {binding} event: {}\ninput: {input}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

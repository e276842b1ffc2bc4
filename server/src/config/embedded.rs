//! The configuration used when there is none, so `txoutboxd` with no arguments serves
//! something a newcomer can try at once; and when it applies.

use std::path::Path;

/// The configuration used when there is none: no `--config`, no `TXOUTBOX_CONFIG`, no
/// `./txoutboxd.toml`, and no `TXOUTBOX_OUTBOXES__*` variable naming an outbox of its own.
/// One outbox, `default`, on the table `outbox` of the SQLite file `./txoutbox.db`,
/// created on first start. Environment variables and flags still apply on top (the file:
/// `--db PATH` or `TXOUTBOX_DATABASES__DEFAULT__URL`).
pub const EMBEDDED_DEFAULT: &str = r#"
[databases.default]
url = "sqlite://txoutbox.db"

[outboxes.default]
database = "default"
table = "outbox"
create_schema = true
# SQLite cannot announce inserts: while idle, look at least every second.
poll.max = "1s"
"#;

/// The outbox and database name of [`EMBEDDED_DEFAULT`].
pub const EMBEDDED_NAME: &str = "default";

/// `sqlite://PATH`, with the characters a URL would misread percent-encoded.
pub(super) fn sqlite_url(path: &Path) -> String {
    let path = path.to_string_lossy();
    let encoded = path
        .replace('%', "%25")
        .replace('?', "%3F")
        .replace('#', "%23");
    format!("sqlite://{encoded}")
}

/// Whether `TXOUTBOX_OUTBOXES__<NAME>__*` declares an outbox other than the embedded
/// default's: then the environment is the whole configuration, not a tweak of the default.
pub(super) fn environment_declares_outboxes() -> bool {
    declares_outboxes(std::env::vars_os().map(|(name, _)| name))
}

pub(super) fn declares_outboxes(names: impl IntoIterator<Item = std::ffi::OsString>) -> bool {
    names.into_iter().any(|name| {
        let name = name.to_string_lossy().to_ascii_lowercase();
        name.strip_prefix("txoutbox_outboxes__")
            .and_then(|rest| rest.split("__").next())
            .is_some_and(|outbox| outbox != EMBEDDED_NAME)
    })
}

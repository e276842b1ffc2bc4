//! SQL identifiers that come from configuration (schema, table and channel names).
//!
//! They are spliced into SQL text, so they are validated once, when a storage is built,
//! and always quoted when rendered. The accepted shape, `^[A-Za-z_][A-Za-z0-9_]{0,62}$`,
//! is what PostgreSQL accepts unquoted (minus case folding) within its 63-byte limit, so
//! a name that passes never needs escaping and is never truncated by the server.

use std::fmt;

/// Longest identifier PostgreSQL keeps without truncating (`NAMEDATALEN - 1`).
pub const MAX_LEN: usize = 63;

/// A validated SQL identifier.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ident(String);

/// Why a name was refused; the message says what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{value}` is not a valid SQL identifier: use 1 to 63 ASCII letters, digits and \
     underscores, not starting with a digit"
)]
pub struct InvalidIdent {
    pub value: String,
}

impl Ident {
    pub fn new(value: &str) -> Result<Self, InvalidIdent> {
        validate(value)?;
        Ok(Self(value.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The identifier in double quotes, so its case is kept.
    pub fn quoted(&self) -> String {
        quote(&self.0)
    }
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks `value` against `^[A-Za-z_][A-Za-z0-9_]{0,62}$`.
pub fn validate(value: &str) -> Result<(), InvalidIdent> {
    let mut chars = value.chars();
    let starts_well = chars
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_');
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if starts_well && rest_ok && value.len() <= MAX_LEN {
        Ok(())
    } else {
        Err(InvalidIdent {
            value: value.to_owned(),
        })
    }
}

/// Double-quotes an identifier, doubling embedded quotes. Validated identifiers have none,
/// but quoting stays correct for any input.
pub fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_names() {
        for name in ["outbox", "_private", "Outbox_2", "a", &"x".repeat(63)] {
            assert!(validate(name).is_ok(), "{name}");
        }
    }

    #[test]
    fn refuses_anything_else() {
        for name in [
            "",
            "1outbox",
            "out-box",
            "out box",
            "public.outbox",
            "é",
            &"x".repeat(64),
        ] {
            let err = validate(name).unwrap_err();
            assert_eq!(err.value, name);
            assert!(err
                .to_string()
                .contains("ASCII letters, digits and underscores"));
        }
    }

    #[test]
    fn quoting_keeps_case_and_escapes_quotes() {
        assert_eq!(Ident::new("Outbox").unwrap().quoted(), "\"Outbox\"");
        assert_eq!(quote("a\"b"), "\"a\"\"b\"");
    }
}

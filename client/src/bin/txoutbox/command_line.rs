//! The `txoutbox` command a hint prints: the one the user ran, reaching the same servers
//! with the same credentials, so that it works as printed when pasted into the same
//! shell. A token given with `--token` is never printed: the hint shows `TOKEN` in its
//! place and says so; one read from `TXOUTBOX_TOKEN` needs nothing, the variable is still
//! there.

use std::path::PathBuf;

use super::DEFAULT_SERVER;

/// What every hint repeats of the user's command line.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reach {
    /// Server URIs, as [`super::Context`] holds them.
    pub servers: Vec<String>,
    /// True when a token was given with `--token`, not through `TXOUTBOX_TOKEN`.
    pub token_flag: bool,
    pub tls_ca: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
}

/// The word that stands for the token in a printed command.
pub(crate) const TOKEN_PLACEHOLDER: &str = "TOKEN";

impl Reach {
    /// `txoutbox` with the server and credential options, then `args`, quoted for a
    /// POSIX shell; with a note after it when the user must put the token in.
    pub fn command(&self, args: &[&str]) -> String {
        let servers = self.servers.join(",");
        let mut words: Vec<String> = vec!["txoutbox".to_owned()];
        let mut option = |name: &str, value: String| {
            words.push(name.to_owned());
            words.push(value);
        };
        if self.servers != [DEFAULT_SERVER] {
            option("--server", servers);
        }
        if self.token_flag {
            option("--token", TOKEN_PLACEHOLDER.to_owned());
        }
        let path = |path: &Option<PathBuf>| path.as_ref().map(|p| p.display().to_string());
        for (name, value) in [
            ("--tls-ca", path(&self.tls_ca)),
            ("--tls-cert", path(&self.tls_cert)),
            ("--tls-key", path(&self.tls_key)),
        ] {
            if let Some(value) = value {
                option(name, value);
            }
        }
        words.extend(args.iter().map(|arg| (*arg).to_owned()));
        let quoted = words.iter().map(|word| quote(word)).collect::<Vec<_>>();
        let command = format!("`{}`", quoted.join(" "));
        if self.token_flag {
            format!("{command} ({TOKEN_PLACEHOLDER}: your token, not printed here)")
        } else {
            command
        }
    }
}

/// `word` as one shell word: as it is when it holds only characters the shell leaves
/// alone (URLs and paths mostly do), else single-quoted. txoutboxd's start-up line
/// quotes the same way.
fn quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:=@%+,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        return word.to_owned();
    }
    format!("'{}'", word.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_server_is_left_out_and_a_token_is_never_printed() {
        let local = Reach {
            servers: vec![DEFAULT_SERVER.to_owned()],
            ..Reach::default()
        };
        assert_eq!(
            local.command(&["--outbox", "orders", "resume"]),
            "`txoutbox --outbox orders resume`"
        );
        let remote = Reach {
            servers: vec!["https://a:7411".into(), "https://b:7411".into()],
            token_flag: true,
            tls_ca: Some("my ca.pem".into()),
            ..Reach::default()
        };
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(
            remote.command(&["--outbox", "orders", "resume"]),
            "`txoutbox --server https://a:7411,https://b:7411 --token TOKEN --tls-ca 'my ca.pem' \
             --outbox orders resume` (TOKEN: your token, not printed here)"
        );
    }
}

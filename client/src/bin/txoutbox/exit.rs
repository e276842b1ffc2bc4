//! Why a command failed, and the exit code scripts see for it.

use std::fmt;
use std::process::ExitCode;

use txoutbox_client::ClientError;

/// What went wrong, by what a script can do about it. Exit codes:
/// 0 ok, 1 failure, 2 usage, 3 server unreachable or unavailable, 4 not found.
#[derive(Debug)]
pub enum CliError {
    /// Anything else: the command ran and failed (exit 1).
    Failed(String),
    /// Bad arguments or settings (exit 2, like clap's own usage errors).
    Usage(String),
    /// No server answered, or it could not serve now: retrying later may help (exit 3).
    Unreachable(String),
    /// The outbox (or message) does not exist (exit 4).
    NotFound(String),
}

impl CliError {
    pub fn code(&self) -> u8 {
        match self {
            Self::Failed(_) => 1,
            Self::Usage(_) => 2,
            Self::Unreachable(_) => 3,
            Self::NotFound(_) => 4,
        }
    }

    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.code())
    }

    /// A failed call, with `what` was being done ("stats of outbox `orders`").
    pub fn from_status(status: &tonic::Status) -> Self {
        use tonic::Code;
        let text = status.message().to_owned();
        match status.code() {
            Code::NotFound => Self::NotFound(text),
            Code::InvalidArgument | Code::OutOfRange => Self::Usage(text),
            Code::Unavailable | Code::DeadlineExceeded => {
                Self::Unreachable(format!("server unavailable: {text}"))
            }
            code => Self::Failed(format!("{code:?}: {text}")),
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed(text) | Self::Usage(text) | Self::NotFound(text) => f.write_str(text),
            Self::Unreachable(text) => write!(
                f,
                "{text}\nhint: is txoutboxd running there? Set the address with --server or TXOUTBOX_SERVER"
            ),
        }
    }
}

impl From<tonic::Status> for CliError {
    fn from(status: tonic::Status) -> Self {
        Self::from_status(&status)
    }
}

impl From<ClientError> for CliError {
    fn from(error: ClientError) -> Self {
        match error {
            ClientError::Unreachable { .. } => Self::Unreachable(error.to_string()),
            ClientError::Refused { status, .. } | ClientError::Call { status, .. } => {
                Self::from_status(&status)
            }
            ClientError::Config(_) | ClientError::InvalidAddress { .. } => {
                Self::Usage(error.to_string())
            }
            other => Self::Failed(other.to_string()),
        }
    }
}

/// Writing to stdout failed: a closed pipe (`| head`) ends the command quietly.
pub fn output_error(error: std::io::Error) -> CliError {
    CliError::Failed(format!("cannot write the output: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_documented_codes() {
        let code = |status| CliError::from_status(&status).code();
        assert_eq!(code(tonic::Status::not_found("x")), 4);
        assert_eq!(code(tonic::Status::unavailable("x")), 3);
        assert_eq!(code(tonic::Status::invalid_argument("x")), 2);
        assert_eq!(code(tonic::Status::failed_precondition("x")), 1);
        let unreachable = ClientError::Unreachable {
            addresses: vec!["http://127.0.0.1:1".into()],
            reason: "refused".into(),
        };
        assert_eq!(CliError::from(unreachable).code(), 3);
    }
}

//! The one place where errors become gRPC statuses.

use tonic::Status;

use crate::relay::RelayError;
use crate::storage::StorageError;

pub fn to_status(error: RelayError) -> Status {
    match error {
        RelayError::UnknownOutbox { .. } | RelayError::UnknownGroup { .. } => {
            Status::not_found(error.to_string())
        }
        RelayError::WrongMode(_) => Status::failed_precondition(error.to_string()),
        RelayError::InvalidArgument(_) | RelayError::Storage(StorageError::InvalidMessage(_)) => {
            Status::invalid_argument(error.to_string())
        }
        RelayError::ResourceExhausted(_) => Status::resource_exhausted(error.to_string()),
        RelayError::ShuttingDown => Status::unavailable(error.to_string()),
        RelayError::Storage(StorageError::Unavailable(_)) => Status::unavailable(format!(
            "{error}; the server keeps retrying, try again shortly"
        )),
        RelayError::Storage(
            StorageError::MissingTable { .. }
            | StorageError::MismatchedTable { .. }
            | StorageError::ReadOnly(_),
        ) => Status::failed_precondition(error.to_string()),
        RelayError::Storage(StorageError::Other(ref cause)) => {
            tracing::error!(error = ?cause, "internal storage error");
            Status::internal(format!("internal storage error: {cause:#}"))
        }
    }
}

impl From<RelayError> for Status {
    fn from(error: RelayError) -> Self {
        to_status(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn codes_follow_the_kind_of_error() {
        let unknown = RelayError::UnknownOutbox {
            name: "x".into(),
            configured: vec!["a".into()],
        };
        assert_eq!(to_status(unknown).code(), Code::NotFound);
        let down = RelayError::Storage(StorageError::Unavailable("refused".into()));
        assert_eq!(to_status(down).code(), Code::Unavailable);
        let missing = RelayError::Storage(StorageError::MissingTable { table: "t".into() });
        assert_eq!(to_status(missing).code(), Code::FailedPrecondition);
        assert_eq!(
            to_status(RelayError::InvalidArgument("x".into())).code(),
            Code::InvalidArgument
        );
        let read_only = RelayError::Storage(StorageError::ReadOnly("file".into()));
        assert_eq!(to_status(read_only).code(), Code::FailedPrecondition);
        let flood = RelayError::ResourceExhausted("answers".into());
        assert_eq!(to_status(flood).code(), Code::ResourceExhausted);
        let group = RelayError::UnknownGroup {
            outbox: "o".into(),
            name: "x".into(),
            configured: vec!["a".into()],
        };
        assert_eq!(to_status(group).code(), Code::NotFound);
        let mode = RelayError::WrongMode("groups".into());
        assert_eq!(to_status(mode).code(), Code::FailedPrecondition);
        let refused = RelayError::Storage(StorageError::InvalidMessage("NUL".into()));
        assert_eq!(to_status(refused).code(), Code::InvalidArgument);
    }
}

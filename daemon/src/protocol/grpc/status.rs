//! The domain's `Status` as gRPC's, with Pub/Sub's codes for the same mistakes.

use crate::api::{Code, Status};

/// The gRPC code of a domain code. `NotOwner` is the gateway's to handle (it looks the
/// resource up again); if one escapes, the client retries it as `Unavailable`. A malformed
/// request (`ProtocolError`) is the caller's mistake: `InvalidArgument`.
pub fn grpc_code(code: Code) -> tonic::Code {
    match code {
        Code::Ok => tonic::Code::Ok,
        Code::Cancelled => tonic::Code::Cancelled,
        Code::Unknown => tonic::Code::Unknown,
        Code::InvalidArgument | Code::ProtocolError => tonic::Code::InvalidArgument,
        Code::DeadlineExceeded => tonic::Code::DeadlineExceeded,
        Code::NotFound => tonic::Code::NotFound,
        Code::AlreadyExists => tonic::Code::AlreadyExists,
        Code::PermissionDenied => tonic::Code::PermissionDenied,
        Code::ResourceExhausted => tonic::Code::ResourceExhausted,
        Code::FailedPrecondition => tonic::Code::FailedPrecondition,
        Code::Aborted => tonic::Code::Aborted,
        Code::OutOfRange => tonic::Code::OutOfRange,
        Code::Unimplemented => tonic::Code::Unimplemented,
        Code::Internal => tonic::Code::Internal,
        Code::Unavailable | Code::NotOwner => tonic::Code::Unavailable,
        Code::DataLoss => tonic::Code::DataLoss,
        Code::Unauthenticated => tonic::Code::Unauthenticated,
    }
}

/// A `ResourceExhausted` refusal that names a retry delay (a topic over its publish rate:
/// `api::data::DataError::Throttled`) carries it as Google does, a `google.rpc.RetryInfo` in the
/// status details, which Google's client libraries read; the message keeps it as well.
pub fn to_grpc(status: Status) -> tonic::Status {
    use tonic_types::{ErrorDetails, StatusExt};
    let code = grpc_code(status.code);
    if status.code == Code::ResourceExhausted {
        let wire = ringpost_wire::Status::new(ringpost_wire::ErrorCode::ResourceExhausted, status.message);
        return match wire.retry_delay() {
            Some(delay) => tonic::Status::with_error_details(
                code,
                wire.message,
                ErrorDetails::with_retry_info(Some(delay)),
            ),
            None => tonic::Status::new(code, wire.message),
        };
    }
    tonic::Status::new(code, status.message)
}

impl From<Status> for tonic::Status {
    fn from(status: Status) -> tonic::Status {
        to_grpc(status)
    }
}

/// A data-plane error, through its domain code.
impl From<crate::api::data::DataError> for tonic::Status {
    fn from(error: crate::api::data::DataError) -> tonic::Status {
        to_grpc(Status::from(error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::StatusExt;

    #[test]
    fn a_refusal_naming_a_retry_delay_carries_it_as_retry_info() {
        let refused = to_grpc(Status::resource_exhausted(
            "topic 'a' is publishing over its rate (x); retry after 1500 ms",
        ));
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(refused.message().ends_with("retry after 1500 ms"));
        let retry = refused.get_details_retry_info().expect("RetryInfo in the details");
        assert_eq!(retry.retry_delay, Some(std::time::Duration::from_millis(1500)));
        let plain = to_grpc(Status::resource_exhausted("out of disk space or open files: full"));
        assert!(plain.get_details_retry_info().is_none() && plain.details().is_empty());
    }
}

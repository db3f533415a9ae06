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

pub fn to_grpc(status: Status) -> tonic::Status {
    tonic::Status::new(grpc_code(status.code), status.message)
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

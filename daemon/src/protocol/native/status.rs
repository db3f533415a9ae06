//! The domain's errors on the wire: the native protocol's numbered codes are the domain's
//! `Code` list, and a `Status` is carried as the wire's.

use crate::api::{Code, Status};
use ringpost_wire::{ErrorCode, Status as WireStatus};

/// The native protocol's numbered codes are the same list; these two conversions are the whole
/// mapping, checked both ways by a test.
impl From<Code> for ErrorCode {
    fn from(code: Code) -> ErrorCode {
        use ErrorCode as Wire;
        match code {
            Code::Ok => Wire::Ok,
            Code::Cancelled => Wire::Cancelled,
            Code::Unknown => Wire::Unknown,
            Code::InvalidArgument => Wire::InvalidArgument,
            Code::DeadlineExceeded => Wire::DeadlineExceeded,
            Code::NotFound => Wire::NotFound,
            Code::AlreadyExists => Wire::AlreadyExists,
            Code::PermissionDenied => Wire::PermissionDenied,
            Code::ResourceExhausted => Wire::ResourceExhausted,
            Code::FailedPrecondition => Wire::FailedPrecondition,
            Code::Aborted => Wire::Aborted,
            Code::OutOfRange => Wire::OutOfRange,
            Code::Unimplemented => Wire::Unimplemented,
            Code::Internal => Wire::Internal,
            Code::Unavailable => Wire::Unavailable,
            Code::DataLoss => Wire::DataLoss,
            Code::Unauthenticated => Wire::Unauthenticated,
            Code::NotOwner => Wire::NotOwner,
            Code::ProtocolError => Wire::ProtocolError,
        }
    }
}

impl From<ErrorCode> for Code {
    fn from(code: ErrorCode) -> Code {
        use ErrorCode as Wire;
        match code {
            Wire::Ok => Code::Ok,
            Wire::Cancelled => Code::Cancelled,
            Wire::Unknown => Code::Unknown,
            Wire::InvalidArgument => Code::InvalidArgument,
            Wire::DeadlineExceeded => Code::DeadlineExceeded,
            Wire::NotFound => Code::NotFound,
            Wire::AlreadyExists => Code::AlreadyExists,
            Wire::PermissionDenied => Code::PermissionDenied,
            Wire::ResourceExhausted => Code::ResourceExhausted,
            Wire::FailedPrecondition => Code::FailedPrecondition,
            Wire::Aborted => Code::Aborted,
            Wire::OutOfRange => Code::OutOfRange,
            Wire::Unimplemented => Code::Unimplemented,
            Wire::Internal => Code::Internal,
            Wire::Unavailable => Code::Unavailable,
            Wire::DataLoss => Code::DataLoss,
            Wire::Unauthenticated => Code::Unauthenticated,
            Wire::NotOwner => Code::NotOwner,
            Wire::ProtocolError => Code::ProtocolError,
        }
    }
}

impl From<Status> for WireStatus {
    fn from(status: Status) -> WireStatus {
        WireStatus::new(status.code.into(), status.message)
    }
}

/// A data-plane error, through its domain code.
impl From<crate::api::data::DataError> for WireStatus {
    fn from(error: crate::api::data::DataError) -> WireStatus {
        Status::from(error).into()
    }
}

impl From<WireStatus> for Status {
    fn from(status: WireStatus) -> Status {
        Status::new(status.code.into(), status.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_wire_code_maps_to_a_domain_code_and_back() {
        for wire in ErrorCode::ALL {
            let domain = Code::from(wire);
            assert_eq!(ErrorCode::from(domain), wire);
            assert_eq!(domain.name(), wire.name());
        }
    }
}

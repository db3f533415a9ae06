//! The domain's errors: a code with a message. The codes are gRPC's, which Pub/Sub's users know,
//! plus the two a forwarder needs of its own; each protocol maps them onto its own numbers.

/// What went wrong, as a caller decides what to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    Ok,
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
    /// This shard does not own the topic or subscription; the caller should ask the router.
    NotOwner,
    /// The request could not be parsed; its connection is closed after the reply.
    ProtocolError,
}

impl Code {
    /// Every code. A code's place here is its number between nodes (`control::codec`), so the
    /// list only grows at its end.
    pub const ALL: [Code; 19] = [
        Code::Ok,
        Code::Cancelled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
        Code::NotOwner,
        Code::ProtocolError,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "Ok",
            Code::Cancelled => "Cancelled",
            Code::Unknown => "Unknown",
            Code::InvalidArgument => "InvalidArgument",
            Code::DeadlineExceeded => "DeadlineExceeded",
            Code::NotFound => "NotFound",
            Code::AlreadyExists => "AlreadyExists",
            Code::PermissionDenied => "PermissionDenied",
            Code::ResourceExhausted => "ResourceExhausted",
            Code::FailedPrecondition => "FailedPrecondition",
            Code::Aborted => "Aborted",
            Code::OutOfRange => "OutOfRange",
            Code::Unimplemented => "Unimplemented",
            Code::Internal => "Internal",
            Code::Unavailable => "Unavailable",
            Code::DataLoss => "DataLoss",
            Code::Unauthenticated => "Unauthenticated",
            Code::NotOwner => "NotOwner",
            Code::ProtocolError => "ProtocolError",
        }
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An error with its code and a message for a person.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Status {
    pub code: Code,
    pub message: String,
}

impl Status {
    pub fn new(code: Code, message: impl Into<String>) -> Status {
        Status { code, message: message.into() }
    }
    pub fn invalid_argument(message: impl Into<String>) -> Status {
        Status::new(Code::InvalidArgument, message)
    }
    pub fn not_found(message: impl Into<String>) -> Status {
        Status::new(Code::NotFound, message)
    }
    pub fn already_exists(message: impl Into<String>) -> Status {
        Status::new(Code::AlreadyExists, message)
    }
    pub fn unavailable(message: impl Into<String>) -> Status {
        Status::new(Code::Unavailable, message)
    }
    pub fn internal(message: impl Into<String>) -> Status {
        Status::new(Code::Internal, message)
    }
    pub fn resource_exhausted(message: impl Into<String>) -> Status {
        Status::new(Code::ResourceExhausted, message)
    }
    pub fn failed_precondition(message: impl Into<String>) -> Status {
        Status::new(Code::FailedPrecondition, message)
    }
}

/// A log's failure as a caller sees it: fenced storage and I/O errors are worth a retry
/// elsewhere or later, a full disk or queue is exhausted, damage is lost data. A replicated
/// write whose leader was deposed is `NotOwner` (go elsewhere: the native client and the gRPC
/// gateway look the topic's leader up again, and gRPC's clients see the `Unavailable` they
/// retry if the gateway cannot), one whose quorum was slow `Unavailable` (retry here).
impl From<crate::log::LogError> for Status {
    fn from(error: crate::log::LogError) -> Status {
        use crate::log::LogError;
        match error {
            LogError::Deposed { .. } => Status::new(Code::NotOwner, error.to_string()),
            LogError::CommitTimeout { .. } => Status::unavailable(error.to_string()),
            LogError::Fenced(why) => {
                Status::unavailable(format!("the topic's storage failed and is fenced: {why}"))
            }
            LogError::NoSpace(why) => {
                Status::resource_exhausted(format!("out of disk space or open files: {why}"))
            }
            LogError::Overloaded => {
                Status::resource_exhausted("too many publishes are waiting for the disk; retry with backoff")
            }
            LogError::DataLoss(why) => Status::new(Code::DataLoss, why),
            LogError::Corrupt(why) => Status::new(Code::DataLoss, why),
            LogError::Io(why) => Status::unavailable(why),
            LogError::Refused(why) => Status::failed_precondition(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Epoch;
    use crate::log::LogError;
    use crate::protocol::grpc::status::grpc_code;
    use ringpost_wire::ErrorCode;
    use std::time::Duration;

    /// A deposed leader's write says "go elsewhere": `NotOwner` natively, so the client asks
    /// the router for the new leader, and gRPC's `Unavailable`, which Google's publishers
    /// retry (the gateway, seeing `NotOwner`, forgets its route first).
    #[test]
    fn a_deposed_leaders_write_is_not_owner_natively_and_unavailable_over_grpc() {
        for deposed in [LogError::Deposed { led: Some(Epoch::new(7)) }, LogError::Deposed { led: None }] {
            let status = Status::from(deposed);
            assert_eq!(status.code, Code::NotOwner, "{status}");
            assert_eq!(ErrorCode::from(status.code), ErrorCode::NotOwner);
            assert_eq!(grpc_code(status.code), tonic::Code::Unavailable);
            assert!(status.message.contains("no longer leads") || status.message.contains("stopped leading"));
            assert!(status.message.contains("new leader"), "{status}");
        }
        let status = Status::from(LogError::Deposed { led: Some(Epoch::new(7)) });
        assert!(status.message.contains("epoch 7"), "{status}");
    }

    /// A write whose quorum was slow says "retry here": `Unavailable` on both protocols, and
    /// its message names the quorum and the wait rather than a change of leader.
    #[test]
    fn a_slow_quorums_write_is_unavailable_on_both_protocols() {
        let status =
            Status::from(LogError::CommitTimeout { quorum: 2, replicas: 3, waited: Duration::from_secs(10) });
        assert_eq!(status.code, Code::Unavailable, "{status}");
        assert_eq!(ErrorCode::from(status.code), ErrorCode::Unavailable);
        assert_eq!(grpc_code(status.code), tonic::Code::Unavailable);
        assert!(status.message.contains("fewer than 2 of 3 replicas"), "{status}");
        assert!(status.message.contains("within 10 s"), "{status}");
        assert!(!status.message.contains("leader serves"), "{status}");
    }
}

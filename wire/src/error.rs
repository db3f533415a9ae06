//! The error codes carried on the wire. Numbers 0 to 16 are gRPC's, so that users of Pub/Sub
//! read them as they always have; Ringpost's own codes start at 100. A number is never reused
//! for another meaning, even after the code is retired.

/// A stable, numbered error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ErrorCode {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
    /// The shard that received the request does not own the topic or subscription; the client
    /// should ask the router again.
    NotOwner = 100,
    /// The frame could not be parsed; the connection is closed after this reply.
    ProtocolError = 101,
}

impl ErrorCode {
    /// Every code, in number order. The tests check that this table is complete and unique.
    pub const ALL: [ErrorCode; 19] = [
        ErrorCode::Ok,
        ErrorCode::Cancelled,
        ErrorCode::Unknown,
        ErrorCode::InvalidArgument,
        ErrorCode::DeadlineExceeded,
        ErrorCode::NotFound,
        ErrorCode::AlreadyExists,
        ErrorCode::PermissionDenied,
        ErrorCode::ResourceExhausted,
        ErrorCode::FailedPrecondition,
        ErrorCode::Aborted,
        ErrorCode::OutOfRange,
        ErrorCode::Unimplemented,
        ErrorCode::Internal,
        ErrorCode::Unavailable,
        ErrorCode::DataLoss,
        ErrorCode::Unauthenticated,
        ErrorCode::NotOwner,
        ErrorCode::ProtocolError,
    ];

    pub fn from_u32(value: u32) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|code| *code as u32 == value)
    }

    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::Ok => "Ok",
            ErrorCode::Cancelled => "Cancelled",
            ErrorCode::Unknown => "Unknown",
            ErrorCode::InvalidArgument => "InvalidArgument",
            ErrorCode::DeadlineExceeded => "DeadlineExceeded",
            ErrorCode::NotFound => "NotFound",
            ErrorCode::AlreadyExists => "AlreadyExists",
            ErrorCode::PermissionDenied => "PermissionDenied",
            ErrorCode::ResourceExhausted => "ResourceExhausted",
            ErrorCode::FailedPrecondition => "FailedPrecondition",
            ErrorCode::Aborted => "Aborted",
            ErrorCode::OutOfRange => "OutOfRange",
            ErrorCode::Unimplemented => "Unimplemented",
            ErrorCode::Internal => "Internal",
            ErrorCode::Unavailable => "Unavailable",
            ErrorCode::DataLoss => "DataLoss",
            ErrorCode::Unauthenticated => "Unauthenticated",
            ErrorCode::NotOwner => "NotOwner",
            ErrorCode::ProtocolError => "ProtocolError",
        }
    }

    /// Whether a client may retry the same request: Pub/Sub's publish retry set.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::Unavailable
                | ErrorCode::ResourceExhausted
                | ErrorCode::Aborted
                | ErrorCode::DeadlineExceeded
                | ErrorCode::Internal
                | ErrorCode::Unknown
        )
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An error with its code and a human-readable message, as carried in an error frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Status {
    pub code: ErrorCode,
    pub message: String,
}

/// How a `ResourceExhausted` refusal's message names the delay its sender should wait before
/// retrying: it ends with `retry after <milliseconds> ms`. In the message, so that a client
/// that knows nothing of it still reads the code it always read, and retries with its own
/// backoff.
pub const RETRY_AFTER_PREFIX: &str = "retry after ";
pub const RETRY_AFTER_SUFFIX: &str = " ms";

impl Status {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Status {
        Status { code, message: message.into() }
    }

    /// The delay a `ResourceExhausted` refusal asks its sender to wait before retrying
    /// (`RETRY_AFTER_PREFIX`); `None` if it names none.
    pub fn retry_delay(&self) -> Option<std::time::Duration> {
        if self.code != ErrorCode::ResourceExhausted {
            return None;
        }
        let (_, after) = self.message.rsplit_once(RETRY_AFTER_PREFIX)?;
        let milliseconds = after.strip_suffix(RETRY_AFTER_SUFFIX)?;
        if milliseconds.is_empty() || !milliseconds.bytes().all(|byte| byte.is_ascii_digit()) {
            return None;
        }
        milliseconds.parse().ok().map(std::time::Duration::from_millis)
    }
    pub fn invalid_argument(message: impl Into<String>) -> Status {
        Status::new(ErrorCode::InvalidArgument, message)
    }
    pub fn not_found(message: impl Into<String>) -> Status {
        Status::new(ErrorCode::NotFound, message)
    }
    pub fn already_exists(message: impl Into<String>) -> Status {
        Status::new(ErrorCode::AlreadyExists, message)
    }
    pub fn unavailable(message: impl Into<String>) -> Status {
        Status::new(ErrorCode::Unavailable, message)
    }
    pub fn internal(message: impl Into<String>) -> Status {
        Status::new(ErrorCode::Internal, message)
    }
    pub fn resource_exhausted(message: impl Into<String>) -> Status {
        Status::new(ErrorCode::ResourceExhausted, message)
    }
    pub fn failed_precondition(message: impl Into<String>) -> Status {
        Status::new(ErrorCode::FailedPrecondition, message)
    }
}

#[cfg(test)]
mod retry_delay_tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_resource_exhausted_refusal_names_its_retry_delay_at_its_end() {
        let refusal = |message: &str| Status::new(ErrorCode::ResourceExhausted, message);
        assert_eq!(
            refusal("topic 'a' is publishing over its rate (--x); retry after 250 ms").retry_delay(),
            Some(Duration::from_millis(250))
        );
        assert_eq!(refusal("retry after 250 ms, then").retry_delay(), None);
        assert_eq!(refusal("retry after  ms").retry_delay(), None);
        assert_eq!(refusal("retry after -5 ms").retry_delay(), None);
        assert_eq!(
            refusal("too many publishes are waiting for the disk; retry with backoff").retry_delay(),
            None
        );
        let unavailable = Status::new(ErrorCode::Unavailable, "retry after 5 ms");
        assert_eq!(unavailable.retry_delay(), None);
    }
}

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

// The data plane's errors (`api::data::DataError`, `subscription::SubscriptionError`,
// `topic::TopicError`): each
// variant is a code here, with its `Display` as the message; the protocols map the code onto
// their own numbers at their edges.

/// A data-plane error as a caller sees it: a refusal of the request is `InvalidArgument` (or
/// `ProtocolError` when it could not be read); not served here is `NotOwner` (go elsewhere);
/// quarantined is `DataLoss`; the subscription's and the log's own errors map as below and
/// above.
impl From<crate::api::data::DataError> for Status {
    fn from(error: crate::api::data::DataError) -> Status {
        use crate::api::data::DataError;
        match error {
            DataError::InvalidArgument(_) => Status::invalid_argument(error.to_string()),
            DataError::Malformed(_) => Status::new(Code::ProtocolError, error.to_string()),
            DataError::NotOwner { .. } => Status::new(Code::NotOwner, error.to_string()),
            DataError::Quarantined { .. } => Status::new(Code::DataLoss, error.to_string()),
            DataError::Subscription(error) => Status::from(error),
            DataError::Log(error) => Status::from(error),
            DataError::Throttled { .. } => Status::resource_exhausted(error.to_string()),
        }
    }
}

/// A subscription that moved to its topic's new leader is `Unavailable` (clients retry it, and
/// the retry looks the subscription up again), a detached one `FailedPrecondition`, a deleted
/// one `NotFound`; a stopping shard `Unavailable`.
impl From<crate::subscription::SubscriptionError> for Status {
    fn from(error: crate::subscription::SubscriptionError) -> Status {
        use crate::subscription::SubscriptionError;
        match error {
            SubscriptionError::Moved { .. } => Status::unavailable(error.to_string()),
            SubscriptionError::Detached { .. } => Status::failed_precondition(error.to_string()),
            SubscriptionError::Deleted { .. } => Status::not_found(error.to_string()),
            SubscriptionError::Stopping => Status::unavailable(error.to_string()),
            SubscriptionError::Log(error) => Status::from(error),
        }
    }
}

/// A topic that could not be opened for want of space is `ResourceExhausted` (retry once space
/// is freed); one whose files or journal are damaged `DataLoss`; the journal's read errors map
/// as the log's.
impl From<crate::topic::TopicError> for Status {
    fn from(error: crate::topic::TopicError) -> Status {
        use crate::topic::TopicError;
        match error {
            TopicError::NoRoom { .. } | TopicError::NoSpace { .. } => {
                Status::resource_exhausted(error.to_string())
            }
            TopicError::Damaged { .. } | TopicError::JournalEntry { .. } => {
                Status::new(Code::DataLoss, error.to_string())
            }
            TopicError::Log(error) => Status::from(error),
        }
    }
}

// The control plane's errors (`catalog::CatalogError`, `router::ControlError`): one mapping
// each onto a code, here, and their messages as their `Display` says them.

/// A catalog's refusal as a caller sees it: a node that stopped leading, a leader cut off from
/// its majority and a refusal by openraft are `Unavailable` (try again, at the leader); a
/// change not decided in time `DeadlineExceeded` (it may still be decided: look first); a name
/// taken meanwhile `AlreadyExists`; the catalog's own storage as the log's errors map.
impl From<crate::catalog::CatalogError> for Status {
    fn from(error: crate::catalog::CatalogError) -> Status {
        use crate::catalog::CatalogError;
        let code = match &error {
            CatalogError::Storage(failed) => return Status::from(failed.clone()),
            CatalogError::NotLeader { .. }
            | CatalogError::QuorumNotHeard { .. }
            | CatalogError::NotCaughtUp { .. }
            | CatalogError::NotCommitted(_)
            | CatalogError::MembershipRefused { .. }
            | CatalogError::TransferRefused(_) => Code::Unavailable,
            CatalogError::Undecided { .. } | CatalogError::MembershipUndecided { .. } => {
                Code::DeadlineExceeded
            }
            CatalogError::NameTaken(_) => Code::AlreadyExists,
        };
        Status::new(code, error.to_string())
    }
}

/// A router's refusal as a caller sees it: each variant's code is what its caller acts on. Not
/// the leader, out of reach and not applied are `Unavailable` (try again, or at the leader); a
/// name another request is creating `Aborted`; a catalog's limit `ResourceExhausted`; what
/// came as a `Status` keeps its code, and what failed within a step keeps its own.
impl From<crate::router::ControlError> for Status {
    fn from(error: crate::router::ControlError) -> Status {
        use crate::router::ControlError;
        let code = match &error {
            ControlError::NotFound(_) => Code::NotFound,
            ControlError::AlreadyExists(_) => Code::AlreadyExists,
            ControlError::InvalidArgument(_) => Code::InvalidArgument,
            ControlError::FailedPrecondition(_) => Code::FailedPrecondition,
            ControlError::BeingCreated { .. } | ControlError::ChangedMeanwhile(_) => Code::Aborted,
            ControlError::LimitReached(_) => Code::ResourceExhausted,
            ControlError::NotLeader { .. }
            | ControlError::Unavailable(_)
            | ControlError::NotApplied { .. } => Code::Unavailable,
            ControlError::NoAnswer(_) => Code::DeadlineExceeded,
            ControlError::Internal(_) => Code::Internal,
            ControlError::Within { error: within, .. } => Status::from((**within).clone()).code,
            ControlError::Catalog(catalog) => return Status::from(catalog.clone()),
            ControlError::Answered(status) => return status.clone(),
        };
        Status::new(code, error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Epoch, NodeId};
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

    /// Every catalog error maps onto the code its caller acts on, on both protocols, with the
    /// message it had as a `Status` written where it happened.
    #[test]
    fn every_catalog_error_has_its_code_and_message() {
        use crate::catalog::CatalogError;
        let seconds = Duration::from_secs(10);
        let cases = [
            (
                CatalogError::NotLeader { leader: Some(NodeId::new(2)) },
                Code::Unavailable,
                "this node no longer leads the catalog; try again",
            ),
            (
                CatalogError::QuorumNotHeard {
                    node: NodeId::new(1),
                    voters: 3,
                    since: Some(Duration::from_millis(2500)),
                },
                Code::Unavailable,
                "node 1 leads the catalog but has not heard from a majority of its 3 voters for 2.5 s: \
                 too few are reachable to decide anything",
            ),
            (
                CatalogError::QuorumNotHeard { node: NodeId::new(1), voters: 3, since: None },
                Code::Unavailable,
                "node 1 leads the catalog but has not heard from a majority of its 3 voters: \
                 too few are reachable to decide anything",
            ),
            (
                CatalogError::Undecided { waited: seconds },
                Code::DeadlineExceeded,
                "the catalog did not decide the change within 10 s (too few of its voters answer); \
                 it may still be decided once they do",
            ),
            (
                CatalogError::MembershipUndecided { node_id: NodeId::new(4), waited: seconds },
                Code::DeadlineExceeded,
                "the catalog did not decide the change of its members (node 4) within 10 s; \
                 it may still be decided: look with `ringpost cluster status`",
            ),
            (
                CatalogError::NotCaughtUp { node_id: NodeId::new(4), waited: Duration::from_secs(60) },
                Code::Unavailable,
                "node 4 is a learner of the catalog now, but did not catch up within 60 s: \
                 is it running, started with --join? Run the command again once it is",
            ),
            (
                CatalogError::NotCommitted("stopped".into()),
                Code::Unavailable,
                "the catalog did not commit the change: stopped",
            ),
            (
                CatalogError::MembershipRefused { node_id: NodeId::new(4), why: "stopped".into() },
                Code::Unavailable,
                "changing the catalog's members (node 4): stopped",
            ),
            (
                CatalogError::TransferRefused("stopped".into()),
                Code::Unavailable,
                "handing the catalog's leadership over: stopped",
            ),
            (
                CatalogError::NameTaken("topic 'a' exists (id 7)".into()),
                Code::AlreadyExists,
                "topic 'a' exists (id 7)",
            ),
            (
                CatalogError::Storage(LogError::NoSpace("disk full".into())),
                Code::ResourceExhausted,
                "out of disk space or open files: disk full",
            ),
        ];
        for (error, code, message) in cases {
            let undecided = error.is_undecided();
            let status = Status::from(error.clone());
            assert_eq!((status.code, status.message.as_str()), (code, message), "{error:?}");
            assert_eq!(error.to_string(), message);
            assert_eq!(undecided, code == Code::DeadlineExceeded, "{error:?}");
            let native = ErrorCode::from(code);
            let grpc = grpc_code(code);
            let (expected_native, expected_grpc) = match code {
                Code::Unavailable => (ErrorCode::Unavailable, tonic::Code::Unavailable),
                Code::DeadlineExceeded => (ErrorCode::DeadlineExceeded, tonic::Code::DeadlineExceeded),
                Code::AlreadyExists => (ErrorCode::AlreadyExists, tonic::Code::AlreadyExists),
                Code::ResourceExhausted => (ErrorCode::ResourceExhausted, tonic::Code::ResourceExhausted),
                other => unreachable!("{other}"),
            };
            assert_eq!((native, grpc), (expected_native, expected_grpc), "{error:?}");
        }
    }

    /// Every router error maps onto the code its caller acts on, natively and over gRPC, and
    /// says the message it said as a `Status` written where it happened. The expected codes are
    /// an exhaustive match, so a new variant cannot go untested.
    #[test]
    fn every_router_error_has_its_code_on_both_protocols_and_its_message() {
        use crate::catalog::CatalogError;
        use crate::router::ControlError;
        fn expected(error: &ControlError) -> (ErrorCode, tonic::Code) {
            match error {
                ControlError::NotFound(_) => (ErrorCode::NotFound, tonic::Code::NotFound),
                ControlError::AlreadyExists(_) => (ErrorCode::AlreadyExists, tonic::Code::AlreadyExists),
                ControlError::InvalidArgument(_) => {
                    (ErrorCode::InvalidArgument, tonic::Code::InvalidArgument)
                }
                ControlError::FailedPrecondition(_) => {
                    (ErrorCode::FailedPrecondition, tonic::Code::FailedPrecondition)
                }
                ControlError::BeingCreated { .. } | ControlError::ChangedMeanwhile(_) => {
                    (ErrorCode::Aborted, tonic::Code::Aborted)
                }
                ControlError::LimitReached(_) => {
                    (ErrorCode::ResourceExhausted, tonic::Code::ResourceExhausted)
                }
                ControlError::NotLeader { .. }
                | ControlError::Unavailable(_)
                | ControlError::NotApplied { .. } => (ErrorCode::Unavailable, tonic::Code::Unavailable),
                ControlError::NoAnswer(_) => (ErrorCode::DeadlineExceeded, tonic::Code::DeadlineExceeded),
                ControlError::Internal(_) => (ErrorCode::Internal, tonic::Code::Internal),
                ControlError::Within { error, .. } => expected(error),
                ControlError::Catalog(CatalogError::Undecided { .. }) => {
                    (ErrorCode::DeadlineExceeded, tonic::Code::DeadlineExceeded)
                }
                ControlError::Catalog(_) => (ErrorCode::Unavailable, tonic::Code::Unavailable),
                ControlError::Answered(status) => (ErrorCode::from(status.code), grpc_code(status.code)),
            }
        }
        let cases = [
            (ControlError::not_found("topic 'orders'"), "topic 'orders'"),
            (ControlError::already_exists("topic 'orders'"), "topic 'orders'"),
            (ControlError::invalid_argument("invalid filter: x"), "invalid filter: x"),
            (
                ControlError::failed_precondition("subscription 'audit' is detached"),
                "subscription 'audit' is detached",
            ),
            (
                ControlError::BeingCreated { name: "topic/orders".into() },
                "'topic/orders' is being created by another request",
            ),
            (
                ControlError::ChangedMeanwhile(
                    "the topic's leader or replicas changed meanwhile; try again".into(),
                ),
                "the topic's leader or replicas changed meanwhile; try again",
            ),
            (ControlError::LimitReached("the catalog holds 10 topics".into()), "the catalog holds 10 topics"),
            (
                ControlError::NotLeader {
                    this_node: NodeId::new(2),
                    leader: Some((NodeId::new(1), "10.0.0.1:7450".into())),
                },
                "node 2 does not lead the catalog; node 1 does (its router is at 10.0.0.1:7450)",
            ),
            (
                ControlError::NotLeader { this_node: NodeId::new(2), leader: None },
                "the catalog has no leader (too few of its voters are reachable)",
            ),
            (ControlError::unavailable("this node has no peers"), "this node has no peers"),
            (ControlError::no_answer("no answer in time"), "no answer in time"),
            (
                ControlError::NotApplied {
                    kind: "topic",
                    name: "orders".into(),
                    why: Status::unavailable("the forwarder shard is gone"),
                },
                "the update of topic 'orders' is durable, but its forwarder did not apply it \
                 (Unavailable: the forwarder shard is gone); it applies at the next start, or when \
                 the update is sent again",
            ),
            (
                ControlError::not_found("the topic was deleted").within("moving topic 'orders' off node 3"),
                "moving topic 'orders' off node 3: the topic was deleted",
            ),
            (
                ControlError::ChangedMeanwhile("try again".into()).within("moving topic 'orders' off node 3"),
                "moving topic 'orders' off node 3: try again",
            ),
            (ControlError::internal("the router is closing: closed"), "the router is closing: closed"),
            (
                ControlError::Catalog(CatalogError::NotLeader { leader: None }),
                "this node no longer leads the catalog; try again",
            ),
            (
                ControlError::Catalog(CatalogError::Undecided { waited: Duration::from_secs(10) }),
                "the catalog did not decide the change within 10 s (too few of its voters answer); \
                 it may still be decided once they do",
            ),
            (ControlError::from(Status::new(Code::NotOwner, "not here")), "not here"),
            (ControlError::from(Status::new(Code::PermissionDenied, "may not")), "may not"),
        ];
        for (error, message) in cases {
            let status = Status::from(error.clone());
            assert_eq!(status.message, message, "{error:?}");
            assert_eq!(error.to_string(), message, "{error:?}");
            assert_eq!(error.code(), status.code, "{error:?}");
            assert_eq!((ErrorCode::from(status.code), grpc_code(status.code)), expected(&error), "{error:?}");
        }
        // Only a change the catalog may still decide is undecided, within a step too.
        let undecided = ControlError::Catalog(CatalogError::Undecided { waited: Duration::from_secs(10) });
        assert!(undecided.is_undecided() && undecided.clone().within("a move").is_undecided());
        assert!(!ControlError::no_answer("no answer in time").is_undecided());
        // A forwarder's refusal passes with its own code: a node that no longer owns a topic
        // stays NotOwner natively.
        assert_eq!(Status::from(ControlError::from(Status::new(Code::NotOwner, "x"))).code, Code::NotOwner);
    }
}

/// The data plane's errors, each variant to its domain code, native code and gRPC code, with
/// the message its callers saw before the errors were typed.
#[cfg(test)]
mod data_plane_tests {
    use super::*;
    use crate::api::data::{DataError, ResourceKind};
    use crate::ids::Epoch;
    use crate::log::LogError;
    use crate::protocol::grpc::status::grpc_code;
    use crate::subscription::SubscriptionError;
    use ringpost_wire::ErrorCode;
    use std::rc::Rc;

    fn assert_maps(status: Status, code: Code, native: ErrorCode, grpc: tonic::Code, message: &str) {
        assert_eq!(status.code, code, "{status}");
        assert_eq!(ErrorCode::from(status.code), native, "{status}");
        assert_eq!(grpc_code(status.code), grpc, "{status}");
        assert_eq!(status.message, message);
    }

    #[test]
    fn every_subscription_error_has_its_code_on_both_protocols() {
        use tonic::Code as Grpc;
        let name: Rc<str> = Rc::from("audit");
        let cases = [
            (
                SubscriptionError::Moved { subscription: name.clone() },
                Code::Unavailable,
                ErrorCode::Unavailable,
                Grpc::Unavailable,
                "subscription 'audit' is now served by its topic's new leader; look it up again",
            ),
            (
                SubscriptionError::Detached { subscription: name.clone() },
                Code::FailedPrecondition,
                ErrorCode::FailedPrecondition,
                Grpc::FailedPrecondition,
                "subscription 'audit' is detached",
            ),
            (
                SubscriptionError::Deleted { subscription: name.clone() },
                Code::NotFound,
                ErrorCode::NotFound,
                Grpc::NotFound,
                "subscription 'audit' was deleted",
            ),
            (
                SubscriptionError::Stopping,
                Code::Unavailable,
                ErrorCode::Unavailable,
                Grpc::Unavailable,
                "ringpostd is stopping; open the stream again (its messages are delivered again)",
            ),
        ];
        for (error, code, native, grpc, message) in cases {
            assert_eq!(error.to_string(), message);
            assert_maps(Status::from(error), code, native, grpc, message);
        }
        // The log's errors keep the log's mapping (`From<LogError>`), whatever layer carries them.
        let overloaded = SubscriptionError::from(LogError::Overloaded);
        assert_eq!(Status::from(overloaded), Status::from(LogError::Overloaded));
        let deposed = SubscriptionError::from(LogError::Deposed { led: Some(Epoch::new(3)) });
        assert_eq!(Status::from(deposed).code, Code::NotOwner);
    }

    #[test]
    fn every_data_error_has_its_code_on_both_protocols() {
        use tonic::Code as Grpc;
        let cases = [
            (
                DataError::InvalidArgument("publish request has no messages".into()),
                Code::InvalidArgument,
                ErrorCode::InvalidArgument,
                Grpc::InvalidArgument,
                "publish request has no messages",
            ),
            (
                DataError::Malformed("malformed frame body: short".into()),
                Code::ProtocolError,
                ErrorCode::ProtocolError,
                Grpc::InvalidArgument,
                "malformed frame body: short",
            ),
            (
                DataError::NotOwner { kind: ResourceKind::Topic, name: "orders".into() },
                Code::NotOwner,
                ErrorCode::NotOwner,
                Grpc::Unavailable,
                "this forwarder does not serve topic 'orders'; ask the router again",
            ),
            (
                DataError::NotOwner { kind: ResourceKind::Subscription, name: "audit".into() },
                Code::NotOwner,
                ErrorCode::NotOwner,
                Grpc::Unavailable,
                "this forwarder does not serve subscription 'audit'; ask the router again",
            ),
            (
                DataError::Quarantined {
                    kind: ResourceKind::Subscription,
                    name: "audit".into(),
                    why: Rc::from("segment 0 is damaged"),
                },
                Code::DataLoss,
                ErrorCode::DataLoss,
                Grpc::DataLoss,
                "subscription 'audit' is quarantined: segment 0 is damaged. It is not served until repaired or \
                 deleted; nothing was deleted",
            ),
            (
                DataError::Subscription(SubscriptionError::Deleted { subscription: Rc::from("audit") }),
                Code::NotFound,
                ErrorCode::NotFound,
                Grpc::NotFound,
                "subscription 'audit' was deleted",
            ),
            (
                DataError::Log(LogError::NoSpace("disk full".into())),
                Code::ResourceExhausted,
                ErrorCode::ResourceExhausted,
                Grpc::ResourceExhausted,
                "out of disk space or open files: disk full",
            ),
        ];
        for (error, code, native, grpc, message) in cases {
            if !matches!(error, DataError::Log(_)) {
                assert_eq!(error.to_string(), message);
            }
            assert_maps(Status::from(error), code, native, grpc, message);
        }
    }

    /// `is_not_owner`, which the forwarders' carrying and the dead-letter publisher decide on,
    /// is exactly the errors that reach a client as `NotOwner`.
    #[test]
    fn a_data_error_is_not_owner_exactly_when_its_code_is() {
        let name: Rc<str> = Rc::from("audit");
        let errors = [
            DataError::InvalidArgument("no".into()),
            DataError::Malformed("no".into()),
            DataError::NotOwner { kind: ResourceKind::Topic, name: "orders".into() },
            DataError::Quarantined { kind: ResourceKind::Topic, name: "orders".into(), why: name.clone() },
            DataError::Subscription(SubscriptionError::Moved { subscription: name.clone() }),
            DataError::Subscription(SubscriptionError::Detached { subscription: name.clone() }),
            DataError::Subscription(SubscriptionError::Deleted { subscription: name.clone() }),
            DataError::Subscription(SubscriptionError::Stopping),
            DataError::Subscription(SubscriptionError::Log(LogError::Deposed { led: None })),
            DataError::Subscription(SubscriptionError::Log(LogError::Overloaded)),
            DataError::Log(LogError::Deposed { led: Some(Epoch::new(7)) }),
            DataError::Log(LogError::CommitTimeout {
                quorum: 2,
                replicas: 3,
                waited: std::time::Duration::from_secs(10),
            }),
            DataError::Log(LogError::Fenced("write failed".into())),
            DataError::Log(LogError::Refused("old epoch".into())),
        ];
        for error in errors {
            let not_owner = error.is_not_owner();
            assert_eq!(not_owner, Status::from(error.clone()).code == Code::NotOwner, "{error:?}");
        }
    }
}

/// A topic's errors, each to its codes, with the messages they had before they were typed.
#[cfg(test)]
mod topic_tests {
    use super::*;
    use crate::log::LogError;
    use crate::protocol::grpc::status::grpc_code;
    use crate::topic::TopicError;
    use ringpost_wire::ErrorCode;

    #[test]
    fn every_topic_error_has_its_code_on_both_protocols() {
        use tonic::Code as Grpc;
        let cases = [
            (
                TopicError::NoRoom {
                    topic: "orders".into(),
                    directory: "/var/lib/ringpost/d0".into(),
                    available_bytes: 4096,
                    needed_bytes: 8192,
                },
                Code::ResourceExhausted,
                ErrorCode::ResourceExhausted,
                Grpc::ResourceExhausted,
                "no disk space for topic 'orders': data directory /var/lib/ringpost/d0 has 4096 bytes available, \
                 and a topic needs 8192 (its first segment and its journal's reserve); acknowledge messages or \
                 delete topics to free space",
            ),
            (
                TopicError::NoSpace { what: "topic 'orders' journal".into(), why: "quota".into() },
                Code::ResourceExhausted,
                ErrorCode::ResourceExhausted,
                Grpc::ResourceExhausted,
                "topic 'orders' journal: out of disk space or open files: quota",
            ),
            (
                TopicError::Damaged { what: "topic 'orders'".into(), error: LogError::Corrupt("bad manifest".into()) },
                Code::DataLoss,
                ErrorCode::DataLoss,
                Grpc::DataLoss,
                "topic 'orders': log is corrupt: bad manifest",
            ),
            (
                TopicError::JournalEntry { topic: "orders".into(), offset: crate::ids::Offset::new(12), why: "unknown kind 9".into() },
                Code::DataLoss,
                ErrorCode::DataLoss,
                Grpc::DataLoss,
                "topic 'orders' journal entry 12: unknown kind 9",
            ),
        ];
        for (error, code, native, grpc, message) in cases {
            assert_eq!(error.to_string(), message);
            assert!(error.is_damage() == (code == Code::DataLoss), "{error}");
            let status = Status::from(error);
            assert_eq!(status.code, code, "{status}");
            assert_eq!(ErrorCode::from(status.code), native, "{status}");
            assert_eq!(grpc_code(status.code), grpc, "{status}");
            assert_eq!(status.message, message);
        }
        // The journal's read errors keep the log's mapping; damage among them is what a start
        // that quarantines damaged topics quarantines.
        for error in [LogError::DataLoss("gone".into()), LogError::Io("EIO".into()), LogError::Overloaded] {
            let status = Status::from(error.clone());
            let topic = TopicError::from(error);
            assert_eq!(topic.is_damage(), status.code == Code::DataLoss, "{topic}");
            assert_eq!(Status::from(topic), status);
        }
    }
}

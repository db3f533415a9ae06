//! The model's limits, by name, each with its reason. Values follow Google Cloud Pub/Sub where
//! it has one (its documented quotas and limits), so that users meet the numbers they know.
//!
//! Each protocol that carries them re-exports them, so that there is one table to read and
//! nothing to keep equal.

/// Largest `data` plus attributes of one message (Pub/Sub: 10 MB).
pub const MESSAGE_BYTES_MAX: usize = 10_000_000;
/// Largest sum of message sizes in one publish (Pub/Sub: 10 MB): one publish is one commit,
/// and this bounds the memory a publish waiting for the disk holds.
pub const PUBLISH_REQUEST_BYTES_MAX: usize = 10_000_000;
/// Messages in one publish (Pub/Sub: 1000); it also bounds a commit's index entries.
pub const PUBLISH_BATCH_MESSAGES_MAX: usize = 1000;
/// Attributes on one message (Pub/Sub: 100).
pub const ATTRIBUTES_COUNT_MAX: usize = 100;
/// Bytes in one attribute key (Pub/Sub: 256).
pub const ATTRIBUTE_KEY_BYTES_MAX: usize = 256;
/// Bytes in one attribute value (Pub/Sub: 1024).
pub const ATTRIBUTE_VALUE_BYTES_MAX: usize = 1024;
/// Bytes in an ordering key (Pub/Sub: 1 KB).
pub const ORDERING_KEY_BYTES_MAX: usize = 1024;
/// Topic, subscription and snapshot names (Pub/Sub: 3 to 255 characters); names are keys of
/// the catalog and parts of data directories' paths.
pub const NAME_BYTES_MIN: usize = 3;
pub const NAME_BYTES_MAX: usize = 255;
/// Subscription filter expression (Pub/Sub: 256 bytes), which bounds the work of parsing one.
pub const FILTER_BYTES_MAX: usize = 256;

/// Messages one pull returns (Pub/Sub caps max_messages at 1000): it bounds the leases and the
/// read-ahead one request takes.
pub const PULL_MESSAGES_MAX: u32 = 1000;
/// Longest a pull may wait for messages to arrive, so that a waiting pull cannot hold its
/// shard's resources without end.
pub const PULL_WAIT_MS_MAX: u32 = 60_000;
/// Ack ids in one acknowledgement or deadline change (Pub/Sub: 2500 per request in practice,
/// bounded by its 512 KiB request limit): one request is one durable commit.
pub const ACK_IDS_PER_REQUEST_MAX: usize = 2500;
/// Bytes of one ack id string: more than any ack id Ringpost hands out (the marker `v1.` and
/// four hex numbers of at most 16, 8, 16 and 8 digits with three dots: 54; before the marker,
/// three of 16, 16 and 8 with two dots: 42), so a longer one is not Ringpost's and is refused
/// before it is parsed.
pub const ACK_ID_BYTES_MAX: usize = 64;
/// Entries in one list page, so that a listing holds the router shard for a bounded time.
pub const LIST_PAGE_SIZE_MAX: u32 = 1000;
pub const LIST_PAGE_SIZE_DEFAULT: u32 = 100;

/// Subscription ack deadline (Pub/Sub: default 10 s, 10 to 600 s).
pub const ACK_DEADLINE_SECONDS_DEFAULT: u32 = 10;
pub const ACK_DEADLINE_SECONDS_MIN: u32 = 10;
pub const ACK_DEADLINE_SECONDS_MAX: u32 = 600;
/// A deadline change accepts 0 (a nack) to 600 s (Pub/Sub's range).
pub const MODIFY_ACK_DEADLINE_SECONDS_MAX: u32 = 600;

/// Message retention (Pub/Sub: default 7 days, 10 minutes to 31 days).
pub const RETENTION_SECONDS_DEFAULT: u64 = 7 * 24 * 3600;
pub const RETENTION_SECONDS_MIN: u64 = 10 * 60;
pub const RETENTION_SECONDS_MAX: u64 = 31 * 24 * 3600;

/// Subscription expiration after inactivity (Pub/Sub: default 31 days, minimum 1 day).
pub const EXPIRATION_TTL_SECONDS_DEFAULT: u64 = 31 * 24 * 3600;
pub const EXPIRATION_TTL_SECONDS_MIN: u64 = 24 * 3600;
/// An expiration policy without a ttl (Pub/Sub: the subscription never expires). The largest
/// value, so that every comparison with an idle time says "not yet" without a special case;
/// whoever turns it into milliseconds must saturate.
pub const EXPIRATION_TTL_SECONDS_NEVER: u64 = u64::MAX;
/// Labels on one topic, subscription or snapshot (Pub/Sub: 64).
pub const LABELS_COUNT_MAX: usize = 64;
/// Bytes of a label key (Pub/Sub: 1 to 63, lowercase letters, digits, `_` and `-`, starting
/// with a lowercase letter).
pub const LABEL_KEY_BYTES_MAX: usize = 63;
/// Bytes of a label value (Pub/Sub: at most 63, of the key's characters, may be empty).
pub const LABEL_VALUE_BYTES_MAX: usize = 63;
/// Dead-letter policy (Pub/Sub: 5 to 100 delivery attempts, 0 means 5).
pub const MAX_DELIVERY_ATTEMPTS_DEFAULT: u32 = 5;
pub const MAX_DELIVERY_ATTEMPTS_MIN: u32 = 5;
pub const MAX_DELIVERY_ATTEMPTS_MAX: u32 = 100;
/// Retry policy (Pub/Sub: defaults 10 s and 600 s, each 0 to 600 s).
pub const BACKOFF_SECONDS_MINIMUM_DEFAULT: u32 = 10;
pub const BACKOFF_SECONDS_MAXIMUM_DEFAULT: u32 = 600;
pub const BACKOFF_SECONDS_MAX: u32 = 600;
/// Bytes of a push subscription's endpoint URL: a URL longer than browsers and proxies carry
/// (about 2 KB) is a mistake, and the catalog keeps every subscription's in memory.
pub const PUSH_ENDPOINT_BYTES_MAX: usize = 2048;
/// A push configuration's attributes (Pub/Sub reads one, `x-goog-version`); a few more are
/// kept as given, each within a message attribute's sizes.
pub const PUSH_ATTRIBUTES_COUNT_MAX: usize = 16;
/// Bytes of a push token's service account email or audience: an email is at most 254 bytes
/// (RFC 5321), an audience is a URL or a name like one.
pub const PUSH_TOKEN_FIELD_BYTES_MAX: usize = 2048;
/// Bytes of a project id, domain-scoped ones (`example.com:project`) included: Google's ids are
/// at most 30 bytes and a DNS label 63, so this leaves room for a domain while keeping the name a
/// push request carries (`projects/P/subscriptions/S`) within a header's usual size.
pub const PROJECT_BYTES_MAX: usize = 255;
/// The project a push subscription's requests name it in when none was given
/// (`projects/ringpost/subscriptions/S`): the native protocol and the CLI have no projects, and
/// push configurations stored before the project was kept named this one.
pub const PUSH_PROJECT_DEFAULT: &str = "ringpost";

const _: () = assert!(MESSAGE_BYTES_MAX <= PUBLISH_REQUEST_BYTES_MAX);
const _: () = assert!(NAME_BYTES_MIN <= NAME_BYTES_MAX);
const _: () = assert!(LIST_PAGE_SIZE_DEFAULT <= LIST_PAGE_SIZE_MAX);
const _: () = assert!(ACK_DEADLINE_SECONDS_MIN <= ACK_DEADLINE_SECONDS_DEFAULT);
const _: () = assert!(ACK_DEADLINE_SECONDS_DEFAULT <= ACK_DEADLINE_SECONDS_MAX);
const _: () = assert!(RETENTION_SECONDS_MIN <= RETENTION_SECONDS_DEFAULT);
const _: () = assert!(RETENTION_SECONDS_DEFAULT <= RETENTION_SECONDS_MAX);
const _: () = assert!(EXPIRATION_TTL_SECONDS_MIN <= EXPIRATION_TTL_SECONDS_DEFAULT);
const _: () = assert!(EXPIRATION_TTL_SECONDS_DEFAULT < EXPIRATION_TTL_SECONDS_NEVER);
const _: () = assert!(MAX_DELIVERY_ATTEMPTS_MIN <= MAX_DELIVERY_ATTEMPTS_DEFAULT);
const _: () = assert!(MAX_DELIVERY_ATTEMPTS_DEFAULT <= MAX_DELIVERY_ATTEMPTS_MAX);
const _: () = assert!(BACKOFF_SECONDS_MINIMUM_DEFAULT <= BACKOFF_SECONDS_MAXIMUM_DEFAULT);
const _: () = assert!(BACKOFF_SECONDS_MAXIMUM_DEFAULT <= BACKOFF_SECONDS_MAX);

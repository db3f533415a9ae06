//! Every limit of the protocol, by name. Values follow Google Cloud Pub/Sub where it has one
//! (its documented quotas and limits), so that users meet the numbers they know.

/// Largest `data` plus attributes of one message, and of one publish request (Pub/Sub: 10 MB).
pub const MESSAGE_BYTES_MAX: usize = 10_000_000;
/// Largest sum of message sizes in one publish request (Pub/Sub: 10 MB).
pub const PUBLISH_REQUEST_BYTES_MAX: usize = 10_000_000;
/// Messages in one publish request (Pub/Sub: 1000).
pub const PUBLISH_BATCH_MESSAGES_MAX: usize = 1000;
/// Attributes on one message (Pub/Sub: 100).
pub const ATTRIBUTES_COUNT_MAX: usize = 100;
/// Bytes in one attribute key (Pub/Sub: 256).
pub const ATTRIBUTE_KEY_BYTES_MAX: usize = 256;
/// Bytes in one attribute value (Pub/Sub: 1024).
pub const ATTRIBUTE_VALUE_BYTES_MAX: usize = 1024;
/// Bytes in an ordering key (Pub/Sub: 1 KB).
pub const ORDERING_KEY_BYTES_MAX: usize = 1024;
/// Topic, subscription and snapshot names (Pub/Sub: 3 to 255 characters).
pub const NAME_BYTES_MIN: usize = 3;
pub const NAME_BYTES_MAX: usize = 255;
/// Subscription filter expression (Pub/Sub: 256 bytes).
pub const FILTER_BYTES_MAX: usize = 256;

/// Fixed frame header: body length, command, flags, request id.
pub const FRAME_HEADER_BYTES: usize = 16;
/// Largest frame body either side accepts. A publish request of `PUBLISH_REQUEST_BYTES_MAX`
/// plus the per-message framing of the largest batch must fit.
pub const FRAME_BODY_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Messages returned by one pull (Pub/Sub: max_messages is capped at 1000).
pub const PULL_MESSAGES_MAX: u32 = 1000;
/// Longest a pull may wait for messages to arrive.
pub const PULL_WAIT_MS_MAX: u32 = 60_000;
/// Ack ids in one acknowledge or modify-deadline request (Pub/Sub: 2500 per request in
/// practice, bounded by its 512 KiB request limit).
pub const ACK_IDS_PER_REQUEST_MAX: usize = 2500;
/// Bytes of one ack id string.
pub const ACK_ID_BYTES_MAX: usize = 64;
/// Entries in one list page.
pub const LIST_PAGE_SIZE_MAX: u32 = 1000;
pub const LIST_PAGE_SIZE_DEFAULT: u32 = 100;
/// Bytes of an error message carried on the wire.
pub const ERROR_MESSAGE_BYTES_MAX: usize = 4096;

/// Subscription ack deadline (Pub/Sub: default 10 s, 10 to 600 s).
pub const ACK_DEADLINE_SECONDS_DEFAULT: u32 = 10;
pub const ACK_DEADLINE_SECONDS_MIN: u32 = 10;
pub const ACK_DEADLINE_SECONDS_MAX: u32 = 600;
/// ModifyAckDeadline accepts 0 (a nack) to 600 s.
pub const MODIFY_ACK_DEADLINE_SECONDS_MAX: u32 = 600;

/// Message retention (Pub/Sub: default 7 days, 10 minutes to 31 days).
pub const RETENTION_SECONDS_DEFAULT: u64 = 7 * 24 * 3600;
pub const RETENTION_SECONDS_MIN: u64 = 10 * 60;
pub const RETENTION_SECONDS_MAX: u64 = 31 * 24 * 3600;

/// Subscription expiration after inactivity (Pub/Sub: default 31 days, minimum 1 day).
pub const EXPIRATION_TTL_SECONDS_DEFAULT: u64 = 31 * 24 * 3600;
pub const EXPIRATION_TTL_SECONDS_MIN: u64 = 24 * 3600;
/// Dead-letter policy (Pub/Sub: 5 to 100 delivery attempts, 0 means 5).
pub const MAX_DELIVERY_ATTEMPTS_DEFAULT: u32 = 5;
pub const MAX_DELIVERY_ATTEMPTS_MIN: u32 = 5;
pub const MAX_DELIVERY_ATTEMPTS_MAX: u32 = 100;
/// Retry policy (Pub/Sub: defaults 10 s and 600 s, each 0 to 600 s).
pub const BACKOFF_SECONDS_MINIMUM_DEFAULT: u32 = 10;
pub const BACKOFF_SECONDS_MAXIMUM_DEFAULT: u32 = 600;
pub const BACKOFF_SECONDS_MAX: u32 = 600;
/// Field names in one update mask: more than the fields there are to name, so a mask that
/// repeats some still fits, while a hostile one cannot make the router scan without end.
pub const UPDATE_MASK_PATHS_MAX: usize = 32;

/// The protocol version this crate speaks; the server refuses a Hello with another major.
pub const PROTOCOL_VERSION: u32 = 1;

const _: () = assert!(PUBLISH_REQUEST_BYTES_MAX + PUBLISH_BATCH_MESSAGES_MAX * 256 < FRAME_BODY_BYTES_MAX);
const _: () = assert!(MESSAGE_BYTES_MAX <= PUBLISH_REQUEST_BYTES_MAX);
const _: () = assert!(ACK_DEADLINE_SECONDS_MIN <= ACK_DEADLINE_SECONDS_DEFAULT);
const _: () = assert!(ACK_DEADLINE_SECONDS_DEFAULT <= ACK_DEADLINE_SECONDS_MAX);
const _: () = assert!(EXPIRATION_TTL_SECONDS_MIN <= EXPIRATION_TTL_SECONDS_DEFAULT);
const _: () = assert!(MAX_DELIVERY_ATTEMPTS_MIN <= MAX_DELIVERY_ATTEMPTS_DEFAULT);
const _: () = assert!(MAX_DELIVERY_ATTEMPTS_DEFAULT <= MAX_DELIVERY_ATTEMPTS_MAX);
const _: () = assert!(BACKOFF_SECONDS_MINIMUM_DEFAULT <= BACKOFF_SECONDS_MAXIMUM_DEFAULT);
const _: () = assert!(BACKOFF_SECONDS_MAXIMUM_DEFAULT <= BACKOFF_SECONDS_MAX);
const _: () =
    assert!(FRAME_HEADER_BYTES.is_multiple_of(16), "bodies must stay 16-byte aligned after the header");

//! Pub/Sub's messages (`google.pubsub.v1`, prost) to and from the control plane's types
//! (`crate::api::control`): names, durations and timestamps, the fields Ringpost stores, the
//! refusal of those it does not implement (by name), and update masks.
//!
//! Plain functions of plain values, so that every handler (administration and delivery) maps
//! a field the same way. Refusals are the domain's `InvalidArgument`, naming the field as
//! Pub/Sub spells it; the values themselves are checked by the model's rules (`effective_*`),
//! the same as the native protocol's, so both protocols accept and refuse the same settings.

use super::names::{self, Kind, Name};
use crate::api::control::{
    effective_ack_deadline_seconds, effective_expiration_ttl_seconds, effective_max_delivery_attempts,
    effective_retention_seconds, retry_backoff_seconds, topic_retention_seconds, Labels, OidcToken,
    PushConfig, PushWrapper, Snapshot, Subscription, SubscriptionSettings, SubscriptionUpdate, Topic,
    TopicUpdate,
};
use crate::api::Status;
use crate::router::DELETED_TOPIC;
use ringpost_proto::pubsub;
use std::collections::HashMap;

/// An expiration policy without a ttl: the subscription never expires. The same value as the
/// model's `EXPIRATION_TTL_SECONDS_NEVER` (which the core work adds); the router's expiry
/// multiplies it saturating, so it is never reached.
pub const EXPIRATION_TTL_SECONDS_NEVER: u64 = u64::MAX;

/// Milliseconds in a second, for timestamps.
const MS_PER_SECOND: u64 = 1000;
/// Nanoseconds in a millisecond, for timestamps.
const NANOS_PER_MS: u32 = 1_000_000;
/// The largest `nanos` of a protobuf `Timestamp` or `Duration`: a whole second's worth or more
/// belongs in `seconds`, and protobuf's well-known types refuse it (as Pub/Sub does).
const NANOS_MAX: i32 = 999_999_999;
/// The latest time a protobuf `Timestamp` may hold, 9999-12-31T23:59:59Z (its documented range).
const TIMESTAMP_SECONDS_MAX: i64 = 253_402_300_799;

// --- Durations and timestamps -------------------------------------------------------------

/// A duration as whole seconds (a fraction is dropped: Ringpost keeps its settings in
/// seconds); absent is 0, which the setting's rule reads as its default.
pub fn duration_seconds(field: &str, duration: Option<&prost_types::Duration>) -> Result<u64, Status> {
    let Some(duration) = duration else { return Ok(0) };
    if duration.nanos > NANOS_MAX {
        return Err(Status::invalid_argument(format!(
            "{field}.nanos is {}; it must be 0 to {NANOS_MAX} (whole seconds go in seconds)",
            duration.nanos
        )));
    }
    if duration.seconds < 0 || duration.nanos < 0 {
        return Err(Status::invalid_argument(format!(
            "{field} is negative ({}s); a duration must be positive",
            duration.seconds
        )));
    }
    Ok(duration.seconds as u64)
}

/// Seconds as a duration; 0 (not set) as none.
pub fn duration(seconds: u64) -> Option<prost_types::Duration> {
    (seconds != 0).then(|| prost_types::Duration { seconds: clamp_i64(seconds), nanos: 0 })
}

/// A timestamp as milliseconds since the Unix epoch; before the epoch is refused.
pub fn timestamp_ms(field: &str, timestamp: &prost_types::Timestamp) -> Result<u64, Status> {
    if !(0..=NANOS_MAX).contains(&timestamp.nanos) {
        return Err(Status::invalid_argument(format!(
            "{field}.nanos is {}; it must be 0 to {NANOS_MAX} (whole seconds go in seconds)",
            timestamp.nanos
        )));
    }
    if timestamp.seconds > TIMESTAMP_SECONDS_MAX {
        return Err(Status::invalid_argument(format!(
            "{field} is {}s after the Unix epoch, past 9999-12-31T23:59:59Z, the latest a timestamp holds",
            timestamp.seconds
        )));
    }
    if timestamp.seconds < 0 {
        return Err(Status::invalid_argument(format!(
            "{field} is before 1970-01-01T00:00:00Z ({}s); a time must be after the Unix epoch",
            timestamp.seconds
        )));
    }
    let seconds = timestamp.seconds as u64;
    Ok(seconds.saturating_mul(MS_PER_SECOND).saturating_add((timestamp.nanos as u32 / NANOS_PER_MS) as u64))
}

/// Milliseconds since the Unix epoch as a timestamp.
pub fn timestamp(time_ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: clamp_i64(time_ms / MS_PER_SECOND),
        nanos: ((time_ms % MS_PER_SECOND) as u32 * NANOS_PER_MS) as i32,
    }
}

fn clamp_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A count Pub/Sub sends as a signed number (a deadline, attempts, a page size): negative is
/// refused, naming the field.
pub fn unsigned(field: &str, value: i32) -> Result<u32, Status> {
    u32::try_from(value)
        .map_err(|_| Status::invalid_argument(format!("{field} is {value}; it must not be negative")))
}

// --- Labels --------------------------------------------------------------------------------

/// Labels as Ringpost keeps them (in key order). Their rules are the router's.
pub fn labels_in(labels: &HashMap<String, String>) -> Labels {
    labels.iter().map(|(key, value)| (key.clone(), value.clone())).collect()
}

pub fn labels_out(labels: Labels) -> HashMap<String, String> {
    labels.into_iter().collect()
}

// --- Fields Ringpost does not implement ----------------------------------------------------

/// The refusal of a field Ringpost does not implement, set in a request.
pub fn unsupported(field: &str) -> Status {
    Status::invalid_argument(format!("{field} is not supported by Ringpost; leave it unset"))
}

/// Refuses the first field that is set among `fields` (name, whether set).
fn refuse_set(fields: &[(&str, bool)]) -> Result<(), Status> {
    match fields.iter().find(|(_, set)| *set) {
        Some((field, _)) => Err(unsupported(field)),
        None => Ok(()),
    }
}

/// A topic's fields Ringpost does not implement, when set. Output-only fields (`state`,
/// `satisfies_pzs`) are ignored, as Google ignores them on input.
pub fn refuse_unsupported_topic_fields(topic: &pubsub::Topic) -> Result<(), Status> {
    let storage_policy_set = topic
        .message_storage_policy
        .as_ref()
        .is_some_and(|policy| !policy.allowed_persistence_regions.is_empty() || policy.enforce_in_transit);
    refuse_set(&[
        ("kms_key_name", !topic.kms_key_name.is_empty()),
        ("message_storage_policy", storage_policy_set),
        ("ingestion_data_source_settings", topic.ingestion_data_source_settings.is_some()),
        ("message_transforms", !topic.message_transforms.is_empty()),
        ("tags", !topic.tags.is_empty()),
    ])
}

/// A subscription's fields Ringpost does not implement, when set. Output-only fields (`state`,
/// `topic_message_retention_duration`, `analytics_hub_subscription_info`) are ignored.
pub fn refuse_unsupported_subscription_fields(subscription: &pubsub::Subscription) -> Result<(), Status> {
    refuse_set(&[
        ("bigquery_config", subscription.bigquery_config.is_some()),
        ("cloud_storage_config", subscription.cloud_storage_config.is_some()),
        ("bigtable_config", subscription.bigtable_config.is_some()),
        ("detached", subscription.detached),
        ("message_transforms", !subscription.message_transforms.is_empty()),
        ("tags", !subscription.tags.is_empty()),
    ])
}

// --- Topics --------------------------------------------------------------------------------

/// A CreateTopic's topic: its name and what Ringpost stores of it.
pub fn topic_in(topic: &pubsub::Topic) -> Result<(Name, Topic), Status> {
    let name = names::parse("name", Kind::Topic, &topic.name)?;
    refuse_unsupported_topic_fields(topic)?;
    let retention =
        duration_seconds("message_retention_duration", topic.message_retention_duration.as_ref())?;
    let request = Topic {
        name: name.name.clone(),
        message_retention_seconds: topic_retention_seconds(retention)?,
        labels: labels_in(&topic.labels),
        replicas: 0,
        // Pub/Sub's topics have no such field: one source, as every topic before sources.
        sources: 0,
        source_leaders: Vec::new(),
        source_policy: None,
    };
    Ok((name, request))
}

/// A topic's schema settings as the catalog keeps them: the schema's own name (in any
/// project, as every name), the encoding (JSON when unspecified, as Pub/Sub takes it) and the
/// bounds. `None` when the topic has none.
pub fn schema_settings_in(
    settings: Option<&pubsub::SchemaSettings>,
) -> Result<Option<crate::catalog::schemas::SchemaSettings>, Status> {
    use crate::catalog::schemas::{SchemaEncoding, SchemaSettings};
    let Some(settings) = settings else { return Ok(None) };
    let schema = names::parse("schema_settings.schema", Kind::Schema, &settings.schema)?.name;
    let encoding = match settings.encoding {
        0 => SchemaEncoding::Json,
        number => crate::router::schemas::schema_encoding(number)
            .ok_or_else(|| Status::invalid_argument("schema_settings.encoding must be JSON or BINARY"))?,
    };
    Ok(Some(SchemaSettings {
        schema,
        encoding,
        first_revision_id: settings.first_revision_id.clone(),
        last_revision_id: settings.last_revision_id.clone(),
    }))
}

/// A topic's schema settings as Pub/Sub shows them, the schema named in `project` (or
/// `_deleted-schema_` once deleted).
pub fn schema_settings_out(
    project: &str,
    settings: &crate::catalog::schemas::SchemaSettings,
) -> pubsub::SchemaSettings {
    use crate::catalog::schemas::DELETED_SCHEMA;
    pubsub::SchemaSettings {
        schema: match settings.schema.as_str() {
            DELETED_SCHEMA => DELETED_SCHEMA.to_owned(),
            schema => names::format(project, Kind::Schema, schema),
        },
        encoding: settings.encoding as i32,
        first_revision_id: settings.first_revision_id.clone(),
        last_revision_id: settings.last_revision_id.clone(),
    }
}

/// A topic as Pub/Sub shows it, named in `project`.
pub fn topic_out(project: &str, topic: Topic) -> pubsub::Topic {
    pubsub::Topic {
        name: names::format(project, Kind::Topic, &topic.name),
        labels: labels_out(topic.labels),
        message_retention_duration: duration(topic.message_retention_seconds),
        state: pubsub::topic::State::Active as i32,
        ..Default::default()
    }
}

/// A topic's full name in `project`, or Pub/Sub's `_deleted-topic_` for a deleted one.
pub fn topic_name_out(project: &str, topic: &str) -> String {
    if topic == DELETED_TOPIC {
        DELETED_TOPIC.to_owned()
    } else {
        names::format(project, Kind::Topic, topic)
    }
}

// --- Subscriptions -------------------------------------------------------------------------

/// A dead-letter policy as (Ringpost's topic name, delivery attempts), checked; absent is no
/// policy.
fn dead_letter_policy_in(policy: Option<&pubsub::DeadLetterPolicy>) -> Result<(String, u32), Status> {
    let Some(policy) = policy else { return Ok((String::new(), 0)) };
    let attempts = unsigned("dead_letter_policy.max_delivery_attempts", policy.max_delivery_attempts)?;
    let topic = if policy.dead_letter_topic.is_empty() {
        String::new()
    } else {
        names::parse("dead_letter_policy.dead_letter_topic", Kind::Topic, &policy.dead_letter_topic)?.name
    };
    let attempts = effective_max_delivery_attempts(&topic, attempts)?;
    Ok((topic, attempts))
}

/// A retry policy as (minimum, maximum) backoff seconds, checked. Absent is none, (0, 0): a
/// message is delivered again at once. Present, a bound left unset takes Pub/Sub's default,
/// and one set to 0 is 0 (the model's `retry_backoff_seconds`, which names what was given).
fn retry_policy_in(policy: Option<&pubsub::RetryPolicy>) -> Result<(u32, u32), Status> {
    let Some(policy) = policy else { return Ok((0, 0)) };
    let bound = |field: &str, value: Option<&prost_types::Duration>| match value {
        None => Ok::<Option<u32>, Status>(None),
        Some(value) => Ok(Some(u32::try_from(duration_seconds(field, Some(value))?).unwrap_or(u32::MAX))),
    };
    let minimum = bound("retry_policy.minimum_backoff", policy.minimum_backoff.as_ref())?;
    let maximum = bound("retry_policy.maximum_backoff", policy.maximum_backoff.as_ref())?;
    Ok(retry_backoff_seconds(minimum, maximum)?)
}

/// An expiration policy as its ttl in seconds, checked: absent takes the default (31 days);
/// present without a ttl never expires.
fn expiration_ttl_in(policy: Option<&pubsub::ExpirationPolicy>) -> Result<u64, Status> {
    match policy {
        None => Ok(effective_expiration_ttl_seconds(0)?),
        Some(pubsub::ExpirationPolicy { ttl: None }) => Ok(EXPIRATION_TTL_SECONDS_NEVER),
        Some(pubsub::ExpirationPolicy { ttl: Some(ttl) }) => {
            match duration_seconds("expiration_policy.ttl", Some(ttl))? {
                // A ttl of 0 is below the minimum, not the default.
                0 => Err(Status::invalid_argument(
                    "expiration_policy.ttl is 0; it must be at least one day, or unset to never expire",
                )),
                seconds => Ok(effective_expiration_ttl_seconds(seconds)?),
            }
        }
    }
}

/// A CreateSubscription's subscription: its name and its settings as asked (0 or empty for a
/// setting's default, which the router applies), with Ringpost's names for it and its topics.
pub fn subscription_in(subscription: &pubsub::Subscription) -> Result<(Name, Subscription), Status> {
    let name = names::parse("name", Kind::Subscription, &subscription.name)?;
    let topic = names::parse("topic", Kind::Topic, &subscription.topic)?;
    refuse_unsupported_subscription_fields(subscription)?;
    let (dead_letter_topic, max_delivery_attempts) =
        dead_letter_policy_in(subscription.dead_letter_policy.as_ref())?;
    let (minimum_backoff_seconds, maximum_backoff_seconds) =
        retry_policy_in(subscription.retry_policy.as_ref())?;
    let settings = SubscriptionSettings {
        ack_deadline_seconds: unsigned("ack_deadline_seconds", subscription.ack_deadline_seconds)?,
        retain_acked_messages: subscription.retain_acked_messages,
        message_retention_seconds: duration_seconds(
            "message_retention_duration",
            subscription.message_retention_duration.as_ref(),
        )?,
        enable_message_ordering: subscription.enable_message_ordering,
        filter: subscription.filter.clone(),
        dead_letter_topic,
        max_delivery_attempts,
        minimum_backoff_seconds,
        maximum_backoff_seconds,
        expiration_ttl_seconds: expiration_ttl_in(subscription.expiration_policy.as_ref())?,
        labels: labels_in(&subscription.labels),
        enable_exactly_once_delivery: subscription.enable_exactly_once_delivery,
        push: push_config_in(subscription.push_config.as_ref(), &name.project),
    };
    let request = Subscription { name: name.name.clone(), topic: topic.name, settings, detached: false };
    Ok((name, request))
}

/// A push configuration as Ringpost stores it: `None` (pull) when it names no endpoint, as
/// Pub/Sub reads an empty `push_config`. Its endpoint, attributes and token are checked by the
/// router, for every protocol (`api::validate::validate_push_config`). Its requests name the
/// subscription in `project`, the one the request named it in, as Pub/Sub's would.
pub fn push_config_in(push_config: Option<&pubsub::PushConfig>, project: &str) -> Option<Box<PushConfig>> {
    let config = push_config.filter(|config| !config.push_endpoint.is_empty())?;
    let wrapper = match config.wrapper {
        None | Some(pubsub::push_config::Wrapper::PubsubWrapper(_)) => PushWrapper::Pubsub,
        Some(pubsub::push_config::Wrapper::NoWrapper(no_wrapper)) => {
            PushWrapper::NoWrapper { write_metadata: no_wrapper.write_metadata }
        }
    };
    let oidc_token = config.authentication_method.as_ref().map(|method| match method {
        pubsub::push_config::AuthenticationMethod::OidcToken(token) => OidcToken {
            service_account_email: token.service_account_email.clone(),
            audience: token.audience.clone(),
        },
    });
    Some(Box::new(PushConfig {
        endpoint: config.push_endpoint.clone(),
        attributes: labels_in(&config.attributes),
        wrapper,
        oidc_token,
        project: project.to_owned(),
    }))
}

/// A push configuration as Pub/Sub shows it: empty for a pull subscription. The default
/// wrapper (Pub/Sub's JSON envelope) is shown unset, as it is when a client does not name it.
pub fn push_config_out(push: Option<&PushConfig>) -> pubsub::PushConfig {
    let Some(push) = push else { return pubsub::PushConfig::default() };
    pubsub::PushConfig {
        push_endpoint: push.endpoint.clone(),
        attributes: labels_out(push.attributes.clone()),
        authentication_method: push.oidc_token.as_ref().map(|token| {
            pubsub::push_config::AuthenticationMethod::OidcToken(pubsub::push_config::OidcToken {
                service_account_email: token.service_account_email.clone(),
                audience: token.audience.clone(),
            })
        }),
        wrapper: match push.wrapper {
            PushWrapper::Pubsub => None,
            PushWrapper::NoWrapper { write_metadata } => {
                Some(pubsub::push_config::Wrapper::NoWrapper(pubsub::push_config::NoWrapper {
                    write_metadata,
                }))
            }
        },
    }
}

/// A subscription as Pub/Sub shows it, named in `project`; `topic_retention_seconds` is its
/// topic's message retention (0: not set, or the topic is gone).
pub fn subscription_out(
    project: &str,
    subscription: Subscription,
    topic_retention_seconds: u64,
) -> pubsub::Subscription {
    let settings = subscription.settings;
    let dead_letter_policy = (!settings.dead_letter_topic.is_empty()).then(|| pubsub::DeadLetterPolicy {
        dead_letter_topic: names::format(project, Kind::Topic, &settings.dead_letter_topic),
        max_delivery_attempts: i32::try_from(settings.max_delivery_attempts).unwrap_or(i32::MAX),
    });
    let retry_policy =
        (settings.minimum_backoff_seconds != 0 || settings.maximum_backoff_seconds != 0).then(|| {
            pubsub::RetryPolicy {
                minimum_backoff: Some(prost_types::Duration {
                    seconds: settings.minimum_backoff_seconds.into(),
                    nanos: 0,
                }),
                maximum_backoff: Some(prost_types::Duration {
                    seconds: settings.maximum_backoff_seconds.into(),
                    nanos: 0,
                }),
            }
        });
    let expiration_policy = pubsub::ExpirationPolicy {
        ttl: (settings.expiration_ttl_seconds != EXPIRATION_TTL_SECONDS_NEVER)
            .then(|| prost_types::Duration { seconds: clamp_i64(settings.expiration_ttl_seconds), nanos: 0 }),
    };
    pubsub::Subscription {
        name: names::format(project, Kind::Subscription, &subscription.name),
        topic: topic_name_out(project, &subscription.topic),
        push_config: Some(push_config_out(settings.push.as_deref())),
        ack_deadline_seconds: i32::try_from(settings.ack_deadline_seconds).unwrap_or(i32::MAX),
        retain_acked_messages: settings.retain_acked_messages,
        message_retention_duration: duration(settings.message_retention_seconds),
        labels: labels_out(settings.labels),
        enable_message_ordering: settings.enable_message_ordering,
        expiration_policy: Some(expiration_policy),
        filter: settings.filter,
        dead_letter_policy,
        retry_policy,
        enable_exactly_once_delivery: settings.enable_exactly_once_delivery,
        detached: subscription.detached,
        topic_message_retention_duration: duration(topic_retention_seconds),
        state: pubsub::subscription::State::Active as i32,
        ..Default::default()
    }
}

// --- Snapshots -----------------------------------------------------------------------------

/// A snapshot as Pub/Sub shows it, named in `project`.
pub fn snapshot_out(project: &str, snapshot: Snapshot) -> pubsub::Snapshot {
    pubsub::Snapshot {
        name: names::format(project, Kind::Snapshot, &snapshot.name),
        topic: topic_name_out(project, &snapshot.topic),
        expire_time: Some(timestamp(snapshot.expire_time_ms)),
        labels: labels_out(snapshot.labels),
    }
}

// --- Update masks --------------------------------------------------------------------------

/// A field an update mask may not name, and why (said in the refusal).
const IMMUTABLE: &str = "it cannot be changed after creation";

/// The paths of an update mask, refused when empty or absent.
fn mask_paths(mask: Option<&prost_types::FieldMask>) -> Result<&[String], Status> {
    match mask {
        Some(mask) if !mask.paths.is_empty() => Ok(&mask.paths),
        _ => Err(Status::invalid_argument("update_mask is required: name the fields to change")),
    }
}

/// The refusal of an update mask's `path`: an unsupported field, an immutable one, or one the
/// resource does not have; `updatable` lists what may be named instead.
fn refuse_path(
    resource: &str,
    path: &str,
    unsupported_fields: &[&str],
    immutable: &[&str],
    updatable: &[&str],
) -> Status {
    let shown = ringpost_model::validate::shorten(path);
    if unsupported_fields.contains(&path) {
        return Status::invalid_argument(format!(
            "update_mask names '{shown}': {}",
            unsupported(path).message
        ));
    }
    if immutable.contains(&path) {
        return Status::invalid_argument(format!("update_mask names '{shown}', which {IMMUTABLE}"));
    }
    Status::invalid_argument(format!(
        "update_mask names '{shown}', which is not a {resource} field Ringpost can update; it can update {}",
        updatable.join(", ")
    ))
}

/// UpdateTopic's updatable fields, as Pub/Sub names them.
pub const TOPIC_UPDATABLE_FIELDS: [&str; 3] = ["labels", "message_retention_duration", "schema_settings"];
const TOPIC_IMMUTABLE_FIELDS: [&str; 1] = ["name"];
const TOPIC_UNSUPPORTED_FIELDS: [&str; 5] = [
    "kms_key_name",
    "message_storage_policy",
    "ingestion_data_source_settings",
    "message_transforms",
    "tags",
];

/// An UpdateTopic as the router's changes, checked with the create path's rules; only the
/// fields the mask names are read.
pub fn topic_update_in(request: &pubsub::UpdateTopicRequest) -> Result<(Name, TopicUpdate), Status> {
    let topic = request.topic.as_ref().ok_or_else(|| Status::invalid_argument("topic is required"))?;
    let name = names::parse("topic.name", Kind::Topic, &topic.name)?;
    let mut update = TopicUpdate { name: name.name.clone(), ..Default::default() };
    for path in mask_paths(request.update_mask.as_ref())? {
        match path.as_str() {
            "labels" => update.labels = Some(labels_in(&topic.labels)),
            // Kept by the router beside the topic's other settings (`schema_settings_in`).
            "schema_settings" => {}
            "message_retention_duration" => {
                let seconds = duration_seconds(
                    "message_retention_duration",
                    topic.message_retention_duration.as_ref(),
                )?;
                update.message_retention_seconds = Some(topic_retention_seconds(seconds)?);
            }
            other => {
                return Err(refuse_path(
                    "topic",
                    other,
                    &TOPIC_UNSUPPORTED_FIELDS,
                    &TOPIC_IMMUTABLE_FIELDS,
                    &TOPIC_UPDATABLE_FIELDS,
                ))
            }
        }
    }
    Ok((name, update))
}

/// UpdateSubscription's updatable fields, as Pub/Sub names them.
pub const SUBSCRIPTION_UPDATABLE_FIELDS: [&str; 9] = [
    "ack_deadline_seconds",
    "retain_acked_messages",
    "message_retention_duration",
    "labels",
    "expiration_policy",
    "dead_letter_policy",
    "retry_policy",
    "enable_exactly_once_delivery",
    "push_config",
];
const SUBSCRIPTION_IMMUTABLE_FIELDS: [&str; 4] = ["name", "topic", "filter", "enable_message_ordering"];
const SUBSCRIPTION_UNSUPPORTED_FIELDS: [&str; 6] =
    ["bigquery_config", "cloud_storage_config", "bigtable_config", "detached", "message_transforms", "tags"];

/// An UpdateSubscription as the router's changes, checked with the create path's rules (the
/// router applies them as given); only the fields the mask names are read.
pub fn subscription_update_in(
    request: &pubsub::UpdateSubscriptionRequest,
) -> Result<(Name, SubscriptionUpdate), Status> {
    let subscription =
        request.subscription.as_ref().ok_or_else(|| Status::invalid_argument("subscription is required"))?;
    let name = names::parse("subscription.name", Kind::Subscription, &subscription.name)?;
    let mut update = SubscriptionUpdate { name: name.name.clone(), ..Default::default() };
    for path in mask_paths(request.update_mask.as_ref())? {
        subscription_update_path(&mut update, subscription, &name.project, path)?;
    }
    Ok((name, update))
}

/// One path of an UpdateSubscription's mask, read from `subscription` into `update`.
fn subscription_update_path(
    update: &mut SubscriptionUpdate,
    subscription: &pubsub::Subscription,
    project: &str,
    path: &str,
) -> Result<(), Status> {
    match path {
        "ack_deadline_seconds" => {
            let seconds = unsigned("ack_deadline_seconds", subscription.ack_deadline_seconds)?;
            update.ack_deadline_seconds = Some(effective_ack_deadline_seconds(seconds)?);
        }
        "retain_acked_messages" => update.retain_acked_messages = Some(subscription.retain_acked_messages),
        "message_retention_duration" => {
            let seconds = duration_seconds(
                "message_retention_duration",
                subscription.message_retention_duration.as_ref(),
            )?;
            update.message_retention_seconds = Some(effective_retention_seconds(seconds)?);
        }
        "labels" => update.labels = Some(labels_in(&subscription.labels)),
        "expiration_policy" => {
            update.expiration_ttl_seconds = Some(expiration_ttl_in(subscription.expiration_policy.as_ref())?)
        }
        "dead_letter_policy" => {
            update.dead_letter_policy = Some(dead_letter_policy_in(subscription.dead_letter_policy.as_ref())?)
        }
        "retry_policy" => update.retry_policy = Some(retry_policy_in(subscription.retry_policy.as_ref())?),
        "enable_exactly_once_delivery" => {
            update.enable_exactly_once_delivery = Some(subscription.enable_exactly_once_delivery)
        }
        "push_config" => update.push = Some(push_config_in(subscription.push_config.as_ref(), project)),
        other => {
            return Err(refuse_path(
                "subscription",
                other,
                &SUBSCRIPTION_UNSUPPORTED_FIELDS,
                &SUBSCRIPTION_IMMUTABLE_FIELDS,
                &SUBSCRIPTION_UPDATABLE_FIELDS,
            ))
        }
    }
    Ok(())
}

/// UpdateSnapshot's updatable field.
pub const SNAPSHOT_UPDATABLE_FIELDS: [&str; 1] = ["labels"];
const SNAPSHOT_IMMUTABLE_FIELDS: [&str; 2] = ["name", "topic"];
/// A snapshot's expiry follows its subscription's backlog in Pub/Sub; in Ringpost it is fixed
/// at creation (`SNAPSHOT_LIFETIME_MS`), so an update may not move it.
const SNAPSHOT_UNSUPPORTED_FIELDS: [&str; 1] = ["expire_time"];

/// An UpdateSnapshot as (its name, the new labels).
pub fn snapshot_update_in(request: &pubsub::UpdateSnapshotRequest) -> Result<(Name, Option<Labels>), Status> {
    let snapshot =
        request.snapshot.as_ref().ok_or_else(|| Status::invalid_argument("snapshot is required"))?;
    let name = names::parse("snapshot.name", Kind::Snapshot, &snapshot.name)?;
    let mut labels = None;
    for path in mask_paths(request.update_mask.as_ref())? {
        match path.as_str() {
            "labels" => labels = Some(labels_in(&snapshot.labels)),
            other => {
                return Err(refuse_path(
                    "snapshot",
                    other,
                    &SNAPSHOT_UNSUPPORTED_FIELDS,
                    &SNAPSHOT_IMMUTABLE_FIELDS,
                    &SNAPSHOT_UPDATABLE_FIELDS,
                ))
            }
        }
    }
    Ok((name, labels))
}

#[cfg(test)]
mod tests;

//! Semantic checks on what passed rkyv's structural validation: names, sizes, counts, ranges.
//! Every refusal is `InvalidArgument` naming the limit.
//!
//! The rules themselves are the model's (`ringpost_model::validate`), which the daemon applies
//! too; this module applies them to the wire's archived requests, keeps the checks that are the
//! wire's own (a publish request as a whole, update masks), and answers the model's checks with
//! the wire's `Status`, for the client.

use crate::error::Status;
use crate::limits::*;
use ringpost_model::validate as model;
use ringpost_model::validate::shorten;
use ringpost_model::Invalid;

impl From<Invalid> for Status {
    /// The model's refusals are all invalid arguments.
    fn from(invalid: Invalid) -> Status {
        Status::invalid_argument(invalid.message)
    }
}

/// The model's [`model::validate_name`]: Pub/Sub's rules for a topic, subscription or snapshot
/// name.
pub fn validate_name(kind: &str, name: &str) -> Result<(), Status> {
    Ok(model::validate_name(kind, name)?)
}

/// The model's [`model::validate_message`]: checks one message's parts and returns its
/// accounted size, which counts towards `PUBLISH_REQUEST_BYTES_MAX`.
pub fn validate_message<'a>(
    index: usize,
    data: &[u8],
    attributes: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    ordering_key: &str,
) -> Result<usize, Status> {
    Ok(model::validate_message(index, data, attributes, ordering_key)?)
}

/// Checks a whole publish request (already structurally valid) and returns its total size.
pub fn validate_publish(request: &crate::messages::ArchivedPublishRequest) -> Result<usize, Status> {
    validate_name("topic", request.topic.as_str())?;
    let count = request.messages.len();
    if count == 0 {
        return Err(Status::invalid_argument("publish request has no messages"));
    }
    if count > PUBLISH_BATCH_MESSAGES_MAX {
        return Err(Status::invalid_argument(format!(
            "publish request has {count} messages; the limit is {PUBLISH_BATCH_MESSAGES_MAX} (PUBLISH_BATCH_MESSAGES_MAX)"
        )));
    }
    let mut total = 0usize;
    for (index, message) in request.messages.iter().enumerate() {
        total += validate_message(
            index,
            message.data.as_slice(),
            message.attributes.iter().map(|a| (a.key.as_str(), a.value.as_str())),
            message.ordering_key.as_str(),
        )?;
    }
    if total > PUBLISH_REQUEST_BYTES_MAX {
        return Err(Status::invalid_argument(format!(
            "publish request is {total} bytes; the limit is {PUBLISH_REQUEST_BYTES_MAX} (PUBLISH_REQUEST_BYTES_MAX)"
        )));
    }
    Ok(total)
}

/// The model's [`model::effective_ack_deadline_seconds`]; 0 stands for the default.
pub fn effective_ack_deadline_seconds(requested: u32) -> Result<u32, Status> {
    Ok(model::effective_ack_deadline_seconds(requested)?)
}

/// The model's [`model::effective_retention_seconds`]; 0 stands for the default.
pub fn effective_retention_seconds(requested: u64) -> Result<u64, Status> {
    Ok(model::effective_retention_seconds(requested)?)
}

/// The model's [`model::topic_retention_seconds`]; 0 means not set.
pub fn topic_retention_seconds(requested: u64) -> Result<u64, Status> {
    Ok(model::topic_retention_seconds(requested)?)
}

/// The model's [`model::effective_expiration_ttl_seconds`]; 0 stands for the default.
pub fn effective_expiration_ttl_seconds(requested: u64) -> Result<u64, Status> {
    Ok(model::effective_expiration_ttl_seconds(requested)?)
}

/// The model's [`model::effective_max_delivery_attempts`]: a dead-letter policy's delivery
/// attempts, 0 without a dead-letter topic.
pub fn effective_max_delivery_attempts(dead_letter_topic: &str, requested: u32) -> Result<u32, Status> {
    Ok(model::effective_max_delivery_attempts(dead_letter_topic, requested)?)
}

/// The model's [`model::retry_backoff_seconds`]: a retry policy's bounds as given (`None`: not
/// given, the default), checked, for a client that knows which were given.
pub fn retry_backoff_seconds(minimum: Option<u32>, maximum: Option<u32>) -> Result<(u32, u32), Status> {
    Ok(model::retry_backoff_seconds(minimum, maximum)?)
}

/// The model's [`model::effective_retry_backoff_seconds`]: a retry policy's minimum and maximum
/// backoff, (0, 0) for none; a minimum of 0 is 0 s, a maximum of 0 the default.
pub fn effective_retry_backoff_seconds(minimum: u32, maximum: u32) -> Result<(u32, u32), Status> {
    Ok(model::effective_retry_backoff_seconds(minimum, maximum)?)
}

/// The subscription fields an update may name, as Pub/Sub names them.
pub const SUBSCRIPTION_UPDATABLE_FIELDS: [&str; 6] = [
    "ack_deadline_seconds",
    "retain_acked_messages",
    "message_retention_duration",
    "expiration_policy",
    "dead_letter_policy",
    "retry_policy",
];
/// Subscription fields Ringpost stores that an update may not change, and why.
const SUBSCRIPTION_IMMUTABLE_FIELDS: [(&str, &str); 4] = [
    ("name", "it names the subscription"),
    ("topic", "a subscription stays on the topic it was created on"),
    ("filter", "it is fixed when the subscription is created"),
    ("enable_message_ordering", "it is fixed when the subscription is created"),
];
/// The topic fields an update may name, as Pub/Sub names them.
pub const TOPIC_UPDATABLE_FIELDS: [&str; 1] = ["message_retention_duration"];
const TOPIC_IMMUTABLE_FIELDS: [(&str, &str); 1] = [("name", "it names the topic")];

/// What an UpdateSubscription changes, checked, with defaults applied as the create path
/// applies them; `None` leaves a field as it is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubscriptionChanges {
    pub ack_deadline_seconds: Option<u32>,
    pub retain_acked_messages: Option<bool>,
    pub message_retention_seconds: Option<u64>,
    pub expiration_ttl_seconds: Option<u64>,
    /// The dead-letter topic (empty: no policy) and its delivery attempts (0 without one).
    pub dead_letter_policy: Option<(String, u32)>,
    /// Minimum and maximum backoff seconds; (0, 0): no retry policy.
    pub retry_policy: Option<(u32, u32)>,
    /// The mask names `push_config` (UpdateSubscriptionWithPush only): the request's push
    /// configuration replaces the subscription's.
    pub push_config: bool,
}

/// What an UpdateTopic changes, checked; `None` leaves a field as it is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TopicChanges {
    /// 0: not set.
    pub message_retention_seconds: Option<u64>,
}

/// Checks an update mask: not empty, not longer than `UPDATE_MASK_PATHS_MAX`, and naming only
/// fields the update may change. Refusals name the field.
fn check_update_mask<'a>(
    resource: &str,
    mask: impl ExactSizeIterator<Item = &'a str>,
    updatable: &[&str],
    immutable: &[(&str, &str)],
) -> Result<Vec<&'a str>, Status> {
    let choices = updatable.join(", ");
    if mask.len() == 0 {
        return Err(Status::invalid_argument(format!(
            "update_mask is empty: name the {resource} fields to change ({choices})"
        )));
    }
    if mask.len() > UPDATE_MASK_PATHS_MAX {
        return Err(Status::invalid_argument(format!(
            "update_mask names {} fields; the limit is {UPDATE_MASK_PATHS_MAX} (UPDATE_MASK_PATHS_MAX)",
            mask.len()
        )));
    }
    let mut paths = Vec::with_capacity(mask.len());
    for path in mask {
        if updatable.contains(&path) {
            paths.push(path);
        } else if let Some((_, why)) = immutable.iter().find(|(field, _)| *field == path) {
            return Err(Status::invalid_argument(format!(
                "update_mask names '{path}', which cannot be changed: {why}"
            )));
        } else {
            return Err(Status::invalid_argument(format!(
                "update_mask names '{}', which is not a {resource} field Ringpost stores; it can change {choices}",
                shorten(path)
            )));
        }
    }
    Ok(paths)
}

/// Checks an UpdateSubscription request (already structurally valid) with the ranges the create
/// path checks, and returns what it changes. Whether a new dead-letter topic exists is the
/// router's to check.
pub fn validate_subscription_update(
    request: &crate::messages::ArchivedUpdateSubscriptionRequest,
) -> Result<SubscriptionChanges, Status> {
    validate_name("subscription", request.subscription.name.as_str())?;
    let paths = check_update_mask(
        "subscription",
        request.update_mask.iter().map(|path| path.as_str()),
        &SUBSCRIPTION_UPDATABLE_FIELDS,
        &SUBSCRIPTION_IMMUTABLE_FIELDS,
    )?;
    subscription_changes(&request.subscription, paths)
}

/// UpdateSubscriptionWithPush's updatable fields: UpdateSubscription's and `push_config`.
pub const SUBSCRIPTION_WITH_PUSH_UPDATABLE_FIELDS: [&str; 7] = [
    "ack_deadline_seconds",
    "retain_acked_messages",
    "message_retention_duration",
    "expiration_policy",
    "dead_letter_policy",
    "retry_policy",
    "push_config",
];

/// `validate_subscription_update` for an UpdateSubscriptionWithPush, whose mask may also name
/// `push_config` (then `SubscriptionChanges::push_config` is set; the configuration itself is
/// the router's to check, for every protocol).
pub fn validate_subscription_with_push_update(
    request: &crate::messages::ArchivedUpdateSubscriptionWithPushRequest,
) -> Result<SubscriptionChanges, Status> {
    validate_name("subscription", request.subscription.subscription.name.as_str())?;
    let paths = check_update_mask(
        "subscription",
        request.update_mask.iter().map(|path| path.as_str()),
        &SUBSCRIPTION_WITH_PUSH_UPDATABLE_FIELDS,
        &SUBSCRIPTION_IMMUTABLE_FIELDS,
    )?;
    subscription_changes(&request.subscription.subscription, paths)
}

/// The changes the update mask's `paths` (each one of the updatable fields) name.
fn subscription_changes(
    subscription: &crate::messages::ArchivedSubscription,
    paths: Vec<&str>,
) -> Result<SubscriptionChanges, Status> {
    let mut changes = SubscriptionChanges::default();
    for path in paths {
        match path {
            "push_config" => changes.push_config = true,
            "ack_deadline_seconds" => {
                changes.ack_deadline_seconds =
                    Some(effective_ack_deadline_seconds(subscription.ack_deadline_seconds.to_native())?)
            }
            "retain_acked_messages" => {
                changes.retain_acked_messages = Some(subscription.retain_acked_messages)
            }
            "message_retention_duration" => {
                changes.message_retention_seconds =
                    Some(effective_retention_seconds(subscription.message_retention_seconds.to_native())?)
            }
            "expiration_policy" => {
                changes.expiration_ttl_seconds =
                    Some(effective_expiration_ttl_seconds(subscription.expiration_ttl_seconds.to_native())?)
            }
            "dead_letter_policy" => {
                let topic = subscription.dead_letter_topic.as_str();
                let attempts =
                    effective_max_delivery_attempts(topic, subscription.max_delivery_attempts.to_native())?;
                changes.dead_letter_policy = Some((topic.to_owned(), attempts));
            }
            "retry_policy" => {
                changes.retry_policy = Some(effective_retry_backoff_seconds(
                    subscription.minimum_backoff_seconds.to_native(),
                    subscription.maximum_backoff_seconds.to_native(),
                )?)
            }
            // The mask check lets through only the names matched above.
            other => {
                return Err(Status::internal(format!("update_mask field '{other}' has no meaning here")))
            }
        }
    }
    Ok(changes)
}

/// Checks an UpdateTopic request (already structurally valid) with the ranges the create path
/// checks, and returns what it changes.
pub fn validate_topic_update(
    request: &crate::messages::ArchivedUpdateTopicRequest,
) -> Result<TopicChanges, Status> {
    validate_name("topic", request.topic.name.as_str())?;
    let paths = check_update_mask(
        "topic",
        request.update_mask.iter().map(|path| path.as_str()),
        &TOPIC_UPDATABLE_FIELDS,
        &TOPIC_IMMUTABLE_FIELDS,
    )?;
    let mut changes = TopicChanges::default();
    for path in paths {
        match path {
            "message_retention_duration" => {
                changes.message_retention_seconds =
                    Some(topic_retention_seconds(request.topic.message_retention_seconds.to_native())?)
            }
            // The mask check lets through only the names matched above.
            other => {
                return Err(Status::internal(format!("update_mask field '{other}' has no meaning here")))
            }
        }
    }
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use crate::frame::{access_body, encode_frame};
    use crate::messages::{Subscription, Topic, UpdateSubscriptionRequest, UpdateTopicRequest};

    fn update_subscription(subscription: Subscription, mask: &[&str]) -> Result<SubscriptionChanges, Status> {
        let request = UpdateSubscriptionRequest {
            subscription: Subscription { name: "audit".into(), ..subscription },
            update_mask: mask.iter().map(|path| path.to_string()).collect(),
        };
        let frame = encode_frame(0, 0, 0, &request);
        validate_subscription_update(access_body::<UpdateSubscriptionRequest>(&frame[FRAME_HEADER_BYTES..])?)
    }

    fn update_topic(retention_seconds: u64, mask: &[&str]) -> Result<TopicChanges, Status> {
        let request = UpdateTopicRequest {
            topic: Topic { name: "orders".into(), message_retention_seconds: retention_seconds },
            update_mask: mask.iter().map(|path| path.to_string()).collect(),
        };
        let frame = encode_frame(0, 0, 0, &request);
        validate_topic_update(access_body::<UpdateTopicRequest>(&frame[FRAME_HEADER_BYTES..])?)
    }

    /// The refusal's message, checked to be InvalidArgument.
    fn refusal<T: std::fmt::Debug>(result: Result<T, Status>) -> String {
        let status = result.expect_err("the update should be refused");
        assert_eq!(status.code, ErrorCode::InvalidArgument, "{status}");
        status.message
    }

    #[test]
    fn an_empty_mask_is_refused() {
        assert!(refusal(update_subscription(Subscription::default(), &[])).contains("update_mask is empty"));
        assert!(refusal(update_topic(600, &[])).contains("update_mask is empty"));
    }

    #[test]
    fn immutable_and_unknown_fields_are_refused_by_name() {
        for field in ["filter", "enable_message_ordering", "topic", "name"] {
            let message =
                refusal(update_subscription(Subscription::default(), &["ack_deadline_seconds", field]));
            assert!(
                message.contains(&format!("'{field}'")) && message.contains("cannot be changed"),
                "{message}"
            );
        }
        for field in ["labels", "push_config", "message_retention_seconds", "retry_policy.minimum_backoff"] {
            let message = refusal(update_subscription(Subscription::default(), &[field]));
            assert!(message.contains(&format!("'{field}'")) && message.contains("retry_policy"), "{message}");
        }
        assert!(refusal(update_topic(600, &["name"])).contains("'name'"));
        assert!(refusal(update_topic(600, &["labels"])).contains("'labels'"));
        let many = vec!["retain_acked_messages"; UPDATE_MASK_PATHS_MAX + 1];
        assert!(
            refusal(update_subscription(Subscription::default(), &many)).contains("UPDATE_MASK_PATHS_MAX")
        );
        let most = vec!["retain_acked_messages"; UPDATE_MASK_PATHS_MAX];
        assert!(
            update_subscription(Subscription::default(), &most).is_ok(),
            "a repeated field is one change"
        );
    }

    #[test]
    fn only_the_fields_the_mask_names_are_read_and_checked() {
        let out_of_range = Subscription {
            ack_deadline_seconds: 3,
            message_retention_seconds: 5,
            max_delivery_attempts: 1,
            retain_acked_messages: true,
            ..Default::default()
        };
        assert_eq!(
            update_subscription(out_of_range, &["retain_acked_messages"]),
            Ok(SubscriptionChanges { retain_acked_messages: Some(true), ..Default::default() })
        );
    }

    #[test]
    fn subscription_fields_keep_the_create_paths_ranges_and_defaults() {
        let ack = |seconds| {
            update_subscription(
                Subscription { ack_deadline_seconds: seconds, ..Default::default() },
                &["ack_deadline_seconds"],
            )
            .map(|changes| changes.ack_deadline_seconds.unwrap())
        };
        assert_eq!(ack(0), Ok(ACK_DEADLINE_SECONDS_DEFAULT));
        assert_eq!(ack(ACK_DEADLINE_SECONDS_MIN), Ok(ACK_DEADLINE_SECONDS_MIN));
        assert_eq!(ack(ACK_DEADLINE_SECONDS_MAX), Ok(ACK_DEADLINE_SECONDS_MAX));
        refusal(ack(ACK_DEADLINE_SECONDS_MIN - 1));
        refusal(ack(ACK_DEADLINE_SECONDS_MAX + 1));

        let retention = |seconds| {
            update_subscription(
                Subscription { message_retention_seconds: seconds, ..Default::default() },
                &["message_retention_duration"],
            )
            .map(|changes| changes.message_retention_seconds.unwrap())
        };
        assert_eq!(retention(0), Ok(RETENTION_SECONDS_DEFAULT));
        assert_eq!(retention(RETENTION_SECONDS_MIN), Ok(RETENTION_SECONDS_MIN));
        refusal(retention(RETENTION_SECONDS_MIN - 1));
        refusal(retention(RETENTION_SECONDS_MAX + 1));

        let expiration = |seconds| {
            update_subscription(
                Subscription { expiration_ttl_seconds: seconds, ..Default::default() },
                &["expiration_policy"],
            )
            .map(|changes| changes.expiration_ttl_seconds.unwrap())
        };
        assert_eq!(expiration(0), Ok(EXPIRATION_TTL_SECONDS_DEFAULT));
        assert_eq!(expiration(EXPIRATION_TTL_SECONDS_MIN), Ok(EXPIRATION_TTL_SECONDS_MIN));
        refusal(expiration(EXPIRATION_TTL_SECONDS_MIN - 1));

        let dead_letter = |topic: &str, attempts| {
            update_subscription(
                Subscription {
                    dead_letter_topic: topic.into(),
                    max_delivery_attempts: attempts,
                    ..Default::default()
                },
                &["dead_letter_policy"],
            )
            .map(|changes| changes.dead_letter_policy.unwrap())
        };
        assert_eq!(dead_letter("", 0), Ok((String::new(), 0)), "an empty topic removes the policy");
        assert_eq!(dead_letter("dead", 0), Ok(("dead".into(), MAX_DELIVERY_ATTEMPTS_DEFAULT)));
        assert_eq!(
            dead_letter("dead", MAX_DELIVERY_ATTEMPTS_MAX),
            Ok(("dead".into(), MAX_DELIVERY_ATTEMPTS_MAX))
        );
        assert!(refusal(dead_letter("", 5)).contains("needs a dead_letter_topic"));
        refusal(dead_letter("dead", MAX_DELIVERY_ATTEMPTS_MIN - 1));
        refusal(dead_letter("dead", MAX_DELIVERY_ATTEMPTS_MAX + 1));
        assert!(refusal(dead_letter("-bad", 5)).contains("dead-letter topic name"));

        let retry = |minimum, maximum| {
            update_subscription(
                Subscription {
                    minimum_backoff_seconds: minimum,
                    maximum_backoff_seconds: maximum,
                    ..Default::default()
                },
                &["retry_policy"],
            )
            .map(|changes| changes.retry_policy.unwrap())
        };
        assert_eq!(retry(0, 0), Ok((0, 0)), "both 0 remove the policy");
        assert_eq!(retry(5, 0), Ok((5, BACKOFF_SECONDS_MAXIMUM_DEFAULT)));
        assert_eq!(retry(0, 60), Ok((0, 60)), "a minimum of 0 is no wait");
        assert_eq!(retry(0, 5), Ok((0, 5)));
        assert!(
            refusal(retry(30, 20)).contains("minimum_backoff of 30 s is above its maximum_backoff of 20 s")
        );
        refusal(retry(BACKOFF_SECONDS_MAX + 1, 0));
    }

    #[test]
    fn topic_retention_is_unset_by_0_and_otherwise_in_range() {
        let retention = |seconds| {
            update_topic(seconds, &["message_retention_duration"]).map(|c| c.message_retention_seconds)
        };
        assert_eq!(retention(0), Ok(Some(0)));
        assert_eq!(retention(RETENTION_SECONDS_MIN), Ok(Some(RETENTION_SECONDS_MIN)));
        assert_eq!(retention(RETENTION_SECONDS_MAX), Ok(Some(RETENTION_SECONDS_MAX)));
        refusal(retention(RETENTION_SECONDS_MIN - 1));
        refusal(retention(RETENTION_SECONDS_MAX + 1));
    }
}

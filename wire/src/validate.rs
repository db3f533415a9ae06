//! Semantic checks on what passed rkyv's structural validation: names, sizes, counts, ranges.
//! Every refusal is `InvalidArgument` naming the limit.

use crate::error::Status;
use crate::limits::*;

/// Checks a topic, subscription or snapshot name with Pub/Sub's rules: 3 to 255 bytes,
/// starting with a letter, of letters, digits and `-_.~+%`, and not starting with `goog`.
pub fn validate_name(kind: &str, name: &str) -> Result<(), Status> {
    if name.len() < NAME_BYTES_MIN || name.len() > NAME_BYTES_MAX {
        return Err(Status::invalid_argument(format!(
            "{kind} name '{}' is {} bytes; it must be {NAME_BYTES_MIN} to {NAME_BYTES_MAX} (NAME_BYTES_MIN, NAME_BYTES_MAX)",
            shorten(name),
            name.len()
        )));
    }
    let first = name.as_bytes()[0];
    if !first.is_ascii_alphabetic() {
        return Err(Status::invalid_argument(format!(
            "{kind} name '{}' must start with a letter",
            shorten(name)
        )));
    }
    if let Some(bad) =
        name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '~' | '+' | '%')))
    {
        return Err(Status::invalid_argument(format!(
            "{kind} name '{}' has the character {bad:?}; allowed are letters, digits and -_.~+%",
            shorten(name)
        )));
    }
    // Compared in place: this runs on every publish, and lowering a copy allocated each time.
    if name.as_bytes().get(..4).is_some_and(|prefix| prefix.eq_ignore_ascii_case(b"goog")) {
        return Err(Status::invalid_argument(format!("{kind} name '{name}' must not start with 'goog'")));
    }
    Ok(())
}

fn shorten(text: &str) -> String {
    if text.len() <= 64 {
        return text.to_owned();
    }
    let mut cut = 64;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &text[..cut])
}

/// Checks one message's parts and returns its accounted size (data + attribute keys and
/// values + ordering key), which counts towards `PUBLISH_REQUEST_BYTES_MAX`.
pub fn validate_message<'a>(
    index: usize,
    data: &[u8],
    attributes: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    ordering_key: &str,
) -> Result<usize, Status> {
    let attribute_count = attributes.len();
    if attribute_count > ATTRIBUTES_COUNT_MAX {
        return Err(Status::invalid_argument(format!(
            "message {index} has {attribute_count} attributes; the limit is {ATTRIBUTES_COUNT_MAX} (ATTRIBUTES_COUNT_MAX)"
        )));
    }
    let mut size = data.len() + ordering_key.len();
    for (key, value) in attributes {
        if key.is_empty() {
            return Err(Status::invalid_argument(format!(
                "message {index} has an attribute with an empty key"
            )));
        }
        if key.len() > ATTRIBUTE_KEY_BYTES_MAX {
            return Err(Status::invalid_argument(format!(
                "message {index} has an attribute key of {} bytes; the limit is {ATTRIBUTE_KEY_BYTES_MAX} (ATTRIBUTE_KEY_BYTES_MAX)",
                key.len()
            )));
        }
        if value.len() > ATTRIBUTE_VALUE_BYTES_MAX {
            return Err(Status::invalid_argument(format!(
                "message {index} attribute '{}' has a value of {} bytes; the limit is {ATTRIBUTE_VALUE_BYTES_MAX} (ATTRIBUTE_VALUE_BYTES_MAX)",
                shorten(key),
                value.len()
            )));
        }
        size += key.len() + value.len();
    }
    if data.is_empty() && attribute_count == 0 {
        return Err(Status::invalid_argument(format!(
            "message {index} is empty: a message needs data or at least one attribute"
        )));
    }
    if ordering_key.len() > ORDERING_KEY_BYTES_MAX {
        return Err(Status::invalid_argument(format!(
            "message {index} has an ordering key of {} bytes; the limit is {ORDERING_KEY_BYTES_MAX} (ORDERING_KEY_BYTES_MAX)",
            ordering_key.len()
        )));
    }
    if size > MESSAGE_BYTES_MAX {
        return Err(Status::invalid_argument(format!(
            "message {index} is {size} bytes; the limit is {MESSAGE_BYTES_MAX} (MESSAGE_BYTES_MAX)"
        )));
    }
    Ok(size)
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

/// Checks a subscription's ack deadline; 0 stands for the default.
pub fn effective_ack_deadline_seconds(requested: u32) -> Result<u32, Status> {
    match requested {
        0 => Ok(ACK_DEADLINE_SECONDS_DEFAULT),
        ACK_DEADLINE_SECONDS_MIN..=ACK_DEADLINE_SECONDS_MAX => Ok(requested),
        _ => Err(Status::invalid_argument(format!(
            "ack deadline of {requested} s is outside {ACK_DEADLINE_SECONDS_MIN} to {ACK_DEADLINE_SECONDS_MAX} s (ACK_DEADLINE_SECONDS_MIN, ACK_DEADLINE_SECONDS_MAX)"
        ))),
    }
}

/// Checks a retention duration; 0 stands for the default.
pub fn effective_retention_seconds(requested: u64) -> Result<u64, Status> {
    match requested {
        0 => Ok(RETENTION_SECONDS_DEFAULT),
        RETENTION_SECONDS_MIN..=RETENTION_SECONDS_MAX => Ok(requested),
        _ => Err(Status::invalid_argument(format!(
            "message retention of {requested} s is outside {RETENTION_SECONDS_MIN} to {RETENTION_SECONDS_MAX} s (10 minutes to 31 days; RETENTION_SECONDS_MIN, RETENTION_SECONDS_MAX)"
        ))),
    }
}

//! What one push request carries: its body and headers, built from a delivered message as
//! Pub/Sub builds them, without I/O.
//!
//! Wrapped (the default), the body is Pub/Sub's JSON envelope:
//!
//! ```text
//! {"message":{"attributes":{"k":"v"},"data":"aGk=","messageId":"7","message_id":"7",
//!   "publishTime":"2026-12-06T10:00:00.123Z","publish_time":"2026-12-06T10:00:00.123Z",
//!   "orderingKey":"o"},"subscription":"projects/p/subscriptions/s","deliveryAttempt":2}
//! ```
//!
//! where `p` is the project the push configuration was set in (`PushConfig::project`): a daemon
//! is one namespace (see `protocol::grpc::names`), but a receiver written for Pub/Sub routes by
//! that name, or refuses another.
//!
//! with `orderingKey` only when the message has one, and `deliveryAttempt` only where the
//! subscription has a dead-letter policy (Pub/Sub counts attempts only there). Unwrapped
//! (`no_wrapper`), the body is the message's data as published; with `write_metadata`, its
//! attributes are headers by their own names, and its metadata the `x-goog-pubsub-*` headers.
//!
//! A push config's `attributes` (`x-goog-version`) choose among Pub/Sub's historical envelope
//! versions; the envelope above is `v1` and `v1beta2`'s, the one every current receiver reads,
//! and is sent whatever the attribute says (it is kept and shown as given).

use crate::catalog::{PushConfig, PushWrapper};
use crate::logging::{push_json_string, utc_text};

/// A delivered message, as a push request reads it.
pub struct PushedMessage<'a, A> {
    pub message_id: u64,
    pub publish_time_ms: u64,
    pub data: &'a [u8],
    pub ordering_key: &'a str,
    pub attributes: A,
    /// The delivery attempt, where the subscription counts them (a dead-letter policy).
    pub delivery_attempt: Option<u32>,
}

/// A push request's body, its content type and its headers beyond those.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushBody {
    pub content_type: &'static str,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// The request that pushes `message` of subscription `subscription` (Ringpost's name) to an
/// endpoint configured as `config`.
pub fn push_body<'a, A>(config: &PushConfig, subscription: &str, message: PushedMessage<'a, A>) -> PushBody
where
    A: Iterator<Item = (&'a str, &'a str)>,
{
    match config.wrapper {
        PushWrapper::Pubsub => PushBody {
            content_type: "application/json",
            headers: Vec::new(),
            body: wrapped(&config.project, subscription, message).into_bytes(),
        },
        PushWrapper::NoWrapper { write_metadata } => {
            let headers = if write_metadata {
                metadata_headers(&config.project, subscription, &message)
            } else {
                Vec::new()
            };
            let attributes: Vec<(String, String)> = match write_metadata {
                true => message
                    .attributes
                    .filter(|(key, value)| is_header_name(key) && is_header_value(value))
                    .map(|(key, value)| (key.to_ascii_lowercase(), value.to_owned()))
                    .collect(),
                false => Vec::new(),
            };
            PushBody {
                content_type: "application/octet-stream",
                headers: headers.into_iter().chain(attributes).collect(),
                body: message.data.to_vec(),
            }
        }
    }
}

/// `projects/{project}/subscriptions/{subscription}`.
pub fn subscription_path(project: &str, subscription: &str) -> String {
    format!("projects/{project}/subscriptions/{subscription}")
}

/// Pub/Sub's JSON envelope, written by hand as the daemon's JSON log lines are.
fn wrapped<'a, A: Iterator<Item = (&'a str, &'a str)>>(
    project: &str,
    subscription: &str,
    message: PushedMessage<'a, A>,
) -> String {
    let mut json = String::with_capacity(message.data.len() * 4 / 3 + 256);
    json.push_str("{\"message\":{\"attributes\":{");
    for (index, (key, value)) in message.attributes.enumerate() {
        if index > 0 {
            json.push(',');
        }
        push_json_string(&mut json, key);
        json.push(':');
        push_json_string(&mut json, value);
    }
    json.push_str("},\"data\":\"");
    push_base64(&mut json, message.data);
    let id = message.message_id.to_string();
    let time = utc_text(message.publish_time_ms);
    for (name, value) in
        [("messageId", &id), ("message_id", &id), ("publishTime", &time), ("publish_time", &time)]
    {
        json.push_str("\",\"");
        json.push_str(name);
        json.push_str("\":\"");
        json.push_str(value);
    }
    json.push('"');
    if !message.ordering_key.is_empty() {
        json.push_str(",\"orderingKey\":");
        push_json_string(&mut json, message.ordering_key);
    }
    json.push_str("},\"subscription\":");
    push_json_string(&mut json, &subscription_path(project, subscription));
    if let Some(attempt) = message.delivery_attempt {
        json.push_str(",\"deliveryAttempt\":");
        json.push_str(&attempt.to_string());
    }
    json.push('}');
    json
}

/// Pub/Sub's metadata headers of an unwrapped request with `write_metadata`.
fn metadata_headers<A>(
    project: &str,
    subscription: &str,
    message: &PushedMessage<'_, A>,
) -> Vec<(String, String)> {
    let mut headers = vec![
        ("x-goog-pubsub-subscription-name".to_owned(), subscription_path(project, subscription)),
        ("x-goog-pubsub-message-id".to_owned(), message.message_id.to_string()),
        ("x-goog-pubsub-publish-time".to_owned(), utc_text(message.publish_time_ms)),
    ];
    if !message.ordering_key.is_empty() && is_header_value(message.ordering_key) {
        headers.push(("x-goog-pubsub-ordering-key".to_owned(), message.ordering_key.to_owned()));
    }
    if let Some(attempt) = message.delivery_attempt {
        headers.push(("x-goog-pubsub-delivery-attempt".to_owned(), attempt.to_string()));
    }
    headers
}

/// Whether `name` is an HTTP header name (RFC 9110's token): an attribute that is not cannot
/// be a header, and is left out of an unwrapped request rather than failing it.
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte))
}

/// Whether `value` can be an HTTP header's value: visible ASCII, spaces and tabs.
fn is_header_value(value: &str) -> bool {
    value.bytes().all(|byte| byte == b'\t' || (b' '..=b'~').contains(&byte))
}

/// Appends `bytes` in standard base64 with padding (RFC 4648 §4), as Pub/Sub's `data` is.
fn push_base64(out: &mut String, bytes: &[u8]) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for chunk in bytes.chunks(3) {
        let triple = (chunk[0] as u32) << 16
            | (chunk.get(1).copied().unwrap_or(0) as u32) << 8
            | chunk.get(2).copied().unwrap_or(0) as u32;
        for index in 0..4 {
            if index <= chunk.len() {
                out.push(ALPHABET[(triple >> (18 - 6 * index) & 0x3f) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Labels, PUSH_PROJECT_DEFAULT};

    fn config(wrapper: PushWrapper) -> PushConfig {
        PushConfig {
            endpoint: "http://127.0.0.1:9/push".into(),
            attributes: Labels::new(),
            wrapper,
            oidc_token: None,
            project: "my-proj".into(),
        }
    }

    fn message<'a>(
        attributes: &'a [(&'a str, &'a str)],
        ordering_key: &'a str,
        delivery_attempt: Option<u32>,
    ) -> PushedMessage<'a, impl Iterator<Item = (&'a str, &'a str)>> {
        PushedMessage {
            message_id: 7,
            // 2026-12-06T10:00:00.123Z
            publish_time_ms: 1_796_551_200_123,
            data: b"hello \"world\"",
            ordering_key,
            attributes: attributes.iter().copied(),
            delivery_attempt,
        }
    }

    #[test]
    fn base64_is_rfc_4648s_with_padding() {
        for (bytes, text) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"fooba", "Zm9vYmE="),
            (b"foobar", "Zm9vYmFy"),
            (&[0xfb, 0xff, 0xfe], "+//+"),
        ] {
            let mut out = String::new();
            push_base64(&mut out, bytes);
            assert_eq!(out, text, "{bytes:?}");
        }
    }

    #[test]
    fn a_wrapped_body_is_pubsubs_envelope_field_for_field() {
        let attributes = [("colour", "red"), ("quote", "a\"b")];
        let body = push_body(&config(PushWrapper::Pubsub), "orders", message(&attributes, "", None));
        assert_eq!(body.content_type, "application/json");
        assert!(body.headers.is_empty());
        assert_eq!(
            String::from_utf8(body.body).unwrap(),
            "{\"message\":{\"attributes\":{\"colour\":\"red\",\"quote\":\"a\\\"b\"},\
             \"data\":\"aGVsbG8gIndvcmxkIg==\",\"messageId\":\"7\",\"message_id\":\"7\",\
             \"publishTime\":\"2026-12-06T10:00:00.123Z\",\"publish_time\":\"2026-12-06T10:00:00.123Z\"},\
             \"subscription\":\"projects/my-proj/subscriptions/orders\"}"
        );
    }

    #[test]
    fn a_wrapped_body_names_its_ordering_key_and_attempt_only_when_there_are_any() {
        let body = push_body(&config(PushWrapper::Pubsub), "orders", message(&[], "key\n1", Some(3)));
        assert_eq!(
            String::from_utf8(body.body).unwrap(),
            "{\"message\":{\"attributes\":{},\"data\":\"aGVsbG8gIndvcmxkIg==\",\"messageId\":\"7\",\
             \"message_id\":\"7\",\"publishTime\":\"2026-12-06T10:00:00.123Z\",\
             \"publish_time\":\"2026-12-06T10:00:00.123Z\",\"orderingKey\":\"key\\n1\"},\
             \"subscription\":\"projects/my-proj/subscriptions/orders\",\"deliveryAttempt\":3}"
        );
    }

    #[test]
    fn an_unwrapped_body_is_the_data_alone_without_metadata() {
        let attributes = [("colour", "red")];
        let wrapper = PushWrapper::NoWrapper { write_metadata: false };
        let body = push_body(&config(wrapper), "orders", message(&attributes, "k", Some(2)));
        assert_eq!(body.body, b"hello \"world\"");
        assert_eq!(body.content_type, "application/octet-stream");
        assert!(body.headers.is_empty());
    }

    #[test]
    fn an_unwrapped_body_with_metadata_carries_it_in_headers() {
        let attributes = [("Colour", "red"), ("not a header", "x"), ("bad-value", "a\nb")];
        let wrapper = PushWrapper::NoWrapper { write_metadata: true };
        let body = push_body(&config(wrapper), "orders", message(&attributes, "k", Some(2)));
        assert_eq!(body.body, b"hello \"world\"");
        let headers: Vec<(&str, &str)> =
            body.headers.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
        assert_eq!(
            headers,
            [
                ("x-goog-pubsub-subscription-name", "projects/my-proj/subscriptions/orders"),
                ("x-goog-pubsub-message-id", "7"),
                ("x-goog-pubsub-publish-time", "2026-12-06T10:00:00.123Z"),
                ("x-goog-pubsub-ordering-key", "k"),
                ("x-goog-pubsub-delivery-attempt", "2"),
                ("colour", "red"),
            ]
        );
        // Without an ordering key or a dead-letter policy, neither header.
        let body = push_body(&config(wrapper), "orders", message(&[], "", None));
        let names: Vec<&str> = body.headers.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            names,
            ["x-goog-pubsub-subscription-name", "x-goog-pubsub-message-id", "x-goog-pubsub-publish-time"]
        );
    }

    /// Without a project given (the native protocol, the CLI, configurations stored before the
    /// project was kept), the requests name the default one, as they did before.
    #[test]
    fn a_configuration_without_a_project_names_the_default_one() {
        let default =
            PushConfig { wrapper: PushWrapper::NoWrapper { write_metadata: true }, ..Default::default() };
        assert_eq!(default.project, PUSH_PROJECT_DEFAULT);
        let body = push_body(&default, "orders", message(&[], "", None));
        assert_eq!(
            body.headers[0],
            ("x-goog-pubsub-subscription-name".into(), "projects/ringpost/subscriptions/orders".into())
        );
        let body = push_body(&PushConfig::default(), "orders", message(&[], "", None));
        assert!(String::from_utf8(body.body)
            .unwrap()
            .contains("\"subscription\":\"projects/ringpost/subscriptions/orders\""));
    }
}

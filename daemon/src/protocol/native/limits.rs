//! The wire crate's limits are the domain's (`api::limits`): the client checks its requests
//! with the wire's table, the daemon with the domain's, so the two are asserted equal here, at
//! compile time, and the checks made with them are tested to give the same answers.

use crate::api::limits as domain;
use crate::subscription::budget::PULL_RESPONSE_BYTES_MAX;
use ringpost_wire::limits as wire;

const _: () = assert!(wire::MESSAGE_BYTES_MAX == domain::MESSAGE_BYTES_MAX);
const _: () = assert!(wire::PUBLISH_REQUEST_BYTES_MAX == domain::PUBLISH_REQUEST_BYTES_MAX);
const _: () = assert!(wire::PUBLISH_BATCH_MESSAGES_MAX == domain::PUBLISH_BATCH_MESSAGES_MAX);
const _: () = assert!(wire::ATTRIBUTES_COUNT_MAX == domain::ATTRIBUTES_COUNT_MAX);
const _: () = assert!(wire::ATTRIBUTE_KEY_BYTES_MAX == domain::ATTRIBUTE_KEY_BYTES_MAX);
const _: () = assert!(wire::ATTRIBUTE_VALUE_BYTES_MAX == domain::ATTRIBUTE_VALUE_BYTES_MAX);
const _: () = assert!(wire::ORDERING_KEY_BYTES_MAX == domain::ORDERING_KEY_BYTES_MAX);
const _: () = assert!(wire::NAME_BYTES_MIN == domain::NAME_BYTES_MIN);
const _: () = assert!(wire::NAME_BYTES_MAX == domain::NAME_BYTES_MAX);
const _: () = assert!(wire::FILTER_BYTES_MAX == domain::FILTER_BYTES_MAX);
const _: () = assert!(wire::PULL_MESSAGES_MAX == domain::PULL_MESSAGES_MAX);
const _: () = assert!(wire::PULL_WAIT_MS_MAX == domain::PULL_WAIT_MS_MAX);
const _: () = assert!(wire::ACK_IDS_PER_REQUEST_MAX == domain::ACK_IDS_PER_REQUEST_MAX);
const _: () = assert!(wire::ACK_ID_BYTES_MAX == domain::ACK_ID_BYTES_MAX);
const _: () = assert!(wire::LIST_PAGE_SIZE_MAX == domain::LIST_PAGE_SIZE_MAX);
const _: () = assert!(wire::LIST_PAGE_SIZE_DEFAULT == domain::LIST_PAGE_SIZE_DEFAULT);
const _: () = assert!(wire::ACK_DEADLINE_SECONDS_DEFAULT == domain::ACK_DEADLINE_SECONDS_DEFAULT);
const _: () = assert!(wire::ACK_DEADLINE_SECONDS_MIN == domain::ACK_DEADLINE_SECONDS_MIN);
const _: () = assert!(wire::ACK_DEADLINE_SECONDS_MAX == domain::ACK_DEADLINE_SECONDS_MAX);
const _: () = assert!(wire::MODIFY_ACK_DEADLINE_SECONDS_MAX == domain::MODIFY_ACK_DEADLINE_SECONDS_MAX);
const _: () = assert!(wire::RETENTION_SECONDS_DEFAULT == domain::RETENTION_SECONDS_DEFAULT);
const _: () = assert!(wire::RETENTION_SECONDS_MIN == domain::RETENTION_SECONDS_MIN);
const _: () = assert!(wire::RETENTION_SECONDS_MAX == domain::RETENTION_SECONDS_MAX);
const _: () = assert!(wire::EXPIRATION_TTL_SECONDS_DEFAULT == domain::EXPIRATION_TTL_SECONDS_DEFAULT);
const _: () = assert!(wire::EXPIRATION_TTL_SECONDS_MIN == domain::EXPIRATION_TTL_SECONDS_MIN);
const _: () = assert!(wire::MAX_DELIVERY_ATTEMPTS_DEFAULT == domain::MAX_DELIVERY_ATTEMPTS_DEFAULT);
const _: () = assert!(wire::MAX_DELIVERY_ATTEMPTS_MIN == domain::MAX_DELIVERY_ATTEMPTS_MIN);
const _: () = assert!(wire::MAX_DELIVERY_ATTEMPTS_MAX == domain::MAX_DELIVERY_ATTEMPTS_MAX);
const _: () = assert!(wire::BACKOFF_SECONDS_MINIMUM_DEFAULT == domain::BACKOFF_SECONDS_MINIMUM_DEFAULT);
const _: () = assert!(wire::BACKOFF_SECONDS_MAXIMUM_DEFAULT == domain::BACKOFF_SECONDS_MAXIMUM_DEFAULT);
const _: () = assert!(wire::BACKOFF_SECONDS_MAX == domain::BACKOFF_SECONDS_MAX);

/// A pull response's messages and the envelope of the largest single message fit one frame.
const _: () = assert!(PULL_RESPONSE_BYTES_MAX + 2 * 1024 * 1024 <= wire::FRAME_BODY_BYTES_MAX);

#[cfg(test)]
mod tests {
    use crate::api::validate as domain;
    use crate::api::Status;
    use ringpost_wire::validate as wire;

    /// The same answer, refusals' codes and messages included.
    fn same<T: PartialEq + std::fmt::Debug>(
        domain: Result<T, Status>,
        wire: Result<T, ringpost_wire::Status>,
    ) {
        assert_eq!(domain, wire.map_err(Status::from));
    }

    #[test]
    fn the_domains_checks_answer_as_the_wires() {
        let long = "a".repeat(300);
        for name in ["orders", "ab", long.as_str(), "9lives", "has space", "goog-x", "Orders.v2~+%", ""] {
            same(domain::validate_name("topic", name), wire::validate_name("topic", name));
        }
        let big_value = "v".repeat(2000);
        let big_key = "k".repeat(300);
        let attributes: [&[(&str, &str)]; 5] = [
            &[],
            &[("key", "value")],
            &[("", "v")],
            &[("key", big_value.as_str())],
            &[(big_key.as_str(), "v")],
        ];
        let long_key = "o".repeat(2000);
        for data in [&b""[..], b"data"] {
            for attributes in attributes {
                for ordering_key in ["", "key", long_key.as_str()] {
                    same(
                        domain::validate_message(3, data, attributes.iter().copied(), ordering_key),
                        wire::validate_message(3, data, attributes.iter().copied(), ordering_key),
                    );
                }
            }
        }
        for seconds in [0, 5, 10, 600, 601] {
            same(
                domain::effective_ack_deadline_seconds(seconds),
                wire::effective_ack_deadline_seconds(seconds),
            );
        }
        for seconds in [0, 5, 600, 7 * 24 * 3600, 31 * 24 * 3600, 31 * 24 * 3600 + 1] {
            same(domain::effective_retention_seconds(seconds), wire::effective_retention_seconds(seconds));
            same(domain::topic_retention_seconds(seconds), wire::topic_retention_seconds(seconds));
            same(
                domain::effective_expiration_ttl_seconds(seconds),
                wire::effective_expiration_ttl_seconds(seconds),
            );
        }
        for topic in ["", "dead", "-bad"] {
            for attempts in [0, 4, 5, 100, 101] {
                same(
                    domain::effective_max_delivery_attempts(topic, attempts),
                    wire::effective_max_delivery_attempts(topic, attempts),
                );
            }
        }
        for (minimum, maximum) in [(0, 0), (5, 0), (0, 60), (0, 5), (30, 20), (601, 0), (10, 600)] {
            same(
                domain::effective_retry_backoff_seconds(minimum, maximum),
                wire::effective_retry_backoff_seconds(minimum, maximum),
            );
        }
    }
}

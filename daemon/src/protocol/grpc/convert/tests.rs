use super::*;
use crate::api::Code;

fn refusal<T: std::fmt::Debug>(result: Result<T, Status>) -> String {
    let status = result.expect_err("should be refused");
    assert_eq!(status.code, Code::InvalidArgument, "{status:?}");
    status.message
}

fn seconds(seconds: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration { seconds, nanos: 0 })
}

fn mask(paths: &[&str]) -> Option<prost_types::FieldMask> {
    Some(prost_types::FieldMask { paths: paths.iter().map(|path| path.to_string()).collect() })
}

#[test]
fn durations_and_timestamps_map_both_ways() {
    assert_eq!(duration_seconds("d", None), Ok(0));
    assert_eq!(duration_seconds("d", seconds(600).as_ref()), Ok(600));
    assert!(refusal(duration_seconds("retry", seconds(-1).as_ref())).contains("retry"));
    assert_eq!(duration(0), None);
    assert_eq!(duration(7), seconds(7));
    let time = timestamp(1_700_000_000_123);
    assert_eq!(time, prost_types::Timestamp { seconds: 1_700_000_000, nanos: 123_000_000 });
    assert_eq!(timestamp_ms("time", &time), Ok(1_700_000_000_123));
    assert!(refusal(timestamp_ms("time", &prost_types::Timestamp { seconds: -5, nanos: 0 })).contains("time"));
    // Nanoseconds beyond a second, or negative, are refused as protobuf's types define them.
    for nanos in [1_000_000_000, 2_000_000_000, -1] {
        let refused = refusal(timestamp_ms("time", &prost_types::Timestamp { seconds: 5, nanos }));
        assert!(refused.contains("time.nanos"), "{refused}");
    }
    assert_eq!(timestamp_ms("t", &prost_types::Timestamp { seconds: 1, nanos: 999_999_999 }), Ok(1_999));
    assert!(refusal(timestamp_ms(
        "t",
        &prost_types::Timestamp { seconds: TIMESTAMP_SECONDS_MAX + 1, nanos: 0 }
    ))
    .contains("9999"));
    let too_many = prost_types::Duration { seconds: 5, nanos: 1_000_000_000 };
    assert!(refusal(duration_seconds("ttl", Some(&too_many))).contains("ttl.nanos"));
}

#[test]
fn a_topic_maps_in_and_out_and_unsupported_fields_are_refused_by_name() {
    let topic = pubsub::Topic {
        name: "projects/p/topics/orders".into(),
        labels: [("team".to_owned(), "core".to_owned())].into(),
        message_retention_duration: seconds(3600),
        state: 1,
        satisfies_pzs: true,
        ..Default::default()
    };
    let (name, request) = topic_in(&topic).unwrap();
    assert_eq!(name.project, "p");
    assert_eq!(request.name, "orders");
    assert_eq!(request.message_retention_seconds, 3600);
    assert_eq!(request.labels.get("team").map(String::as_str), Some("core"));
    let shown = topic_out("q", request);
    assert_eq!(shown.name, "projects/q/topics/orders");
    assert_eq!(shown.message_retention_duration, seconds(3600));
    assert_eq!(shown.labels, topic.labels);

    let refused = |topic: pubsub::Topic| {
        refusal(topic_in(&pubsub::Topic { name: "projects/p/topics/orders".into(), ..topic }))
    };
    let storage =
        pubsub::MessageStoragePolicy { allowed_persistence_regions: vec!["eu".into()], ..Default::default() };
    for (field, topic) in [
        ("kms_key_name", pubsub::Topic { kms_key_name: "k".into(), ..Default::default() }),
        (
            "message_storage_policy",
            pubsub::Topic { message_storage_policy: Some(storage), ..Default::default() },
        ),
        (
            "ingestion_data_source_settings",
            pubsub::Topic { ingestion_data_source_settings: Some(Default::default()), ..Default::default() },
        ),
        (
            "message_transforms",
            pubsub::Topic { message_transforms: vec![Default::default()], ..Default::default() },
        ),
    ] {
        let message = refused(topic);
        assert!(message.contains(field) && message.contains("not supported"), "{field}: {message}");
    }
    // An empty storage policy asks for nothing.
    let empty_policy = pubsub::Topic {
        name: "projects/p/topics/orders".into(),
        message_storage_policy: Some(Default::default()),
        ..Default::default()
    };
    assert!(topic_in(&empty_policy).is_ok());
    assert!(refused(pubsub::Topic { message_retention_duration: seconds(5), ..Default::default() })
        .contains("RETENTION_SECONDS_MIN"));
}

fn subscription() -> pubsub::Subscription {
    pubsub::Subscription {
        name: "projects/p/subscriptions/audit".into(),
        topic: "projects/p/topics/orders".into(),
        ..Default::default()
    }
}

#[test]
fn a_subscription_maps_in_with_ringpost_names_and_out_with_the_projects() {
    let full = pubsub::Subscription {
        ack_deadline_seconds: 30,
        retain_acked_messages: true,
        message_retention_duration: seconds(7200),
        labels: [("env".to_owned(), "test".to_owned())].into(),
        enable_message_ordering: true,
        filter: "attributes.kind = \"a\"".into(),
        dead_letter_policy: Some(pubsub::DeadLetterPolicy {
            dead_letter_topic: "projects/p/topics/dead".into(),
            max_delivery_attempts: 7,
        }),
        retry_policy: Some(pubsub::RetryPolicy { minimum_backoff: seconds(5), maximum_backoff: None }),
        enable_exactly_once_delivery: true,
        push_config: Some(pubsub::PushConfig::default()),
        state: 2,
        ..subscription()
    };
    let (name, request) = subscription_in(&full).unwrap();
    assert_eq!(
        (name.project.as_str(), request.name.as_str(), request.topic.as_str()),
        ("p", "audit", "orders")
    );
    let settings = &request.settings;
    assert_eq!(settings.ack_deadline_seconds, 30);
    assert_eq!(settings.message_retention_seconds, 7200);
    assert_eq!((settings.dead_letter_topic.as_str(), settings.max_delivery_attempts), ("dead", 7));
    assert_eq!((settings.minimum_backoff_seconds, settings.maximum_backoff_seconds), (5, 600));
    assert_eq!(settings.expiration_ttl_seconds, 31 * 24 * 3600, "absent: the default");
    assert!(
        settings.enable_exactly_once_delivery
            && settings.enable_message_ordering
            && settings.retain_acked_messages
    );

    let shown = subscription_out("q", request, 600);
    assert_eq!(shown.name, "projects/q/subscriptions/audit");
    assert_eq!(shown.topic, "projects/q/topics/orders");
    assert_eq!(shown.dead_letter_policy.unwrap().dead_letter_topic, "projects/q/topics/dead");
    assert_eq!(shown.topic_message_retention_duration, seconds(600));
    assert_eq!(shown.expiration_policy.unwrap().ttl, seconds(31 * 24 * 3600));
    assert_eq!(shown.labels, full.labels);
    assert_eq!(shown.filter, full.filter);

    // An expiration policy without a ttl never expires, and says so on the way out.
    let never = pubsub::Subscription { expiration_policy: Some(Default::default()), ..subscription() };
    let (_, request) = subscription_in(&never).unwrap();
    assert_eq!(request.settings.expiration_ttl_seconds, EXPIRATION_TTL_SECONDS_NEVER);
    assert_eq!(subscription_out("p", request, 0).expiration_policy.unwrap().ttl, None);
    let deleted = Subscription { topic: DELETED_TOPIC.into(), ..Default::default() };
    assert_eq!(subscription_out("p", deleted, 0).topic, "_deleted-topic_");
}

/// Every shape of Pub/Sub's push configuration maps in and back out as it was given (the
/// default wrapper shown unset); one without an endpoint is a pull subscription's.
#[test]
fn push_configurations_map_in_and_out() {
    use pubsub::push_config::{AuthenticationMethod, NoWrapper, OidcToken, Wrapper};
    let token = OidcToken { service_account_email: "pusher@p.iam.example".into(), audience: "aud".into() };
    for config in [
        pubsub::PushConfig { push_endpoint: "https://example.com/push".into(), ..Default::default() },
        pubsub::PushConfig {
            push_endpoint: "http://localhost:8080/".into(),
            attributes: [("x-goog-version".to_owned(), "v1".to_owned())].into(),
            authentication_method: Some(AuthenticationMethod::OidcToken(token.clone())),
            wrapper: Some(Wrapper::NoWrapper(NoWrapper { write_metadata: true })),
        },
        pubsub::PushConfig {
            push_endpoint: "https://example.com/push".into(),
            wrapper: Some(Wrapper::NoWrapper(NoWrapper { write_metadata: false })),
            ..Default::default()
        },
    ] {
        let asked = pubsub::Subscription { push_config: Some(config.clone()), ..subscription() };
        let (_, request) = subscription_in(&asked).unwrap();
        assert_eq!(request.settings.push.as_ref().unwrap().endpoint, config.push_endpoint);
        // The requests name the subscription in the project the request named it in.
        assert_eq!(request.settings.push.as_ref().unwrap().project, "p");
        assert_eq!(subscription_out("p", request, 0).push_config, Some(config));
    }
    let wrapped = pubsub::PushConfig {
        push_endpoint: "https://example.com/push".into(),
        wrapper: Some(Wrapper::PubsubWrapper(Default::default())),
        ..Default::default()
    };
    assert_eq!(push_config_in(Some(&wrapped), "p").unwrap().wrapper, crate::catalog::PushWrapper::Pubsub);
    let without_endpoint = pubsub::PushConfig {
        authentication_method: Some(AuthenticationMethod::OidcToken(token)),
        ..Default::default()
    };
    assert_eq!(push_config_in(Some(&without_endpoint), "p"), None);
    assert_eq!(push_config_in(None, "p"), None);
    let pull = subscription_in(&subscription()).unwrap().1;
    assert_eq!(subscription_out("p", pull, 0).push_config, Some(pubsub::PushConfig::default()));
}

#[test]
fn a_subscriptions_unsupported_fields_and_bad_values_are_refused_by_name() {
    for (field, refused) in [
        (
            "bigquery_config",
            pubsub::Subscription { bigquery_config: Some(Default::default()), ..subscription() },
        ),
        (
            "cloud_storage_config",
            pubsub::Subscription { cloud_storage_config: Some(Default::default()), ..subscription() },
        ),
        (
            "bigtable_config",
            pubsub::Subscription { bigtable_config: Some(Default::default()), ..subscription() },
        ),
        ("detached", pubsub::Subscription { detached: true, ..subscription() }),
        (
            "message_transforms",
            pubsub::Subscription { message_transforms: vec![Default::default()], ..subscription() },
        ),
        ("ack_deadline_seconds", pubsub::Subscription { ack_deadline_seconds: -1, ..subscription() }),
        (
            "dead_letter_topic",
            pubsub::Subscription {
                dead_letter_policy: Some(pubsub::DeadLetterPolicy {
                    dead_letter_topic: "dead".into(),
                    max_delivery_attempts: 5,
                }),
                ..subscription()
            },
        ),
        (
            "expiration_policy.ttl",
            pubsub::Subscription {
                expiration_policy: Some(pubsub::ExpirationPolicy { ttl: seconds(0) }),
                ..subscription()
            },
        ),
        ("topic", pubsub::Subscription { topic: "orders".into(), ..subscription() }),
        ("name", pubsub::Subscription { name: "projects/p/topics/audit".into(), ..subscription() }),
    ] {
        let message = refusal(subscription_in(&refused));
        assert!(message.contains(field), "{field}: {message}");
    }
}

#[test]
fn update_masks_name_what_changes_and_refuse_the_rest_by_name() {
    let request = |subscription: pubsub::Subscription, paths: &[&str]| pubsub::UpdateSubscriptionRequest {
        subscription: Some(subscription),
        update_mask: mask(paths),
    };
    let changed = pubsub::Subscription {
        ack_deadline_seconds: 60,
        labels: [("a".to_owned(), "b".to_owned())].into(),
        enable_exactly_once_delivery: true,
        ..subscription()
    };
    let (_, update) = subscription_update_in(&request(
        changed.clone(),
        &["ack_deadline_seconds", "labels", "enable_exactly_once_delivery"],
    ))
    .unwrap();
    assert_eq!(update.name, "audit");
    assert_eq!(update.ack_deadline_seconds, Some(60));
    assert_eq!(update.labels.unwrap().len(), 1);
    assert_eq!(update.enable_exactly_once_delivery, Some(true));
    assert_eq!(update.retain_acked_messages, None, "only what the mask names");
    let (_, update) =
        subscription_update_in(&request(subscription(), &["dead_letter_policy", "retry_policy"])).unwrap();
    assert_eq!(update.dead_letter_policy, Some((String::new(), 0)), "absent: the policy is removed");
    assert_eq!(update.retry_policy, Some((0, 0)));

    assert!(
        refusal(subscription_update_in(&request(subscription(), &[]))).contains("update_mask is required")
    );
    let absent = pubsub::UpdateSubscriptionRequest { subscription: Some(subscription()), update_mask: None };
    assert!(refusal(subscription_update_in(&absent)).contains("update_mask is required"));
    for path in ["filter", "enable_message_ordering", "topic", "name"] {
        let message = refusal(subscription_update_in(&request(subscription(), &["labels", path])));
        assert!(message.contains(&format!("'{path}'")) && message.contains("cannot be changed"), "{message}");
    }
    let pushing = pubsub::Subscription {
        push_config: Some(pubsub::PushConfig {
            push_endpoint: "http://localhost:1/".into(),
            ..Default::default()
        }),
        ..subscription()
    };
    let (_, update) = subscription_update_in(&request(pushing, &["push_config"])).unwrap();
    assert_eq!(update.push.unwrap().unwrap().endpoint, "http://localhost:1/");
    let (_, update) = subscription_update_in(&request(subscription(), &["push_config"])).unwrap();
    assert_eq!(update.push, Some(None), "absent or empty: the subscription pulls");
    let message = refusal(subscription_update_in(&request(subscription(), &["no_such_field"])));
    assert!(message.contains("'no_such_field'") && message.contains("retry_policy"), "{message}");
    let out_of_range = pubsub::Subscription { ack_deadline_seconds: 3, ..subscription() };
    assert!(refusal(subscription_update_in(&request(out_of_range.clone(), &["ack_deadline_seconds"])))
        .contains("ACK_DEADLINE_SECONDS_MIN"));
    assert!(
        subscription_update_in(&request(out_of_range, &["labels"])).is_ok(),
        "unnamed fields are not read"
    );

    let topic = |paths: &[&str]| pubsub::UpdateTopicRequest {
        topic: Some(pubsub::Topic { name: "projects/p/topics/orders".into(), ..Default::default() }),
        update_mask: mask(paths),
    };
    let (_, update) = topic_update_in(&topic(&["labels", "message_retention_duration"])).unwrap();
    assert_eq!((update.labels, update.message_retention_seconds), (Some(Labels::new()), Some(0)));
    assert!(refusal(topic_update_in(&topic(&[]))).contains("update_mask is required"));
    assert!(refusal(topic_update_in(&topic(&["name"]))).contains("cannot be changed"));
    assert!(refusal(topic_update_in(&topic(&["kms_key_name"]))).contains("kms_key_name is not supported"));

    let snapshot = |paths: &[&str]| pubsub::UpdateSnapshotRequest {
        snapshot: Some(pubsub::Snapshot { name: "projects/p/snapshots/snap-1".into(), ..Default::default() }),
        update_mask: mask(paths),
    };
    assert_eq!(snapshot_update_in(&snapshot(&["labels"])).unwrap().1, Some(Labels::new()));
    assert!(refusal(snapshot_update_in(&snapshot(&["expire_time"]))).contains("expire_time"));
    assert!(refusal(snapshot_update_in(&snapshot(&[]))).contains("update_mask is required"));
}

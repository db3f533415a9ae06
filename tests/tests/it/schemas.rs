//! Pub/Sub's schemas over the gRPC API, against the real daemon: Avro and Protocol Buffer
//! schemas created, revised, listed and rolled back; topics with schema settings, whose
//! publishes are checked against the revisions between their bounds (a refused publish stores
//! nothing of its request), whose messages carry the attributes Pub/Sub adds; all of it kept
//! across a restart.

use crate::grpc_admin::{grpc_daemon, refused};
use ringpost_tests::grpc::{project_path, pubsub, schema_path, topic_path, Grpc};
use tonic::Code;

const AVRO: &str = r#"{"type": "record", "name": "State", "namespace": "utilities",
    "fields": [
        {"name": "name", "type": "string"},
        {"name": "post_abbr", "type": "string"},
        {"name": "population", "type": ["null", "long"], "default": null}
    ]}"#;

/// The second revision: a record of one field.
const AVRO_COUNT: &str = r#"{"type": "record", "name": "Count", "fields": [{"name": "n", "type": "int"}]}"#;

const PROTOCOL_BUFFER: &str = r#"syntax = "proto3";
    message State {
      string name = 1;
      string post_abbr = 2;
      int64 population = 3;
    }"#;

/// `{"name": "AK", "post_abbr": "AK", "population": 5}` as an Avro binary datum of `AVRO`:
/// each string its zigzag length then its bytes, the union's branch 1 (long) then 5, zigzag.
const AVRO_BINARY: &[u8] = &[0x04, b'A', b'K', 0x04, b'A', b'K', 0x02, 0x0a];

/// `State { name: "Alaska", population: 5 }` as a Protocol Buffer binary message.
fn protocol_buffer_binary() -> Vec<u8> {
    [&[0x0a, 6][..], b"Alaska", &[0x18, 5]].concat()
}

fn create_schema(
    grpc: &Grpc,
    id: &str,
    schema_type: pubsub::schema::Type,
    definition: &str,
) -> pubsub::Schema {
    grpc.create_schema(pubsub::CreateSchemaRequest {
        parent: project_path(),
        schema: Some(pubsub::Schema {
            r#type: schema_type as i32,
            definition: definition.to_owned(),
            ..Default::default()
        }),
        schema_id: id.to_owned(),
    })
    .unwrap()
}

fn topic_with_schema(
    grpc: &Grpc,
    topic: &str,
    schema: &str,
    encoding: pubsub::Encoding,
    bounds: (&str, &str),
) -> Result<pubsub::Topic, tonic::Status> {
    grpc.create_topic(pubsub::Topic {
        name: topic_path(topic),
        schema_settings: Some(pubsub::SchemaSettings {
            schema: schema_path(schema),
            encoding: encoding as i32,
            first_revision_id: bounds.0.to_owned(),
            last_revision_id: bounds.1.to_owned(),
        }),
        ..Default::default()
    })
}

/// Publishes one request of `data`, each a message.
fn publish(grpc: &Grpc, topic: &str, data: &[&[u8]]) -> Result<Vec<String>, tonic::Status> {
    grpc.publish_data(topic, data)
}

/// What `subscription` holds now, acknowledged.
fn drain(grpc: &Grpc, subscription: &str) -> Vec<pubsub::PubsubMessage> {
    let received = grpc.pull_now(subscription, 100).unwrap();
    if !received.is_empty() {
        let ack_ids = received.iter().map(|message| message.ack_id.clone()).collect();
        let subscription = ringpost_tests::grpc::subscription_path(subscription);
        grpc.acknowledge(pubsub::AcknowledgeRequest { subscription, ack_ids }).unwrap();
    }
    received.into_iter().filter_map(|message| message.message).collect()
}

#[test]
fn schemas_check_publishes_in_both_encodings_within_revision_bounds_and_survive_a_restart() {
    let (mut daemon, grpc) = grpc_daemon("schemas");
    let avro = create_schema(&grpc, "states", pubsub::schema::Type::Avro, AVRO);
    assert_eq!(avro.name, schema_path("states"));
    assert_eq!(avro.revision_id.len(), 8, "{}", avro.revision_id);
    assert!(avro.revision_id.chars().all(|digit| digit.is_ascii_hexdigit()));
    assert!(avro.revision_create_time.is_some());
    let proto = create_schema(&grpc, "states-proto", pubsub::schema::Type::ProtocolBuffer, PROTOCOL_BUFFER);
    assert_eq!(proto.definition, PROTOCOL_BUFFER);

    // Definitions that are no schema, and a name taken, are refused.
    let bad = pubsub::CreateSchemaRequest {
        parent: project_path(),
        schema: Some(pubsub::Schema {
            r#type: 2,
            definition: "{\"type\": \"recrod\"}".into(),
            ..Default::default()
        }),
        schema_id: "broken".into(),
    };
    refused(grpc.create_schema(bad), Code::InvalidArgument, "an invalid Avro schema");
    let again = pubsub::CreateSchemaRequest {
        parent: project_path(),
        schema: Some(pubsub::Schema { r#type: 2, definition: AVRO.into(), ..Default::default() }),
        schema_id: "states".into(),
    };
    refused(grpc.create_schema(again), Code::AlreadyExists, "a schema's name taken");

    // A second revision; both listed, newest first; BASIC leaves the definition out.
    let second = grpc
        .commit_schema(pubsub::CommitSchemaRequest {
            name: schema_path("states"),
            schema: Some(pubsub::Schema { r#type: 2, definition: AVRO_COUNT.into(), ..Default::default() }),
        })
        .unwrap();
    assert_ne!(second.revision_id, avro.revision_id);
    let revisions = grpc
        .list_schema_revisions(pubsub::ListSchemaRevisionsRequest {
            name: schema_path("states"),
            view: pubsub::SchemaView::Full as i32,
            ..Default::default()
        })
        .unwrap();
    let ids: Vec<&str> = revisions.schemas.iter().map(|schema| schema.revision_id.as_str()).collect();
    assert_eq!(ids, [second.revision_id.as_str(), avro.revision_id.as_str()]);
    let listed = grpc
        .list_schemas(pubsub::ListSchemasRequest { parent: project_path(), ..Default::default() })
        .unwrap();
    assert_eq!(listed.schemas.len(), 2);
    assert!(listed.schemas.iter().all(|schema| schema.definition.is_empty()), "BASIC by default");
    let first = grpc
        .get_schema(pubsub::GetSchemaRequest {
            name: format!("{}@{}", schema_path("states"), avro.revision_id),
            view: pubsub::SchemaView::Full as i32,
        })
        .unwrap();
    assert_eq!(first.definition, AVRO);

    // Topics: Avro in JSON over every revision, Avro in binary from the first to the first,
    // Protocol Buffer in binary and in JSON.
    let json_topic =
        topic_with_schema(&grpc, "avro-json", "states", pubsub::Encoding::Json, ("", "")).unwrap();
    let settings = json_topic.schema_settings.clone().expect("the topic's schema settings");
    assert_eq!(settings.schema, schema_path("states"));
    assert_eq!(settings.encoding, pubsub::Encoding::Json as i32);
    let first_only = (avro.revision_id.as_str(), avro.revision_id.as_str());
    topic_with_schema(&grpc, "avro-binary", "states", pubsub::Encoding::Binary, first_only).unwrap();
    topic_with_schema(&grpc, "proto-binary", "states-proto", pubsub::Encoding::Binary, ("", "")).unwrap();
    topic_with_schema(&grpc, "proto-json", "states-proto", pubsub::Encoding::Json, ("", "")).unwrap();
    refused(
        topic_with_schema(&grpc, "unknown-schema", "nothing", pubsub::Encoding::Json, ("", "")),
        Code::NotFound,
        "a topic naming no schema",
    );
    refused(
        topic_with_schema(
            &grpc,
            "reversed",
            "states",
            pubsub::Encoding::Json,
            (&second.revision_id, &avro.revision_id),
        ),
        Code::InvalidArgument,
        "bounds in the wrong order",
    );
    assert!(
        !grpc.topic_names().unwrap().iter().any(|name| name.ends_with("/unknown-schema")),
        "nothing created"
    );
    for topic in ["avro-json", "avro-binary", "proto-binary", "proto-json"] {
        grpc.create_plain_subscription(topic, topic).unwrap();
    }
    let shown = grpc.get_topic(pubsub::GetTopicRequest { topic: topic_path("avro-binary") }).unwrap();
    assert_eq!(shown.schema_settings.unwrap().first_revision_id, avro.revision_id);

    // Valid messages, of either revision when both are in bounds.
    let state = br#"{"name": "Alaska", "post_abbr": "AK", "population": {"long": 733391}}"#;
    publish(&grpc, "avro-json", &[state, br#"{"n": 3}"#]).unwrap();
    publish(&grpc, "avro-binary", &[AVRO_BINARY]).unwrap();
    publish(&grpc, "proto-binary", &[&protocol_buffer_binary()]).unwrap();
    publish(&grpc, "proto-json", &[br#"{"name": "Alaska", "population": "5"}"#]).unwrap();

    // Invalid ones: the whole request refused, nothing of it stored.
    for (topic, data) in [
        ("avro-json", &[&state[..], br#"{"name": 3}"#][..]),
        ("avro-json", &[&b"not json"[..]][..]),
        ("avro-binary", &[&AVRO_BINARY[..5]][..]),
        ("avro-binary", &[&br#"{"name": "Alaska", "post_abbr": "AK"}"#[..]][..]),
        ("proto-binary", &[&[0x0a, 9, b'A'][..]][..]),
        ("proto-json", &[&br#"{"name": 3}"#[..]][..]),
    ] {
        let said = refused(publish(&grpc, topic, data), Code::InvalidArgument, topic);
        assert!(said.contains("Message failed schema validation"), "{topic}: {said}");
    }

    // What was delivered: the valid messages alone, each with Pub/Sub's attributes.
    let delivered = drain(&grpc, "avro-json");
    assert_eq!(delivered.len(), 2, "the refused publishes stored nothing");
    assert_eq!(delivered[0].attributes["googclient_schemaname"], schema_path("states"));
    assert_eq!(delivered[0].attributes["googclient_schemaencoding"], "JSON");
    assert_eq!(delivered[0].attributes["googclient_schemarevisionid"], avro.revision_id);
    assert_eq!(delivered[1].attributes["googclient_schemarevisionid"], second.revision_id);
    let delivered = drain(&grpc, "avro-binary");
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].attributes["googclient_schemaencoding"], "BINARY");
    assert_eq!(drain(&grpc, "proto-binary").len(), 1);
    assert_eq!(drain(&grpc, "proto-json").len(), 1);

    // The first revision alone: a message of the second is refused on that topic.
    refused(
        publish(&grpc, "avro-binary", &[&[0x06]]),
        Code::InvalidArgument,
        "the second revision, out of bounds",
    );

    // Across a restart: the schemas, their revisions and the topics' settings, still checked.
    daemon.restart();
    let grpc = Grpc::connect(&daemon.grpc_address.clone().expect("the gRPC API's address"));
    let revisions = grpc
        .list_schema_revisions(pubsub::ListSchemaRevisionsRequest {
            name: schema_path("states"),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(revisions.schemas.len(), 2);
    let shown = grpc.get_topic(pubsub::GetTopicRequest { topic: topic_path("avro-json") }).unwrap();
    assert_eq!(shown.schema_settings, Some(settings));
    refused(publish(&grpc, "avro-json", &[b"{}"]), Code::InvalidArgument, "checked after the restart");
    publish(&grpc, "avro-json", &[br#"{"n": 4}"#]).unwrap();
    assert_eq!(drain(&grpc, "avro-json").len(), 1);

    // A rollback is a new revision with an older one's definition; a revision is deleted, not
    // the last; a deleted schema leaves its topics' settings naming `_deleted-schema_`.
    let rolled = grpc
        .rollback_schema(pubsub::RollbackSchemaRequest {
            name: schema_path("states"),
            revision_id: avro.revision_id.clone(),
        })
        .unwrap();
    assert_eq!(rolled.definition, AVRO);
    assert_ne!(rolled.revision_id, avro.revision_id);
    let request = pubsub::DeleteSchemaRevisionRequest {
        name: format!("{}@{}", schema_path("states"), second.revision_id),
        ..Default::default()
    };
    grpc.delete_schema_revision(request).unwrap();
    grpc.delete_schema(pubsub::DeleteSchemaRequest { name: schema_path("states") }).unwrap();
    refused(
        grpc.get_schema(pubsub::GetSchemaRequest { name: schema_path("states"), view: 0 }),
        Code::NotFound,
        "a deleted schema",
    );
    let shown = grpc.get_topic(pubsub::GetTopicRequest { topic: topic_path("avro-json") }).unwrap();
    assert_eq!(shown.schema_settings.unwrap().schema, "_deleted-schema_");
    refused(publish(&grpc, "avro-json", &[br#"{"n": 4}"#]), Code::InvalidArgument, "a deleted schema");

    // A topic deleted and created again without a schema takes any data at once.
    grpc.delete_topic(pubsub::DeleteTopicRequest { topic: topic_path("avro-json") }).unwrap();
    grpc.create_plain_topic("avro-json").unwrap();
    publish(&grpc, "avro-json", &[b"any data"]).unwrap();
}

/// ValidateSchema and ValidateMessage need no topic.
#[test]
fn schemas_and_messages_are_validated_without_a_topic() {
    let (_daemon, grpc) = grpc_daemon("schemas-validate");
    let schema = |schema_type: pubsub::schema::Type, definition: &str| pubsub::Schema {
        r#type: schema_type as i32,
        definition: definition.to_owned(),
        ..Default::default()
    };
    let validate = |schema| {
        grpc.validate_schema(pubsub::ValidateSchemaRequest { parent: project_path(), schema: Some(schema) })
    };
    validate(schema(pubsub::schema::Type::Avro, AVRO)).unwrap();
    validate(schema(pubsub::schema::Type::ProtocolBuffer, PROTOCOL_BUFFER)).unwrap();
    refused(
        validate(schema(pubsub::schema::Type::ProtocolBuffer, "message {")),
        Code::InvalidArgument,
        "no proto",
    );
    let message = |data: &[u8], encoding: pubsub::Encoding| pubsub::ValidateMessageRequest {
        parent: project_path(),
        schema_spec: Some(pubsub::validate_message_request::SchemaSpec::Schema(schema(
            pubsub::schema::Type::Avro,
            AVRO,
        ))),
        message: data.to_vec(),
        encoding: encoding as i32,
    };
    grpc.validate_message(message(AVRO_BINARY, pubsub::Encoding::Binary)).unwrap();
    refused(
        grpc.validate_message(message(b"{}", pubsub::Encoding::Json)),
        Code::InvalidArgument,
        "a record's fields",
    );
}

/// A native publish (the `ringpost` client, straight to the topic's forwarder) is checked on
/// that forwarder against the schema the router pushed it, with gRPC's rules and wording: a
/// valid message stored with Pub/Sub's attributes, a request holding an invalid one refused
/// whole. A revision committed and the topic's last bound moved to it reach the forwarder at
/// once (no cache to expire), and a restart keeps the check.
#[test]
fn native_publishes_are_checked_against_the_topics_schema_on_its_forwarder() {
    use ringpost_client::{block_on, ErrorCode, Message, Subscription};
    let (mut daemon, grpc) = grpc_daemon("schemas-native");
    let avro = create_schema(&grpc, "states", pubsub::schema::Type::Avro, AVRO);
    let first_only = (avro.revision_id.as_str(), avro.revision_id.as_str());
    topic_with_schema(&grpc, "typed", "states", pubsub::Encoding::Json, first_only).unwrap();
    let client = daemon.client();
    let subscription = Subscription { name: "typed".into(), topic: "typed".into(), ..Default::default() };
    block_on(client.create_subscription(subscription)).unwrap();
    let state = &br#"{"name": "Alaska", "post_abbr": "AK", "population": {"long": 733391}}"#[..];
    let count = &br#"{"n": 3}"#[..];
    let refused_natively = |client: &ringpost_client::Client, messages: Vec<Message>, what: &str| {
        let error = block_on(client.publish("typed", messages)).expect_err(what);
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{what}: {error}");
        assert!(error.to_string().contains("Message failed schema validation"), "{what}: {error}");
    };

    block_on(client.publish("typed", vec![Message::new(state).attribute("origin", "native")])).unwrap();
    refused_natively(
        &client,
        vec![Message::new(state), Message::new(count)],
        "a message of no revision in bounds",
    );
    refused_natively(&client, vec![Message::new("not json")], "not JSON");
    let delivered = block_on(client.pull("typed", 10, 0)).unwrap();
    assert_eq!(delivered.len(), 1, "the refused publishes stored nothing");
    let attribute = |key: &str| {
        let found = delivered[0].attributes.iter().find(|attribute| attribute.key == key);
        found.map(|attribute| attribute.value.clone()).unwrap_or_default()
    };
    assert_eq!(attribute("googclient_schemaname"), "projects/ringpost/schemas/states");
    assert_eq!(attribute("googclient_schemaencoding"), "JSON");
    assert_eq!(attribute("googclient_schemarevisionid"), avro.revision_id);
    assert_eq!(attribute("origin"), "native");
    let ack_ids = delivered.iter().map(|message| message.ack_id.clone()).collect();
    assert!(block_on(client.acknowledge("typed", ack_ids)).unwrap().is_empty());

    // A second revision, and the topic's last bound moved to it: a message of it is taken
    // at once.
    let second = grpc
        .commit_schema(pubsub::CommitSchemaRequest {
            name: schema_path("states"),
            schema: Some(pubsub::Schema { r#type: 2, definition: AVRO_COUNT.into(), ..Default::default() }),
        })
        .unwrap();
    refused_natively(&client, vec![Message::new(count)], "the second revision, out of bounds");
    grpc.update_topic(pubsub::UpdateTopicRequest {
        topic: Some(pubsub::Topic {
            name: topic_path("typed"),
            schema_settings: Some(pubsub::SchemaSettings {
                schema: schema_path("states"),
                encoding: pubsub::Encoding::Json as i32,
                first_revision_id: avro.revision_id.clone(),
                last_revision_id: second.revision_id.clone(),
            }),
            ..Default::default()
        }),
        update_mask: Some(prost_types::FieldMask { paths: vec!["schema_settings".into()] }),
    })
    .unwrap();
    block_on(client.publish("typed", vec![Message::new(count)])).unwrap();
    let delivered = block_on(client.pull("typed", 10, 0)).unwrap();
    assert_eq!(delivered.len(), 1);
    let revision =
        delivered[0].attributes.iter().find(|attribute| attribute.key == "googclient_schemarevisionid");
    assert_eq!(revision.map(|attribute| attribute.value.as_str()), Some(second.revision_id.as_str()));

    // Across a restart the forwarder is pushed the schema again with its topic's attach.
    daemon.restart();
    let client = daemon.client();
    refused_natively(&client, vec![Message::new("{}")], "checked after the restart");
    block_on(client.publish("typed", vec![Message::new(state)])).unwrap();
}

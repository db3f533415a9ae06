//! The router's handlers under authentication: each control-plane command is checked before
//! it changes anything, lists show what their reader may list, and lookups serve both users
//! and viewers of a resource.

use crate::auth::{Access, Session};
use crate::dispatch::Door;
use crate::net::server::Responder;
use crate::protocol::native::forwarder::tests::{call, required_access};
use crate::runtime::sim;
use crate::shard::Forwarder;
use crate::storage::sim::SimDisk;
use ringpost_wire::frame::{decode_body, FrameBuffer};
use ringpost_wire::messages::*;
use ringpost_wire::{Command, ErrorCode, Status};
use std::rc::Rc;

/// root may do anything; alice edits her topics and the subscriptions named after them; bob
/// views the topics whose names end in 1; carol publishes to "orders", dave views it, erin
/// consumes its subscription "orders-audit"; frank may create subscriptions but attach them
/// only to "orders".
const ACCESS_FILE: &str = "\
grant admin * root
grant editor topic:alice-* alice
grant editor subscription:alice-* alice
grant viewer topic:*1 bob
grant publisher topic:orders carol
grant viewer topic:orders dave
grant viewer subscription:orders-audit dave
grant subscriber subscription:orders-audit erin
grant editor subscription:* frank
grant subscriber topic:orders frank
";

/// A router's door with one forwarder on one simulated disk, as the daemon starts them.
async fn node() -> (Rc<Door<SimDisk>>, Rc<Forwarder<SimDisk>>) {
    crate::dispatch::tests::door_with_one_forwarder().await
}

fn code<T>(result: Result<T, Status>) -> ErrorCode {
    match result {
        Ok(_) => panic!("allowed where a refusal was expected"),
        Err(status) => status.code,
    }
}

fn as_principal(access: &Rc<Access>, name: &str) -> Responder {
    Responder::with_session(access.authenticate_certificate(name), access.clone())
}

fn topic(name: &str) -> Topic {
    Topic { name: name.into(), message_retention_seconds: 0 }
}

fn named(name: &str) -> NameRequest {
    NameRequest { name: name.into() }
}

fn subscription(name: &str, topic: &str) -> Subscription {
    Subscription { name: name.into(), topic: topic.into(), ack_deadline_seconds: 10, ..Default::default() }
}

fn topic_names(body: &[u8]) -> (Vec<String>, String) {
    let list = decode_body::<TopicList>(body).unwrap();
    (list.topics.into_iter().map(|topic| topic.name).collect(), list.next_page_token)
}

#[test]
fn a_refused_create_creates_nothing() {
    sim::run(0, async {
        let access = required_access("router-create", ACCESS_FILE);
        let (router, forwarder) = node().await;
        let root = as_principal(&access, "root");
        let alice = as_principal(&access, "alice");
        let anonymous = Responder::with_session(Session::anonymous(), access.clone());
        assert_eq!(
            code(call(&*router, &alice, Command::CreateTopic, &topic("bob-1")).await),
            ErrorCode::PermissionDenied
        );
        assert_eq!(
            code(call(&*router, &anonymous, Command::CreateTopic, &topic("xyz")).await),
            ErrorCode::Unauthenticated
        );
        assert_eq!(
            code(call(&*router, &root, Command::GetTopic, &named("bob-1")).await),
            ErrorCode::NotFound
        );
        assert!(forwarder.topic("bob-1").is_err(), "no forwarder serves a refused topic");

        call(&*router, &alice, Command::CreateTopic, &topic("alice-1")).await.unwrap();
        call(&*router, &alice, Command::GetTopic, &named("alice-1")).await.unwrap();
        let created = subscription("reader-of-alice", "alice-1");
        let refused = call(&*router, &alice, Command::CreateSubscription, &created).await;
        assert_eq!(code(refused), ErrorCode::PermissionDenied, "the subscription's name is not alice's");
        assert_eq!(
            code(call(&*router, &root, Command::GetSubscription, &named("reader-of-alice")).await),
            ErrorCode::NotFound
        );
        call(&*router, &alice, Command::CreateSubscription, &subscription("alice-sub", "alice-1"))
            .await
            .unwrap();
        // Deleting, updating, snapshots and the daemon's own commands are checked alike.
        assert_eq!(
            code(call(&*router, &anonymous, Command::DeleteTopic, &named("alice-1")).await),
            ErrorCode::Unauthenticated
        );
        let bob = as_principal(&access, "bob");
        assert_eq!(
            code(call(&*router, &bob, Command::DeleteTopic, &named("alice-1")).await),
            ErrorCode::PermissionDenied
        );
        call(&*router, &root, Command::GetTopic, &named("alice-1")).await.unwrap();
        let snapshot = SnapshotRequest { name: "alice-snapshot".into(), subscription: "alice-sub".into() };
        assert_eq!(
            code(call(&*router, &bob, Command::CreateSnapshot, &snapshot).await),
            ErrorCode::PermissionDenied
        );
        assert_eq!(
            code(call(&*router, &root, Command::GetSnapshot, &named("alice-snapshot")).await),
            ErrorCode::NotFound
        );
        // StatsWithPush is Stats with more in its answer, under the same permission.
        for stats in [Command::Stats, Command::StatsWithPush] {
            assert_eq!(code(call(&*router, &anonymous, stats, &Empty {}).await), ErrorCode::Unauthenticated);
            assert_eq!(code(call(&*router, &alice, stats, &Empty {}).await), ErrorCode::PermissionDenied);
            call(&*router, &root, stats, &Empty {}).await.unwrap();
        }
        let resync = ResyncDirectoryRequest { index: 0 };
        assert_eq!(
            code(call(&*router, &alice, Command::ResyncDirectory, &resync).await),
            ErrorCode::PermissionDenied
        );
        // Hello needs nothing.
        call(&*router, &anonymous, Command::Hello, &HelloRequest::default()).await.unwrap();
    });
}

#[test]
fn lists_show_only_what_their_reader_may_list() {
    sim::run(0, async {
        let access = required_access("router-list", ACCESS_FILE);
        let (router, _forwarder) = node().await;
        let root = as_principal(&access, "root");
        for name in ["aa1", "bb1", "aa2", "cc1"] {
            call(&*router, &root, Command::CreateTopic, &topic(name)).await.unwrap();
        }
        let bob = as_principal(&access, "bob");
        let first = ListRequest { topic: String::new(), page_size: 2, page_token: String::new() };
        let (names, token) = topic_names(&call(&*router, &bob, Command::ListTopics, &first).await.unwrap());
        // What bob may not list is left out before the page is cut: the page is full, and its
        // token names only what bob was shown (never aa2).
        assert_eq!((names, token.as_str()), (vec!["aa1".to_owned(), "bb1".to_owned()], "bb1"));
        let second = ListRequest { page_token: token, ..first.clone() };
        let (names, token) = topic_names(&call(&*router, &bob, Command::ListTopics, &second).await.unwrap());
        assert_eq!((names, token.as_str()), (vec!["cc1".to_owned()], ""));
        let all = ListRequest { page_size: 0, ..first };
        let (names, _) = topic_names(&call(&*router, &root, Command::ListTopics, &all).await.unwrap());
        assert_eq!(names, ["aa1", "aa2", "bb1", "cc1"]);
        // Anonymous may do nothing here: its list is refused, as on the gRPC API.
        let anonymous = Responder::with_session(Session::anonymous(), access.clone());
        assert_eq!(
            code(call(&*router, &anonymous, Command::ListTopics, &all).await),
            ErrorCode::Unauthenticated
        );
        for name in ["aa1-s", "bb1-s"] {
            call(&*router, &root, Command::CreateSubscription, &subscription(name, "aa1")).await.unwrap();
        }
        let subscriptions = |body: FrameBuffer| -> Vec<String> {
            let list = decode_body::<SubscriptionList>(&body).unwrap();
            list.subscriptions.into_iter().map(|subscription| subscription.name).collect()
        };
        assert!(
            subscriptions(call(&*router, &bob, Command::ListSubscriptions, &all).await.unwrap()).is_empty()
        );
        let listed = subscriptions(call(&*router, &root, Command::ListSubscriptions, &all).await.unwrap());
        assert_eq!(listed, ["aa1-s", "bb1-s"]);
        let snapshot = SnapshotRequest { name: "aa1-snapshot".into(), subscription: "aa1-s".into() };
        call(&*router, &root, Command::CreateSnapshot, &snapshot).await.unwrap();
        let snapshots = |body: FrameBuffer| decode_body::<SnapshotList>(&body).unwrap().snapshots.len();
        assert_eq!(snapshots(call(&*router, &bob, Command::ListSnapshots, &all).await.unwrap()), 0);
        assert_eq!(snapshots(call(&*router, &root, Command::ListSnapshots, &all).await.unwrap()), 1);
    });
}

#[test]
fn a_lookup_serves_who_uses_or_views_the_resource() {
    sim::run(0, async {
        let access = required_access("router-lookup", ACCESS_FILE);
        let (router, _forwarder) = node().await;
        let root = as_principal(&access, "root");
        call(&*router, &root, Command::CreateTopic, &topic("orders")).await.unwrap();
        call(&*router, &root, Command::CreateSubscription, &subscription("orders-audit", "orders"))
            .await
            .unwrap();
        let [carol, dave, erin] = ["carol", "dave", "erin"].map(|name| as_principal(&access, name));
        call(&*router, &carol, Command::LookupTopic, &named("orders")).await.unwrap();
        call(&*router, &dave, Command::LookupTopic, &named("orders")).await.unwrap();
        let refused = call(&*router, &erin, Command::LookupTopic, &named("orders")).await.unwrap_err();
        assert_eq!(refused.code, ErrorCode::PermissionDenied);
        assert!(refused.message.contains("publish"), "the publish permission's refusal: {}", refused.message);
        call(&*router, &erin, Command::LookupSubscription, &named("orders-audit")).await.unwrap();
        call(&*router, &dave, Command::LookupSubscription, &named("orders-audit")).await.unwrap();
        let refused =
            call(&*router, &carol, Command::LookupSubscription, &named("orders-audit")).await.unwrap_err();
        assert_eq!(refused.code, ErrorCode::PermissionDenied);
        assert!(refused.message.contains("consume"), "the consume permission's refusal: {}", refused.message);
        let anonymous = Responder::with_session(Session::anonymous(), access.clone());
        assert_eq!(
            code(call(&*router, &anonymous, Command::LookupTopic, &named("orders")).await),
            ErrorCode::Unauthenticated
        );
        // Seeking needs the seek permission on the subscription: erin's subscriber role.
        let seek = SeekRequest { subscription: "orders-audit".into(), time_ms: 0, snapshot: String::new() };
        call(&*router, &erin, Command::Seek, &seek).await.unwrap();
        assert_eq!(code(call(&*router, &dave, Command::Seek, &seek).await), ErrorCode::PermissionDenied);
    });
}

#[test]
fn lookup_sources_lists_a_topic_of_one_source_as_its_lookup_with_the_lookups_permissions() {
    sim::run(0, async {
        let access = required_access("router-lookup-sources", ACCESS_FILE);
        let (router, _forwarder) = node().await;
        let root = as_principal(&access, "root");
        call(&*router, &root, Command::CreateTopic, &topic("orders")).await.unwrap();
        call(&*router, &root, Command::CreateSubscription, &subscription("orders-audit", "orders"))
            .await
            .unwrap();
        let [carol, dave, erin] = ["carol", "dave", "erin"].map(|name| as_principal(&access, name));
        let of_topic = LookupSourcesRequest { name: "orders".into(), subscription: false };
        let of_subscription = LookupSourcesRequest { name: "orders-audit".into(), subscription: true };
        let lookup = call(&*router, &carol, Command::LookupTopic, &named("orders")).await.unwrap();
        let plain = decode_body::<LookupResponse>(&lookup).unwrap();
        let answer = call(&*router, &carol, Command::LookupSources, &of_topic).await.unwrap();
        let sources = decode_body::<LookupSourcesResponse>(&answer).unwrap();
        assert_eq!(sources.active, 1);
        assert_eq!(sources.sources, [SourceRoute { number: 0, forwarders: plain.forwarders }]);
        call(&*router, &dave, Command::LookupSources, &of_topic).await.unwrap();
        assert_eq!(
            code(call(&*router, &erin, Command::LookupSources, &of_topic).await),
            ErrorCode::PermissionDenied
        );
        call(&*router, &erin, Command::LookupSources, &of_subscription).await.unwrap();
        assert_eq!(
            code(call(&*router, &carol, Command::LookupSources, &of_subscription).await),
            ErrorCode::PermissionDenied
        );
        let missing = LookupSourcesRequest { name: "nothing".into(), subscription: false };
        assert_eq!(code(call(&*router, &root, Command::LookupSources, &missing).await), ErrorCode::NotFound);
    });
}

#[test]
fn a_subscription_needs_its_topic_and_its_dead_letter_topic() {
    sim::run(0, async {
        let access = required_access("router-attach", ACCESS_FILE);
        let (router, _forwarder) = node().await;
        let root = as_principal(&access, "root");
        for name in ["orders", "invoices", "orders-dead"] {
            call(&*router, &root, Command::CreateTopic, &topic(name)).await.unwrap();
        }
        let frank = as_principal(&access, "frank");
        let refused =
            call(&*router, &frank, Command::CreateSubscription, &subscription("fr-1", "invoices")).await;
        assert_eq!(code(refused), ErrorCode::PermissionDenied, "frank may not attach to invoices");
        let dead_lettered = Subscription {
            dead_letter_topic: "orders-dead".into(),
            max_delivery_attempts: 5,
            ..subscription("fr-2", "orders")
        };
        let refused = call(&*router, &frank, Command::CreateSubscription, &dead_lettered).await;
        assert_eq!(code(refused), ErrorCode::PermissionDenied, "frank may not publish to orders-dead");
        for name in ["fr-1", "fr-2"] {
            assert_eq!(
                code(call(&*router, &root, Command::GetSubscription, &named(name)).await),
                ErrorCode::NotFound
            );
        }
        call(&*router, &frank, Command::CreateSubscription, &subscription("fr-3", "orders")).await.unwrap();
        let update = UpdateSubscriptionRequest {
            subscription: dead_lettered.clone(),
            update_mask: vec!["dead_letter_policy".into()],
        };
        let update = UpdateSubscriptionRequest {
            subscription: Subscription { name: "fr-3".into(), ..update.subscription },
            ..update
        };
        let refused = call(&*router, &frank, Command::UpdateSubscription, &update).await;
        assert_eq!(code(refused), ErrorCode::PermissionDenied);
        let unchanged = decode_body::<Subscription>(
            &call(&*router, &root, Command::GetSubscription, &named("fr-3")).await.unwrap(),
        )
        .unwrap();
        assert_eq!(unchanged.dead_letter_topic, "");
        call(&*router, &root, Command::UpdateSubscription, &update).await.unwrap();
    });
}

#[test]
fn an_authenticate_request_is_not_a_handlers() {
    sim::run(0, async {
        let (router, _forwarder) = node().await;
        let request = AuthenticateRequest { token: "rpt_0".into() };
        let refused = call(&*router, &Responder::unconnected(), Command::Authenticate, &request).await;
        assert_eq!(code(refused), ErrorCode::Internal);
    });
}

#[test]
fn the_cluster_status_needs_the_stats_permission_and_shows_the_single_voter_leading() {
    sim::run(0, async {
        let access = required_access("router-cluster", ACCESS_FILE);
        let (router, _forwarder) = node().await;
        let anonymous = Responder::with_session(Session::anonymous(), access.clone());
        assert_eq!(
            code(call(&*router, &anonymous, Command::ClusterStatus, &Empty {}).await),
            ErrorCode::Unauthenticated
        );
        let alice = as_principal(&access, "alice");
        assert_eq!(
            code(call(&*router, &alice, Command::ClusterStatus, &Empty {}).await),
            ErrorCode::PermissionDenied,
            "an editor of topics is no viewer of the daemon"
        );
        let root = as_principal(&access, "root");
        call(&*router, &root, Command::CreateTopic, &topic("orders")).await.unwrap();
        let body = call(&*router, &root, Command::ClusterStatus, &Empty {}).await.unwrap();
        let status = decode_body::<ClusterStatusResponse>(&body).unwrap();
        assert_eq!((status.node_id, status.catalog_leader), (1, Some(1)), "{status:?}");
        assert!(status.term >= 1, "{status:?}");
        // One consistent reading of openraft's metrics, which it reports after it acts: the
        // create's entry may be applied before the metrics say so.
        let last = status.last_log_index.expect("the catalog's log holds its entries");
        let applied = status.last_applied_index.expect("the start applied the catalog's log");
        assert!(1 <= applied && applied <= last, "{status:?}");
        assert_eq!(status.nodes.len(), 1, "{status:?}");
        let node = &status.nodes[0];
        assert_eq!((node.node_id, node.voter, node.role.as_str()), (1, true, "leader"));
        let matched = node.matched_index.expect("the leader knows what it holds itself");
        assert!(applied <= matched && matched <= last, "{status:?}");
    });
}

/// An Avro record of one field, the schema the tests below create.
const ORDER_SCHEMA: &str =
    r#"{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}"#;

/// The schema commands ask `pubsub.schemas.*` on the schema's name: a viewer reads and checks
/// but may not create; an editor of `schema:orders-*` creates and deletes; a topic's creator
/// without `pubsub.schemas.attach` on the schema is refused before the topic is made.
#[test]
fn schema_commands_ask_the_schemas_permissions_and_a_refused_attach_creates_no_topic() {
    sim::run(0, async {
        let access = required_access(
            "router-schemas",
            "grant admin * root\ngrant editor schema:orders-* sara\ngrant viewer * vic\ngrant editor topic:t-* tom\n",
        );
        let (router, _forwarder) = node().await;
        let (root, sara, vic, tom) = (
            as_principal(&access, "root"),
            as_principal(&access, "sara"),
            as_principal(&access, "vic"),
            as_principal(&access, "tom"),
        );
        let create =
            SchemaRequest { name: "orders-v1".into(), schema_type: 2, definition: ORDER_SCHEMA.into() };
        assert_eq!(
            code(call(&*router, &vic, Command::CreateSchema, &create).await),
            ErrorCode::PermissionDenied
        );
        let created =
            decode_body::<Schema>(&call(&*router, &sara, Command::CreateSchema, &create).await.unwrap())
                .unwrap();
        assert_eq!((created.name.as_str(), created.schema_type), ("orders-v1", 2));
        assert_eq!(created.revision_id.len(), 8);

        let get = GetSchemaRequest { name: "orders-v1".into(), revision_id: String::new(), full: false };
        let got =
            decode_body::<Schema>(&call(&*router, &vic, Command::GetSchema, &get).await.unwrap()).unwrap();
        assert_eq!((got.revision_id, got.definition), (created.revision_id.clone(), String::new()));
        let list = ListSchemasRequest { full: true, ..Default::default() };
        let listed =
            decode_body::<SchemaList>(&call(&*router, &vic, Command::ListSchemas, &list).await.unwrap())
                .unwrap();
        assert_eq!(listed.schemas.len(), 1);
        assert_eq!(listed.schemas[0].definition, ORDER_SCHEMA);

        let message = |text: &str| ValidateMessageRequest {
            name: "orders-v1".into(),
            encoding: 1,
            message: text.as_bytes().to_vec(),
            ..Default::default()
        };
        call(&*router, &vic, Command::ValidateMessage, &message(r#"{"id": 7}"#)).await.unwrap();
        let bad = call(&*router, &vic, Command::ValidateMessage, &message(r#"{"name": "x"}"#)).await;
        assert_eq!(code(bad), ErrorCode::InvalidArgument);
        let valid = SchemaRequest { name: String::new(), schema_type: 2, definition: ORDER_SCHEMA.into() };
        call(&*router, &vic, Command::ValidateSchema, &valid).await.unwrap();
        let invalid = SchemaRequest { definition: "{\"type\": \"nothing\"}".into(), ..valid };
        assert_eq!(
            code(call(&*router, &vic, Command::ValidateSchema, &invalid).await),
            ErrorCode::InvalidArgument
        );

        let settings = SchemaSettings { schema: "orders-v1".into(), encoding: 1, ..Default::default() };
        let with_schema = |name: &str| CreateTopicWithSchemaRequest {
            topic: CreateTopicWithSourcesRequest { topic: topic(name), replicas: 0, sources: 0 },
            schema: settings.clone(),
        };
        let refused = call(&*router, &tom, Command::CreateTopicWithSchema, &with_schema("t-1")).await;
        assert_eq!(code(refused), ErrorCode::PermissionDenied);
        assert_eq!(code(call(&*router, &root, Command::GetTopic, &named("t-1")).await), ErrorCode::NotFound);
        let made = call(&*router, &root, Command::CreateTopicWithSchema, &with_schema("t-2")).await.unwrap();
        assert_eq!(decode_body::<TopicWithSchema>(&made).unwrap().schema, settings);
        let read = call(&*router, &tom, Command::GetTopicWithSchema, &named("t-2")).await.unwrap();
        assert_eq!(decode_body::<TopicWithSchema>(&read).unwrap().schema, settings);

        assert_eq!(
            code(call(&*router, &vic, Command::DeleteSchema, &named("orders-v1")).await),
            ErrorCode::PermissionDenied
        );
        call(&*router, &sara, Command::DeleteSchema, &named("orders-v1")).await.unwrap();
        assert_eq!(code(call(&*router, &vic, Command::GetSchema, &get).await), ErrorCode::NotFound);
    });
}

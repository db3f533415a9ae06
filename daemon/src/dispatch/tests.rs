//! The door on one node: an operation another node carried here is decided here, for its
//! principal, with this node's access file, and answered with how far this node applied the
//! catalog. (A change reaching a node that does not lead is carried: the clustered
//! integration tests, `grpc_cluster` and `cluster`, check that, on real nodes.)

use super::*;
use crate::api::control::{ListRequest, Topic};
use crate::auth::{AccessSettings, Mode};
use crate::catalog::placement::BALANCE_FACTOR_DEFAULT;
use crate::catalog::Catalog;
use crate::clock::SystemClock;
use crate::log::{Directories, LogConfig};
use crate::router::{Advertise, ForwarderAddresses, ForwarderLink};
use crate::runtime::sim;
use crate::shard::Forwarder;
use crate::storage::sim::SimDisk;
use std::cell::RefCell;

/// A router's door, with one forwarder on one simulated disk, as the daemon starts them.
pub(crate) async fn door_with_one_forwarder() -> (Rc<Door<SimDisk>>, Rc<Forwarder<SimDisk>>) {
    let disk = SimDisk::new();
    let paths = vec![std::path::PathBuf::from("/d0")];
    let catalog = Catalog::open(disk.clone(), Directories::new(paths.clone()), 1, BALANCE_FACTOR_DEFAULT)
        .await
        .unwrap();
    let forwarder = Rc::new(Forwarder::new(
        0,
        disk.clone(),
        Directories::new(paths.clone()),
        LogConfig::default(),
        Rc::new(SystemClock),
    ));
    let link = {
        let forwarder = forwarder.clone();
        ForwarderLink::local(Box::new(move |request| {
            let forwarder = forwarder.clone();
            Box::pin(async move { forwarder.control(request).await })
        }))
    };
    let addresses = ForwarderAddresses::new(vec![7451], Advertise::Host("simulated".into()));
    let router = Rc::new(Router::new(
        disk,
        Directories::new(paths),
        catalog,
        vec![link],
        addresses,
        BALANCE_FACTOR_DEFAULT,
    ));
    router.recover().await.unwrap();
    (Rc::new(Door::new(router, None)), forwarder)
}

/// Required mode with `grants`, its audit lines kept in the returned list.
fn access(test: &str, grants: &str) -> (Access, Rc<RefCell<Vec<String>>>) {
    let path = std::env::temp_dir().join(format!("ringpost-door-{}-{test}", std::process::id()));
    std::fs::write(&path, grants).unwrap();
    let settings = AccessSettings { mode: Mode::Required, file: Some(path.clone()) };
    let lines = Rc::new(RefCell::new(Vec::new()));
    let sink = lines.clone();
    let access = Access::open(&settings)
        .unwrap()
        .with_audit_sink(Box::new(move |line: &str| sink.borrow_mut().push(line.to_owned())));
    std::fs::remove_file(&path).unwrap();
    (access, lines)
}

fn create(name: &str) -> Operation {
    Operation::CreateTopic(Topic { name: name.into(), ..Default::default() })
}

#[test]
fn a_carried_operation_is_decided_here_for_its_principal() {
    sim::run(0, async {
        let (door, forwarder) = door_with_one_forwarder().await;
        let (access, audit) = access("carried", "grant editor topic:alice-* alice\n");
        let alice = || Principal::Named("alice".into());

        let carried = door.execute_carried(&access, alice(), create("alice-1")).await;
        assert_eq!(carried.outcome.unwrap().into_topic().unwrap().name, "alice-1");
        let applied = carried.applied.expect("the index the creation applied at");
        assert!(forwarder.topic("alice-1").is_ok());

        // Another principal, and nobody: refused here, nothing created, the refusal audited here.
        let refused = door.execute_carried(&access, Principal::Named("bob".into()), create("alice-2")).await;
        assert_eq!(refused.outcome.unwrap_err().code, Code::PermissionDenied);
        let refused = door.execute_carried(&access, Principal::Anonymous, create("alice-3")).await;
        assert_eq!(refused.outcome.unwrap_err().code, Code::Unauthenticated);
        assert!(forwarder.topic("alice-2").is_err() && forwarder.topic("alice-3").is_err());
        assert_eq!(door.router().applied_index(), Some(applied), "a refusal proposes nothing");
        let audited = audit.borrow().clone();
        assert!(
            audited.iter().any(|line| line.contains("pubsub.topics.create on topic:alice-2 to bob")),
            "{audited:?}"
        );

        // A principal another node vouches for counts as presenting a credential: it may list
        // what it may see, where anonymous may not list at all.
        let list = Operation::ListTopics(ListRequest::default());
        let page = door.execute_carried(&access, alice(), list.clone()).await.outcome.unwrap();
        assert_eq!(page.into_topics().unwrap().items.len(), 1);
        let anonymous = door.execute_carried(&access, Principal::Anonymous, list).await;
        assert_eq!(anonymous.outcome.unwrap_err().code, Code::Unauthenticated);
    });
}

#[test]
fn the_door_checks_before_anything_happens_and_lookups_serve_viewers_too() {
    sim::run(0, async {
        let (door, forwarder) = door_with_one_forwarder().await;
        let grants =
            "grant admin * root\ngrant viewer topic:orders dave\ngrant subscriber subscription:s frank\n";
        let (access, _) = access("checks", grants);
        let session = |name: &str| access.authenticate_certificate(name);
        let (root, dave, frank) = (session("root"), session("dave"), session("frank"));
        let as_ = |session| Caller::new(session, &access);

        door.execute(&as_(&root), create("orders")).await.unwrap();
        // A subscription needs its topic's attach permission too: frank lacks it.
        let subscription = crate::api::control::Subscription {
            name: "s".into(),
            topic: "orders".into(),
            ..Default::default()
        };
        let refused = door.execute(&as_(&frank), Operation::CreateSubscription(subscription)).await;
        assert_eq!(refused.unwrap_err().code, Code::PermissionDenied);
        assert!(door.router().get_subscription("s").is_err(), "a refused create creates nothing");
        // A viewer looks a topic up as a publisher does.
        let lookup = Operation::LookupTopic { name: "orders".into() };
        let found = door.execute(&as_(&dave), lookup.clone()).await.unwrap().into_forwarders().unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(door.execute(&as_(&frank), lookup).await.unwrap_err().code, Code::PermissionDenied);
        assert!(forwarder.topic("orders").is_ok());
    });
}

#[test]
fn the_data_planes_checks_use_the_same_table() {
    let (access, audit) =
        access("data", "grant publisher topic:orders carol\ngrant subscriber subscription:s erin\n");
    let carol = access.authenticate_certificate("carol");
    let erin = access.authenticate_certificate("erin");
    assert!(check(&access, &carol, Kind::Publish, "orders").is_ok());
    assert!(!allows(&access, &carol, Kind::Publish, "other"));
    assert!(allows(&access, &erin, Kind::Pull, "s"));
    for kind in [Kind::Pull, Kind::StreamingPull, Kind::Acknowledge, Kind::ModifyAckDeadline] {
        assert_eq!(check(&access, &carol, kind, "s").unwrap_err().code, Code::PermissionDenied, "{kind:?}");
    }
    assert!(audit
        .borrow()
        .iter()
        .any(|line| line.contains("pubsub.subscriptions.consume on subscription:s to carol")));
}

/// Setting a topic's schema asks `pubsub.schemas.attach` on the schema besides the topic's
/// update; a list of schemas shows what its reader may list; a message is checked against a
/// schema only by who may read it. An editor of the topic alone (`topic:t-*`) attaches no
/// schema of another name, and the refusal names the schema.
#[test]
fn a_topics_schema_needs_the_schemas_attach_and_reads_ask_the_schemas_permissions() {
    use crate::catalog::schemas::{SchemaEncoding, SchemaSettings, SchemaType};
    sim::run(0, async {
        let (door, _forwarder) = door_with_one_forwarder().await;
        let grants = "grant admin * root\ngrant editor topic:t-* tom\ngrant viewer schema:public-* vic\n";
        let (access, audit) = access("schemas", grants);
        let session = |name: &str| access.authenticate_certificate(name);
        let (root, tom, vic) = (session("root"), session("tom"), session("vic"));
        let as_ = |session| Caller::new(session, &access);
        let definition = r#"{"type": "record", "name": "R", "fields": [{"name": "n", "type": "int"}]}"#;
        for name in ["orders", "public-orders"] {
            let create = Operation::CreateSchema {
                name: name.into(),
                schema_type: SchemaType::Avro,
                definition: definition.into(),
            };
            door.execute(&as_(&root), create).await.unwrap();
        }
        door.execute(&as_(&tom), create("t-1")).await.unwrap();

        let settings = SchemaSettings {
            schema: "orders".into(),
            encoding: SchemaEncoding::Json,
            first_revision_id: String::new(),
            last_revision_id: String::new(),
        };
        let set = Operation::SetTopicSchema { topic: "t-1".into(), settings: Some(settings.clone()) };
        assert_eq!(door.execute(&as_(&tom), set.clone()).await.unwrap_err().code, Code::PermissionDenied);
        assert!(audit
            .borrow()
            .iter()
            .any(|line| line.contains("pubsub.schemas.attach on schema:orders to tom")));
        assert_eq!(door.router().topics_schema_settings(&["t-1".into()]), [None], "a refusal sets nothing");
        door.execute(&as_(&root), set).await.unwrap();
        assert_eq!(door.router().topics_schema_settings(&["t-1".into()]), [Some(settings)]);

        let list = Operation::ListSchemas(ListRequest::default());
        let page = door.execute(&as_(&vic), list).await.unwrap().into_schemas().unwrap();
        assert_eq!(
            page.items.iter().map(|schema| schema.name.as_str()).collect::<Vec<_>>(),
            ["public-orders"]
        );
        let check = |schema: &str, message: &str| {
            Operation::ValidateMessage(Box::new(MessageCheck {
                schema: schema.into(),
                revision_id: String::new(),
                schema_type: SchemaType::Avro,
                definition: String::new(),
                encoding: SchemaEncoding::Json,
                message: message.as_bytes().to_vec(),
            }))
        };
        door.execute(&as_(&vic), check("public-orders", r#"{"n": 1}"#)).await.unwrap();
        let mismatch = door.execute(&as_(&vic), check("public-orders", "{}")).await.unwrap_err();
        assert_eq!(mismatch.code, Code::InvalidArgument);
        let unreadable = door.execute(&as_(&vic), check("orders", r#"{"n": 1}"#)).await.unwrap_err();
        assert_eq!(unreadable.code, Code::PermissionDenied);
        let get = Operation::GetSchema { name: "orders".into() };
        assert_eq!(door.execute(&as_(&vic), get).await.unwrap_err().code, Code::PermissionDenied);
    });
}

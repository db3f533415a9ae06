//! The router's operations on domain values: labels kept through updates and restarts, checked
//! on every create and update; UpdateSnapshot; DetachSubscription, also across a restart; and
//! subscriptions that never expire.

use super::*;
use crate::api::data::{DataPlane, PullSettings};
use crate::catalog::placement::BALANCE_FACTOR_DEFAULT;
use crate::clock::SystemClock;
use crate::log::LogConfig;
use crate::net::server::Responder;
use crate::protocol::native::forwarder::tests::call;
use crate::runtime::sim;
use crate::shard::Forwarder;
use crate::storage::sim::{CrashMode, SimDisk};
use ringpost_model::limits::{EXPIRATION_TTL_SECONDS_NEVER, LABEL_KEY_BYTES_MAX};
use ringpost_wire::messages::{PublishRequest, PubsubMessage};
use ringpost_wire::Command;
use std::path::PathBuf;
use std::time::Duration;

struct Node {
    router: Rc<Router<SimDisk>>,
    forwarder: Rc<Forwarder<SimDisk>>,
}

/// A router with one forwarder on `disk`, started as the daemon starts them (catalog opened,
/// then everything it names recovered).
async fn start(disk: &SimDisk) -> Node {
    start_with_clock(disk, Rc::new(SystemClock)).await
}

/// `start`, with the forwarder on `clock`.
async fn start_with_clock(disk: &SimDisk, clock: Rc<dyn crate::clock::Clock>) -> Node {
    let paths = vec![PathBuf::from("/d0")];
    let catalog = Catalog::open(disk.clone(), Directories::new(paths.clone()), 1, BALANCE_FACTOR_DEFAULT)
        .await
        .unwrap();
    let forwarder = Rc::new(Forwarder::new(
        0,
        disk.clone(),
        Directories::new(paths.clone()),
        LogConfig::default(),
        clock,
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
        disk.clone(),
        Directories::new(paths),
        catalog,
        vec![link],
        addresses,
        BALANCE_FACTOR_DEFAULT,
    ));
    router.recover().await.unwrap();
    Node { router, forwarder }
}

/// Stops the node as a crash would (what was unsynced is lost) and starts it again.
async fn restart(disk: &SimDisk, node: Node) -> Node {
    sim::kill_spawned_tasks();
    drop(node);
    disk.crash(CrashMode::DropUnsynced);
    start(disk).await
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect()
}

fn topic(name: &str, labels: Labels) -> Topic {
    Topic { name: name.into(), labels, ..Topic::default() }
}

fn subscription(name: &str, topic: &str, settings: SubscriptionSettings) -> Subscription {
    Subscription { name: name.into(), topic: topic.into(), settings, detached: false }
}

async fn publish(node: &Node, topic: &str, data: &str) {
    let request = PublishRequest {
        topic: topic.into(),
        messages: vec![PubsubMessage { data: data.as_bytes().to_vec(), ..PubsubMessage::default() }],
    };
    call(&*node.forwarder, &Responder::unconnected(), Command::Publish, &request).await.unwrap();
}

/// An invalid argument whose message names `limit`.
fn refused_naming<T: std::fmt::Debug>(result: Result<T, ControlError>, limit: &str) {
    let status = Status::from(result.unwrap_err());
    assert_eq!(status.code, ErrorCode::InvalidArgument, "{status}");
    assert!(status.message.contains(limit), "{status} does not name {limit}");
}

#[test]
fn labels_are_kept_through_updates_and_a_restart() {
    sim::run(0, async {
        let disk = SimDisk::new();
        let node = start(&disk).await;
        let router = &node.router;
        let created = router.create_topic(topic("orders", labels(&[("team", "shop")]))).await.unwrap();
        assert_eq!(created.labels, labels(&[("team", "shop")]));
        let changes = TopicUpdate {
            name: "orders".into(),
            labels: Some(labels(&[("env", "prod")])),
            ..Default::default()
        };
        assert_eq!(router.update_topic(changes).await.unwrap().labels, labels(&[("env", "prod")]));
        // An update of the retention alone leaves the labels.
        let retention = TopicUpdate {
            name: "orders".into(),
            message_retention_seconds: Some(3600),
            ..Default::default()
        };
        assert_eq!(router.update_topic(retention).await.unwrap().labels, labels(&[("env", "prod")]));

        let settings = SubscriptionSettings {
            labels: labels(&[("reader", "audit")]),
            enable_exactly_once_delivery: true,
            ..Default::default()
        };
        let created = router.create_subscription(subscription("audit", "orders", settings)).await.unwrap();
        assert_eq!(created.settings.labels, labels(&[("reader", "audit")]));
        assert!(created.settings.enable_exactly_once_delivery);
        let changes = SubscriptionUpdate {
            name: "audit".into(),
            labels: Some(labels(&[("reader", "billing")])),
            ..Default::default()
        };
        let updated = router.update_subscription(changes).await.unwrap();
        assert_eq!(updated.settings.labels, labels(&[("reader", "billing")]));
        assert!(updated.settings.enable_exactly_once_delivery, "left as it was");

        let snapshot = router.create_snapshot("before", "audit", labels(&[("why", "backup")])).await.unwrap();
        assert_eq!(snapshot.labels, labels(&[("why", "backup")]));
        let updated = router.update_snapshot("before", Some(labels(&[("why", "audit-1")]))).await.unwrap();
        assert_eq!(updated.labels, labels(&[("why", "audit-1")]));
        assert_eq!(updated.topic, "orders");
        assert_eq!(updated.expire_time_ms, snapshot.expire_time_ms, "an update changes only labels");
        let unchanged = router.update_snapshot("before", None).await.unwrap();
        assert_eq!(unchanged.labels, labels(&[("why", "audit-1")]));

        let node = restart(&disk, node).await;
        let router = &node.router;
        assert_eq!(router.get_topic("orders").unwrap().labels, labels(&[("env", "prod")]));
        assert_eq!(router.get_topic("orders").unwrap().message_retention_seconds, 3600);
        assert_eq!(
            router.list_topics(&ListRequest::default(), |_| true).items[0].labels,
            labels(&[("env", "prod")])
        );
        let audit = router.get_subscription("audit").unwrap();
        assert_eq!(audit.settings.labels, labels(&[("reader", "billing")]));
        assert!(audit.settings.enable_exactly_once_delivery);
        let listed = router.list_subscriptions(&ListRequest::default(), |_| true).items;
        assert_eq!(listed[0].settings.labels, labels(&[("reader", "billing")]));
        assert_eq!(router.get_snapshot("before").unwrap().labels, labels(&[("why", "audit-1")]));
        assert_eq!(
            router.list_snapshots(&ListRequest::default(), |_| true).items[0].labels,
            labels(&[("why", "audit-1")])
        );
        // The forwarder carries exactly-once delivery from the catalog at recovery, and an
        // update turns it off.
        let served =
            |node: &Node| node.forwarder.subscription("audit").unwrap().0.state.borrow().policy.exactly_once;
        assert!(served(&node));
        let off = SubscriptionUpdate {
            name: "audit".into(),
            enable_exactly_once_delivery: Some(false),
            ..Default::default()
        };
        assert!(!router.update_subscription(off).await.unwrap().settings.enable_exactly_once_delivery);
        assert!(!served(&node));
    });
}

#[test]
fn every_create_and_update_checks_labels() {
    sim::run(0, async {
        let disk = SimDisk::new();
        let node = start(&disk).await;
        let router = &node.router;
        let long_key = "k".repeat(LABEL_KEY_BYTES_MAX + 1);
        let bad = labels(&[(long_key.as_str(), "x")]);
        refused_naming(router.create_topic(topic("orders", bad.clone())).await, "LABEL_KEY_BYTES_MAX");
        assert!(router.get_topic("orders").is_err(), "a refused create creates nothing");
        router.create_topic(topic("orders", Labels::new())).await.unwrap();
        let changes = TopicUpdate {
            name: "orders".into(),
            labels: Some(labels(&[("Team", "x")])),
            ..Default::default()
        };
        refused_naming(router.update_topic(changes).await, "lowercase letter");
        let settings = SubscriptionSettings { labels: bad.clone(), ..Default::default() };
        refused_naming(
            router.create_subscription(subscription("audit", "orders", settings)).await,
            "LABEL_KEY_BYTES_MAX",
        );
        assert!(router.get_subscription("audit").is_err());
        router
            .create_subscription(subscription("audit", "orders", SubscriptionSettings::default()))
            .await
            .unwrap();
        let changes =
            SubscriptionUpdate { name: "audit".into(), labels: Some(bad.clone()), ..Default::default() };
        refused_naming(router.update_subscription(changes).await, "LABEL_KEY_BYTES_MAX");
        let many: Labels = (0..65).map(|n| (format!("k{n}"), String::new())).collect();
        refused_naming(router.create_snapshot("before", "audit", many).await, "LABELS_COUNT_MAX");
        assert_eq!(router.get_snapshot("before").unwrap_err().code(), ErrorCode::NotFound);
        router.create_snapshot("before", "audit", Labels::new()).await.unwrap();
        refused_naming(router.update_snapshot("before", Some(bad)).await, "LABEL_KEY_BYTES_MAX");
        assert_eq!(router.update_snapshot("missing", None).await.unwrap_err().code(), ErrorCode::NotFound);
        // Nothing refused changed anything.
        assert!(router.get_topic("orders").unwrap().labels.is_empty());
        assert!(router.get_subscription("audit").unwrap().settings.labels.is_empty());
        assert!(router.get_snapshot("before").unwrap().labels.is_empty());
    });
}

fn push_to(endpoint: &str) -> Option<Box<crate::catalog::PushConfig>> {
    Some(Box::new(crate::catalog::PushConfig { endpoint: endpoint.into(), ..Default::default() }))
}

/// A push configuration is checked, kept through updates and a restart, handed to the
/// forwarder that serves the subscription, and removed (pull) in place; exactly-once delivery
/// is refused beside it whichever came first, at creation and by update, changing nothing.
#[test]
fn push_configurations_are_checked_kept_and_served() {
    sim::run(0, async {
        let disk = SimDisk::new();
        let node = start(&disk).await;
        let router = &node.router;
        router.create_topic(topic("orders", Labels::new())).await.unwrap();
        for (endpoint, why) in
            [("example.com/push", "absolute"), ("https://", "no host"), ("ftp://h/", "scheme")]
        {
            let settings = SubscriptionSettings { push: push_to(endpoint), ..Default::default() };
            refused_naming(router.create_subscription(subscription("pushed", "orders", settings)).await, why);
        }
        let token =
            crate::catalog::OidcToken { service_account_email: "nobody".into(), audience: String::new() };
        let mut bad_token = push_to("https://example.com/push");
        bad_token.as_mut().unwrap().oidc_token = Some(token);
        let settings = SubscriptionSettings { push: bad_token, ..Default::default() };
        refused_naming(router.create_subscription(subscription("pushed", "orders", settings)).await, "email");
        let both = SubscriptionSettings {
            push: push_to("https://example.com/push"),
            enable_exactly_once_delivery: true,
            ..Default::default()
        };
        refused_naming(
            router.create_subscription(subscription("pushed", "orders", both)).await,
            "not supported on push subscriptions",
        );
        assert!(router.get_subscription("pushed").is_err(), "a refused create creates nothing");

        let mut push = push_to("http://localhost:8080/push");
        push.as_mut().unwrap().wrapper = crate::catalog::PushWrapper::NoWrapper { write_metadata: true };
        let settings = SubscriptionSettings { push: push.clone(), ..Default::default() };
        let created = router.create_subscription(subscription("pushed", "orders", settings)).await.unwrap();
        assert_eq!(created.settings.push, push);
        let served = |node: &Node| node.forwarder.subscription("pushed").unwrap().0.push.get();
        assert_eq!(served(&node).as_deref(), push.as_deref(), "the forwarder holds it");
        // Exactly-once on a push subscription is refused, and so is a bad endpoint by update.
        let exactly_once = SubscriptionUpdate {
            name: "pushed".into(),
            enable_exactly_once_delivery: Some(true),
            ..Default::default()
        };
        refused_naming(router.update_subscription(exactly_once).await, "not supported on push subscriptions");
        let bad = SubscriptionUpdate {
            name: "pushed".into(),
            push: Some(push_to("https:///")),
            ..Default::default()
        };
        refused_naming(router.update_subscription(bad).await, "no host");
        assert_eq!(router.get_subscription("pushed").unwrap().settings.push, push, "refusals change nothing");
        // An update of something else leaves it.
        let deadline = SubscriptionUpdate {
            name: "pushed".into(),
            ack_deadline_seconds: Some(30),
            ..Default::default()
        };
        assert_eq!(router.update_subscription(deadline).await.unwrap().settings.push, push);

        let node = restart(&disk, node).await;
        let router = &node.router;
        assert_eq!(router.get_subscription("pushed").unwrap().settings.push, push, "kept across a restart");
        assert_eq!(served(&node).as_deref(), push.as_deref(), "attached again with it");
        // Back to pull in place; then exactly-once is allowed, and push beside it is refused.
        let pull = SubscriptionUpdate { name: "pushed".into(), push: Some(None), ..Default::default() };
        assert_eq!(router.update_subscription(pull).await.unwrap().settings.push, None);
        assert_eq!(served(&node), None);
        let exactly_once = SubscriptionUpdate {
            name: "pushed".into(),
            enable_exactly_once_delivery: Some(true),
            ..Default::default()
        };
        assert!(
            router.update_subscription(exactly_once).await.unwrap().settings.enable_exactly_once_delivery
        );
        let again =
            SubscriptionUpdate { name: "pushed".into(), push: push.clone().map(Some), ..Default::default() };
        refused_naming(router.update_subscription(again).await, "not supported on push subscriptions");
        assert_eq!(router.get_subscription("pushed").unwrap().settings.push, None);
    });
}

/// A detached subscription stays in the catalog without its topic: its forwarder dropped it,
/// the pull waiting on it ends with FailedPrecondition, and so do a lookup, a seek and a
/// snapshot; it is no longer listed among its topic's subscriptions; all of it across a restart.
#[test]
fn a_detached_subscription_stays_but_leaves_its_topic() {
    sim::run(0, async {
        let disk = SimDisk::new();
        let node = start(&disk).await;
        node.router.create_topic(topic("orders", Labels::new())).await.unwrap();
        for name in ["audit", "billing"] {
            let created = subscription(name, "orders", SubscriptionSettings::default());
            node.router.create_subscription(created).await.unwrap();
        }
        publish(&node, "orders", "first").await;
        let delivered = node.forwarder.pull("audit", PullSettings::new(10, 0).unwrap()).await.unwrap();
        assert_eq!(delivered.map(|delivery| delivery.messages.len()), Some(1));
        let waiting = {
            let forwarder = node.forwarder.clone();
            crate::runtime::spawn(async move {
                forwarder
                    .pull("audit", PullSettings::new(10, 30_000).unwrap())
                    .await
                    .map(|delivery| delivery.is_some())
            })
        };
        crate::runtime::sleep(Duration::from_millis(1)).await;
        node.router.detach_subscription("audit").await.unwrap();
        let ended = Status::from(waiting.await.unwrap_err());
        assert_eq!(ended.code, ErrorCode::FailedPrecondition, "{ended}");
        assert_eq!(ended.message, "subscription 'audit' is detached");
        node.router.detach_subscription("audit").await.unwrap();
        assert_eq!(node.router.detach_subscription("missing").await.unwrap_err().code(), ErrorCode::NotFound);

        let node = check_detached(node).await;
        let node = check_detached(restart(&disk, node).await).await;
        // The other subscription of the topic was not touched.
        publish(&node, "orders", "second").await;
        let delivered = node.forwarder.pull("billing", PullSettings::new(10, 0).unwrap()).await.unwrap();
        assert_eq!(delivered.map(|delivery| delivery.messages.len()), Some(2));
        // It can still be updated (in the catalog) and deleted.
        let changes = SubscriptionUpdate {
            name: "audit".into(),
            labels: Some(labels(&[("a", "b")])),
            ..Default::default()
        };
        let updated = node.router.update_subscription(changes).await.unwrap();
        assert!(updated.detached && updated.topic == DELETED_TOPIC);
        node.router.delete_subscription("audit").await.unwrap();
        assert_eq!(node.router.get_subscription("audit").unwrap_err().code(), ErrorCode::NotFound);
    });
}

async fn check_detached(node: Node) -> Node {
    let router = &node.router;
    let audit = router.get_subscription("audit").unwrap();
    assert!(audit.detached);
    assert_eq!(audit.topic, DELETED_TOPIC);
    assert!(!router.get_subscription("billing").unwrap().detached);
    let listed: Vec<String> = router
        .list_subscriptions(&ListRequest { topic: "orders".into(), ..Default::default() }, |_| true)
        .items
        .into_iter()
        .map(|subscription| subscription.name)
        .collect();
    assert_eq!(listed, ["billing"]);
    assert!(router
        .list_subscriptions(&ListRequest::default(), |_| true)
        .items
        .iter()
        .any(|s| s.name == "audit" && s.detached));
    let precondition = |error: ControlError| {
        let status = Status::from(error);
        assert_eq!(status.code, ErrorCode::FailedPrecondition, "{status}");
        assert!(status.message.contains("is detached"), "{status}");
    };
    precondition(router.lookup_subscription("audit", None, None).unwrap_err());
    precondition(router.seek("audit", SeekTarget::Time { time_ms: 0 }).await.unwrap_err());
    precondition(router.create_snapshot("of-audit", "audit", Labels::new()).await.unwrap_err());
    // The forwarder serves it no more: a client asks the router again, which says why.
    let served = node.forwarder.pull("audit", PullSettings::new(10, 0).unwrap()).await;
    assert_eq!(served.err().map(|error| Status::from(error).code), Some(ErrorCode::NotOwner));
    node
}

/// A subscription whose expiration policy never expires is kept however long it is idle, and
/// the arithmetic of its ttl does not overflow; one with the default policy expires.
#[test]
fn a_subscription_that_never_expires_is_kept() {
    sim::run(0, async {
        let disk = SimDisk::new();
        let clock = crate::clock::ManualClock::default();
        let node = start_with_clock(&disk, Rc::new(clock.clone())).await;
        node.router.create_topic(topic("orders", Labels::new())).await.unwrap();
        let never = SubscriptionSettings {
            expiration_ttl_seconds: EXPIRATION_TTL_SECONDS_NEVER,
            ..Default::default()
        };
        let created = node.router.create_subscription(subscription("kept", "orders", never)).await.unwrap();
        assert_eq!(created.settings.expiration_ttl_seconds, EXPIRATION_TTL_SECONDS_NEVER);
        let default = subscription("expiring", "orders", SubscriptionSettings::default());
        node.router.create_subscription(default).await.unwrap();
        // The forwarder measures idleness on the wall clock.
        clock.jump_wall_ms(400 * 24 * 3600 * 1000);
        node.router.expire_subscriptions().await;
        assert!(node.router.get_subscription("kept").is_ok());
        assert_eq!(node.router.get_subscription("expiring").unwrap_err().code(), ErrorCode::NotFound);
    });
}

/// A router with two forwarders (shards 0 and 1) on `disk`, started as `start` starts one.
async fn start_two(disk: &SimDisk) -> Rc<Router<SimDisk>> {
    let paths = vec![PathBuf::from("/d0")];
    let catalog = Catalog::open(disk.clone(), Directories::new(paths.clone()), 2, BALANCE_FACTOR_DEFAULT)
        .await
        .unwrap();
    let links = (0..2)
        .map(|shard| {
            let forwarder = Rc::new(Forwarder::new(
                shard,
                disk.clone(),
                Directories::new(paths.clone()),
                LogConfig::default(),
                Rc::new(SystemClock),
            ));
            ForwarderLink::local(Box::new(move |request| {
                let forwarder = forwarder.clone();
                Box::pin(async move { forwarder.control(request).await })
            }))
        })
        .collect();
    let addresses = ForwarderAddresses::new(vec![7451, 7452], Advertise::Host("simulated".into()));
    let router = Rc::new(Router::new(
        disk.clone(),
        Directories::new(paths),
        catalog,
        links,
        addresses,
        BALANCE_FACTOR_DEFAULT,
    ));
    router.recover().await.unwrap();
    router
}

fn failed_precondition<T: std::fmt::Debug>(result: Result<T, ControlError>) {
    let status = Status::from(result.unwrap_err());
    assert_eq!(status.code, ErrorCode::FailedPrecondition, "{status}");
}

/// On two forwarder shards, a topic of two sources has one on each; a third is refused (one
/// source of a topic per shard), before anything is created; the count rises by an update, and
/// lowered retires the highest source, which a restart keeps retiring and which is deleted
/// once delivered out; the sources outlive a restart and go with their topic.
#[test]
fn a_topics_sources_are_placed_one_per_shard_and_retired_from_the_top() {
    sim::run(0, async {
        let disk = SimDisk::new();
        let router = start_two(&disk).await;
        let hot = router.create_topic(Topic { sources: 2, ..topic("hot", Labels::new()) }).await.unwrap();
        assert_eq!(hot.sources, 2);
        assert_eq!(hot.source_leaders.len(), 2);
        assert_ne!(hot.source_leaders[0], hot.source_leaders[1]);
        assert_eq!(router.get_topic("hot").unwrap().source_leaders, hot.source_leaders);

        failed_precondition(router.create_topic(Topic { sources: 3, ..topic("wide", Labels::new()) }).await);
        assert!(router.get_topic("wide").is_err(), "a refused topic was created");
        let past_max =
            Topic { sources: crate::ids::SOURCES_PER_TOPIC_MAX + 1, ..topic("wide", Labels::new()) };
        refused_naming(router.create_topic(past_max).await, "SOURCES_PER_TOPIC_MAX");

        // Lowered, its highest source retires: still listed, no longer counted active, and
        // no source is added while one retires.
        let hot_id = router.catalog_state().topics["hot"].id;
        let lower = TopicUpdate { name: "hot".into(), sources: Some(1), ..Default::default() };
        assert_eq!(router.update_topic(lower).await.unwrap().sources, 2);
        assert_eq!(router.catalog_state().active_sources(hot_id), 1);
        let more = TopicUpdate { name: "hot".into(), sources: Some(3), ..Default::default() };
        failed_precondition(router.update_topic(more).await);
        failed_precondition(router.retire_source("hot").await);

        let warm = router.create_topic(topic("warm", Labels::new())).await.unwrap();
        assert_eq!(warm.sources, 1);
        let raise = TopicUpdate { name: "warm".into(), sources: Some(2), ..Default::default() };
        let warm = router.update_topic(raise).await.unwrap();
        assert_eq!(warm.sources, 2);
        assert_ne!(warm.source_leaders[0], warm.source_leaders[1]);
        let listed = router.list_topics(&ListRequest::default(), |_| true);
        assert_eq!(listed.items.iter().map(|topic| topic.sources).collect::<Vec<_>>(), [2, 2]);
        // The cluster's status places each source after its topic, by its placement key.
        let (placements, omitted) = router.topic_placements();
        let names: Vec<&str> = placements.iter().map(|placement| placement.name.as_str()).collect();
        assert_eq!((names, omitted), (vec!["hot", "hot#1", "warm", "warm#1"], 0));

        sim::kill_spawned_tasks();
        drop(router);
        disk.crash(CrashMode::DropUnsynced);
        let router = start_two(&disk).await;
        assert_eq!(router.get_topic("hot").unwrap().source_leaders, hot.source_leaders);
        assert_eq!(router.get_topic("warm").unwrap().source_leaders, warm.source_leaders);
        assert_eq!(router.catalog_state().active_sources(hot_id), 1, "a restart ended a retirement");

        // With no subscription, the retiring source is delivered out: the pass deletes it.
        router.sources_pass().await;
        assert_eq!(router.get_topic("hot").unwrap().source_leaders, hot.source_leaders[..1]);
        assert_eq!(router.get_topic("warm").unwrap().source_leaders, warm.source_leaders);

        router.delete_topic("hot").await.unwrap();
        let hot_id = router
            .catalog_state()
            .source_units
            .values()
            .filter(|(topic, _)| router.catalog_state().topic_by_id(*topic).is_none())
            .count();
        assert_eq!(hot_id, 0, "a deleted topic's source is left in the catalog");
        assert_eq!(router.catalog_state().sources.len(), 1);
    });
}

/// A topic's sources follow its load once asked (`--sources auto`): the bounds default to what
/// placement gives (two shards here), a minimum adds sources at once, the policy outlives a
/// restart, a count asked for fixes it again, and bounds out of order, past
/// `SOURCES_AUTO_MAX` or under what the topic has are refused.
#[test]
fn a_topics_sources_follow_its_load_once_asked_and_a_count_fixes_them_again() {
    use crate::catalog::SourceBounds;
    use crate::router::follow::SOURCES_AUTO_MAX;
    sim::run(0, async {
        let disk = SimDisk::new();
        let router = start_two(&disk).await;
        router.create_topic(topic("hot", Labels::new())).await.unwrap();
        assert_eq!(router.get_topic("hot").unwrap().source_policy, None);
        let auto = |min, max| TopicUpdate {
            name: "hot".into(),
            sources_auto: Some(SourceBounds { min, max }),
            ..Default::default()
        };
        let hot = router.update_topic(auto(1, 0)).await.unwrap();
        assert_eq!((hot.sources, hot.source_policy), (1, Some(SourceBounds { min: 1, max: 2 })));
        refused_naming(router.update_topic(auto(1, SOURCES_AUTO_MAX + 1)).await, "SOURCES_AUTO_MAX");
        let hot = router.update_topic(auto(2, 2)).await.unwrap();
        assert_eq!((hot.sources, hot.source_policy), (2, Some(SourceBounds { min: 2, max: 2 })));
        let followed = router.followed_topics(usize::MAX);
        assert_eq!(followed.len(), 1);
        assert_eq!(
            (followed[0].name.as_str(), followed[0].sources, followed[0].last_decision),
            ("hot", 2, None)
        );
        // Bounds below the count retire the highest sources at once (listed until deleted).
        let hot = router.update_topic(auto(1, 1)).await.unwrap();
        assert_eq!((hot.sources, hot.source_policy), (2, Some(SourceBounds { min: 1, max: 1 })));
        let id = router.catalog_state().topics["hot"].id;
        assert_eq!(router.catalog_state().active_sources(id), 1);
        // A count above the active ones is refused while a source retires.
        failed_precondition(router.update_topic(auto(2, 2)).await);

        sim::kill_spawned_tasks();
        drop(router);
        disk.crash(CrashMode::DropUnsynced);
        let router = start_two(&disk).await;
        assert_eq!(router.get_topic("hot").unwrap().source_policy, Some(SourceBounds { min: 1, max: 1 }));
        assert_eq!(router.catalog_state().active_sources(id), 1, "still retiring after the restart");
        let fixed = TopicUpdate { name: "hot".into(), sources: Some(1), ..Default::default() };
        let hot = router.update_topic(fixed).await.unwrap();
        assert_eq!(hot.source_policy, None);
        assert!(router.catalog_state().source_policies.is_empty());
        assert_eq!(router.followed_topics(usize::MAX), Vec::new());
    });
}

/// A subscription served on two sources is idle for its expiration policy only as long as on
/// the one where it was last active.
#[test]
fn a_subscription_is_idle_as_long_as_on_its_busiest_source() {
    use crate::api::stats::{Stats, SubscriptionStats, TopicStats};
    let on = |shard: u32, idle: &[(&str, u64)]| TopicStats {
        name: "hot".into(),
        shard,
        subscriptions: idle
            .iter()
            .map(|(name, idle_ms)| SubscriptionStats {
                name: (*name).into(),
                idle_ms: *idle_ms,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let stats = Stats {
        topics: vec![on(0, &[("busy", 9_000), ("still", 9_000)]), on(1, &[("busy", 10), ("still", 8_000)])],
        ..Default::default()
    };
    let idle = super::subscriptions::idle_everywhere(&stats);
    assert_eq!(idle.into_iter().collect::<Vec<_>>(), [("busy".to_owned(), 10), ("still".to_owned(), 8_000)]);
}

/// A subscription created while a source is added to its topic is served on that source too.
/// The creation read the topic's units before the source's `SourceAdded` applied, and the
/// source attached only the subscriptions committed when it read them, before the creation's
/// entry: so neither attached it there, and what was published to the new source never reached
/// it until that source's next start (the cluster simulation with topics of several sources,
/// seed 92). The creation begins at steps of `STEP` after the update, so that some begin while
/// the source is being attached, before its entry commits (step 10 of 40 did, here).
#[test]
fn a_subscription_created_while_a_source_is_added_is_served_on_it() {
    const STEPS: u32 = 40;
    const STEP: Duration = Duration::from_nanos(100);
    for step in 0..STEPS {
        sim::run(0, async move {
            let disk = SimDisk::new();
            let router = start_two(&disk).await;
            router.create_topic(topic("warm", Labels::new())).await.unwrap();
            let raise = TopicUpdate { name: "warm".into(), sources: Some(2), ..Default::default() };
            let adding = router.update_topic(raise);
            let creating = async {
                crate::runtime::sleep(STEP * step).await;
                router.create_subscription(subscription("late", "warm", Default::default())).await
            };
            let (added, created) = futures_lite::future::zip(adding, creating).await;
            added.unwrap();
            created.unwrap();
            let stats = router.stats().await.unwrap();
            let served: Vec<(u32, bool)> = stats
                .topics
                .iter()
                .filter(|topic| topic.name == "warm")
                .map(|topic| {
                    (topic.source.get(), topic.subscriptions.iter().any(|served| served.name == "late"))
                })
                .collect();
            assert_eq!(served.len(), 2, "step {step}: the topic's two sources: {served:?}");
            assert!(
                served.iter().all(|(_, late)| *late),
                "step {step}: a source does not serve it: {served:?}"
            );
            sim::kill_spawned_tasks();
        });
    }
}

/// Which of topic "hot"'s sources serve subscription "reader", by source number.
async fn reader_served_on_hot(router: &Router<SimDisk>) -> Vec<(u32, bool)> {
    let stats = router.stats().await.unwrap();
    stats
        .topics
        .iter()
        .filter(|topic| topic.name == "hot")
        .map(|topic| (topic.source.get(), topic.subscriptions.iter().any(|served| served.name == "reader")))
        .collect()
}

/// A router of two shards with topic "hot" of two sources and subscription "reader", which
/// source 1 then no longer serves, as if its attach had not reached it.
async fn reader_missing_on_source_1(disk: &SimDisk) -> Rc<Router<SimDisk>> {
    let router = start_two(disk).await;
    router.create_topic(Topic { sources: 2, ..topic("hot", Labels::new()) }).await.unwrap();
    router.create_subscription(subscription("reader", "hot", Default::default())).await.unwrap();
    assert_eq!(reader_served_on_hot(&router).await, [(0, true), (1, true)]);
    let record = router.subscription_record("reader").unwrap();
    let topic_id = router.catalog_state().topics["hot"].id;
    let unit = router.units_of(topic_id)[1];
    let detach = ControlRequest::DetachSubscription {
        subscription_id: record.id,
        name: record.name.to_string(),
        topic_id: unit.id,
        deleted: false,
    };
    router.call_forwarder(unit.shard, detach).await.unwrap();
    assert_eq!(reader_served_on_hot(&router).await, [(0, true), (1, false)]);
    router
}

/// An update asking for the count of sources a topic has serves each subscription on each
/// source again, as the error of an update whose source did not take every subscription says
/// (`NotApplied`: "when the update is sent again"). Before, it changed nothing, and the
/// subscription got none of that source's messages until its next start (the cluster
/// simulation with topics of several sources, seed 169: the new source's forwarder was
/// unreachable as the subscriptions were attached).
#[test]
fn an_update_sent_again_serves_every_subscription_on_every_source() {
    sim::run(0, async {
        let router = reader_missing_on_source_1(&SimDisk::new()).await;
        let again = TopicUpdate { name: "hot".into(), sources: Some(2), ..Default::default() };
        router.update_topic(again).await.unwrap();
        assert_eq!(reader_served_on_hot(&router).await, [(0, true), (1, true)]);
        sim::kill_spawned_tasks();
    });
}

/// The catalog leader's pass gives a later source of one replica every subscription of its
/// topic before it first tells it a count (`serve_before_count`): a count lets the source take
/// publishes, and one serving no subscription lets them go as acknowledged by all. The cluster
/// simulation (topics of several sources, seed 165) found a source added while its node was
/// unreachable, so without its subscriptions, made active by the pass, and 16 acknowledged
/// publishes gone by the time its subscription was attached.
#[test]
fn the_sources_pass_serves_every_subscription_on_a_source_before_telling_it_a_count() {
    sim::run(0, async {
        let router = reader_missing_on_source_1(&SimDisk::new()).await;
        // As a router that has told it no count yet (the catalog's next leader, or this one
        // when the add stopped before its count): the creation told it one here.
        router.sources_served.borrow_mut().clear();
        router.sources_pass().await;
        assert_eq!(reader_served_on_hot(&router).await, [(0, true), (1, true)], "served before its count");
        sim::kill_spawned_tasks();
    });
}

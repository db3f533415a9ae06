//! A topic's sources each take the ordering keys the key map gives them under the topic's
//! active count, and refuse the others (and a retiring source everything) with `NotOwner`, so
//! that at any moment one source takes a key.

use super::sources::{forwarders, leader_shards, Forwarder};
use ringpost_client::{block_on, ErrorCode};
use ringpost_model::sources::source_of_key;
use ringpost_tests::{succeeded, Daemon};
use ringpost_wire::frame::{decode_body, decode_error};
use ringpost_wire::messages::{PublishRequest, PublishResponse, PubsubMessage};

/// A key the key map gives source `source` of `active`.
pub(super) fn key_of(source: u32, active: u32) -> String {
    (0u32..).map(|n| format!("key-{n}")).find(|key| source_of_key(key.as_bytes(), active) == source).unwrap()
}

impl Forwarder {
    /// Publishes one message with ordering key `key` (none when empty): its message id, or the
    /// code it was refused with.
    pub(super) fn publish_keyed(&self, topic: &str, key: &str, data: &str) -> Result<u64, ErrorCode> {
        let message = PubsubMessage {
            data: data.as_bytes().to_vec(),
            attributes: Vec::new(),
            ordering_key: key.to_owned(),
        };
        let request = PublishRequest { topic: topic.to_owned(), messages: vec![message] };
        let response = block_on(self.0.call(ringpost_wire::Command::Publish.code(), &request)).unwrap();
        if response.header.is_error() {
            return Err(decode_error(&response.body).code);
        }
        Ok(decode_body::<PublishResponse>(&response.body).unwrap().message_ids[0])
    }
}

/// Two shards, a topic of two sources: an ordered publish sent to the source its key does not
/// map to is refused `NotOwner`, at its own source taken; unordered ones are taken by both;
/// and a restart keeps it so (each source learns the count from the catalog at attach).
#[test]
fn an_ordered_publish_is_taken_only_at_its_keys_source() {
    let mut daemon = Daemon::start("source-keys");
    let leaders = leader_shards(&succeeded(&daemon.cli(&["topic", "create", "keyed", "--sources", "2"])));
    assert_eq!(leaders.len(), 2);
    let keys = [key_of(0, 2), key_of(1, 2)];
    for round in ["before", "after a restart"] {
        let addresses = forwarders(&daemon);
        let at = |source: usize| Forwarder::connect(&addresses[leaders[source] as usize]);
        for source in 0..2 {
            let id = at(source)
                .publish_keyed("keyed", &keys[source], "mine")
                .unwrap_or_else(|code| panic!("{round}: source {source} refused its own key with {code:?}"));
            assert_eq!(id >> 52, source as u64, "{round}");
            let other = &keys[1 - source];
            assert_eq!(
                at(source).publish_keyed("keyed", other, "not mine"),
                Err(ErrorCode::NotOwner),
                "{round}: source {source} took key '{other}'"
            );
            assert!(at(source).publish_keyed("keyed", "", "unordered").is_ok(), "{round}");
        }
        if round == "before" {
            daemon.restart();
        }
    }
}

/// Entries in every data directory's `topics` folders: one per unit (a topic's own log, or a
/// source's).
fn unit_folders(daemon: &Daemon) -> usize {
    daemon.data_dirs.iter().flat_map(|dir| super::sources::topic_folders(dir)).map(|(_, count)| count).sum()
}

/// A topic of two sources lowered to one: its source 1 retires. Publishes there are refused
/// `NotOwner` (every key now maps to source 0, which takes them), a restart keeps it retiring,
/// its subscriber still receives what it held, and once that is acknowledged the source is
/// deleted: `topic get` shows one source and its folder is gone.
#[test]
fn a_retired_source_takes_no_publish_is_delivered_out_and_deleted() {
    let mut daemon = Daemon::start("source-retired");
    let leaders = leader_shards(&succeeded(&daemon.cli(&["topic", "create", "cooling", "--sources", "2"])));
    ringpost_tests::create_subscription(&daemon.client(), "cooling-sub", "cooling", 10);
    let sent: Vec<String> = (0..3).map(|index| format!("held-{index}")).collect();
    let addresses = forwarders(&daemon);
    assert_eq!(Forwarder::connect(&addresses[leaders[1] as usize]).publish("cooling", &sent).len(), 3);
    let folders = unit_folders(&daemon);

    let lowered = succeeded(&daemon.cli(&["topic", "update", "cooling", "--sources", "1"]));
    assert_eq!(leader_shards(&lowered), leaders, "a retiring source is still listed: {lowered}");
    let key = key_of(1, 2);
    for round in ["retiring", "retiring after a restart"] {
        let addresses = forwarders(&daemon);
        let retiring = Forwarder::connect(&addresses[leaders[1] as usize]);
        assert_eq!(retiring.publish_keyed("cooling", "", "late"), Err(ErrorCode::NotOwner), "{round}");
        assert_eq!(retiring.publish_keyed("cooling", &key, "late"), Err(ErrorCode::NotOwner), "{round}");
        let first = Forwarder::connect(&addresses[leaders[0] as usize]);
        assert_eq!(first.publish_keyed("cooling", &key, "moved").map(|id| id >> 52), Ok(0), "{round}");
        if round == "retiring" {
            daemon.restart();
        }
    }
    let addresses = forwarders(&daemon);
    let retiring = Forwarder::connect(&addresses[leaders[1] as usize]);
    let received = retiring.pull("cooling-sub", sent.len());
    let mut payloads: Vec<String> =
        received.iter().map(|m| String::from_utf8(m.data.clone()).unwrap()).collect();
    payloads.sort();
    assert_eq!(payloads, sent);
    // Not yet acknowledged: still there a few passes later.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert_eq!(leader_shards(&succeeded(&daemon.cli(&["topic", "get", "cooling"]))), leaders);
    retiring.settle("cooling-sub", received.iter().map(|m| m.ack_id.clone()).collect(), None);

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let shown = succeeded(&daemon.cli(&["topic", "get", "cooling"]));
        if leader_shards(&shown) == leaders[..1] {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the delivered-out source was not deleted: {shown}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(unit_folders(&daemon), folders - 1, "the deleted source's folder is left");
    // Source 0 delivers what moved to it.
    let first = Forwarder::connect(&addresses[leaders[0] as usize]);
    assert_eq!(first.pull("cooling-sub", 2).len(), 2);
}

/// The delivery gate (docs/SOURCES.md, rule 3): an ordered subscription of a topic of one
/// source, keys published there, the topic raised to two sources and more of the same keys
/// published (those of the key that moved go to source 1). Source 1 holds the moved key's
/// messages while its earlier ones on source 0 are unacknowledged; the subscriber, pulling
/// both sources and acknowledging slowly, gets every key in publish order; and a next change
/// is refused until the subscription passed this one.
#[test]
fn a_moved_key_is_delivered_from_its_new_source_only_after_its_old_messages_are_acknowledged() {
    let daemon = Daemon::start("source-gate");
    succeeded(&daemon.cli(&["topic", "create", "gated"]));
    succeeded(&daemon.cli(&[
        "sub",
        "create",
        "gated-sub",
        "--topic",
        "gated",
        "--ordering",
        "--ack-deadline",
        "60",
    ]));
    let (moved, stayed) = (key_of(1, 2), key_of(0, 2));
    let addresses = forwarders(&daemon);
    let leaders = leader_shards(&succeeded(&daemon.cli(&["topic", "get", "gated"])));
    let first = Forwarder::connect(&addresses[leaders[0] as usize]);
    for index in 0..2 {
        for key in [&moved, &stayed] {
            first.publish_keyed("gated", key, &format!("{key}/{index}")).unwrap();
        }
    }
    let leaders = leader_shards(&succeeded(&daemon.cli(&["topic", "update", "gated", "--sources", "2"])));
    assert_eq!(leaders.len(), 2);
    let second = Forwarder::connect(&addresses[leaders[1] as usize]);
    for index in 2..4 {
        second.publish_keyed("gated", &moved, &format!("{moved}/{index}")).unwrap();
        first.publish_keyed("gated", &stayed, &format!("{stayed}/{index}")).unwrap();
    }
    let refused = ringpost_tests::failed(&daemon.cli(&["topic", "update", "gated", "--sources", "1"]));
    assert!(refused.contains("has not passed"), "a second change at once: {refused}");

    // Source 1 holds the moved key while its first messages on source 0 are out.
    assert!(second.pull("gated-sub", 0).is_empty(), "the moved key came from its new source first");
    let mut delivered: Vec<String> = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while delivered.len() < 8 {
        assert!(std::time::Instant::now() < deadline, "only {delivered:?} came");
        for source in [&first, &second] {
            let received = source.pull("gated-sub", 0);
            delivered.extend(received.iter().map(|m| String::from_utf8(m.data.clone()).unwrap()));
            // The subscriber acknowledges slowly.
            std::thread::sleep(std::time::Duration::from_millis(300));
            if !received.is_empty() {
                source.settle("gated-sub", received.iter().map(|m| m.ack_id.clone()).collect(), None);
            }
        }
    }
    for key in [&moved, &stayed] {
        let order: Vec<&String> =
            delivered.iter().filter(|data| data.starts_with(&format!("{key}/"))).collect();
        let expected: Vec<String> = (0..4).map(|index| format!("{key}/{index}")).collect();
        assert_eq!(
            order,
            expected.iter().collect::<Vec<_>>(),
            "key {key} out of publish order: {delivered:?}"
        );
    }
}

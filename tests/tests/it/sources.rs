//! A topic of several publish sources through the CLI: each source placed on a forwarder shard
//! of its own, the count raised and never lowered, and every source kept across a restart.

use ringpost_client::block_on;
use ringpost_tests::{create_subscription, failed, json_field, succeeded, Daemon};
use ringpost_wire::frame::decode_body;
use std::time::Duration;

/// Each source's leader shard in a topic's JSON, source 0 first.
pub(super) fn leader_shards(json: &str) -> Vec<u32> {
    json.split("\"leader_shard\":")
        .skip(1)
        .map(|rest| rest.chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap())
        .collect()
}

#[test]
fn a_topic_of_two_sources_has_one_on_each_shard_and_keeps_them_across_a_restart() {
    let mut daemon = Daemon::start("sources");
    let created = succeeded(&daemon.cli(&["topic", "create", "hot", "--sources", "2"]));
    let mut shards = leader_shards(&created);
    assert_eq!(shards.len(), 2, "{created}");
    shards.sort_unstable();
    assert_eq!(shards, [0, 1], "{created}");
    assert_eq!(succeeded(&daemon.cli(&["topic", "get", "hot"])), created);

    // Two shards hold one source of a topic each: a third has nowhere to go, and a source is
    // never retired yet.
    for count in ["3", "1"] {
        let refused = failed(&daemon.cli(&["topic", "update", "hot", "--sources", count]));
        assert!(refused.starts_with("FailedPrecondition"), "--sources {count}: {refused}");
    }
    let refused = failed(&daemon.cli(&["topic", "create", "wide", "--sources", "3"]));
    assert!(refused.starts_with("FailedPrecondition"), "{refused}");
    assert!(failed(&daemon.cli(&["topic", "get", "wide"])).starts_with("NotFound"));

    succeeded(&daemon.cli(&["topic", "create", "warm"]));
    assert_eq!(leader_shards(&succeeded(&daemon.cli(&["topic", "get", "warm"]))).len(), 1);
    let raised = succeeded(&daemon.cli(&["topic", "update", "warm", "--sources", "2"]));
    let mut shards = leader_shards(&raised);
    shards.sort_unstable();
    assert_eq!(shards, [0, 1], "{raised}");

    // Source 0 is the topic as it always was: publishing to it works as before.
    succeeded(&daemon.cli_with_input(&["publish", "hot"], Some("a message\n")));

    daemon.restart();
    assert_eq!(succeeded(&daemon.cli(&["topic", "get", "hot"])), created);
    assert_eq!(succeeded(&daemon.cli(&["topic", "get", "warm"])), raised);
}

/// Every directory named `topics` under `root` (a data directory's topic logs), with how many
/// entries each holds.
fn topic_folders(root: &std::path::Path) -> Vec<(std::path::PathBuf, usize)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        if path.file_name().is_some_and(|name| name == "topics") {
            found.push((path.clone(), std::fs::read_dir(&path).unwrap().count()));
        } else {
            found.extend(topic_folders(&path));
        }
    }
    found
}

/// A forwarder's port, spoken to directly, as a client that knows which shard serves which
/// source would.
pub(super) struct Forwarder(std::sync::Arc<ringpost_client::Connection>);

impl Forwarder {
    pub(super) fn connect(address: &str) -> Forwarder {
        Forwarder(ringpost_client::Connection::connect(address).unwrap())
    }

    /// The answer's body, to decode as the command's answer.
    fn call<T: ringpost_wire::frame::Body>(
        &self,
        command: ringpost_wire::Command,
        request: &T,
    ) -> ringpost_wire::frame::FrameBuffer {
        block_on(self.0.call(command.code(), request)).unwrap().body
    }

    pub(super) fn publish(&self, topic: &str, payloads: &[String]) -> Vec<u64> {
        use ringpost_wire::messages::{PublishRequest, PublishResponse, PubsubMessage};
        let messages = payloads
            .iter()
            .map(|data| PubsubMessage {
                data: data.clone().into_bytes(),
                attributes: Vec::new(),
                ordering_key: String::new(),
            })
            .collect();
        let body =
            self.call(ringpost_wire::Command::Publish, &PublishRequest { topic: topic.to_owned(), messages });
        decode_body::<PublishResponse>(&body).unwrap().message_ids
    }

    /// Pulls until `count` messages came (or 10 s passed), then once more briefly to see that
    /// no more come.
    pub(super) fn pull(&self, subscription: &str, count: usize) -> Vec<ringpost_client::ReceivedMessage> {
        use ringpost_wire::messages::{PullRequest, PullResponse};
        let mut received = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let wait_ms =
                if received.len() < count && std::time::Instant::now() < deadline { 1000 } else { 200 };
            let request = PullRequest { subscription: subscription.to_owned(), max_messages: 100, wait_ms };
            let body = self.call(ringpost_wire::Command::Pull, &request);
            let batch = decode_body::<PullResponse>(&body).unwrap().received_messages;
            let done = batch.is_empty() && (received.len() >= count || std::time::Instant::now() >= deadline);
            received.extend(batch);
            if done {
                return received;
            }
        }
    }

    /// Acknowledges `ack_ids` (or, with `seconds`, sets their deadlines); none refused.
    pub(super) fn settle(&self, subscription: &str, ack_ids: Vec<String>, seconds: Option<u32>) {
        use ringpost_wire::messages::{AckResponse, AcknowledgeRequest, ModifyAckDeadlineRequest};
        let subscription = subscription.to_owned();
        let body = match seconds {
            None => {
                self.call(ringpost_wire::Command::Acknowledge, &AcknowledgeRequest { subscription, ack_ids })
            }
            Some(ack_deadline_seconds) => self.call(
                ringpost_wire::Command::ModifyAckDeadline,
                &ModifyAckDeadlineRequest { subscription, ack_ids, ack_deadline_seconds },
            ),
        };
        let answer = decode_body::<AckResponse>(&body).unwrap();
        assert!(answer.invalid_ack_ids.is_empty(), "refused: {:?}", answer.invalid_ack_ids);
    }
}

/// The forwarders' addresses from the daemon's last start line (they change at each start).
pub(super) fn forwarders(daemon: &Daemon) -> Vec<String> {
    let log = daemon.log();
    let line = log.lines().rev().find(|line| line.contains("(router) with")).expect("a start line");
    let list = line.split(" on ").nth(2).unwrap().split(';').next().unwrap();
    list.split(", ").map(str::to_owned).collect()
}

/// The source a message id names (the bits above its offset).
pub(super) fn source_of(message_id: u64) -> u64 {
    message_id >> 52
}

/// Sorted payloads of `messages`.
pub(super) fn payloads(messages: &[ringpost_client::ReceivedMessage]) -> Vec<String> {
    let mut payloads: Vec<String> =
        messages.iter().map(|m| String::from_utf8(m.data.clone()).unwrap()).collect();
    payloads.sort();
    payloads
}

/// A topic of two sources, one on each shard, is hosted: published directly at each source's
/// forwarder, every message is delivered by pulling at that forwarder, with message ids and ack
/// ids naming the source; acknowledgements and redelivery work per source and survive a
/// restart; a subscription created after messages were published on a source does not get them
/// (its sync point there); seeking to a time rewinds every source; deleting the topic deletes
/// every source's log.
#[test]
fn a_topics_sources_are_each_hosted_on_their_shard_with_their_own_sync_points() {
    const PER_SOURCE: usize = 5;
    let mut daemon = Daemon::start("sources-hosted");
    let created = succeeded(&daemon.cli(&["topic", "create", "hosted", "--sources", "2"]));
    let leaders = leader_shards(&created);
    assert_eq!(leaders.len(), 2, "{created}");
    let early = "hosted-early";
    create_subscription(&daemon.client(), early, "hosted", 10);

    let addresses = forwarders(&daemon);
    let at = |daemon_addresses: &[String], source: usize| {
        Forwarder::connect(&daemon_addresses[leaders[source] as usize])
    };
    let published = |source: usize, round: &str| -> Vec<String> {
        (0..PER_SOURCE).map(|index| format!("{round}-{source}-{index}")).collect()
    };
    for source in 0..2 {
        let ids = at(&addresses, source).publish("hosted", &published(source, "first"));
        assert_eq!(ids.len(), PER_SOURCE);
        assert!(ids.iter().all(|id| source_of(*id) == source as u64), "source {source}: ids {ids:x?}");
    }
    // Created once each source holds messages: it gets none of them.
    let late = "hosted-late";
    create_subscription(&daemon.client(), late, "hosted", 10);

    for source in 0..2 {
        let forwarder = at(&addresses, source);
        let received = forwarder.pull(early, PER_SOURCE);
        assert_eq!(payloads(&received), published(source, "first"), "source {source}");
        for message in &received {
            assert_eq!(source_of(message.message_id), source as u64);
            assert!(message.ack_id.contains(&format!(".{source}.")), "{}", message.ack_id);
        }
        // Three acknowledged, two given back for redelivery.
        let (acked, nacked) = received.split_at(3);
        forwarder.settle(early, acked.iter().map(|m| m.ack_id.clone()).collect(), None);
        forwarder.settle(early, nacked.iter().map(|m| m.ack_id.clone()).collect(), Some(0));
        let again = forwarder.pull(early, nacked.len());
        assert_eq!(payloads(&again), payloads(nacked), "source {source}: redelivered");
        forwarder.settle(early, again.iter().map(|m| m.ack_id.clone()).collect(), Some(0));
        assert!(
            forwarder.pull(late, 0).is_empty(),
            "source {source}: the late subscription got older messages"
        );
    }

    daemon.restart();
    let addresses = forwarders(&daemon);
    assert_eq!(leader_shards(&succeeded(&daemon.cli(&["topic", "get", "hosted"]))), leaders);
    for source in 0..2 {
        let forwarder = at(&addresses, source);
        // What was not acknowledged before the restart, and only that.
        let kept = forwarder.pull(early, 2);
        let mut expected = published(source, "first")[3..].to_vec();
        expected.sort();
        assert_eq!(payloads(&kept), expected, "source {source} after the restart");
        forwarder.settle(early, kept.iter().map(|m| m.ack_id.clone()).collect(), None);
        assert!(
            forwarder.pull(late, 0).is_empty(),
            "source {source}: the late subscription after the restart"
        );

        // What is published now reaches both.
        let ids = forwarder.publish("hosted", &published(source, "second"));
        assert!(ids.iter().all(|id| source_of(*id) == source as u64));
        for subscription in [early, late] {
            let received = forwarder.pull(subscription, PER_SOURCE);
            assert_eq!(payloads(&received), published(source, "second"), "{subscription} on source {source}");
            forwarder.settle(subscription, received.iter().map(|m| m.ack_id.clone()).collect(), None);
        }
    }

    // A seek to the start rewinds every source.
    block_on(daemon.client().seek(early, 0)).unwrap();
    for source in 0..2 {
        let received = at(&addresses, source).pull(early, 2 * PER_SOURCE);
        let mut expected = [published(source, "first"), published(source, "second")].concat();
        expected.sort();
        assert_eq!(payloads(&received), expected, "source {source} after the seek");
    }

    let data = daemon.data_dirs[0].clone();
    assert!(topic_folders(&data).iter().map(|(_, count)| count).sum::<usize>() >= 2);
    succeeded(&daemon.cli(&["topic", "delete", "hosted"]));
    let left: Vec<_> = topic_folders(&data).into_iter().filter(|(_, count)| *count > 0).collect();
    assert!(left.is_empty(), "the deleted topic's logs are left: {left:?}");
}

/// A source added to a topic that has a subscription serves it from the source's start (all of
/// it was published after the subscription existed), and keeps doing so across a restart;
/// updating the subscription reaches every source.
#[test]
fn a_source_added_after_a_subscription_serves_it_from_its_start() {
    let mut daemon = Daemon::start("sources-added");
    succeeded(&daemon.cli(&["topic", "create", "grown"]));
    let subscription = "grown-before";
    create_subscription(&daemon.client(), subscription, "grown", 10);
    let raised = succeeded(&daemon.cli(&["topic", "update", "grown", "--sources", "2"]));
    let leaders = leader_shards(&raised);
    assert_eq!(leaders.len(), 2, "{raised}");
    let update = ringpost_client::SubscriptionUpdate { ack_deadline_seconds: Some(20), ..Default::default() };
    block_on(daemon.client().update_subscription(subscription, update)).unwrap();

    let sent: Vec<String> = (0..3).map(|index| format!("added-{index}")).collect();
    let added = Forwarder::connect(&forwarders(&daemon)[leaders[1] as usize]);
    let ids = added.publish("grown", &sent);
    assert!(ids.iter().all(|id| source_of(*id) == 1), "{ids:x?}");
    let received = added.pull(subscription, sent.len());
    assert_eq!(payloads(&received), sent);
    added.settle(subscription, received.iter().map(|m| m.ack_id.clone()).collect(), Some(0));

    daemon.restart();
    let added = Forwarder::connect(&forwarders(&daemon)[leaders[1] as usize]);
    let again = added.pull(subscription, sent.len());
    assert_eq!(payloads(&again), sent, "after the restart");
    added.settle(subscription, again.iter().map(|m| m.ack_id.clone()).collect(), None);
    assert!(added.pull(subscription, 0).is_empty());
    succeeded(&daemon.cli(&["topic", "delete", "grown"]));
}

/// `ringpost stats` and `/metrics` name each source of a topic of several sources, each with its
/// own figures (source n is sent n + 2 messages at its own forwarder, so a row's count tells
/// whose it is); a topic of one source reads as before, with no source.
#[test]
fn stats_and_metrics_show_each_source_with_its_own_figures() {
    let monitored = ["--http-listen", "127.0.0.1:0"].map(String::from).to_vec();
    let daemon = Daemon::start_with("sources-stats", Vec::new(), monitored);
    let leaders = leader_shards(&succeeded(&daemon.cli(&["topic", "create", "shown", "--sources", "2"])));
    assert_eq!(leaders.len(), 2);
    succeeded(&daemon.cli(&["topic", "create", "single"]));
    create_subscription(&daemon.client(), "shown-watch", "shown", 10);
    let addresses = forwarders(&daemon);
    for (source, leader) in leaders.iter().enumerate() {
        let messages: Vec<String> = (0..source + 2).map(|index| format!("m{index}")).collect();
        assert_eq!(
            Forwarder::connect(&addresses[*leader as usize]).publish("shown", &messages).len(),
            source + 2
        );
    }
    succeeded(&daemon.cli_with_input(&["publish", "single"], Some("one\n")));

    let json = succeeded(&daemon.cli(&["stats"]));
    let line = |prefix: &str, source: usize| {
        let source = source.to_string();
        json.lines()
            .find(|line| line.starts_with(prefix) && line.contains(&format!("\"source\":{source},")))
            .unwrap_or_else(|| panic!("no {prefix} line of source {source}: {json}"))
    };
    for (source, leader) in leaders.iter().enumerate() {
        let topic = line("{\"topic\":\"shown\",\"shard\"", source);
        assert_eq!(json_field(topic, "shard"), leader.to_string(), "{topic}");
        assert_eq!(json_field(topic, "messages"), (source + 2).to_string(), "{topic}");
        let subscription = line("{\"topic\":\"shown\",\"subscription\"", source);
        assert_eq!(json_field(subscription, "backlog"), (source + 2).to_string(), "{subscription}");
    }
    let single = json.lines().find(|line| line.starts_with("{\"topic\":\"single\",")).expect(&json);
    assert!(!single.contains("\"source\""), "{single}");
    assert_eq!(json_field(single, "messages"), "1");

    let table = succeeded(&daemon.cli(&["--output", "table", "stats"]));
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    let column = |name: &str| header.iter().position(|heading| *heading == name).expect(name);
    let (topic_column, source_column, shard_column) = (column("TOPIC"), column("SOURCE"), column("SHARD"));
    // The topic's and its subscription's rows, in the first table (the topics').
    let mut sources_shown: Vec<(String, String)> = table
        .lines()
        .skip(1)
        .take_while(|row| !row.starts_with("NODE"))
        .map(|row| row.split_whitespace().collect::<Vec<_>>())
        .filter(|cells| cells.get(topic_column) == Some(&"shown"))
        .map(|cells| (cells[source_column].to_owned(), cells[shard_column].to_owned()))
        .collect();
    sources_shown.sort();
    sources_shown.dedup();
    let mut expected: Vec<(String, String)> =
        leaders.iter().enumerate().map(|(source, leader)| (source.to_string(), leader.to_string())).collect();
    expected.sort();
    assert_eq!(sources_shown, expected, "{table}");

    let (status, body) = ringpost_tests::scrape::http_get(
        daemon.http_address.as_ref().expect("the monitoring endpoint"),
        "/metrics",
    );
    assert_eq!(status, 200);
    let scrape = ringpost_tests::scrape::Scrape::parse(&body);
    for source in 0..2 {
        let labels = [("topic", "shown"), ("source", &source.to_string()[..])];
        let published = scrape.value("ringpost_topic_published_messages_total", &labels);
        assert_eq!(published, Some((source + 2) as f64), "source {source}: {body}");
        let labels =
            [("subscription", "shown-watch"), ("topic", "shown"), ("source", &source.to_string()[..])];
        let undelivered = scrape.value("ringpost_subscription_num_undelivered_messages", &labels);
        assert_eq!(undelivered, Some((source + 2) as f64), "source {source}: {body}");
    }
    let single = body
        .lines()
        .find(|line| line.starts_with("ringpost_topic_published_messages_total{topic=\"single\""));
    assert_eq!(single, Some("ringpost_topic_published_messages_total{topic=\"single\"} 1"), "{body}");
}

/// A snapshot of a topic of several sources holds each source's acknowledgements: a seek to it
/// puts every source back where the subscription stood, and a source added after the snapshot
/// replays everything it holds (all of it published after the snapshot); deleting the snapshot
/// drops every source's copy.
#[test]
fn a_seek_to_a_snapshot_puts_every_source_back_and_replays_a_source_added_after_it() {
    let daemon = Daemon::start("sources-snapshot");
    let client = daemon.client();
    succeeded(&daemon.cli(&["topic", "create", "snapped"]));
    let subscription = "snapped-sub";
    create_subscription(&client, subscription, "snapped", 60);
    let addresses = forwarders(&daemon);
    let leaders = leader_shards(&succeeded(&daemon.cli(&["topic", "get", "snapped"])));
    let first = Forwarder::connect(&addresses[leaders[0] as usize]);
    let sent = |prefix: &str, count: usize| -> Vec<String> {
        (0..count).map(|index| format!("{prefix}{index}")).collect()
    };
    let ack = |forwarder: &Forwarder, messages: &[ringpost_client::ReceivedMessage]| {
        forwarder.settle(subscription, messages.iter().map(|m| m.ack_id.clone()).collect(), None)
    };
    let by_payload = |mut messages: Vec<ringpost_client::ReceivedMessage>| {
        messages.sort_by(|a, b| a.data.cmp(&b.data));
        messages
    };

    // Source 0 alone: a0 and a1 acknowledged when the snapshot is taken, a2 and a3 not.
    first.publish("snapped", &sent("a", 4));
    let received = by_payload(first.pull(subscription, 4));
    assert_eq!(payloads(&received), sent("a", 4));
    ack(&first, &received[..2]);
    block_on(client.create_snapshot("before-growth", subscription)).unwrap();
    ack(&first, &received[2..]);

    // A source added after the snapshot, and what it holds acknowledged.
    let raised = succeeded(&daemon.cli(&["topic", "update", "snapped", "--sources", "2"]));
    let leaders = leader_shards(&raised);
    assert_eq!(leaders.len(), 2, "{raised}");
    let second = Forwarder::connect(&addresses[leaders[1] as usize]);
    second.publish("snapped", &sent("b", 3));
    let received = second.pull(subscription, 3);
    assert_eq!(payloads(&received), sent("b", 3));
    ack(&second, &received);

    block_on(client.seek_to_snapshot(subscription, "before-growth")).unwrap();
    let again = first.pull(subscription, 2);
    assert_eq!(payloads(&again), vec!["a2".to_owned(), "a3".to_owned()], "source 0 back to the snapshot");
    ack(&first, &again);
    let again = second.pull(subscription, 3);
    assert_eq!(payloads(&again), sent("b", 3), "the source added after the snapshot replays all it holds");
    ack(&second, &again);

    // A snapshot taken with both sources: c0 acknowledged on source 1, c1 not.
    second.publish("snapped", &sent("c", 2));
    let received = by_payload(second.pull(subscription, 2));
    ack(&second, &received[..1]);
    block_on(client.create_snapshot("both", subscription)).unwrap();
    ack(&second, &received[1..]);
    block_on(client.seek_to_snapshot(subscription, "both")).unwrap();
    assert_eq!(
        payloads(&second.pull(subscription, 1)),
        vec!["c1".to_owned()],
        "source 1 back to the snapshot"
    );
    assert!(first.pull(subscription, 0).is_empty(), "source 0 had acknowledged everything");

    block_on(client.delete_snapshot("both")).unwrap();
    let refused = block_on(client.seek_to_snapshot(subscription, "both")).unwrap_err();
    assert_eq!(refused.code(), ringpost_client::ErrorCode::NotFound, "{refused}");
}

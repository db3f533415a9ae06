//! The forwarder shard driven through its native protocol handlers and control requests.

use super::*;
use crate::catalog::SubscriptionSettings;
use crate::clock::ManualClock;
use crate::control::{ControlRequest, SettingsUpdate};
use crate::ids::{Offset, TopicId};
use crate::metrics::process::QUIET_SWEEPS_BEFORE_TRIM;
use crate::net::server::Handler;
use crate::protocol::native::forwarder as native;
use crate::storage::sim::SimDisk;
use crate::subscription::SubscriptionEntry;
use crate::topic::{journal_folder, topic_folder, TopicState};
use ringpost_wire::frame::{FrameBuffer, FrameHeader};
use ringpost_wire::limits::FRAME_HEADER_BYTES;
use ringpost_wire::messages::*;
use ringpost_wire::{Command, ErrorCode, Status};
use std::path::PathBuf;

const DAY: Duration = Duration::from_secs(24 * 3600);

fn run<F: std::future::Future<Output = ()> + 'static>(future: F) {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).make().unwrap().run(future);
}

fn forwarder(clock: &ManualClock) -> Forwarder<SimDisk> {
    let config =
        LogConfig { segment_bytes_initial: 64 * 1024, segment_bytes_max: 64 * 1024, ..LogConfig::default() };
    Forwarder::new(0, SimDisk::new(), Directories::new(vec!["/d0".into()]), config, Rc::new(clock.clone()))
}

/// Every request runs as a task the size of `handle`'s future, allocated per request: a
/// publish's must not pay for the pull and acknowledgement paths' larger futures (the
/// handler's was 2,776 bytes before they were boxed).
#[test]
fn a_request_task_stays_small() {
    let forwarder = forwarder(&ManualClock::default());
    let responder = crate::net::server::Responder::unconnected();
    let frame = ringpost_wire::encode_frame(Command::Publish.code(), 0, 1, &PublishRequest::default());
    let header = FrameHeader::decode(&frame).unwrap();
    let body = FrameBuffer::with_capacity(0);
    let handling = forwarder.handle(header, body, &responder);
    let bytes = std::mem::size_of_val(&handling);
    // 520 bytes in the debug build since a publish carries its sender to the check made with
    // its one validation (`native::publish`), instead of being checked before it.
    assert!(bytes <= 544, "handle's future is {bytes} bytes");
}

/// A publish's messages are encoded into the commit's buffer only when it is built: the log
/// then holds what was published, attributes and ordering keys included, at any length, in
/// a commit shared with other publishes.
#[test]
fn published_messages_are_stored_as_sent() {
    run(async {
        let clock = ManualClock::default();
        let forwarder = Rc::new(forwarder(&clock));
        let topic = topic(&forwarder, 0).await;
        let message = |i: usize| PubsubMessage {
            data: vec![i as u8; 1 + i * 37 % 200],
            attributes: (0..i % 4)
                .map(|a| Attribute { key: format!("k{a}"), value: "v".repeat(a * 3 + i % 5) })
                .collect(),
            ordering_key: if i.is_multiple_of(3) { format!("key-{i}") } else { String::new() },
        };
        // Three publishes at once, so that they can share commits.
        let publishes = (0..3).map(|request| {
            let forwarder = forwarder.clone();
            let messages: Vec<PubsubMessage> = (request * 20..request * 20 + 20).map(message).collect();
            let frame = ringpost_wire::encode_frame(
                Command::Publish.code(),
                0,
                1,
                &PublishRequest { topic: "retained".into(), messages },
            );
            let mut body = FrameBuffer::new();
            body.extend_from_slice(&frame[FRAME_HEADER_BYTES..]);
            async move { native::publish_unchecked(&*forwarder, body).await.unwrap().message_ids }
        });
        let ids: Vec<Vec<u64>> = crate::sync::join_all(publishes.collect()).await;
        let stored = topic.log.read(Offset::ZERO, 100, usize::MAX).await.unwrap();
        assert_eq!(stored.len(), 60);
        for (request, ids) in ids.iter().enumerate() {
            for (index, id) in ids.iter().enumerate() {
                let sent = message(request * 20 + index);
                let record = &stored[*id as usize];
                assert_eq!(record.data, sent.data);
                assert_eq!(record.ordering_key, sent.ordering_key);
                let attributes: Vec<(String, String)> =
                    sent.attributes.into_iter().map(|a| (a.key, a.value)).collect();
                assert_eq!(record.attributes, attributes);
            }
        }
    });
}

async fn topic(forwarder: &Forwarder<SimDisk>, retention_seconds: u64) -> Rc<TopicState<SimDisk>> {
    forwarder
        .control(ControlRequest::AttachTopic {
            topic_id: TopicId::new(7),
            name: "retained".into(),
            retention_seconds,
            recovering: false,
            source: crate::ids::SourceId::FIRST,
            active: 1,
        })
        .await
        .unwrap();
    forwarder.topic("retained").unwrap()
}

async fn subscribe(forwarder: &Forwarder<SimDisk>, retain_acked_messages: bool) -> Rc<SubscriptionEntry> {
    attach_subscription(forwarder, retain_acked_messages, true).await
}

/// Attaches "reader" to topic 7, created now or recovered (`create` false) from the journal.
/// The topic is empty when the subscription is created, so its start offset is 0.
async fn attach_subscription(
    forwarder: &Forwarder<SimDisk>,
    retain_acked_messages: bool,
    create: bool,
) -> Rc<SubscriptionEntry> {
    let settings = SubscriptionSettings {
        ack_deadline_seconds: 10,
        message_retention_seconds: 7 * 24 * 3600,
        retain_acked_messages,
        ..Default::default()
    };
    forwarder
        .control(ControlRequest::AttachSubscription {
            subscription_id: 9,
            name: "reader".into(),
            topic_id: TopicId::new(7),
            settings,
            create,
            start_offset: 0,
        })
        .await
        .unwrap();
    forwarder.subscription("reader").unwrap().0
}

async fn publish(forwarder: &Forwarder<SimDisk>, count: usize) {
    for _ in 0..count {
        publish_one(forwarder, "retained").await.unwrap();
    }
}

/// Publishes one message of 1,000 bytes to `topic`.
async fn publish_one(forwarder: &Forwarder<SimDisk>, topic: &str) -> Result<PublishResponse, Status> {
    let request = PublishRequest {
        topic: topic.into(),
        messages: vec![PubsubMessage { data: vec![1u8; 1000], ..Default::default() }],
    };
    let frame = ringpost_wire::encode_frame(Command::Publish.code(), 0, 1, &request);
    let mut body = FrameBuffer::new();
    body.extend_from_slice(&frame[FRAME_HEADER_BYTES..]);
    native::publish_unchecked(forwarder, body).await
}

fn ack_everything(entry: &SubscriptionEntry, end: Offset) {
    let mut state = entry.state.borrow_mut();
    for offset in state.ack_floor().up_to(end) {
        state.apply_ack(offset);
    }
}

async fn pull(forwarder: &Forwarder<SimDisk>, max_messages: u32) -> Vec<ReceivedMessage> {
    let request = PullRequest { subscription: "reader".into(), max_messages, wait_ms: 0 };
    let frame = ringpost_wire::encode_frame(Command::Pull.code(), 0, 1, &request);
    let header = FrameHeader::decode(&frame[..FRAME_HEADER_BYTES]).unwrap();
    let response =
        native::pull(forwarder, &header, &frame[FRAME_HEADER_BYTES..]).await.unwrap().into_contiguous();
    ringpost_wire::decode_body::<PullResponse>(&response[FRAME_HEADER_BYTES..]).unwrap().received_messages
}

async fn acknowledge_one_by_one(forwarder: &Forwarder<SimDisk>, messages: &[ReceivedMessage]) {
    for message in messages {
        let request =
            AcknowledgeRequest { subscription: "reader".into(), ack_ids: vec![message.ack_id.clone()] };
        let frame = ringpost_wire::encode_frame(Command::Acknowledge.code(), 0, 1, &request);
        let response = native::acknowledge(forwarder, &frame[FRAME_HEADER_BYTES..]).await.unwrap();
        assert!(response.invalid_ack_ids.is_empty());
    }
}

/// Acknowledging one message per request writes a journal block each time; checkpoints keep
/// the journal bounded, and a restart from the compacted journal brings nothing back.
#[test]
fn the_journal_stays_bounded_and_compaction_loses_no_acknowledgement() {
    journal_stays_bounded_and_recovers(usize::MAX);
}

/// The same with the journal closing its files after every commit, as the journals beyond
/// the open-file budget do: appends, compaction and recovery all go through reopened files.
#[test]
fn a_journal_that_closes_its_files_loses_no_acknowledgement() {
    journal_stays_bounded_and_recovers(0);
}

/// A deleted topic's files go in the background, and they do go.
#[test]
fn a_deleted_topics_files_are_removed() {
    run(async move {
        let clock = ManualClock::default();
        let forwarder = forwarder(&clock);
        let retained = topic(&forwarder, 0).await;
        subscribe(&forwarder, false).await;
        publish(&forwarder, 300).await;
        assert!(retained.log.closed_segments().len() >= 2);
        let folder = PathBuf::from("/d0").join(topic_folder(TopicId::new(7)));
        assert!(forwarder.store.storage.exists(&folder));
        forwarder
            .control(ControlRequest::DetachTopic { topic_id: TopicId::new(7), delete_data: true })
            .await
            .unwrap();
        assert!(forwarder.topic("retained").is_err() && forwarder.subscription("reader").is_err());
        for _ in 0..100 {
            if !forwarder.store.storage.exists(&folder) {
                break;
            }
            crate::runtime::sleep(Duration::from_millis(10)).await;
        }
        assert!(!forwarder.store.storage.exists(&folder), "the topic's folder is gone");
    });
}

/// A new topic's two folders are made with one sync of each new name's parent, no file,
/// and they survive a power cut, as do the messages published into them.
#[test]
fn a_new_topics_folders_are_durable_and_synced_once_each() {
    run(async move {
        let clock = ManualClock::default();
        let forwarder = forwarder(&clock);
        let disk = forwarder.store.storage.clone();
        topic(&forwarder, 0).await;
        // On this empty disk: / (for d0/), /d0, /d0/topics and /d0/topics/7 (for messages/
        // and journal/), one each, where a folder at a time synced /d0/topics/7 twice.
        assert_eq!(disk.directory_sync_count(), 4);
        let folder = PathBuf::from("/d0").join(topic_folder(TopicId::new(7)));
        for log in ["messages", "journal"] {
            assert_eq!(disk.list_dir(&folder.join(log)).unwrap(), Vec::<String>::new());
        }
        publish(&forwarder, 3).await;
        drop(forwarder);
        disk.crash(crate::storage::sim::CrashMode::DropUnsynced);
        let restarted = Forwarder::new(
            0,
            disk.clone(),
            Directories::new(vec!["/d0".into()]),
            LogConfig {
                segment_bytes_initial: 64 * 1024,
                segment_bytes_max: 64 * 1024,
                ..LogConfig::default()
            },
            Rc::new(clock.clone()),
        );
        assert_eq!(topic(&restarted, 0).await.log.end_offset().get(), 3);
    });
}

/// An idle topic keeps no journal; the first acknowledgements open it, and a restart finds
/// every one of them.
#[test]
fn the_journal_opens_at_the_first_acknowledgements_and_keeps_them() {
    run(async move {
        let clock = ManualClock::default();
        let disk = SimDisk::new();
        let directories = Directories::new(vec!["/d0".into()]);
        let config = LogConfig::default();
        let forwarder =
            Forwarder::new(0, disk.clone(), directories.clone(), config.clone(), Rc::new(clock.clone()));
        let retained = topic(&forwarder, 0).await;
        subscribe(&forwarder, false).await;
        publish(&forwarder, 20).await;
        let delivered = pull(&forwarder, 100).await;
        assert_eq!(delivered.len(), 20);
        assert!(retained.journal.opened().is_none());
        let acknowledgements = delivered.iter().map(|message| {
            let request =
                AcknowledgeRequest { subscription: "reader".into(), ack_ids: vec![message.ack_id.clone()] };
            let frame = ringpost_wire::encode_frame(Command::Acknowledge.code(), 0, 1, &request);
            let forwarder = &forwarder;
            async move { native::acknowledge(forwarder, &frame[FRAME_HEADER_BYTES..]).await.unwrap() }
        });
        let responses = crate::sync::join_all(acknowledgements.collect()).await;
        assert!(responses.iter().all(|response| response.invalid_ack_ids.is_empty()));
        assert_eq!(retained.journal.opened().unwrap().end_offset().get(), 20, "one journal took all 20");
        drop(retained);
        drop(forwarder);
        let forwarder = Forwarder::new(0, disk, directories, config, Rc::new(clock.clone()));
        topic(&forwarder, 0).await;
        attach_subscription(&forwarder, false, false).await;
        assert!(pull(&forwarder, 100).await.is_empty(), "every acknowledgement survived the restart");
    });
}

fn journal_stays_bounded_and_recovers(journals_open_max: usize) {
    run(async move {
        let clock = ManualClock::default();
        let disk = SimDisk::new();
        let directories = Directories::new(vec!["/d0".into()]);
        let config = LogConfig {
            segment_bytes_initial: 64 * 1024,
            segment_bytes_max: 64 * 1024,
            ..LogConfig::default()
        };
        let forwarder =
            Forwarder::new(0, disk.clone(), directories.clone(), config.clone(), Rc::new(clock.clone()));
        forwarder.set_journals_open_max(journals_open_max);
        let retained = topic(&forwarder, 0).await;
        subscribe(&forwarder, false).await;
        assert!(retained.journal.opened().is_none(), "nothing acknowledged yet: no journal");
        let mut journal_peak = 0;
        for _round in 0..12 {
            publish(&forwarder, 500).await;
            let delivered = pull(&forwarder, 1000).await;
            assert_eq!(delivered.len(), 500);
            acknowledge_one_by_one(&forwarder, &delivered).await;
            forwarder.collect_segments().await;
            journal_peak = journal_peak.max(retained.journal.opened().unwrap().disk_bytes());
        }
        let journal = retained.journal.opened().unwrap();
        assert_eq!(journal.keeps_files_open(), journals_open_max > 0);
        // 6,000 acknowledge requests of a 4 KiB block each would be 24 MB of journal.
        assert!(journal_peak < 20 << 20, "journal reached {journal_peak} bytes");
        assert!(journal.start_offset().get() > 0, "old journal segments were deleted");
        drop(journal);
        publish(&forwarder, 10).await;
        let unacknowledged: Vec<u64> = pull(&forwarder, 100).await.iter().map(|m| m.message_id).collect();
        assert_eq!(unacknowledged.len(), 10);
        drop(retained);
        drop(forwarder);
        // Restart on the same disk: recover the topic and the subscription from the journal.
        let forwarder = Forwarder::new(0, disk, directories, config, Rc::new(clock.clone()));
        forwarder.set_journals_open_max(journals_open_max);
        topic(&forwarder, 0).await;
        attach_subscription(&forwarder, false, false).await;
        let redelivered: Vec<u64> = pull(&forwarder, 1000).await.iter().map(|m| m.message_id).collect();
        assert_eq!(redelivered, unacknowledged, "exactly the unacknowledged messages come back");
    });
}

/// At start-up the router attaches many topics at once; each counts toward the budget of
/// journals that keep their files open from the start of its attach, so the budget holds
/// however the attaches interleave.
#[test]
fn topics_attached_together_keep_to_the_open_journal_budget() {
    run(async {
        let clock = ManualClock::default();
        let forwarder = forwarder(&clock);
        forwarder.set_journals_open_max(3);
        let attaches = (0..10u64)
            .map(|topic_id| {
                forwarder.control(ControlRequest::AttachTopic {
                    topic_id: TopicId::new(topic_id),
                    name: format!("topic-{topic_id}"),
                    retention_seconds: 0,
                    recovering: true,
                    source: crate::ids::SourceId::FIRST,
                    active: 1,
                })
            })
            .collect();
        for result in crate::sync::join_all(attaches).await {
            result.unwrap();
        }
        let keeping_open = (0..10)
            .filter(|topic_id| {
                forwarder.topic(&format!("topic-{topic_id}")).unwrap().journal.config.keep_files_open
            })
            .count();
        assert_eq!(keeping_open, 3);
        assert_eq!(forwarder.attach_policy.topics_attaching.get(), 0);
    });
}

/// A shard that was busy trims malloc's free memory once, after `QUIET_SWEEPS_BEFORE_TRIM`
/// sweeps without a request; one that never was busy, or already trimmed, does not again.
#[test]
fn trims_once_after_a_quiet_spell() {
    let clock = ManualClock::default();
    let forwarder = forwarder(&clock);
    forwarder.sweep_leases();
    assert_eq!(forwarder.activity.trim.quiet_sweeps(), None, "never busy: nothing to trim");
    forwarder.activity.requests.set(forwarder.activity.requests.get() + 1);
    forwarder.sweep_leases();
    assert_eq!(forwarder.activity.trim.quiet_sweeps(), Some(0));
    for quiet in 1..QUIET_SWEEPS_BEFORE_TRIM {
        forwarder.sweep_leases();
        assert_eq!(forwarder.activity.trim.quiet_sweeps(), Some(quiet));
    }
    forwarder.sweep_leases();
    assert_eq!(forwarder.activity.trim.quiet_sweeps(), None, "trimmed, and not again until busy");
    forwarder.activity.requests.set(forwarder.activity.requests.get() + 1);
    forwarder.sweep_leases();
    assert_eq!(forwarder.activity.trim.quiet_sweeps(), Some(0), "a request starts the count again");
}

/// T11: ack deadlines run on the monotonic clock. A wall-clock jump (an NTP step of an hour,
/// either way) redelivers nothing early and delays nothing; the deadline itself still works.
#[test]
fn a_wall_clock_jump_causes_no_redelivery() {
    for jump_ms in [3_600_000i64, -3_600_000] {
        run(async move {
            let clock = ManualClock::default();
            let forwarder = forwarder(&clock);
            topic(&forwarder, 0).await;
            subscribe(&forwarder, false).await;
            publish(&forwarder, 50).await;
            assert_eq!(pull(&forwarder, 100).await.len(), 50);
            clock.jump_wall_ms(jump_ms);
            assert!(
                pull(&forwarder, 100).await.is_empty(),
                "a wall-clock jump of {jump_ms} ms redelivered leases"
            );
            clock.advance(Duration::from_secs(9));
            assert!(pull(&forwarder, 100).await.is_empty(), "redelivered before the 10 s deadline");
            clock.advance(Duration::from_secs(1));
            let again = pull(&forwarder, 100).await;
            assert_eq!(again.len(), 50, "every lease expires at its deadline");
            assert!(again.iter().all(|message| message.delivery_attempt == 2));
        });
    }
}

/// A publish refused for want of disk space makes every topic of the shard give up the file
/// it kept for its next roll, so that the publisher's retry finds the space.
/// On a full disk acknowledgements are still recorded (the journal's first segment comes
/// from its reserve), segment collection then deletes what they acknowledged, and the
/// reserve is made again once there is room.
#[test]
fn acknowledgements_are_recorded_on_a_full_disk_and_free_it() {
    run(async {
        let clock = ManualClock::default();
        let forwarder = forwarder(&clock);
        let topic = topic(&forwarder, 0).await;
        subscribe(&forwarder, false).await;
        publish(&forwarder, 100).await;
        // The first publish had the journal's reserve made, in the background.
        crate::runtime::sleep(Duration::from_millis(20)).await;
        let reserve = PathBuf::from("/d0").join(journal_folder(topic.id)).join(crate::log::RESERVE_NAME);
        assert!(forwarder.store.storage.exists(&reserve), "no journal reserve after the first publish");
        assert!(topic.journal.opened().is_none(), "nothing acknowledged yet: the journal is closed");

        forwarder.store.storage.set_no_space(true);
        let messages = pull(&forwarder, 1000).await;
        assert_eq!(messages.len(), 100);
        let request = AcknowledgeRequest {
            subscription: "reader".into(),
            ack_ids: messages.iter().map(|message| message.ack_id.clone()).collect(),
        };
        let frame = ringpost_wire::encode_frame(Command::Acknowledge.code(), 0, 1, &request);
        let response = native::acknowledge(&forwarder, &frame[FRAME_HEADER_BYTES..])
            .await
            .expect("an acknowledgement on a full disk");
        assert!(response.invalid_ack_ids.is_empty(), "{response:?}");
        assert!(!forwarder.store.storage.exists(&reserve), "the journal's first segment took the reserve");

        let segments_before = topic.log.closed_segments().len();
        assert!(segments_before > 2, "the test wants several segments");
        forwarder.collect_segments().await;
        assert!(
            topic.log.closed_segments().is_empty(),
            "acknowledged segments stayed on a full disk: {:?}",
            topic.log.closed_segments()
        );
        forwarder.store.storage.set_no_space(false);
        forwarder.collect_segments().await;
        assert!(
            forwarder.store.storage.exists(&reserve),
            "the reserve was not made again once there was room"
        );
        publish_one(&forwarder, "retained").await.unwrap();
    });
}

#[test]
fn a_full_disk_releases_the_files_kept_for_later_rolls() {
    run(async {
        let clock = ManualClock::default();
        let forwarder = forwarder(&clock);
        let busy = topic(&forwarder, 0).await;
        publish(&forwarder, 300).await;
        crate::runtime::sleep(Duration::from_millis(20)).await;
        assert!(busy.log.keeps_a_recycled_file(), "the busy topic recycles its segments");
        forwarder
            .control(ControlRequest::AttachTopic {
                topic_id: TopicId::new(8),
                name: "newcomer".into(),
                retention_seconds: 0,
                recovering: false,
                source: crate::ids::SourceId::FIRST,
                active: 1,
            })
            .await
            .unwrap();
        forwarder.store.storage.set_no_space(true);
        let refused = publish_one(&forwarder, "newcomer").await.expect_err("no space for a first segment");
        assert_eq!(refused.code, ErrorCode::ResourceExhausted, "{refused:?}");
        crate::runtime::sleep(Duration::from_millis(20)).await;
        assert!(!busy.log.keeps_a_recycled_file(), "the kept file was given up");
    });
}

#[test]
fn a_topic_without_subscriptions_keeps_nothing_closed() {
    run(async {
        let clock = ManualClock::default();
        let forwarder = forwarder(&clock);
        let topic = topic(&forwarder, 0).await;
        publish(&forwarder, 300).await;
        // Each publish that rolled the log had what came before deleted in the background.
        crate::runtime::sleep(Duration::from_millis(20)).await;
        assert!(topic.log.closed_segments().len() <= 1, "{:?}", topic.log.closed_segments().len());
        assert!(topic.log.start_offset().get() > 0);
        forwarder.collect_segments().await;
        assert!(topic.log.closed_segments().is_empty());
    });
}

#[test]
fn unacknowledged_messages_stay_until_the_subscription_retention_expires() {
    run(async {
        let clock = ManualClock::default();
        let forwarder = forwarder(&clock);
        let topic = topic(&forwarder, 0).await;
        let entry = subscribe(&forwarder, false).await;
        publish(&forwarder, 300).await;
        forwarder.collect_segments().await;
        assert_eq!(
            topic.log.start_offset().get(),
            0,
            "nothing acknowledged, nothing expired: nothing deleted"
        );
        clock.advance(8 * DAY);
        forwarder.collect_segments().await;
        let start = topic.log.start_offset().get();
        assert!(start > 0, "seven days later the unacknowledged messages expire");
        assert_eq!(
            entry.state.borrow().ack_floor().get(),
            start,
            "the subscription forgets what was deleted"
        );
        assert_eq!(
            entry.state.borrow().backlog(topic.log.end_offset()),
            topic.log.end_offset().get() - start
        );
    });
}

/// An update applied on the forwarder decides from then on what keeps acknowledged
/// segments (the topic's retention, the subscription's retain_acked_messages) and what lease
/// a pull grants.
#[test]
fn updated_settings_decide_what_is_kept_and_how_long_a_lease_runs() {
    run(async {
        let clock = ManualClock::default();
        let forwarder = forwarder(&clock);
        let topic = topic(&forwarder, 0).await;
        let entry = subscribe(&forwarder, false).await;
        let update_topic = |retention_seconds| ControlRequest::UpdateSettings {
            topic_id: TopicId::new(7),
            update: SettingsUpdate::Topic { retention_seconds },
        };
        let update_subscription = |ack_deadline_seconds, retain_acked_messages| {
            let settings = SubscriptionSettings {
                ack_deadline_seconds,
                message_retention_seconds: 7 * 24 * 3600,
                retain_acked_messages,
                ..Default::default()
            };
            ControlRequest::UpdateSettings {
                topic_id: TopicId::new(7),
                update: SettingsUpdate::Subscription { subscription_id: 9, settings },
            }
        };
        forwarder.control(update_topic(3600)).await.unwrap();
        forwarder.control(update_subscription(30, true)).await.unwrap();
        publish(&forwarder, 300).await;
        let leased = pull(&forwarder, 1).await;
        clock.advance(Duration::from_secs(20));
        assert!(pull(&forwarder, 1).await.iter().all(|m| m.message_id != leased[0].message_id));
        clock.advance(Duration::from_secs(11));
        let again = pull(&forwarder, 1).await;
        assert_eq!(again[0].message_id, leased[0].message_id, "the lease ran the new 30 s");
        ack_everything(&entry, topic.log.end_offset());
        forwarder.collect_segments().await;
        assert_eq!(topic.log.start_offset().get(), 0, "the new topic retention keeps acknowledged messages");
        forwarder.control(update_topic(0)).await.unwrap();
        forwarder.collect_segments().await;
        assert_eq!(topic.log.start_offset().get(), 0, "and so does retain_acked_messages");
        forwarder.control(update_subscription(30, false)).await.unwrap();
        forwarder.collect_segments().await;
        assert!(topic.log.start_offset().get() > 0, "without either, acknowledged segments go");
    });
}

#[test]
fn acknowledged_segments_go_unless_a_retention_keeps_them() {
    run(async {
        let clock = ManualClock::default();
        let forwarder = forwarder(&clock);
        let topic = topic(&forwarder, 0).await;
        let entry = subscribe(&forwarder, false).await;
        publish(&forwarder, 300).await;
        ack_everything(&entry, topic.log.end_offset());
        forwarder.collect_segments().await;
        assert!(topic.log.closed_segments().is_empty(), "every closed segment was acknowledged");
    });
    for (topic_retention_seconds, retain_acked) in [(3600, false), (0, true)] {
        run(async move {
            let clock = ManualClock::default();
            let forwarder = forwarder(&clock);
            let topic = topic(&forwarder, topic_retention_seconds).await;
            let entry = subscribe(&forwarder, retain_acked).await;
            publish(&forwarder, 300).await;
            ack_everything(&entry, topic.log.end_offset());
            forwarder.collect_segments().await;
            assert_eq!(topic.log.start_offset().get(), 0, "retention keeps acknowledged messages for seek");
            clock.advance(if retain_acked { 8 * DAY } else { Duration::from_secs(7200) });
            forwarder.collect_segments().await;
            assert!(topic.log.start_offset().get() > 0, "and lets them go once it expires");
        });
    }
}

/// The offsets (message ids) and ack ids one pull of "reader" leased.
async fn pull_leases(forwarder: &Forwarder<SimDisk>) -> Vec<(u64, String)> {
    use crate::api::data::{DataPlane, PullSettings};
    let pulled = DataPlane::pull(forwarder, "reader", PullSettings::new(10, 0).unwrap()).await.unwrap();
    let Some(delivery) = pulled else { return Vec::new() };
    let ack_id =
        |message: &crate::api::data::DeliveredMessage| delivery.ack_ids[message.ack_id.clone()].to_owned();
    delivery.messages.iter().map(|message| (message.message_id, ack_id(message))).collect()
}

async fn acknowledge_ids(
    forwarder: &Forwarder<SimDisk>,
    ack_ids: &[&str],
) -> Vec<crate::api::data::InvalidAckId> {
    use crate::api::data::DataPlane;
    DataPlane::acknowledge(forwarder, "reader", ack_ids.iter().copied())
        .await
        .expect("with exactly-once delivery, failures are per id")
}

/// Exactly-once delivery through the data plane: an acknowledgement whose journal write is in
/// flight pins its lease past the deadline, so the message is not delivered again, then or
/// after; an ack id whose lease expired is refused for good; and a journal that fails is
/// answered per id, as transient, and lets the lease run out.
#[test]
fn exactly_once_acknowledgements_pin_their_lease_and_fail_per_id() {
    run(async {
        let clock = ManualClock::default();
        let forwarder = Rc::new(forwarder(&clock));
        topic(&forwarder, 0).await;
        let entry = subscribe(&forwarder, false).await;
        let settings = SubscriptionSettings {
            ack_deadline_seconds: 10,
            message_retention_seconds: 7 * 24 * 3600,
            enable_exactly_once_delivery: true,
            ..Default::default()
        };
        let update = SettingsUpdate::Subscription { subscription_id: 9, settings };
        forwarder
            .control(ControlRequest::UpdateSettings { topic_id: TopicId::new(7), update })
            .await
            .unwrap();
        assert!(entry.state.borrow().policy.exactly_once, "an update carries the setting");
        publish(&forwarder, 3).await;
        // The first publish had the journal's reserve made, in the background.
        crate::runtime::sleep(Duration::from_millis(20)).await;
        let first = pull_leases(&forwarder).await;
        assert_eq!(first.len(), 3);

        // The acknowledgement of the first message is held at the disk past its deadline.
        forwarder.store.storage.delay_nth_write(1, Duration::from_millis(100), false);
        let confirmed = Rc::new(Cell::new(None));
        let acking = {
            let (forwarder, confirmed, ack_id) = (forwarder.clone(), confirmed.clone(), first[0].1.clone());
            crate::runtime::spawn(async move {
                confirmed.set(Some(acknowledge_ids(&forwarder, &[&ack_id]).await))
            })
        };
        crate::runtime::sleep(Duration::from_millis(10)).await;
        clock.advance(Duration::from_secs(11));
        let again = pull_leases(&forwarder).await;
        assert!(confirmed.take().is_none(), "the acknowledgement was still in flight");
        let offsets: Vec<u64> = again.iter().map(|(offset, _)| *offset).collect();
        assert_eq!(offsets, [first[1].0, first[2].0], "the pinned lease did not expire");
        acking.await;
        assert_eq!(confirmed.take().map(|invalid| invalid.len()), Some(0), "confirmed");

        // The ack id of a lease that expired is refused, permanently.
        let refused = acknowledge_ids(&forwarder, &[&first[1].1]).await;
        assert_eq!(refused.len(), 1);
        assert!(refused[0].permanent, "{refused:?}");

        // A journal that fails: each id is a transient failure, and its lease runs out.
        forwarder.store.storage.fail_all_writes(true);
        let failed = acknowledge_ids(&forwarder, &[&again[0].1, &again[1].1]).await;
        assert_eq!(failed.len(), 2, "{failed:?}");
        assert!(failed.iter().all(|invalid| !invalid.permanent), "{failed:?}");
        clock.advance(Duration::from_secs(11));
        let redelivered: Vec<u64> = pull_leases(&forwarder).await.iter().map(|(offset, _)| *offset).collect();
        assert_eq!(redelivered, offsets, "unpinned: delivered again; the acknowledged one never");
    });
}

/// A unit attached as source 1 of its topic answers publishes with message ids naming source 1
/// (`MessageId::new(source, offset)`), delivers them under the same ids with ack ids naming
/// source 1, takes those acknowledgements, and refuses an ack id of the same offset naming
/// source 0, which is another log's.
#[test]
fn a_source_after_the_first_names_itself_in_message_ids_and_ack_ids() {
    use crate::ids::{MessageId, SourceId, MESSAGE_ID_OFFSET_BITS};
    use crate::subscription::state::AckId;
    run(async {
        let clock = ManualClock::default();
        let forwarder = forwarder(&clock);
        let source = SourceId::new(1).unwrap();
        let attach = ControlRequest::AttachTopic {
            topic_id: TopicId::new(7),
            name: "retained".into(),
            retention_seconds: 0,
            recovering: false,
            source,
            active: 2,
        };
        forwarder.control(attach).await.unwrap();
        let entry = subscribe(&forwarder, false).await;
        let mut published = Vec::new();
        for _ in 0..3 {
            published.extend(publish_one(&forwarder, "retained").await.unwrap().message_ids);
        }
        let expected: Vec<u64> =
            (0..3).map(|offset| MessageId::new(source, Offset::new(offset)).get()).collect();
        assert_eq!(published, expected);
        assert_eq!(published[0], 1 << MESSAGE_ID_OFFSET_BITS);

        let messages = pull(&forwarder, 10).await;
        let delivered: Vec<u64> = messages.iter().map(|message| message.message_id).collect();
        assert_eq!(delivered, published);
        let first = AckId::parse(&messages[0].ack_id).unwrap();
        assert_eq!((first.source, first.offset), (source, Offset::ZERO));

        // The same delivery's ack id naming source 0: another log's offset, refused.
        let elsewhere = AckId { source: SourceId::FIRST, ..first }.encode();
        let request = AcknowledgeRequest { subscription: "reader".into(), ack_ids: vec![elsewhere] };
        let frame = ringpost_wire::encode_frame(Command::Acknowledge.code(), 0, 1, &request);
        let response = native::acknowledge(&forwarder, &frame[FRAME_HEADER_BYTES..]).await.unwrap();
        assert_eq!(response.invalid_ack_ids.len(), 1);
        assert_eq!(entry.state.borrow().ack_floor(), Offset::ZERO);

        acknowledge_one_by_one(&forwarder, &messages).await;
        assert_eq!(entry.state.borrow().ack_floor(), Offset::new(3));
    });
}

/// A topic's schema pushed by the router (`SetTopicSchema`) is checked on every native publish
/// before anything is appended, the matching messages stored with Pub/Sub's attributes; the
/// same schema again keeps what was compiled; `None` stops the check; a unit not attached
/// here is left alone.
#[test]
fn a_pushed_schema_checks_native_publishes_until_it_is_cleared() {
    run(async {
        let forwarder = forwarder(&ManualClock::default());
        let topic = topic(&forwarder, 0).await;
        let schema = crate::topic::schema::counts_schema();
        let set = |topic_id: u64, schema: Option<crate::router::schemas::TopicSchema>| {
            forwarder.control(ControlRequest::SetTopicSchema { topic_id: TopicId::new(topic_id), schema })
        };
        assert_eq!(set(99, Some(schema.clone())).await, Ok(crate::control::ControlOk::Done));
        set(7, Some(schema.clone())).await.unwrap();
        let compiled = topic.schema.borrow().clone().expect("the schema is held");
        set(7, Some(schema)).await.unwrap();
        assert!(Rc::ptr_eq(&compiled, topic.schema.borrow().as_ref().unwrap()), "compiled again");

        let publish = |data: Vec<&'static [u8]>| {
            let messages =
                data.into_iter().map(|data| PubsubMessage { data: data.to_vec(), ..Default::default() });
            let request = PublishRequest { topic: "retained".into(), messages: messages.collect() };
            let frame = ringpost_wire::encode_frame(Command::Publish.code(), 0, 1, &request);
            let mut body = FrameBuffer::new();
            body.extend_from_slice(&frame[FRAME_HEADER_BYTES..]);
            native::publish_unchecked(&forwarder, body)
        };
        let refused = publish(vec![br#"{"n": 1}"#, b"not json"]).await.unwrap_err();
        assert_eq!(refused.code, ErrorCode::InvalidArgument, "{refused:?}");
        assert!(refused.message.starts_with(crate::schema::SCHEMA_MISMATCH), "{refused:?}");
        assert_eq!(topic.log.durable_end(), Offset::ZERO, "a refused publish stored nothing");
        publish(vec![br#"{"n": 1}"#]).await.unwrap();
        let stored = topic.log.read(Offset::ZERO, 10, usize::MAX).await.unwrap();
        let keys: Vec<&str> = stored[0].attributes.iter().map(|(key, _)| key.as_str()).collect();
        assert_eq!(
            keys,
            ["googclient_schemaencoding", "googclient_schemaname", "googclient_schemarevisionid"]
        );

        set(7, None).await.unwrap();
        assert!(topic.schema.borrow().is_none());
        publish(vec![b"not json"]).await.expect("a topic without a schema takes anything");
    });
}

/// A gate told again (`ControlRequest::GateSources`, as every node's router re-tells its units
/// each pass) never holds a subscription that passed its change: the same generation adds its
/// passed to those told before, whatever a lagging catalog leaves out; a newer one starts
/// anew; an older one changes nothing.
#[test]
fn a_gate_told_again_never_holds_a_subscription_that_passed() {
    run(async {
        let forwarder = forwarder(&ManualClock::default());
        let topic = topic(&forwarder, 0).await;
        let gate = |generation: u64, passed: Vec<u64>| {
            forwarder.control(ControlRequest::GateSources {
                topic_id: TopicId::new(7),
                generation,
                before: 2,
                after: 1,
                passed,
            })
        };
        let held = |id: u64| topic.gate_of(id).is_some();
        gate(1, vec![]).await.unwrap();
        assert!(held(5) && held(6));
        gate(1, vec![5]).await.unwrap();
        assert!(!held(5) && held(6));
        gate(1, vec![]).await.unwrap();
        assert!(!held(5), "told less again: 5 passed generation 1 for good");
        gate(1, vec![6]).await.unwrap();
        assert!(!held(5) && !held(6));
        gate(0, vec![]).await.unwrap();
        assert!(!held(5) && !held(6), "an older gate changes nothing");
        gate(2, vec![6]).await.unwrap();
        assert!(held(5) && !held(6), "a newer change is passed anew");
    });
}

/// An attach under an id this shard holds for another unit (another topic, or another source
/// of the same topic) is refused and leaves that unit as it was: a router whose catalog lagged
/// its log allocated the id again, and detaches what it attached when its commit is refused,
/// deleting the files (the cluster simulation, topics of several sources, seed 469, found
/// spread-7's source 2 detached so). The same unit again is a retry, answered at once.
#[test]
fn an_attach_under_an_id_held_by_another_unit_is_refused() {
    run(async {
        let forwarder = forwarder(&ManualClock::default());
        let topic = topic(&forwarder, 0).await;
        let attach = |name: &str, source: u32| ControlRequest::AttachTopic {
            topic_id: TopicId::new(7),
            name: name.into(),
            retention_seconds: 0,
            recovering: false,
            source: crate::ids::SourceId::new(source).unwrap(),
            active: 1,
        };
        let refused = forwarder.control(attach("another", 0)).await.unwrap_err();
        assert_eq!(refused.code, crate::api::error::Code::AlreadyExists, "{refused:?}");
        assert!(refused.message.contains("source 0 of topic 'retained'"), "{refused:?}");
        let refused = forwarder.control(attach("retained", 2)).await.unwrap_err();
        assert_eq!(refused.code, crate::api::error::Code::AlreadyExists, "{refused:?}");
        assert!(Rc::ptr_eq(&topic, &forwarder.topic("retained").unwrap()), "left as it was");
        forwarder.control(attach("retained", 0)).await.expect("a retried attach");
    });
}

//! A forwarder shard: owns topics (their message logs and subscription journals) and serves
//! publish, pull, acknowledge and modify-ack-deadline for them, on its own port. Control
//! requests from the router arrive on a channel. Nothing here is shared with other shards.

use crate::catalog::SubscriptionSettings;
use crate::clock::Clock;
use crate::control::{ControlOk, ControlRequest};
use crate::journal::{journal_log_id, runs_of, JournalEntry};
use crate::log::{record, Directories, Log, LogConfig, LogError, RecoveryReport};
use crate::net::{fail, respond, Handler};
use crate::storage::Storage;
use crate::subscription::{AckId, SubscriptionState};
use ringpost_wire::frame::{access_body, FrameBuffer, FrameHeader};
use ringpost_wire::limits::*;
use ringpost_wire::messages::*;
use ringpost_wire::{Command, ErrorCode, Status};
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

/// Bytes of messages one pull response may carry; the frame limit leaves room for the
/// envelope of the largest single message.
pub const PULL_RESPONSE_BYTES_MAX: usize = 12 * 1024 * 1024;
const _: () = assert!(PULL_RESPONSE_BYTES_MAX + 2 * 1024 * 1024 <= FRAME_BODY_BYTES_MAX);
const _: () = assert!(MESSAGE_BYTES_MAX <= PULL_RESPONSE_BYTES_MAX);
/// How often segments every subscription has acknowledged are deleted.
pub const SEGMENT_COLLECTION_INTERVAL: Duration = Duration::from_secs(5);

pub fn log_error_status(error: LogError) -> Status {
    match error {
        LogError::Fenced(why) => {
            Status::unavailable(format!("the topic's storage failed and is fenced: {why}"))
        }
        LogError::NoSpace(why) => Status::resource_exhausted(format!("disk full: {why}")),
        LogError::Overloaded => {
            Status::resource_exhausted("too many publishes are waiting for the disk; retry with backoff")
        }
        LogError::DataLoss(why) => Status::new(ErrorCode::DataLoss, why),
        LogError::Corrupt(why) => Status::new(ErrorCode::DataLoss, why),
        LogError::Io(why) => Status::unavailable(why),
    }
}

pub struct TopicState<S: Storage> {
    pub id: u64,
    pub name: String,
    pub log: Log<S>,
    pub journal: Log<S>,
    pub subscriptions: RefCell<Vec<Rc<SubscriptionEntry>>>,
    /// Subscription states rebuilt from the journal, waiting for the router to attach them.
    recovered: RefCell<HashMap<u64, SubscriptionState>>,
    /// The topic's folder inside each data directory.
    relative: PathBuf,
    /// Topic message retention; 0 when not set.
    retention_seconds: u64,
}

pub struct SubscriptionEntry {
    pub id: u64,
    pub name: String,
    pub topic_id: u64,
    pub settings: SubscriptionSettings,
    pub state: RefCell<SubscriptionState>,
}

/// A subscription this forwarder serves, with its topic.
type Served<S> = (Rc<SubscriptionEntry>, Rc<TopicState<S>>);

pub struct Forwarder<S: Storage> {
    pub shard: u32,
    storage: S,
    directories: Rc<Directories>,
    log_config: LogConfig,
    clock: Rc<dyn Clock>,
    topics: RefCell<HashMap<String, Rc<TopicState<S>>>>,
    topics_by_id: RefCell<HashMap<u64, Rc<TopicState<S>>>>,
    subscriptions: RefCell<HashMap<String, Served<S>>>,
}

/// A topic's folder inside each data directory.
pub fn topic_folder(topic_id: u64) -> PathBuf {
    PathBuf::from("topics").join(format!("{topic_id:016x}"))
}

fn not_owner(kind: &str, name: &str) -> Status {
    Status::new(
        ErrorCode::NotOwner,
        format!("this forwarder does not serve {kind} '{name}'; ask the router again"),
    )
}

impl<S: Storage> Forwarder<S> {
    pub fn new(
        shard: u32,
        storage: S,
        directories: Rc<Directories>,
        log_config: LogConfig,
        clock: Rc<dyn Clock>,
    ) -> Forwarder<S> {
        Forwarder {
            shard,
            storage,
            directories,
            log_config,
            clock,
            topics: RefCell::default(),
            topics_by_id: RefCell::default(),
            subscriptions: RefCell::default(),
        }
    }

    pub async fn control(&self, request: ControlRequest) -> Result<ControlOk, Status> {
        match request {
            ControlRequest::AttachTopic { topic_id, name, retention_seconds } => {
                self.attach_topic(topic_id, name, retention_seconds).await
            }
            ControlRequest::Stats => Ok(ControlOk::Stats(self.shard_stats(), self.topic_stats().await)),
            ControlRequest::ResyncDirectory { index } => {
                if index >= self.directories.count() {
                    return Err(Status::invalid_argument(format!(
                        "there is no data directory {index}; there are {}",
                        self.directories.count()
                    )));
                }
                self.directories.unfence(index);
                let topics: Vec<Rc<TopicState<S>>> = self.topics_by_id.borrow().values().cloned().collect();
                let (mut logs, mut batches) = (0, 0);
                for topic in topics {
                    for log in [&topic.log, &topic.journal] {
                        if log.is_stale(index) {
                            batches += log.resync_copy(index).await.map_err(log_error_status)?;
                            logs += 1;
                        }
                    }
                }
                Ok(ControlOk::Resynced { logs, batches })
            }
            ControlRequest::DetachTopic { topic_id, delete_data } => {
                let topic = self.topics_by_id.borrow_mut().remove(&topic_id);
                if let Some(topic) = topic {
                    self.topics.borrow_mut().remove(&topic.name);
                    self.subscriptions.borrow_mut().retain(|_, (_, owner)| owner.id != topic_id);
                    if delete_data {
                        for copy in 0..self.directories.count() {
                            let folder = self.directories.path(copy).join(&topic.relative);
                            if self.storage.exists(&folder) {
                                self.storage.remove_dir_all(&folder).map_err(|error| {
                                    Status::internal(format!("removing {}: {error}", folder.display()))
                                })?;
                            }
                        }
                    }
                }
                Ok(ControlOk::Done)
            }
            ControlRequest::AttachSubscription { subscription_id, name, topic_id, settings, create } => {
                self.attach_subscription(subscription_id, name, topic_id, settings, create).await
            }
            ControlRequest::DetachSubscription { subscription_id, name, topic_id } => {
                self.subscriptions.borrow_mut().remove(&name);
                let topic = self.topics_by_id.borrow().get(&topic_id).cloned();
                if let Some(topic) = topic {
                    topic.subscriptions.borrow_mut().retain(|entry| entry.id != subscription_id);
                    append_journal(&topic.journal, &JournalEntry::SubscriptionDeleted { subscription_id })
                        .await
                        .map_err(log_error_status)?;
                }
                Ok(ControlOk::Done)
            }
        }
    }

    async fn attach_topic(
        &self,
        topic_id: u64,
        name: String,
        retention_seconds: u64,
    ) -> Result<ControlOk, Status> {
        if self.topics_by_id.borrow().contains_key(&topic_id) {
            return Ok(ControlOk::Done);
        }
        let relative = topic_folder(topic_id);
        let (log, report) = Log::open(
            self.storage.clone(),
            self.directories.clone(),
            &relative.join("messages"),
            topic_id,
            self.log_config.clone(),
        )
        .await
        .map_err(|error| Status::new(ErrorCode::DataLoss, format!("topic '{name}': {error}")))?;
        report_recovery(&name, "messages", &report);
        let journal_config = LogConfig { segment_bytes_initial: 256 * 1024, ..self.log_config.clone() };
        let (journal, report) = Log::open(
            self.storage.clone(),
            self.directories.clone(),
            &relative.join("journal"),
            journal_log_id(topic_id),
            journal_config,
        )
        .await
        .map_err(|error| Status::new(ErrorCode::DataLoss, format!("topic '{name}' journal: {error}")))?;
        report_recovery(&name, "journal", &report);
        let mut recovered: HashMap<u64, SubscriptionState> = HashMap::new();
        for stored in journal.read(0, usize::MAX, usize::MAX).await.map_err(log_error_status)? {
            let entry = JournalEntry::decode(&stored.data).map_err(|why| {
                Status::new(
                    ErrorCode::DataLoss,
                    format!("topic '{name}' journal entry {}: {why}", stored.offset),
                )
            })?;
            match entry {
                JournalEntry::SubscriptionCreated { subscription_id, start_offset } => {
                    recovered.insert(
                        subscription_id,
                        SubscriptionState::new(subscription_id, start_offset, Duration::from_secs(10)),
                    );
                }
                JournalEntry::SubscriptionDeleted { subscription_id } => {
                    recovered.remove(&subscription_id);
                }
                JournalEntry::Acked { subscription_id, runs } => {
                    if let Some(state) = recovered.get_mut(&subscription_id) {
                        for (first, count) in runs {
                            for offset in first..first + count as u64 {
                                state.restore_ack(offset);
                            }
                        }
                    }
                }
            }
        }
        let topic = Rc::new(TopicState {
            id: topic_id,
            name: name.clone(),
            log,
            journal,
            subscriptions: RefCell::default(),
            recovered: RefCell::new(recovered),
            relative,
            retention_seconds,
        });
        self.topics.borrow_mut().insert(name, topic.clone());
        self.topics_by_id.borrow_mut().insert(topic_id, topic);
        Ok(ControlOk::Done)
    }

    async fn attach_subscription(
        &self,
        subscription_id: u64,
        name: String,
        topic_id: u64,
        settings: SubscriptionSettings,
        create: bool,
    ) -> Result<ControlOk, Status> {
        let topic = self.topics_by_id.borrow().get(&topic_id).cloned().ok_or_else(|| {
            Status::internal(format!("topic {topic_id:x} is not attached to shard {}", self.shard))
        })?;
        let ack_deadline = Duration::from_secs(settings.ack_deadline_seconds as u64);
        let mut state = if create {
            // The sync point: every publish acknowledged after this reply has an offset at or
            // above the durable end now, because offsets are assigned at commit.
            let start_offset = topic.log.end_offset();
            append_journal(
                &topic.journal,
                &JournalEntry::SubscriptionCreated { subscription_id, start_offset },
            )
            .await
            .map_err(log_error_status)?;
            SubscriptionState::new(subscription_id, start_offset, ack_deadline)
        } else {
            match topic.recovered.borrow_mut().remove(&subscription_id) {
                Some(state) => state,
                None => {
                    // The catalog has it but the journal does not: deliver everything still
                    // stored rather than risk skipping an acknowledged publish.
                    eprintln!(
                        "ringpostd: WARNING: subscription '{name}' has no journal entry on topic '{}'; it restarts from offset {}",
                        topic.name,
                        topic.log.start_offset()
                    );
                    SubscriptionState::new(subscription_id, topic.log.start_offset(), ack_deadline)
                }
            }
        };
        state.ack_deadline = ack_deadline;
        state.forget_before(topic.log.start_offset());
        let start = state.start_offset;
        let entry = Rc::new(SubscriptionEntry {
            id: subscription_id,
            name: name.clone(),
            topic_id,
            settings,
            state: RefCell::new(state),
        });
        topic.subscriptions.borrow_mut().push(entry.clone());
        self.subscriptions.borrow_mut().insert(name, (entry, topic));
        Ok(ControlOk::SubscriptionStart(start))
    }

    fn topic(&self, name: &str) -> Result<Rc<TopicState<S>>, Status> {
        self.topics.borrow().get(name).cloned().ok_or_else(|| not_owner("topic", name))
    }

    fn subscription(&self, name: &str) -> Result<Served<S>, Status> {
        self.subscriptions.borrow().get(name).cloned().ok_or_else(|| not_owner("subscription", name))
    }

    async fn publish(&self, body: &[u8]) -> Result<PublishResponse, Status> {
        let request = access_body::<PublishRequest>(body)?;
        ringpost_wire::validate::validate_publish(request)?;
        let topic = self.topic(request.topic.as_str())?;
        let publish_time_ms = self.clock.wall_ms();
        let mut records =
            Vec::with_capacity(body.len() + request.messages.len() * record::RECORD_HEADER_BYTES);
        for message in request.messages.iter() {
            let mut attributes = message.attributes.iter().map(|a| (a.key.as_str(), a.value.as_str()));
            record::encode_record_unsealed(
                &mut records,
                publish_time_ms,
                message.data.as_slice(),
                &mut attributes,
                message.ordering_key.as_str(),
            );
        }
        let count = request.messages.len() as u32;
        let (first, count) = topic.log.append(records, count).await.map_err(log_error_status)?;
        Ok(PublishResponse { message_ids: (first..first + count as u64).collect() })
    }

    async fn pull(&self, body: &[u8]) -> Result<PullResponse, Status> {
        let request = access_body::<PullRequest>(body)?;
        let max_messages = request.max_messages.to_native();
        if max_messages == 0 || max_messages > PULL_MESSAGES_MAX {
            return Err(Status::invalid_argument(format!(
                "max_messages is {max_messages}; it must be 1 to {PULL_MESSAGES_MAX} (PULL_MESSAGES_MAX)"
            )));
        }
        let wait_ms = request.wait_ms.to_native();
        if wait_ms > PULL_WAIT_MS_MAX {
            return Err(Status::invalid_argument(format!(
                "wait_ms is {wait_ms}; the limit is {PULL_WAIT_MS_MAX} (PULL_WAIT_MS_MAX)"
            )));
        }
        let (subscription, topic) = self.subscription(request.subscription.as_str())?;
        let give_up_at = self.clock.now() + Duration::from_millis(wait_ms as u64);
        loop {
            let committed = topic.log.committed();
            let now = self.clock.now();
            let deliveries =
                subscription.state.borrow_mut().pull(now, max_messages as usize, topic.log.end_offset());
            if !deliveries.is_empty() {
                return self.read_deliveries(&subscription, &topic, deliveries).await;
            }
            if now >= give_up_at {
                return Ok(PullResponse::default());
            }
            // Wait for a commit, a lease to expire, or the caller's deadline, whichever first.
            let mut wake_at = give_up_at;
            if let Some(deadline) = subscription.state.borrow().next_deadline() {
                wake_at = wake_at.min(deadline);
            }
            let sleep = glommio::timer::sleep(wake_at.saturating_duration_since(now));
            futures_lite::future::or(committed, sleep).await;
        }
    }

    async fn read_deliveries(
        &self,
        subscription: &SubscriptionEntry,
        topic: &TopicState<S>,
        mut deliveries: Vec<crate::subscription::Delivery>,
    ) -> Result<PullResponse, Status> {
        deliveries.sort_by_key(|delivery| delivery.offset);
        let offsets: Vec<u64> = deliveries.iter().map(|delivery| delivery.offset).collect();
        let records = match topic.log.read_offsets(&offsets).await {
            Ok(records) => records,
            Err(error) => {
                let mut state = subscription.state.borrow_mut();
                for delivery in deliveries {
                    state.release(delivery);
                }
                return Err(log_error_status(error));
            }
        };
        let mut by_offset: HashMap<u64, crate::log::StoredRecord> =
            records.into_iter().map(|record| (record.offset, record)).collect();
        let mut response = PullResponse::default();
        let mut bytes = 0usize;
        let mut state = subscription.state.borrow_mut();
        for delivery in deliveries {
            let Some(record) = by_offset.remove(&delivery.offset) else {
                // Below the log's start: removed by retention. Nothing to deliver.
                state.apply_ack(delivery.offset);
                continue;
            };
            let size = record.data.len()
                + record.ordering_key.len()
                + record.attributes.iter().map(|(k, v)| k.len() + v.len() + 16).sum::<usize>();
            if !response.received_messages.is_empty() && bytes + size > PULL_RESPONSE_BYTES_MAX {
                state.release(delivery);
                continue;
            }
            bytes += size;
            let ack_id = AckId {
                subscription_id: subscription.id,
                offset: delivery.offset,
                generation: delivery.generation,
            };
            response.received_messages.push(ReceivedMessage {
                ack_id: ack_id.encode(),
                message_id: record.offset,
                publish_time_ms: record.publish_time_ms,
                data: record.data,
                attributes: record
                    .attributes
                    .into_iter()
                    .map(|(key, value)| Attribute { key, value })
                    .collect(),
                ordering_key: record.ordering_key,
                delivery_attempt: delivery.attempt,
            });
        }
        Ok(response)
    }

    async fn acknowledge(&self, body: &[u8]) -> Result<AckResponse, Status> {
        let request = access_body::<AcknowledgeRequest>(body)?;
        check_ack_id_count(request.ack_ids.len())?;
        let (subscription, topic) = self.subscription(request.subscription.as_str())?;
        let mut response = AckResponse::default();
        let mut offsets = Vec::new();
        {
            let state = subscription.state.borrow();
            for ack_id in request.ack_ids.iter() {
                match state.check_ack(ack_id.as_str()) {
                    Ok(Some(offset)) => offsets.push(offset),
                    Ok(None) => {}
                    Err(refusal) => response.invalid_ack_ids.push(InvalidAckId {
                        ack_id: ack_id.as_str().chars().take(ACK_ID_BYTES_MAX).collect(),
                        reason: refusal.reason().to_owned(),
                    }),
                }
            }
        }
        if offsets.is_empty() {
            return Ok(response);
        }
        offsets.sort_unstable();
        offsets.dedup();
        // Durable first: an acknowledgement confirmed to the subscriber never comes back.
        let entry = JournalEntry::Acked { subscription_id: subscription.id, runs: runs_of(&offsets) };
        append_journal(&topic.journal, &entry).await.map_err(log_error_status)?;
        let mut state = subscription.state.borrow_mut();
        for offset in offsets {
            state.apply_ack(offset);
        }
        Ok(response)
    }

    async fn modify_ack_deadline(&self, body: &[u8]) -> Result<AckResponse, Status> {
        let request = access_body::<ModifyAckDeadlineRequest>(body)?;
        check_ack_id_count(request.ack_ids.len())?;
        let seconds = request.ack_deadline_seconds.to_native();
        if seconds > MODIFY_ACK_DEADLINE_SECONDS_MAX {
            return Err(Status::invalid_argument(format!(
                "ack deadline of {seconds} s is outside 0 to {MODIFY_ACK_DEADLINE_SECONDS_MAX} s (MODIFY_ACK_DEADLINE_SECONDS_MAX)"
            )));
        }
        let (subscription, _topic) = self.subscription(request.subscription.as_str())?;
        let now = self.clock.now();
        let mut response = AckResponse::default();
        let mut state = subscription.state.borrow_mut();
        for ack_id in request.ack_ids.iter() {
            if let Err(refusal) = state.modify_deadline(ack_id.as_str(), seconds, now) {
                response.invalid_ack_ids.push(InvalidAckId {
                    ack_id: ack_id.as_str().chars().take(ACK_ID_BYTES_MAX).collect(),
                    reason: refusal.reason().to_owned(),
                });
            }
        }
        Ok(response)
    }

    /// Deletes the oldest segments nobody needs any more. A closed segment goes when no
    /// retention keeps it: the topic's `message_retention_duration` (if set) has passed for its
    /// newest message, and for every subscription either its ack floor passed the segment (unless
    /// it retains acknowledged messages) or the subscription's own retention expired. A topic
    /// without subscriptions and without retention keeps nothing: no one can ever receive it.
    pub async fn collect_segments(&self) {
        let now_ms = self.clock.wall_ms();
        let topics: Vec<Rc<TopicState<S>>> = self.topics_by_id.borrow().values().cloned().collect();
        for topic in topics {
            let deletable = {
                let subscriptions = topic.subscriptions.borrow();
                let expired = |newest_ms: u64, seconds: u64| {
                    newest_ms.saturating_add(seconds.saturating_mul(1000)) <= now_ms
                };
                topic
                    .log
                    .closed_segments()
                    .iter()
                    .take_while(|segment| {
                        let topic_keeps = topic.retention_seconds > 0
                            && !expired(segment.newest_publish_ms, topic.retention_seconds);
                        !topic_keeps
                            && subscriptions.iter().all(|entry| {
                                let gone = expired(
                                    segment.newest_publish_ms,
                                    entry.settings.message_retention_seconds,
                                );
                                let acked = entry.state.borrow().ack_floor() >= segment.end_offset;
                                gone || (acked && !entry.settings.retain_acked_messages)
                            })
                    })
                    .count()
            };
            if deletable == 0 {
                continue;
            }
            match topic.log.remove_oldest(deletable).await {
                Ok(_) => {
                    let start = topic.log.start_offset();
                    for entry in topic.subscriptions.borrow().iter() {
                        entry.state.borrow_mut().forget_before(start);
                    }
                }
                Err(error) => {
                    eprintln!("ringpostd: deleting old segments of topic '{}': {error}", topic.name)
                }
            }
        }
    }

    fn shard_stats(&self) -> ShardStats {
        ShardStats {
            shard: self.shard,
            topics: self.topics_by_id.borrow().len() as u32,
            directories: directory_status(&self.directories),
            repairs: self.directories.repairs(),
        }
    }

    async fn topic_stats(&self) -> Vec<TopicStats> {
        let now_ms = self.clock.wall_ms();
        let topics: Vec<Rc<TopicState<S>>> = self.topics_by_id.borrow().values().cloned().collect();
        let mut out = Vec::with_capacity(topics.len());
        for topic in topics {
            let end = topic.log.end_offset();
            let entries: Vec<Rc<SubscriptionEntry>> = topic.subscriptions.borrow().clone();
            let mut subscriptions = Vec::with_capacity(entries.len());
            for entry in entries {
                let (floor, backlog, outstanding, delivered_total, expired_total) = {
                    let state = entry.state.borrow();
                    (
                        state.ack_floor(),
                        state.backlog(end),
                        state.outstanding(),
                        state.delivered_total,
                        state.expired_total,
                    )
                };
                let oldest_unacked_age_ms = if floor < end {
                    match topic.log.read(floor, 1, usize::MAX).await {
                        Ok(records) => {
                            records.first().map(|r| now_ms.saturating_sub(r.publish_time_ms)).unwrap_or(0)
                        }
                        Err(_) => 0,
                    }
                } else {
                    0
                };
                subscriptions.push(SubscriptionStats {
                    name: entry.name.clone(),
                    backlog_messages: backlog,
                    outstanding_messages: outstanding as u64,
                    delivered_total,
                    expired_total,
                    oldest_unacked_age_ms,
                });
            }
            out.push(TopicStats {
                name: topic.name.clone(),
                shard: self.shard,
                first_offset: topic.log.start_offset(),
                end_offset: end,
                disk_bytes: topic.log.disk_bytes(),
                subscriptions,
            });
        }
        out
    }
}

pub fn directory_status(directories: &Directories) -> Vec<DirectoryStatus> {
    directories
        .status()
        .into_iter()
        .map(|(path, fenced)| DirectoryStatus {
            path: path.display().to_string(),
            fenced: fenced.unwrap_or_default(),
        })
        .collect()
}

fn check_ack_id_count(count: usize) -> Result<(), Status> {
    if count == 0 || count > ACK_IDS_PER_REQUEST_MAX {
        return Err(Status::invalid_argument(format!(
            "{count} ack ids; a request carries 1 to {ACK_IDS_PER_REQUEST_MAX} (ACK_IDS_PER_REQUEST_MAX)"
        )));
    }
    Ok(())
}

async fn append_journal<S: Storage>(journal: &Log<S>, entry: &JournalEntry) -> Result<(), LogError> {
    let bytes = entry.encode();
    let mut records = Vec::with_capacity(bytes.len() + record::RECORD_HEADER_BYTES + 8);
    record::encode_record_unsealed(&mut records, 0, &bytes, &mut std::iter::empty(), "");
    journal.append(records, 1).await.map(|_| ())
}

fn report_recovery(topic: &str, what: &str, report: &RecoveryReport) {
    if let Some((path, position)) = &report.torn_at {
        eprintln!(
            "ringpostd: recovery of topic '{topic}' {what}: cut a torn tail at byte {position} of {} ({} bytes discarded; \
             they were never acknowledged)",
            path.display(),
            report.torn_bytes_discarded
        );
    }
    if report.batches_repaired > 0 {
        eprintln!(
            "ringpostd: recovery of topic '{topic}' {what}: repaired {} batch copies from healthy data directories",
            report.batches_repaired
        );
    }
    if report.empty_segments_removed > 0 {
        eprintln!(
            "ringpostd: recovery of topic '{topic}' {what}: removed {} empty segment(s) created before a crash",
            report.empty_segments_removed
        );
    }
    if report.buffered_io_warning {
        eprintln!("ringpostd: WARNING: topic '{topic}' {what}: O_DIRECT is not in effect on this filesystem");
    }
}

impl<S: Storage> Handler for Forwarder<S> {
    async fn handle(&self, header: FrameHeader, body: FrameBuffer) -> FrameBuffer {
        let result = match Command::from_u16(header.command) {
            Some(Command::Hello) => Ok(crate::router::hello_response(&header)),
            Some(Command::Publish) => self.publish(&body).await.map(|response| respond(&header, &response)),
            Some(Command::Pull) => self.pull(&body).await.map(|response| respond(&header, &response)),
            Some(Command::Acknowledge) => {
                self.acknowledge(&body).await.map(|response| respond(&header, &response))
            }
            Some(Command::ModifyAckDeadline) => {
                self.modify_ack_deadline(&body).await.map(|response| respond(&header, &response))
            }
            Some(command) => Err(Status::failed_precondition(format!(
                "{command:?} is a control-plane command: send it to the router's address, not a forwarder's"
            ))),
            None => Err(Status::new(ErrorCode::Unimplemented, format!("unknown command {}", header.command))),
        };
        result.unwrap_or_else(|status| fail(&header, &status))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::storage::sim::SimDisk;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    fn run<F: std::future::Future<Output = ()> + 'static>(future: F) {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).make().unwrap().run(future);
    }

    fn forwarder(clock: &ManualClock) -> Forwarder<SimDisk> {
        let config = LogConfig {
            segment_bytes_initial: 64 * 1024,
            segment_bytes_max: 64 * 1024,
            ..LogConfig::default()
        };
        Forwarder::new(
            0,
            SimDisk::new(),
            Directories::new(vec!["/d0".into()]),
            config,
            Rc::new(clock.clone()),
        )
    }

    async fn topic(forwarder: &Forwarder<SimDisk>, retention_seconds: u64) -> Rc<TopicState<SimDisk>> {
        forwarder
            .control(ControlRequest::AttachTopic { topic_id: 7, name: "retained".into(), retention_seconds })
            .await
            .unwrap();
        forwarder.topic("retained").unwrap()
    }

    async fn subscribe(forwarder: &Forwarder<SimDisk>, retain_acked_messages: bool) -> Rc<SubscriptionEntry> {
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
                topic_id: 7,
                settings,
                create: true,
            })
            .await
            .unwrap();
        forwarder.subscription("reader").unwrap().0
    }

    async fn publish(forwarder: &Forwarder<SimDisk>, count: usize) {
        for _ in 0..count {
            let request = PublishRequest {
                topic: "retained".into(),
                messages: vec![PubsubMessage { data: vec![1u8; 1000], ..Default::default() }],
            };
            let frame = ringpost_wire::encode_frame(Command::Publish.code(), 0, 1, &request);
            forwarder.publish(&frame[FRAME_HEADER_BYTES..]).await.unwrap();
        }
    }

    fn ack_everything(entry: &SubscriptionEntry, end: u64) {
        let mut state = entry.state.borrow_mut();
        for offset in state.ack_floor()..end {
            state.apply_ack(offset);
        }
    }

    #[test]
    fn a_topic_without_subscriptions_keeps_nothing_closed() {
        run(async {
            let clock = ManualClock::default();
            let forwarder = forwarder(&clock);
            let topic = topic(&forwarder, 0).await;
            publish(&forwarder, 300).await;
            assert!(topic.log.closed_segments().len() > 2);
            forwarder.collect_segments().await;
            assert!(topic.log.closed_segments().is_empty());
            assert!(topic.log.start_offset() > 0);
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
            assert_eq!(topic.log.start_offset(), 0, "nothing acknowledged, nothing expired: nothing deleted");
            clock.advance(8 * DAY);
            forwarder.collect_segments().await;
            let start = topic.log.start_offset();
            assert!(start > 0, "seven days later the unacknowledged messages expire");
            assert_eq!(entry.state.borrow().ack_floor(), start, "the subscription forgets what was deleted");
            assert_eq!(entry.state.borrow().backlog(topic.log.end_offset()), topic.log.end_offset() - start);
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
                assert_eq!(topic.log.start_offset(), 0, "retention keeps acknowledged messages for seek");
                clock.advance(if retain_acked { 8 * DAY } else { Duration::from_secs(7200) });
                forwarder.collect_segments().await;
                assert!(topic.log.start_offset() > 0, "and lets them go once it expires");
            });
        }
    }
}

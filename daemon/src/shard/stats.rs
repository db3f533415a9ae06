//! A shard's stats for the router's stats response: its topics, subscriptions, data
//! directories and latencies.

use super::Forwarder;
use crate::api::stats::{
    DirectoryStatus, FollowerStats, PushError, PushStats, QuarantinedTopic, ReplicaStats, ShardStats,
    SubscriptionStats, TopicStats,
};
use crate::log::Directories;
use crate::push::client::PUSH_OUTCOME_CLASSES;
use crate::replication::protocol::{JOURNAL, MESSAGES};
use crate::storage::Storage;
use crate::subscription::SubscriptionEntry;
use crate::topic::{Replication, TopicState};
use std::rc::Rc;

impl<S: Storage> Forwarder<S> {
    pub fn shard_stats(&self) -> ShardStats {
        let (publish_latency, commit_latency) = crate::metrics::latency::shard_summaries();
        ShardStats {
            publish_latency,
            commit_latency,
            shard: self.shard,
            topics: self.registry.topics_by_id.borrow().len() as u32,
            directories: directory_status(&self.store.directories),
            repairs: self.store.directories.repairs(),
            quarantined: self
                .registry
                .quarantined
                .borrow()
                .topics
                .values()
                .map(|(name, why)| QuarantinedTopic { name: name.to_string(), reason: why.to_string() })
                .collect(),
        }
    }

    pub async fn topic_stats(&self) -> Vec<TopicStats> {
        let now_ms = self.environment.clock.wall_ms();
        let topics = self.registry.topic_list();
        let mut out = Vec::with_capacity(topics.len());
        // Followers serve no client but are shown: an operator looks for a source's lag on
        // every replica.
        let followers: Vec<_> = self.registry.followers.borrow().values().cloned().collect();
        for topic in followers {
            out.push(TopicStats {
                name: topic.name.to_string(),
                shard: self.shard,
                source: topic.source,
                first_offset: topic.log.start_offset().get(),
                end_offset: topic.log.end_offset().get(),
                disk_bytes: topic.log.disk_bytes(),
                replication: self.replica_stats(&topic),
                ..TopicStats::default()
            });
        }
        for topic in topics {
            let end = topic.log.end_offset();
            let entries: Vec<Rc<SubscriptionEntry>> = topic.subscriptions.borrow().to_vec();
            let mut subscriptions = Vec::with_capacity(entries.len());
            for entry in entries {
                let (floor, backlog, outstanding, open_streams) = {
                    let state = entry.state.borrow();
                    (state.ack_floor(), state.backlog(end), state.outstanding(), state.stream_count())
                };
                let counted = {
                    let state = entry.state.borrow();
                    SubscriptionStats {
                        delivered_total: state.delivered_total,
                        redelivered_total: state.redelivered_total,
                        acked_total: state.acked_total,
                        expired_total: state.expired_total,
                        dead_lettered_total: state.dead_lettered_total,
                        ..SubscriptionStats::default()
                    }
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
                let idle_ms =
                    if open_streams > 0 { 0 } else { now_ms.saturating_sub(entry.last_activity_ms.get()) };
                subscriptions.push(SubscriptionStats {
                    idle_ms,
                    delivered_per_second: entry.delivered.per_second(&self.activity.rate_ticks.borrow()),
                    acked_per_second: entry.acked.per_second(&self.activity.rate_ticks.borrow()),
                    name: entry.name.to_string(),
                    backlog_messages: backlog,
                    outstanding_messages: outstanding as u64,
                    backlog_bytes: if floor < end { topic.log.bytes_from(floor) } else { 0 },
                    open_streams: open_streams as u64,
                    oldest_unacked_age_ms,
                    push: self.push_stats(&entry),
                    ..counted
                });
            }
            out.push(TopicStats {
                name: topic.name.to_string(),
                shard: self.shard,
                source: topic.source,
                several_sources: false,
                first_offset: topic.log.start_offset().get(),
                end_offset: end.get(),
                disk_bytes: topic.log.disk_bytes(),
                published_per_second: topic.published.per_second(&self.activity.rate_ticks.borrow()),
                published_messages_total: topic.published_messages_total.get(),
                published_bytes_total: topic.published_bytes_total.get(),
                subscriptions,
                replication: self.replica_stats(&topic),
            });
        }
        out
    }

    /// A push subscription's pushing, from its configuration and its task's flight; `None`
    /// for a pull subscription.
    fn push_stats(&self, entry: &SubscriptionEntry) -> Option<PushStats> {
        let endpoint = entry.push.get()?.endpoint.clone();
        let Some(flight) = self.pushing.flight(&entry.name) else {
            return Some(PushStats { endpoint, ..PushStats::default() });
        };
        let now = crate::runtime::now();
        let last_error = flight.last_error.borrow().clone().map(|reason| PushError {
            reason,
            ms_ago: flight
                .last_error_at
                .get()
                .map_or(0, |at| now.saturating_duration_since(at).as_millis() as u64),
        });
        let requests = flight.requests_by_class.get();
        let window = flight.window.borrow().size();
        Some(PushStats {
            endpoint,
            window,
            outstanding: flight.outstanding.get(),
            last_error,
            failures_in_a_row: flight.failures_in_a_row.get(),
            requests_by_class: PUSH_OUTCOME_CLASSES
                .iter()
                .zip(requests)
                .map(|(class, count)| ((*class).to_owned(), count))
                .collect(),
        })
    }

    /// The replica's part in `topic`'s replication; `None` for a topic of one replica.
    fn replica_stats(&self, topic: &TopicState<S>) -> Option<ReplicaStats> {
        let durable_end = topic.log.durable_end().get();
        let committed_end = topic.log.committed_end().get();
        match &*topic.replication.borrow() {
            Replication::Alone => None,
            Replication::Follower { synced_epoch } => Some(ReplicaStats {
                leader: false,
                epoch: synced_epoch.get(),
                durable_end,
                committed_end,
                followers: Vec::new(),
            }),
            Replication::Leader(leader) => {
                let now = self.environment.clock.now();
                // The journal opens with its first entry; unopened, nothing lags.
                let journal_end = topic.journal.opened().map_or(0, |journal| journal.durable_end().get());
                let journal_ends = leader.followers(JOURNAL, now);
                Some(ReplicaStats {
                    leader: true,
                    epoch: leader.epoch.get(),
                    durable_end,
                    committed_end,
                    followers: leader
                        .followers(MESSAGES, now)
                        .into_iter()
                        .zip(journal_ends)
                        .map(|((peer, end, answered), (_, journal_held, _))| {
                            (peer, end.get(), answered, journal_held.get())
                        })
                        .map(|(peer, end, answered, journal_held)| FollowerStats {
                            shard: peer.shard.global(),
                            address: peer.address.clone(),
                            durable_end: end,
                            lag_messages: durable_end.saturating_sub(end),
                            journal_lag_entries: journal_end.saturating_sub(journal_held),
                            answered_ms_ago: answered.map(|ago| ago.as_millis() as u64),
                        })
                        .collect(),
                })
            }
        }
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

impl<S: Storage> Forwarder<S> {
    /// What the shard's flow control holds and has done, for a scrape.
    pub fn flow_figures(&self) -> crate::metrics::shard::FlowFigures {
        let (outstanding, rate) = (&self.store.outstanding, &self.store.publish_rate);
        let (outstanding_messages, outstanding_bytes) = outstanding.held();
        crate::metrics::shard::FlowFigures {
            outstanding_messages,
            outstanding_bytes,
            deliveries_paused: outstanding.paused_total.get(),
            publishes_slowed: rate.slowed_total.get(),
            publishes_refused_messages_rate: rate.refused_messages_total.get(),
            publishes_refused_bytes_rate: rate.refused_bytes_total.get(),
            publishes_refused_held_bytes: rate.refused_held_total.get(),
            publish_held_bytes: rate.held_bytes.get() as u64,
        }
    }
}

//! The stats response on the wire: the domain's figures (`api::stats`), moved field by field
//! into the wire's messages. Stats are asked for by an operator, not on a data path.

use crate::api::stats::{
    DirectoryStatus, FollowerStats, LatencySummary, ProcessStats, PushStats, QuarantinedTopic, ReplicaStats,
    ShardStats, Stats, SubscriptionStats, TopicStats,
};
use ringpost_wire::messages as wire;

impl From<Stats> for wire::StatsWithPushResponse {
    fn from(mut stats: Stats) -> wire::StatsWithPushResponse {
        let mut push_subscriptions = Vec::new();
        for topic in &mut stats.topics {
            for subscription in &mut topic.subscriptions {
                if let Some(push) = subscription.push.take() {
                    push_subscriptions.push(push_subscription(&topic.name, &subscription.name, push));
                }
            }
        }
        wire::StatsWithPushResponse { stats: stats.into(), push_subscriptions }
    }
}

fn push_subscription(topic: &str, subscription: &str, push: PushStats) -> wire::PushSubscriptionStats {
    wire::PushSubscriptionStats {
        topic: topic.to_owned(),
        subscription: subscription.to_owned(),
        endpoint: push.endpoint,
        window: push.window,
        outstanding: push.outstanding,
        last_error: push
            .last_error
            .map(|error| wire::PushError { reason: error.reason, ms_ago: error.ms_ago }),
        failures_in_a_row: push.failures_in_a_row,
        requests: push
            .requests_by_class
            .into_iter()
            .map(|(class, count)| wire::PushRequestCount { class, count })
            .collect(),
    }
}

impl From<Stats> for wire::StatsResponse {
    fn from(stats: Stats) -> wire::StatsResponse {
        wire::StatsResponse {
            shards: stats.shards.into_iter().map(shard).collect(),
            topics: stats.topics.into_iter().map(topic).collect(),
            process: process(stats.process),
        }
    }
}

fn shard(stats: ShardStats) -> wire::ShardStats {
    wire::ShardStats {
        shard: stats.shard,
        topics: stats.topics,
        directories: stats.directories.into_iter().map(directory).collect(),
        repairs: stats.repairs,
        quarantined: stats.quarantined.into_iter().map(quarantined).collect(),
        publish_latency: latency(stats.publish_latency),
        commit_latency: latency(stats.commit_latency),
    }
}

fn directory(status: DirectoryStatus) -> wire::DirectoryStatus {
    wire::DirectoryStatus { path: status.path, fenced: status.fenced }
}

fn quarantined(topic: QuarantinedTopic) -> wire::QuarantinedTopic {
    wire::QuarantinedTopic { name: topic.name, reason: topic.reason }
}

fn latency(summary: LatencySummary) -> wire::LatencySummary {
    wire::LatencySummary {
        count: summary.count,
        p50_us: summary.p50_us,
        p99_us: summary.p99_us,
        p999_us: summary.p999_us,
        max_us: summary.max_us,
    }
}

fn topic(stats: TopicStats) -> wire::TopicStats {
    wire::TopicStats {
        name: stats.name,
        shard: stats.shard,
        first_offset: stats.first_offset,
        end_offset: stats.end_offset,
        disk_bytes: stats.disk_bytes,
        published_per_second: stats.published_per_second,
        subscriptions: stats.subscriptions.into_iter().map(subscription).collect(),
        replication: stats.replication.map(replica),
    }
}

fn replica(stats: ReplicaStats) -> wire::ReplicaStats {
    wire::ReplicaStats {
        leader: stats.leader,
        epoch: stats.epoch,
        durable_end: stats.durable_end,
        committed_end: stats.committed_end,
        followers: stats.followers.into_iter().map(follower).collect(),
    }
}

fn follower(stats: FollowerStats) -> wire::FollowerStats {
    wire::FollowerStats {
        shard: stats.shard,
        address: stats.address,
        durable_end: stats.durable_end,
        lag_messages: stats.lag_messages,
        journal_lag_entries: stats.journal_lag_entries,
        answered_ms_ago: stats.answered_ms_ago,
    }
}

fn subscription(stats: SubscriptionStats) -> wire::SubscriptionStats {
    wire::SubscriptionStats {
        name: stats.name,
        backlog_messages: stats.backlog_messages,
        outstanding_messages: stats.outstanding_messages,
        delivered_total: stats.delivered_total,
        expired_total: stats.expired_total,
        oldest_unacked_age_ms: stats.oldest_unacked_age_ms,
        idle_ms: stats.idle_ms,
        delivered_per_second: stats.delivered_per_second,
        acked_per_second: stats.acked_per_second,
    }
}

fn process(stats: ProcessStats) -> wire::ProcessStats {
    wire::ProcessStats {
        resident_bytes: stats.resident_bytes,
        open_files: stats.open_files,
        open_files_limit: stats.open_files_limit,
    }
}

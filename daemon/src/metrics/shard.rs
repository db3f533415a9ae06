//! What a shard counts for a scrape besides its requests: how long publishes and commits took,
//! how old messages were when first delivered, each data directory's writes, and its open
//! connections. Thread-local like the requests' table (`requests.rs`): every log, stream and
//! connection of the shard adds to it without a handle, with plain additions; a scrape asks
//! each shard for a copy (`ControlRequest::Requests`).

use super::histogram::DurationHistogram;
use super::requests::CommandFigures;
use std::cell::RefCell;
use std::time::Duration;

/// One data directory's writes on a shard, by its place in the shard's directories.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DirectoryFigures {
    pub copy: u32,
    /// Each write of a commit to this directory, from issued to done; a log's files are
    /// opened with O_DSYNC where the filesystem allows, so this is the time to durable.
    pub writes: DurationHistogram,
    /// fdatasync(2) calls after a commit's write, where writes are not O_DSYNC.
    pub syncs: DurationHistogram,
    pub written_bytes: u64,
    /// Writes that failed (each fences the directory for the log that made it).
    pub write_errors: u64,
}

/// A shard's figures for a scrape.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardFigures {
    pub commands: Vec<CommandFigures>,
    /// Publish requests from the checked request to their durable (and replicated) result.
    pub publish_ack: DurationHistogram,
    /// Commits of the shard's logs, from the write issued to durable on a quorum of copies.
    pub commit: DurationHistogram,
    /// Messages at their first delivery: from their publish time (the server's clock) to the
    /// delivery leaving the shard.
    pub delivery: DurationHistogram,
    pub directories: Vec<DirectoryFigures>,
    /// Connections of the native protocol open on this shard, on every port it serves.
    pub connections: u64,
    /// A forwarder's flow control (`subscription::outstanding`, `topic::rate`); the router
    /// shard's stays empty.
    pub flow: FlowFigures,
}

/// What a forwarder shard's flow control holds and has done.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FlowFigures {
    /// Messages and bytes its subscribers hold, delivered and not yet acknowledged.
    pub outstanding_messages: u64,
    pub outstanding_bytes: u64,
    /// Times a pull or stream with messages to deliver paused at an outstanding limit.
    pub deliveries_paused: u64,
    /// Publishes held back for their topic's rate, and refused: by the messages' rate, by the
    /// bytes' rate, for the shard's held bytes.
    pub publishes_slowed: u64,
    pub publishes_refused_messages_rate: u64,
    pub publishes_refused_bytes_rate: u64,
    pub publishes_refused_held_bytes: u64,
    /// Bytes of publishes held back now.
    pub publish_held_bytes: u64,
}

#[derive(Default)]
struct Figures {
    publish_ack: DurationHistogram,
    commit: DurationHistogram,
    delivery: DurationHistogram,
    directories: Vec<DirectoryFigures>,
    connections: u64,
}

impl Figures {
    fn directory(&mut self, copy: usize) -> &mut DirectoryFigures {
        while self.directories.len() <= copy {
            let next = self.directories.len() as u32;
            self.directories.push(DirectoryFigures { copy: next, ..DirectoryFigures::default() });
        }
        &mut self.directories[copy]
    }
}

thread_local! {
    static FIGURES: RefCell<Figures> = RefCell::new(Figures::default());
}

fn with<R>(action: impl FnOnce(&mut Figures) -> R) -> R {
    FIGURES.with(|figures| action(&mut figures.borrow_mut()))
}

pub fn record_publish_ack(duration: Duration) {
    with(|figures| figures.publish_ack.record(duration));
}

pub fn record_commit(duration: Duration) {
    with(|figures| figures.commit.record(duration));
}

/// A message first delivered `age_ms` after it was published.
pub fn record_delivery(age_ms: u64) {
    with(|figures| figures.delivery.record(Duration::from_millis(age_ms)));
}

/// A write of `bytes` to the shard's data directory `copy`, done after `duration`.
pub fn record_write(copy: usize, bytes: u64, duration: Duration, succeeded: bool) {
    with(|figures| {
        let directory = figures.directory(copy);
        if succeeded {
            directory.writes.record(duration);
            directory.written_bytes += bytes;
        } else {
            directory.write_errors += 1;
        }
    });
}

pub fn record_sync(copy: usize, duration: Duration) {
    with(|figures| figures.directory(copy).syncs.record(duration));
}

/// A native connection opened on this shard; the guard counts it closed when dropped.
pub fn connection_opened() -> ConnectionCounted {
    with(|figures| figures.connections += 1);
    ConnectionCounted(())
}

/// One open connection in the shard's count.
pub struct ConnectionCounted(());

impl Drop for ConnectionCounted {
    fn drop(&mut self) {
        with(|figures| {
            debug_assert!(figures.connections > 0, "a connection is counted closed once");
            figures.connections = figures.connections.saturating_sub(1);
        });
    }
}

/// This shard's figures, its requests included.
pub fn snapshot() -> ShardFigures {
    let commands = super::requests::snapshot();
    with(|figures| ShardFigures {
        commands,
        publish_ack: figures.publish_ack.clone(),
        commit: figures.commit.clone(),
        delivery: figures.delivery.clone(),
        directories: figures.directories.clone(),
        connections: figures.connections,
        flow: FlowFigures::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_counts_its_directories_writes_and_connections() {
        let before = snapshot();
        record_write(2, 4096, Duration::from_micros(300), true);
        record_write(2, 4096, Duration::from_micros(300), false);
        record_sync(0, Duration::from_micros(900));
        let connection = connection_opened();
        let figures = snapshot();
        assert_eq!(figures.connections, before.connections + 1);
        drop(connection);
        assert_eq!(snapshot().connections, before.connections);
        assert!(figures.directories.len() >= 3);
        assert_eq!(figures.directories[2].copy, 2);
        assert_eq!(figures.directories[2].written_bytes, 4096);
        assert_eq!(figures.directories[2].write_errors, 1);
        assert_eq!(figures.directories[2].writes.count(), 1);
        assert_eq!(figures.directories[0].syncs.count(), 1);
    }
}

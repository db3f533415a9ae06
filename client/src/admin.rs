//! Administrative requests: stats and data-directory resync. Both go to the router.

use crate::{Client, Result};
use ringpost_wire::messages::{
    Empty, ListRequest, NameRequest, ResyncDirectoryRequest, ResyncDirectoryResponse, SeekRequest, Snapshot,
    SnapshotList, SnapshotRequest, StatsResponse,
};
use ringpost_wire::Command;

impl Client {
    /// Per topic and subscription: offsets, backlog, outstanding, delivery counters, oldest
    /// unacknowledged age; per shard: data directories and whether they are fenced.
    pub async fn stats(&self) -> Result<StatsResponse> {
        self.control(Command::Stats, &Empty {}).await
    }

    /// Seeks a subscription to a time (milliseconds since the Unix epoch): messages published
    /// before it count as acknowledged, messages from it on as not, including acknowledged ones
    /// still retained (`retain_acked_messages` or a topic retention keeps them for replay).
    pub async fn seek(&self, subscription: &str, time_ms: u64) -> Result<()> {
        let request = SeekRequest { subscription: subscription.to_owned(), time_ms, snapshot: String::new() };
        let _: Empty = self.control(Command::Seek, &request).await?;
        Ok(())
    }

    /// Seeks a subscription to a snapshot of the same topic: exactly the messages unacknowledged
    /// when the snapshot was taken (and those published since) are delivered again.
    pub async fn seek_to_snapshot(&self, subscription: &str, snapshot: &str) -> Result<()> {
        let request =
            SeekRequest { subscription: subscription.to_owned(), time_ms: 0, snapshot: snapshot.to_owned() };
        let _: Empty = self.control(Command::Seek, &request).await?;
        Ok(())
    }

    /// Captures a subscription's acknowledgements as a snapshot, which keeps the messages it
    /// needs for up to 7 days.
    pub async fn create_snapshot(&self, name: &str, subscription: &str) -> Result<Snapshot> {
        let request = SnapshotRequest { name: name.to_owned(), subscription: subscription.to_owned() };
        self.control(Command::CreateSnapshot, &request).await
    }

    /// A snapshot's topic and expiry (`NotFound` if there is no such snapshot).
    pub async fn get_snapshot(&self, name: &str) -> Result<Snapshot> {
        self.control(Command::GetSnapshot, &NameRequest { name: name.to_owned() }).await
    }

    pub async fn delete_snapshot(&self, name: &str) -> Result<()> {
        let _: Empty = self.control(Command::DeleteSnapshot, &NameRequest { name: name.to_owned() }).await?;
        Ok(())
    }

    /// Every snapshot, following pages.
    pub async fn list_snapshots(&self) -> Result<Vec<Snapshot>> {
        let mut snapshots = Vec::new();
        let mut page_token = String::new();
        loop {
            let request = ListRequest { topic: String::new(), page_size: 1000, page_token };
            let page: SnapshotList = self.control(Command::ListSnapshots, &request).await?;
            snapshots.extend(page.snapshots);
            if page.next_page_token.is_empty() {
                return Ok(snapshots);
            }
            page_token = page.next_page_token;
        }
    }

    /// Brings fenced data directory `index` (0-based, in `--data-dir` order) back: every log's
    /// copy in it is rewritten from healthy copies, then it takes writes again.
    pub async fn resync_directory(&self, index: u32) -> Result<ResyncDirectoryResponse> {
        self.control(Command::ResyncDirectory, &ResyncDirectoryRequest { index }).await
    }
}

//! Administrative requests: stats and data-directory resync. Both go to the router.

use crate::{Client, Result};
use ringpost_wire::messages::{
    Empty, ResyncDirectoryRequest, ResyncDirectoryResponse, SeekRequest, StatsResponse,
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
        let _: Empty = self
            .control(Command::Seek, &SeekRequest { subscription: subscription.to_owned(), time_ms })
            .await?;
        Ok(())
    }

    /// Brings fenced data directory `index` (0-based, in `--data-dir` order) back: every log's
    /// copy in it is rewritten from healthy copies, then it takes writes again.
    pub async fn resync_directory(&self, index: u32) -> Result<ResyncDirectoryResponse> {
        self.control(Command::ResyncDirectory, &ResyncDirectoryRequest { index }).await
    }
}

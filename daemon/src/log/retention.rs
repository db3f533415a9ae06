//! Retention: the closed segments as retention sees them, and their deletion, oldest first and
//! never the active one (`remove_oldest`): the manifest without them is durable before their
//! files go, and the files shrink in steps so that a trimming disk never stalls the commits
//! behind one large deletion (`shrink_gradually`).

use super::*;
use crate::ids::Offset;

/// A closed segment, as retention sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentInfo {
    pub base_offset: Offset,
    /// One past its last record.
    pub end_offset: Offset,
    pub newest_publish_ms: u64,
}

/// Bytes a deleted segment shrinks by at a time before it is unlinked (see `shrink_gradually`).
pub const SEGMENT_DELETE_STEP_BYTES: u64 = 4 << 20;

/// Pause between two steps, so that other writes and syncs get to the device in between.
pub const SEGMENT_DELETE_PAUSE: std::time::Duration = std::time::Duration::from_millis(2);

impl<S: Storage> Log<S> {
    /// The oldest offset still stored.
    pub fn start_offset(&self) -> Offset {
        let inner = self.inner.borrow();
        Offset::new(
            inner
                .segments
                .first()
                .map(|segment| segment.base_offset)
                .unwrap_or(inner.positions.committed_end),
        )
    }

    /// Refuses appends from now on and waits until the commits in flight are done, so that the
    /// log's files can be removed: a commit that met a vanished file would fail its write, and a
    /// failed write fences the data directory for every log of the shard. Segments can still be
    /// removed (`remove_oldest`), and nothing is fenced.
    pub async fn close_for_removal(&self) {
        self.inner.borrow_mut().closed_for_removal = true;
        while self.inner.borrow().flushing || self.inner.borrow().manifest_writing {
            crate::runtime::sleep(REMOVAL_WAIT).await;
        }
    }

    /// The closed segments (all but the active one), oldest first, for retention decisions.
    pub fn closed_segments(&self) -> Vec<SegmentInfo> {
        let inner = self.inner.borrow();
        let count = inner.segments.len();
        (0..count.saturating_sub(1))
            .map(|index| SegmentInfo {
                base_offset: Offset::new(inner.segments[index].base_offset),
                end_offset: Offset::new(inner.segments[index + 1].base_offset),
                newest_publish_ms: inner.segments[index].newest_publish_ms,
            })
            .collect()
    }

    /// Deletes whole segments all of whose records are below `offset` (never the active one).
    pub async fn remove_before(&self, offset: Offset) -> Result<usize, LogError> {
        let count = self.closed_segments().iter().take_while(|segment| segment.end_offset <= offset).count();
        self.remove_oldest(count).await
    }

    /// Deletes the `count` oldest segments (never the active one): the manifest without them is
    /// made durable first, then the files are removed. Returns the number removed.
    pub async fn remove_oldest(&self, count: usize) -> Result<usize, LogError> {
        let count = count.min(self.inner.borrow().segments.len().saturating_sub(1));
        if count == 0 || self.is_fenced().is_some() {
            return Ok(0);
        }
        let mut removed: Vec<Segment<S>> = self.inner.borrow_mut().segments.drain(..count).collect();
        if let Err(error) = self.write_manifest().await {
            // Nothing was deleted: the segments stay the log's, for the next collection to try
            // again (dropped here, they would have stayed on disk for good).
            let mut inner = self.inner.borrow_mut();
            let kept = std::mem::take(&mut inner.segments);
            inner.segments = removed;
            inner.segments.extend(kept);
            return Err(error);
        }
        self.recycle_one_of(&mut removed);
        for copy in 0..self.directories.count() {
            let folder = self.folder(copy);
            for segment in &mut removed {
                let path = folder.join(segment_name(segment.base_offset));
                if self.storage.exists(&path) {
                    shrink_gradually(segment.files[copy].take(), segment.capacity).await;
                    let _ = self.storage.remove_file(&path);
                }
            }
            if !self.directories.is_fenced(copy) {
                let _ = self.storage.sync_dir(&folder).await;
            }
        }
        Ok(count)
    }

    /// Bytes of segment files (allocated capacity) of one copy, a recycled one included.
    pub fn disk_bytes(&self) -> u64 {
        let inner = self.inner.borrow();
        let recycled = inner.kept.recycled.as_ref().map_or(0, |recycled| recycled.capacity);
        inner.segments.iter().map(|segment| segment.capacity).sum::<u64>() + recycled
    }
}

/// Deleting a large file frees all of its blocks at once, and where the filesystem trims freed
/// blocks (ext4 mounted with `discard`, as here) the device then trims all of them while every
/// write and fdatasync queued behind waits, for milliseconds: the tail of the end-to-end
/// latency. Shrinking it by `SEGMENT_DELETE_STEP_BYTES` with a pause between steps trims a
/// step at a time, between the other I/O (see benches/README.md).
/// Not while anyone else holds the file (a read still finishing): the plain unlink that follows
/// leaves the bytes to it.
pub(super) async fn shrink_gradually<F: StorageFile>(file: Option<Rc<F>>, size: u64) {
    let Some(file) = file else { return };
    if Rc::strong_count(&file) > 1 {
        return;
    }
    let mut size = size;
    while size > SEGMENT_DELETE_STEP_BYTES {
        size -= SEGMENT_DELETE_STEP_BYTES;
        if file.truncate(size).await.is_err() {
            return;
        }
        crate::runtime::sleep(SEGMENT_DELETE_PAUSE).await;
    }
}

//! Snapshots: created from a subscription's acknowledgements, updated, deleted and listed.

use super::*;

/// Snapshots keep their messages for 7 days (Pub/Sub's limit).
pub const SNAPSHOT_LIFETIME_MS: u64 = 7 * 24 * 3600 * 1000;

impl<S: Storage> Router<S> {
    pub(super) fn snapshot_record(&self, name: &str) -> Result<SnapshotRecord, ControlError> {
        validate_name("snapshot", name)?;
        self.state
            .borrow()
            .snapshots
            .get(name)
            .cloned()
            .ok_or_else(|| ControlError::not_found(format!("snapshot '{name}'")))
    }

    /// A snapshot named `name` of subscription `subscription`'s acknowledgements.
    pub async fn create_snapshot(
        &self,
        name: &str,
        subscription: &str,
        labels: Labels,
    ) -> Result<Snapshot, ControlError> {
        validate_name("snapshot", name)?;
        validate_labels(&labels)?;
        let record = self.subscription_record(subscription)?;
        if record.detached {
            return Err(detached(&record.name));
        }
        let _reservation = self.reserve_name(&format!("snapshot/{name}"))?;
        if self.state.borrow().snapshots.contains_key(name) {
            return Err(ControlError::already_exists(format!("snapshot '{name}'")));
        }
        let Some(topic) = self.state.borrow().topic_by_id(record.topic_id).cloned() else {
            return Err(ControlError::failed_precondition(format!(
                "subscription '{}' is detached",
                record.name
            )));
        };
        self.check_leads()?;
        let _slot = self.within_limits(CreateKind::Snapshot)?;
        let id = SnapshotId::new(self.allocate_id().await?);
        let expire_time_ms = wall_ms() + SNAPSHOT_LIFETIME_MS;
        // Every source keeps the subscription's acknowledgements on its own log under the one
        // id. A source added later has none: a seek to the snapshot seeks it to the
        // snapshot's time instead (`seek`).
        let units = self.units_of(topic.id);
        if units.is_empty() {
            return Err(ControlError::unavailable("topic not placed"));
        }
        for (taken, unit) in units.iter().enumerate() {
            let take = ControlRequest::TakeSnapshot {
                topic_id: unit.id,
                subscription_id: record.id,
                snapshot_id: id,
                expire_time_ms,
            };
            if let Err(error) = self.call_forwarder(unit.shard, take).await {
                // Not committed: what the other sources took would only wait for its expiry.
                self.drop_snapshot_on(&units[..taken], id).await;
                return Err(error);
            }
        }
        let snapshot =
            SnapshotRecord { id, name: name.to_owned(), topic_id: topic.id, expire_time_ms, labels };
        let response = Snapshot {
            name: name.to_owned(),
            topic: topic.name.to_string(),
            expire_time_ms,
            labels: snapshot.labels.clone(),
        };
        self.propose(CatalogEntry::SnapshotCreated(snapshot)).await?;
        Ok(response)
    }

    /// One page of the snapshots (of `request.topic`, when given) that `visible` shows, as
    /// `list_topics` pages.
    pub fn list_snapshots(&self, request: &ListRequest, visible: impl Fn(&str) -> bool) -> Page<Snapshot> {
        let state = self.state.borrow();
        let topic_filter = request.topic.as_str();
        let snapshots = state
            .snapshots
            .range::<str, _>((
                std::ops::Bound::Excluded(request.page_token.as_str()),
                std::ops::Bound::Unbounded,
            ))
            .filter(|(name, _)| visible(name))
            .map(|(_, snapshot)| snapshot_message(&state, snapshot))
            .filter(|snapshot| topic_filter.is_empty() || snapshot.topic == topic_filter);
        page(snapshots, request.page_size, |snapshot| &snapshot.name)
    }

    /// UpdateSnapshot: changes a snapshot's labels (`None`: leaves them). Only the catalog
    /// holds them: the forwarder's copy of the snapshot is its acknowledgements.
    pub async fn update_snapshot(
        &self,
        name: &str,
        labels: Option<Labels>,
    ) -> Result<Snapshot, ControlError> {
        let _update = self.update_permit().await?;
        let mut snapshot = self.snapshot_record(name)?;
        if let Some(labels) = labels {
            validate_labels(&labels)?;
            snapshot.labels = labels;
        }
        let entry = CatalogEntry::SnapshotUpdated {
            id: snapshot.id,
            name: snapshot.name.clone(),
            labels: snapshot.labels,
        };
        // A deletion that committed while the update waited for the disk wins.
        if self.propose(entry).await? == Applied::Updated(false) {
            return Err(ControlError::not_found(format!("snapshot '{name}' (deleted during the update)")));
        }
        self.get_snapshot(name)
    }

    pub fn get_snapshot(&self, name: &str) -> Result<Snapshot, ControlError> {
        let snapshot = self.snapshot_record(name)?;
        Ok(snapshot_message(&self.state.borrow(), &snapshot))
    }

    pub async fn delete_snapshot(&self, name: &str) -> Result<(), ControlError> {
        let snapshot = self.snapshot_record(name)?;
        self.propose(CatalogEntry::SnapshotDeleted { id: snapshot.id, name: snapshot.name.clone() }).await?;
        self.drop_snapshot_on(&self.units_of(snapshot.topic_id), snapshot.id).await;
        Ok(())
    }

    /// Drops snapshot `id`'s copies on `units`. Best effort: a copy left behind (a forwarder
    /// that did not answer) keeps its messages only until the snapshot's expiry.
    async fn drop_snapshot_on(&self, units: &[sources::Unit], id: SnapshotId) {
        for unit in units {
            let drop = ControlRequest::DropSnapshot { topic_id: unit.id, snapshot_id: id };
            let _ = self.call_forwarder(unit.shard, drop).await;
        }
    }
}

/// When snapshot `snapshot` was taken: its expiry less its lifetime.
pub(super) fn snapshot_taken_ms(snapshot: &SnapshotRecord) -> u64 {
    snapshot.expire_time_ms.saturating_sub(SNAPSHOT_LIFETIME_MS)
}

/// A snapshot as clients see it: its topic's name, or `DELETED_TOPIC` once it is deleted.
pub(super) fn snapshot_message(state: &CatalogState, snapshot: &SnapshotRecord) -> Snapshot {
    Snapshot {
        name: snapshot.name.clone(),
        topic: state
            .topic_names
            .get(&snapshot.topic_id)
            .cloned()
            .unwrap_or_else(|| DELETED_TOPIC.into())
            .to_string(),
        expire_time_ms: snapshot.expire_time_ms,
        labels: snapshot.labels.clone(),
    }
}

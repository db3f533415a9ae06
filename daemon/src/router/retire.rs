//! Retiring a topic's highest source (docs/SOURCES.md, "Retiring a source"): the catalog marks
//! it retiring (`CatalogEntry::SourceRetiring`), so the topic's active count falls by one and
//! every unit applies the new count (`ControlRequest::ApplySources`): the retiring source takes
//! no publish and is still delivered from. The catalog's leader then looks, every
//! `SOURCES_PASS_INTERVAL`, at each retiring source's subscriptions: once each one's ack floor
//! there is at its fence (the source's assigned end when it stopped taking publishes), or it
//! has none, the source is deleted (`CatalogEntry::SourceDeleted`) and its log removed.

use super::sources::Unit;
use super::*;
use crate::ids::SourceId;

/// How often the catalog's leader looks whether a retiring source is delivered out, and tells
/// every unit of a topic of several sources its active count again (a unit that missed a
/// change, its node unreachable then, learns it here). A second: a retired source's files
/// wait at most that long after its last acknowledgement, and a topic of several sources costs
/// one small control request per unit a second.
pub const SOURCES_PASS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

impl<S: Storage> Router<S> {
    /// Retires topic `name`'s highest active source (the load-following loop's way down): it
    /// takes no more publishes, its subscribers receive what it holds, and it is deleted once
    /// every subscription acknowledged that. Refused for a topic of one active source.
    pub async fn retire_source(&self, name: &str) -> Result<(), ControlError> {
        let _update = self.update_permit().await?;
        let topic = self.topic_record(name)?;
        self.retire_highest(&topic).await
    }

    /// Retires topic `topic`'s highest active sources until `count` are active.
    pub(super) async fn retire_sources(&self, topic: &TopicRecord, count: u32) -> Result<(), ControlError> {
        while self.state.borrow().active_sources(topic.id) > count.max(1) {
            self.retire_highest(topic).await?;
        }
        Ok(())
    }

    /// Commits the retirement of topic `topic`'s highest active source, then tells each of its
    /// units the count.
    async fn retire_highest(&self, topic: &TopicRecord) -> Result<(), ControlError> {
        // A replicated source's followers learn no active count (their attach carries none, and
        // the count is told to leaders), and a deletion would remove the leader's files alone:
        // refused until both are built, rather than leave replicas behind.
        if topic.replica_count() > 1 {
            return Err(ControlError::failed_precondition(format!(
                "topic '{}' has {} replicas: retiring a replicated source is not supported yet",
                topic.name,
                topic.replica_count()
            )));
        }
        self.check_gate_passed(topic)?;
        let active = self.state.borrow().active_sources(topic.id);
        let source =
            SourceId::new(active - 1).filter(|source| *source != SourceId::FIRST).ok_or_else(|| {
                ControlError::failed_precondition(format!(
                    "topic '{}' has one active source: source 0, the topic's own log, never retires",
                    topic.name
                ))
            })?;
        match self.propose(CatalogEntry::SourceRetiring { topic_id: topic.id, source }).await? {
            Applied::Updated(true) => {}
            _ => {
                return Err(ControlError::failed_precondition(format!(
                    "topic '{}': source {} did not retire (the topic or its sources changed meanwhile)",
                    topic.name,
                    source.get()
                )))
            }
        }
        self.apply_active_sources(topic.id)
            .await
            .map_err(|status| not_applied("topic", &topic.name, status))?;
        Ok(())
    }

    /// On the catalog's leader: each topic of several sources' units told its active count
    /// again, and each retiring source whose every subscription acknowledged up to its fence
    /// deleted. One change at a time with the updates (the update gate).
    pub async fn sources_pass(&self) {
        if !self.catalog.leads() {
            return;
        }
        let Ok(_update) = self.update_permit().await else { return };
        for topic_id in self.topics_to_pass() {
            let active = self.state.borrow().active_sources(topic_id);
            let mut answers = Vec::new();
            for unit in self.units_of(topic_id) {
                // The gate first, so that a unit takes a moved key only once it holds it.
                if self.tell_gate(topic_id, &unit).await.is_err() {
                    continue;
                }
                let request = ControlRequest::ApplySources { topic_id: unit.id, active };
                let (fence, floors) = match self.call_forwarder(unit.shard, request).await {
                    Ok(ControlOk::SourcesApplied { fence, floors }) => (fence, floors),
                    Ok(_) => continue,
                    Err(error) => {
                        crate::log_warn!(
                            "ringpostd: telling source {} of topic {topic_id:x} its active count: {}",
                            unit.source.get(),
                            Status::from(error)
                        );
                        continue;
                    }
                };
                if unit.source.get() >= active && floors.iter().all(|(_, floor)| *floor >= fence) {
                    self.delete_retired(topic_id, unit).await;
                }
                answers.push((unit.source.get(), fence, floors));
            }
            self.commit_passes(topic_id, &answers).await;
        }
    }

    /// Deletes retiring source `unit` of topic `topic_id`, delivered out: the catalog first,
    /// then its log (if removing the files fails now, the next start removes them, as a
    /// deleted topic's: the catalog no longer names the folder).
    async fn delete_retired(&self, topic_id: TopicId, unit: Unit) {
        let entry = CatalogEntry::SourceDeleted { topic_id, source: unit.source, id: unit.id };
        match self.propose(entry).await {
            Ok(Applied::Updated(true)) => {}
            Ok(_) => return,
            Err(error) => {
                crate::log_warn!(
                    "ringpostd: deleting retired source {} of topic {topic_id:x}: {error}",
                    unit.source.get()
                );
                return;
            }
        }
        crate::log_info!("ringpostd: source {} of topic {topic_id:x} retired and deleted", unit.source.get());
        let detach = ControlRequest::DetachTopic { topic_id: unit.id, delete_data: true };
        if let Err(error) = self.call_forwarder(unit.shard, detach).await {
            crate::log_warn!(
                "ringpostd: removing the files of retired source {} of topic {topic_id:x}: {}",
                unit.source.get(),
                Status::from(error)
            );
        }
    }
}

//! The delivery gate (docs/SOURCES.md, "Key order across a change of the source set", rule 3):
//! after a change of a topic's active count, each ordered subscription's sources hold the
//! messages of the keys that moved to them until the subscription has *passed* the change, its
//! ack floor on every source that lost keys at or above that source's fence. The catalog opens
//! the gate in the same step as the change (`SourceAdded`, `SourceRetiring`); the catalog's
//! leader reads fences and floors in its pass (`sources_pass`), commits each subscription's
//! pass (`CatalogEntry::SourcesPassed`) and tells the sources (`ControlRequest::GateSources`),
//! which release what they held. One change at a time: the next waits for every pass.

use super::sources::Unit;
use super::*;
use crate::catalog::entry::losing_sources;
use std::collections::BTreeSet;

/// One unit's answer to `ApplySources`: its source number, its fence, and each subscription's
/// ack floor on it.
pub(super) type Answer = (u32, u64, Vec<(u64, u64)>);

/// Whether subscription `id` passed the change from `before` to `after`: on every source that
/// lost keys, its ack floor is at or above that source's fence. `answers` are the units that
/// answered, `units` every source the topic still has: a losing source it no longer has was
/// deleted once every subscription's floor reached its fence; one that did not answer, or
/// that does not serve the subscription, has not shown it.
pub(super) fn passed(id: u64, before: u32, after: u32, units: &[u32], answers: &[Answer]) -> bool {
    losing_sources(before, after).all(|source| {
        match answers.iter().find(|(number, _, _)| *number == source) {
            Some((_, fence, floors)) => {
                floors.iter().any(|(subscription, floor)| *subscription == id && floor >= fence)
            }
            None => !units.contains(&source),
        }
    })
}

/// What a unit was told of its gate: the generation and the subscriptions that passed it, in
/// order.
pub(super) type Told = (u64, Vec<u64>);

/// What a gate request tells, to compare with what was told before.
fn gate_told(request: &ControlRequest) -> Told {
    match request {
        ControlRequest::GateSources { generation, passed, .. } => {
            let mut passed = passed.clone();
            passed.sort_unstable();
            (*generation, passed)
        }
        _ => (0, Vec::new()),
    }
}

impl<S: Storage> Router<S> {
    /// What tells `unit` of topic `topic_id` its gate, as the catalog holds it; `None` for a
    /// topic whose count never changed.
    fn gate_request(&self, topic_id: TopicId, unit: &Unit) -> Option<ControlRequest> {
        let state = self.state.borrow();
        let gate = state.source_gate(topic_id);
        if gate.generation == 0 {
            return None;
        }
        let passed = state
            .subscriptions_served_by(topic_id)
            .filter(|record| state.passed_sources(record))
            .map(|record| record.id)
            .collect();
        Some(ControlRequest::GateSources {
            topic_id: unit.id,
            generation: gate.generation,
            before: gate.before,
            after: state.active_sources(topic_id),
            passed,
        })
    }

    /// Tells `unit` its topic's gate: before its `ApplySources`, so that it takes a moved key
    /// only once it holds it, and before its subscriptions are attached at a start.
    pub(super) async fn tell_gate(&self, topic_id: TopicId, unit: &Unit) -> Result<(), ControlError> {
        let Some(request) = self.gate_request(topic_id, unit) else { return Ok(()) };
        let told = gate_told(&request);
        self.call_forwarder(unit.shard, request).await?;
        if unit.shard.node() == self.node_id() {
            self.gates_told.borrow_mut().insert((unit.id, unit.shard), told);
        }
        Ok(())
    }

    /// On every node, each pass: each unit served here told its topic's gate as this node's
    /// catalog holds it, when that is not what this router last told it. The catalog's leader
    /// tells every unit once a subscription passes (`commit_passes`), but not again: a unit
    /// whose node it did not reach then would hold the moved keys' messages for good, its
    /// topic back to one source and passed by all, so out of the pass's topics. A unit is
    /// never told less than it was (`TopicState::apply_gate` adds the passed of one
    /// generation), so a catalog here that lags the leader's holds nothing again.
    pub(super) async fn retell_gates(&self) {
        let node = self.node_id();
        let topics: Vec<TopicId> = self.state.borrow().source_gates.keys().copied().collect();
        let mut current = std::collections::HashSet::new();
        for topic_id in topics {
            for unit in self.units_of(topic_id).into_iter().filter(|unit| unit.shard.node() == node) {
                current.insert((unit.id, unit.shard));
                let Some(request) = self.gate_request(topic_id, &unit) else { continue };
                if self.gates_told.borrow().get(&(unit.id, unit.shard)) == Some(&gate_told(&request)) {
                    continue;
                }
                // A replica that does not lead now is told at its promotion (`promote`).
                if let Err(error) = self.tell_gate(topic_id, &unit).await {
                    crate::log_debug!(
                        "ringpostd: telling source {} of topic {topic_id:x} its gate again: {}",
                        unit.source.get(),
                        Status::from(error)
                    );
                }
            }
        }
        self.gates_told.borrow_mut().retain(|key, _| current.contains(key));
    }

    /// At start, before the subscriptions are attached: each unit placed on this node told its
    /// topic's gate, so that what its subscriptions held before the restart is held again. A
    /// unit that is not served (quarantined, or a replica not leading) is passed over: it
    /// serves no subscription now, and the pass tells it once it does.
    pub(super) async fn recover_gates(&self) {
        let topics: Vec<TopicId> = self.state.borrow().source_gates.keys().copied().collect();
        for topic_id in topics {
            for unit in self.units_of(topic_id).into_iter().filter(|unit| unit.shard.node() == self.node_id())
            {
                if let Err(error) = self.tell_gate(topic_id, &unit).await {
                    crate::log_warn!(
                        "ringpostd: telling source {} of topic {topic_id:x} its gate at start: {}",
                        unit.source.get(),
                        Status::from(error)
                    );
                }
            }
        }
    }

    /// Refuses a change of topic `topic`'s active count while an ordered subscription has not
    /// passed the last one: one change at a time.
    pub(super) fn check_gate_passed(&self, topic: &TopicRecord) -> Result<(), ControlError> {
        let state = self.state.borrow();
        let Some(waiting) = state.gated_subscriptions(topic.id).next() else { return Ok(()) };
        let gate = state.source_gate(topic.id);
        Err(ControlError::failed_precondition(format!(
            "topic '{}' changed its sources from {} to {} and ordered subscription '{}' has not passed \
             that change yet (its acknowledgements on the sources that lost keys have not reached the \
             change): one change at a time; try again once it has",
            topic.name,
            gate.before,
            state.active_sources(topic.id),
            waiting.name
        )))
    }

    /// Whether topic `name`'s next change waits for an ordered subscription to pass the last:
    /// the load-following loop then skips it until a later round, saying so only in debug.
    pub(super) fn gate_waits(&self, name: &str) -> bool {
        let Ok(topic) = self.topic_record(name) else { return false };
        let waiting =
            self.state.borrow().gated_subscriptions(topic.id).next().map(|record| record.name.clone());
        if let Some(waiting) = &waiting {
            crate::log_debug!(
                "ringpostd: topic '{name}' keeps its sources while '{waiting}' passes their last change"
            );
        }
        waiting.is_some()
    }

    /// The topics whose sources the pass tells: those of several sources, and those with an
    /// ordered subscription that has not passed the last change (a topic back to one source).
    pub(super) fn topics_to_pass(&self) -> BTreeSet<TopicId> {
        let state = self.state.borrow();
        let mut topics: BTreeSet<TopicId> = state.sources.keys().map(|(topic_id, _)| *topic_id).collect();
        if !state.source_gates.is_empty() {
            topics.extend(
                state
                    .subscriptions
                    .values()
                    .filter(|record| !record.detached && !state.passed_sources(record))
                    .map(|record| record.topic_id),
            );
        }
        topics
    }

    /// In the catalog leader's pass, with each unit's `answers`: commits the pass of each
    /// subscription of topic `topic_id` that passed its last change, then tells every unit, so
    /// that they release what they held for it.
    pub(super) async fn commit_passes(&self, topic_id: TopicId, answers: &[Answer]) {
        let (gate, after, waiting) = {
            let state = self.state.borrow();
            let waiting: Vec<(u64, String)> = state
                .gated_subscriptions(topic_id)
                .map(|record| (record.id, record.name.to_string()))
                .collect();
            (state.source_gate(topic_id), state.active_sources(topic_id), waiting)
        };
        let units = self.units_of(topic_id);
        let numbers: Vec<u32> = units.iter().map(|unit| unit.source.get()).collect();
        let mut committed = false;
        for (id, name) in waiting {
            if !passed(id, gate.before, after, &numbers, answers) {
                continue;
            }
            let entry = CatalogEntry::SourcesPassed { id, name, generation: gate.generation };
            match self.propose(entry).await {
                Ok(_) => committed = true,
                Err(error) => {
                    crate::log_warn!(
                        "ringpostd: a subscription passing topic {topic_id:x}'s source change: {error}"
                    );
                    return;
                }
            }
        }
        if !committed {
            return;
        }
        for unit in units {
            if let Err(error) = self.tell_gate(topic_id, &unit).await {
                crate::log_warn!(
                    "ringpostd: telling source {} of topic {topic_id:x} its gate: {}",
                    unit.source.get(),
                    Status::from(error)
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_addition_looks_at_the_sources_before_and_a_retirement_at_the_retired() {
        assert_eq!(losing_sources(1, 2), 0..1);
        assert_eq!(losing_sources(3, 4), 0..3);
        assert_eq!(losing_sources(3, 2), 2..3);
        assert_eq!(losing_sources(2, 2), 2..2, "no change, nothing to wait for");
    }

    /// Subscription 7 passes an addition 2 -> 3 once its floors on sources 0 and 1 reach their
    /// fences, whatever its floor on source 2, where the gate holds moved keys; a source that
    /// did not answer keeps it waiting, one deleted (retired out) does not.
    #[test]
    fn a_subscription_passes_once_its_floors_reach_the_losing_sources_fences() {
        let units = [0, 1, 2];
        let answers = |floor_on_1: u64| -> Vec<Answer> {
            vec![(0, 10, vec![(7, 10), (8, 0)]), (1, 20, vec![(7, floor_on_1)]), (2, 0, vec![(7, 0)])]
        };
        assert!(!passed(7, 2, 3, &units, &answers(19)));
        assert!(passed(7, 2, 3, &units, &answers(20)));
        assert!(!passed(8, 2, 3, &units, &answers(20)), "8 is behind on source 0, and not on 1");
        let missing: Vec<Answer> = answers(20).into_iter().filter(|(source, _, _)| *source != 1).collect();
        assert!(!passed(7, 2, 3, &units, &missing), "source 1 did not answer");
        assert!(passed(7, 2, 1, &[0], &[(0, 5, vec![(7, 0)])]), "source 1, retired, was deleted");
        assert!(!passed(7, 2, 1, &[0, 1], &[(0, 5, vec![(7, 0)]), (1, 5, vec![(7, 4)])]));
    }
}

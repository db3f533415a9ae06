//! A source's part in its topic's key map (docs/SOURCES.md, "Key order across a change of the
//! source set"): the topic's *active count*, the sources numbered below it taking publishes
//! and those at or above it retiring, and the assigned end of its log when it last changed
//! (`fence`). A source checks every ordered message's key itself, so that at any moment one
//! source takes a key, and no publish needs a stamp.

use super::TopicState;
use crate::api::data::{DataError, PublishBatch, ResourceKind};
use crate::storage::Storage;
use crate::subscription::state::KeyGate;
use ringpost_model::sources::source_of_key;

/// Whether source `source` of a topic whose key map counts `active` sources takes a publish
/// whose messages carry ordering keys `keys` (empty for an unordered message). `active` 0 is a
/// source attached by a router that did not say the count (before the key map): it takes
/// everything, as every source did then. A retiring source (`source >= active`) takes nothing;
/// an active one, every unordered message and the ordered ones whose key maps to it.
pub fn takes<'a>(source: u32, active: u32, mut keys: impl Iterator<Item = &'a [u8]>) -> bool {
    if active == 0 {
        return true;
    }
    if source >= active {
        return false;
    }
    // A topic of one source maps every key to it: nothing to hash.
    active == 1 || keys.all(|key| key.is_empty() || source_of_key(key, active) == source)
}

/// A source's view of its topic's key map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SourceSet {
    /// The topic's active count as this source last applied it (0: never told).
    pub active: u32,
    /// The log's assigned end (`Log::next_offset`) when the count last changed: every message
    /// this source accepted under the count before has an offset below it, every one accepted
    /// under this count one at or above it, because the key check and the offset's assignment
    /// are made in one step of the shard (`Forwarder::publish`).
    pub fence: u64,
}

/// The delivery gate as a source was last told it (`ControlRequest::GateSources`): the gate of
/// the topic's last change of its count, and the subscriptions that passed it (by id). Kept on
/// the source so that a subscription attached later is held from its attach on.
#[derive(Debug, Default)]
pub struct UnitGate {
    pub generation: u64,
    pub gate: Option<KeyGate>,
    pub passed: std::collections::HashSet<u64>,
}

impl<S: Storage> TopicState<S> {
    /// Applies the delivery gate of the topic's change `generation`, from `before` sources to
    /// `after`, that the subscriptions `passed` passed: each ordered one that did not holds the
    /// keys that moved to this source, the others release what they held (their waiting pulls
    /// and streams woken). A gate older than the one applied changes nothing; the same one
    /// told again adds its passed to those told before (a subscription passes a change once and
    /// for good, and a router whose catalog lags may tell fewer).
    pub fn apply_gate(&self, generation: u64, before: u32, after: u32, passed: Vec<u64>) {
        let mut unit = self.gate.borrow_mut();
        let unit = unit.get_or_insert_with(Box::default);
        if generation < unit.generation {
            return;
        }
        let mut passed: std::collections::HashSet<u64> = passed.into_iter().collect();
        if generation == unit.generation {
            passed.extend(unit.passed.iter().copied());
        }
        let gate = KeyGate { source: self.source.get(), before, after };
        **unit = UnitGate { generation, gate: Some(gate), passed };
        for entry in self.subscriptions.borrow().iter() {
            let held = unit.gate_of(entry.id.get());
            if entry.state.borrow_mut().set_gate(held) {
                entry.changed.notify_all();
            }
        }
    }
}

impl<S: Storage> TopicState<S> {
    /// The gate subscription `id` holds on this source, if any (`UnitGate::gate_of`).
    pub fn gate_of(&self, id: u64) -> Option<KeyGate> {
        self.gate.borrow().as_ref().and_then(|unit| unit.gate_of(id))
    }
}

impl UnitGate {
    /// The gate subscription `id` holds, if it has not passed the change (its state holds
    /// nothing unless it is ordered).
    pub fn gate_of(&self, id: u64) -> Option<KeyGate> {
        self.gate.filter(|_| !self.passed.contains(&id))
    }
}

impl<S: Storage> TopicState<S> {
    /// Refuses a publish this source does not take under its active count (`takes`), with
    /// `NotOwner`: the publisher looks the topic's sources up again and resends. Made right
    /// before the messages are staged in the log, with no wait between, so that a change of
    /// the count splits this source's offsets at its `fence`.
    pub fn check_key_owner(&self, messages: &impl PublishBatch) -> Result<(), DataError> {
        let active = self.sources.get().active;
        let source = self.source.get();
        if active == 0 || (active == 1 && source == 0) {
            return Ok(());
        }
        let mut taken = true;
        messages.visit(&mut |_, views| {
            taken = takes(source, active, views.map(|view| view.ordering_key.as_bytes()));
        })?;
        if taken {
            Ok(())
        } else {
            Err(DataError::NotOwner { kind: ResourceKind::Topic, name: self.name.as_ref().into() })
        }
    }

    /// Applies the topic's active count `active`: when it changes, the log's assigned end
    /// becomes the fence of the change, and this source's share of the topic's outstanding
    /// limits follows the count (`OutstandingLimits::per_source`, as its publish rate's share
    /// is taken at each publish). Returns the fence of the count now applied (the same count
    /// applied again changes nothing).
    pub fn apply_active_sources(&self, active: u32) -> u64 {
        self.outstanding.set_active_sources(active);
        let mut set = self.sources.get();
        if set.active != active {
            set = SourceSet { active, fence: self.log.next_offset().get() };
            self.sources.set(set);
        }
        set.fence
    }

    /// A promoted replica's fence: `end`, its messages log's assigned end as its epoch begins,
    /// under the count it knew as a follower (told at attach, at each change, and right before
    /// its promotion). The fence a follower recorded is its own log's end when the count came,
    /// which may be below messages its leader accepted under the count before and replicated
    /// after; so it is taken anew. Every message a leader before accepted under any earlier
    /// count and acknowledged is committed, so on a quorum, so in this replica's log (elected
    /// the most up-to-date of a quorum), below `end`; one it holds unacknowledged is below
    /// `end` too, and one it lacks was never acknowledged (its publisher resends it, to the
    /// source its new lookup names). From here on this leader checks every publish itself, so
    /// what it accepts is under its count: what `ApplySources` answers after the promotion
    /// splits the source's offsets as rule 1 says, for a retiring source's deletion. A later
    /// fence only makes the deletion wait longer; one above `end` (a follower's, over records
    /// the fencing round cut) would make it wait for ever on a source taking nothing.
    pub fn fence_at_promotion(&self, end: u64) {
        let active = self.sources.get().active;
        self.sources.set(SourceSet { active, fence: end });
    }

    /// Each subscription's ack floor on this source, by id: every offset below it is
    /// acknowledged (or dead-lettered, or before its sync point).
    pub fn ack_floors(&self) -> Vec<(u64, u64)> {
        self.subscriptions
            .borrow()
            .iter()
            .map(|entry| (entry.id.get(), entry.state.borrow().ack_floor().get()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(source: u32, active: u32) -> Vec<u8> {
        (0u32..)
            .map(|n| format!("key-{n}").into_bytes())
            .find(|key| source_of_key(key, active) == source)
            .expect("some key maps to every source")
    }

    #[test]
    fn a_source_takes_its_keys_and_unordered_messages_only() {
        let (zero, one) = (key_of(0, 2), key_of(1, 2));
        assert!(takes(0, 2, [zero.as_slice()].into_iter()));
        assert!(!takes(0, 2, [one.as_slice()].into_iter()));
        assert!(takes(1, 2, [one.as_slice(), b"".as_slice()].into_iter()));
        // One message of another source's key refuses the whole request.
        assert!(!takes(1, 2, [one.as_slice(), zero.as_slice()].into_iter()));
        assert!(takes(0, 2, [b"".as_slice()].into_iter()));
    }

    #[test]
    fn a_retiring_source_takes_nothing_and_an_untold_one_everything() {
        assert!(!takes(2, 2, [b"".as_slice()].into_iter()));
        assert!(!takes(1, 1, std::iter::empty()));
        assert!(takes(1, 0, [key_of(0, 2).as_slice()].into_iter()));
        assert!(takes(0, 1, [b"any".as_slice()].into_iter()));
    }
}

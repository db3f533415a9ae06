//! Following the load: whether a topic whose sources follow its load (`--sources auto`) should
//! get one more source, retire one, or keep what it has. `decide` is the whole decision, without
//! I/O: the topic's bounds, its sources' recent rates, and what it remembers of the topic
//! (`FollowState`) in; a `Decision` out. The catalog's leader runs it every
//! `SOURCE_FOLLOW_INTERVAL` for every such topic (`Router::follow_load`).
//!
//! The load is counted in *sources' worth*: the topic's messages a second over the add
//! threshold's, or its bytes a second over that threshold's, whichever is more. A topic of `n`
//! sources runs hot when its load exceeds `n` (its sources average above the threshold), and
//! cold when it is under `retire_fraction` of `n - 1` (one source fewer would still average
//! under that fraction of the threshold): between the two nothing changes, which is the
//! hysteresis, and the hold (`FollowThresholds::hold`) keeps a change from following another
//! within it and asks that a topic run hot (or cold) that long before one.

use super::sources::Unit;
use super::*;
use crate::catalog::SourceBounds;
use std::time::{Duration, Instant};

/// How often the catalog's leader reads the followed topics' rates and decides: a rate is
/// measured over this, so a change comes at the earliest this after the load changed, plus
/// the hold.
pub const SOURCE_FOLLOW_INTERVAL: Duration = Duration::from_secs(2);

/// The most sources `auto` ever asks for, whatever placement could give: each source is a log
/// on a shard of its own, and a topic followed past the cores of a large cluster would take a
/// shard from every other topic.
pub const SOURCES_AUTO_MAX: u32 = 64;
/// The fewest sources of a followed topic unless asked for more: one, as a topic was before.
pub const SOURCES_AUTO_MIN: u32 = 1;

/// Messages a second per source above which a followed topic gets one more source, unless
/// `--source-add-messages-per-second` says otherwise: a fifth of what one shard took in W1
/// here (1.5 M msgs/s of 1 KiB), so the topic spreads well before its core is full.
pub const SOURCE_ADD_MESSAGES_PER_SECOND_DEFAULT: u64 = 300_000;
/// Bytes a second per source above which a followed topic gets one more source, unless
/// `--source-add-kib-per-second` says otherwise: a fifth of what one shard's disks took
/// (about 1.3 GB/s of direct writes here).
pub const SOURCE_ADD_BYTES_PER_SECOND_DEFAULT: u64 = 256 << 20;
/// Percent of the add thresholds under which the sources, one fewer, would still run before
/// one is retired (`--source-retire-percent`): well under the add threshold, so that a topic
/// at the threshold neither grows nor shrinks.
pub const SOURCE_RETIRE_PERCENT_DEFAULT: u32 = 30;
/// How long a followed topic must run hot (or cold) before a source is added (or retired),
/// and the least time between two changes of its count (`--source-hold-seconds`).
pub const SOURCE_HOLD_SECONDS_DEFAULT: u64 = 30;
/// The longest hold `--source-hold-seconds` takes: a day; a longer one is no following.
pub const SOURCE_HOLD_SECONDS_MAX: u64 = 86_400;

/// When the catalog's leader adds and retires a followed topic's sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowThresholds {
    /// Messages a second per source above which a source is added; 0: messages do not count.
    pub add_messages_per_second: u64,
    /// Bytes a second per source above which a source is added; 0: bytes do not count.
    pub add_bytes_per_second: u64,
    /// Percent of the add thresholds (below 100) the sources, one fewer, must stay under for
    /// one to be retired.
    pub retire_percent: u32,
    pub hold: Duration,
}

impl Default for FollowThresholds {
    fn default() -> FollowThresholds {
        FollowThresholds {
            add_messages_per_second: SOURCE_ADD_MESSAGES_PER_SECOND_DEFAULT,
            add_bytes_per_second: SOURCE_ADD_BYTES_PER_SECOND_DEFAULT,
            retire_percent: SOURCE_RETIRE_PERCENT_DEFAULT,
            hold: Duration::from_secs(SOURCE_HOLD_SECONDS_DEFAULT),
        }
    }
}

/// One source's publishes, as measured over the last interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SourceRate {
    pub messages_per_second: u64,
    pub bytes_per_second: u64,
}

/// What the leader remembers of a followed topic between two decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FollowState {
    /// When its count last changed (as this leader decided it).
    pub changed: Option<Instant>,
    /// Since when it has run hot, or cold, without a break; `None` while it does not.
    pub hot_since: Option<Instant>,
    pub cold_since: Option<Instant>,
    /// The last decision other than `Keep`, for the stats.
    pub last: Option<Decision>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// One more source.
    Add,
    /// One source fewer: the highest.
    Retire,
    Keep,
}

impl Decision {
    pub fn name(self) -> &'static str {
        match self {
            Decision::Add => "add",
            Decision::Retire => "retire",
            Decision::Keep => "keep",
        }
    }
}

/// The load of `rates`, in sources' worth: the most of their messages and their bytes a second
/// over the add thresholds (a threshold of 0 does not count).
fn load(rates: &[SourceRate], thresholds: &FollowThresholds) -> f64 {
    let over =
        |total: u64, threshold: u64| if threshold == 0 { 0.0 } else { total as f64 / threshold as f64 };
    let messages: u64 = rates.iter().map(|rate| rate.messages_per_second).sum();
    let bytes: u64 = rates.iter().map(|rate| rate.bytes_per_second).sum();
    over(messages, thresholds.add_messages_per_second).max(over(bytes, thresholds.add_bytes_per_second))
}

/// Whether topic of `rates.len()` sources (each one's rate) within `bounds` gets one more
/// source, retires one, or keeps them, at `now`; `state` is what the last decisions left and is
/// updated. A count outside the bounds (they were changed) is brought in at once; otherwise a
/// change needs the topic hot (or cold) for the whole hold, and the hold since the last change.
pub fn decide(
    bounds: SourceBounds,
    rates: &[SourceRate],
    thresholds: &FollowThresholds,
    state: &mut FollowState,
    now: Instant,
) -> Decision {
    assert!(bounds.min >= 1 && bounds.min <= bounds.max, "the catalog keeps bounds in order");
    assert!(thresholds.retire_percent < 100, "retiring below adding is the hysteresis");
    let count = rates.len() as u32;
    let decision = if count < bounds.min {
        Decision::Add
    } else if count > bounds.max {
        Decision::Retire
    } else {
        let load = load(rates, thresholds);
        let hot = count < bounds.max && load > count as f64;
        let cold = count > bounds.min && load < thresholds.retire_percent as f64 / 100.0 * (count - 1) as f64;
        let since = |flag: bool, since: Option<Instant>| if flag { Some(since.unwrap_or(now)) } else { None };
        state.hot_since = since(hot, state.hot_since);
        state.cold_since = since(cold, state.cold_since);
        let held =
            |since: Option<Instant>| since.is_some_and(|since| now.duration_since(since) >= thresholds.hold);
        let settled = state.changed.is_none_or(|changed| now.duration_since(changed) >= thresholds.hold);
        match (settled, held(state.hot_since), held(state.cold_since)) {
            (true, true, _) => Decision::Add,
            (true, _, true) => Decision::Retire,
            _ => Decision::Keep,
        }
    };
    if decision != Decision::Keep {
        // The rates measured so far were of the count before: the next change waits for the
        // new count to run hot (or cold) as long.
        *state = FollowState { changed: Some(now), hot_since: None, cold_since: None, last: Some(decision) };
    }
    decision
}

/// A topic whose sources follow its load, for a scrape: its sources now, its bounds, and, on
/// the catalog's leader, its last decision other than keeping them (`None` before one, and on
/// other nodes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowedTopic {
    pub name: String,
    pub sources: u32,
    pub bounds: SourceBounds,
    pub last_decision: Option<Decision>,
}

/// What the catalog's leader keeps of the topics it follows: the thresholds, and each followed
/// topic's last decisions and its units' publish counters when last read, from which the next
/// reading's rates are measured. Forgotten when this node stops leading, or a topic stops being
/// followed.
#[derive(Default)]
pub(super) struct Following {
    pub thresholds: FollowThresholds,
    topics: HashMap<TopicId, Followed>,
}

#[derive(Default)]
struct Followed {
    state: FollowState,
    /// Each unit's messages and bytes published when last read, and when that was.
    counters: HashMap<TopicId, (u64, u64)>,
    read: Option<Instant>,
}

/// The most shards one round of following reads the stats of: every followed topic's units'
/// leaders, once each (a shard answers for every topic it holds).
const FOLLOW_SHARDS_READ_MAX: usize = 4096;

impl<S: Storage> Router<S> {
    /// Sets when a followed topic's sources are added and retired (`--source-add-*`).
    pub fn set_follow_thresholds(&self, thresholds: FollowThresholds) {
        self.following.borrow_mut().thresholds = thresholds;
    }

    /// Every topic whose sources follow its load, in name order, at most `limit`: its sources,
    /// its bounds and (on the catalog's leader) its last decision.
    pub fn followed_topics(&self, limit: usize) -> Vec<FollowedTopic> {
        let following = self.following.borrow();
        let state = self.state.borrow();
        let mut followed: Vec<FollowedTopic> = state
            .source_policies
            .iter()
            .filter_map(|(id, bounds)| {
                Some(FollowedTopic {
                    name: state.topic_by_id(*id)?.name.to_string(),
                    sources: state.source_count(*id) as u32,
                    bounds: *bounds,
                    last_decision: following.topics.get(id).and_then(|followed| followed.state.last),
                })
            })
            .collect();
        followed.sort_by(|a, b| a.name.cmp(&b.name));
        followed.truncate(limit);
        followed
    }

    /// One round of following the load, on the catalog's leader: reads every followed topic's
    /// units' publish counters from their shards' stats (as `ringpost stats` does), measures
    /// each unit's rate since the last round, decides, and adds a source where it decided so,
    /// through the path `topic update --sources` takes, or retires its highest where it decided
    /// that (`retire_source`).
    pub async fn follow_load(&self) {
        if !self.catalog.leads() {
            self.following.borrow_mut().topics.clear();
            return;
        }
        let followed: Vec<(TopicRecord, SourceBounds, Vec<Unit>)> = {
            let state = self.state.borrow();
            state
                .source_policies
                .iter()
                .filter_map(|(id, bounds)| Some((state.topic_by_id(*id)?.clone(), *bounds)))
                .collect::<Vec<_>>()
        }
        .into_iter()
        .map(|(topic, bounds)| {
            // A retiring source takes no publish: it counts neither in the load nor in the
            // sources the load is spread over.
            let active = self.state.borrow().active_sources(topic.id);
            let mut units = self.units_of(topic.id);
            units.retain(|unit| unit.source.get() < active);
            (topic, bounds, units)
        })
        .collect();
        self.following
            .borrow_mut()
            .topics
            .retain(|id, _| followed.iter().any(|(topic, _, _)| topic.id == *id));
        if followed.is_empty() {
            return;
        }
        let counters = self.read_counters(&followed).await;
        let now = crate::runtime::now();
        for (topic, bounds, units) in followed {
            let decision = {
                let mut following = self.following.borrow_mut();
                let thresholds = following.thresholds;
                let entry = following.topics.entry(topic.id).or_default();
                match measure(entry, &topic.name, &units, &counters, now) {
                    Some(rates) => decide(bounds, &rates, &thresholds, &mut entry.state, now),
                    None => Decision::Keep,
                }
            };
            match decision {
                Decision::Keep => {}
                Decision::Add => self.follow_add(&topic.name).await,
                Decision::Retire => self.follow_retire(&topic.name).await,
            }
        }
    }

    /// The publish counters of every unit of `followed`, by (leader's shard, topic name): a
    /// shard holds one unit of a topic. A shard that does not answer is left out, and so are
    /// its units' topics this round.
    async fn read_counters(
        &self,
        followed: &[(TopicRecord, SourceBounds, Vec<Unit>)],
    ) -> HashMap<(ShardId, String), (u64, u64)> {
        let shards: std::collections::BTreeSet<ShardId> =
            followed.iter().flat_map(|(_, _, units)| units.iter().map(|unit| unit.shard)).collect();
        let mut counters = HashMap::new();
        for shard in shards.into_iter().take(FOLLOW_SHARDS_READ_MAX) {
            match self.call_forwarder(shard, ControlRequest::Stats).await {
                Ok(ControlOk::Stats(_, topics)) => {
                    for topic in topics {
                        counters.insert(
                            (shard, topic.name),
                            (topic.published_messages_total, topic.published_bytes_total),
                        );
                    }
                }
                Ok(_) => {}
                Err(error) => {
                    crate::log_debug!("ringpostd: following the load: shard {shard}'s stats: {error}")
                }
            }
        }
        counters
    }

    /// Adds one source to followed topic `name`, as `topic update --sources` would (under the
    /// update gate, the count checked against placement), unless it stopped being followed
    /// meanwhile or already has its maximum.
    async fn follow_add(&self, name: &str) {
        if self.gate_waits(name) {
            return;
        }
        let added = async {
            let _update = self.update_permit().await?;
            let topic = self.topic_record(name)?;
            let (have, bounds) = {
                let state = self.state.borrow();
                (state.source_count(topic.id) as u32, state.source_policies.get(&topic.id).copied())
            };
            match bounds {
                Some(bounds) if have < bounds.max => {
                    self.set_source_count(&topic, have + 1).await.map(|_| have + 1)
                }
                _ => Ok(have),
            }
        }
        .await;
        match added {
            Ok(count) => crate::log_info!("ringpostd: topic '{name}' runs hot: {count} sources now"),
            Err(error) => {
                crate::log_warn!("ringpostd: topic '{name}' runs hot, but no source was added: {error}")
            }
        }
    }

    /// Retires followed topic `name`'s highest active source (`retire_source`), unless it
    /// stopped being followed meanwhile or is at its minimum.
    async fn follow_retire(&self, name: &str) {
        if self.gate_waits(name) {
            return;
        }
        let above_min = self.topic_record(name).ok().is_some_and(|topic| {
            let state = self.state.borrow();
            let bounds = state.source_policies.get(&topic.id).copied();
            bounds.is_some_and(|bounds| state.active_sources(topic.id) > bounds.min)
        });
        if !above_min {
            return;
        }
        match self.retire_source(name).await {
            Ok(()) => crate::log_info!("ringpostd: topic '{name}' runs cold: its highest source retires"),
            Err(error) => {
                crate::log_warn!("ringpostd: topic '{name}' runs cold, but no source was retired: {error}")
            }
        }
    }

    /// Makes topic `topic`'s sources follow its load within `bounds` (a `max` of 0: as many as
    /// placement can give now, at most `SOURCES_AUTO_MAX`), adding sources up to `min` first.
    /// The caller holds the update gate.
    pub(super) async fn follow_sources(
        &self,
        topic: &TopicRecord,
        bounds: SourceBounds,
    ) -> Result<(), ControlError> {
        let replicas = topic.replica_count();
        let placeable = (self.source_shards() / replicas.max(1)).max(1) as u32;
        let max = if bounds.max == 0 { SOURCES_AUTO_MAX.min(placeable).max(bounds.min) } else { bounds.max };
        let bounds = SourceBounds { min: bounds.min, max };
        if bounds.min == 0 || bounds.min > bounds.max || bounds.max > SOURCES_AUTO_MAX {
            return Err(ControlError::invalid_argument(format!(
                "sources from {} to {}: following the load takes from 1 to {SOURCES_AUTO_MAX} \
                 (SOURCES_AUTO_MAX), the least first",
                bounds.min, bounds.max
            )));
        }
        // Into the bounds at once: sources added up to the minimum, the highest retired down to
        // the maximum.
        let active = self.state.borrow().active_sources(topic.id);
        self.set_source_count(topic, active.clamp(bounds.min, bounds.max)).await?;
        self.propose(CatalogEntry::SourcePolicySet { topic_id: topic.id, bounds: Some(bounds) }).await?;
        Ok(())
    }
}

/// Each of followed topic `name`'s units' rates since the last reading, keeping the counters
/// for the next; `None` on the first reading, or when a unit's counters were not read (its
/// shard did not answer, the unit is not attached yet), which starts the measure again. A unit
/// added since the last reading counts from 0, where its counters started.
fn measure(
    followed: &mut Followed,
    name: &str,
    units: &[Unit],
    counters: &HashMap<(ShardId, String), (u64, u64)>,
    now: Instant,
) -> Option<Vec<SourceRate>> {
    let read: Option<HashMap<TopicId, (u64, u64)>> = units
        .iter()
        .map(|unit| counters.get(&(unit.shard, name.to_owned())).map(|counter| (unit.id, *counter)))
        .collect();
    let before = std::mem::take(&mut followed.counters);
    let then = followed.read.take();
    followed.counters = read?;
    followed.read = Some(now);
    let seconds = now.duration_since(then?).as_secs_f64();
    if seconds <= 0.0 {
        return None;
    }
    let per_second = |now: u64, then: u64| (now.saturating_sub(then) as f64 / seconds).round() as u64;
    let rates = units
        .iter()
        .map(|unit| {
            let (messages, bytes) = followed.counters[&unit.id];
            let (messages_before, bytes_before) = before.get(&unit.id).copied().unwrap_or((0, 0));
            SourceRate {
                messages_per_second: per_second(messages, messages_before),
                bytes_per_second: per_second(bytes, bytes_before),
            }
        })
        .collect();
    Some(rates)
}

#[cfg(test)]
mod tests {
    use super::*;

    const THRESHOLDS: FollowThresholds = FollowThresholds {
        add_messages_per_second: 1000,
        add_bytes_per_second: 1 << 20,
        retire_percent: 30,
        hold: Duration::from_secs(30),
    };

    fn messages(per_source: &[u64]) -> Vec<SourceRate> {
        per_source.iter().map(|rate| SourceRate { messages_per_second: *rate, bytes_per_second: 0 }).collect()
    }

    /// Runs `decide` every `step` from `start` for `steps` steps with the same rates, and returns
    /// the decisions.
    fn run(
        bounds: SourceBounds,
        rates: &[SourceRate],
        state: &mut FollowState,
        start: Instant,
        steps: u64,
    ) -> Vec<Decision> {
        (0..steps)
            .map(|step| decide(bounds, rates, &THRESHOLDS, state, start + Duration::from_secs(step * 2)))
            .collect()
    }

    const AUTO: SourceBounds = SourceBounds { min: 1, max: 4 };

    #[test]
    fn a_hot_topic_gets_a_source_once_it_ran_hot_for_the_hold_and_not_again_within_it() {
        let start = crate::runtime::now();
        let mut state = FollowState::default();
        // Two sources averaging 1,500 a second, over the 1,000 threshold: added after 30 s hot.
        let decisions = run(AUTO, &messages(&[1500, 1500]), &mut state, start, 16);
        assert_eq!(decisions[..15], [Decision::Keep; 15]);
        assert_eq!(decisions[15], Decision::Add, "hot since 0 s, held at 30 s");
        assert_eq!(state.last, Some(Decision::Add));
        // Three sources of the same load now average 1,000: neither hot nor cold.
        let later = start + Duration::from_secs(32);
        assert!(run(AUTO, &messages(&[1000, 1000, 1000]), &mut state, later, 100)
            .iter()
            .all(|d| *d == Decision::Keep));
    }

    #[test]
    fn a_break_in_the_heat_starts_the_hold_again() {
        let start = crate::runtime::now();
        let mut state = FollowState::default();
        let hot = messages(&[2500]);
        assert!(run(AUTO, &hot, &mut state, start, 10).iter().all(|d| *d == Decision::Keep));
        // One interval at the threshold: no longer hot.
        assert_eq!(
            decide(AUTO, &messages(&[900]), &THRESHOLDS, &mut state, start + Duration::from_secs(20)),
            Decision::Keep
        );
        let again = start + Duration::from_secs(22);
        let decisions = run(AUTO, &hot, &mut state, again, 16);
        assert_eq!(decisions.iter().position(|d| *d == Decision::Add), Some(15), "30 s from the break");
    }

    #[test]
    fn between_the_thresholds_nothing_changes() {
        let start = crate::runtime::now();
        // Three sources: hot above 3,000 in all, cold below 0.3 * 2 * 1,000 = 600 in all.
        for total in [600, 1000, 2000, 3000] {
            let mut state = FollowState::default();
            let third = total / 3;
            let rates = messages(&[total - 2 * third, third, third]);
            assert!(
                run(AUTO, &rates, &mut state, start, 100).iter().all(|d| *d == Decision::Keep),
                "{total}"
            );
        }
        let mut state = FollowState::default();
        assert_eq!(run(AUTO, &messages(&[3003, 0, 0]), &mut state, start, 16)[15], Decision::Add);
        let mut state = FollowState::default();
        assert_eq!(run(AUTO, &messages(&[590, 0, 0]), &mut state, start, 16)[15], Decision::Retire);
    }

    #[test]
    fn an_idle_topic_retires_down_to_its_minimum_and_no_further() {
        let start = crate::runtime::now();
        let bounds = SourceBounds { min: 2, max: 4 };
        let mut state = FollowState::default();
        assert_eq!(run(bounds, &messages(&[0, 0, 0]), &mut state, start, 16)[15], Decision::Retire);
        let later = start + Duration::from_secs(32);
        assert!(run(bounds, &messages(&[0, 0]), &mut state, later, 100).iter().all(|d| *d == Decision::Keep));
        assert_eq!(state.cold_since, None, "at its minimum an idle topic is not cold");
    }

    #[test]
    fn the_bounds_hold_whatever_the_load() {
        let start = crate::runtime::now();
        let bounds = SourceBounds { min: 2, max: 3 };
        let mut state = FollowState::default();
        // At its maximum, however hot: nothing more.
        assert!(run(bounds, &messages(&[90_000; 3]), &mut state, start, 100)
            .iter()
            .all(|d| *d == Decision::Keep));
        // Outside its bounds (they were changed), at once and whatever the load, one at a time.
        let mut state = FollowState { changed: Some(start), ..FollowState::default() };
        assert_eq!(decide(bounds, &messages(&[90_000]), &THRESHOLDS, &mut state, start), Decision::Add);
        assert_eq!(decide(bounds, &messages(&[0; 5]), &THRESHOLDS, &mut state, start), Decision::Retire);
    }

    #[test]
    fn one_hot_source_among_idle_ones_counts_for_the_topic_as_a_whole() {
        let start = crate::runtime::now();
        // One source at 2.5 times the threshold beside three idle ones: the topic's four average
        // under it. A source more would not cool a hot key's source, and the publishers that
        // spread their requests spread them over the sources the topic has.
        let mut state = FollowState::default();
        let one_hot = messages(&[2500, 0, 0, 0]);
        let bounds = SourceBounds { min: 1, max: 8 };
        assert!(run(bounds, &one_hot, &mut state, start, 100).iter().all(|d| *d == Decision::Keep));
        // Hot enough for the four: one more.
        let mut state = FollowState::default();
        assert_eq!(run(bounds, &messages(&[4100, 0, 0, 0]), &mut state, start, 16)[15], Decision::Add);
    }

    #[test]
    fn bytes_count_as_messages_do_and_a_threshold_of_zero_does_not_count() {
        let start = crate::runtime::now();
        let heavy = [SourceRate { messages_per_second: 10, bytes_per_second: 3 << 20 }];
        let mut state = FollowState::default();
        assert_eq!(run(AUTO, &heavy, &mut state, start, 16)[15], Decision::Add);
        let messages_only = FollowThresholds { add_bytes_per_second: 0, ..THRESHOLDS };
        let mut state = FollowState::default();
        let decisions: Vec<Decision> = (0..100)
            .map(|step| decide(AUTO, &heavy, &messages_only, &mut state, start + Duration::from_secs(step)))
            .collect();
        assert!(decisions.iter().all(|d| *d == Decision::Keep));
    }
}

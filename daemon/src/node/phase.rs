//! What a node is doing while it starts, for whoever asks before it serves: the monitoring
//! endpoint's `/readyz` (503 with it) and a client of the router's port (`Unavailable` with it).
//! The router shard sets it as its start moves on; the endpoint's thread reads it, so it is the
//! one value of the node shared across threads, behind a lock taken only at those moments.

use std::sync::{Arc, Mutex};

/// The start's current step, or `None` once every shard serves.
#[derive(Clone, Debug)]
pub struct StartPhase(Arc<Mutex<Option<String>>>);

impl Default for StartPhase {
    fn default() -> StartPhase {
        StartPhase(Arc::new(Mutex::new(Some("starting its shards".to_owned()))))
    }
}

impl StartPhase {
    /// The start moved on to `step` (said as what the node is doing: "recovering topics").
    pub fn set(&self, step: impl Into<String>) {
        let step = step.into();
        let mut current = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if current.as_deref() != Some(step.as_str()) {
            crate::log_debug!("ringpostd: start: {step}");
            *current = Some(step);
        }
    }

    /// Every shard serves: the start is over.
    pub fn finish(&self) {
        *self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
    }

    /// What the start is doing, or `None` once it is over.
    pub fn current(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_is_shared_until_the_start_finishes() {
        let phase = StartPhase::default();
        let seen = phase.clone();
        assert_eq!(seen.current().as_deref(), Some("starting its shards"));
        phase.set("recovering topics");
        assert_eq!(seen.current().as_deref(), Some("recovering topics"));
        phase.finish();
        assert_eq!(seen.current(), None);
    }
}

//! The start line of a run: threads connect, then wait here until all of them are ready, so
//! that publishing starts at the same moment for all of them and subscribers are attached
//! before the first message.
//!
//! A `std::sync::Barrier` needs its party count up front, and a thread that failed to spawn
//! would leave the others waiting forever; here the coordinator waits for as many threads as it
//! managed to start, then opens the gate.

use std::sync::{Condvar, Mutex};

#[derive(Default)]
pub struct StartGate {
    /// Threads arrived, and whether the gate is open.
    state: Mutex<(usize, bool)>,
    changed: Condvar,
}

impl StartGate {
    pub fn new() -> StartGate {
        StartGate::default()
    }

    /// Called by each thread when it is ready: returns once the gate opens.
    pub fn arrive_and_wait(&self) {
        let mut state = self.state.lock().unwrap();
        state.0 += 1;
        self.changed.notify_all();
        while !state.1 {
            state = self.changed.wait(state).unwrap();
        }
    }

    /// Called by the coordinator: waits until `threads` threads arrived, then lets them all go.
    pub fn open_when_arrived(&self, threads: usize) {
        let mut state = self.state.lock().unwrap();
        while state.0 < threads {
            state = self.changed.wait(state).unwrap();
        }
        state.1 = true;
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn threads_pass_only_once_all_arrived() {
        let gate = StartGate::new();
        let passed = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..3 {
                scope.spawn(|| {
                    gate.arrive_and_wait();
                    passed.fetch_add(1, Ordering::SeqCst);
                });
            }
            gate.open_when_arrived(3);
        });
        assert_eq!(passed.load(Ordering::SeqCst), 3);
    }
}

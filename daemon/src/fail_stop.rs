//! Fail-stop: a panic anywhere in the daemon ends the process at once.
//!
//! A shard is a thread. A panic ends that thread and its executor, while the router, the other
//! shards and the monitoring endpoint carry on: the dead shard's topics time out for minutes,
//! `/readyz` says ready, and no supervisor notices. Half a node is worse than none, and a
//! panic means the shard's state broke an assumption, so nothing of it is worth keeping. The
//! panic hook (`install`) logs the panic at ERROR with the thread and the place, then aborts
//! (SIGABRT, with a core dump where the system keeps them). Nothing acknowledged is lost:
//! that is what recovery is for, and a supervisor (systemd's `Restart=on-failure`) starts
//! the daemon again. TigerBeetle and Redpanda stop the same way.
//!
//! A test must be able to make a shard panic in the real binary: `PANIC_AFTER_PUBLISHES_VARIABLE`,
//! read once by `install`, makes the Nth publish of each forwarder shard panic. Nothing else
//! sets it, so it cannot fire in production unless someone sets that variable.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Test hook: the environment variable that, set to N at start, makes the Nth publish of each
/// forwarder shard panic (see `count_publish`). Unset (or 0): off.
pub const PANIC_AFTER_PUBLISHES_VARIABLE: &str = "RINGPOST_TEST_PANIC_AFTER_PUBLISHES";

/// The publish on which a shard panics on purpose; 0 for never. Written once by `install`.
static PANIC_AFTER_PUBLISHES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Publishes this shard (thread) took, counted only while the test hook is on.
    static PUBLISHES: Cell<u64> = const { Cell::new(0) };
}

/// Makes any panic of the process log one ERROR line (thread, place, message), print a
/// backtrace when `RUST_BACKTRACE` asks for one, run `cleanup` (the benchmark removes its
/// scratch data directory), and abort. Reads the test hook's variable; an unreadable value is
/// an error, so that a test that meant to set it does not pass without it.
pub fn install(cleanup: Option<Box<dyn Fn() + Send + Sync>>) -> Result<(), String> {
    let panic_after = match std::env::var(PANIC_AFTER_PUBLISHES_VARIABLE) {
        Ok(text) => text.trim().parse::<u64>().map_err(|error| {
            format!("{PANIC_AFTER_PUBLISHES_VARIABLE}={text}: give a number of publishes ({error})")
        })?,
        Err(_) => 0,
    };
    PANIC_AFTER_PUBLISHES.store(panic_after, Ordering::Relaxed);
    if panic_after != 0 {
        crate::log_warn!(
            "ringpostd: WARNING: test hook {PANIC_AFTER_PUBLISHES_VARIABLE}={panic_after}: publish {panic_after} of each forwarder shard panics and stops the process"
        );
    }
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current();
        let location = info.location().map_or_else(|| "an unknown place".to_owned(), ToString::to_string);
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("a panic without a message");
        crate::log_error!(
            "ringpostd: ERROR: thread '{}' panicked at {location}: {message}; stopping the process (fail-stop: a supervisor starts it again and recovery runs)",
            thread.name().unwrap_or("unnamed")
        );
        let backtrace = std::backtrace::Backtrace::capture();
        if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
            eprintln!("{backtrace}");
        }
        if let Some(cleanup) = &cleanup {
            cleanup();
        }
        std::process::abort();
    }));
    Ok(())
}

/// Counts a publish on this shard; panics on the one the test hook names. A load and a
/// comparison per publish while the hook is off.
pub fn count_publish() {
    let panic_after = PANIC_AFTER_PUBLISHES.load(Ordering::Relaxed);
    if panic_after == 0 {
        return;
    }
    let count = PUBLISHES.with(|publishes| {
        publishes.set(publishes.get() + 1);
        publishes.get()
    });
    if count == panic_after {
        panic!("{PANIC_AFTER_PUBLISHES_VARIABLE}={panic_after}: this shard's publish {count} panics on purpose (a test hook)");
    }
}

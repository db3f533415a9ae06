//! The audit log of refusals: one line on stderr for each denied request and each failed
//! authentication, at most `AUDIT_LINES_PER_SECOND_MAX` a second per shard, so that a client
//! refused in a loop cannot fill the disk or drown the rest of the log. What the limit leaves
//! out is counted and the count is reported in the next line written, so nothing is lost
//! silently.

use std::cell::{Cell, RefCell};
use std::fmt::Write;
use std::time::{Duration, Instant};

/// Audit lines one shard writes a second at most.
pub const AUDIT_LINES_PER_SECOND_MAX: u32 = 10;
/// The window the limit counts lines over.
const AUDIT_WINDOW: Duration = Duration::from_secs(1);

/// Where lines go: stderr in the daemon, a test's buffer in tests.
pub type AuditSink = Box<dyn FnMut(&str)>;

/// One shard's rate-limited audit log.
pub struct Audit {
    sink: RefCell<AuditSink>,
    window_started: Cell<Option<Instant>>,
    lines_in_window: Cell<u32>,
    suppressed: Cell<u64>,
}

impl Audit {
    /// An audit log on stderr.
    pub fn stderr() -> Audit {
        Audit::with_sink(Box::new(|line| crate::log_warn!("{line}")))
    }

    pub fn with_sink(sink: AuditSink) -> Audit {
        Audit {
            sink: RefCell::new(sink),
            window_started: Cell::new(None),
            lines_in_window: Cell::new(0),
            suppressed: Cell::new(0),
        }
    }

    /// Logs `ringpostd: audit: denied <what>` at the runtime's present time.
    pub fn denied(&self, what: std::fmt::Arguments<'_>) {
        self.denied_at(crate::runtime::now(), what);
    }

    /// Logs the refusal if this second's lines are not used up; else counts it. Returns
    /// whether a line was written.
    pub fn denied_at(&self, now: Instant, what: std::fmt::Arguments<'_>) -> bool {
        let window_over =
            self.window_started.get().is_none_or(|started| now.duration_since(started) >= AUDIT_WINDOW);
        if window_over {
            self.window_started.set(Some(now));
            self.lines_in_window.set(0);
        }
        if self.lines_in_window.get() >= AUDIT_LINES_PER_SECOND_MAX {
            self.suppressed.set(self.suppressed.get() + 1);
            return false;
        }
        self.lines_in_window.set(self.lines_in_window.get() + 1);
        let mut line = String::new();
        let _ = write!(line, "ringpostd: audit: denied {what}");
        let suppressed = self.suppressed.replace(0);
        if suppressed > 0 {
            let _ = write!(line, " ({suppressed} more denial(s) not logged since the last line)");
        }
        (self.sink.borrow_mut())(&line);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    fn captured() -> (Audit, Rc<RefCell<Vec<String>>>) {
        let lines = Rc::new(RefCell::new(Vec::new()));
        let sink = lines.clone();
        (Audit::with_sink(Box::new(move |line| sink.borrow_mut().push(line.to_string()))), lines)
    }

    #[test]
    fn at_most_the_limit_is_written_a_second_and_the_rest_is_counted_in_the_next_line() {
        let (audit, lines) = captured();
        let start = Instant::now();
        for index in 0..25 {
            let at = start + Duration::from_millis(index);
            audit.denied_at(at, format_args!("request {index}"));
        }
        assert_eq!(lines.borrow().len(), AUDIT_LINES_PER_SECOND_MAX as usize);
        assert!(lines.borrow().iter().all(|line| line.starts_with("ringpostd: audit: denied request ")));
        assert!(lines.borrow().iter().all(|line| !line.contains("not logged")));

        // Still within the first second: counted, not written.
        assert!(!audit.denied_at(start + Duration::from_millis(999), format_args!("late")));
        assert!(audit.denied_at(start + AUDIT_WINDOW, format_args!("next")));
        assert_eq!(
            lines.borrow().last().unwrap(),
            "ringpostd: audit: denied next (16 more denial(s) not logged since the last line)"
        );
        assert!(audit.denied_at(start + AUDIT_WINDOW, format_args!("again")));
        assert_eq!(lines.borrow().last().unwrap(), "ringpostd: audit: denied again");
    }

    #[test]
    fn a_steady_trickle_below_the_limit_is_written_whole() {
        let (audit, lines) = captured();
        let start = Instant::now();
        for index in 0..100u64 {
            assert!(audit.denied_at(start + Duration::from_millis(150 * index), format_args!("{index}")));
        }
        assert_eq!(lines.borrow().len(), 100);
    }
}

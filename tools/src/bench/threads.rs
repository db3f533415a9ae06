//! CPU time by thread of this process, from `/proc/self/task`: with `--embedded` the daemon's
//! threads are this process's, so a run can say where its CPU went (a forwarder shard, the push
//! client's thread, the receiver) without a profiler beside it.

use std::collections::HashMap;

/// A thread's CPU time (user and system) in clock ticks, by thread id, with its name.
pub type Ticks = HashMap<u32, (String, u64)>;

/// Every live thread's CPU ticks now; empty where `/proc` cannot be read.
pub fn cpu_ticks_by_thread() -> Ticks {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Ticks::new() };
    tasks
        .flatten()
        .filter_map(|task| {
            let id: u32 = task.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
            Some((id, parse_stat(&stat)?))
        })
        .collect()
}

/// A thread's name and its user plus system ticks, from its `stat` line: `pid (name) state
/// ...`, utime and stime the 14th and 15th fields. The name may hold spaces and parentheses, so
/// the fields are counted from its last closing parenthesis.
fn parse_stat(stat: &str) -> Option<(String, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_owned();
    let mut fields = stat.get(close + 1..)?.split_whitespace();
    // After the name: state (field 3) ... utime (14), stime (15).
    let user: u64 = fields.nth(11)?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((name, user + system))
}

/// CPU seconds since `before`, by thread name (threads of one name added), most first: the
/// threads alive now, so those that ended since (a run's publishers) are not counted.
pub fn cpu_seconds_since(before: &Ticks) -> Vec<(String, f64)> {
    // SAFETY: sysconf only reads a configuration value.
    let ticks_per_second = match unsafe { nix::libc::sysconf(nix::libc::_SC_CLK_TCK) } {
        ticks if ticks > 0 => ticks as f64,
        _ => 100.0,
    };
    let mut by_name: HashMap<String, u64> = HashMap::new();
    for (id, (name, ticks)) in cpu_ticks_by_thread() {
        let earlier = before.get(&id).map_or(0, |(_, ticks)| *ticks);
        *by_name.entry(name).or_default() += ticks.saturating_sub(earlier);
    }
    let mut seconds: Vec<(String, f64)> = by_name
        .into_iter()
        .filter(|(_, ticks)| *ticks > 0)
        .map(|(name, ticks)| (name, ticks as f64 / ticks_per_second))
        .collect();
    seconds.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    seconds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_names() {
        let line = "4242 (ringpost-push) S 1 2 3 4 5 6 7 8 9 10 250 31 0 0 20 0 1 0";
        assert_eq!(parse_stat(line), Some(("ringpost-push".to_owned(), 281)));
        let odd = "7 (a (b) c) R 1 2 3 4 5 6 7 8 9 10 3 4 0 0";
        assert_eq!(parse_stat(odd), Some(("a (b) c".to_owned(), 7)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_threads_time_is_counted() {
        let before = cpu_ticks_by_thread();
        assert!(!before.is_empty());
        let started = std::time::Instant::now();
        let mut spin = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(300) {
            spin = spin.wrapping_add(1);
        }
        std::hint::black_box(spin);
        let seconds: f64 = cpu_seconds_since(&before).iter().map(|(_, seconds)| seconds).sum();
        assert!(seconds > 0.05, "{seconds}");
    }
}

//! Named moments at which the process dies on purpose, for crash tests.
//!
//! `JOBCENTER_CRASH_AT=POINT:N` aborts the process the N-th time it reaches
//! `POINT`. The committer has `before-flush` (a batch written, not flushed)
//! and `after-flush` (flushed, nothing acknowledged or dispatched yet); a
//! sled compaction has `compaction-copied` (the new generation durable,
//! `CURRENT` not switched yet) and `compaction-switched` (`CURRENT` names
//! the new generation, the old one not removed yet). An instance of a
//! cluster has `lend-durable` (attempts lent to another instance's workers
//! made durable, the answer that hands them over not sent), and
//! `schedule-claimed` (a schedule's run claimed fresh, its job not
//! submitted yet).

use std::sync::atomic::{AtomicU64, Ordering};

/// The crash point the environment names, if any, and how often it was reached.
pub(crate) struct CrashPoint {
    point: Option<(String, u64)>,
    seen: AtomicU64,
}

impl CrashPoint {
    pub(crate) fn from_env() -> CrashPoint {
        let point = std::env::var("JOBCENTER_CRASH_AT").ok().and_then(|spec| {
            let (name, count) = spec.split_once(':')?;
            Some((name.to_string(), count.parse().ok()?))
        });
        CrashPoint { point, seen: AtomicU64::new(0) }
    }

    /// Aborts the process if this is the moment the environment named.
    pub(crate) fn reached(&self, name: &str) {
        let Some((point, count)) = &self.point else { return };
        if point == name && self.seen.fetch_add(1, Ordering::Relaxed) + 1 >= *count {
            eprintln!("jobcenter: crashing on purpose at {name} ({count})");
            std::process::abort();
        }
    }
}

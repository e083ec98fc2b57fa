//! File descriptors, which every connection takes one of: the server raises
//! its soft limit of open files to the hard limit at start, says in the log
//! and in `/readyz` when the descriptors it holds near the limit, and waits
//! a little after an accept that failed for want of one, rather than spin.
//! The limit is the process's, so what is kept here is too.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Open descriptors, as a share of the limit, from which `/readyz` and the log say so.
const NEAR_PERCENT: u64 = 90;
/// How long `/readyz` says "out of descriptors" after an accept failed for want of one.
const EXHAUSTED_FOR: Duration = Duration::from_secs(10);
/// At most one warning of a failed accept in this long.
const WARN_EVERY: Duration = Duration::from_secs(5);

/// When the process started counting (the base of the instants below).
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn millis_now() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Until when (ms since the epoch) descriptors ran out at the last accept that failed.
static EXHAUSTED_UNTIL: AtomicU64 = AtomicU64::new(0);
/// When (ms since the epoch, plus one) a failed accept was last warned of.
static WARNED_AT: AtomicU64 = AtomicU64::new(0);

/// Raises the soft limit of open files to the hard limit and says which
/// limit holds; `workers` is how many workers the server takes at once,
/// each of which holds a descriptor.
pub(crate) fn raise_limit(workers: usize) {
    epoch();
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return };
    let limit = match soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        true => {
            tracing::info!(from = soft, to = hard, "file descriptors: soft limit raised to the hard limit");
            hard
        }
        false => soft,
    };
    // The store, the listeners and the clients take some beside the workers.
    if limit < workers as u64 + 256 {
        tracing::warn!(
            limit,
            max_workers = workers,
            "file descriptors: the limit of open files is below --max-workers plus 256: the server takes fewer \
             workers than it would otherwise; raise the hard limit (ulimit -Hn, LimitNOFILE=) or lower --max-workers"
        );
    }
}

/// Open descriptors and the soft limit, now; none while none is free to count them with.
pub(crate) fn usage() -> Option<(u64, u64)> {
    let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    let open = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    Some((open, soft))
}

/// The soft limit of open files.
fn limit() -> Option<u64> {
    getrlimit(Resource::RLIMIT_NOFILE).ok().map(|(soft, _)| soft)
}

/// What `/readyz` adds about descriptors: `Err` when an accept failed for
/// want of one lately (not ready), `Ok(Some)` when they near the limit.
pub(crate) fn readiness() -> Result<Option<String>, String> {
    let usage = usage();
    let shown = |(open, limit): (u64, u64)| format!("{open} of {limit} file descriptors open");
    if EXHAUSTED_UNTIL.load(Ordering::Relaxed) > millis_now() {
        let held = usage.map(|u| format!(" ({})", shown(u))).unwrap_or_default();
        return Err(format!(
            "out of file descriptors{held}: new connections wait; raise the limit of open files (ulimit -Hn, \
             LimitNOFILE=) or connect fewer workers"
        ));
    }
    Ok(usage
        .filter(|(open, limit)| open * 100 >= limit * NEAR_PERCENT)
        .map(|u| format!("{}: near the limit; raise it (ulimit -Hn, LimitNOFILE=) or connect fewer workers", shown(u))))
}

/// An accept on `port` failed: says so (at most once in a while) and waits
/// a little, so that a listener out of descriptors does not spin.
pub(crate) async fn accept_failed(error: &io::Error, port: &str) {
    let out = matches!(error.raw_os_error().map(Errno::from_raw), Some(Errno::EMFILE | Errno::ENFILE));
    let now = millis_now();
    if out {
        EXHAUSTED_UNTIL.fetch_max(now + EXHAUSTED_FOR.as_millis() as u64, Ordering::Relaxed);
    }
    let last = WARNED_AT.load(Ordering::Relaxed);
    let due = last == 0 || now + 1 >= last + WARN_EVERY.as_millis() as u64;
    if due && WARNED_AT.compare_exchange(last, now + 1, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
        match out {
            true => tracing::warn!(
                port, error = %error, limit = limit(),
                "cannot accept a connection: out of file descriptors; it waits until one is free \
                 (raise the limit of open files, or connect fewer workers)"
            ),
            false => tracing::warn!(port, error = %error, "cannot accept a connection"),
        }
    }
    tokio::time::sleep(if out { Duration::from_millis(100) } else { Duration::from_millis(10) }).await;
}

/// Warns in the log, every `every`, while the open descriptors near the limit.
pub(crate) async fn watch(every: Duration) {
    let mut near = false;
    loop {
        tokio::time::sleep(every).await;
        let Some((open, limit)) = usage() else { continue };
        let now_near = open * 100 >= limit * NEAR_PERCENT;
        if now_near {
            tracing::warn!(
                open,
                limit,
                "file descriptors near the limit: new connections will wait once it is reached; raise the limit \
                 of open files (ulimit -Hn, LimitNOFILE=) or connect fewer workers"
            );
        } else if near {
            tracing::info!(open, limit, "file descriptors below the limit's warning level again");
        }
        near = now_near;
    }
}

//! Time as the engine sees it: a `Clock` trait, the system clock and a mock for tests.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Timestamp(pub i64);

impl Timestamp {
    pub fn as_millis(self) -> i64 {
        self.0
    }

    pub fn plus_millis(self, millis: i64) -> Timestamp {
        Timestamp(self.0.saturating_add(millis))
    }

    pub fn plus_seconds(self, seconds: u64) -> Timestamp {
        self.plus_millis(i64::try_from(seconds.saturating_mul(1000)).unwrap_or(i64::MAX))
    }

    /// Milliseconds from `earlier` to `self`, zero when `earlier` is later.
    pub fn millis_since(self, earlier: Timestamp) -> u64 {
        u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0)
    }

    /// RFC 3339 in UTC with millisecond precision, for humans and JSON.
    pub fn to_rfc3339(self) -> String {
        let millis = self.0.rem_euclid(1000);
        let secs = self.0.div_euclid(1000);
        let days = secs.div_euclid(86_400);
        let secs_of_day = secs.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        format!(
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
            secs_of_day / 3600,
            (secs_of_day / 60) % 60,
            secs_of_day % 60
        )
    }
}

/// Howard Hinnant's days-to-civil conversion.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Timestamp;
}

/// The system's time, as the process keeps it: the wall clock, followed
/// while it moves with the system's monotonic clock, and not when it steps.
/// A step of the wall clock while the process runs (an hour back, a manual
/// change, a correction) moves no deadline and no time it records: the
/// process goes on at the monotonic clock's pace from where it was, and
/// follows the wall clock again once the two agree (or at its next start).
/// It never goes back.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

/// How far the wall clock may stray from the process's time and still be
/// followed: more is a step.
const FOLLOW_MS: i64 = 1_000;

/// The process's time `elapsed` ms after a start whose wall reading was
/// `base`, given the wall clock now: the wall clock and the new base when
/// it is within `FOLLOW_MS` of it, else the process's own time alone.
fn keep_time(base: i64, elapsed: i64, wall: i64) -> (i64, Option<i64>) {
    let kept = base.saturating_add(elapsed);
    match (wall - kept).abs() <= FOLLOW_MS {
        true => (wall, Some(wall - elapsed)),
        false => (kept, None),
    }
}

/// The process's one timeline, shared by every `SystemClock`.
struct Timeline {
    start: std::time::Instant,
    /// The wall clock's reading at `start`, as last followed.
    base_ms: AtomicI64,
    /// The latest time handed out: none is ever earlier.
    last_ms: AtomicI64,
    /// A step is said once, until the clocks agree again.
    stepped: std::sync::atomic::AtomicBool,
}

static TIMELINE: std::sync::OnceLock<Timeline> = std::sync::OnceLock::new();

#[allow(clippy::disallowed_methods)]
fn wall_ms() -> i64 {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
}

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let timeline = TIMELINE.get_or_init(|| Timeline {
            start: std::time::Instant::now(),
            base_ms: AtomicI64::new(wall_ms()),
            last_ms: AtomicI64::new(i64::MIN),
            stepped: false.into(),
        });
        let elapsed = i64::try_from(timeline.start.elapsed().as_millis()).unwrap_or(i64::MAX);
        let wall = wall_ms();
        let (now, followed) = keep_time(timeline.base_ms.load(Ordering::Relaxed), elapsed, wall);
        if let Some(base) = followed {
            timeline.base_ms.store(base, Ordering::Relaxed);
            if timeline.stepped.swap(false, Ordering::Relaxed) {
                tracing::info!("the wall clock agrees with this process's time again: followed");
            }
        } else if !timeline.stepped.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                step_ms = wall - now,
                "the wall clock stepped: this process keeps its own time (deadlines move with the monotonic clock) until the two agree again or it restarts"
            );
        }
        let last = timeline.last_ms.fetch_max(now, Ordering::Relaxed);
        Timestamp(now.max(last))
    }
}

/// A clock that only moves when told to.
#[derive(Clone, Debug, Default)]
pub struct MockClock {
    millis: Arc<AtomicI64>,
}

impl MockClock {
    pub fn new(start: Timestamp) -> MockClock {
        MockClock { millis: Arc::new(AtomicI64::new(start.0)) }
    }

    pub fn advance_ms(&self, millis: i64) {
        self.millis.fetch_add(millis, Ordering::SeqCst);
    }

    pub fn set(&self, now: Timestamp) {
        self.millis.store(now.0, Ordering::SeqCst);
    }
}

impl Clock for MockClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.millis.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339() {
        assert_eq!(Timestamp(0).to_rfc3339(), "1970-01-01T00:00:00.000Z");
        assert_eq!(Timestamp(1_795_000_000_123).to_rfc3339(), "2026-11-18T11:06:40.123Z");
        assert_eq!(Timestamp(951_782_400_000).to_rfc3339(), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn the_process_follows_the_wall_clock_but_not_its_steps() {
        let base = 1_000_000;
        // Drifting a little: followed.
        assert_eq!(keep_time(base, 5_000, base + 5_300), (base + 5_300, Some(base + 300)));
        // Stepped an hour back, then an hour ahead: the process's own time.
        assert_eq!(keep_time(base, 5_000, base + 5_000 - 3_600_000), (base + 5_000, None));
        assert_eq!(keep_time(base, 6_000, base + 6_000 + 3_600_000), (base + 6_000, None));
        // Back where it was: followed again.
        assert_eq!(keep_time(base, 7_000, base + 7_000), (base + 7_000, Some(base)));
    }

    #[test]
    fn mock_clock_moves_only_when_told() {
        let clock = MockClock::new(Timestamp(1000));
        assert_eq!(clock.now(), Timestamp(1000));
        clock.advance_ms(250);
        assert_eq!(clock.now(), Timestamp(1250));
    }
}

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

#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)]
    fn now(&self) -> Timestamp {
        let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Timestamp(i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX))
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
    fn mock_clock_moves_only_when_told() {
        let clock = MockClock::new(Timestamp(1000));
        assert_eq!(clock.now(), Timestamp(1000));
        clock.advance_ms(250);
        assert_eq!(clock.now(), Timestamp(1250));
    }
}

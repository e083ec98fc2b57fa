//! A job type's rate limit: tasks started per minute, with a burst, kept
//! as a token bucket counted in whole units (a token is 60,000 of them, so
//! a rate of N per minute adds exactly N units a millisecond: no rounding
//! drifts however long it runs).

use crate::clock::Timestamp;

/// Units of one token.
const TOKEN: u64 = 60_000;

/// Tasks started per minute, and how many may start at once after a quiet spell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub per_minute: u32,
    /// At least 1.
    pub burst: u32,
}

impl Rate {
    /// The part of the rate one instance of several uses: `share` of `of`.
    /// At least one a minute, so that no instance with a share waits for ever.
    pub fn share(self, share: u32, of: u32) -> Rate {
        if of == 0 || share >= of {
            return self;
        }
        let part = |n: u32| ((u64::from(n) * u64::from(share)).div_ceil(u64::from(of)) as u32).max(1);
        Rate { per_minute: part(self.per_minute), burst: part(self.burst) }
    }
}

/// The tokens of one job type's rate, as of `at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    rate: Rate,
    units: u64,
    at: Timestamp,
}

impl Bucket {
    /// A full bucket: a new limit may start its burst at once.
    pub fn new(rate: Rate, now: Timestamp) -> Bucket {
        Bucket { rate, units: Self::cap(rate), at: now }
    }

    fn cap(rate: Rate) -> u64 {
        u64::from(rate.burst.max(1)) * TOKEN
    }

    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The limit changed: the tokens saved so far stay, up to the new burst.
    pub fn set_rate(&mut self, rate: Rate, now: Timestamp) {
        self.refill(now);
        self.rate = rate;
        self.units = self.units.min(Self::cap(rate));
    }

    fn refill(&mut self, now: Timestamp) {
        let elapsed = (now.as_millis() - self.at.as_millis()).max(0) as u64;
        self.units = (self.units + elapsed.saturating_mul(u64::from(self.rate.per_minute))).min(Self::cap(self.rate));
        self.at = Timestamp(self.at.as_millis().max(now.as_millis()));
    }

    /// Whether a task may start now.
    pub fn has_token(&self, now: Timestamp) -> bool {
        let mut probe = *self;
        probe.refill(now);
        probe.units >= TOKEN
    }

    /// A task started: it spends a token (the caller checked there was one).
    pub fn spend(&mut self, now: Timestamp) {
        self.refill(now);
        self.units = self.units.saturating_sub(TOKEN);
    }

    /// When the next token is whole, if it is not now; never, at a rate of 0.
    pub fn next_token(&self, now: Timestamp) -> Option<Timestamp> {
        let mut probe = *self;
        probe.refill(now);
        if probe.units >= TOKEN {
            return None;
        }
        let per_ms = u64::from(self.rate.per_minute);
        (per_ms > 0).then(|| Timestamp(probe.at.as_millis() + (TOKEN - probe.units).div_ceil(per_ms) as i64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_starts_at_once_then_tokens_come_at_the_rate() {
        let rate = Rate { per_minute: 6, burst: 2 };
        let mut bucket = Bucket::new(rate, Timestamp(0));
        for _ in 0..2 {
            assert!(bucket.has_token(Timestamp(0)));
            bucket.spend(Timestamp(0));
        }
        assert!(!bucket.has_token(Timestamp(0)));
        assert_eq!(bucket.next_token(Timestamp(0)), Some(Timestamp(10_000)), "six a minute: one every ten seconds");
        assert!(!bucket.has_token(Timestamp(9_999)));
        assert!(bucket.has_token(Timestamp(10_000)));
        bucket.spend(Timestamp(10_000));
        // A quiet hour saves no more than the burst.
        assert!(bucket.has_token(Timestamp(3_600_000)));
        bucket.spend(Timestamp(3_600_000));
        bucket.spend(Timestamp(3_600_000));
        assert!(!bucket.has_token(Timestamp(3_600_000)));
    }

    #[test]
    fn over_a_long_run_exactly_the_rate_starts() {
        // A burst of two: checked every 250 ms, the bucket is never full,
        // so no token is lost to its cap.
        let rate = Rate { per_minute: 7, burst: 2 };
        let mut bucket = Bucket::new(rate, Timestamp(0));
        let mut started = 0;
        for ms in (0..=60 * 60_000).step_by(250) {
            if bucket.has_token(Timestamp(ms)) {
                bucket.spend(Timestamp(ms));
                started += 1;
            }
        }
        assert_eq!(started, 2 + 7 * 60, "the burst, then seven a minute for an hour");
    }

    #[test]
    fn a_changed_rate_keeps_the_tokens_saved_up_to_its_burst() {
        let mut bucket = Bucket::new(Rate { per_minute: 60, burst: 10 }, Timestamp(0));
        bucket.set_rate(Rate { per_minute: 60, burst: 3 }, Timestamp(0));
        let mut n = 0;
        while bucket.has_token(Timestamp(0)) {
            bucket.spend(Timestamp(0));
            n += 1;
        }
        assert_eq!(n, 3);
        bucket.set_rate(Rate { per_minute: 0, burst: 3 }, Timestamp(0));
        assert_eq!(bucket.next_token(Timestamp(0)), None, "a rate of 0 never gives a token");
    }

    #[test]
    fn instances_share_a_rate_by_their_permits() {
        let rate = Rate { per_minute: 10, burst: 4 };
        assert_eq!(rate.share(1, 3), Rate { per_minute: 4, burst: 2 });
        assert_eq!(rate.share(0, 3), Rate { per_minute: 1, burst: 1 });
        assert_eq!(rate.share(3, 3), rate);
    }
}

//! Pauses between tries of something that failed: one policy, doubling from
//! a first pause up to a most, over `backon`'s exponential backoff.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// The pauses before each next try, without end; `reset` after a success.
#[derive(Debug)]
pub(crate) struct Backoff {
    policy: ExponentialBuilder,
    pauses: ExponentialBackoff,
}

impl Backoff {
    /// `first`, then twice the last, up to `most`.
    pub(crate) fn doubling(first: Duration, most: Duration) -> Backoff {
        let most = most.max(first);
        Backoff::of(ExponentialBuilder::new().with_min_delay(first).with_max_delay(most))
    }

    /// As `doubling`, each pause drawn between half of it and the whole, so
    /// that many clients that failed together do not all come back together,
    /// and none waits longer than its pause says.
    pub(crate) fn spread(first: Duration, most: Duration) -> Backoff {
        let most = most.max(first);
        Backoff::of(ExponentialBuilder::new().with_min_delay(first / 2).with_max_delay(most / 2).with_jitter())
    }

    fn of(policy: ExponentialBuilder) -> Backoff {
        let policy = policy.with_factor(2.0).without_max_times();
        Backoff { pauses: policy.build(), policy }
    }

    /// The pause before the next try.
    pub(crate) fn next_pause(&mut self) -> Duration {
        self.pauses.next().expect("a backoff without a most number of tries goes on")
    }

    /// Back to the first pause, after a success.
    pub(crate) fn reset(&mut self) {
        self.pauses = self.policy.build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(pauses: impl Iterator<Item = Duration>) -> Vec<f64> {
        pauses.map(|p| (p.as_secs_f64() * 1000.0).round() / 1000.0).collect()
    }

    #[test]
    fn pauses_double_up_to_the_most_and_start_over_after_a_reset() {
        let mut backoff = Backoff::doubling(Duration::from_secs(1), Duration::from_secs(30));
        let pauses = secs((0..7).map(|_| backoff.next_pause()));
        assert_eq!(pauses, [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]);
        backoff.reset();
        assert_eq!(backoff.next_pause(), Duration::from_secs(1));
    }

    #[test]
    fn spread_pauses_lie_between_half_and_the_whole_of_each_doubling_pause() {
        let mut seen = Vec::new();
        for _ in 0..200 {
            let mut backoff = Backoff::spread(Duration::from_millis(300), Duration::from_millis(750));
            for bound in [300u64, 600, 750, 750] {
                let pause = backoff.next_pause();
                // Within a microsecond: the pauses are computed in f32 seconds.
                let (low, high) = (bound as f64 / 2000.0 - 1e-6, bound as f64 / 1000.0 + 1e-6);
                let at = pause.as_secs_f64();
                assert!(at >= low && at <= high, "{pause:?} outside {low}..={high} s");
                seen.push(pause);
            }
        }
        seen.sort();
        seen.dedup();
        assert!(seen.len() > 100, "the pauses are drawn, not fixed: {} distinct", seen.len());
    }

    #[test]
    fn a_most_below_the_first_pause_keeps_the_first() {
        let mut backoff = Backoff::doubling(Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(secs((0..3).map(|_| backoff.next_pause())), [2.0, 2.0, 2.0]);
    }
}

//! Repeated failures from one address slow its answers: past a few unknown
//! credentials in a minute, every credential it presents that was not
//! verified before waits before it is judged, twice as long at each further
//! failure, up to five seconds.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Failures an address may have in a window before it waits, by default.
pub(crate) const FREE: u32 = 5;
/// Failures older than this are forgotten.
const WINDOW: Duration = Duration::from_secs(60);
const FIRST_WAIT: Duration = Duration::from_millis(250);
const LONGEST_WAIT: Duration = Duration::from_secs(5);
/// The most addresses remembered; the longest quiet goes first.
const MAX_ADDRESSES: usize = 10_000;

pub(super) struct Throttle {
    /// Failures an address may have in a window before it waits.
    free: u32,
    failures: Mutex<HashMap<IpAddr, Failures>>,
}

impl Default for Throttle {
    fn default() -> Throttle {
        Throttle::new(FREE)
    }
}

#[derive(Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
}

impl Throttle {
    pub(super) fn new(free: u32) -> Throttle {
        Throttle { free, failures: Mutex::default() }
    }

    /// How long a credential from `from` waits before it is judged.
    fn delay(&self, from: IpAddr) -> Duration {
        let failures = self.failures.lock().expect("throttle lock");
        match failures.get(&from) {
            Some(f) if f.count > self.free && f.last.elapsed() < WINDOW => {
                let doublings = (f.count - self.free - 1).min(16);
                (FIRST_WAIT * 2u32.pow(doublings)).min(LONGEST_WAIT)
            }
            _ => Duration::ZERO,
        }
    }

    pub(super) async fn wait(&self, from: Option<IpAddr>) {
        let Some(from) = from else { return };
        let delay = self.delay(from);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }

    pub(super) fn failed(&self, from: Option<IpAddr>) {
        let Some(from) = from else { return };
        let now = Instant::now();
        let mut failures = self.failures.lock().expect("throttle lock");
        if failures.len() >= MAX_ADDRESSES && !failures.contains_key(&from) {
            failures.retain(|_, f| f.last.elapsed() < WINDOW);
            if failures.len() >= MAX_ADDRESSES {
                if let Some(quietest) = failures.iter().min_by_key(|(_, f)| f.last).map(|(a, _)| *a) {
                    failures.remove(&quietest);
                }
            }
        }
        let entry = failures.entry(from).or_insert(Failures { count: 0, last: now });
        if entry.last.elapsed() >= WINDOW {
            entry.count = 0;
        }
        entry.count += 1;
        entry.last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn failures_past_the_free_ones_wait_longer_each_time_and_are_forgotten_after_a_minute() {
        let throttle = Throttle::default();
        let (guesser, other): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        for _ in 0..FREE {
            throttle.failed(Some(guesser));
        }
        assert_eq!(throttle.delay(guesser), Duration::ZERO);
        let waits: Vec<Duration> = (0..7)
            .map(|_| {
                throttle.failed(Some(guesser));
                throttle.delay(guesser)
            })
            .collect();
        let ms: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [250, 500, 1000, 2000, 4000, 5000, 5000]);
        assert_eq!(throttle.delay(other), Duration::ZERO, "another address does not wait");
        let before = Instant::now();
        throttle.wait(Some(guesser)).await;
        assert_eq!(before.elapsed(), Duration::from_secs(5));
        tokio::time::advance(WINDOW).await;
        assert_eq!(throttle.delay(guesser), Duration::ZERO);
        throttle.failed(Some(guesser));
        assert_eq!(throttle.delay(guesser), Duration::ZERO, "the count started again");
    }
}

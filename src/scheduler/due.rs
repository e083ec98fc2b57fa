//! When each job type is due for detection. An interval that changes takes
//! effect at once: the next run is the last run plus the new interval.

use std::collections::BTreeMap;

use crate::clock::Timestamp;

#[derive(Debug, Default, Clone)]
pub(crate) struct Due {
    next: BTreeMap<String, Timestamp>,
    last: BTreeMap<String, Timestamp>,
    intervals: BTreeMap<String, u64>,
}

impl Due {
    /// True (and the next run set to now + interval) when the job type is due.
    pub(crate) fn mark_detection_due(&mut self, job_type: &str, interval_seconds: u64, now: Timestamp) -> bool {
        if self.intervals.get(job_type) != Some(&interval_seconds) {
            self.intervals.insert(job_type.to_string(), interval_seconds);
            if let Some(last) = self.last.get(job_type) {
                self.next.insert(job_type.to_string(), last.plus_seconds(interval_seconds));
            }
        }
        let next = self.next.get(job_type).copied().unwrap_or(now);
        if now < next {
            return false;
        }
        self.next.insert(job_type.to_string(), now.plus_seconds(interval_seconds));
        self.last.insert(job_type.to_string(), now);
        true
    }

    /// The earliest next run among `job_types`; a type never run is due now.
    pub(crate) fn next_due<'a>(
        &self,
        job_types: impl IntoIterator<Item = &'a str>,
        now: Timestamp,
    ) -> Option<Timestamp> {
        job_types.into_iter().map(|t| self.next.get(t).copied().unwrap_or(now)).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, MockClock};

    #[test]
    fn a_type_is_due_at_once_then_every_interval() {
        let clock = MockClock::new(Timestamp(1_000_000));
        let mut due = Due::default();
        assert!(due.mark_detection_due("vacuum", 60, clock.now()), "never run: due now");
        assert!(!due.mark_detection_due("vacuum", 60, clock.now()));
        clock.advance_ms(59_999);
        assert!(!due.mark_detection_due("vacuum", 60, clock.now()));
        clock.advance_ms(1);
        assert!(due.mark_detection_due("vacuum", 60, clock.now()));
        assert_eq!(due.next_due(["vacuum"], clock.now()), Some(clock.now().plus_seconds(60)));
    }

    #[test]
    fn a_changed_interval_takes_effect_at_once() {
        let clock = MockClock::new(Timestamp(0));
        let mut due = Due::default();
        assert!(due.mark_detection_due("vacuum", 7200, clock.now()));
        clock.advance_ms(120_000);
        assert!(!due.mark_detection_due("vacuum", 7200, clock.now()), "two hours not yet passed");
        assert!(due.mark_detection_due("vacuum", 60, clock.now()), "the new interval of one minute has passed");
        clock.advance_ms(30_000);
        assert!(!due.mark_detection_due("vacuum", 60, clock.now()));
        // Lengthening works the same way.
        clock.advance_ms(40_000);
        assert!(!due.mark_detection_due("vacuum", 600, clock.now()));
    }

    #[test]
    fn types_are_due_independently() {
        let clock = MockClock::new(Timestamp(0));
        let mut due = Due::default();
        assert!(due.mark_detection_due("vacuum", 3600, clock.now()));
        assert!(due.mark_detection_due("erasure_coding", 300, clock.now()));
        clock.advance_ms(300_000);
        assert!(!due.mark_detection_due("vacuum", 3600, clock.now()));
        assert!(due.mark_detection_due("erasure_coding", 300, clock.now()));
        assert_eq!(
            due.next_due(["vacuum", "erasure_coding", "balance"], clock.now()),
            Some(clock.now()),
            "balance never ran"
        );
    }
}

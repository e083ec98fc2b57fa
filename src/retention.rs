//! Which ended jobs to remove, and why: the retention rules, pure. An ended
//! job is kept for an age and within a count of the newest ended jobs; a
//! recovery-check job (one made by the periodic check, every minute or so)
//! is kept only briefly and counts toward nothing. Jobs that have not ended
//! are never removed.

use std::time::Duration;

use crate::clock::Timestamp;
use crate::model::{JobId, JobOrigin, JobRecord};

/// How long and how many ended jobs are kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retention {
    /// An ended job older than this (since it ended) is removed.
    pub age: Duration,
    /// Beyond this many newest ended jobs, older ones are removed.
    pub count: usize,
    /// An ended recovery-check job older than this is removed.
    pub recovery_checks: Duration,
    /// How long and how much of the audit trail is kept.
    pub audit: crate::model::audit::Keep,
}

impl Default for Retention {
    fn default() -> Retention {
        Retention {
            age: Duration::from_secs(7 * 24 * 3600),
            count: 10_000,
            recovery_checks: Duration::from_secs(3600),
            audit: Default::default(),
        }
    }
}

/// Why a job goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    /// Ended longer ago than the age kept.
    Age,
    /// Older than the newest `count` ended jobs.
    Count,
    /// A recovery-check job past its brief keep.
    RecoveryCheck,
}

impl Reason {
    pub(crate) fn describe(self, retention: &Retention) -> String {
        match self {
            Reason::Age => format!("ended more than {} ago", human(retention.age)),
            Reason::Count => format!("older than the newest {} ended jobs", retention.count),
            Reason::RecoveryCheck => {
                format!("a recovery check that ended more than {} ago", human(retention.recovery_checks))
            }
        }
    }
}

/// A job made by the periodic recovery check.
pub(crate) fn is_recovery_check(record: &JobRecord) -> bool {
    matches!(&record.origin, JobOrigin::Scheduler { job_type, .. } if job_type == crate::wire::RECOVERY_CHECK_JOB_TYPE)
}

/// The ended jobs among `jobs` (newest first, as `list_jobs` gives them)
/// that the rules remove at `now`, oldest last.
pub(crate) fn expired(jobs: &[JobRecord], now: Timestamp, retention: &Retention) -> Vec<(JobId, Reason)> {
    let older_than = |record: &JobRecord, keep: Duration| {
        let ended = record.finished_at.unwrap_or(record.updated_at);
        now.as_millis().saturating_sub(ended.as_millis()) > keep.as_millis() as i64
    };
    let mut kept = 0usize;
    let mut out = Vec::new();
    for record in jobs.iter().filter(|r| r.state.is_terminal()) {
        let reason = if is_recovery_check(record) {
            older_than(record, retention.recovery_checks).then_some(Reason::RecoveryCheck)
        } else if older_than(record, retention.age) {
            Some(Reason::Age)
        } else if kept >= retention.count {
            Some(Reason::Count)
        } else {
            kept += 1;
            None
        };
        if let Some(reason) = reason {
            out.push((record.id, reason));
        }
    }
    out
}

/// `7d`, `36h`, `90m`, `45s`: the largest whole unit.
pub(crate) fn human(duration: Duration) -> String {
    let s = duration.as_secs();
    match s {
        _ if s >= 86_400 && s.is_multiple_of(86_400) => format!("{}d", s / 86_400),
        _ if s >= 3600 && s.is_multiple_of(3600) => format!("{}h", s / 3600),
        _ if s >= 60 && s.is_multiple_of(60) => format!("{}m", s / 60),
        _ => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::JobState;

    const HOUR: i64 = 3_600_000;

    fn record(n: u128, state: JobState, ended_hours_ago: i64, origin: JobOrigin) -> JobRecord {
        let ended = Timestamp(1_000 * HOUR - ended_hours_ago * HOUR);
        JobRecord {
            id: JobId(uuid::Uuid::from_u128(n)),
            name: format!("job-{n}"),
            state,
            origin,
            n_tasks: 1,
            fingerprint: [0; 32],
            created_at: ended,
            updated_at: ended,
            finished_at: state.is_terminal().then_some(ended),
            cancel_requested: false,
            handler: None,
        }
    }

    fn check() -> JobOrigin {
        JobOrigin::Scheduler { job_type: crate::wire::RECOVERY_CHECK_JOB_TYPE.into(), sequence: 0 }
    }

    #[test]
    fn age_count_and_recovery_checks_each_remove_what_they_should_and_nothing_running() {
        let retention = Retention {
            age: Duration::from_secs(48 * 3600),
            count: 2,
            recovery_checks: Duration::from_secs(3600),
            ..Retention::default()
        };
        let now = Timestamp(1_000 * HOUR);
        // Newest first.
        let jobs = vec![
            record(10, JobState::Running, 0, JobOrigin::User),
            record(9, JobState::Succeeded, 0, check()),
            record(8, JobState::Succeeded, 1, JobOrigin::User),
            record(7, JobState::Succeeded, 2, check()),
            record(6, JobState::Failed, 3, JobOrigin::Scheduler { job_type: "vacuum".into(), sequence: 4 }),
            record(5, JobState::Pending, 400, JobOrigin::User),
            record(4, JobState::Canceled, 4, JobOrigin::User),
            record(3, JobState::Succeeded, 49, JobOrigin::User),
        ];
        let gone = expired(&jobs, now, &retention);
        let ids: Vec<(u128, Reason)> = gone.iter().map(|(id, r)| (id.0.as_u128(), *r)).collect();
        assert_eq!(ids, [(7, Reason::RecoveryCheck), (4, Reason::Count), (3, Reason::Age)]);
    }

    #[test]
    fn reasons_read_well() {
        let retention = Retention::default();
        assert_eq!(Reason::Age.describe(&retention), "ended more than 7d ago");
        assert_eq!(Reason::Count.describe(&retention), "older than the newest 10000 ended jobs");
        assert_eq!(Reason::RecoveryCheck.describe(&retention), "a recovery check that ended more than 1h ago");
        assert_eq!(human(Duration::from_secs(90)), "90s");
    }

    proptest::proptest! {
        /// Whatever the jobs: nothing that runs goes, everything that goes
        /// has its reason, and what stays is within every rule.
        #[test]
        fn what_goes_has_a_reason_and_what_stays_keeps_the_rules(
            jobs in proptest::collection::vec((0u8..6, 0i64..100, proptest::bool::ANY), 0..60),
            count in 0usize..10,
            age_hours in 1u64..80,
        ) {
            let retention = Retention {
                age: Duration::from_secs(age_hours * 3600),
                count,
                recovery_checks: Duration::from_secs(2 * 3600),
                ..Retention::default()
            };
            let now = Timestamp(1_000 * HOUR);
            let states = [JobState::Pending, JobState::Running, JobState::Succeeded, JobState::Failed, JobState::Canceled, JobState::Succeeded];
            // Newest first, as the store lists them.
            let records: Vec<JobRecord> = jobs
                .iter()
                .enumerate()
                .map(|(n, (state, hours, is_check))| {
                    let origin = if *is_check { check() } else { JobOrigin::User };
                    record(1_000 - n as u128, states[*state as usize], *hours, origin)
                })
                .collect();
            let gone: std::collections::HashMap<JobId, Reason> = expired(&records, now, &retention).into_iter().collect();
            let hours_ago = |r: &JobRecord| (now.as_millis() - r.finished_at.unwrap_or(r.updated_at).as_millis()) / HOUR;
            let mut kept_ended = 0;
            for r in &records {
                match gone.get(&r.id) {
                    Some(reason) => {
                        proptest::prop_assert!(r.state.is_terminal());
                        match reason {
                            Reason::RecoveryCheck => proptest::prop_assert!(is_recovery_check(r) && hours_ago(r) > 2),
                            Reason::Age => proptest::prop_assert!(!is_recovery_check(r) && hours_ago(r) > age_hours as i64),
                            Reason::Count => proptest::prop_assert!(!is_recovery_check(r) && kept_ended >= count),
                        }
                    }
                    None if r.state.is_terminal() && is_recovery_check(r) => proptest::prop_assert!(hours_ago(r) <= 2),
                    None if r.state.is_terminal() => {
                        proptest::prop_assert!(hours_ago(r) <= age_hours as i64);
                        kept_ended += 1;
                    }
                    None => {}
                }
            }
            proptest::prop_assert!(kept_ended <= count);
        }
    }
}

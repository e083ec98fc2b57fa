//! The steps at start and on adoption: stored jobs brought back, with what
//! their held attempts imply, and what the store kept of cooling volumes and
//! of the workers of handlers without a lease.

use std::sync::Arc;

use super::super::Orphans;
use super::{Core, Step, COOLING, HANDLER_NAME, SHARE};
use crate::active::ActiveJob;
use crate::clock::Timestamp;
use crate::follower::Loss;
use crate::model::{AttemptId, HandlerId, Phase, TaskIdx, TaskRecord, TaskRef};
use crate::store::StoredJob;

impl Core {
    /// The priorities operators gave running jobs, from their settings;
    /// a value this version cannot read is left out.
    pub(in crate::engine) fn remember_priorities(&mut self, settings: Vec<(String, Vec<u8>)>) {
        for (key, value) in settings {
            let job = key.strip_prefix(super::PRIORITY_PREFIX).and_then(|id| id.parse::<crate::model::JobId>().ok());
            if let (Some(job), Ok(priority)) = (job, serde_json::from_slice(&value)) {
                self.priorities.insert(job, priority);
            }
        }
    }

    /// What the store kept of cooling resources, of the workers of
    /// handlers without a lease, and of the shares of the budget, at start.
    pub(in crate::engine) fn remember(
        &mut self,
        cooling: Vec<(String, Vec<u8>)>,
        names: Vec<(String, Vec<u8>)>,
        shares: Vec<(String, Vec<u8>)>,
    ) {
        for (key, value) in shares {
            let (Some(Ok(attempt)), Ok(share)) = (
                key.strip_prefix(SHARE).map(str::parse::<AttemptId>),
                serde_json::from_slice::<crate::budget::Share>(&value),
            ) else {
                continue;
            };
            self.kept_shares.insert(attempt, share);
        }
        for (key, value) in cooling {
            let (Some(resource), Ok(bytes)) = (key.strip_prefix(COOLING), <[u8; 8]>::try_from(value.as_slice())) else {
                continue;
            };
            self.attempts.keep_cooling(resource.to_string(), Timestamp(i64::from_be_bytes(bytes)));
        }
        for (key, value) in names {
            let (Some(Ok(handler)), Ok(name)) =
                (key.strip_prefix(HANDLER_NAME).map(str::parse::<HandlerId>), String::from_utf8(value))
            else {
                continue;
            };
            self.names.insert(handler, Arc::from(name));
        }
    }

    /// A held attempt restored counts the share of the bandwidth budget
    /// its worker was given, as the store kept it.
    fn keep_share(&mut self, attempt: AttemptId) {
        if let Some(share) = self.kept_shares.remove(&attempt) {
            self.shares.start(attempt, share);
        }
    }

    /// Brings stored active jobs back: repairs derived state, rebuilds what
    /// every held attempt implies (its slot, volume lock and deadline), deals
    /// with the attempts of the previous run's handlers, finalizes jobs whose
    /// tasks all ended, and queues the rest.
    pub(in crate::engine) fn restore(&mut self, stored: Vec<StoredJob>, now: Timestamp, step: &mut Step) {
        // Attempts held again may be of a type whose window is closed.
        self.recheck_windows(now);
        let mut orphans: Vec<AttemptId> = Vec::new();
        for stored_job in stored {
            let id = stored_job.record.id;
            let mut job = ActiveJob::from_stored(stored_job);
            let mut ready = Vec::new();
            let mut held: Vec<(u32, u32, HandlerId, Timestamp)> = Vec::new();
            for idx in 0..job.len() as u32 {
                if matches!(job.tasks[idx as usize].phase, Phase::Pending) && job.unmet[idx as usize] == 0 {
                    job.set_phase(idx, Phase::READY, now);
                    job.record_task(idx, &mut step.batch);
                }
                let record: &TaskRecord = &job.tasks[idx as usize];
                match record.phase {
                    Phase::Ready { .. } => ready.push(idx),
                    // A held task always has its handler: decoding made one
                    // stored without it ready again (rule R1).
                    Phase::Held(hold) => held.push((idx, record.attempt, hold.handler, hold.assigned_at)),
                    Phase::Pending | Phase::Ended { .. } => {}
                }
            }
            self.jobs.insert(id, job);
            self.queue_ready(id, &ready, now);
            for (idx, attempt, handler, assigned_at) in held {
                let task = TaskRef { job: id, idx: TaskIdx(idx) };
                self.hold(task, attempt, handler, assigned_at);
                self.keep_share(AttemptId::new(task, attempt));
                orphans.push(AttemptId::new(task, attempt));
            }
            if self.jobs.get(&id).is_some_and(ActiveJob::all_ended) {
                self.finalize(id, now, step);
            }
        }
        // Those of attempts not held here are another instance's (in a
        // cluster, the store keeps every instance's).
        self.kept_shares.clear();
        match self.options.orphans {
            Orphans::Requeue => {
                let loss = Loss::NotCounted("the admin restarted".into());
                for attempt in orphans {
                    self.lose(attempt, &loss, now, step);
                }
            }
            Orphans::Keep { grace } => {
                let handlers: std::collections::BTreeSet<HandlerId> =
                    orphans.iter().filter_map(|a| self.attempts.get(a.task).map(|held| held.handler)).collect();
                // A connected handler reports what it runs with its heartbeats;
                // one already absent keeps the time it was given.
                let away = |handler: &HandlerId| {
                    !self.dispatch.has_handler(*handler)
                        && !self.peer_handlers.contains(handler)
                        && !self.attempts.is_away(*handler)
                };
                let handlers: Vec<HandlerId> = handlers.into_iter().filter(away).collect();
                for handler in handlers {
                    let reason = format!(
                        "lost with its worker: the admin restarted and the worker did not come back within {:.1} s",
                        grace.as_secs_f64()
                    );
                    self.attempts.away(handler, now.plus_millis(grace.as_millis() as i64), reason);
                }
                if !self.attempts.is_empty() {
                    tracing::info!(
                        held = self.attempts.len(),
                        handlers = self.attempts.handlers().len(),
                        grace_ms = grace.as_millis() as u64,
                        "keeping the attempts of the previous run for their workers"
                    );
                }
            }
        }
    }
}

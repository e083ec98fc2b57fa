//! Retention on the server: every `--prune-interval` the ended jobs past the
//! rules (`crate::retention`) are removed, through the engine, in bounded
//! batches, so that the store holds what is kept and no more however long
//! the server runs. `jobcenter prune` does the same now, or only names them.
//! With several admins on one database, the live instance with the lowest
//! id prunes for all. After each prune the store may reclaim the space of
//! what was removed (`Store::reclaim`).

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::engine::EngineHandle;
use crate::model::{audit, JobId, JobRecord};
use crate::proto::api;
use crate::retention::{expired, human, Reason, Retention};
use crate::server::cluster::Topology;
use crate::server::duties::DutyError;
use crate::server::surface::convert;
use crate::server::surface::metrics::Metrics;
use crate::store::JobFilter;

/// At most this many jobs, and this many of their tasks, per removal step.
const BATCH_JOBS: usize = 500;
const BATCH_TASKS: u64 = 200_000;
/// The pause between two removal steps, so that a large prune leaves the
/// committer to the jobs running meanwhile.
const BATCH_PAUSE: Duration = Duration::from_millis(20);

/// Keeps pruning single-flight on an instance.
#[derive(Default)]
pub(crate) struct Gate {
    running: super::flight::Gate,
}

impl Gate {
    pub(crate) fn is_running(&self) -> bool {
        self.running.is_taken()
    }
}

/// Pruning on this instance: the rules, what it reads and removes through
/// the engine, and the store it lets reclaim the space.
pub(crate) struct Pruner {
    pub(crate) gate: Arc<Gate>,
    pub(crate) engine: EngineHandle,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) metrics: Arc<Metrics>,
    /// In a cluster, the live instance with the lowest id prunes for all.
    pub(crate) topology: Topology,
    pub(crate) retention: Retention,
    /// How often the loop prunes.
    pub(crate) interval: Duration,
}

impl Pruner {
    /// The rules in a line, for `prune` and the log.
    pub(crate) fn rules(&self) -> String {
        let r = &self.retention;
        format!(
            "ended jobs are kept {}, at most {}; recovery checks {}; audit records {}, at most {}",
            human(r.age),
            r.count,
            human(r.recovery_checks),
            human(r.audit.age),
            r.audit.count
        )
    }

    /// The ended jobs the rules remove now, newest first.
    async fn due(&self) -> Result<Vec<(JobRecord, Reason)>, DutyError> {
        let records = self.engine.list(JobFilter::default()).await?;
        let now = self.clock.now();
        let mut gone: std::collections::HashMap<JobId, Reason> =
            expired(&records, now, &self.retention).into_iter().collect();
        Ok(records.into_iter().filter_map(|r| gone.remove(&r.id).map(|reason| (r, reason))).collect())
    }

    /// Finds what the rules remove and, unless `dry_run`, removes it.
    pub(crate) async fn prune(&self, dry_run: bool) -> Result<api::PruneResponse, DutyError> {
        let Some(_pass) = self.gate.running.enter() else {
            return Err(DutyError::Busy("a prune is already running; try again when it has ended".into()));
        };
        self.prune_inner(dry_run).await
    }

    async fn prune_inner(&self, dry_run: bool) -> Result<api::PruneResponse, DutyError> {
        let due = self.due().await?;
        let retention = &self.retention;
        let jobs = due
            .iter()
            .map(|(record, reason)| api::PrunedJob {
                job: Some(convert::summary(record)),
                reason: reason.describe(retention),
            })
            .collect();
        if !dry_run {
            let mut removed = 0;
            let (mut batch, mut tasks) = (Vec::new(), 0u64);
            // Oldest first: a prune cut short leaves the newest.
            for (record, _) in due.iter().rev() {
                batch.push(record.id);
                tasks += u64::from(record.n_tasks);
                if batch.len() >= BATCH_JOBS || tasks >= BATCH_TASKS {
                    removed += self.engine.remove(std::mem::take(&mut batch)).await?;
                    tasks = 0;
                    tokio::time::sleep(BATCH_PAUSE).await;
                }
            }
            if !batch.is_empty() {
                removed += self.engine.remove(batch).await?;
            }
            if removed > 0 {
                self.metrics.jobs_pruned(removed as u64);
                tracing::info!(removed, rules = %self.rules(), "ended jobs removed");
            }
            self.prune_audit().await?;
        }
        Ok(api::PruneResponse { jobs, dry_run, rules: self.rules() })
    }

    /// Removes the audit records past their age and count, oldest first.
    async fn prune_audit(&self) -> Result<(), DutyError> {
        let store = self.engine.store().clone();
        let keys: Vec<String> = tokio::task::spawn_blocking(move || {
            store.settings(audit::PREFIX).map(|s| s.into_iter().map(|(k, _)| k).collect())
        })
        .await
        .map_err(|e| DutyError::Failed(e.to_string()))??;
        let now_ms = u64::try_from(self.clock.now().as_millis()).unwrap_or(0);
        let expired = audit::expired(&keys, now_ms, self.retention.audit);
        for keys in expired.chunks(BATCH_JOBS) {
            self.engine.put_settings(keys.iter().map(|k| (k.clone(), None)).collect()).await?;
            tokio::time::sleep(BATCH_PAUSE).await;
        }
        if !expired.is_empty() {
            tracing::info!(removed = expired.len(), rules = %self.rules(), "audit records removed");
        }
        Ok(())
    }

    /// Whether this instance prunes: alone always; in a cluster, the live
    /// instance with the lowest id.
    fn prunes_here(&self) -> bool {
        match &self.topology {
            Topology::Alone => true,
            Topology::Member(node) => node.live().iter().map(|i| i.id).min().is_none_or(|lowest| lowest == node.id),
        }
    }

    /// Prunes every `--prune-interval`.
    pub(crate) async fn prunes(self: Arc<Self>) {
        let mut compactions = CompactionPace::default();
        loop {
            tokio::time::sleep(self.interval).await;
            if !self.prunes_here() {
                continue;
            }
            if let Err(e) = self.prune(false).await {
                tracing::warn!(error = %e, "pruning ended jobs failed; trying again at the next interval");
            }
            if compactions.try_now() {
                compactions.record(self.reclaim().await);
            }
        }
    }

    /// Lets the store give back the space of what was removed, when that is due
    /// (a sled data directory compacts its log while the server runs). False
    /// when it tried and failed.
    async fn reclaim(&self) -> bool {
        let store = self.engine.store().clone();
        match tokio::task::spawn_blocking(move || store.reclaim()).await {
            Ok(Ok(Some(done))) => {
                self.metrics.store_compacted(&done);
                tracing::info!(
                    before_mib = done.before_bytes / (1024 * 1024),
                    after_mib = done.after_bytes / (1024 * 1024),
                    took_ms = done.took.as_millis() as u64,
                    "store compacted"
                );
            }
            Ok(Ok(None)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "compacting the store failed; trying again later, less often while it fails");
                return false;
            }
            Err(e) => {
                tracing::warn!(error = %e, "compacting the store stopped");
                return false;
            }
        }
        true
    }
}

/// After a failed compaction (a full disk, most likely), the next tries
/// come after 1, 3, 7… prunes skipped, at most `MAX_SKIPPED_PRUNES`.
const MAX_SKIPPED_PRUNES: u32 = 63;

/// When the next compaction is tried, after failures in a row.
#[derive(Debug, Default)]
struct CompactionPace {
    failures: u32,
    skip: u32,
}

impl CompactionPace {
    /// Whether to try at this prune.
    fn try_now(&mut self) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        true
    }

    fn record(&mut self, succeeded: bool) {
        if succeeded {
            self.failures = 0;
        } else {
            self.failures = self.failures.saturating_add(1);
            self.skip = (2u32.saturating_pow(self.failures) - 1).min(MAX_SKIPPED_PRUNES);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The prunes at which a compaction is tried, out of `n`, each try
    /// failing while `fails` says so.
    fn tries(n: u32, fails: impl Fn(u32) -> bool) -> Vec<u32> {
        let mut backoff = CompactionPace::default();
        let mut tried = Vec::new();
        for prune in 0..n {
            if backoff.try_now() {
                tried.push(prune);
                backoff.record(!fails(prune));
            }
        }
        tried
    }

    #[test]
    fn failed_compactions_are_tried_less_often_and_success_resets_the_pace() {
        assert_eq!(tries(5, |_| false), vec![0, 1, 2, 3, 4]);
        assert_eq!(tries(40, |_| true), vec![0, 2, 6, 14, 30]);
        // At most 63 prunes skipped, however long it fails.
        let tried = tries(1_000, |_| true);
        let gaps: Vec<u32> = tried.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(*gaps.iter().max().unwrap(), 64, "{gaps:?}");
        assert!(gaps[gaps.len() - 3..].iter().all(|&g| g == 64), "{gaps:?}");
        // Once one succeeds, every prune tries again.
        assert_eq!(tries(12, |prune| prune < 3), vec![0, 2, 6, 7, 8, 9, 10, 11]);
    }
}

//! The recovery check on the server: build the snapshot from the engine and
//! the worker registry, run the pure rules, apply their actions through the
//! engine's normal steps, and record every finding. It runs single-flight,
//! every interval, as a cluster task (a `recovery_check` job that any
//! capable worker executes by calling back) or, with no such worker, here.

use std::sync::Arc;

use jobcenter_recovery as recovery;
use tracing::Instrument;

use super::scheduler::Board;
use crate::clock::Clock;
use crate::engine::EngineHandle;
use crate::model::JobOrigin;
use crate::proto::api;
use crate::server::cluster::peer::Peers;
use crate::server::cluster::{Timing, Topology};
use crate::server::duties::DutyError;
use crate::server::surface::metrics::Metrics;
use crate::server::workers::registry::Registry;

/// The job type of the periodic check, as a cluster task.
pub(crate) const JOB_TYPE: &str = crate::wire::RECOVERY_CHECK_JOB_TYPE;

/// Keeps the check single-flight: a check that is still running when the
/// next is due makes that one a no-op (a queue of one).
#[derive(Default)]
pub(crate) struct Gate {
    running: super::flight::Gate,
    /// The last check that ran here (not a dry run): when, and what it found.
    last: std::sync::Mutex<Option<(i64, Vec<api::Finding>)>>,
}

impl Gate {
    pub(crate) fn is_running(&self) -> bool {
        self.running.is_taken()
    }

    pub(crate) fn last(&self) -> Option<(i64, Vec<api::Finding>)> {
        self.last.lock().expect("last check lock").clone()
    }
}

/// The recovery check and what it reads: the engine's jobs, the workers
/// connected here and, in a cluster, elsewhere; what it writes: the engine's
/// steps, the metrics and the scheduler's activity log.
pub(crate) struct Recovery {
    pub(crate) gate: Arc<Gate>,
    pub(crate) engine: EngineHandle,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) registry: Registry,
    pub(crate) topology: Topology,
    /// The other instances: what their sessions know, the workers lent to.
    pub(crate) peers: Peers,
    pub(crate) metrics: Arc<Metrics>,
    /// Each finding applied is a line of the activity log.
    pub(crate) board: Board,
    pub(crate) settings: Settings,
    /// The findings a check applied are a notification (`recovery.findings`).
    pub(crate) notifier: Arc<crate::server::notify::Notifier>,
}

/// The server's settings the check reads.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) silence_timeout: std::time::Duration,
    pub(crate) finalize_grace: std::time::Duration,
    pub(crate) progress_timeout: std::time::Duration,
    pub(crate) delivery_grace: std::time::Duration,
    /// How often the periodic check runs.
    pub(crate) interval: std::time::Duration,
    /// The first check waits no longer than this after a start.
    pub(crate) orphan_grace: std::time::Duration,
    /// The cluster's pace: a worker lent within two heartbeats and the lag is alive.
    pub(crate) cluster: Timing,
    /// The periodic check's job is a job like any other.
    pub(crate) limits: crate::jobfile::Limits,
}

impl Recovery {
    /// The last check that ran here (not a dry run): when, and what it found.
    pub(crate) fn last(&self) -> Option<(i64, Vec<api::Finding>)> {
        self.gate.last()
    }

    /// Runs the check once; applies the actions unless `dry_run`.
    pub(crate) async fn check(&self, dry_run: bool) -> Result<Vec<api::Finding>, DutyError> {
        let gate = &self.gate;
        let Some(_pass) = gate.running.enter() else {
            return Err(DutyError::Busy("a recovery check is already running".into()));
        };
        let span = tracing::info_span!(
            target: crate::traces::TARGET,
            "recovery_check",
            dry_run,
            findings = tracing::field::Empty,
            applied = tracing::field::Empty,
            error = tracing::field::Empty,
        );
        let result = self.check_inner(dry_run).instrument(span.clone()).await;
        match &result {
            Ok(findings) => {
                span.record("findings", findings.len());
                span.record("applied", findings.iter().filter(|f| f.applied).count());
            }
            Err(e) => {
                span.record("error", tracing::field::display(e));
            }
        }
        if let (Ok(findings), false) = (&result, dry_run) {
            *gate.last.lock().expect("last check lock") = Some((self.clock.now().as_millis(), findings.clone()));
        }
        result
    }

    async fn check_inner(&self, dry_run: bool) -> Result<Vec<api::Finding>, DutyError> {
        let snapshot = self.snapshot().await?;
        let findings = recovery::check(&snapshot);
        let applied = if dry_run || findings.is_empty() {
            vec![false; findings.len()]
        } else {
            self.engine.apply_recovery(findings.iter().map(|f| (f.rule, f.action.clone())).collect()).await?
        };
        if !dry_run {
            // A silent worker gets no more work: its session ends, and the worker,
            // when it wakes, finds its stream gone and drops what it was running.
            for finding in findings.iter().filter(|f| f.rule == recovery::Rule::HandlerSilent) {
                if let Some(handler) = finding.handler.as_deref().and_then(|h| h.parse().ok()) {
                    self.registry.stop(handler);
                }
            }
        }
        let reports: Vec<api::Finding> = findings
            .into_iter()
            .zip(applied)
            .map(|(finding, applied)| self.report(finding, applied, dry_run))
            .collect();
        let acted: Vec<&api::Finding> = reports.iter().filter(|f| f.applied).collect();
        if !acted.is_empty() {
            let payload = serde_json::json!({ "findings": acted });
            self.notifier.record(crate::model::notify::Kind::RecoveryFindings, payload).await;
        }
        Ok(reports)
    }

    /// What the rules look at: the jobs led here with their held and ready
    /// tasks, and every handler known to be alive, here or at another
    /// instance, with the attempts its session knows.
    async fn snapshot(&self) -> Result<recovery::Snapshot, DutyError> {
        // While the store is away nothing is durable and no work order leaves:
        // what the check would see then is the outage, not a fault.
        let Some(ready_for) = self.engine.ready_for() else {
            return Err(DutyError::NotNow("the store is away: the recovery check waits until it is back".into()));
        };
        let now = self.clock.now().as_millis();
        let (mut jobs, engine_handlers) = self.engine.recovery_snapshot().await?;
        // No work order could leave before the store took writes again: an
        // attempt is counted as handed over from then at the earliest.
        let ready_since = now - ready_for.as_millis() as i64;
        for task in jobs.iter_mut().flat_map(|job| job.tasks.iter_mut()) {
            if let Some(assigned_at) = task.assigned_at.as_mut() {
                *assigned_at = (*assigned_at).max(ready_since);
            }
        }
        let grace_ms = self.settings.delivery_grace.as_millis() as i64;
        let mut handlers = std::collections::BTreeMap::new();
        for worker in self.registry.workers() {
            let last_seen = worker.last_seen.as_millis();
            let handler = worker.handler.to_string();
            let knows = worker
                .known
                .as_ref()
                .and_then(|known| known.lock().expect("known lock").all())
                .map(|all| all.into_iter().map(|a| (a.task.job.to_string(), a.task.idx.0, a.number)).collect());
            handlers.insert(
                handler.clone(),
                recovery::HandlerSnapshot { handler, node: worker.worker_id.clone(), last_seen, knows },
            );
        }
        self.add_handlers_elsewhere(&jobs, now - grace_ms, now, &mut handlers).await;
        for handler in engine_handlers {
            // In-process executors live as long as the admin does.
            let id = handler.to_string();
            handlers.entry(id.clone()).or_insert(recovery::HandlerSnapshot {
                handler: id,
                node: "admin".into(),
                last_seen: now,
                knows: None,
            });
        }
        Ok(recovery::Snapshot {
            now,
            config: recovery::Config {
                silence_timeout_ms: self.settings.silence_timeout.as_millis() as i64,
                finalize_grace_ms: self.settings.finalize_grace.as_millis() as i64,
                progress_timeout_ms: self.settings.progress_timeout.as_millis() as i64,
                delivery_grace_ms: grace_ms,
            },
            handlers,
            jobs,
        })
    }

    /// Workers connected to the other live instances are alive: an attempt
    /// one of them runs for a job led here is not orphaned. Their instances
    /// say which of the attempts held here for them since before `due_before`
    /// their sessions know.
    async fn add_handlers_elsewhere(
        &self,
        jobs: &[recovery::JobSnapshot],
        due_before: i64,
        now: i64,
        handlers: &mut std::collections::BTreeMap<String, recovery::HandlerSnapshot>,
    ) {
        let Some(node) = self.topology.member() else { return };
        let timing = &self.settings.cluster;
        let lent = self.peers.lent_within(timing.heartbeat * 2 + timing.lag);
        let live = node.live();
        for worker in elsewhere(node.id, &live, lent, now, |ms| node.local_ms(ms)) {
            let id = worker.handler.to_string();
            if handlers.contains_key(&id) {
                continue;
            }
            let due = held_past(jobs, &id, due_before);
            let knows =
                match due.is_empty() {
                    true => None,
                    false => self.peers.known_at(&worker.address, worker.handler, &due).await.map(|known| {
                        known.into_iter().map(|a| (a.task.job.to_string(), a.task.idx.0, a.number)).collect()
                    }),
                };
            handlers.insert(id, worker.snapshot(knows));
        }
    }

    /// A finding as the API answers it, recorded in the activity log and
    /// the metrics unless the check was a dry run, and logged either way.
    fn report(&self, finding: recovery::Finding, applied: bool, dry_run: bool) -> api::Finding {
        if !dry_run {
            self.metrics.record_recovery_finding(finding.rule.id());
            let done = if applied { "applied" } else { "skipped (the task moved on)" };
            let message = format!(
                "{} job {} task {}: {} ({})",
                finding.rule,
                finding.job,
                finding.task.as_deref().unwrap_or("-"),
                done,
                finding.detail
            );
            self.board.record(JOB_TYPE, message);
        }
        tracing::warn!(
            rule = finding.rule.id(),
            job.id = %finding.job,
            task.id = finding.task.as_deref().unwrap_or(""),
            handler = finding.handler.as_deref().unwrap_or(""),
            age_ms = finding.age_ms,
            applied,
            dry_run,
            detail = %finding.detail,
            "recovery finding"
        );
        let action = serde_json::to_value(&finding.action)
            .ok()
            .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(String::from))
            .unwrap_or_default();
        api::Finding {
            rule: finding.rule.id().into(),
            rule_name: finding.rule.name().into(),
            job_id: finding.job,
            task_id: finding.task.unwrap_or_default(),
            handler: finding.handler.unwrap_or_default(),
            age_ms: finding.age_ms,
            action,
            detail: finding.detail,
            applied,
            instance: self.topology.member().map(|n| n.id.to_string()).unwrap_or_default(),
        }
    }

    /// The check over the whole cluster: this instance checks the jobs it leads
    /// and asks every other live instance to check the jobs it leads. Alone,
    /// the same as `check`. An instance that does not answer is skipped: once
    /// silent past the lag threshold, it is deactivated and its jobs taken over.
    pub(crate) async fn check_cluster(&self, dry_run: bool) -> Result<Vec<api::Finding>, DutyError> {
        let mut findings = self.check(dry_run).await?;
        let Some(node) = self.topology.member() else { return Ok(findings) };
        for instance in
            node.live().into_iter().filter(|i| i.id != node.id && i.role == crate::store::cluster::Role::Server)
        {
            match self.check_elsewhere(&instance.grpc_address, dry_run).await {
                Ok(more) => findings.extend(more),
                Err(e) => {
                    tracing::warn!(instance = %instance.id, error = %e, "another instance did not run its part of the recovery check")
                }
            }
        }
        Ok(findings)
    }

    /// The check at another instance, or why it gave nothing.
    async fn check_elsewhere(&self, address: &str, dry_run: bool) -> Result<Vec<api::Finding>, String> {
        let mut client = self.peers.job_service(address).await?;
        let message = api::RecoverRequest { dry_run, here_only: true };
        let request = self.peers.request_within(message, std::time::Duration::from_secs(30));
        Ok(client.recover(request).await.map_err(|status| status.message().to_string())?.into_inner().findings)
    }

    /// Whether this instance runs the periodic check now: alone, always; in a
    /// cluster, the instance holding the recovery lease (one at a time, a live
    /// one: the lease of a silent holder runs out and another takes it).
    async fn my_turn(&self) -> bool {
        let Some(_) = self.topology.member() else { return true };
        let store = self.engine.store().clone();
        let ttl = self.settings.interval * 3;
        let lease = tokio::task::spawn_blocking(move || store.cluster().map(|c| c.lease("recovery", ttl))).await;
        matches!(lease, Ok(Some(Ok(true))))
    }

    /// Every interval: a cluster task when a worker can run one, else the check here.
    pub(crate) async fn checks(self: Arc<Self>) {
        tokio::time::sleep(self.settings.orphan_grace.min(self.settings.interval)).await;
        let mut in_flight: Option<crate::model::JobId> = None;
        loop {
            if !self.my_turn().await {
                tokio::time::sleep(self.settings.interval).await;
                continue;
            }
            let capable = self
                .registry
                .workers()
                .iter()
                .any(|w| w.capabilities.iter().any(|c| c.job_type == JOB_TYPE && c.can_execute));
            if capable {
                let busy = match in_flight {
                    Some(job) => match self.engine.summary(job).await {
                        Ok(Some(summary)) => !summary.record.state.is_terminal(),
                        _ => false,
                    },
                    None => false,
                };
                if !busy {
                    in_flight = self.submit_cluster_task().await;
                }
            } else if let Err(e) = self.check_cluster(false).await {
                tracing::debug!(error = %e, "recovery check skipped");
            }
            tokio::time::sleep(self.settings.interval).await;
        }
    }

    async fn submit_cluster_task(&self) -> Option<crate::model::JobId> {
        let text = format!(r#"{{"name":"{JOB_TYPE}","tasks":[{{"id":"check","job_type":"{JOB_TYPE}"}}]}}"#);
        let spec =
            crate::jobfile::parse(text.as_bytes(), crate::jobfile::Format::Json, JOB_TYPE, &self.settings.limits);
        let spec = match spec {
            Ok(spec) => spec,
            Err(e) => {
                tracing::error!(error = %e, "cannot build the recovery check job");
                return None;
            }
        };
        let origin = JobOrigin::Scheduler { job_type: JOB_TYPE.into(), sequence: 0 };
        match self.engine.submit(spec, origin).await {
            Ok(job) => Some(job),
            Err(e) => {
                tracing::debug!(error = %e, "recovery check job not submitted");
                None
            }
        }
    }
}

/// A worker connected to another live instance, as the check sees it.
#[derive(Debug, PartialEq)]
struct Elsewhere {
    handler: crate::model::HandlerId,
    /// The gRPC address of its instance, which says what its session knows.
    address: Arc<str>,
    /// When it was last known alive, on this machine's clock.
    last_seen: i64,
    /// What the findings call its place.
    at: String,
}

impl Elsewhere {
    /// The worker as the recovery rules see it, with the attempts its
    /// session knows when its instance was asked.
    fn snapshot(self, knows: Option<std::collections::BTreeSet<(String, u32, u32)>>) -> recovery::HandlerSnapshot {
        recovery::HandlerSnapshot { handler: self.handler.to_string(), node: self.at, last_seen: self.last_seen, knows }
    }
}

/// The workers connected to the other live instances: those their last
/// heartbeats list, and those one of them offered this instance (`lent`:
/// handler, the instance's address, how long ago) since. A worker offered
/// is alive as of the offer though the heartbeats that list it may not have
/// reached this instance yet, so the attempts lent to it a moment ago are
/// not orphaned; `lent` holds only offers within two heartbeats and the lag,
/// past which the list says. `local_ms` turns the store's clock into this
/// machine's.
fn elsewhere(
    me: crate::model::HandlerId,
    live: &[crate::store::cluster::Instance],
    lent: Vec<(crate::model::HandlerId, Arc<str>, std::time::Duration)>,
    now: i64,
    local_ms: impl Fn(i64) -> i64,
) -> Vec<Elsewhere> {
    let mut out = Vec::new();
    for instance in live.iter().filter(|i| i.id != me) {
        let address: Arc<str> = Arc::from(instance.grpc_address.as_str());
        let (last_seen, at) = (local_ms(instance.heartbeat_ms), format!("instance {}", instance.id));
        for handler in &instance.handlers {
            out.push(Elsewhere { handler: *handler, address: address.clone(), last_seen, at: at.clone() });
        }
    }
    for (handler, address, ago) in lent {
        if live.iter().any(|i| i.id != me && *i.grpc_address == *address) {
            let (last_seen, at) = (now - ago.as_millis() as i64, format!("instance at {address}"));
            out.push(Elsewhere { handler, address, last_seen, at });
        }
    }
    out
}

/// The attempts held for `handler` that were assigned before `before`.
fn held_past(jobs: &[recovery::JobSnapshot], handler: &str, before: i64) -> Vec<crate::model::AttemptId> {
    let mut due = Vec::new();
    for job in jobs {
        let Ok(id) = job.id.parse::<crate::model::JobId>() else { continue };
        for task in &job.tasks {
            let assigned_at = task.assigned_at.unwrap_or(task.updated_at);
            if task.state.is_held() && task.handler.as_deref() == Some(handler) && assigned_at < before {
                let task_ref = crate::model::TaskRef { job: id, idx: crate::model::TaskIdx(task.idx) };
                due.push(crate::model::AttemptId::new(task_ref, task.attempt));
            }
        }
    }
    due
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::model::HandlerId;
    use crate::store::cluster::{Instance, Role};

    fn instance(id: HandlerId, grpc_address: &str, heartbeat_ms: i64, handlers: Vec<HandlerId>) -> Instance {
        Instance {
            id,
            role: Role::Server,
            grpc_address: grpc_address.into(),
            http_address: String::new(),
            started_at_ms: 0,
            heartbeat_ms,
            heartbeat_age_ms: 0,
            paused: false,
            jobs_led: 0,
            workers: handlers.len(),
            detectors: Vec::new(),
            detections: Vec::new(),
            handlers,
            active: true,
        }
    }

    /// The check's findings on one job led here whose only task was lent a
    /// moment ago to `worker`, with `others` as the workers it sees elsewhere.
    fn findings(now: i64, worker: HandlerId, others: Vec<Elsewhere>) -> Vec<recovery::Finding> {
        let task = recovery::TaskSnapshot {
            idx: 0,
            id: "a".into(),
            state: recovery::TaskState::Assigned,
            attempt: 1,
            handler: Some(worker.to_string()),
            assigned_at: Some(now - 50),
            started_at: None,
            updated_at: now - 50,
            finished_at: None,
            pinned_node: None,
            progress_timeout_ms: None,
            queued: false,
        };
        let job = recovery::JobSnapshot {
            id: crate::model::JobId::new().to_string(),
            active: true,
            from_scheduler: false,
            updated_at: now - 50,
            unfinished: 1,
            tasks: vec![task],
        };
        // As `check_inner` does: nothing is due past the delivery grace, so
        // no instance is asked what its sessions know.
        let handlers = others.into_iter().map(|e| (e.handler.to_string(), e.snapshot(None))).collect();
        recovery::check(&recovery::Snapshot { now, config: recovery::Config::default(), handlers, jobs: vec![job] })
    }

    #[test]
    fn a_worker_offered_before_the_heartbeats_list_it_keeps_the_attempts_just_lent_to_it() {
        let (me, b, gone) = (HandlerId::new(), HandlerId::new(), HandlerId::new());
        let (listed, offered) = (HandlerId::new(), HandlerId::new());
        let now = 1_000_000;
        // b's last heartbeat, as this instance read it, lists only `listed`;
        // b offered `offered` 100 ms ago. An instance no longer live offered
        // `gone`, and this instance is never "elsewhere".
        let live = [instance(me, "me:1", now, vec![]), instance(b, "b:1", now - 1_500, vec![listed])];
        let mine = HandlerId::new();
        let lent = || {
            vec![
                (offered, Arc::from("b:1"), Duration::from_millis(100)),
                (gone, Arc::from("c:1"), Duration::from_millis(100)),
                (mine, Arc::from("me:1"), Duration::from_millis(100)),
            ]
        };
        let seen = elsewhere(me, &live, lent(), now, |ms| ms - 7);
        assert_eq!(
            seen,
            [
                Elsewhere {
                    handler: listed,
                    address: "b:1".into(),
                    last_seen: now - 1_507,
                    at: format!("instance {b}")
                },
                Elsewhere {
                    handler: offered,
                    address: "b:1".into(),
                    last_seen: now - 100,
                    at: "instance at b:1".into()
                },
            ]
        );

        assert_eq!(findings(now, offered, seen), [], "an attempt lent 50 ms ago to a worker offered 100 ms ago");

        // Without the offer, that worker is gone as far as the heartbeats
        // tell, and the check takes its attempt back: it would run twice.
        let listed_only = elsewhere(me, &live, Vec::new(), now, |ms| ms - 7);
        let rules: Vec<recovery::Rule> = findings(now, offered, listed_only).iter().map(|f| f.rule).collect();
        assert_eq!(rules, [recovery::Rule::HandlerGone]);
        let rules: Vec<recovery::Rule> =
            findings(now, gone, elsewhere(me, &live, lent(), now, |ms| ms - 7)).iter().map(|f| f.rule).collect();
        assert_eq!(rules, [recovery::Rule::HandlerGone], "a worker offered by an instance no longer live");
    }
}

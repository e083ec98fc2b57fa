//! `EngineHandle`: the cheap, cloneable way in. Commands go to the loop over
//! one channel, in order; answers come back once the step behind them is
//! durable. Reads of jobs that have ended go to the store.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use jobcenter_recovery as recovery;
use tokio::sync::{broadcast, mpsc, oneshot};

use super::core::{ClusterCommand, Command, HandlerCommand, JobCommand, Query, Reply, ReportCommand};
use super::{CommitObserver, Error, Event, Progress, Summary};
use crate::clock::Timestamp;
use crate::dispatch::{Assignment, FreeSlots, HandlerSpec, TypeLimits};
use crate::follower::{Loss, Outcome, Rejection};
use crate::model::audit;
use crate::model::{AttemptId, HandlerId, JobId, JobOrigin, JobRecord, JobSpec, StateCounts};
use crate::store::{JobFilter, Store, StoredJob};

/// Told how a report ended: applied (durably) or refused with its reason.
pub type Answer = Box<dyn FnOnce(Result<(), Rejection>) + Send>;

/// What a handler's report of its running attempts changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Attempts it runs that it holds: kept as they are.
    pub adopted: usize,
    /// Attempts it held and no longer runs: lost, uncounted.
    pub dropped: usize,
    /// Attempts of jobs led here that it runs and does not hold (taken
    /// back while it was away, or never given): it must stop them.
    pub not_held: Vec<AttemptId>,
    /// Attempts it runs of jobs not led here: another instance's, or of a
    /// job ended, or of one being adopted here and not loaded yet.
    pub not_led_here: Vec<AttemptId>,
}

/// Of the attempts a handler runs: those it holds here, and those of jobs
/// not led here (by another instance, or adopted and not loaded yet). Any
/// other was taken back.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Holdings {
    pub held: Vec<AttemptId>,
    pub not_led_here: Vec<AttemptId>,
}

/// A cheap, cloneable handle to a running engine.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
    store: Arc<dyn Store>,
    events: broadcast::Sender<Event>,
    commit_observer: Arc<std::sync::OnceLock<CommitObserver>>,
    lifetime: Lifetime,
}

/// What a handle knows of the engine's life: whether its store takes
/// writes, what stopped it for good, and how to stop it.
#[derive(Clone)]
pub(super) struct Lifetime {
    pub(super) ready: Arc<super::Readiness>,
    pub(super) removals: Arc<AtomicU64>,
    pub(super) fate: crate::fate::Fate,
    /// Ends the loop.
    pub(super) stop: tokio_util::sync::CancellationToken,
    /// Cancelled once the committer wrote its last step and ended.
    pub(super) done: tokio_util::sync::CancellationToken,
    /// The jobs that ended here, by how.
    pub(super) endings: Arc<super::Endings>,
}

impl EngineHandle {
    pub(super) fn new(
        commands: mpsc::Sender<Command>,
        store: Arc<dyn Store>,
        events: broadcast::Sender<Event>,
        commit_observer: Arc<std::sync::OnceLock<CommitObserver>>,
        lifetime: Lifetime,
    ) -> EngineHandle {
        EngineHandle { commands, store, events, commit_observer, lifetime }
    }

    /// What stopped the engine for good, once something has.
    pub fn fate(&self) -> &crate::fate::Fate {
        &self.lifetime.fate
    }

    /// Stops the engine: the loop takes no more commands (those waiting are
    /// answered `Stopped`), and this returns once every step it made is
    /// durable and its actions performed.
    pub async fn close(&self) {
        self.lifetime.stop.cancel();
        self.lifetime.done.cancelled().await;
    }

    /// False while the store is away and nothing can be acknowledged.
    pub fn is_ready(&self) -> bool {
        self.lifetime.ready.is_ready()
    }

    /// The jobs that ended at this engine since it started, by how.
    pub fn endings(&self) -> [(crate::model::JobState, u64); 3] {
        self.lifetime.endings.counts()
    }

    /// How long the store has taken writes without a break, if it does now.
    pub fn ready_for(&self) -> Option<std::time::Duration> {
        self.lifetime.ready.ready_for()
    }

    /// Sets (or with `None` removes) settings, written with the engine's
    /// other steps; answers once they are durable.
    pub async fn put_settings(&self, settings: Vec<(String, Option<Vec<u8>>)>) -> Result<(), Error> {
        self.call(|reply| JobCommand::PutSettings { settings, reply }.into()).await
    }

    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, Error> {
        let (tx, rx) = oneshot::channel();
        self.commands.send(make(tx)).await.map_err(|_| Error::Stopped)?;
        rx.await.map_err(|_| Error::Stopped)
    }

    async fn send(&self, command: Command) -> Result<(), Error> {
        self.commands.send(command).await.map_err(|_| Error::Stopped)
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Persists a validated job; returns its id once it is durable.
    pub async fn submit(&self, spec: JobSpec, origin: JobOrigin) -> Result<JobId, Error> {
        self.submit_recorded(spec, origin, |_| None).await
    }

    /// Submits a job and, in the same step, the audit record `audit` makes of its id.
    pub async fn submit_recorded(
        &self,
        spec: JobSpec,
        origin: JobOrigin,
        audit: impl FnOnce(JobId) -> Option<audit::Entry>,
    ) -> Result<JobId, Error> {
        let (spec, id) = (Arc::new(spec), JobId::new());
        let audit = audit(id);
        self.call(|reply| JobCommand::Submit { id, spec, origin, audit, reply }.into()).await?
    }

    /// Submits a job and, in the same step, the settings `settings` makes of its id.
    pub async fn submit_with(
        &self,
        spec: JobSpec,
        origin: JobOrigin,
        settings: impl FnOnce(JobId) -> Vec<(String, Option<Vec<u8>>)>,
    ) -> Result<JobId, Error> {
        let (spec, id) = (Arc::new(spec), JobId::new());
        let settings = settings(id);
        self.call(|reply| JobCommand::SubmitWith { id, spec, origin, settings, reply }.into()).await?
    }

    /// Reports that an attempt began executing.
    pub async fn started(&self, attempt: AttemptId, handler: HandlerId) -> Result<Result<(), Rejection>, Error> {
        self.call(|reply| ReportCommand::Started { attempt, handler, reply: Some(reply) }.into()).await
    }

    /// Reports an attempt's outcome; the answer comes once the step is durable.
    pub async fn complete(
        &self,
        attempt: AttemptId,
        handler: HandlerId,
        outcome: Outcome,
    ) -> Result<Result<(), Rejection>, Error> {
        let (tx, rx) = oneshot::channel();
        let answer: Answer = Box::new(move |result| {
            let _ = tx.send(result);
        });
        let answer = Some(answer);
        self.send(ReportCommand::Complete { attempt, handler, outcome, received: None, waited_ms: 0, answer }.into())
            .await?;
        rx.await.map_err(|_| Error::Stopped)
    }

    /// Reports an attempt's outcome without waiting for the step: `answer`,
    /// if given, is told once the step is durable or the report refused (a
    /// refusal is logged either way). `received` is when the report reached
    /// the server, for a worker of another process.
    pub async fn report(
        &self,
        attempt: AttemptId,
        handler: HandlerId,
        outcome: Outcome,
        received: Option<std::time::Instant>,
        answer: Option<Answer>,
    ) -> Result<(), Error> {
        self.send(ReportCommand::Complete { attempt, handler, outcome, received, waited_ms: 0, answer }.into()).await
    }

    /// The handler gave an attempt up without an outcome: at capacity
    /// (uncounted), or its lease ran out (lost with its worker). The task is
    /// ready again unless that takes it past its lost-attempt limit.
    pub async fn give_up(
        &self,
        attempt: AttemptId,
        handler: HandlerId,
        loss: Loss,
        answer: Option<Answer>,
    ) -> Result<(), Error> {
        self.send(ReportCommand::GiveUp { attempt, handler, loss, answer }.into()).await
    }

    pub async fn cancel(&self, job: JobId) -> Result<(), Error> {
        self.cancel_recorded(job, None).await
    }

    /// Cancels a job and writes `audit` in the same step, if the cancel is taken.
    pub async fn cancel_recorded(&self, job: JobId, audit: Option<audit::Entry>) -> Result<(), Error> {
        match self.call(|reply| JobCommand::Cancel { job, audit, reply }.into()).await? {
            Err(Error::JobEnded(_)) if self.stored(job).await?.is_none() => Err(Error::UnknownJob(job)),
            other => other,
        }
    }

    /// Gives every task of a running job a priority, and writes `audit` in
    /// the same step, if the change is taken.
    pub async fn set_priority_recorded(
        &self,
        job: JobId,
        priority: crate::model::Priority,
        audit: Option<audit::Entry>,
    ) -> Result<(), Error> {
        match self.call(|reply| JobCommand::SetPriority { job, priority, audit, reply }.into()).await? {
            Err(Error::JobEnded(_)) if self.stored(job).await?.is_none() => Err(Error::UnknownJob(job)),
            other => other,
        }
    }

    /// The priority an operator gave a job while it ran, if it has one.
    pub async fn job_priority(&self, job: JobId) -> Result<Option<crate::model::Priority>, Error> {
        let store = self.store.clone();
        let key = format!("{}{job}", super::core::PRIORITY_PREFIX);
        let settings =
            tokio::task::spawn_blocking(move || store.settings(&key)).await.map_err(|_| Error::Stopped)??;
        Ok(settings.first().and_then(|(_, value)| serde_json::from_slice(value).ok()))
    }

    /// Retries the failed part of an ended job.
    pub async fn retry(&self, job: JobId) -> Result<(), Error> {
        self.retry_recorded(job, None).await
    }

    /// Retries a job and writes `audit` in the same step, if the retry is taken.
    pub async fn retry_recorded(&self, job: JobId, audit: Option<audit::Entry>) -> Result<(), Error> {
        loop {
            // A removal taken between the read and the retry may have been this job's.
            let removals = self.lifetime.removals.load(Ordering::Acquire);
            let stored = self.stored(job).await?.ok_or(Error::UnknownJob(job))?;
            if let Some(result) = self
                .call(|reply| JobCommand::Retry { job: stored, removals, audit: audit.clone(), reply }.into())
                .await?
            {
                return result;
            }
        }
    }

    /// Removes ended jobs with everything they own (retention); jobs led
    /// here, or not ended in the store by then, are left alone. Answers
    /// once the removal is durable.
    pub async fn remove(&self, jobs: Vec<JobId>) -> Result<usize, Error> {
        self.call(|reply| JobCommand::Remove { jobs, reply }.into()).await
    }

    /// Reports the timing of every group commit from now on; the first observer set stays.
    pub fn on_commit(&self, observer: CommitObserver) {
        let _ = self.commit_observer.set(observer);
    }

    /// Every durable change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// How many subscriptions to the durable changes are open.
    pub fn subscribers(&self) -> usize {
        self.events.receiver_count()
    }

    /// Progress of an attempt; the first report also marks it running.
    pub async fn progress(&self, attempt: AttemptId, handler: HandlerId, progress: Progress) -> Result<(), Error> {
        self.send(ReportCommand::Progress { attempt, handler, progress }.into()).await
    }

    /// The slot total a handler reports about itself.
    pub async fn handler_slots(&self, handler: HandlerId, total: u32) -> Result<(), Error> {
        self.send(HandlerCommand::HandlerSlots { handler, total }.into()).await
    }

    /// The handler runs `running` attempts this instance does not hold: its
    /// slots they take are not free.
    pub async fn handler_elsewhere(&self, handler: HandlerId, running: u32) -> Result<(), Error> {
        self.send(HandlerCommand::HandlerElsewhere { handler, running }.into()).await
    }

    /// The endpoints that now want each kind of notification: a job that
    /// ends from the next step on puts its event in the outbox for them.
    pub async fn set_notify(&self, routes: crate::model::notify::Routes) -> Result<(), Error> {
        self.send(JobCommand::SetNotify { routes }.into()).await
    }

    pub async fn set_limits(&self, job_type: Arc<str>, limits: TypeLimits) -> Result<(), Error> {
        self.send(JobCommand::SetLimits { job_type, limits }.into()).await
    }

    /// A job type's maintenance windows (`None`: always open), applied at once.
    pub(crate) async fn set_window(
        &self,
        job_type: Arc<str>,
        window: Option<Arc<crate::windows::Window>>,
    ) -> Result<(), Error> {
        self.send(JobCommand::SetWindow { job_type, window }.into()).await
    }

    /// The database's clock is `offset_ms` ahead of this machine's: the
    /// maintenance windows follow it.
    pub(crate) async fn database_clock(&self, offset_ms: i64) -> Result<(), Error> {
        self.send(ClusterCommand::DatabaseTime { offset_ms }.into()).await
    }

    /// The terms of a demanding operator on `job_type`, for the benchmarks:
    /// a weekly window open all week, a rate limit no run reaches, and a
    /// bandwidth budget of its own (`budgeted`) or of other types.
    #[cfg(any(test, feature = "testsuite"))]
    pub async fn set_bench_terms(&self, job_type: &str, budgeted: bool) -> Result<(), Error> {
        let calendar = crate::windows::parse_windows("Mon-Sun 00:00-24:00 UTC").expect("a window of every day");
        let window = crate::windows::Window { calendar, on_close: crate::windows::OnClose::Drain, grace_seconds: 60 };
        self.set_window(Arc::from(job_type), Some(Arc::new(window))).await?;
        let budget = crate::budget::Budget { cluster: 1 << 50, per_server: None, minimum: 1 };
        self.set_budget(Some(budget), [(Arc::from(job_type), budgeted)].into()).await?;
        self.set_bench_limits(job_type, true).await
    }

    /// For the benchmarks: concurrency limits on `job_type` no run reaches,
    /// as a server gives every job type its workers declare, with a rate
    /// limit no run reaches either (`rate`) or none.
    #[cfg(any(test, feature = "testsuite"))]
    pub async fn set_bench_limits(&self, job_type: &str, rate: bool) -> Result<(), Error> {
        let rate = rate.then_some(crate::rate::Rate { per_minute: u32::MAX, burst: u32::MAX });
        let limits = TypeLimits { global: 1 << 30, per_worker: 1 << 30, execution_timeout_seconds: None, rate };
        self.set_limits(Arc::from(job_type), limits).await
    }

    /// The bandwidth budget (or none), and the job types whose policy says
    /// whether they share it.
    pub(crate) async fn set_budget(
        &self,
        budget: Option<crate::budget::Budget>,
        marks: std::collections::HashMap<Arc<str>, bool>,
    ) -> Result<(), Error> {
        self.send(JobCommand::SetBudget { budget, marks }.into()).await
    }

    /// The active jobs and the handlers that are connected (or whose
    /// attempts still wait for them), for the recovery rules.
    pub async fn recovery_snapshot(&self) -> Result<(Vec<recovery::JobSnapshot>, Vec<HandlerId>), Error> {
        self.call(|reply| Query::RecoverySnapshot { reply }.into()).await
    }

    /// Applies recovery actions; for each, whether it changed anything. Answers once the changes are durable.
    pub async fn apply_recovery(&self, actions: Vec<(recovery::Rule, recovery::Action)>) -> Result<Vec<bool>, Error> {
        self.call(|reply| JobCommand::ApplyRecovery { actions, reply }.into()).await
    }

    /// The attempts a handler runs now. With `dropped_before` (its first
    /// report after connecting), those it was given before then, no longer
    /// runs and did not report on (`reported`, outcomes sent on to another
    /// instance) are lost, uncounted. The command takes its place among the
    /// handler's other reports at once; the answer comes once it is durable.
    pub async fn reconcile(
        &self,
        handler: HandlerId,
        running: HashSet<AttemptId>,
        reported: HashSet<AttemptId>,
        dropped_before: Option<Timestamp>,
    ) -> Result<oneshot::Receiver<Reconciled>, Error> {
        let (reply, answer) = oneshot::channel();
        self.send(HandlerCommand::Reconcile { handler, running, reported, dropped_before, reply }.into()).await?;
        Ok(answer)
    }

    /// Sets which job types run only while the gate is open, and whether it
    /// is; answers how many attempts of those types are queued and running.
    pub async fn gate(&self, gated: Vec<Arc<str>>, open: bool) -> Result<(usize, u32), Error> {
        self.call(|reply| JobCommand::Gate { gated, open, reply }.into()).await
    }

    /// The dedupe keys (label `dedupe_key`) of every task that has not ended.
    pub async fn active_dedupe_keys(&self) -> Result<HashSet<String>, Error> {
        self.call(|reply| Query::ActiveDedupeKeys { reply }.into()).await
    }

    /// A handler (re)connected; the attempts it already holds keep their slots.
    pub async fn connected(&self, spec: HandlerSpec) -> Result<(), Error> {
        self.send(HandlerCommand::Connected { spec }.into()).await
    }

    /// A handler's session ended. With `keep_for`, its attempts wait that
    /// long for it to come back (it keeps running them), then are lost with
    /// their worker; without, they are lost now.
    pub async fn disconnected(
        &self,
        handler: HandlerId,
        session: u64,
        keep_for: Option<Duration>,
        reason: &str,
    ) -> Result<(), Error> {
        self.send(HandlerCommand::Disconnected { handler, session, keep_for, reason: reason.to_string() }.into()).await
    }

    /// Every attempt the handler holds is lost now, and it gets no more work.
    pub async fn handler_gone(&self, handler: HandlerId, loss: Loss) -> Result<(), Error> {
        self.send(HandlerCommand::HandlerGone { handler, loss }.into()).await
    }

    /// A job with all its tasks, active or ended.
    pub async fn job(&self, job: JobId) -> Result<Option<StoredJob>, Error> {
        match self.call(|reply| Query::Get { job, reply }.into()).await? {
            Some(active) => Ok(Some(active)),
            None => self.stored(job).await,
        }
    }

    /// Every attempt held now, for jobs led here.
    pub async fn attempts(&self) -> Result<Vec<super::HeldAttempt>, Error> {
        self.call(|reply| Query::Attempts { reply }.into()).await
    }

    /// One task of a job by its id, without copying the rest of the job
    /// when it is led here; `None` when the job or the task is unknown.
    pub async fn task(&self, job: JobId, task: &str) -> Result<Option<super::OneTask>, Error> {
        let owned = super::TaskKey::Id(task.to_string());
        if let Some(found) = self.call(|reply| Query::Task { job, task: owned, reply }.into()).await? {
            return Ok(found);
        }
        Ok(self.stored(job).await?.and_then(|stored| {
            let idx = stored.spec.tasks.iter().position(|t| &*t.id == task)?;
            Some((stored.spec.clone(), idx, stored.tasks[idx].clone()))
        }))
    }

    /// One task of a job led here by its index; `None` when the job is not
    /// led here or has no such task.
    pub async fn task_at(&self, job: JobId, idx: usize) -> Result<Option<super::OneTask>, Error> {
        let key = super::TaskKey::Index(idx);
        Ok(self.call(|reply| Query::Task { job, task: key, reply }.into()).await?.flatten())
    }

    /// Every job led here, each whole, as of one step that is durable when
    /// this answers, and that step's time.
    pub async fn snapshot(&self) -> Result<(Timestamp, Vec<StoredJob>), Error> {
        self.call(|reply| Query::Snapshot { reply }.into()).await
    }

    pub async fn summary(&self, job: JobId) -> Result<Option<Summary>, Error> {
        match self.call(|reply| Query::Summary { job, reply }.into()).await? {
            Some(summary) => Ok(Some(summary)),
            None => Ok(self.stored(job).await?.map(|stored| {
                let mut counts = StateCounts::default();
                for task in &stored.tasks {
                    counts.add(task.state());
                }
                Summary { record: stored.record, counts }
            })),
        }
    }

    /// Waits until the job has ended and returns its final record. A job
    /// led by another instance (several on one store) is watched in the store.
    pub async fn wait(&self, job: JobId) -> Result<JobRecord, Error> {
        loop {
            match self.call(|reply| Query::Wait { job, reply }.into()).await? {
                Some(record) => return Ok(record),
                None => match self.stored(job).await? {
                    Some(stored) if stored.record.state.is_terminal() => return Ok(stored.record),
                    Some(_) if self.store.cluster().is_some() => {
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    Some(_) => return Err(Error::Stopped),
                    None => return Err(Error::UnknownJob(job)),
                },
            }
        }
    }

    /// Takes the lead of jobs claimed from the store; returns how many were new here.
    pub async fn adopt(&self, jobs: Vec<StoredJob>) -> Result<usize, Error> {
        let store = self.store.clone();
        let priorities = tokio::task::spawn_blocking(move || store.settings(super::core::PRIORITY_PREFIX))
            .await
            .map_err(|_| Error::Stopped)??;
        self.call(|reply| ClusterCommand::Adopt { jobs, priorities, reply }.into()).await
    }

    /// Stops leading up to `up_to` idle jobs; answers once that is durable.
    pub async fn release(&self, up_to: usize) -> Result<Vec<JobId>, Error> {
        self.call(|reply| ClusterCommand::Release { up_to, reply }.into()).await
    }

    /// Reserves the free slots no task queued here can use, to offer them
    /// to jobs other instances lead; give back what is not used with `borrowed`.
    pub async fn reserve(&self) -> Result<Vec<FreeSlots>, Error> {
        self.call(|reply| ClusterCommand::Reserve { reply }.into()).await
    }

    /// Hands attempts another instance lent to `handler` for `reserved`
    /// reserved slots; returns those it could not take (the handler left).
    pub async fn borrowed(
        &self,
        handler: HandlerId,
        reserved: u32,
        lent: Vec<Assignment>,
    ) -> Result<Vec<Assignment>, Error> {
        self.call(|reply| ClusterCommand::Borrowed { handler, reserved, lent, reply }.into()).await
    }

    /// A borrowed attempt's report was settled with its leader: its slot is free.
    pub async fn return_borrowed(&self, attempt: AttemptId) -> Result<(), Error> {
        self.send(ClusterCommand::ReturnBorrowed { attempt }.into()).await
    }

    /// Lends queued tasks to another instance's handlers; answers once the
    /// assignments are durable.
    pub async fn lend(&self, slots: Vec<FreeSlots>) -> Result<Vec<(HandlerId, Assignment)>, Error> {
        self.call(|reply| ClusterCommand::Lend { slots, reply }.into()).await
    }

    /// What this instance asks of the cluster's permits: limited job types and resources.
    pub async fn permit_demand(&self) -> Result<crate::dispatch::Demand, Error> {
        self.call(|reply| ClusterCommand::PermitDemand { reply }.into()).await
    }

    /// In a cluster: the slots of each type's global limit this instance
    /// holds, and the resources (volumes) whose lock it holds.
    pub async fn set_permits(
        &self,
        permits: std::collections::HashMap<Arc<str>, u32>,
        resources: std::collections::HashSet<String>,
    ) -> Result<(), Error> {
        self.send(ClusterCommand::SetPermits { permits, resources }.into()).await
    }

    /// In a cluster: the slots of the bandwidth budget's permits this instance holds.
    pub(crate) async fn set_budget_permits(&self, held: crate::budget::Held) -> Result<(), Error> {
        self.send(ClusterCommand::SetBudgetPermits { held }.into()).await
    }

    /// The shares of the bandwidth budget the store keeps (settings under
    /// `SHARE_SETTINGS`), read before jobs are adopted.
    pub async fn keep_shares(&self, shares: Vec<(String, Vec<u8>)>) -> Result<(), Error> {
        self.send(ClusterCommand::KeepShares { shares }.into()).await
    }

    /// The handlers connected to the other live instances.
    pub async fn peer_handlers(&self, handlers: HashSet<HandlerId>) -> Result<(), Error> {
        self.send(ClusterCommand::PeerHandlers { handlers }.into()).await
    }

    /// A worker without a lease (it drops its work with its stream)
    /// connected as `handler` under its worker id `name`: what another
    /// handler of the same worker held while away ends now. Answers it.
    pub async fn returned(&self, handler: HandlerId, name: Arc<str>) -> Result<Vec<super::Returned>, Error> {
        self.call(|reply| HandlerCommand::Returned { handler, name, reply }.into()).await
    }

    /// Of these attempts, which the handler holds here and which are of jobs not led here.
    pub async fn holds(&self, handler: HandlerId, attempts: Vec<AttemptId>) -> Result<Holdings, Error> {
        self.call(|reply| HandlerCommand::Holds { handler, attempts, reply }.into()).await
    }

    /// Another instance renews the handler's lease for these attempts: of
    /// those it holds here (answered), none is taken back before `keep`.
    pub async fn vouch(
        &self,
        handler: HandlerId,
        attempts: Vec<AttemptId>,
        keep: Duration,
    ) -> Result<Vec<AttemptId>, Error> {
        self.call(|reply| HandlerCommand::Vouch { handler, attempts, keep, reply }.into()).await
    }

    pub async fn active_jobs(&self) -> Result<Vec<JobRecord>, Error> {
        self.call(|reply| Query::ActiveJobs { reply }.into()).await
    }

    pub async fn list(&self, filter: JobFilter) -> Result<Vec<JobRecord>, Error> {
        let store = self.store.clone();
        Ok(tokio::task::spawn_blocking(move || store.list_jobs(&filter)).await.map_err(|_| Error::Stopped)??)
    }

    async fn stored(&self, job: JobId) -> Result<Option<StoredJob>, Error> {
        let store = self.store.clone();
        Ok(tokio::task::spawn_blocking(move || store.get_job(job)).await.map_err(|_| Error::Stopped)??)
    }
}

//! The schedules duty: runs each schedule's job file when its calendar says
//! (`crate::model::schedule`), honouring its overlap policy, its pause and
//! its catch-up rule after a time when no admin ran; and the changes the
//! API makes to schedules (add, pause, resume, remove, run now).
//!
//! Each run is submitted with the schedule's last run (`LastRun`) in the
//! same step, so a restart neither repeats nor skips a run. Among several
//! instances, a run is claimed in the database first (`Cluster::claim_schedule_run`):
//! one instance claims each slot; a claim whose instance is no longer
//! active is taken over by a live one, which starts the run unless the last
//! run stored says it was started (an instance no longer active writes
//! nothing more, so what is stored then is final).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;

use crate::clock::Clock;
use crate::engine::{self, EngineHandle};
use crate::jobfile::{self, Format, Limits};
use crate::model::schedule::{self, Due, LastRun, Overlap, Schedule, Stored, Terms};
use crate::model::{JobId, JobOrigin, JobSpec};
use crate::server::cluster::peer::Peers;
use crate::server::cluster::{self, Topology};
use crate::store::cluster::RunClaim;

/// The longest the loop sleeps: how soon a change made on another instance,
/// or a claim held by an instance that died, is seen.
const MOST_SLEEP: Duration = Duration::from_secs(1);

/// Why a change to schedules was refused or failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error(transparent)]
    Invalid(#[from] schedule::Error),
    /// The job file breaks the rules: every problem.
    #[error("{0}")]
    Rejected(jobfile::Error),
    #[error("no schedule {0:?}: see `jobcenter schedule list`")]
    NotFound(String),
    #[error("schedule {0:?} exists: remove it first, or choose another name")]
    Exists(String),
    #[error(transparent)]
    Engine(#[from] engine::Error),
    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

/// A schedule as listed: its terms, its next run and its last.
#[derive(Clone, Debug)]
pub(crate) struct Listed {
    pub(crate) schedule: Schedule,
    pub(crate) last: LastRun,
    /// When its next run starts, ms since the epoch; `None` while paused.
    pub(crate) next_ms: Option<i64>,
}

/// The duty and the changes: the engine that submits runs and writes
/// schedules, the clock (the database's in a cluster), the links to other
/// instances (to cancel a run another one leads), and what a job may hold.
pub(crate) struct Schedules {
    pub(crate) engine: EngineHandle,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) topology: Topology,
    pub(crate) peers: Peers,
    pub(crate) limits: Limits,
    /// The job types' policies: a task that names no priority takes its type's.
    policies: crate::server::policies::Policies,
    /// When this instance's loop first ran: a run that came due before came
    /// due while no admin ran, as far as this one knows.
    up_since: OnceLock<i64>,
    /// Slots that catch-up left, per schedule: not looked at again.
    missed: Mutex<HashMap<String, i64>>,
    wake: Notify,
    crash: crate::crash::CrashPoint,
}

fn format_of(text: &str) -> Format {
    match text {
        "toml" => Format::Toml,
        "yaml" | "yml" => Format::Yaml,
        _ => Format::Json,
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, crate::store::Error> + Send + 'static,
) -> Result<T, crate::store::Error> {
    tokio::task::spawn_blocking(work).await.map_err(|e| crate::store::Error::Io(crate::fate::panic_text(e)))?
}

fn setting(key: String, value: &impl serde::Serialize) -> (String, Option<Vec<u8>>) {
    (key, Some(serde_json::to_vec(value).expect("a schedule is JSON")))
}

fn last_run_setting(name: &str, last: &LastRun) -> (String, Option<Vec<u8>>) {
    setting(format!("{}{name}", schedule::RUN_PREFIX), last)
}

impl Schedules {
    pub(crate) fn new(
        engine: EngineHandle,
        clock: Arc<dyn Clock>,
        topology: Topology,
        peers: Peers,
        limits: Limits,
        policies: crate::server::policies::Policies,
    ) -> Schedules {
        Schedules {
            engine,
            clock,
            topology,
            peers,
            limits,
            policies,
            up_since: OnceLock::new(),
            missed: Mutex::default(),
            wake: Notify::new(),
            crash: crate::crash::CrashPoint::from_env(),
        }
    }

    /// Now: the database's clock in a cluster, this machine's alone.
    fn now(&self) -> i64 {
        match self.topology.member() {
            Some(node) => node.db_now_ms(),
            None => self.clock.now().as_millis(),
        }
    }

    /// Every schedule stored, and each one's last run.
    async fn load(&self) -> Result<Vec<(Schedule, LastRun)>, crate::store::Error> {
        let store = self.engine.store().clone();
        let all = blocking(move || store.settings_any(&[schedule::PREFIX, schedule::RUN_PREFIX])).await?;
        let runs: HashMap<String, LastRun> = all
            .iter()
            .filter_map(|(key, bytes)| {
                let name = key.strip_prefix(schedule::RUN_PREFIX)?;
                Some((name.to_string(), serde_json::from_slice(bytes).ok()?))
            })
            .collect();
        let mut out = Vec::new();
        for (key, bytes) in all.iter().filter(|(key, _)| key.starts_with(schedule::PREFIX)) {
            let checked = serde_json::from_slice::<Stored>(bytes)
                .map_err(|e| e.to_string())
                .and_then(|stored| Schedule::from_stored(stored).map_err(|e| e.to_string()));
            match checked {
                Ok(schedule) => {
                    let last = runs.get(&schedule.name).cloned().unwrap_or_default();
                    out.push((schedule, last));
                }
                Err(e) => tracing::error!(key, error = %e, "a stored schedule cannot be read"),
            }
        }
        Ok(out)
    }

    /// One schedule and its last run, read now.
    async fn one(&self, name: &str) -> Result<(Schedule, LastRun), Error> {
        schedule::check_name(name)?;
        let store = self.engine.store().clone();
        let (key, run_key) = (format!("{}{name}", schedule::PREFIX), format!("{}{name}", schedule::RUN_PREFIX));
        let (stored, run) = blocking(move || {
            let exact = |prefix: &str, key: &str| -> Result<Option<Vec<u8>>, crate::store::Error> {
                Ok(store.settings(prefix)?.into_iter().find(|(k, _)| k == key).map(|(_, v)| v))
            };
            Ok((exact(&key, &key)?, exact(&run_key, &run_key)?))
        })
        .await?;
        let stored = stored.ok_or_else(|| Error::NotFound(name.to_string()))?;
        let stored: Stored = serde_json::from_slice(&stored).map_err(|e| crate::store::Error::Io(e.to_string()))?;
        let last = run.and_then(|bytes| serde_json::from_slice(&bytes).ok()).unwrap_or_default();
        Ok((Schedule::from_stored(stored)?, last))
    }

    /// The job file of a schedule, checked as a submitted one is.
    fn spec(&self, schedule: &Schedule) -> Result<JobSpec, jobfile::Error> {
        let source = format!("schedule {}", schedule.name);
        let type_priority = |job_type: &str| self.policies.effective(job_type).0.priority;
        let format = format_of(&schedule.format);
        jobfile::parse_with(schedule.job_file.as_bytes(), format, &source, &self.limits, &type_priority)
    }

    /// The name of the job each run of `schedule` makes; empty if its file no longer passes.
    pub(crate) fn job_name(&self, schedule: &Schedule) -> String {
        self.spec(schedule).map(|spec| spec.name.to_string()).unwrap_or_default()
    }

    /// The loop: every second at most, each schedule's due runs.
    pub(crate) async fn runs(self: Arc<Self>) {
        let up_since = *self.up_since.get_or_init(|| self.now());
        loop {
            let next = match self.load().await {
                Ok(all) => {
                    let mut next: Option<i64> = None;
                    for (schedule, last) in all {
                        let at = self.visit(&schedule, last, up_since).await;
                        next = match (next, at) {
                            (Some(a), Some(b)) => Some(a.min(b)),
                            (a, b) => a.or(b),
                        };
                    }
                    next
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the schedules");
                    None
                }
            };
            let wait = next.map_or(MOST_SLEEP, |at| Duration::from_millis(u64::try_from(at - self.now()).unwrap_or(0)));
            tokio::select! {
                () = tokio::time::sleep(wait.clamp(Duration::from_millis(20), MOST_SLEEP)) => {}
                () = self.wake.notified() => {}
            }
        }
    }

    /// Wakes the loop: a schedule changed.
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    /// Does what one schedule asks now; answers when it next needs a look.
    async fn visit(&self, schedule: &Schedule, last: LastRun, up_since: i64) -> Option<i64> {
        let name = &schedule.name;
        if let Some(queued) = last.queued.filter(|_| !schedule.paused) {
            if let Err(e) = self.start_queued(schedule, &last, queued).await {
                tracing::warn!(schedule = name, error = %e, "a queued run did not start");
            }
        }
        let missed = self.missed.lock().expect("missed lock").get(name).copied();
        let decided = match (last.slot, missed) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        match schedule.due(decided, up_since, self.now()) {
            Due::Wait { at } => at,
            Due::Missed { slot } => {
                let count = schedule.slots_between(decided.unwrap_or(schedule.since_ms - 1), slot, 1000).len();
                tracing::info!(schedule = name, slot, count, "runs missed while no admin ran are not caught up");
                self.missed.lock().expect("missed lock").insert(name.clone(), slot);
                schedule.next_start(Some(slot))
            }
            Due::Run { slot, caught_up } => {
                match self.run(schedule, slot, caught_up).await {
                    Ok(()) => {}
                    // A job file that no longer passes (the limits changed) is not tried again for this slot.
                    Err(e @ Error::Rejected(_)) => {
                        tracing::error!(schedule = name, slot, error = %e, "a scheduled run was refused");
                        self.missed.lock().expect("missed lock").insert(name.clone(), slot);
                    }
                    Err(e) => tracing::warn!(schedule = name, slot, error = %e, "a scheduled run did not start"),
                }
                // Looked at again soon: a claim another instance holds may be free by then.
                Some(self.now() + 250)
            }
        }
    }

    /// Claims a run among several instances: `None` when another has it, or
    /// when the run was started already (a claim taken over from an
    /// instance no longer active, whose writes are all in); otherwise the
    /// last run as it stands now.
    async fn claim(&self, key: String, slot: i64, name: &str) -> Result<Option<LastRun>, Error> {
        let Some(node) = self.topology.member().cloned() else {
            return Ok(Some(self.one(name).await?.1));
        };
        let store = self.engine.store().clone();
        let claimed = blocking(move || store.cluster().expect("cluster").claim_schedule_run(&key, slot)).await;
        match claimed {
            Ok(RunClaim::Held) => Ok(None),
            Ok(RunClaim::Fresh) => {
                self.crash.reached("schedule-claimed");
                Ok(Some(self.one(name).await?.1))
            }
            Ok(RunClaim::TakenOver) => Ok(Some(self.one(name).await?.1)),
            Err(crate::store::Error::Fenced { .. }) => {
                cluster::deactivated(&self.engine, &node);
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Starts the run of `slot`, as the overlap policy says.
    async fn run(&self, schedule: &Schedule, slot: i64, caught_up: bool) -> Result<(), Error> {
        let name = &schedule.name;
        let Some(last) = self.claim(name.clone(), slot, name).await? else { return Ok(()) };
        if last.slot.is_some_and(|done| done >= slot) {
            return Ok(());
        }
        let previous = match &last.job {
            Some(job) => self.active(job).await?,
            None => None,
        };
        let now = self.now();
        let outcome = if caught_up { "caught_up" } else { "started" };
        let Some(previous) = previous else {
            return self
                .start(schedule, slot, LastRun { slot: Some(slot), at_ms: now, outcome: outcome.into(), ..last })
                .await;
        };
        match schedule.overlap {
            Overlap::Allow => {
                let next = LastRun { slot: Some(slot), at_ms: now, outcome: outcome.into(), ..last };
                self.start(schedule, slot, next).await
            }
            Overlap::CancelRunning => {
                self.cancel(previous).await;
                tracing::info!(schedule = name, job.id = %previous, "the running run is canceled for the next");
                let next = LastRun { slot: Some(slot), at_ms: now, outcome: outcome.into(), ..last };
                self.start(schedule, slot, next).await
            }
            Overlap::Skip => {
                tracing::info!(schedule = name, slot, job.id = %previous, "run skipped: the previous run is still active");
                let next = LastRun { slot: Some(slot), at_ms: now, outcome: "skipped".into(), ..last };
                Ok(self.engine.put_settings(vec![last_run_setting(name, &next)]).await?)
            }
            Overlap::QueueOne => {
                tracing::info!(schedule = name, slot, job.id = %previous, "run queued: the previous run is still active");
                let next =
                    LastRun { slot: Some(slot), at_ms: now, outcome: "queued".into(), queued: Some(slot), ..last };
                Ok(self.engine.put_settings(vec![last_run_setting(name, &next)]).await?)
            }
        }
    }

    /// Starts the queued run once the run before it has ended.
    async fn start_queued(&self, schedule: &Schedule, last: &LastRun, queued: i64) -> Result<(), Error> {
        if let Some(job) = &last.job {
            if self.active(job).await?.is_some() {
                return Ok(());
            }
        }
        let name = &schedule.name;
        let Some(last) = self.claim(format!("{name}/queued"), queued, name).await? else { return Ok(()) };
        if last.queued != Some(queued) {
            return Ok(());
        }
        let next = LastRun { at_ms: self.now(), outcome: "started".into(), queued: None, ..last };
        self.start(schedule, queued, next).await
    }

    /// Submits a run of `slot` with `next` (its job filled in) in the same step.
    async fn start(&self, schedule: &Schedule, slot: i64, next: LastRun) -> Result<(), Error> {
        let spec = self.spec(schedule).map_err(Error::Rejected)?;
        let name = schedule.name.clone();
        let origin = JobOrigin::Schedule { name: name.clone(), slot };
        let job = self
            .engine
            .submit_with(spec, origin, |id| {
                vec![last_run_setting(&name, &LastRun { job: Some(id.to_string()), ..next })]
            })
            .await?;
        tracing::info!(schedule = name, slot, job.id = %job, "schedule run started");
        Ok(())
    }

    /// The job, if it has not ended.
    async fn active(&self, job: &str) -> Result<Option<JobId>, Error> {
        let Ok(id) = job.parse::<JobId>() else { return Ok(None) };
        match self.engine.summary(id).await? {
            Some(summary) if !summary.record.state.is_terminal() => Ok(Some(id)),
            _ => Ok(None),
        }
    }

    /// Cancels a run, here or on the instance that leads it.
    async fn cancel(&self, job: JobId) {
        match self.engine.cancel(job).await {
            Err(engine::Error::JobEnded(_)) if self.topology.member().is_some() => {}
            Err(e) => {
                tracing::warn!(job.id = %job, error = %e, "cannot cancel the running run");
                return;
            }
            Ok(()) => return,
        }
        let store = self.engine.store().clone();
        let whereabouts = blocking(move || Ok(store.cluster().map(|c| c.whereabouts(job)))).await;
        let Ok(Some(Ok(Some(where_it_is)))) = whereabouts else { return };
        let Some(owner) = where_it_is.owner.filter(|_| !where_it_is.state.is_terminal()) else { return };
        let cancel = async {
            let mut client = self.peers.job_service(&owner.grpc_address).await?;
            let request =
                self.peers.request_within(crate::proto::api::JobRef { job_id: job.to_string() }, MOST_SLEEP * 30);
            client.cancel_job(request).await.map_err(|s| s.message().to_string())
        };
        if let Err(e) = cancel.await {
            tracing::warn!(job.id = %job, leader = owner.grpc_address, error = %e, "cannot cancel the running run");
        }
    }

    /// Adds a schedule with its audit record; the job file is checked as a submitted one.
    pub(crate) async fn add(
        &self,
        terms: Terms,
        job_file: String,
        format: String,
        audit: Vec<(String, Option<Vec<u8>>)>,
    ) -> Result<Listed, Error> {
        let schedule = Schedule::from_terms(terms, job_file, format, self.now())?;
        self.spec(&schedule).map_err(Error::Rejected)?;
        match self.one(&schedule.name).await {
            Ok(_) => return Err(Error::Exists(schedule.name)),
            Err(Error::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        let mut settings = vec![setting(format!("{}{}", schedule::PREFIX, schedule.name), &schedule.stored())];
        settings.extend(audit);
        self.engine.put_settings(settings).await?;
        self.missed.lock().expect("missed lock").remove(&schedule.name);
        self.wake();
        tracing::info!(schedule = schedule.name, calendar = schedule.terms.calendar, "schedule added");
        Ok(self.listed(schedule, LastRun::default()))
    }

    fn listed(&self, schedule: Schedule, last: LastRun) -> Listed {
        let missed = self.missed.lock().expect("missed lock").get(&schedule.name).copied();
        let decided = last.slot.max(missed);
        let next_ms = schedule.next_start(decided);
        Listed { schedule, last, next_ms }
    }

    /// Every schedule, by name.
    pub(crate) async fn list(&self) -> Result<Vec<Listed>, Error> {
        let all = self.load().await?;
        Ok(all.into_iter().map(|(schedule, last)| self.listed(schedule, last)).collect())
    }

    /// Pauses or resumes a schedule; resumed, no run due while it was paused starts.
    pub(crate) async fn set_paused(
        &self,
        name: &str,
        paused: bool,
        audit: Vec<(String, Option<Vec<u8>>)>,
    ) -> Result<Listed, Error> {
        let (mut schedule, last) = self.one(name).await?;
        if schedule.paused && !paused {
            schedule.since_ms = self.now();
        }
        schedule.paused = paused;
        let mut settings = vec![setting(format!("{}{name}", schedule::PREFIX), &schedule.stored())];
        settings.extend(audit);
        self.engine.put_settings(settings).await?;
        self.wake();
        tracing::info!(schedule = name, paused, "schedule paused or resumed");
        Ok(self.listed(schedule, last))
    }

    /// Removes a schedule and its last run; its runs are left as they are.
    pub(crate) async fn remove(&self, name: &str, audit: Vec<(String, Option<Vec<u8>>)>) -> Result<(), Error> {
        self.one(name).await?;
        let mut settings =
            vec![(format!("{}{name}", schedule::PREFIX), None), (format!("{}{name}", schedule::RUN_PREFIX), None)];
        settings.extend(audit);
        self.engine.put_settings(settings).await?;
        self.missed.lock().expect("missed lock").remove(name);
        tracing::info!(schedule = name, "schedule removed");
        Ok(())
    }

    /// Starts a run now, whatever the calendar, the overlap and the pause
    /// say; the next calendar run still comes due as it would.
    pub(crate) async fn run_now(
        &self,
        name: &str,
        audit: impl FnOnce(JobId) -> Vec<(String, Option<Vec<u8>>)>,
    ) -> Result<JobId, Error> {
        let (schedule, last) = self.one(name).await?;
        let spec = self.spec(&schedule).map_err(Error::Rejected)?;
        let now = self.now();
        let origin = JobOrigin::Schedule { name: name.to_string(), slot: now };
        let job = self
            .engine
            .submit_with(spec, origin, |id| {
                let next = LastRun { job: Some(id.to_string()), at_ms: now, outcome: "run_now".into(), ..last };
                let mut settings = vec![last_run_setting(name, &next)];
                settings.extend(audit(id));
                settings
            })
            .await?;
        tracing::info!(schedule = name, job.id = %job, "schedule run started now");
        Ok(job)
    }
}

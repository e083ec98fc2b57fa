//! The recovery rules: pure checks over a plain snapshot of jobs, tasks and
//! handlers, each finding naming its rule and the action to take. No I/O:
//! the server builds the snapshot, applies the actions through its normal
//! leader and follower steps, and records every finding.
//!
//! The promise they keep: a job always ends completed or failed, never
//! stuck in between holding a resource, whatever fails. Anything the admin
//! did not acknowledge durably is treated as if it never happened; anything
//! it did is carried to an end.
//!
//! | rule | what it finds | action |
//! |---|---|---|
//! | `R1` held-without-handler | a task assigned or running with no handler recorded | resubmit |
//! | `R2` handler-gone | a task held by a handler that is not connected | resubmit |
//! | `R2-undelivered` not-with-its-handler | a task held by a connected handler whose session neither sent it, nor hears it run, nor carries its outcome, for longer than the delivery grace | resubmit |
//! | `R3` handler-silent | a task whose handler has written nothing for longer than the silence timeout | resubmit |
//! | `R3` pinned-node-down | the same, for a task pinned to that node | fail the task |
//! | `R3-progress` no-progress | a running task whose handler writes but that reported no progress for longer than the progress timeout (or twice its estimated runtime, when it declares one) | resubmit |
//! | `R4` ready-not-dispatched | a ready task that is in no dispatch queue | dispatch |
//! | `R5` job-not-finalized | every task ended, the job not finalized for longer than the grace | finalize |
//! | `R6` scheduler-job | any resubmission of a task of a scheduler job | fail the job and its unfinished tasks |
//!
//! R1 stays a check over any snapshot, but jobcenter's own cannot show it:
//! a held task's state carries its handler, and a stored record held with
//! no handler is made ready when it is read.
//!
//! R7 (duplicates and leftovers) holds by construction: every action names
//! the attempt it acts on, and the server refuses an action whose task has
//! moved on, so a finding applied twice, or a stale one, changes nothing; a
//! task that is failed leaves the dispatch queues with its job.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    Pending,
    Ready,
    Assigned,
    Running,
    Succeeded,
    Failed,
    UpstreamFailed,
    Canceled,
}

impl TaskState {
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskState::Succeeded | TaskState::Failed | TaskState::UpstreamFailed | TaskState::Canceled)
    }

    pub fn is_held(self) -> bool {
        matches!(self, TaskState::Assigned | TaskState::Running)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSnapshot {
    pub idx: u32,
    pub id: String,
    pub state: TaskState,
    pub attempt: u32,
    pub handler: Option<String>,
    pub assigned_at: Option<Millis>,
    pub started_at: Option<Millis>,
    pub updated_at: Millis,
    pub finished_at: Option<Millis>,
    /// The node (worker id) the task must run on, if any.
    pub pinned_node: Option<String>,
    /// The task's own no-progress limit, when it declares an estimated
    /// runtime: twice that. The shorter of it and the configured one applies.
    #[serde(default)]
    pub progress_timeout_ms: Option<Millis>,
    /// It sits in a dispatch queue (or waits for its backoff there).
    pub queued: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSnapshot {
    pub id: String,
    /// Not yet finalized (pending or running).
    pub active: bool,
    pub from_scheduler: bool,
    pub updated_at: Millis,
    /// Tasks that have not ended. `tasks` may hold only the tasks that can
    /// need recovery (held and ready ones) and the last to end.
    pub unfinished: usize,
    pub tasks: Vec<TaskSnapshot>,
}

/// A handler the admin knows: connected now, and when it last wrote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandlerSnapshot {
    pub handler: String,
    /// The worker id (node) behind it.
    pub node: String,
    pub last_seen: Millis,
    /// The attempts (job, task index, attempt) the handler's session knows:
    /// sent to the worker on it, reported running by the worker, or with an
    /// outcome on its way to the leader. `None` when that is not known yet
    /// (no heartbeat since the worker connected) or not tracked.
    #[serde(default)]
    pub knows: Option<BTreeSet<(String, u32, u32)>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// A handler silent for longer loses its tasks (default 5 minutes).
    pub silence_timeout_ms: Millis,
    /// A job whose tasks all ended is finalized if still not after this (default 1 minute).
    pub finalize_grace_ms: Millis,
    /// A task held this long without a progress report or any other update
    /// is taken back, however alive its handler is (default 24 hours).
    pub progress_timeout_ms: Millis,
    /// A task assigned this long ago that its live handler does not know
    /// never reached it (its leader died before sending it): taken back
    /// (default 30 s).
    #[serde(default = "default_delivery_grace")]
    pub delivery_grace_ms: Millis,
}

fn default_delivery_grace() -> Millis {
    30 * 1000
}

impl Default for Config {
    fn default() -> Config {
        Config {
            silence_timeout_ms: 5 * 60 * 1000,
            finalize_grace_ms: 60 * 1000,
            progress_timeout_ms: 24 * 3600 * 1000,
            delivery_grace_ms: default_delivery_grace(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub now: Millis,
    pub config: Config,
    /// Connected handlers by handler id.
    pub handlers: BTreeMap<String, HandlerSnapshot>,
    pub jobs: Vec<JobSnapshot>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Rule {
    #[serde(rename = "R1")]
    HeldWithoutHandler,
    #[serde(rename = "R2")]
    HandlerGone,
    #[serde(rename = "R2-undelivered")]
    NotDelivered,
    #[serde(rename = "R3")]
    HandlerSilent,
    #[serde(rename = "R3-pinned")]
    PinnedNodeDown,
    #[serde(rename = "R3-progress")]
    NoProgress,
    #[serde(rename = "R4")]
    ReadyNotDispatched,
    #[serde(rename = "R5")]
    JobNotFinalized,
    #[serde(rename = "R6")]
    SchedulerJob,
}

impl Rule {
    pub fn id(self) -> &'static str {
        match self {
            Rule::HeldWithoutHandler => "R1",
            Rule::HandlerGone => "R2",
            Rule::NotDelivered => "R2-undelivered",
            Rule::HandlerSilent => "R3",
            Rule::PinnedNodeDown => "R3-pinned",
            Rule::NoProgress => "R3-progress",
            Rule::ReadyNotDispatched => "R4",
            Rule::JobNotFinalized => "R5",
            Rule::SchedulerJob => "R6",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Rule::HeldWithoutHandler => "held-without-handler",
            Rule::HandlerGone => "handler-gone",
            Rule::NotDelivered => "not-with-its-handler",
            Rule::HandlerSilent => "handler-silent",
            Rule::PinnedNodeDown => "pinned-node-down",
            Rule::NoProgress => "no-progress",
            Rule::ReadyNotDispatched => "ready-not-dispatched",
            Rule::JobNotFinalized => "job-not-finalized",
            Rule::SchedulerJob => "scheduler-job",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.id(), self.name())
    }
}

/// What the server does about a finding. Task actions name the attempt they
/// act on; the server refuses one whose task has moved on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Action {
    /// Take the attempt back: the task is ready again as a new attempt.
    Resubmit { job: String, task: u32, attempt: u32 },
    /// End the task failed, with its descendants upstream_failed.
    FailTask { job: String, task: u32, attempt: u32 },
    /// Put the ready task in its dispatch queue.
    Dispatch { job: String, task: u32 },
    /// Hand the job to the leader to be finalized.
    Finalize { job: String },
    /// End the job failed: every unfinished task failed, held ones told to stop.
    FailJob { job: String },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub rule: Rule,
    pub job: String,
    pub task: Option<String>,
    pub handler: Option<String>,
    /// How long the condition has lasted, as far as the snapshot tells.
    pub age_ms: Millis,
    pub action: Action,
    pub detail: String,
}

/// Every finding in a snapshot, in job order; a scheduler job gets at most
/// one `R6` finding however many of its tasks would be resubmitted.
pub fn check(snapshot: &Snapshot) -> Vec<Finding> {
    let mut findings = Vec::new();
    for job in &snapshot.jobs {
        check_job(snapshot, job, &mut findings);
    }
    findings
}

fn check_job(snapshot: &Snapshot, job: &JobSnapshot, findings: &mut Vec<Finding>) {
    if !job.active {
        return;
    }
    let now = snapshot.now;
    if job.unfinished == 0 {
        let ended_at = job.tasks.iter().filter_map(|t| t.finished_at).max().unwrap_or(job.updated_at);
        let age = now - ended_at;
        if age > snapshot.config.finalize_grace_ms {
            findings.push(Finding {
                rule: Rule::JobNotFinalized,
                job: job.id.clone(),
                task: None,
                handler: None,
                age_ms: age,
                action: Action::Finalize { job: job.id.clone() },
                detail: format!("every task ended {age} ms ago and the job is not finalized"),
            });
        }
        return;
    }
    let mut resubmissions: Vec<Finding> = Vec::new();
    for task in &job.tasks {
        if task.state.is_held() {
            if let Some(finding) = check_held(snapshot, job, task) {
                if finding.rule == Rule::PinnedNodeDown {
                    findings.push(finding);
                } else {
                    resubmissions.push(finding);
                }
            }
        } else if task.state == TaskState::Ready && !task.queued {
            findings.push(Finding {
                rule: Rule::ReadyNotDispatched,
                job: job.id.clone(),
                task: Some(task.id.clone()),
                handler: None,
                age_ms: now - task.updated_at,
                action: Action::Dispatch { job: job.id.clone(), task: task.idx },
                detail: "ready but in no dispatch queue".into(),
            });
        }
    }
    if resubmissions.is_empty() {
        return;
    }
    if job.from_scheduler {
        let first = &resubmissions[0];
        let tasks: BTreeSet<&str> = resubmissions.iter().filter_map(|f| f.task.as_deref()).collect();
        findings.push(Finding {
            rule: Rule::SchedulerJob,
            job: job.id.clone(),
            task: first.task.clone(),
            handler: first.handler.clone(),
            age_ms: resubmissions.iter().map(|f| f.age_ms).max().unwrap_or(0),
            action: Action::FailJob { job: job.id.clone() },
            detail: format!(
                "a scheduler job is not resubmitted ({} for {}); the next detection proposes the work again",
                first.rule,
                tasks.into_iter().collect::<Vec<_>>().join(", ")
            ),
        });
    } else {
        findings.extend(resubmissions);
    }
}

fn check_held(snapshot: &Snapshot, job: &JobSnapshot, task: &TaskSnapshot) -> Option<Finding> {
    let now = snapshot.now;
    let finding = |rule: Rule, handler: Option<String>, age: Millis, action: Action, detail: String| Finding {
        rule,
        job: job.id.clone(),
        task: Some(task.id.clone()),
        handler,
        age_ms: age,
        action,
        detail,
    };
    let resubmit = Action::Resubmit { job: job.id.clone(), task: task.idx, attempt: task.attempt };
    let since_assigned = now - task.assigned_at.unwrap_or(task.updated_at);
    let Some(handler) = &task.handler else {
        let detail = "held with no handler recorded".to_string();
        return Some(finding(Rule::HeldWithoutHandler, None, since_assigned, resubmit, detail));
    };
    let Some(live) = snapshot.handlers.get(handler) else {
        let detail = format!("its handler {handler} is not connected");
        return Some(finding(Rule::HandlerGone, Some(handler.clone()), since_assigned, resubmit, detail));
    };
    if let Some(knows) = &live.knows {
        if since_assigned > snapshot.config.delivery_grace_ms
            && !knows.contains(&(job.id.clone(), task.idx, task.attempt))
        {
            let detail = format!(
                "its handler {handler} ({}) is connected but was never sent attempt {}, does not run it and reported no outcome",
                live.node, task.attempt
            );
            return Some(finding(Rule::NotDelivered, Some(handler.clone()), since_assigned, resubmit, detail));
        }
    }
    let last_written = live.last_seen.max(task.updated_at);
    let silence = now - last_written;
    if silence <= snapshot.config.silence_timeout_ms {
        let stuck = now - task.updated_at;
        let limit = task
            .progress_timeout_ms
            .map_or(snapshot.config.progress_timeout_ms, |own| own.min(snapshot.config.progress_timeout_ms));
        if stuck > limit {
            let why = if limit < snapshot.config.progress_timeout_ms { " (twice its estimated runtime)" } else { "" };
            let detail = format!("no progress for {stuck} ms{why} although its handler {handler} is alive");
            return Some(finding(Rule::NoProgress, Some(handler.clone()), stuck, resubmit, detail));
        }
        return None;
    }
    let detail = format!("its handler {handler} ({}) has written nothing for {silence} ms", live.node);
    if task.pinned_node.as_deref().is_some_and(|node| node == live.node) {
        let fail = Action::FailTask { job: job.id.clone(), task: task.idx, attempt: task.attempt };
        return Some(finding(Rule::PinnedNodeDown, Some(handler.clone()), silence, fail, detail));
    }
    Some(finding(Rule::HandlerSilent, Some(handler.clone()), silence, resubmit, detail))
}

//! The worker stream target: decoded `WorkerToAdminMessage`s fed to a real
//! worker session of an in-process admin (the engine over the memory store,
//! built once per process), one message at a time, each once the one
//! before it has been handled and the engine has made what it caused
//! durable.
//!
//! An input is up to 24 length-delimited messages; the first is meant to
//! be the hello. For each run the target submits a job (`JOB`, its tasks at
//! indices 0 to 3) whose task `held` (index 0) a second worker, the
//! bystander, holds; attempt ids may name that job by the placeholder id.
//!
//! Checked after each run: the session ended when its stream did, within
//! the time limit, and left the registry; the bystander's attempt is
//! exactly as it was (no message of another worker touches it); a worker
//! without a lease holds nothing once its session ended; every refusal is
//! a status with a code and a message; what a task keeps of a worker's
//! reports is within the admin's bounds; and a job type's descriptor is
//! stored only when the session asked the worker for it.

use std::cell::OnceCell;
use std::collections::HashSet;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use jobcenter::follower::Loss;
use jobcenter::jobfile::{self, Format, Limits};
use jobcenter::model::{HandlerId, JobId, JobOrigin, JobSpec, TaskRecord};
use jobcenter::proto::plugin::{
    admin_to_worker_message, worker_to_admin_message::Body, AdminToWorkerMessage, JobCompleted, JobTypeCapability,
    WorkerHello, WorkerToAdminMessage,
};
use jobcenter::server::fuzzing::Admin;
use jobcenter::server::{handler_of, ServerOptions};
use jobcenter::store::MemoryStore;
use tokio::sync::{mpsc, Notify};
use tokio_stream::Stream;
use tonic::Status;

use crate::frame;

/// The job submitted for each run.
pub const JOB: &str = r#"{"name":"fuzz","tasks":[
  {"id":"held","job_type":"held"},
  {"id":"a","job_type":"noop","parameters":{"n":1},"labels":{"dedupe_key":"a"}},
  {"id":"b","job_type":"noop","depends_on":["a"],"retry_limit":1},
  {"id":"c","job_type":"noop"}
]}"#;
/// The bystander's instance id, and so its handler id.
pub const BYSTANDER: &str = "6a0b8e0c-0000-4000-8000-00000000b057";
const MOST_MESSAGES: usize = 24;
/// Every wait of a run ends within this, or the run fails as a hang.
const LIMIT: Duration = Duration::from_secs(10);
/// The most output lines, bytes of one line, and bytes of an error, that a
/// task keeps of what a worker reports (a longer line or error is cut and
/// marked ` [...]`).
const MOST_OUTPUT_LINES: usize = 200;
const MOST_LINE_BYTES: usize = 1000 + " [...]".len();
const MOST_ERROR_BYTES: usize = 4096 + " [...]".len();

struct Harness {
    admin: Admin,
    spec: JobSpec,
    bystander: HandlerId,
    bystander_tx: mpsc::UnboundedSender<WorkerToAdminMessage>,
}

thread_local! {
    static HARNESS: OnceCell<Rc<Harness>> = const { OnceCell::new() };
}

fn harness() -> Rc<Harness> {
    HARNESS.with(|cell| cell.get_or_init(|| Rc::new(crate::block_on(Harness::start()))).clone())
}

pub fn run(data: &[u8]) {
    let messages: Vec<WorkerToAdminMessage> = frame::messages(data, MOST_MESSAGES);
    if messages.is_empty() {
        return;
    }
    let harness = harness();
    crate::block_on(harness.run(messages));
}

/// What the session's stream and its consumer tell each other.
#[derive(Default)]
struct Signals {
    /// Messages the session took and finished handling.
    handled: AtomicUsize,
    /// Every sender of the session's answers is gone: it has ended.
    ended: AtomicBool,
    changed: Notify,
}

impl Signals {
    async fn until(&self, what: &str, done: impl Fn(&Signals) -> bool) {
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if done(self) {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!("{what} within {LIMIT:?}");
            }
        }
    }
}

/// A worker's side of the stream: each poll after the first says the
/// message taken before has been handled (the session takes the next one
/// only then).
struct Paced {
    messages: mpsc::UnboundedReceiver<WorkerToAdminMessage>,
    taken: usize,
    signals: Arc<Signals>,
}

impl Stream for Paced {
    type Item = Result<WorkerToAdminMessage, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.signals.handled.swap(this.taken, Ordering::SeqCst) != this.taken {
            this.signals.changed.notify_waiters();
        }
        match this.messages.poll_recv(cx) {
            Poll::Ready(Some(message)) => {
                this.taken += 1;
                Poll::Ready(Some(Ok(message)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

fn capability(job_type: &str, slots: i32) -> JobTypeCapability {
    JobTypeCapability {
        job_type: job_type.into(),
        can_execute: true,
        max_execution_concurrency: slots,
        ..JobTypeCapability::default()
    }
}

fn status_is_typed(status: &Status, context: &str) {
    assert!(
        !matches!(status.code(), tonic::Code::Ok | tonic::Code::Unknown),
        "{context}: a refusal without a code: {status:?}"
    );
    assert!(!status.message().trim().is_empty(), "{context}: a refusal that names no rule: {status:?}");
}

impl Harness {
    async fn start() -> Harness {
        let store = Arc::new(MemoryStore::new());
        let admin = Admin::start(store, ServerOptions::default()).await.expect("an admin over the memory store");
        let spec = jobfile::parse(JOB.as_bytes(), Format::Json, "fuzz.json", &Limits::default()).expect("the job");
        let hello = WorkerHello {
            worker_id: "bystander".into(),
            worker_instance_id: BYSTANDER.into(),
            capabilities: vec![capability("held", 4)],
            ..WorkerHello::default()
        };
        let bystander = handler_of(&hello);
        let (bystander_tx, messages) = mpsc::unbounded_channel();
        bystander_tx
            .send(WorkerToAdminMessage { body: Some(Body::Hello(hello)), ..WorkerToAdminMessage::default() })
            .expect("the bystander's stream");
        let inbound = Paced { messages, taken: 0, signals: Arc::default() };
        let mut answers = admin.open_worker_stream(inbound).await.expect("the bystander is accepted");
        tokio::spawn(async move { while answers.recv().await.is_some() {} });
        Harness { admin, spec, bystander, bystander_tx }
    }

    async fn job(&self, job: JobId) -> Vec<TaskRecord> {
        let stored = self.admin.engine().job(job).await.expect("the engine runs").expect("the job is known");
        stored.tasks
    }

    /// Waits until every step the engine was asked for is durable.
    async fn settle(&self, job: JobId) {
        tokio::time::timeout(LIMIT, self.admin.engine().summary(job))
            .await
            .expect("the engine answers")
            .expect("the engine runs");
    }

    async fn run(&self, mut messages: Vec<WorkerToAdminMessage>) {
        let engine = self.admin.engine();
        let job = engine.submit(self.spec.clone(), JobOrigin::User).await.expect("the job is submitted");
        let job_text = job.to_string();
        let deadline = tokio::time::Instant::now() + LIMIT;
        let held_before = loop {
            let held = self.job(job).await.swap_remove(0);
            if held.holder() == Some(self.bystander) {
                break held;
            }
            assert!(tokio::time::Instant::now() < deadline, "the bystander never got its task: {held:?}");
            tokio::task::yield_now().await;
        };

        // The input names the run's job by the placeholder, and is never
        // the bystander: a worker that says it is another is that one.
        let mut hello: Option<WorkerHello> = None;
        for message in &mut messages {
            match &mut message.body {
                Some(Body::Hello(h)) => {
                    if handler_of(h) == self.bystander {
                        h.worker_instance_id = format!("not-{}", h.worker_instance_id);
                    }
                    hello.get_or_insert_with(|| h.clone());
                }
                Some(Body::JobCompleted(c)) => frame::with_job(&mut c.job_id, &job_text),
                Some(Body::JobProgressUpdate(p)) => frame::with_job(&mut p.job_id, &job_text),
                Some(Body::Heartbeat(h)) => {
                    for work in &mut h.running_work {
                        frame::with_job(&mut work.work_id, &job_text);
                    }
                }
                _ => {}
            }
        }
        let first_is_hello = matches!(messages[0].body, Some(Body::Hello(_)));
        let handler = first_is_hello.then(|| hello.as_ref().map(handler_of)).flatten();
        let offered: HashSet<String> = messages
            .iter()
            .filter_map(|m| match &m.body {
                Some(Body::ConfigSchemaResponse(r)) => r.job_type_descriptor.as_ref().map(|d| d.job_type.clone()),
                _ => None,
            })
            .filter(|job_type| !self.admin.has_descriptor(job_type))
            .collect();

        let signals = Arc::new(Signals::default());
        let (tx, inbound) = mpsc::unbounded_channel();
        let mut rest = messages.split_off(1);
        tx.send(messages.remove(0)).expect("the stream is open");
        let paced = Paced { messages: inbound, taken: 0, signals: signals.clone() };
        let answers: Arc<Mutex<Vec<Result<AdminToWorkerMessage, Status>>>> = Arc::default();
        let mut accepted = false;
        match tokio::time::timeout(LIMIT, self.admin.open_worker_stream(paced)).await.expect("open answers") {
            Err(status) => {
                status_is_typed(&status, "opening the stream");
                rest.clear();
                signals.ended.store(true, Ordering::SeqCst);
            }
            Ok(mut receiver) => {
                let first = tokio::time::timeout(LIMIT, receiver.recv()).await.expect("the admin answers hello");
                if let Some(Ok(AdminToWorkerMessage { body: Some(admin_to_worker_message::Body::Hello(h)), .. })) =
                    &first
                {
                    accepted = h.accepted;
                }
                answers.lock().expect("answers").extend(first);
                let (answers, signals) = (answers.clone(), signals.clone());
                tokio::spawn(async move {
                    while let Some(answer) = receiver.recv().await {
                        answers.lock().expect("answers").push(answer);
                    }
                    signals.ended.store(true, Ordering::SeqCst);
                    signals.changed.notify_waiters();
                });
            }
        }
        for (n, message) in rest.into_iter().enumerate() {
            signals
                .until(&format!("the session handled message {}", n + 1), |s| {
                    s.ended.load(Ordering::SeqCst) || s.handled.load(Ordering::SeqCst) > n
                })
                .await;
            if signals.ended.load(Ordering::SeqCst) {
                break;
            }
            self.settle(job).await;
            if tx.send(message).is_err() {
                break;
            }
        }
        drop(tx);
        signals.until("the session ended with its stream", |s| s.ended.load(Ordering::SeqCst)).await;
        self.settle(job).await;

        // What the run left.
        let tasks = self.job(job).await;
        assert_eq!(tasks[0], held_before, "another worker's attempt changed");
        if let Some(handler) = handler {
            let lease = hello.as_ref().is_some_and(|h| h.metadata.contains_key(jobcenter::wire::LEASE_METADATA));
            if accepted && !lease {
                for (idx, task) in tasks.iter().enumerate() {
                    assert!(
                        task.holder() != Some(handler),
                        "task {idx} is still held by a worker without a lease whose session ended: {task:?}"
                    );
                }
            }
            assert!(!self.admin.connected_workers().contains(&handler), "an ended session left its worker registered");
        }
        assert!(self.admin.connected_workers().contains(&self.bystander), "the bystander's session ended");
        for answer in answers.lock().expect("answers").iter() {
            if let Err(status) = answer {
                status_is_typed(status, "the session");
            }
        }
        for (idx, task) in tasks.iter().enumerate() {
            assert!(
                task.progress_percent.is_finite() && (0.0..=100.0).contains(&task.progress_percent),
                "task {idx} keeps a progress of {}",
                task.progress_percent
            );
            assert!(task.output.len() <= MOST_OUTPUT_LINES, "task {idx} keeps {} output lines", task.output.len());
            for line in task.output.iter() {
                assert!(line.len() <= MOST_LINE_BYTES, "task {idx} keeps an output line of {} bytes", line.len());
            }
            let error = task.error.as_deref().unwrap_or("");
            assert!(error.len() <= MOST_ERROR_BYTES, "task {idx} keeps an error of {} bytes", error.len());
        }
        let requested: HashSet<&str> = match (&hello, accepted) {
            (Some(hello), true) => hello.capabilities.iter().map(|c| c.job_type.as_str()).collect(),
            _ => HashSet::new(),
        };
        for job_type in &offered {
            if self.admin.has_descriptor(job_type) {
                assert!(
                    requested.contains(job_type.as_str()),
                    "the descriptor of job type {job_type:?}, which the session never asked for, was stored"
                );
            }
        }

        // Leave nothing behind for the next run.
        if let Some(handler) = handler {
            let _ = engine.handler_gone(handler, Loss::NotCounted("the run ended".into())).await;
        }
        engine.cancel(job).await.expect("the job is canceled");
        let held = self.job(job).await.swap_remove(0);
        if held.state().is_held() {
            let canceled = JobCompleted {
                job_id: jobcenter::model::AttemptId::new(
                    jobcenter::model::TaskRef { job, idx: jobcenter::model::TaskIdx(0) },
                    held.attempt,
                )
                .to_string(),
                success: false,
                error_message: "canceled".into(),
                ..JobCompleted::default()
            };
            self.bystander_tx
                .send(WorkerToAdminMessage {
                    body: Some(Body::JobCompleted(canceled)),
                    ..WorkerToAdminMessage::default()
                })
                .expect("the bystander's stream");
        }
        crate::remove_once_ended(engine, job, LIMIT).await;
    }
}

//! The engine as a whole: commands in, durable steps, work orders out. Every
//! test runs on each backend: the in-memory store (whose `crash` forgets
//! unflushed writes), sled in a data directory, and a real PostgreSQL.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use jobcenter::clock::{SystemClock, Timestamp};
use jobcenter::dispatch::{HandlerSpec, WorkOrder};
use jobcenter::engine::{Engine, EngineHandle, Error, Options, Orphans, Reconciled};
use jobcenter::follower::{Outcome, Rejection};
use jobcenter::jobfile::{self, Format, Limits};
use jobcenter::model::{AttemptId, HandlerId, JobOrigin, JobSpec, JobState, TaskState};
use jobcenter::store::{Location, MemoryStore, PasswordSources, SledStore, Store};
use jobcenter::worker::{builtin_handlers, LocalExecutor, Registry};
use tokio::sync::mpsc;

fn spec(text: &str) -> JobSpec {
    jobfile::parse(text.as_bytes(), Format::Json, "test", &Limits::default()).expect("valid job")
}

fn nine_tasks(fail: Option<u32>) -> JobSpec {
    let edges = [(1, 4), (1, 7), (2, 4), (2, 5), (2, 6), (2, 7), (4, 7), (4, 9), (5, 8), (6, 8), (6, 9)];
    let tasks: Vec<String> = (1..=9)
        .map(|i| {
            let deps: Vec<String> = edges.iter().filter(|(_, b)| *b == i).map(|(a, _)| format!("\"{a}\"")).collect();
            let fail = fail == Some(i);
            format!(
                r#"{{"id":"{i}","job_type":"noop","parameters":{{"fail":{fail}}},"depends_on":[{}]}}"#,
                deps.join(",")
            )
        })
        .collect();
    spec(&format!(r#"{{"name":"nine","tasks":[{}]}}"#, tasks.join(",")))
}

use crate::support::postgres as pg;

/// A store to run the engine on, opened again (as after a restart) as often as needed.
enum Subject {
    Memory(MemoryStore),
    Sled(tempfile::TempDir),
    Postgres(Location),
}

impl Subject {
    fn memory() -> Subject {
        Subject::Memory(MemoryStore::new())
    }

    fn sled() -> Subject {
        Subject::Sled(tempfile::tempdir().unwrap())
    }

    fn postgres() -> Subject {
        let cluster = pg::shared();
        let database = cluster.new_database();
        Subject::Postgres(Location::Database { url: cluster.url(&database), passwords: PasswordSources::default() })
    }

    /// The store, opened (again); a data directory is waited for until the
    /// previous engine's threads have let it go.
    async fn open(&self) -> Arc<dyn Store> {
        match self {
            Subject::Memory(store) => Arc::new(store.clone()),
            Subject::Sled(dir) => {
                let path = dir.path().join("data");
                for _ in 0..200 {
                    match SledStore::open(&path) {
                        Ok(store) => return Arc::new(store),
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
                panic!("the data directory was not released")
            }
            Subject::Postgres(location) => {
                let location = location.clone();
                tokio::task::spawn_blocking(move || location.open().unwrap()).await.unwrap()
            }
        }
    }

    /// A crash: writes not flushed are forgotten (the databases keep only
    /// what they flushed anyway; sled's crash is tested by SIGKILL elsewhere).
    fn crash(&self) {
        if let Subject::Memory(store) = self {
            store.crash();
        }
    }
}

/// Runs a test on every backend.
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test] async fn $name() { super::$name(super::Subject::memory()).await })*
        }
        mod sled {
            $(#[tokio::test] async fn $name() { super::$name(super::Subject::sled()).await })*
        }
        mod postgres {
            $(#[tokio::test] async fn $name() { super::$name(super::Subject::postgres()).await })*
        }
    };
}

const KEEP: Orphans = Orphans::Keep { grace: Duration::from_secs(30) };

async fn start(store: Arc<dyn Store>, orphans: Orphans) -> EngineHandle {
    Engine::start(store, Arc::new(SystemClock), Options { orphans, ..Options::default() }).await.expect("engine starts")
}

/// A handler driven by the test: it sees each work order and answers by hand.
struct Manual {
    handler: HandlerId,
    orders: mpsc::UnboundedReceiver<WorkOrder>,
}

async fn manual(engine: &EngineHandle, capacity: u32) -> Manual {
    manual_as(engine, HandlerId::new(), capacity, 0).await
}

/// The handler `handler` (re)connecting in session `session`.
async fn manual_as(engine: &EngineHandle, handler: HandlerId, capacity: u32, session: u64) -> Manual {
    let (sink, orders) = mpsc::unbounded_channel();
    engine
        .connected(HandlerSpec {
            handler,
            job_types: None,
            capacity,
            type_capacity: Default::default(),
            starts_running: false,
            session,
            sink,
            place: Default::default(),
        })
        .await
        .unwrap();
    Manual { handler, orders }
}

impl Manual {
    async fn next(&mut self) -> WorkOrder {
        tokio::time::timeout(Duration::from_secs(10), self.orders.recv()).await.expect("a work order").expect("open")
    }

    async fn none_within(&mut self, millis: u64) {
        let got = tokio::time::timeout(Duration::from_millis(millis), self.orders.recv()).await;
        assert!(got.is_err(), "unexpected work order {got:?}");
    }
}

fn ok() -> Outcome {
    Outcome::Succeeded { output: vec![] }
}

async fn nine_tasks_through_the_engine_dispatch_in_dependency_order(subject: Subject) {
    let engine = start(subject.open().await, KEEP).await;
    let job = engine.submit(nine_tasks(None), JobOrigin::User).await.unwrap();
    let mut worker = manual(&engine, 100).await;
    let mut dispatched = Vec::new();
    let mut held = Vec::new();
    for _ in 0..3 {
        let WorkOrder::Execute(a) = worker.next().await else { panic!("expected an execution") };
        held.push(a);
    }
    let mut first: Vec<String> = held.iter().map(|a| a.task_id.to_string()).collect();
    first.sort();
    assert_eq!(first, ["1", "2", "3"]);
    worker.none_within(100).await;
    // Complete in the specification's order and collect each release.
    for id in ["1", "2", "3", "5", "4", "6", "8", "9", "7"] {
        let position = held.iter().position(|a| &*a.task_id == id).unwrap_or_else(|| panic!("{id} not dispatched"));
        let a = held.remove(position);
        engine.complete(a.attempt, worker.handler, ok()).await.unwrap().unwrap();
        dispatched.push(id.to_string());
        let expected: &[&str] = match id {
            "2" => &["4", "5", "6"],
            "4" => &["7"],
            "6" => &["8", "9"],
            _ => &[],
        };
        let mut released = Vec::new();
        for _ in 0..expected.len() {
            let WorkOrder::Execute(a) = worker.next().await else { panic!("expected an execution") };
            released.push(a.task_id.to_string());
            held.push(a);
        }
        released.sort();
        assert_eq!(released, expected, "released after {id}");
    }
    let record = engine.wait(job).await.unwrap();
    assert_eq!(record.state, JobState::Succeeded);
}

async fn acknowledged_submits_and_completions_survive_a_crash(subject: Subject) {
    let store = subject.open().await;
    let engine = start(store.clone(), KEEP).await;
    let job = engine.submit(nine_tasks(None), JobOrigin::User).await.unwrap();
    subject.crash();
    assert!(store.get_job(job).unwrap().is_some(), "an acknowledged submit is durable");
    let mut worker = manual(&engine, 1).await;
    let WorkOrder::Execute(a) = worker.next().await else { panic!() };
    subject.crash();
    let stored = store.get_job(job).unwrap().unwrap();
    assert_eq!(
        stored.tasks[a.attempt.task.idx.index()].state(),
        TaskState::Assigned,
        "dispatched only after the assignment is durable"
    );
    engine.complete(a.attempt, worker.handler, ok()).await.unwrap().unwrap();
    subject.crash();
    let stored = store.get_job(job).unwrap().unwrap();
    assert_eq!(
        stored.tasks[a.attempt.task.idx.index()].state(),
        TaskState::Succeeded,
        "an acknowledged completion is durable"
    );
}

async fn refused_completions_are_typed_and_idempotent(subject: Subject) {
    let engine = start(subject.open().await, KEEP).await;
    engine.submit(spec(r#"{"name":"one","tasks":[{"id":"a","job_type":"noop"}]}"#), JobOrigin::User).await.unwrap();
    let mut worker = manual(&engine, 1).await;
    let WorkOrder::Execute(a) = worker.next().await else { panic!() };
    let stranger = HandlerId::new();
    assert!(matches!(engine.complete(a.attempt, stranger, ok()).await.unwrap(), Err(Rejection::NotHolder { .. })));
    assert!(matches!(
        engine.complete(AttemptId::new(a.attempt.task, a.attempt.number + 1), worker.handler, ok()).await.unwrap(),
        Err(Rejection::StaleAttempt { .. })
    ));
    engine.complete(a.attempt, worker.handler, ok()).await.unwrap().unwrap();
    assert!(matches!(engine.complete(a.attempt, worker.handler, ok()).await.unwrap(), Err(Rejection::JobEnded { .. })));
    let job = engine.job(a.attempt.task.job).await.unwrap().unwrap();
    assert_eq!(job.record.state, JobState::Succeeded);
    assert_eq!(job.tasks[0].attempt, 1);
}

/// A report naming a task the job does not have is refused, and the engine
/// goes on serving.
async fn a_report_on_a_task_the_job_does_not_have_is_refused(subject: Subject) {
    let engine = start(subject.open().await, KEEP).await;
    engine.submit(spec(r#"{"name":"one","tasks":[{"id":"a","job_type":"noop"}]}"#), JobOrigin::User).await.unwrap();
    let mut worker = manual(&engine, 1).await;
    let WorkOrder::Execute(a) = worker.next().await else { panic!() };
    let beyond = jobcenter::model::TaskRef { job: a.attempt.task.job, idx: jobcenter::model::TaskIdx(5) };
    assert_eq!(
        engine.complete(AttemptId::new(beyond, a.attempt.number), worker.handler, ok()).await.unwrap(),
        Err(Rejection::UnknownTask { job: a.attempt.task.job, idx: 5 })
    );
    assert_eq!(
        engine.started(AttemptId::new(beyond, a.attempt.number), worker.handler).await.unwrap(),
        Err(Rejection::UnknownTask { job: a.attempt.task.job, idx: 5 })
    );
    engine.complete(a.attempt, worker.handler, ok()).await.unwrap().unwrap();
    assert_eq!(engine.wait(a.attempt.task.job).await.unwrap().state, JobState::Succeeded);
}

async fn cancel_stops_running_work_and_ends_the_job_canceled(subject: Subject) {
    let engine = start(subject.open().await, KEEP).await;
    let job = engine.submit(nine_tasks(None), JobOrigin::User).await.unwrap();
    let mut worker = manual(&engine, 2).await;
    let mut running = Vec::new();
    for _ in 0..2 {
        let WorkOrder::Execute(a) = worker.next().await else { panic!() };
        running.push(a);
    }
    engine.cancel(job).await.unwrap();
    for _ in 0..2 {
        let WorkOrder::Cancel { attempt } = worker.next().await else { panic!("expected a cancel") };
        engine.complete(attempt, worker.handler, Outcome::Canceled { reason: "asked".into() }).await.unwrap().unwrap();
    }
    let record = engine.wait(job).await.unwrap();
    assert_eq!(record.state, JobState::Canceled);
    let stored = engine.job(job).await.unwrap().unwrap();
    assert!(stored.tasks.iter().all(|t| t.state() == TaskState::Canceled));
    assert!(matches!(engine.cancel(job).await, Err(Error::JobEnded(_))));
}

async fn executor_runs_many_jobs_and_retry_reruns_the_failed_part(subject: Subject) {
    let engine = start(subject.open().await, KEEP).await;
    LocalExecutor::start(engine.clone(), Registry::new(builtin_handlers()), 16, None).await.unwrap();
    let mut jobs = Vec::new();
    for n in 0..20 {
        jobs.push(engine.submit(nine_tasks(if n % 4 == 0 { Some(4) } else { None }), JobOrigin::User).await.unwrap());
    }
    for (n, job) in jobs.iter().enumerate() {
        let record = engine.wait(*job).await.unwrap();
        let expected = if n % 4 == 0 { JobState::Failed } else { JobState::Succeeded };
        assert_eq!(record.state, expected, "job {n}");
    }
    let failed = engine.job(jobs[0]).await.unwrap().unwrap();
    let states: Vec<TaskState> = failed.tasks.iter().map(|t| t.state()).collect();
    use TaskState::{Failed as F, Succeeded as S, UpstreamFailed as U};
    assert_eq!(states, [S, S, S, F, S, S, U, S, U]);
    // The failure is permanent (fail: true), so a retry fails the same way, but only reruns 4, 7, 9.
    engine.retry(jobs[0]).await.unwrap();
    assert_eq!(engine.wait(jobs[0]).await.unwrap().state, JobState::Failed);
    let again = engine.job(jobs[0]).await.unwrap().unwrap();
    let attempts: Vec<u32> = again.tasks.iter().map(|t| t.attempt).collect();
    assert_eq!(attempts, [1, 1, 1, 2, 1, 1, 0, 1, 0]);
    assert!(matches!(engine.retry(jobs[1]).await, Err(Error::NothingToRetry { .. })));
}

/// A handler that panics on its task, and one that never ends.
struct Panics;

impl jobcenter::worker::Handler for Panics {
    fn job_type(&self) -> &'static str {
        "panics"
    }

    fn execute(&self, _ctx: jobcenter::worker::TaskContext) -> jobcenter::worker::BoxFuture {
        Box::pin(async { panic!("a handler's bug") })
    }
}

struct Hangs;

impl jobcenter::worker::Handler for Hangs {
    fn job_type(&self) -> &'static str {
        "hangs"
    }

    fn execute(&self, _ctx: jobcenter::worker::TaskContext) -> jobcenter::worker::BoxFuture {
        Box::pin(std::future::pending())
    }
}

async fn executor_reports_a_panicking_handler_as_failed_and_a_canceled_task_as_canceled(subject: Subject) {
    let engine = start(subject.open().await, KEEP).await;
    LocalExecutor::start(engine.clone(), Registry::new(vec![Arc::new(Panics), Arc::new(Hangs)]), 4, None)
        .await
        .unwrap();
    let panics = spec(
        r#"{"name":"p","tasks":[{"id":"a","job_type":"panics"},{"id":"b","job_type":"panics","depends_on":["a"]}]}"#,
    );
    let job = engine.submit(panics, JobOrigin::User).await.unwrap();
    let record = tokio::time::timeout(Duration::from_secs(30), engine.wait(job)).await.unwrap().unwrap();
    assert_eq!(record.state, JobState::Failed);
    let stored = engine.job(job).await.unwrap().unwrap();
    assert_eq!(stored.tasks[0].state(), TaskState::Failed);
    assert_eq!(stored.tasks[0].error.as_deref(), Some("the handler panicked"));
    assert_eq!(stored.tasks[1].state(), TaskState::UpstreamFailed);
    let hangs =
        engine.submit(spec(r#"{"name":"h","tasks":[{"id":"a","job_type":"hangs"}]}"#), JobOrigin::User).await.unwrap();
    for _ in 0..300 {
        if engine.job(hangs).await.unwrap().unwrap().tasks[0].state() == TaskState::Running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    engine.cancel(hangs).await.unwrap();
    let record = tokio::time::timeout(Duration::from_secs(30), engine.wait(hangs)).await.unwrap().unwrap();
    assert_eq!(record.state, JobState::Canceled);
    assert_eq!(engine.job(hangs).await.unwrap().unwrap().tasks[0].state(), TaskState::Canceled);
}

async fn restart_requeues_orphaned_attempts_as_new_attempts(subject: Subject) {
    let job = {
        let engine = start(subject.open().await, Orphans::Requeue).await;
        let job = engine.submit(nine_tasks(None), JobOrigin::User).await.unwrap();
        let mut worker = manual(&engine, 3).await;
        let WorkOrder::Execute(a) = worker.next().await else { panic!() };
        engine.complete(a.attempt, worker.handler, ok()).await.unwrap().unwrap();
        for _ in 0..2 {
            let WorkOrder::Execute(_) = worker.next().await else { panic!() };
        }
        job
    };
    let engine = start(subject.open().await, Orphans::Requeue).await;
    let stored = engine.job(job).await.unwrap().unwrap();
    let held = stored.tasks.iter().filter(|t| t.state().is_held()).count();
    assert_eq!(held, 0, "nothing is left held by a handler that is gone");
    LocalExecutor::start(engine.clone(), Registry::new(builtin_handlers()), 4, None).await.unwrap();
    assert_eq!(engine.wait(job).await.unwrap().state, JobState::Succeeded);
    let done = engine.job(job).await.unwrap().unwrap();
    let attempts: Vec<u32> = done.tasks.iter().map(|t| t.attempt).collect();
    assert_eq!(
        attempts.iter().filter(|&&a| a == 2).count(),
        2,
        "the two orphaned tasks ran again as attempt 2: {attempts:?}"
    );
}

async fn tasks_on_the_same_volume_never_run_at_once_across_jobs(subject: Subject) {
    let engine = start(subject.open().await, KEEP).await;
    let on_volume = |name: &str, volume: u32| {
        spec(&format!(
            r#"{{"name":"{name}","tasks":[{{"id":"t","job_type":"noop","labels":{{"volume_id":"{volume}"}}}}]}}"#
        ))
    };
    engine.submit(on_volume("first", 5), JobOrigin::User).await.unwrap();
    engine.submit(on_volume("second", 5), JobOrigin::User).await.unwrap();
    engine.submit(on_volume("other", 6), JobOrigin::User).await.unwrap();
    let mut worker = manual(&engine, 10).await;
    let WorkOrder::Execute(a) = worker.next().await else { panic!() };
    let WorkOrder::Execute(b) = worker.next().await else { panic!() };
    let volumes = [a.labels["volume_id"].clone(), b.labels["volume_id"].clone()];
    assert!(volumes.contains(&"5".to_string()) && volumes.contains(&"6".to_string()), "{volumes:?}");
    worker.none_within(200).await;
    let on_five = if a.labels["volume_id"] == "5" { a } else { b };
    engine.complete(on_five.attempt, worker.handler, ok()).await.unwrap().unwrap();
    let WorkOrder::Execute(c) = worker.next().await else { panic!() };
    assert_eq!(c.labels["volume_id"], "5", "the second task on volume 5 runs once the first ended");
    assert_ne!(c.attempt.task.job, on_five.attempt.task.job);
}

fn now() -> Timestamp {
    jobcenter::clock::Clock::now(&SystemClock)
}

async fn a_restart_keeps_held_attempts_with_their_volume_and_their_deadline(subject: Subject) {
    let engine = start(subject.open().await, KEEP).await;
    let job = engine
        .submit(
            spec(
                r#"{"name":"volume","tasks":[
                {"id":"a","job_type":"noop","labels":{"volume_id":"7"},"execution_timeout_seconds":2},
                {"id":"b","job_type":"noop","labels":{"volume_id":"7"}}]}"#,
            ),
            JobOrigin::User,
        )
        .await
        .unwrap();
    let mut worker = manual(&engine, 2).await;
    let WorkOrder::Execute(a) = worker.next().await else { panic!("expected an execution") };
    assert_eq!(&*a.task_id, "a");
    worker.none_within(200).await;
    drop(engine);

    let engine = start(subject.open().await, KEEP).await;
    let mut back = manual_as(&engine, worker.handler, 2, 1).await;
    let running = HashSet::from([a.attempt]);
    let reconciled =
        engine.reconcile(worker.handler, running, HashSet::new(), Some(now())).await.unwrap().await.unwrap();
    assert_eq!(reconciled, Reconciled { adopted: 1, dropped: 0, not_held: vec![], not_led_here: vec![] });
    back.none_within(300).await;
    // The deadline, two seconds after the assignment, still holds: the worker is told to stop.
    let WorkOrder::Cancel { attempt } = back.next().await else { panic!("expected a cancel") };
    assert_eq!(attempt, a.attempt);
    // Only then does the second task on volume 7 start.
    let WorkOrder::Execute(b) = back.next().await else { panic!("expected an execution") };
    assert_eq!(&*b.task_id, "b");
    engine.complete(b.attempt, worker.handler, ok()).await.unwrap().unwrap();
    let stored = engine.job(job).await.unwrap().unwrap();
    assert_eq!(stored.tasks[0].state(), TaskState::Failed);
    assert_eq!(stored.tasks[0].error.as_deref(), Some("execution timed out after 2 s"));
    assert_eq!(stored.tasks[0].attempt, 1, "the kept attempt was not run again");
}

async fn a_worker_back_within_its_wait_keeps_its_attempts(subject: Subject) {
    let engine = start(subject.open().await, KEEP).await;
    let job = engine
        .submit(
            spec(r#"{"name":"two","tasks":[{"id":"a","job_type":"noop"},{"id":"b","job_type":"noop"}]}"#),
            JobOrigin::User,
        )
        .await
        .unwrap();
    let mut worker = manual(&engine, 2).await;
    let (WorkOrder::Execute(a), WorkOrder::Execute(b)) = (worker.next().await, worker.next().await) else {
        panic!("expected two executions")
    };
    engine.disconnected(worker.handler, 0, Some(Duration::from_millis(600)), "the stream broke").await.unwrap();
    let mut other = manual(&engine, 2).await;
    other.none_within(200).await;
    let _back = manual_as(&engine, worker.handler, 2, 1).await;
    let running = HashSet::from([a.attempt, b.attempt]);
    let reconciled =
        engine.reconcile(worker.handler, running, HashSet::new(), Some(now())).await.unwrap().await.unwrap();
    assert_eq!(reconciled.adopted, 2);
    other.none_within(800).await;
    for held in [&a, &b] {
        engine.complete(held.attempt, worker.handler, ok()).await.unwrap().unwrap();
    }
    let stored = engine.job(job).await.unwrap().unwrap();
    assert_eq!(stored.record.state, JobState::Succeeded);
    assert!(stored.tasks.iter().all(|t| t.attempt == 1 && t.lost == 0), "{:?}", stored.tasks);
}

async fn attempts_of_a_worker_that_does_not_come_back_are_lost_and_counted(subject: Subject) {
    let engine = start(subject.open().await, KEEP).await;
    let job =
        engine.submit(spec(r#"{"name":"one","tasks":[{"id":"a","job_type":"noop"}]}"#), JobOrigin::User).await.unwrap();
    let mut gone = manual(&engine, 1).await;
    let WorkOrder::Execute(a) = gone.next().await else { panic!("expected an execution") };
    drop(engine);
    // After a restart, the attempt waits the orphan grace for its worker.
    let grace = Orphans::Keep { grace: Duration::from_millis(500) };
    let engine = start(subject.open().await, grace).await;
    let mut other = manual(&engine, 1).await;
    other.none_within(300).await;
    let WorkOrder::Execute(again) = other.next().await else { panic!("expected the task again") };
    assert_eq!(again.attempt, AttemptId::new(a.attempt.task, 2));
    // Its first worker comes back after all: it must stop what it runs.
    let _late = manual_as(&engine, gone.handler, 1, 1).await;
    let running = HashSet::from([a.attempt]);
    let reconciled = engine.reconcile(gone.handler, running, HashSet::new(), Some(now())).await.unwrap().await.unwrap();
    assert_eq!(reconciled.not_held, vec![a.attempt]);
    assert!(matches!(
        engine.complete(a.attempt, gone.handler, ok()).await.unwrap(),
        Err(Rejection::StaleAttempt { .. })
    ));
    engine.complete(again.attempt, other.handler, ok()).await.unwrap().unwrap();
    let stored = engine.job(job).await.unwrap().unwrap();
    assert_eq!((stored.record.state, stored.tasks[0].lost), (JobState::Succeeded, 1));
}

async fn a_worker_that_no_longer_runs_an_attempt_gives_it_back_uncounted(subject: Subject) {
    let engine = start(subject.open().await, KEEP).await;
    let job =
        engine.submit(spec(r#"{"name":"one","tasks":[{"id":"a","job_type":"noop"}]}"#), JobOrigin::User).await.unwrap();
    let mut worker = manual(&engine, 1).await;
    let WorkOrder::Execute(a) = worker.next().await else { panic!("expected an execution") };
    engine.disconnected(worker.handler, 0, Some(Duration::from_secs(30)), "the stream broke").await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut back = manual_as(&engine, worker.handler, 1, 1).await;
    let reconciled =
        engine.reconcile(worker.handler, HashSet::new(), HashSet::new(), Some(now())).await.unwrap().await.unwrap();
    assert_eq!(reconciled.dropped, 1);
    let WorkOrder::Execute(again) = back.next().await else { panic!("expected the task again") };
    assert_eq!(again.attempt.number, 2);
    engine.complete(again.attempt, worker.handler, ok()).await.unwrap().unwrap();
    let stored = engine.job(job).await.unwrap().unwrap();
    assert_eq!((stored.tasks[0].attempt, stored.tasks[0].lost), (2, 0));
    let _ = a;
}

async fn a_vouched_worker_s_attempts_are_not_taken_back_before_the_vouch_runs_out(subject: Subject) {
    let engine = start(subject.open().await, KEEP).await;
    let job =
        engine.submit(spec(r#"{"name":"one","tasks":[{"id":"a","job_type":"noop"}]}"#), JobOrigin::User).await.unwrap();
    let mut moved = manual(&engine, 1).await;
    let WorkOrder::Execute(a) = moved.next().await else { panic!("expected an execution") };
    // The worker moved to another instance, which renews its lease once
    // this one vouched: 1.2 s here, though the worker's own wait is 0.3 s.
    let stranger = AttemptId::new(a.attempt.task, a.attempt.number + 1);
    let held = engine.vouch(moved.handler, vec![a.attempt, stranger], Duration::from_millis(1200)).await.unwrap();
    assert_eq!(held, vec![a.attempt], "only what the handler holds is vouched for");
    engine.disconnected(moved.handler, 0, Some(Duration::from_millis(300)), "the stream broke").await.unwrap();
    let mut other = manual(&engine, 1).await;
    other.none_within(900).await;
    // Once the vouch has run out, the attempt is taken back as usual.
    let WorkOrder::Execute(again) = tokio::time::timeout(Duration::from_secs(5), other.next()).await.unwrap() else {
        panic!("expected the task again")
    };
    assert_eq!(again.attempt, AttemptId::new(a.attempt.task, 2));
    engine.complete(again.attempt, other.handler, ok()).await.unwrap().unwrap();
    assert_eq!(engine.job(job).await.unwrap().unwrap().record.state, JobState::Succeeded);
    // Nothing is vouched for a handler that holds nothing here.
    assert!(engine
        .vouch(other.handler, vec![AttemptId::new(a.attempt.task, 1)], Duration::from_secs(60))
        .await
        .unwrap()
        .is_empty());
}

/// An engine whose `noop` attempts that end without success keep their
/// volume for `window`.
async fn start_with_rollback(store: Arc<dyn Store>, window: Duration) -> EngineHandle {
    let rollback_windows = std::collections::HashMap::from([("noop".to_string(), window)]);
    let options = Options { orphans: KEEP, rollback_windows, ..Options::default() };
    Engine::start(store, Arc::new(SystemClock), options).await.expect("engine starts")
}

async fn a_failed_attempt_keeps_its_volume_for_its_rollback_window_across_a_restart(subject: Subject) {
    let window = Duration::from_millis(1500);
    let engine = start_with_rollback(subject.open().await, window).await;
    let on_volume = |name: &str, volume: u32| {
        spec(&format!(
            r#"{{"name":"{name}","tasks":[{{"id":"t","job_type":"noop","labels":{{"volume_id":"{volume}"}}}}]}}"#
        ))
    };
    engine.submit(on_volume("succeeds", 9), JobOrigin::User).await.unwrap();
    let mut worker = manual(&engine, 4).await;
    let WorkOrder::Execute(first) = worker.next().await else { panic!("expected an execution") };
    // A success ends nothing of the kind: the next task on volume 9 starts at once.
    engine.complete(first.attempt, worker.handler, ok()).await.unwrap().unwrap();
    engine.submit(on_volume("fails", 9), JobOrigin::User).await.unwrap();
    let WorkOrder::Execute(second) = worker.next().await else { panic!("expected an execution") };
    let failed = Outcome::Failed { error: "broke".into(), output: vec![] };
    // The window runs from the step that records the failure, which comes
    // after this instant (and may come well before the answer does).
    let ended = std::time::Instant::now();
    engine.complete(second.attempt, worker.handler, failed).await.unwrap().unwrap();
    engine.submit(on_volume("waits", 9), JobOrigin::User).await.unwrap();
    engine.submit(on_volume("elsewhere", 10), JobOrigin::User).await.unwrap();
    let WorkOrder::Execute(other) = worker.next().await else { panic!("expected an execution") };
    assert_eq!(other.labels["volume_id"], "10", "a task on another volume is not held up");
    worker.none_within(300).await;

    // The window outlives a restart.
    drop((engine, worker));
    let engine = start_with_rollback(subject.open().await, window).await;
    let mut worker = manual(&engine, 4).await;
    let WorkOrder::Execute(third) = worker.next().await else { panic!("expected an execution") };
    let waited = ended.elapsed();
    assert_eq!(third.labels["volume_id"], "9");
    assert!(waited >= window, "the next task on volume 9 started {waited:?} after the failure, inside its {window:?}");
    engine.complete(third.attempt, worker.handler, ok()).await.unwrap().unwrap();
}

async fn a_worker_without_a_lease_back_under_a_new_handler_settles_what_its_old_handler_held(subject: Subject) {
    let engine = start(subject.open().await, KEEP).await;
    let job =
        engine.submit(spec(r#"{"name":"one","tasks":[{"id":"a","job_type":"noop"}]}"#), JobOrigin::User).await.unwrap();
    let old = manual(&engine, 1).await;
    assert!(engine.returned(old.handler, Arc::from("weed-1")).await.unwrap().is_empty(), "nothing held yet");
    let mut old = old;
    let WorkOrder::Execute(a) = old.next().await else { panic!("expected an execution") };
    drop((engine, old));

    // After a restart the same worker id says hello as a new handler, and
    // another worker's id comes too: only the first settles anything.
    let engine = start(subject.open().await, KEEP).await;
    let mut stranger = manual(&engine, 1).await;
    assert!(engine.returned(stranger.handler, Arc::from("weed-2")).await.unwrap().is_empty());
    stranger.none_within(200).await;
    let mut back = manual(&engine, 1).await;
    let settled = engine.returned(back.handler, Arc::from("weed-1")).await.unwrap();
    assert_eq!(settled.iter().map(|r| r.attempt).collect::<Vec<_>>(), vec![a.attempt]);
    assert!(!settled[0].from_scheduler);
    let order = tokio::select! {
        order = back.next() => order,
        order = stranger.next() => order,
    };
    let WorkOrder::Execute(again) = order else { panic!("expected the task again") };
    assert_eq!(again.attempt, AttemptId::new(a.attempt.task, 2));
    let stored = engine.job(job).await.unwrap().unwrap();
    assert_eq!(stored.tasks[0].lost, 0, "a worker that came back lost nothing: {:?}", stored.tasks[0]);
    // Said once: the same handler again settles nothing more.
    assert!(engine.returned(back.handler, Arc::from("weed-1")).await.unwrap().is_empty());
}

on_every_store!(
    nine_tasks_through_the_engine_dispatch_in_dependency_order,
    acknowledged_submits_and_completions_survive_a_crash,
    refused_completions_are_typed_and_idempotent,
    a_report_on_a_task_the_job_does_not_have_is_refused,
    cancel_stops_running_work_and_ends_the_job_canceled,
    executor_runs_many_jobs_and_retry_reruns_the_failed_part,
    executor_reports_a_panicking_handler_as_failed_and_a_canceled_task_as_canceled,
    restart_requeues_orphaned_attempts_as_new_attempts,
    tasks_on_the_same_volume_never_run_at_once_across_jobs,
    a_restart_keeps_held_attempts_with_their_volume_and_their_deadline,
    a_worker_back_within_its_wait_keeps_its_attempts,
    attempts_of_a_worker_that_does_not_come_back_are_lost_and_counted,
    a_worker_that_no_longer_runs_an_attempt_gives_it_back_uncounted,
    a_vouched_worker_s_attempts_are_not_taken_back_before_the_vouch_runs_out,
    a_failed_attempt_keeps_its_volume_for_its_rollback_window_across_a_restart,
    a_worker_without_a_lease_back_under_a_new_handler_settles_what_its_old_handler_held,
);

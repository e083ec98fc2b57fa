//! Model-based property test of the follower and leader steps: random DAGs,
//! random outcomes and completion orders, replayed and stale completions,
//! and crashes that lose what was not flushed, checked against a small
//! reference model after every step; on the in-memory store, and on a real
//! PostgreSQL (where a crash drops the store with its unflushed batches).

use std::sync::Arc;

use jobcenter::active::ActiveJob;
use jobcenter::clock::Timestamp;
use jobcenter::follower::{self, Outcome, Rejection};
use jobcenter::jobfile::{self, Format, Limits};
use jobcenter::leader;
use jobcenter::model::{HandlerId, JobId, JobOrigin, JobState, TaskState};
use jobcenter::store::{Batch, Location, MemoryStore, PasswordSources, Store};
use proptest::prelude::*;

use crate::support::postgres as pg;

/// Gives the store back after a crash: what was not flushed is gone.
type Crash = Arc<dyn Fn(Arc<dyn Store>) -> Arc<dyn Store>>;

/// The reference: each task's state, recomputed from scratch by plain rules.
#[derive(Clone, Debug, PartialEq)]
enum M {
    Pending,
    Ready,
    Held,
    Succeeded,
    Failed,
    UpstreamFailed,
}

#[derive(Clone, Debug)]
struct Model {
    parents: Vec<Vec<usize>>,
    retry_limit: Vec<u32>,
    state: Vec<M>,
    attempt: Vec<u32>,
    failures: Vec<u32>,
}

impl Model {
    fn new(parents: Vec<Vec<usize>>, retry_limit: Vec<u32>) -> Model {
        let n = parents.len();
        let mut model =
            Model { parents, retry_limit, state: vec![M::Pending; n], attempt: vec![0; n], failures: vec![0; n] };
        model.settle();
        model
    }

    /// Parents always have smaller indices, so one pass in index order settles everything.
    fn settle(&mut self) {
        for t in 0..self.state.len() {
            let parents = &self.parents[t];
            let blocked = parents.iter().any(|&p| matches!(self.state[p], M::Failed | M::UpstreamFailed));
            let free = parents.iter().all(|&p| self.state[p] == M::Succeeded);
            if self.state[t] == M::Pending && blocked {
                self.state[t] = M::UpstreamFailed;
            } else if self.state[t] == M::Pending && free {
                self.state[t] = M::Ready;
            }
        }
    }

    fn finished(&self) -> bool {
        self.state.iter().all(|s| matches!(s, M::Succeeded | M::Failed | M::UpstreamFailed))
    }
}

fn matches_model(state: TaskState, model: &M) -> bool {
    matches!(
        (state, model),
        (TaskState::Pending, M::Pending)
            | (TaskState::Ready, M::Ready)
            | (TaskState::Assigned | TaskState::Running, M::Held)
            | (TaskState::Succeeded, M::Succeeded)
            | (TaskState::Failed, M::Failed)
            | (TaskState::UpstreamFailed, M::UpstreamFailed)
    )
}

#[derive(Clone, Debug)]
enum Op {
    Dispatch(usize),
    Start(usize),
    Complete(usize, bool),
    Replay(usize),
    Stale(usize),
    WrongHandler(usize),
    Flush,
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => any::<usize>().prop_map(Op::Dispatch),
        1 => any::<usize>().prop_map(Op::Start),
        4 => (any::<usize>(), prop::bool::weighted(0.75)).prop_map(|(k, ok)| Op::Complete(k, ok)),
        1 => any::<usize>().prop_map(Op::Replay),
        1 => any::<usize>().prop_map(Op::Stale),
        1 => any::<usize>().prop_map(Op::WrongHandler),
        2 => Just(Op::Flush),
        1 => Just(Op::Crash),
    ]
}

fn dag() -> impl Strategy<Value = (Vec<Vec<usize>>, Vec<u32>)> {
    (1usize..14).prop_flat_map(|n| {
        let parents =
            (0..n).map(|i| proptest::sample::subsequence((0..i).collect::<Vec<_>>(), 0..=i.min(3))).collect::<Vec<_>>();
        (parents, proptest::collection::vec(0u32..3, n))
    })
}

/// The system under test: the job state, the store, and the model's copy at the last flush.
struct System {
    job: ActiveJob,
    store: Arc<dyn Store>,
    crash: Crash,
    handler: HandlerId,
    now: Timestamp,
    model: Model,
    durable_model: Model,
    finalized: bool,
}

impl System {
    fn write(&mut self, batch: Batch) {
        if !batch.is_empty() {
            self.store.write(&batch).unwrap();
        }
    }

    fn nth(&self, k: usize, pick: impl Fn(TaskState) -> bool) -> Option<u32> {
        let candidates: Vec<u32> =
            (0..self.job.len() as u32).filter(|&t| pick(self.job.tasks[t as usize].state())).collect();
        (!candidates.is_empty()).then(|| candidates[k % candidates.len()])
    }

    fn after_step(&mut self, job_done: bool, batch: &mut Batch) {
        if job_done {
            assert!(leader::finalize(&mut self.job, HandlerId::new(), self.now, batch));
            self.finalized = true;
        }
    }

    fn expect_refused(&mut self, idx: u32, attempt: u32, handler: HandlerId, expected: fn(&Rejection) -> bool) {
        let before = (self.job.tasks.clone(), self.job.unmet.clone());
        let mut batch = Batch::default();
        let outcome = Outcome::Succeeded { output: vec![] };
        let result = follower::complete(&mut self.job, idx, attempt, handler, outcome, self.now, &mut batch);
        match result {
            Err(rejection) => assert!(expected(&rejection), "unexpected rejection {rejection:?}"),
            Ok(_) => panic!("a bad completion of task {idx} attempt {attempt} was applied"),
        }
        assert!(batch.is_empty());
        assert_eq!((self.job.tasks.clone(), self.job.unmet.clone()), before);
    }

    fn apply(&mut self, op: &Op) {
        self.now = self.now.plus_millis(10);
        let mut batch = Batch::default();
        match *op {
            Op::Dispatch(k) => {
                if let Some(t) = self.nth(k, |s| s == TaskState::Ready) {
                    assert_ne!(self.durable_model.state[t as usize], M::Succeeded, "a durable success ran again");
                    let attempt = leader::assign(&mut self.job, t, self.handler, false, self.now, &mut batch);
                    self.model.attempt[t as usize] += 1;
                    self.model.state[t as usize] = M::Held;
                    assert_eq!(attempt, self.model.attempt[t as usize]);
                }
            }
            Op::Start(k) => {
                if let Some(t) = self.nth(k, |s| s == TaskState::Assigned) {
                    let attempt = self.job.tasks[t as usize].attempt;
                    follower::start(&mut self.job, t, attempt, self.handler, self.now).unwrap();
                    assert_eq!(self.job.tasks[t as usize].state(), TaskState::Running);
                }
            }
            Op::Complete(k, ok) => {
                if let Some(t) = self.nth(k, TaskState::is_held) {
                    let attempt = self.job.tasks[t as usize].attempt;
                    let outcome = if ok {
                        Outcome::Succeeded { output: vec![] }
                    } else {
                        Outcome::Failed { error: "model failure".into(), output: vec![] }
                    };
                    let released =
                        follower::complete(&mut self.job, t, attempt, self.handler, outcome, self.now, &mut batch)
                            .expect("a completion by the holder is applied");
                    let i = t as usize;
                    if ok {
                        self.model.state[i] = M::Succeeded;
                    } else {
                        self.model.failures[i] += 1;
                        self.model.state[i] =
                            if self.model.failures[i] <= self.model.retry_limit[i] { M::Ready } else { M::Failed };
                    }
                    self.model.settle();
                    self.after_step(released.job_done, &mut batch);
                }
            }
            Op::Replay(k) => {
                if let Some(t) = self.nth(k, TaskState::is_terminal) {
                    let attempt = self.job.tasks[t as usize].attempt;
                    self.expect_refused(t, attempt, self.handler, |r| {
                        matches!(r, Rejection::AlreadyEnded { .. } | Rejection::StaleAttempt { .. })
                    });
                }
            }
            Op::Stale(k) => {
                if let Some(t) = self.nth(k, |_| true) {
                    let attempt = self.job.tasks[t as usize].attempt;
                    self.expect_refused(t, attempt + 1, self.handler, |r| matches!(r, Rejection::StaleAttempt { .. }));
                    if attempt > 0 {
                        self.expect_refused(t, attempt - 1, self.handler, |r| {
                            matches!(r, Rejection::StaleAttempt { .. })
                        });
                    }
                }
            }
            Op::WrongHandler(k) => {
                if let Some(t) = self.nth(k, TaskState::is_held) {
                    let attempt = self.job.tasks[t as usize].attempt;
                    self.expect_refused(t, attempt, HandlerId::new(), |r| matches!(r, Rejection::NotHolder { .. }));
                }
            }
            Op::Flush => {
                self.store.flush().unwrap();
                self.durable_model = self.model.clone();
            }
            Op::Crash => {
                self.store = (self.crash)(self.store.clone());
                self.restart();
                return;
            }
        }
        self.write(batch);
    }

    /// What the engine does at start-up: reload, then run orphaned attempts again.
    fn restart(&mut self) {
        let id = self.job.id();
        let stored = self.store.get_job(id).unwrap().expect("the job was flushed at submit");
        self.job = ActiveJob::from_stored(stored);
        self.finalized = self.job.record.state.is_terminal();
        self.model = self.durable_model.clone();
        self.handler = HandlerId::new();
        let mut batch = Batch::default();
        for t in 0..self.job.len() as u32 {
            let task = &self.job.tasks[t as usize];
            assert!(
                !(task.state() == TaskState::Pending && self.job.unmet[t as usize] == 0),
                "task {t} is pending with every parent succeeded: a step was stored in part"
            );
            if task.state().is_held() {
                let released = follower::lose(
                    &mut self.job,
                    t,
                    &follower::Loss::NotCounted("restart".into()),
                    3,
                    self.now,
                    &mut batch,
                );
                assert_eq!(released.ready, vec![t]);
                self.model.state[t as usize] = M::Ready;
            }
        }
        self.write(batch);
    }

    fn check(&self) {
        let job = &self.job;
        for t in 0..job.len() {
            let task = &job.tasks[t];
            assert!(
                matches_model(task.state(), &self.model.state[t]),
                "task {t}: {} vs model {:?}",
                task.state(),
                self.model.state[t]
            );
            assert_eq!(task.attempt, self.model.attempt[t], "task {t} attempt");
            let parents = job.spec.dag.parents(t as u32);
            let unsucceeded =
                parents.iter().filter(|&&p| job.tasks[p as usize].state() != TaskState::Succeeded).count() as u32;
            assert_eq!(job.unmet[t], unsucceeded, "task {t}: in-degree equals its unsucceeded parents");
            if matches!(task.state(), TaskState::Ready | TaskState::Assigned | TaskState::Running) {
                assert_eq!(unsucceeded, 0, "task {t} is {} with an unsucceeded parent", task.state());
            }
            if matches!(task.state(), TaskState::Failed | TaskState::UpstreamFailed) {
                for d in job.spec.dag.descendants(t as u32) {
                    assert_eq!(
                        job.tasks[d as usize].state(),
                        TaskState::UpstreamFailed,
                        "descendant {d} of failed {t}"
                    );
                }
            }
        }
        let mut counted = jobcenter::model::StateCounts::default();
        for task in &job.tasks {
            counted.add(task.state());
        }
        assert_eq!(counted, job.counts);
        let all_succeeded = job.tasks.iter().all(|t| t.state() == TaskState::Succeeded);
        assert_eq!(job.record.state == JobState::Succeeded, all_succeeded && self.finalized);
        assert_eq!(self.finalized, self.model.finished(), "finalized exactly when every task ended");
        if self.finalized {
            let expected = if all_succeeded { JobState::Succeeded } else { JobState::Failed };
            assert_eq!(job.record.state, expected);
        }
    }
}

fn job_text(parents: &[Vec<usize>], retry_limit: &[u32]) -> String {
    let tasks: Vec<String> = parents
        .iter()
        .enumerate()
        .map(|(i, ps)| {
            let deps: Vec<String> = ps.iter().map(|p| format!("\"t{p}\"")).collect();
            format!(
                r#"{{"id":"t{i}","job_type":"noop","depends_on":[{}],"retry_limit":{},"retry_backoff_seconds":0}}"#,
                deps.join(","),
                retry_limit[i]
            )
        })
        .collect();
    format!(r#"{{"name":"model","tasks":[{}]}}"#, tasks.join(","))
}

/// Runs one case: the job, the operations, then drives the job to its end.
fn run_case(
    parents: Vec<Vec<usize>>,
    retry_limit: Vec<u32>,
    ops: &[Op],
    store: Arc<dyn Store>,
    crash: Crash,
) -> Result<(), TestCaseError> {
    let text = job_text(&parents, &retry_limit);
    let spec = jobfile::parse(text.as_bytes(), Format::Json, "model", &Limits::default()).unwrap();
    let mut batch = Batch::default();
    let now = Timestamp(1_000);
    let (job, _) = leader::submit(JobId::new(), Arc::new(spec), JobOrigin::User, HandlerId::new(), now, &mut batch);
    store.write(&batch).unwrap();
    store.flush().unwrap();
    let model = Model::new(parents, retry_limit);
    let mut system = System {
        job,
        store,
        crash,
        handler: HandlerId::new(),
        now,
        durable_model: model.clone(),
        model,
        finalized: false,
    };
    system.check();
    for op in ops {
        system.apply(op);
        system.check();
    }
    // Drive to the end: every job finishes, whatever happened before.
    let mut rounds = 0;
    while !system.finalized {
        rounds += 1;
        prop_assert!(rounds < 1000, "the job never finished");
        system.apply(&Op::Dispatch(0));
        system.apply(&Op::Complete(0, true));
        system.check();
    }
    Ok(())
}

fn memory() -> (Arc<dyn Store>, Crash) {
    let store = MemoryStore::new();
    let again = store.clone();
    let crash: Crash = Arc::new(move |_| {
        again.crash();
        Arc::new(again.clone())
    });
    (Arc::new(store), crash)
}

/// One database for every case: each case is its own job.
fn postgres() -> (Arc<dyn Store>, Crash) {
    static DATABASE: std::sync::OnceLock<Location> = std::sync::OnceLock::new();
    let location = DATABASE
        .get_or_init(|| {
            let cluster = pg::shared();
            Location::Database { url: cluster.url(&cluster.new_database()), passwords: PasswordSources::default() }
        })
        .clone();
    let store = location.open().unwrap();
    let crash: Crash = Arc::new(move |old| {
        drop(old);
        location.open().unwrap()
    });
    (store, crash)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn steps_match_the_reference_model((parents, retry_limit) in dag(), ops in proptest::collection::vec(op(), 0..160)) {
        let (store, crash) = memory();
        run_case(parents, retry_limit, &ops, store, crash)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn steps_match_the_reference_model_on_postgres((parents, retry_limit) in dag(), ops in proptest::collection::vec(op(), 0..160)) {
        let (store, crash) = postgres();
        run_case(parents, retry_limit, &ops, store, crash)?;
    }
}

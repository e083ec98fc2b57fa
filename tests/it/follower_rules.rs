//! The leader and follower rules, step by step, on the pure state (no I/O):
//! the specification's nine-task example, retries, cancel, retry of a
//! failed job, and refused completions.

use std::sync::Arc;

use jobcenter::active::ActiveJob;
use jobcenter::clock::Timestamp;
use jobcenter::follower::{self, Outcome, Rejection};
use jobcenter::jobfile::{self, Format, Limits};
use jobcenter::leader;
use jobcenter::model::{HandlerId, JobId, JobOrigin, JobState, TaskState};
use jobcenter::store::Batch;

/// A job under test with one handler and a clock that only moves when told.
struct Fixture {
    job: ActiveJob,
    handler: HandlerId,
    now: Timestamp,
    batch: Batch,
}

impl Fixture {
    fn new(text: &str) -> (Fixture, Vec<u32>) {
        let spec = jobfile::parse(text.as_bytes(), Format::Json, "test", &Limits::default()).expect("valid job");
        let mut batch = Batch::default();
        let now = Timestamp(1_000_000);
        let (job, ready) =
            leader::submit(JobId::new(), Arc::new(spec), JobOrigin::User, HandlerId::new(), now, &mut batch);
        (Fixture { job, handler: HandlerId::new(), now, batch }, ready)
    }

    fn idx(&self, id: &str) -> u32 {
        self.job.spec.tasks.iter().position(|t| &*t.id == id).unwrap_or_else(|| panic!("no task {id}")) as u32
    }

    fn ids(&self, tasks: &[u32]) -> Vec<String> {
        let mut ids: Vec<String> = tasks.iter().map(|&t| self.job.spec.tasks[t as usize].id.to_string()).collect();
        ids.sort();
        ids
    }

    fn state(&self, id: &str) -> TaskState {
        self.job.tasks[self.idx(id) as usize].state()
    }

    fn assign(&mut self, id: &str) -> u32 {
        let idx = self.idx(id);
        leader::assign(&mut self.job, idx, self.handler, false, self.now, &mut self.batch)
    }

    fn end(&mut self, id: &str, outcome: Outcome) -> (Vec<String>, bool) {
        let idx = self.idx(id);
        let attempt = self.job.tasks[idx as usize].attempt;
        let released =
            follower::complete(&mut self.job, idx, attempt, self.handler, outcome, self.now, &mut self.batch)
                .unwrap_or_else(|r| panic!("completion of {id} refused: {r}"));
        if released.job_done {
            assert!(leader::finalize(&mut self.job, HandlerId::new(), self.now, &mut self.batch));
        }
        (self.ids(&released.ready), released.job_done)
    }

    fn succeed(&mut self, id: &str) -> (Vec<String>, bool) {
        self.end(id, Outcome::Succeeded { output: vec![] })
    }

    fn fail(&mut self, id: &str) -> (Vec<String>, bool) {
        self.end(id, Outcome::Failed { error: "boom".into(), output: vec![] })
    }
}

/// The specification's example: tasks 1, 2, 3 have no dependencies; edges
/// 1→4, 1→7, 2→4, 2→5, 2→6, 2→7, 4→7, 4→9, 5→8, 6→8, 6→9.
fn nine_tasks() -> String {
    let edges = [(1, 4), (1, 7), (2, 4), (2, 5), (2, 6), (2, 7), (4, 7), (4, 9), (5, 8), (6, 8), (6, 9)];
    let tasks: Vec<String> = (1..=9)
        .map(|i| {
            let deps: Vec<String> = edges.iter().filter(|(_, b)| *b == i).map(|(a, _)| format!("\"{a}\"")).collect();
            format!(r#"{{"id":"{i}","job_type":"noop","depends_on":[{}]}}"#, deps.join(","))
        })
        .collect();
    format!(r#"{{"name":"nine","tasks":[{}]}}"#, tasks.join(","))
}

fn none() -> Vec<String> {
    Vec::new()
}

fn names(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

#[test]
fn nine_task_example_succeeds_in_the_specified_order() {
    let (mut f, ready) = Fixture::new(&nine_tasks());
    assert_eq!(f.ids(&ready), names(&["1", "2", "3"]), "the leader submits every task of in-degree 0");
    for id in ["1", "2", "3"] {
        f.assign(id);
    }
    assert_eq!(f.succeed("1"), (none(), false), "4 and 7 still wait on 2");
    assert_eq!(f.succeed("2"), (names(&["4", "5", "6"]), false), "4 needed 1 and 2; 5 and 6 needed 2");
    for id in ["4", "5", "6"] {
        f.assign(id);
    }
    assert_eq!(f.succeed("3"), (none(), false));
    assert_eq!(f.succeed("5"), (none(), false), "8 still waits on 6");
    assert_eq!(f.succeed("4"), (names(&["7"]), false), "9 still waits on 6");
    f.assign("7");
    assert_eq!(f.succeed("6"), (names(&["8", "9"]), false));
    f.assign("8");
    f.assign("9");
    assert_eq!(f.succeed("8"), (none(), false));
    assert_eq!(f.succeed("9"), (none(), false));
    assert_eq!(f.succeed("7"), (none(), true), "the last task hands the job back to the leader");
    assert_eq!(f.job.record.state, JobState::Succeeded);
    assert!(f.job.record.finished_at.is_some());
}

#[test]
fn nine_task_example_with_task_4_failing() {
    let (mut f, _) = Fixture::new(&nine_tasks());
    for id in ["1", "2", "3"] {
        f.assign(id);
    }
    f.succeed("1");
    f.succeed("2");
    for id in ["4", "5", "6"] {
        f.assign(id);
    }
    f.succeed("3");
    f.succeed("5");
    assert_eq!(f.fail("4"), (none(), false));
    assert_eq!(f.state("4"), TaskState::Failed, "the failed task stays in the graph");
    assert_eq!(f.state("7"), TaskState::UpstreamFailed);
    assert_eq!(f.state("9"), TaskState::UpstreamFailed);
    assert_eq!(f.state("8"), TaskState::Pending, "8 does not depend on 4");
    assert_eq!(f.succeed("6"), (names(&["8"]), false), "9 is already failed, so only 8 is released");
    f.assign("8");
    assert_eq!(f.succeed("8"), (none(), true));
    assert_eq!(f.job.record.state, JobState::Failed);
}

#[test]
fn nine_task_example_with_steps_6_and_7_swapped() {
    let (mut f, _) = Fixture::new(&nine_tasks());
    for id in ["1", "2", "3"] {
        f.assign(id);
    }
    f.succeed("1");
    f.succeed("2");
    for id in ["4", "5", "6"] {
        f.assign(id);
    }
    f.succeed("3");
    f.succeed("5");
    assert_eq!(f.succeed("6"), (names(&["8"]), false), "9 still waits on 4");
    assert_eq!(f.fail("4"), (none(), false));
    assert_eq!(f.state("9"), TaskState::UpstreamFailed);
    assert_eq!(f.state("7"), TaskState::UpstreamFailed);
    f.assign("8");
    assert_eq!(f.succeed("8"), (none(), true));
    assert_eq!(f.job.record.state, JobState::Failed);
}

#[test]
fn a_step_writes_the_result_and_the_released_children_in_one_batch() {
    let (mut f, _) = Fixture::new(&nine_tasks());
    f.assign("1");
    f.assign("2");
    f.succeed("1");
    f.batch = Batch::default();
    f.succeed("2");
    let written: Vec<(String, TaskState)> = f
        .batch
        .tasks
        .iter()
        .map(|(_, idx, record)| (f.job.spec.tasks[idx.0 as usize].id.to_string(), record.state()))
        .collect();
    assert_eq!(
        written,
        vec![
            ("2".to_string(), TaskState::Succeeded),
            ("4".to_string(), TaskState::Ready),
            ("5".to_string(), TaskState::Ready),
            ("6".to_string(), TaskState::Ready),
        ]
    );
}

#[test]
fn failure_marks_every_descendant_in_the_same_batch() {
    let (mut f, _) = Fixture::new(&nine_tasks());
    for id in ["1", "2"] {
        f.assign(id);
    }
    f.batch = Batch::default();
    f.fail("2");
    let mut written: Vec<(String, TaskState)> = f
        .batch
        .tasks
        .iter()
        .map(|(_, idx, record)| (f.job.spec.tasks[idx.0 as usize].id.to_string(), record.state()))
        .collect();
    written.sort();
    let upstream = TaskState::UpstreamFailed;
    assert_eq!(
        written,
        vec![
            ("2".to_string(), TaskState::Failed),
            ("4".to_string(), upstream),
            ("5".to_string(), upstream),
            ("6".to_string(), upstream),
            ("7".to_string(), upstream),
            ("8".to_string(), upstream),
            ("9".to_string(), upstream),
        ]
    );
    f.assign("3");
    f.succeed("1");
    assert_eq!(f.succeed("3"), (none(), true));
    assert_eq!(f.job.record.state, JobState::Failed);
}

#[test]
fn retries_make_the_task_ready_again_after_its_backoff() {
    let text = r#"{"name":"r","tasks":[
        {"id":"a","job_type":"noop","retry_limit":2,"retry_backoff_seconds":7},
        {"id":"b","job_type":"noop","depends_on":["a"]}]}"#;
    let (mut f, _) = Fixture::new(text);
    assert_eq!(f.assign("a"), 1);
    assert_eq!(f.fail("a"), (names(&["a"]), false));
    let a = &f.job.tasks[f.idx("a") as usize];
    assert_eq!((a.state(), a.failures), (TaskState::Ready, 1));
    assert_eq!(a.not_before(), Some(f.now.plus_seconds(7)));
    assert_eq!(f.assign("a"), 2, "a retry is a new attempt");
    f.fail("a");
    assert_eq!(f.assign("a"), 3);
    assert_eq!(f.fail("a"), (none(), true), "two retries spent: the third failure is final");
    assert_eq!(f.state("a"), TaskState::Failed);
    assert_eq!(f.state("b"), TaskState::UpstreamFailed);
    assert_eq!(f.job.record.state, JobState::Failed);
}

#[test]
fn refused_completions_change_nothing() {
    let (mut f, _) = Fixture::new(&nine_tasks());
    let one = f.idx("1");
    let two = f.idx("2");
    let seven = f.idx("7");
    f.assign("1");
    f.assign("2");
    f.succeed("1");
    let before = f.job.tasks.clone();
    let unmet_before = f.job.unmet.clone();
    let mut batch = Batch::default();
    let now = f.now;
    let ok = || Outcome::Succeeded { output: vec![] };
    let handler = f.handler;
    let job = &mut f.job;
    assert_eq!(
        follower::complete(job, one, 1, handler, ok(), now, &mut batch),
        Err(Rejection::AlreadyEnded { state: TaskState::Succeeded }),
        "a replayed completion"
    );
    assert_eq!(
        follower::complete(job, two, 0, handler, ok(), now, &mut batch),
        Err(Rejection::StaleAttempt { current: 1, reported: 0 })
    );
    assert!(matches!(
        follower::complete(job, two, 1, HandlerId::new(), ok(), now, &mut batch),
        Err(Rejection::NotHolder { attempt: 1, .. })
    ));
    assert_eq!(
        follower::complete(job, seven, 0, handler, ok(), now, &mut batch),
        Err(Rejection::NotHeld { state: TaskState::Pending })
    );
    assert!(matches!(
        follower::complete(job, 99, 1, handler, ok(), now, &mut batch),
        Err(Rejection::UnknownTask { idx: 99, .. })
    ));
    assert!(batch.is_empty(), "nothing is written for a refused completion");
    assert_eq!(f.job.tasks, before);
    assert_eq!(f.job.unmet, unmet_before, "no double decrement");
}

#[test]
fn cancel_ends_waiting_tasks_and_asks_running_ones_to_stop() {
    let (mut f, _) = Fixture::new(&nine_tasks());
    f.assign("1");
    f.assign("2");
    let running = leader::cancel(&mut f.job, f.now, &mut f.batch);
    let mut asked: Vec<u32> = running.running.iter().map(|(idx, _, _)| *idx).collect();
    asked.sort();
    assert_eq!(asked, vec![f.idx("1"), f.idx("2")]);
    assert_eq!(f.state("3"), TaskState::Canceled);
    assert_eq!(f.state("9"), TaskState::Canceled);
    assert!(!leader::finalize(&mut f.job, HandlerId::new(), f.now, &mut f.batch), "two tasks still run");
    f.succeed("1");
    let (_, done) = f.end("2", Outcome::Canceled { reason: "stopped".into() });
    assert!(done);
    assert_eq!(f.job.record.state, JobState::Canceled);
    assert_eq!(f.state("1"), TaskState::Succeeded, "what finished is kept as it is");
}

#[test]
fn retry_reruns_the_failed_part_and_keeps_what_succeeded() {
    let (mut f, _) = Fixture::new(&nine_tasks());
    for id in ["1", "2", "3"] {
        f.assign(id);
    }
    f.succeed("1");
    f.succeed("2");
    f.succeed("3");
    for id in ["4", "5", "6"] {
        f.assign(id);
    }
    f.fail("4");
    f.succeed("5");
    f.succeed("6");
    f.assign("8");
    f.succeed("8");
    assert_eq!(f.job.record.state, JobState::Failed);
    let ready = leader::retry(&mut f.job, HandlerId::new(), f.now, &mut f.batch);
    assert_eq!(f.ids(&ready), names(&["4"]));
    assert_eq!(f.job.record.state, JobState::Running);
    assert_eq!(f.state("7"), TaskState::Pending);
    assert_eq!(f.state("9"), TaskState::Pending);
    assert_eq!(f.state("5"), TaskState::Succeeded);
    assert_eq!(f.assign("4"), 2);
    assert_eq!(f.succeed("4"), (names(&["7", "9"]), false));
    f.assign("7");
    f.assign("9");
    f.succeed("7");
    assert_eq!(f.succeed("9"), (none(), true));
    assert_eq!(f.job.record.state, JobState::Succeeded);
}

#[test]
fn a_lost_attempt_runs_again_until_its_limit() {
    let text = r#"{"name":"l","tasks":[{"id":"a","job_type":"noop"},{"id":"b","job_type":"noop","depends_on":["a"]}]}"#;
    let (mut f, _) = Fixture::new(text);
    let a = f.idx("a");
    for attempt in 1..=3 {
        assert_eq!(f.assign("a"), attempt);
        let released =
            follower::lose(&mut f.job, a, &follower::Loss::WithWorker("worker gone".into()), 2, f.now, &mut f.batch);
        if attempt <= 2 {
            assert_eq!(released.ready, vec![a]);
            assert_eq!(f.state("a"), TaskState::Ready);
        } else {
            assert!(released.job_done);
            assert_eq!(f.state("a"), TaskState::Failed);
            assert_eq!(f.state("b"), TaskState::UpstreamFailed);
            let error = f.job.tasks[a as usize].error.clone().unwrap();
            assert!(error.contains("lost 3 times"), "{error}");
        }
    }
    let lost_uncounted = {
        let (mut g, _) = Fixture::new(text);
        let a = g.idx("a");
        for _ in 0..5 {
            g.assign("a");
            follower::lose(
                &mut g.job,
                a,
                &follower::Loss::NotCounted("admin restarted".into()),
                2,
                g.now,
                &mut g.batch,
            );
        }
        g.state("a")
    };
    assert_eq!(lost_uncounted, TaskState::Ready, "an admin restart is not the task's fault");
}

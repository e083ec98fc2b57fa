//! The engine's state machine driven turn by turn, synchronously and without
//! a runtime: a handler and a job as fixtures, the commands of each turn,
//! and what the step it returns holds: the records to make durable, and
//! the replies and work orders that wait for them.

use tokio::sync::{broadcast, mpsc, oneshot};

use std::sync::Arc;

use super::{Action, ClusterCommand, Command, Core, HandlerCommand, JobCommand, Query, ReportCommand, Step};
use crate::clock::Timestamp;
use crate::dispatch::FreeSlots;
use crate::dispatch::{Assignment, HandlerSpec, WorkOrder};
use crate::engine::Options;
use crate::follower::Outcome;
use crate::jobfile::{self, Format, Limits};
use crate::model::{
    AttemptId, HandlerId, Hold, JobId, JobOrigin, JobSpec, JobState, Phase, TaskIdx, TaskRecord, TaskRef, TaskState,
};
use crate::store::conformance::{record, spec};
use crate::store::StoredJob;

const T0: Timestamp = Timestamp(1_795_694_400_000);

fn at(seconds: i64) -> Timestamp {
    T0.plus_seconds(seconds as u64)
}

/// A core with one handler of two slots connected (one that starts an
/// attempt as it gets it, as a `weed worker` does), and the orders it is sent.
fn core_with_a_handler() -> (Core, HandlerId, mpsc::UnboundedReceiver<WorkOrder>) {
    let mut core = Core::new(Options::default(), broadcast::channel(16).0);
    let handler = HandlerId::new();
    let (connect, orders) = connection(handler, 1);
    let step = core.turn([connect], T0);
    assert!(step.batch.is_empty(), "a connection writes nothing");
    (core, handler, orders)
}

/// `handler` connecting in session `session`, with two slots, and the
/// orders it will be sent.
fn connection(handler: HandlerId, session: u64) -> (Command, mpsc::UnboundedReceiver<WorkOrder>) {
    connection_with_slots(handler, session, 2)
}

fn connection_with_slots(
    handler: HandlerId,
    session: u64,
    capacity: u32,
) -> (Command, mpsc::UnboundedReceiver<WorkOrder>) {
    let (sink, orders) = mpsc::unbounded_channel();
    let spec = HandlerSpec {
        handler,
        job_types: None,
        capacity,
        type_capacity: Default::default(),
        starts_running: true,
        session,
        sink,
        place: Default::default(),
    };
    (HandlerCommand::Connected { spec }.into(), orders)
}

/// The handler's stream broke; its attempts wait `seconds` for it.
fn away(handler: HandlerId, session: u64, seconds: u64) -> Command {
    let keep_for = Some(std::time::Duration::from_secs(seconds));
    HandlerCommand::Disconnected { handler, session, keep_for, reason: "its stream broke".into() }.into()
}

/// A core whose handler runs the first task of a two-task chain (attempt 1).
fn core_running_a_chain() -> (Core, HandlerId, JobId) {
    let (mut core, handler, _orders) = core_with_a_handler();
    let id = JobId::new();
    let (reply, _answer) = oneshot::channel();
    let step = core
        .turn([JobCommand::Submit { id, spec: spec(2), origin: JobOrigin::User, audit: None, reply }.into()], at(1));
    assert_eq!(sent(&step), [attempt(id, 0, 1)]);
    (core, handler, id)
}

/// The attempts a step sends, in order, without sending them.
fn sent(step: &Step) -> Vec<AttemptId> {
    step.actions
        .iter()
        .filter_map(|action| match action {
            Action::Send { order: WorkOrder::Execute(assignment), .. } => Some(assignment.attempt),
            _ => None,
        })
        .collect()
}

/// What the step's batch records of each task, by index: a later entry for
/// a task wins, as it does when the batch is written.
fn written(step: &Step, job: JobId) -> Vec<(u32, TaskState, u32)> {
    let last: std::collections::BTreeMap<u32, (TaskState, u32)> = step
        .batch
        .tasks
        .iter()
        .filter(|(j, ..)| *j == job)
        .map(|(_, idx, task)| (idx.0, (task.state(), task.attempt)))
        .collect();
    last.into_iter().map(|(idx, (state, attempt))| (idx, state, attempt)).collect()
}

/// Gives the step's replies, as the committer does once the step is durable.
fn made_durable(step: Step) {
    for action in step.actions {
        match action {
            Action::Reply(reply) => reply(),
            Action::Answer(answer, result) => answer(result),
            _ => {}
        }
    }
}

fn complete(attempt: AttemptId, handler: HandlerId, outcome: Outcome) -> Command {
    ReportCommand::Complete { attempt, handler, outcome, received: None, waited_ms: 0, answer: None }.into()
}

/// `n` tasks that depend on nothing.
fn independent(n: usize) -> Arc<JobSpec> {
    let tasks: Vec<String> =
        (0..n).map(|i| format!(r#"{{"id":"t{i}","job_type":"noop","parameters":{{}}}}"#)).collect();
    let text = format!(r#"{{"name":"independent","tasks":[{}]}}"#, tasks.join(","));
    Arc::new(jobfile::parse(text.as_bytes(), Format::Json, "test", &Limits::default()).expect("valid"))
}

fn submit(core: &mut Core, spec: Arc<JobSpec>, now: Timestamp) -> (JobId, Step) {
    let (id, (reply, _answer)) = (JobId::new(), oneshot::channel());
    (id, core.turn([JobCommand::Submit { id, spec, origin: JobOrigin::User, audit: None, reply }.into()], now))
}

/// What a query or command answers once its step is durable.
fn answer_of<T>(step: Step, mut answer: oneshot::Receiver<T>) -> T {
    made_durable(step);
    answer.try_recv().expect("answered once durable")
}

/// A `noop` attempt another instance lends to a handler here.
fn lent_from_elsewhere(attempt: AttemptId) -> Assignment {
    Assignment {
        attempt,
        job_name: "theirs".into(),
        task_id: format!("t{}", attempt.task.idx.0).into(),
        job_type: Arc::from("noop"),
        parameters: "{}".into(),
        labels: Default::default(),
        priority: Default::default(),
        execution_timeout_seconds: None,
        released_at: None,
        lent_by: Some(Arc::from("10.0.0.2:19333")),
        traceparent: None,
        io_byte_per_second: None,
    }
}

fn attempt(job: JobId, idx: u32, number: u32) -> AttemptId {
    AttemptId::new(TaskRef { job, idx: TaskIdx(idx) }, number)
}

#[test]
fn a_submit_is_answered_only_once_its_step_is_durable_and_its_first_task_goes_out_with_it() {
    let (mut core, _handler, _orders) = core_with_a_handler();
    let (reply, mut answer) = oneshot::channel();
    let id = JobId::new();
    let submit = JobCommand::Submit { id, spec: spec(3), origin: JobOrigin::User, audit: None, reply };
    let step = core.turn([submit.into()], at(1));
    assert_eq!(step.batch.new_jobs.len(), 1, "the job is in the step's batch");
    assert_eq!(written(&step, id), [(0, TaskState::Running, 1)], "only the chain's first task is ready");
    assert_eq!(sent(&step), [attempt(id, 0, 1)], "its order waits in the same step");
    assert!(answer.try_recv().is_err(), "nothing is answered before the step is durable");
    made_durable(step);
    assert_eq!(answer.try_recv().unwrap().unwrap(), id);
    assert!(core.turn([], at(2)).batch.is_empty(), "a turn without commands or deadlines writes nothing");
}

#[test]
fn each_completion_releases_the_next_task_of_a_chain_in_the_same_turn() {
    let (mut core, handler, _orders) = core_with_a_handler();
    let id = JobId::new();
    let (reply, _answer) = oneshot::channel();
    core.turn([JobCommand::Submit { id, spec: spec(3), origin: JobOrigin::User, audit: None, reply }.into()], at(1));
    for idx in 0..3u32 {
        let done = Outcome::Succeeded { output: vec![format!("t{idx} done")] };
        let step = core.turn([complete(attempt(id, idx, 1), handler, done)], at(2 + i64::from(idx)));
        let mut expected = vec![(idx, TaskState::Succeeded, 1)];
        if idx < 2 {
            expected.push((idx + 1, TaskState::Running, 1));
            assert_eq!(sent(&step), [attempt(id, idx + 1, 1)]);
        } else {
            assert!(sent(&step).is_empty());
            let job = step.batch.jobs.iter().find(|j| j.id == id).expect("the job's record is written");
            assert_eq!(job.state, JobState::Succeeded, "the last task ends the job in the same step");
        }
        assert_eq!(written(&step, id), expected, "after t{idx}");
    }
}

#[test]
fn a_failure_marks_every_task_after_it_upstream_failed_and_ends_the_job_in_one_step() {
    let (mut core, handler, _orders) = core_with_a_handler();
    let id = JobId::new();
    let (reply, _answer) = oneshot::channel();
    core.turn([JobCommand::Submit { id, spec: spec(4), origin: JobOrigin::User, audit: None, reply }.into()], at(1));
    let failed = Outcome::Failed { error: "disk full".into(), output: Vec::new() };
    let step = core.turn([complete(attempt(id, 0, 1), handler, failed)], at(2));
    assert_eq!(
        written(&step, id),
        [
            (0, TaskState::Failed, 1),
            (1, TaskState::UpstreamFailed, 0),
            (2, TaskState::UpstreamFailed, 0),
            (3, TaskState::UpstreamFailed, 0)
        ]
    );
    assert!(sent(&step).is_empty());
    assert_eq!(step.batch.jobs.iter().find(|j| j.id == id).map(|j| j.state), Some(JobState::Failed));
}

#[test]
fn a_stale_report_is_refused_and_changes_nothing() {
    let (mut core, handler, _orders) = core_with_a_handler();
    let id = JobId::new();
    let (reply, _answer) = oneshot::channel();
    core.turn([JobCommand::Submit { id, spec: spec(2), origin: JobOrigin::User, audit: None, reply }.into()], at(1));
    let stranger = HandlerId::new();
    let done = || Outcome::Succeeded { output: Vec::new() };
    for report in [complete(attempt(id, 0, 2), handler, done()), complete(attempt(id, 0, 1), stranger, done())] {
        let step = core.turn([report], at(2));
        assert!(step.batch.is_empty() && sent(&step).is_empty(), "a refused report writes and sends nothing");
    }
    let (reply, mut summary) = oneshot::channel();
    made_durable(core.turn([Query::Summary { job: id, reply }.into()], at(3)));
    let summary = summary.try_recv().unwrap().expect("the job is led here");
    assert_eq!(summary.record.state, JobState::Running);
}

#[test]
fn an_attempt_waits_for_its_absent_handler_and_then_runs_again_elsewhere() {
    let (mut core, handler, id) = core_running_a_chain();
    let step = core.turn([away(handler, 1, 10)], at(2));
    assert!(step.batch.is_empty(), "the attempt is still held while its handler may come back");
    assert_eq!(core.next_wake(at(0)), Some(at(12)), "the loop wakes when its time is up");
    assert!(core.turn([], at(11)).batch.is_empty());
    let step = core.turn([], at(12));
    assert_eq!(written(&step, id), [(0, TaskState::Ready, 1)], "taken back at its time, and ready again");
    assert!(sent(&step).is_empty(), "no handler is connected");
    let other = HandlerId::new();
    let (connect, _orders) = connection(other, 1);
    let step = core.turn([connect], at(13));
    assert_eq!(sent(&step), [attempt(id, 0, 2)], "it runs again, as its next attempt");
    let late = complete(attempt(id, 0, 1), handler, Outcome::Succeeded { output: Vec::new() });
    assert!(core.turn([late], at(14)).batch.is_empty(), "the first attempt's late report is refused");
}

#[test]
fn a_handler_back_in_time_keeps_its_attempt_and_reports_it() {
    let (mut core, handler, id) = core_running_a_chain();
    core.turn([away(handler, 1, 10)], at(2));
    let (connect, _orders) = connection(handler, 2);
    assert!(core.turn([connect], at(5)).batch.is_empty());
    assert_eq!(core.next_wake(at(0)), None, "nothing is left to take back");
    assert!(core.turn([], at(20)).batch.is_empty(), "past the time it was given, it still holds its attempt");
    let done = complete(attempt(id, 0, 1), handler, Outcome::Succeeded { output: Vec::new() });
    let step = core.turn([done], at(21));
    assert_eq!(written(&step, id), [(0, TaskState::Succeeded, 1), (1, TaskState::Running, 1)]);
    assert_eq!(sent(&step), [attempt(id, 1, 1)]);
}

#[test]
fn another_instances_vouch_holds_off_the_take_back_until_it_runs_out() {
    let (mut core, handler, id) = core_running_a_chain();
    core.turn([away(handler, 1, 10)], at(2));
    let (reply, mut vouched) = oneshot::channel();
    let stranger = attempt(id, 1, 1);
    let vouch = HandlerCommand::Vouch {
        handler,
        attempts: vec![attempt(id, 0, 1), stranger],
        keep: std::time::Duration::from_secs(30),
        reply,
    };
    core.turn([vouch.into()], at(5));
    assert_eq!(vouched.try_recv().unwrap(), [attempt(id, 0, 1)], "only what the handler holds here is vouched for");
    assert_eq!(core.next_wake(at(0)), Some(at(35)));
    assert!(core.turn([], at(12)).batch.is_empty(), "not taken back at the end of its own wait");
    assert_eq!(written(&core.turn([], at(35)), id), [(0, TaskState::Ready, 1)], "taken back when the vouch runs out");
}

#[test]
fn a_borrowed_attempt_holds_its_slot_until_its_report_is_settled() {
    let mut core = Core::new(Options::default(), broadcast::channel(16).0);
    let handler = HandlerId::new();
    let (sink, _orders) = mpsc::unbounded_channel();
    let spec_of_handler = HandlerSpec {
        handler,
        job_types: Some(vec![Arc::from("noop")]),
        capacity: 1,
        type_capacity: Default::default(),
        starts_running: true,
        session: 1,
        sink,
        place: Default::default(),
    };
    core.turn([HandlerCommand::Connected { spec: spec_of_handler }.into()], T0);
    let (reply, mut offers) = oneshot::channel();
    core.turn([ClusterCommand::Reserve { reply }.into()], at(1));
    let offers = offers.try_recv().unwrap();
    assert_eq!(offers.iter().map(|o| (o.handler, o.total)).collect::<Vec<_>>(), [(handler, 1)]);
    let theirs = attempt(JobId::new(), 0, 3);
    let assignment = lent_from_elsewhere(theirs);
    let (reply, mut unsent) = oneshot::channel();
    let step =
        core.turn([ClusterCommand::Borrowed { handler, reserved: 1, lent: vec![assignment], reply }.into()], at(2));
    assert_eq!(sent(&step), [theirs], "the borrowed attempt goes to the handler");
    assert!(step.batch.is_empty(), "a borrowed attempt is its leader's to write");
    assert!(unsent.try_recv().unwrap().is_empty());
    let id = JobId::new();
    let (reply, _answer) = oneshot::channel();
    let step = core
        .turn([JobCommand::Submit { id, spec: spec(1), origin: JobOrigin::User, audit: None, reply }.into()], at(3));
    assert!(sent(&step).is_empty(), "the handler's one slot runs the borrowed attempt");
    let other = ClusterCommand::ReturnBorrowed { attempt: attempt(theirs.task.job, 0, 2) };
    assert!(sent(&core.turn([other.into()], at(4))).is_empty(), "another attempt of that task settles nothing");
    let settled = core.turn([ClusterCommand::ReturnBorrowed { attempt: theirs }.into()], at(5));
    assert_eq!(sent(&settled), [attempt(id, 0, 1)], "once settled, its slot runs the next task in the same turn");
}

#[test]
fn a_reconnected_handler_keeps_what_it_runs_loses_what_it_dropped_and_hears_of_what_it_does_not_hold() {
    let (mut core, handler, _orders) = core_with_a_handler();
    let (id, step) = submit(&mut core, independent(2), at(1));
    assert_eq!(sent(&step), [attempt(id, 0, 1), attempt(id, 1, 1)]);
    let stranger = attempt(JobId::new(), 0, 1);
    let taken_back = attempt(id, 0, 9);
    let (reply, answer) = oneshot::channel();
    let running = [attempt(id, 0, 1), stranger, taken_back].into_iter().collect();
    let reconcile = HandlerCommand::Reconcile {
        handler,
        running,
        reported: Default::default(),
        dropped_before: Some(at(3)),
        reply,
    };
    let step = core.turn([reconcile.into()], at(5));
    assert_eq!(written(&step, id), [(1, TaskState::Running, 2)], "what it dropped runs again, here, at once");
    assert_eq!(sent(&step), [attempt(id, 1, 2)]);
    let reconciled = answer_of(step, answer);
    assert_eq!((reconciled.adopted, reconciled.dropped), (1, 1));
    assert_eq!(reconciled.not_held, [taken_back], "an attempt of a job led here that it does not hold");
    assert_eq!(reconciled.not_led_here, [stranger], "an attempt of a job not led here");
    // Only what it was given before the time it names is dropped.
    let (reply, answer) = oneshot::channel();
    let reconcile = HandlerCommand::Reconcile {
        handler,
        running: Default::default(),
        reported: Default::default(),
        dropped_before: Some(at(5)),
        reply,
    };
    let step = core.turn([reconcile.into()], at(6));
    assert_eq!(written(&step, id), [(0, TaskState::Running, 2)]);
    let reconciled = answer_of(step, answer);
    assert_eq!((reconciled.adopted, reconciled.dropped, reconciled.not_held), (0, 1, vec![]));
}

/// In a cluster, a worker that moved here reports an outcome on a job led
/// elsewhere (sent on to its leader), and this instance adopts the job before
/// the worker's first heartbeat: the attempt it reported on is not dropped,
/// for the outcome on its way settles it.
#[test]
fn a_first_heartbeat_does_not_drop_an_attempt_whose_outcome_is_on_its_way() {
    let (mut core, handler, _orders) = core_with_a_handler();
    let (id, step) = submit(&mut core, independent(2), at(1));
    assert_eq!(sent(&step), [attempt(id, 0, 1), attempt(id, 1, 1)]);
    let (reply, answer) = oneshot::channel();
    let reconcile = HandlerCommand::Reconcile {
        handler,
        running: Default::default(),
        reported: [attempt(id, 0, 1)].into_iter().collect(),
        dropped_before: Some(at(3)),
        reply,
    };
    let step = core.turn([reconcile.into()], at(5));
    assert_eq!(
        written(&step, id),
        [(1, TaskState::Running, 2)],
        "only what it neither runs nor reported on runs again"
    );
    let reconciled = answer_of(step, answer);
    assert_eq!((reconciled.adopted, reconciled.dropped), (0, 1));
    let done = complete(attempt(id, 0, 1), handler, Outcome::Succeeded { output: Vec::new() });
    let step = core.turn([done], at(6));
    assert_eq!(written(&step, id), [(0, TaskState::Succeeded, 1)], "the outcome that came back is applied");
}

#[test]
fn a_task_lent_to_another_instances_handler_is_held_here_and_ends_by_that_handlers_report() {
    let mut core = Core::new(Options::default(), broadcast::channel(16).0);
    let (id, step) = submit(&mut core, spec(2), at(1));
    assert!(sent(&step).is_empty(), "no handler is connected here");
    let theirs = HandlerId::new();
    let (reply, answer) = oneshot::channel();
    let offer = FreeSlots { handler: theirs, total: 2, job_types: vec![(Arc::from("noop"), 2)] };
    let step = core.turn([ClusterCommand::Lend { slots: vec![offer], reply }.into()], at(2));
    assert_eq!(written(&step, id), [(0, TaskState::Assigned, 1)], "held by their handler, durable before it leaves");
    assert!(sent(&step).is_empty(), "a lent attempt goes out through its borrower, not from here");
    let lent = answer_of(step, answer);
    assert_eq!(lent.iter().map(|(h, a)| (*h, a.attempt)).collect::<Vec<_>>(), [(theirs, attempt(id, 0, 1))]);
    let done = || Outcome::Succeeded { output: Vec::new() };
    assert!(core.turn([complete(attempt(id, 0, 1), HandlerId::new(), done())], at(3)).batch.is_empty());
    let step = core.turn([complete(attempt(id, 0, 1), theirs, done())], at(4));
    assert_eq!(
        written(&step, id),
        [(0, TaskState::Succeeded, 1), (1, TaskState::Ready, 0)],
        "its child waits for a handler"
    );
    let (reply, answer) = oneshot::channel();
    let offer = FreeSlots { handler: theirs, total: 1, job_types: vec![(Arc::from("noop"), 1)] };
    let step = core.turn([ClusterCommand::Lend { slots: vec![offer], reply }.into()], at(5));
    assert_eq!(answer_of(step, answer).len(), 1, "the task it released is lent in its turn");
}

#[test]
fn a_leader_lends_no_task_of_a_type_its_own_handlers_keep_pace_with() {
    let (mut core, ours, _orders) = core_with_a_handler();
    let (id, step) = submit(&mut core, independent(6), at(1));
    assert_eq!(sent(&step), [attempt(id, 0, 1), attempt(id, 1, 1)], "two slots here");
    let done = || Outcome::Succeeded { output: Vec::new() };
    // Both end in no time: the slots here turn far faster than tasks start.
    let step = core.turn([complete(attempt(id, 0, 1), ours, done()), complete(attempt(id, 1, 1), ours, done())], at(1));
    assert_eq!(sent(&step), [attempt(id, 2, 1), attempt(id, 3, 1)]);
    assert_eq!(lent_elsewhere(&mut core, at(1)), 0, "the two tasks queued stay for the handler here");
    // Tasks that hold a slot here for 10 s each: the slots here no longer keep pace.
    let step = core.turn([complete(attempt(id, 2, 1), ours, done())], at(11));
    assert_eq!(sent(&step), [attempt(id, 4, 1)]);
    assert_eq!(lent_elsewhere(&mut core, at(11)), 1, "the task still queued is lent");
}

#[test]
fn a_reports_wait_for_the_loop_is_not_counted_as_its_handlers_time() {
    let (mut core, ours, _orders) = core_with_a_handler();
    let (id, _) = submit(&mut core, independent(4), at(1));
    // The report reached the server at once and waited 10 s for the loop
    // (`Command::taken`, tested with the loop).
    let report = ReportCommand::Complete {
        attempt: attempt(id, 0, 1),
        handler: ours,
        outcome: Outcome::Succeeded { output: Vec::new() },
        received: None,
        waited_ms: 10_000,
        answer: None,
    };
    let step = core.turn([report.into()], at(11));
    assert_eq!(sent(&step), [attempt(id, 2, 1)]);
    assert_eq!(lent_elsewhere(&mut core, at(11)), 0, "its slot turned in no time: the task queued stays here");
}

/// How many tasks a leader lends to four `noop` slots another instance offers.
fn lent_elsewhere(core: &mut Core, now: Timestamp) -> usize {
    let (reply, answer) = oneshot::channel();
    let offer = FreeSlots { handler: HandlerId::new(), total: 4, job_types: vec![(Arc::from("noop"), 4)] };
    let step = core.turn([ClusterCommand::Lend { slots: vec![offer], reply }.into()], now);
    answer_of(step, answer).len()
}

#[test]
fn an_adopted_job_keeps_the_attempt_borrowed_here_and_its_report_completes_it_here() {
    let mut core = Core::new(Options::default(), broadcast::channel(16).0);
    let handler = HandlerId::new();
    let (connect, _orders) = connection_with_slots(handler, 1, 1);
    core.turn([connect], T0);
    let spec = spec(2);
    let mut stored = StoredJob { record: record(&spec, JobState::Running), spec: spec.clone(), tasks: Vec::new() };
    let id = stored.record.id;
    let borrowed = lent_from_elsewhere(attempt(id, 0, 1));
    let (reply, _unsent) = oneshot::channel();
    let step =
        core.turn([ClusterCommand::Borrowed { handler, reserved: 0, lent: vec![borrowed], reply }.into()], at(2));
    assert_eq!(sent(&step), [attempt(id, 0, 1)]);
    // Its leader went away; this instance claims the job as the leader left it.
    let mut running = TaskRecord::initial(false, at(0));
    running.set_phase(Phase::Held(Hold { handler, assigned_at: at(2), started_at: Some(at(2)) }), at(2));
    running.attempt = 1;
    stored.tasks = vec![running, TaskRecord::initial(true, at(0))];
    let (reply, answer) = oneshot::channel();
    let step =
        core.turn([ClusterCommand::Adopt { jobs: vec![stored.clone()], priorities: Vec::new(), reply }.into()], at(3));
    let leader = step.batch.jobs.iter().find(|j| j.id == id).and_then(|j| j.handler);
    assert_eq!(leader, Some(core.options.instance), "the job's record names its new leader");
    assert!(sent(&step).is_empty(), "its running attempt is not sent again");
    assert_eq!(answer_of(step, answer), 1);
    let (reply, answer) = oneshot::channel();
    assert_eq!(
        answer_of(
            core.turn([ClusterCommand::Adopt { jobs: vec![stored], priorities: Vec::new(), reply }.into()], at(4)),
            answer
        ),
        0
    );
    let step = core.turn([complete(attempt(id, 0, 1), handler, Outcome::Succeeded { output: Vec::new() })], at(5));
    assert_eq!(written(&step, id), [(0, TaskState::Succeeded, 1), (1, TaskState::Running, 1)]);
    assert_eq!(
        sent(&step),
        [attempt(id, 1, 1)],
        "the handler's one slot, the borrowed attempt's no more, runs the next task"
    );
}

#[test]
fn only_jobs_no_attempt_runs_for_are_released_to_other_instances() {
    let (mut core, _handler, _orders) = core_with_a_handler();
    let (busy, step) = submit(&mut core, independent(2), at(1));
    assert_eq!(sent(&step).len(), 2, "both of the handler's slots run the first job");
    let (idle, step) = submit(&mut core, spec(1), at(2));
    assert!(sent(&step).is_empty());
    let (reply, answer) = oneshot::channel();
    let step = core.turn([ClusterCommand::Release { up_to: 5, reply }.into()], at(3));
    assert_eq!(step.batch.released, [idle], "the release is written with the step");
    assert_eq!(answer_of(step, answer), [idle]);
    for (job, led) in [(busy, true), (idle, false)] {
        let (reply, answer) = oneshot::channel();
        let summary = answer_of(core.turn([Query::Summary { job, reply }.into()], at(4)), answer);
        assert_eq!(summary.is_some(), led, "{job} led here");
    }
}

/// An audit record of `action` by `who`, as the API makes one.
fn audit_entry(action: &str) -> crate::model::audit::Entry {
    let at_ms = T0.0 as u64;
    crate::model::audit::Record {
        id: crate::model::audit::new_id(at_ms),
        at_ms,
        who: "ana".into(),
        role: "operator".into(),
        from: "127.0.0.1".into(),
        action: action.into(),
        target: String::new(),
        args: Default::default(),
        outcome: crate::model::audit::OK.into(),
    }
    .entry()
}

#[test]
fn an_audited_cancel_is_written_in_the_step_that_cancels_and_a_refused_one_not_at_all() {
    let (mut core, _handler, job) = core_running_a_chain();
    let entry = audit_entry("job.cancel");
    let (reply, answer) = oneshot::channel();
    let step = core.turn([JobCommand::Cancel { job, audit: Some(entry.clone()), reply }.into()], at(2));
    assert!(written(&step, job).contains(&(1, TaskState::Canceled, 0)), "the cancel is in the step");
    assert_eq!(step.batch.settings, [(entry.key.clone(), Some(entry.bytes))], "so is its record");
    assert!(answer_of(step, answer).is_ok());

    let (reply, answer) = oneshot::channel();
    let unknown = JobId::new();
    let step =
        core.turn([JobCommand::Cancel { job: unknown, audit: Some(audit_entry("job.cancel")), reply }.into()], at(3));
    assert!(step.batch.settings.is_empty(), "a cancel refused writes no record: the API records its refusal");
    assert!(answer_of(step, answer).is_err());
}

#[test]
fn an_audited_submit_is_written_with_the_job() {
    let mut core = Core::new(Options::default(), broadcast::channel(16).0);
    let (id, (reply, _answer)) = (JobId::new(), oneshot::channel());
    let entry = audit_entry("job.submit");
    let step = core.turn(
        [JobCommand::Submit { id, spec: spec(2), origin: JobOrigin::User, audit: Some(entry.clone()), reply }.into()],
        at(1),
    );
    assert_eq!(step.batch.new_jobs.len(), 1);
    assert_eq!(step.batch.settings, [(entry.key, Some(entry.bytes))]);
}

#[test]
fn a_failed_jobs_notification_is_written_in_the_step_that_ends_it() {
    use crate::model::notify::{Event, Kind, Routes, PREFIX};
    let kinds = [Kind::JobFailed];
    let options = Options { notify: Routes::new([("ops", &kinds[..])]), ..Options::default() };
    let mut core = Core::new(options, broadcast::channel(16).0);
    let handler = HandlerId::new();
    let (connect, _orders) = connection(handler, 1);
    core.turn([connect], T0);
    let (id, (reply, _answer)) = (JobId::new(), oneshot::channel());
    let step = core
        .turn([JobCommand::Submit { id, spec: spec(2), origin: JobOrigin::User, audit: None, reply }.into()], at(1));
    assert!(step.batch.settings.is_empty(), "a submit is no notification");
    let mut number = 1;
    let step = loop {
        let failed = Outcome::Failed { error: "disk full".into(), output: vec![] };
        let step = core.turn([complete(attempt(id, 0, number), handler, failed)], at(1 + i64::from(number)));
        if step.batch.jobs.iter().any(|j| j.id == id && j.state == JobState::Failed) {
            break step;
        }
        assert!(step.batch.settings.is_empty(), "a retry is no notification");
        number += 1;
        assert!(number < 10, "the job never failed");
    };
    let [(key, Some(bytes))] = step.batch.settings.as_slice() else { panic!("one event: {:?}", step.batch.settings) };
    let event = Event::decode(bytes).expect("an outbox event");
    assert!(key.starts_with(PREFIX));
    assert_eq!((event.kind, event.endpoints.as_slice()), (Kind::JobFailed, &["ops".to_string()][..]));
    assert_eq!(event.payload["job"]["id"], id.to_string());
    assert_eq!(event.payload["failed_tasks"][0]["id"], "t0");
    assert_eq!(event.payload["failed_tasks"][0]["error"], "disk full");
}

/// Maintenance windows of `noop` (T0 is a Thursday, 12:00 UTC).
fn noop_window(windows: &str, on_close: crate::windows::OnClose, grace_seconds: u32) -> Command {
    let calendar = crate::windows::parse_windows(windows).expect("valid windows");
    let window = crate::windows::Window { calendar, on_close, grace_seconds };
    JobCommand::SetWindow { job_type: Arc::from("noop"), window: Some(Arc::new(window)) }.into()
}

/// The attempts a step tells handlers to stop.
fn canceled(step: &Step) -> Vec<AttemptId> {
    step.actions
        .iter()
        .filter_map(|action| match action {
            Action::Send { order: WorkOrder::Cancel { attempt }, .. } => Some(*attempt),
            _ => None,
        })
        .collect()
}

const MB: u64 = 1_000_000;

/// `n` independent tasks of `job_type`, each on a volume server pair of its own.
fn of_type(job_type: &str, n: usize) -> Arc<JobSpec> {
    let tasks: Vec<String> = (0..n)
        .map(|i| {
            format!(
                r#"{{"id":"t{i}","job_type":"{job_type}","parameters":{{}},"labels":{{"source_node":"s{i}:8080","target_node":"d{i}:8080"}}}}"#
            )
        })
        .collect();
    let text = format!(r#"{{"name":"moves","tasks":[{}]}}"#, tasks.join(","));
    Arc::new(jobfile::parse(text.as_bytes(), Format::Json, "test", &Limits::default()).expect("valid"))
}

fn budget_of(cluster: u64, minimum: u64) -> Command {
    let budget = crate::budget::Budget { cluster, per_server: None, minimum };
    JobCommand::SetBudget { budget: Some(budget), marks: Default::default() }.into()
}

/// The attempts a step sends with the share of the budget each carries.
fn shares_sent(step: &Step) -> Vec<(AttemptId, Option<u64>)> {
    step.actions
        .iter()
        .filter_map(|action| match action {
            Action::Send { order: WorkOrder::Execute(assignment), .. } => {
                Some((assignment.attempt, assignment.io_byte_per_second))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_closed_window_holds_ready_tasks_until_it_opens_and_the_loop_sleeps_until_then() {
    let (mut core, _handler, _orders) = core_with_a_handler();
    core.turn([noop_window("Thu 13:00-14:00 UTC", crate::windows::OnClose::Drain, 60)], T0);
    let (id, step) = submit(&mut core, independent(2), at(1));
    assert_eq!(sent(&step), [], "nothing of a closed type is dispatched");
    assert_eq!(core.next_wake(at(0)), Some(at(3600)), "the loop wakes when the window opens, not before");
    assert_eq!(sent(&core.turn([], at(3599))), []);
    assert_eq!(sent(&core.turn([], at(3600))), [attempt(id, 0, 1), attempt(id, 1, 1)]);
    assert_eq!(core.next_wake(at(0)), Some(at(7200)), "then when it closes");
}

#[test]
fn a_window_that_closes_with_cancel_gives_its_attempts_back_uncounted_at_once() {
    let (mut core, _handler, _orders) = core_with_a_handler();
    core.turn([noop_window("Thu 11:00-12:30 UTC", crate::windows::OnClose::Cancel, 600)], T0);
    let (id, step) = submit(&mut core, independent(2), at(1));
    assert_eq!(sent(&step).len(), 2);
    let step = core.turn([], at(1800));
    assert_eq!(canceled(&step), [attempt(id, 0, 1), attempt(id, 1, 1)]);
    assert_eq!(written(&step, id), [(0, TaskState::Ready, 1), (1, TaskState::Ready, 1)]);
    let task = &step.batch.tasks.last().expect("written").2;
    assert_eq!((task.failures, task.lost), (0, 0), "no try is spent");
    assert!(task.error.as_deref().is_some_and(|e| e.contains("maintenance window of noop closed")));
    assert_eq!(core.next_wake(at(0)), Some(at(7 * 86_400 - 3600)), "next Thursday at 11:00, nothing sooner");
    let again = core.turn([], at(1801));
    assert!(canceled(&again).is_empty() && sent(&again).is_empty() && again.batch.is_empty());
    // The next window runs them again, as their second attempt.
    assert_eq!(sent(&core.turn([], at(7 * 86_400 - 3600))), [attempt(id, 0, 2), attempt(id, 1, 2)]);
}

#[test]
fn a_window_that_closes_with_drain_cancels_only_after_its_grace_and_wakes_no_more_after() {
    let (mut core, handler, _orders) = core_with_a_handler();
    core.turn([noop_window("Thu 11:00-12:30 UTC", crate::windows::OnClose::Drain, 60)], T0);
    let (id, _) = submit(&mut core, independent(2), at(1));
    let step = core.turn([], at(1800));
    assert!(canceled(&step).is_empty() && step.batch.is_empty(), "draining");
    assert_eq!(core.next_wake(at(0)), Some(at(1860)), "the drain's grace");
    // One ends on its own within the grace; the other is canceled at its end.
    let done = core.turn([complete(attempt(id, 0, 1), handler, Outcome::Succeeded { output: Vec::new() })], at(1830));
    assert_eq!(written(&done, id), [(0, TaskState::Succeeded, 1)]);
    let step = core.turn([], at(1860));
    assert_eq!(canceled(&step), [attempt(id, 1, 1)]);
    assert_eq!(written(&step, id), [(1, TaskState::Ready, 1)]);
    assert_eq!(core.next_wake(at(0)), Some(at(7 * 86_400 - 3600)), "the grace is over: no wake before the next window");
    assert!(core.turn([], at(1861)).actions.is_empty());
}

#[test]
fn in_a_cluster_windows_wait_for_the_database_clock_and_follow_it() {
    let options = Options { database_clock: true, ..Options::default() };
    let mut core = Core::new(options, broadcast::channel(16).0);
    let (connect, _orders) = connection(HandlerId::new(), 1);
    core.turn([connect, noop_window("Thu 13:00-14:00 UTC", crate::windows::OnClose::Drain, 60)], T0);
    // This machine's clock says 13:30, in the window; until the database's is known, nothing runs.
    let (id, step) = submit(&mut core, independent(1), at(5400));
    assert_eq!(sent(&step), []);
    // The database's clock is two hours behind: 11:30 there, closed.
    assert_eq!(sent(&core.turn([ClusterCommand::DatabaseTime { offset_ms: -7_200_000 }.into()], at(5400))), []);
    assert_eq!(core.next_wake(at(0)), Some(at(10_800)), "13:00 on the database's clock");
    assert_eq!(sent(&core.turn([], at(10_800))), [attempt(id, 0, 1)]);
}

/// The shares a step's batch keeps (`Some`) or forgets (`None`), by attempt.
fn shares_kept(step: &Step) -> Vec<(String, Option<u64>)> {
    let shares = step.batch.settings.iter().filter_map(|(key, value)| {
        let attempt = key.strip_prefix(super::SHARE)?.to_string();
        let share = value.as_ref().map(|v| serde_json::from_slice::<crate::budget::Share>(v).unwrap());
        Some((attempt, share.map(|s| s.bytes_per_second)))
    });
    shares.collect()
}

#[test]
fn budgeted_tasks_start_with_their_share_kept_in_the_store_and_one_waits_while_too_little_is_free() {
    let mut core = Core::new(Options::default(), broadcast::channel(16).0);
    let handler = HandlerId::new();
    let (connect, _orders) = connection_with_slots(handler, 1, 4);
    core.turn([connect, budget_of(20 * MB, 8 * MB)], T0);
    let (id, step) = submit(&mut core, of_type("volume_balance", 3), at(1));
    // An even split of 20 MB/s over three is under the 8 MB/s minimum: two
    // start with the minimum, and the third waits for 8 MB/s to be free.
    assert_eq!(shares_sent(&step), [(attempt(id, 0, 1), Some(8 * MB)), (attempt(id, 1, 1), Some(8 * MB))]);
    assert_eq!(
        shares_kept(&step),
        [(attempt(id, 0, 1).to_string(), Some(8 * MB)), (attempt(id, 1, 1).to_string(), Some(8 * MB))],
        "each share is written in the step that starts its task"
    );
    // A type that does not share the budget is not held back by it.
    let (noop, step) = submit(&mut core, independent(1), at(2));
    assert_eq!(shares_sent(&step), [(attempt(noop, 0, 1), None)]);
    let done = || Outcome::Succeeded { output: Vec::new() };
    let step = core.turn([complete(attempt(id, 0, 1), handler, done())], at(3));
    assert_eq!(shares_sent(&step), [(attempt(id, 2, 1), Some(10 * MB))], "half of the budget for each of two");
    assert_eq!(
        shares_kept(&step),
        [(attempt(id, 0, 1).to_string(), None), (attempt(id, 2, 1).to_string(), Some(10 * MB))],
        "the ended task's share is forgotten in the step that ends it"
    );
    let (more, step) = submit(&mut core, of_type("volume_balance", 1), at(4));
    assert!(sent(&step).is_empty(), "2 MB/s is free, under the minimum");
    let clear = JobCommand::SetBudget { budget: None, marks: Default::default() };
    let step = core.turn([clear.into()], at(5));
    assert_eq!(
        shares_sent(&step),
        [(attempt(more, 0, 1), None)],
        "without a budget nothing waits for one, nor gets a share"
    );
}

#[test]
fn a_policy_marks_a_job_type_as_sharing_the_budget_or_not() {
    let (mut core, _handler, _orders) = core_with_a_handler();
    let budget = crate::budget::Budget { cluster: 10 * MB, per_server: None, minimum: MB };
    let marks = [(Arc::from("noop"), true), (Arc::from("volume_balance"), false)].into_iter().collect();
    core.turn([JobCommand::SetBudget { budget: Some(budget), marks }.into()], T0);
    let (noop, step) = submit(&mut core, independent(1), at(1));
    assert_eq!(shares_sent(&step), [(attempt(noop, 0, 1), Some(10 * MB))]);
    let (balance, step) = submit(&mut core, of_type("volume_balance", 1), at(2));
    assert_eq!(shares_sent(&step), [(attempt(balance, 0, 1), None)]);
}

#[test]
fn after_a_restart_a_held_attempt_counts_the_share_its_worker_was_given() {
    let mut core = Core::new(Options::default(), broadcast::channel(16).0);
    let handler = HandlerId::new();
    let spec = of_type("volume_balance", 2);
    let mut stored = StoredJob { record: record(&spec, JobState::Running), spec: spec.clone(), tasks: Vec::new() };
    let id = stored.record.id;
    let mut running = TaskRecord::initial(true, at(0));
    running.set_phase(Phase::Held(Hold { handler, assigned_at: at(0), started_at: Some(at(0)) }), at(0));
    running.attempt = 1;
    stored.tasks = vec![running, TaskRecord::initial(true, at(0))];
    let share = crate::budget::Share {
        bytes_per_second: 15 * MB,
        job_type: Arc::from("volume_balance"),
        servers: vec![Arc::from("s0:8080"), Arc::from("d0:8080")].into(),
    };
    let kept = vec![(format!("{}{}", super::SHARE, attempt(id, 0, 1)), serde_json::to_vec(&share).unwrap())];
    core.remember(Vec::new(), Vec::new(), kept);
    core.restore(vec![stored], at(1), &mut Step::default());
    let (connect, _orders) = connection(handler, 1);
    let step = core.turn([connect, budget_of(20 * MB, 8 * MB)], at(2));
    assert!(sent(&step).is_empty(), "5 MB/s is free: under the minimum, the second task waits");
    let step = core.turn([complete(attempt(id, 0, 1), handler, Outcome::Succeeded { output: Vec::new() })], at(3));
    assert_eq!(shares_sent(&step), [(attempt(id, 1, 1), Some(20 * MB))]);
    assert_eq!(shares_kept(&step)[0], (attempt(id, 0, 1).to_string(), None), "the kept share is forgotten");
}

#[test]
fn an_attempt_adopted_while_its_window_is_closed_drains_and_is_canceled() {
    let (mut core, handler, _orders) = core_with_a_handler();
    core.turn([noop_window("Thu 11:00-12:00 UTC", crate::windows::OnClose::Drain, 60)], T0);
    let spec = spec(1);
    let mut stored = StoredJob { record: record(&spec, JobState::Running), spec: spec.clone(), tasks: Vec::new() };
    let id = stored.record.id;
    let mut running = TaskRecord::initial(true, at(0));
    running.set_phase(Phase::Held(Hold { handler, assigned_at: at(0), started_at: Some(at(0)) }), at(0));
    running.attempt = 1;
    stored.tasks = vec![running];
    let (reply, _answer) = oneshot::channel();
    let step = core.turn([ClusterCommand::Adopt { jobs: vec![stored], priorities: Vec::new(), reply }.into()], at(10));
    assert!(canceled(&step).is_empty(), "it drains first");
    assert_eq!(core.next_wake(at(0)), Some(at(60)), "until the grace's end, counted from the close");
    let step = core.turn([], at(60));
    assert_eq!(canceled(&step), [attempt(id, 0, 1)]);
    assert_eq!(written(&step, id), [(0, TaskState::Ready, 1)]);
}

#[test]
fn a_drain_without_bound_lets_what_runs_end_on_its_own() {
    let (mut core, handler, _orders) = core_with_a_handler();
    core.turn([noop_window("Thu 11:00-12:30 UTC", crate::windows::OnClose::Drain, 0)], T0);
    let (id, _) = submit(&mut core, independent(1), at(1));
    let step = core.turn([], at(1800));
    assert!(canceled(&step).is_empty());
    assert_eq!(core.next_wake(at(0)), Some(at(7 * 86_400 - 3600)), "nothing to wake for before the next window");
    assert!(canceled(&core.turn([], at(86_400))).is_empty());
    let done = core.turn([complete(attempt(id, 0, 1), handler, Outcome::Succeeded { output: Vec::new() })], at(86_401));
    assert_eq!(written(&done, id), [(0, TaskState::Succeeded, 1)]);
}

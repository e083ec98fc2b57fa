//! Each recovery rule on hand-made snapshots, and properties over generated ones.

use std::collections::{BTreeMap, BTreeSet};

use jobcenter_recovery::{
    check, Action, Config, HandlerSnapshot, JobSnapshot, Millis, Rule, Snapshot, TaskSnapshot, TaskState,
};
use proptest::prelude::*;

const NOW: Millis = 10_000_000;
const MINUTE: Millis = 60_000;

fn task(idx: u32, state: TaskState, handler: Option<&str>, updated_at: Millis) -> TaskSnapshot {
    TaskSnapshot {
        idx,
        id: format!("t{idx}"),
        state,
        attempt: if state.is_held() || state.is_terminal() { 1 } else { 0 },
        handler: handler.map(String::from),
        assigned_at: state.is_held().then_some(updated_at),
        started_at: None,
        updated_at,
        finished_at: state.is_terminal().then_some(updated_at),
        pinned_node: None,
        progress_timeout_ms: None,
        queued: state == TaskState::Ready,
    }
}

fn job(id: &str, tasks: Vec<TaskSnapshot>) -> JobSnapshot {
    let unfinished = tasks.iter().filter(|t| !t.state.is_terminal()).count();
    JobSnapshot { id: id.into(), active: true, from_scheduler: false, updated_at: NOW - MINUTE, unfinished, tasks }
}

fn snapshot(jobs: Vec<JobSnapshot>, handlers: &[(&str, &str, Millis)]) -> Snapshot {
    Snapshot {
        now: NOW,
        config: Config::default(),
        handlers: handlers
            .iter()
            .map(|(h, node, seen)| {
                (
                    h.to_string(),
                    HandlerSnapshot { handler: h.to_string(), node: node.to_string(), last_seen: *seen, knows: None },
                )
            })
            .collect(),
        jobs,
    }
}

fn rules(findings: &[jobcenter_recovery::Finding]) -> Vec<Rule> {
    findings.iter().map(|f| f.rule).collect()
}

#[test]
fn a_healthy_job_has_no_findings() {
    let s = snapshot(
        vec![job(
            "j",
            vec![
                task(0, TaskState::Running, Some("h1"), NOW - 1000),
                task(1, TaskState::Ready, None, NOW),
                task(2, TaskState::Pending, None, NOW),
            ],
        )],
        &[("h1", "node-a", NOW - 1000)],
    );
    assert!(check(&s).is_empty());
}

#[test]
fn r1_a_held_task_without_handler_is_resubmitted() {
    let s = snapshot(vec![job("j", vec![task(0, TaskState::Assigned, None, NOW - 5000)])], &[]);
    let findings = check(&s);
    assert_eq!(rules(&findings), [Rule::HeldWithoutHandler]);
    assert_eq!(findings[0].action, Action::Resubmit { job: "j".into(), task: 0, attempt: 1 });
}

#[test]
fn r2_a_task_of_a_gone_handler_is_resubmitted() {
    let s = snapshot(vec![job("j", vec![task(0, TaskState::Running, Some("dead"), NOW - 3000)])], &[("h1", "a", NOW)]);
    let findings = check(&s);
    assert_eq!(rules(&findings), [Rule::HandlerGone]);
    assert_eq!(findings[0].handler.as_deref(), Some("dead"));
    assert_eq!(findings[0].age_ms, 3000);
    assert_eq!(findings[0].action, Action::Resubmit { job: "j".into(), task: 0, attempt: 1 });
}

#[test]
fn r2_undelivered_a_task_its_live_handler_never_got_is_resubmitted_after_the_grace() {
    let grace = Config::default().delivery_grace_ms;
    let held = |age: Millis, knows: Option<Vec<(&str, u32, u32)>>| {
        let mut s = snapshot(
            vec![job("j", vec![task(0, TaskState::Assigned, Some("h1"), NOW - age)])],
            &[("h1", "node-a", NOW - 500)],
        );
        s.handlers.get_mut("h1").unwrap().knows =
            knows.map(|k| k.into_iter().map(|(j, t, a)| (j.to_string(), t, a)).collect());
        s
    };
    // Never sent, and long enough ago: taken back.
    let findings = check(&held(grace + 1, Some(vec![])));
    assert_eq!(rules(&findings), [Rule::NotDelivered]);
    assert_eq!(findings[0].action, Action::Resubmit { job: "j".into(), task: 0, attempt: 1 });
    // Within the grace it may still be on its way.
    assert!(check(&held(grace, Some(vec![]))).is_empty());
    // Known to the session (sent, running or reported), or not known yet: left alone.
    assert!(check(&held(10 * grace, Some(vec![("j", 0, 1)]))).is_empty());
    assert!(check(&held(10 * grace, None)).is_empty());
    // An older attempt of the task known to the session does not count.
    assert_eq!(rules(&check(&held(grace + 1, Some(vec![("j", 0, 2)])))), [Rule::NotDelivered]);
}

#[test]
fn r3_a_silent_handler_loses_its_task_after_the_timeout_only() {
    let silent_for = |millis: Millis| {
        snapshot(
            vec![job("j", vec![task(0, TaskState::Running, Some("h1"), NOW - millis)])],
            &[("h1", "node-a", NOW - millis)],
        )
    };
    assert!(check(&silent_for(5 * MINUTE)).is_empty(), "exactly the timeout is not yet silence");
    let findings = check(&silent_for(5 * MINUTE + 1));
    assert_eq!(rules(&findings), [Rule::HandlerSilent]);
    assert!(matches!(findings[0].action, Action::Resubmit { .. }));
    // A recent heartbeat, or a recent task update, keeps it alive.
    let heard = snapshot(
        vec![job("j", vec![task(0, TaskState::Running, Some("h1"), NOW - 10 * MINUTE)])],
        &[("h1", "a", NOW - 1000)],
    );
    assert!(check(&heard).is_empty());
}

#[test]
fn r3_a_task_without_progress_for_too_long_is_resubmitted_though_its_handler_lives() {
    let day = 24 * 3600 * 1000;
    let stuck = |millis: Millis| {
        snapshot(
            vec![job("j", vec![task(0, TaskState::Running, Some("h1"), NOW - millis)])],
            &[("h1", "node-a", NOW - 1000)],
        )
    };
    assert!(check(&stuck(day)).is_empty());
    let findings = check(&stuck(day + 1));
    assert_eq!(rules(&findings), [Rule::NoProgress]);
    assert!(matches!(findings[0].action, Action::Resubmit { .. }));
}

#[test]
fn r3_a_task_with_an_estimated_runtime_is_stuck_after_twice_that() {
    let estimated = |own: Option<Millis>, millis: Millis| {
        let mut t = task(0, TaskState::Running, Some("h1"), NOW - millis);
        t.progress_timeout_ms = own;
        snapshot(vec![job("j", vec![t])], &[("h1", "node-a", NOW - 1000)])
    };
    assert!(check(&estimated(Some(4000), 4000)).is_empty());
    let findings = check(&estimated(Some(4000), 4001));
    assert_eq!(rules(&findings), [Rule::NoProgress]);
    assert!(findings[0].detail.contains("twice its estimated runtime"), "{}", findings[0].detail);
    // A longer estimate than the configured limit does not lengthen it.
    let day = 24 * 3600 * 1000;
    assert_eq!(rules(&check(&estimated(Some(10 * day), day + 1))), [Rule::NoProgress]);
}

#[test]
fn r3_a_task_pinned_to_a_silent_node_fails_instead() {
    let mut pinned = task(0, TaskState::Running, Some("h1"), NOW - 10 * MINUTE);
    pinned.pinned_node = Some("node-a".into());
    let s = snapshot(vec![job("j", vec![pinned])], &[("h1", "node-a", NOW - 10 * MINUTE)]);
    let findings = check(&s);
    assert_eq!(rules(&findings), [Rule::PinnedNodeDown]);
    assert_eq!(findings[0].action, Action::FailTask { job: "j".into(), task: 0, attempt: 1 });
}

#[test]
fn r4_a_ready_task_in_no_queue_is_dispatched() {
    let mut lost = task(1, TaskState::Ready, None, NOW - 2000);
    lost.queued = false;
    let s = snapshot(vec![job("j", vec![task(0, TaskState::Succeeded, Some("h1"), NOW - 3000), lost])], &[]);
    let findings = check(&s);
    assert_eq!(rules(&findings), [Rule::ReadyNotDispatched]);
    assert_eq!(findings[0].action, Action::Dispatch { job: "j".into(), task: 1 });
}

#[test]
fn r5_a_job_whose_tasks_ended_is_finalized_after_the_grace() {
    let ended = |ago: Millis| {
        snapshot(
            vec![job(
                "j",
                vec![
                    task(0, TaskState::Succeeded, Some("h"), NOW - ago),
                    task(1, TaskState::Failed, Some("h"), NOW - ago),
                ],
            )],
            &[],
        )
    };
    assert!(check(&ended(30_000)).is_empty(), "within the grace the leader may still be at it");
    let findings = check(&ended(MINUTE + 1));
    assert_eq!(rules(&findings), [Rule::JobNotFinalized]);
    assert_eq!(findings[0].action, Action::Finalize { job: "j".into() });
    let mut finalized = ended(2 * MINUTE);
    finalized.jobs[0].active = false;
    assert!(check(&finalized).is_empty(), "a finalized job is left alone");
}

#[test]
fn r6_a_scheduler_job_is_failed_instead_of_resubmitted() {
    let mut j = job(
        "sched",
        vec![
            task(0, TaskState::Running, Some("dead"), NOW - 1000),
            task(1, TaskState::Running, Some("dead"), NOW - 2000),
            task(2, TaskState::Pending, None, NOW),
        ],
    );
    j.from_scheduler = true;
    let findings = check(&snapshot(vec![j], &[]));
    assert_eq!(rules(&findings), [Rule::SchedulerJob], "one finding for the whole job");
    assert_eq!(findings[0].action, Action::FailJob { job: "sched".into() });
    assert!(findings[0].detail.contains("t0") && findings[0].detail.contains("t1"), "{}", findings[0].detail);
}

// Properties over generated snapshots.

fn arb_task(idx: u32) -> impl Strategy<Value = TaskSnapshot> {
    (
        prop_oneof![
            Just(TaskState::Pending),
            Just(TaskState::Ready),
            Just(TaskState::Assigned),
            Just(TaskState::Running),
            Just(TaskState::Succeeded),
            Just(TaskState::Failed),
            Just(TaskState::UpstreamFailed),
            Just(TaskState::Canceled),
        ],
        prop::option::weighted(0.9, 0usize..4),
        0..20 * MINUTE,
        any::<bool>(),
        prop::option::of(0usize..4),
        1u32..4,
    )
        .prop_map(move |(state, handler, age, queued, pinned, attempt)| TaskSnapshot {
            idx,
            id: format!("t{idx}"),
            state,
            attempt,
            handler: handler.map(|h| format!("h{h}")),
            assigned_at: Some(NOW - age),
            started_at: None,
            updated_at: NOW - age,
            finished_at: state.is_terminal().then_some(NOW - age),
            pinned_node: pinned.map(|n| format!("node{n}")),
            progress_timeout_ms: None,
            queued,
        })
}

fn arb_snapshot() -> impl Strategy<Value = Snapshot> {
    let job = (1u32..8, any::<bool>(), any::<bool>()).prop_flat_map(|(n, active, from_scheduler)| {
        ((0..n).map(arb_task).collect::<Vec<_>>(), Just(active), Just(from_scheduler))
    });
    let handlers = proptest::collection::btree_map(0usize..4, (0usize..4, 0..20 * MINUTE), 0..4);
    (proptest::collection::vec(job, 0..6), handlers).prop_map(|(jobs, handlers)| Snapshot {
        now: NOW,
        config: Config::default(),
        handlers: handlers
            .into_iter()
            .map(|(h, (node, age))| {
                let id = format!("h{h}");
                (
                    id.clone(),
                    HandlerSnapshot { handler: id, node: format!("node{node}"), last_seen: NOW - age, knows: None },
                )
            })
            .collect(),
        jobs: jobs
            .into_iter()
            .enumerate()
            .map(|(i, (tasks, active, from_scheduler))| JobSnapshot {
                id: format!("j{i}"),
                active,
                from_scheduler,
                updated_at: NOW - MINUTE,
                unfinished: tasks.iter().filter(|t: &&TaskSnapshot| !t.state.is_terminal()).count(),
                tasks,
            })
            .collect(),
    })
}

proptest! {
    #[test]
    fn findings_act_only_on_what_they_name(s in arb_snapshot()) {
        let jobs: BTreeMap<&str, &JobSnapshot> = s.jobs.iter().map(|j| (j.id.as_str(), j)).collect();
        let findings = check(&s);
        let mut seen_tasks = BTreeSet::new();
        for f in &findings {
            let job = jobs[f.job.as_str()];
            prop_assert!(job.active, "an ended job is left alone");
            match &f.action {
                Action::Resubmit { task, attempt, .. } | Action::FailTask { task, attempt, .. } => {
                    let t = &job.tasks[*task as usize];
                    prop_assert!(t.state.is_held());
                    prop_assert_eq!(*attempt, t.attempt);
                    if matches!(f.action, Action::Resubmit { .. }) {
                        prop_assert!(!job.from_scheduler, "a scheduler job's task is never resubmitted");
                    }
                    prop_assert!(seen_tasks.insert((f.job.clone(), *task)), "one finding per task");
                }
                Action::Dispatch { task, .. } => {
                    let t = &job.tasks[*task as usize];
                    prop_assert!(t.state == TaskState::Ready && !t.queued);
                    prop_assert!(seen_tasks.insert((f.job.clone(), *task)));
                }
                Action::Finalize { .. } => prop_assert!(job.tasks.iter().all(|t| t.state.is_terminal())),
                Action::FailJob { .. } => {
                    prop_assert!(job.from_scheduler);
                    prop_assert_eq!(findings.iter().filter(|g| g.job == f.job && g.rule == Rule::SchedulerJob).count(), 1);
                }
            }
        }
        prop_assert_eq!(check(&s), findings, "the check is deterministic");
    }

    #[test]
    fn every_stuck_task_is_found(s in arb_snapshot()) {
        let findings = check(&s);
        for job in s.jobs.iter().filter(|j| j.active && !j.tasks.iter().all(|t| t.state.is_terminal())) {
            for t in job.tasks.iter().filter(|t| t.state.is_held()) {
                let gone = t.handler.as_ref().is_none_or(|h| !s.handlers.contains_key(h));
                if gone {
                    let found = findings.iter().any(|f| f.job == job.id && (f.task.as_deref() == Some(t.id.as_str()) || f.rule == Rule::SchedulerJob));
                    prop_assert!(found, "task {} of {} held by a gone handler", t.id, job.id);
                }
            }
        }
    }
}

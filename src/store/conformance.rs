//! The conformance suite every store backend must pass: memory, sled and
//! PostgreSQL (`tests/it/store_conformance.rs` runs it against each). Each check
//! takes a store to use and a way to open the same store again.

use std::sync::Arc;

use super::{Batch, JobFilter, Store};
use crate::clock::Timestamp;
use crate::jobfile::{self, Format, Limits};
use crate::model::{
    End, HandlerId, Hold, JobId, JobOrigin, JobRecord, JobSpec, JobState, Phase, TaskIdx, TaskRecord, TaskState,
};

/// Opens the same store again, as after a restart.
pub type Reopen<'a> = &'a dyn Fn() -> Arc<dyn Store>;

/// A chain of `n` tasks.
pub fn spec(n: usize) -> Arc<JobSpec> {
    let tasks: Vec<String> = (0..n)
        .map(|i| {
            let deps = if i == 0 { String::new() } else { format!("\"t{}\"", i - 1) };
            format!(r#"{{"id":"t{i}","job_type":"noop","parameters":{{"n":{i}}},"depends_on":[{deps}]}}"#)
        })
        .collect();
    let text = format!(r#"{{"name":"chain","tasks":[{}]}}"#, tasks.join(","));
    Arc::new(jobfile::parse(text.as_bytes(), Format::Json, "test", &Limits::default()).expect("valid"))
}

pub fn record(spec: &JobSpec, state: JobState) -> JobRecord {
    JobRecord {
        id: JobId::new(),
        name: spec.name.clone(),
        state,
        origin: JobOrigin::User,
        n_tasks: spec.len() as u32,
        fingerprint: spec.fingerprint,
        created_at: Timestamp(1_000),
        updated_at: Timestamp(1_000),
        finished_at: None,
        cancel_requested: false,
        handler: None,
    }
}

fn commit(store: &dyn Store, batch: Batch) {
    store.write(&batch).unwrap();
    store.flush().unwrap();
}

pub fn round_trips_a_new_job(store: &dyn Store) {
    let spec = spec(5);
    let job = record(&spec, JobState::Pending);
    store.write(&Batch { new_jobs: vec![(job.clone(), spec.clone())], ..Batch::default() }).unwrap();
    store.flush().unwrap();
    let stored = store.get_job(job.id).unwrap().expect("stored");
    assert_eq!(stored.record, job);
    assert_eq!(*stored.spec, *spec);
    let states: Vec<TaskState> = stored.tasks.iter().map(|t| t.state()).collect();
    assert_eq!(
        states,
        [TaskState::Ready, TaskState::Pending, TaskState::Pending, TaskState::Pending, TaskState::Pending]
    );
    assert_eq!(store.load_active().unwrap().len(), 1);
    assert!(store.get_job(JobId::new()).unwrap().is_none());
}

pub fn task_records_override_initial_state(store: &dyn Store) {
    let spec = spec(3);
    let job = record(&spec, JobState::Running);
    let mut task = TaskRecord::initial(false, Timestamp(1_000));
    task.phase = Phase::Ended { end: End::Succeeded, at: Timestamp(1_500) };
    task.attempt = 1;
    let batch = Batch {
        new_jobs: vec![(job.clone(), spec)],
        tasks: vec![(job.id, TaskIdx(0), task.clone())],
        ..Batch::default()
    };
    store.write(&batch).unwrap();
    store.flush().unwrap();
    let stored = store.get_job(job.id).unwrap().unwrap();
    assert_eq!(stored.tasks[0], task);
    assert_eq!(stored.tasks[1].phase, Phase::Pending);
}

pub fn terminal_jobs_leave_the_active_set(store: &dyn Store) {
    let spec = spec(2);
    let running = record(&spec, JobState::Running);
    let mut done = record(&spec, JobState::Running);
    store
        .write(&Batch {
            new_jobs: vec![(running.clone(), spec.clone()), (done.clone(), spec.clone())],
            ..Batch::default()
        })
        .unwrap();
    done.state = JobState::Succeeded;
    store.write(&Batch { jobs: vec![done.clone()], ..Batch::default() }).unwrap();
    store.flush().unwrap();
    let active: Vec<JobId> = store.load_active().unwrap().iter().map(|j| j.record.id).collect();
    assert_eq!(active, vec![running.id]);
    let listed = store.list_jobs(&JobFilter::default()).unwrap();
    assert_eq!(listed.iter().map(|j| j.id).collect::<Vec<_>>(), vec![done.id, running.id], "newest first");
    let succeeded = store.list_jobs(&JobFilter { state: Some(JobState::Succeeded), ..JobFilter::default() }).unwrap();
    assert_eq!(succeeded.len(), 1);
    assert_eq!(succeeded[0].id, done.id);
}

pub fn stores_a_large_spec_in_chunks(store: &dyn Store) {
    let spec = spec(30_000);
    let job = record(&spec, JobState::Pending);
    store.write(&Batch { new_jobs: vec![(job.clone(), spec.clone())], ..Batch::default() }).unwrap();
    store.flush().unwrap();
    let stored = store.get_job(job.id).unwrap().unwrap();
    assert_eq!(*stored.spec, *spec);
}

pub fn settings_are_kept_by_key(store: &dyn Store) {
    store.put_setting("policy/vacuum", Some(b"a")).unwrap();
    store.put_setting("policy/balance", Some(b"b")).unwrap();
    store.put_setting("descriptor/vacuum", Some(b"c")).unwrap();
    store.put_setting("policy/balance", Some(b"b2")).unwrap();
    let policies = store.settings("policy/").unwrap();
    assert_eq!(
        policies,
        vec![("policy/balance".to_string(), b"b2".to_vec()), ("policy/vacuum".to_string(), b"a".to_vec())]
    );
    store.put_setting("policy/vacuum", None).unwrap();
    assert_eq!(store.settings("policy/").unwrap().len(), 1);
    // Several prefixes at once: every key under any of them, once, in key
    // order; a key under two prefixes is not repeated, and `_` or `%` in a
    // prefix are no patterns.
    store.put_setting("descriptor/vacuum/x", Some(b"d")).unwrap();
    store.put_setting("pol_cy/x", Some(b"e")).unwrap();
    let keys = |prefixes: &[&str]| -> Vec<String> {
        store.settings_any(prefixes).unwrap().into_iter().map(|(key, _)| key).collect()
    };
    assert_eq!(keys(&["policy/", "descriptor/"]), ["descriptor/vacuum", "descriptor/vacuum/x", "policy/balance"]);
    assert_eq!(keys(&["descriptor/vacuum", "descriptor/"]), ["descriptor/vacuum", "descriptor/vacuum/x"]);
    assert_eq!(keys(&["pol_cy/", "po%"]), ["pol_cy/x"]);
    assert_eq!(keys(&["nothing/"]), Vec::<String>::new());
}

pub fn settings_in_a_batch_are_written_with_it(store: &dyn Store) {
    store.put_setting("runs/vacuum", Some(b"old")).unwrap();
    commit(
        store,
        Batch {
            settings: vec![
                ("runs/vacuum".into(), Some(b"new".to_vec())),
                ("runs/balance".into(), Some(b"b".to_vec())),
                ("runs/gone".into(), Some(b"x".to_vec())),
                ("runs/gone".into(), None),
            ],
            ..Batch::default()
        },
    );
    assert_eq!(
        store.settings("runs/").unwrap(),
        vec![("runs/balance".to_string(), b"b".to_vec()), ("runs/vacuum".to_string(), b"new".to_vec())]
    );
}

pub fn the_last_record_written_for_a_key_wins(store: &dyn Store) {
    let spec = spec(2);
    let mut job = record(&spec, JobState::Pending);
    let mut task = TaskRecord::initial(false, Timestamp(1_000));
    store.write(&Batch { new_jobs: vec![(job.clone(), spec.clone())], ..Batch::default() }).unwrap();
    // Two writes before one flush, and one task twice in one batch: the last one counts.
    job.state = JobState::Running;
    let hold = Hold { handler: HandlerId::new(), assigned_at: Timestamp(1_100), started_at: None };
    task.phase = Phase::Held(hold);
    task.attempt = 1;
    let assigned = task.clone();
    task.phase = Phase::Held(Hold { started_at: Some(Timestamp(1_200)), ..hold });
    store
        .write(&Batch {
            jobs: vec![job.clone()],
            tasks: vec![(job.id, TaskIdx(0), assigned), (job.id, TaskIdx(0), task.clone())],
            ..Batch::default()
        })
        .unwrap();
    store.flush().unwrap();
    let stored = store.get_job(job.id).unwrap().unwrap();
    assert_eq!(stored.record, job);
    assert_eq!(stored.tasks[0], task);
}

pub fn writing_a_batch_again_changes_nothing(store: &dyn Store) {
    let spec = spec(3);
    let job = record(&spec, JobState::Running);
    let mut task = TaskRecord::initial(false, Timestamp(1_000));
    task.phase = Phase::Ended { end: End::Succeeded, at: Timestamp(1_500) };
    let batch = Batch {
        new_jobs: vec![(job.clone(), spec.clone())],
        tasks: vec![(job.id, TaskIdx(0), task.clone())],
        ..Batch::default()
    };
    commit(store, batch.clone());
    let first = store.get_job(job.id).unwrap().unwrap();
    commit(store, batch);
    let again = store.get_job(job.id).unwrap().unwrap();
    assert_eq!((again.record, again.tasks), (first.record, first.tasks));
    assert_eq!(*again.spec, *spec);
    assert_eq!(store.list_jobs(&JobFilter::default()).unwrap().len(), 1);
}

pub fn lists_jobs_by_state_name_and_fingerprint_newest_first(store: &dyn Store) {
    let (small, large) = (spec(1), spec(2));
    let mut ids = Vec::new();
    for (spec, state) in [(&small, JobState::Succeeded), (&large, JobState::Failed), (&small, JobState::Running)] {
        let mut job = record(spec, state);
        if spec.len() == 2 {
            job.name = "other".into();
        }
        ids.push(job.id);
        commit(store, Batch { new_jobs: vec![(job, spec.clone())], ..Batch::default() });
    }
    let listed = |filter: JobFilter| -> Vec<JobId> { store.list_jobs(&filter).unwrap().iter().map(|j| j.id).collect() };
    assert_eq!(listed(JobFilter::default()), vec![ids[2], ids[1], ids[0]]);
    assert_eq!(listed(JobFilter { limit: Some(2), ..JobFilter::default() }), vec![ids[2], ids[1]]);
    assert_eq!(listed(JobFilter { state: Some(JobState::Failed), ..JobFilter::default() }), vec![ids[1]]);
    assert_eq!(listed(JobFilter { name: Some("other".into()), ..JobFilter::default() }), vec![ids[1]]);
    assert_eq!(
        listed(JobFilter { fingerprint: Some(small.fingerprint), ..JobFilter::default() }),
        vec![ids[2], ids[0]]
    );
}

/// Takes the store, so that it is closed before it is opened again.
pub fn flushed_writes_survive_a_reopen(store: Arc<dyn Store>, reopen: Reopen) {
    let spec = spec(4);
    let job = record(&spec, JobState::Running);
    let mut task = TaskRecord::initial(false, Timestamp(2_000));
    task.phase = Phase::Held(Hold {
        handler: HandlerId::new(),
        assigned_at: Timestamp(2_100),
        started_at: Some(Timestamp(2_200)),
    });
    task.attempt = 2;
    commit(
        &*store,
        Batch {
            new_jobs: vec![(job.clone(), spec.clone())],
            tasks: vec![(job.id, TaskIdx(0), task.clone())],
            settings: vec![("policy/noop".into(), Some(b"p".to_vec()))],
            ..Batch::default()
        },
    );
    drop(store);
    let reopened = reopen();
    let active = reopened.load_active().unwrap();
    assert_eq!(active.len(), 1);
    assert_eq!(active[0].record, job);
    assert_eq!(*active[0].spec, *spec);
    assert_eq!(active[0].tasks[0], task);
    assert_eq!(active[0].tasks[1].phase, Phase::Pending);
    assert_eq!(reopened.settings("policy/").unwrap(), vec![("policy/noop".to_string(), b"p".to_vec())]);
}

pub fn removes_ended_jobs_with_all_they_own(store: Arc<dyn Store>, reopen: Reopen) {
    let (big, small) = (spec(40), spec(3));
    let mut ended = record(&big, JobState::Running);
    let running = record(&small, JobState::Running);
    let mut kept = record(&small, JobState::Running);
    let failed = |attempt| TaskRecord {
        phase: Phase::Ended { end: End::Failed, at: Timestamp(1_500) },
        attempt,
        error: Some("boom".into()),
        ..TaskRecord::initial(false, Timestamp(1_000))
    };
    let tasks: Vec<(JobId, TaskIdx, TaskRecord)> = (0..40).map(|i| (ended.id, TaskIdx(i), failed(2))).collect();
    commit(
        &*store,
        Batch {
            new_jobs: vec![
                (ended.clone(), big.clone()),
                (running.clone(), small.clone()),
                (kept.clone(), small.clone()),
            ],
            tasks,
            ..Batch::default()
        },
    );
    ended.state = JobState::Failed;
    kept.state = JobState::Succeeded;
    commit(&*store, Batch { jobs: vec![ended.clone(), kept.clone()], ..Batch::default() });

    // A job that has not ended is never removed, even when asked.
    commit(&*store, Batch { removed: vec![ended.id, running.id], ..Batch::default() });
    let check = |store: &dyn Store| {
        assert!(store.get_job(ended.id).unwrap().is_none(), "the ended job is gone");
        assert!(store.get_job(running.id).unwrap().is_some(), "the running job stays");
        let listed: Vec<JobId> = store.list_jobs(&JobFilter::default()).unwrap().iter().map(|j| j.id).collect();
        assert_eq!(listed, vec![kept.id, running.id]);
        let active: Vec<JobId> = store.load_active().unwrap().iter().map(|j| j.record.id).collect();
        assert_eq!(active, vec![running.id]);
    };
    check(&*store);
    drop(store);
    let store = reopen();
    check(&*store);
    // Nothing of it is left behind: a new job under the same id starts clean.
    let again = JobRecord { state: JobState::Pending, n_tasks: 3, ..ended.clone() };
    commit(&*store, Batch { new_jobs: vec![(again.clone(), small.clone())], ..Batch::default() });
    let stored = store.get_job(again.id).unwrap().expect("stored again");
    assert_eq!(*stored.spec, *small, "no chunk of the old spec remains");
    assert_eq!(stored.tasks.len(), 3);
    assert!(
        stored.tasks.iter().all(|t| matches!(t.state(), TaskState::Ready | TaskState::Pending) && t.attempt == 0),
        "no task record of the old job remains: {:?}",
        stored.tasks
    );
}

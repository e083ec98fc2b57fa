//! What the fixtures of schema 1 hold (`tests/fixtures/stored-v1/`): the
//! bytes a sled directory, a PostgreSQL database and an export were given by
//! the build that wrote them, kept so that every later build proves it still
//! reads them: `check` says what reading them back must give, in today's
//! records. The fixtures are never written again (what went in is in this
//! file's history): a new stored form gets fixtures of its own beside these.

use std::sync::Arc;

use super::{Batch, JobFilter, Store};
use crate::clock::Timestamp;
use crate::jobfile::{self, Format, Limits};
use crate::model::{
    End, HandlerId, Hold, JobId, JobOrigin, JobRecord, JobSpec, JobState, LastAttempt, Phase, TaskIdx, TaskRecord,
};

/// Under the crate's root.
pub const SLED_DIR: &str = "tests/fixtures/stored-v1/sled";
pub const POSTGRES_DUMP: &str = "tests/fixtures/stored-v1/postgres.sql";
pub const EXPORT: &str = "tests/fixtures/stored-v1/export.jsonl";

const RUNNING: [u8; 16] = *b"fixture-running!";
const ENDED: [u8; 16] = *b"fixture-ended!!!";
const WORKER: &str = "6f1d2c3b-4a59-4e68-9d7c-8b0a1f2e3d4c";
const ADMIN: &str = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
const SETTING: (&str, &[u8]) = ("fixture/setting", b"{\"kept\":true}");

/// At 2026-11-26 12:00:00 UTC, plus `seconds`.
fn at(seconds: i64) -> Timestamp {
    Timestamp(1_795_694_400_000 + seconds * 1000)
}

fn handler(text: &str) -> HandlerId {
    text.parse().expect("a fixed handler id")
}

/// Nine tasks: `t2` depends on `t1`, `t6` on `t5`, the rest on nothing;
/// two job types, labels, a priority, a retry limit and a timeout.
fn running_spec() -> Arc<JobSpec> {
    let text = r#"{"name":"fixture running","tasks":[
        {"id":"t0","job_type":"noop","parameters":{"sleep_ms":10}},
        {"id":"t1","job_type":"noop","parameters":{"fail":true},"retry_limit":2},
        {"id":"t2","job_type":"noop","parameters":{},"depends_on":["t1"]},
        {"id":"t3","job_type":"balance","parameters":{"volume_id":7,"source":"10.0.0.1:8080"},
         "labels":{"volume":"7","node":"10.0.0.1:8080"},"priority":"high","execution_timeout_seconds":600},
        {"id":"t4","job_type":"noop","parameters":{}},
        {"id":"t5","job_type":"noop","parameters":{},"retry_backoff_seconds":30},
        {"id":"t6","job_type":"noop","parameters":{},"depends_on":["t5"]},
        {"id":"t7","job_type":"noop","parameters":{}},
        {"id":"t8","job_type":"noop","parameters":{}}
    ]}"#;
    written_then(
        jobfile::parse(text.as_bytes(), Format::Json, "fixture.json", &Limits::default()).expect("valid"),
        text,
    )
}

/// The spec as it was stored: these fixtures were written when a job's
/// fingerprint was its file's SHA-256.
fn written_then(mut spec: JobSpec, text: &str) -> Arc<JobSpec> {
    spec.fingerprint = jobfile::fingerprint_before_blake3(text.as_bytes());
    Arc::new(spec)
}

fn ended_spec() -> Arc<JobSpec> {
    let text =
        r#"{"name":"fixture ended","tasks":[{"id":"vacuum-7","job_type":"vacuum","parameters":{"volume_id":7}}]}"#;
    written_then(jobfile::parse(text.as_bytes(), Format::Json, "ended.json", &Limits::default()).expect("valid"), text)
}

fn job(id: [u8; 16], spec: &JobSpec, state: JobState, origin: JobOrigin) -> JobRecord {
    let ended = state.is_terminal();
    JobRecord {
        id: JobId::from_bytes(id),
        name: spec.name.clone(),
        state,
        origin,
        n_tasks: spec.len() as u32,
        fingerprint: spec.fingerprint,
        created_at: at(0),
        updated_at: at(if ended { 90 } else { 60 }),
        finished_at: ended.then(|| at(90)),
        cancel_requested: false,
        handler: Some(handler(ADMIN)),
    }
}

/// What the tasks of the running job read back as, by index: one in each
/// state, each with the data of its state. `t8` was written held with no
/// handler, which no phase can hold: it reads back ready (rule R1), its
/// times and stage gone. `t6` has no record stored.
fn tasks() -> Vec<(u32, TaskRecord)> {
    let worker = Some(handler(WORKER));
    let task = |phase: Phase, attempt: u32, last_attempt: LastAttempt| {
        let mut task = TaskRecord::initial(false, at(0));
        (task.phase, task.attempt, task.last_attempt, task.updated_at) = (phase, attempt, last_attempt, at(50));
        task
    };
    let ran = |started_at: Option<Timestamp>| LastAttempt { handler: worker, assigned_at: Some(at(10)), started_at };
    let ended = |end: End, seconds: i64| Phase::Ended { end, at: at(seconds) };
    let mut succeeded = task(ended(End::Succeeded, 12), 1, ran(Some(at(11))));
    succeeded.output = vec!["slept 10 ms".into(), "done".into()].into();
    succeeded.progress_percent = 100.0;
    succeeded.stage = "done".into();
    let mut failed = task(ended(End::Failed, 40), 3, ran(None));
    failed.failures = 3;
    failed.error = Some("asked to fail".into());
    let mut upstream = task(ended(End::UpstreamFailed, 40), 0, LastAttempt::default());
    upstream.updated_at = at(40);
    let hold = |started_at: Option<Timestamp>| Hold { handler: handler(WORKER), assigned_at: at(10), started_at };
    let mut running = task(Phase::Held(hold(Some(at(21)))), 2, LastAttempt::default());
    running.lost = 1;
    running.progress_percent = 40.5;
    running.stage = "copying".into();
    let assigned = task(Phase::Held(hold(None)), 1, LastAttempt::default());
    let mut ready = task(Phase::Ready { not_before: Some(at(80)) }, 1, LastAttempt { handler: None, ..ran(None) });
    ready.failures = 1;
    ready.error = Some("exit status 1".into());
    let canceled = task(ended(End::Canceled, 30), 1, ran(None));
    let headless = task(Phase::READY, 1, LastAttempt::default());
    vec![
        (0, succeeded),
        (1, failed),
        (2, upstream),
        (3, running),
        (4, assigned),
        (5, ready),
        (7, canceled),
        (8, headless),
    ]
}

/// The jobs, their specs, their tasks' records and the setting that
/// reading the fixtures back must give.
fn expected() -> Batch {
    let (running, ended) = (running_spec(), ended_spec());
    let mut done = TaskRecord::initial(false, at(0));
    done.phase = Phase::Ended { end: End::Succeeded, at: at(90) };
    done.attempt = 1;
    done.last_attempt =
        LastAttempt { handler: Some(handler(WORKER)), assigned_at: Some(at(1)), started_at: Some(at(2)) };
    done.updated_at = at(90);
    let scheduled = JobOrigin::Scheduler { job_type: "vacuum".into(), sequence: 42 };
    let running_id = JobId::from_bytes(RUNNING);
    let mut tasks: Vec<(JobId, TaskIdx, TaskRecord)> =
        self::tasks().into_iter().map(|(idx, task)| (running_id, TaskIdx(idx), task)).collect();
    tasks.push((JobId::from_bytes(ENDED), TaskIdx(0), done));
    Batch {
        new_jobs: vec![
            (job(RUNNING, &running, JobState::Running, JobOrigin::User), running),
            (job(ENDED, &ended, JobState::Succeeded, scheduled), ended),
        ],
        tasks,
        settings: vec![(SETTING.0.to_string(), Some(SETTING.1.to_vec()))],
        ..Batch::default()
    }
}

/// Panics unless `store` holds what schema 1's first build wrote, read
/// back: the records, the specs and the setting as they went in, the one
/// held task without a handler ready again (R1), and the task with no
/// record pending.
pub fn check(store: &dyn Store) {
    let batch = expected();
    let listed = store.list_jobs(&JobFilter::default()).expect("the jobs are listed");
    let mut ids: Vec<JobId> = listed.iter().map(|j| j.id).collect();
    ids.sort();
    let mut expected_ids: Vec<JobId> = batch.new_jobs.iter().map(|(j, _)| j.id).collect();
    expected_ids.sort();
    assert_eq!(ids, expected_ids, "the stored jobs");
    for (record, spec) in &batch.new_jobs {
        let stored = store.get_job(record.id).expect("the job is read").expect("the job is there");
        assert_eq!(&stored.record, record, "the record of {}", record.name);
        assert_eq!(*stored.spec, **spec, "the spec of {}", record.name);
        for (idx, task) in stored.tasks.iter().enumerate() {
            let expected = match batch.tasks.iter().find(|(job, i, _)| *job == record.id && i.0 == idx as u32) {
                Some((_, _, task)) => task.clone(),
                None => TaskRecord::initial(spec.dag.in_degree(idx as u32) > 0, record.created_at),
            };
            assert_eq!(*task, expected, "task {} of {}", spec.tasks[idx].id, record.name);
        }
    }
    let active = store.load_active().expect("the active jobs are read");
    assert_eq!(active.iter().map(|j| j.record.id).collect::<Vec<_>>(), [JobId::from_bytes(RUNNING)]);
    let settings = store.settings("fixture/").expect("the settings are read");
    assert_eq!(settings, [(SETTING.0.to_string(), SETTING.1.to_vec())]);
}

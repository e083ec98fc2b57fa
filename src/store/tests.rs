//! The conformance suite every store backend must pass, instantiated per backend.

use std::sync::Arc;

use super::{Batch, JobFilter, MemoryStore, SledStore, Store};
use crate::clock::Timestamp;
use crate::jobfile::{self, Format, Limits};
use crate::model::{JobId, JobOrigin, JobRecord, JobSpec, JobState, TaskIdx, TaskRecord, TaskState};

fn spec(n: usize) -> Arc<JobSpec> {
    let tasks: Vec<String> = (0..n)
        .map(|i| {
            let deps = if i == 0 { String::new() } else { format!("\"t{}\"", i - 1) };
            format!(r#"{{"id":"t{i}","job_type":"noop","parameters":{{"n":{i}}},"depends_on":[{deps}]}}"#)
        })
        .collect();
    let text = format!(r#"{{"name":"chain","tasks":[{}]}}"#, tasks.join(","));
    Arc::new(jobfile::parse(text.as_bytes(), Format::Json, "test", &Limits::default()).expect("valid"))
}

fn record(spec: &JobSpec, state: JobState) -> JobRecord {
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

pub fn round_trips_a_new_job(store: &dyn Store) {
    let spec = spec(5);
    let job = record(&spec, JobState::Pending);
    store.write(&Batch { new_jobs: vec![(job.clone(), spec.clone())], ..Batch::default() }).unwrap();
    store.flush().unwrap();
    let stored = store.get_job(job.id).unwrap().expect("stored");
    assert_eq!(stored.record, job);
    assert_eq!(*stored.spec, *spec);
    let states: Vec<TaskState> = stored.tasks.iter().map(|t| t.state).collect();
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
    task.state = TaskState::Succeeded;
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
    assert_eq!(stored.tasks[1].state, TaskState::Pending);
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
}

macro_rules! store_test_suite {
    ($module:ident, $make:expr) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;

            #[test]
            fn round_trips_a_new_job() {
                let (store, _dir) = $make;
                super::round_trips_a_new_job(&store);
            }

            #[test]
            fn task_records_override_initial_state() {
                let (store, _dir) = $make;
                super::task_records_override_initial_state(&store);
            }

            #[test]
            fn terminal_jobs_leave_the_active_set() {
                let (store, _dir) = $make;
                super::terminal_jobs_leave_the_active_set(&store);
            }

            #[test]
            fn settings_are_kept_by_key() {
                let (store, _dir) = $make;
                super::settings_are_kept_by_key(&store);
            }

            #[test]
            fn stores_a_large_spec_in_chunks() {
                let (store, _dir) = $make;
                super::stores_a_large_spec_in_chunks(&store);
            }
        }
    };
}

store_test_suite!(memory, (MemoryStore::new(), ()));
store_test_suite!(sled_backend, {
    let dir = tempfile::tempdir().unwrap();
    (SledStore::open(&dir.path().join("data")).unwrap(), dir)
});

#[test]
fn memory_store_crash_forgets_unflushed_writes() {
    let store = MemoryStore::new();
    let spec = spec(1);
    let kept = record(&spec, JobState::Pending);
    let lost = record(&spec, JobState::Pending);
    store.write(&Batch { new_jobs: vec![(kept.clone(), spec.clone())], ..Batch::default() }).unwrap();
    store.flush().unwrap();
    store.write(&Batch { new_jobs: vec![(lost.clone(), spec)], ..Batch::default() }).unwrap();
    assert!(store.get_job(lost.id).unwrap().is_some());
    store.crash();
    assert!(store.get_job(kept.id).unwrap().is_some());
    assert!(store.get_job(lost.id).unwrap().is_none());
}

#[test]
fn sled_store_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let spec = spec(4);
    let job = record(&spec, JobState::Running);
    {
        let store = SledStore::open(&path).unwrap();
        store.write(&Batch { new_jobs: vec![(job.clone(), spec.clone())], ..Batch::default() }).unwrap();
        store.flush().unwrap();
    }
    let store = SledStore::open(&path).unwrap();
    assert_eq!(store.get_job(job.id).unwrap().unwrap().record, job);
}

#[test]
fn sled_store_refuses_a_foreign_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "hello").unwrap();
    let err = SledStore::open(dir.path()).err().expect("refused");
    let text = err.to_string();
    assert!(text.contains("not a jobcenter data directory"), "{text}");
    assert!(text.contains(&dir.path().display().to_string()), "{text}");
}

#[test]
fn sled_store_refuses_a_locked_directory() {
    let dir = tempfile::tempdir().unwrap();
    let _first = SledStore::open(dir.path()).unwrap();
    let err = SledStore::open(dir.path()).err().expect("refused");
    assert!(matches!(err, super::Error::Locked { .. }), "{err}");
}

#[test]
fn sled_store_refuses_another_schema_version() {
    let dir = tempfile::tempdir().unwrap();
    drop(SledStore::open(dir.path()).unwrap());
    std::fs::write(dir.path().join("JOBCENTER"), "jobcenter data directory\nschema 99\n").unwrap();
    let err = SledStore::open(dir.path()).err().expect("refused");
    assert!(matches!(err, super::Error::SchemaMismatch { found: 99, .. }), "{err}");
}

#[test]
fn sled_store_refuses_a_truncated_database() {
    let dir = tempfile::tempdir().unwrap();
    drop(SledStore::open(dir.path()).unwrap());
    let db = dir.path().join("db");
    std::fs::OpenOptions::new().write(true).open(&db).unwrap().set_len(0).unwrap();
    let err = SledStore::open(dir.path()).err().expect("refused");
    assert!(matches!(err, super::Error::Corrupt { .. }), "{err}");
}

#[test]
fn sled_store_refuses_a_garbled_database() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = SledStore::open(dir.path()).unwrap();
        let spec = spec(50);
        let job = record(&spec, JobState::Running);
        store.write(&Batch { new_jobs: vec![(job, spec)], ..Batch::default() }).unwrap();
        store.flush().unwrap();
    }
    let db = dir.path().join("db");
    let mut bytes = std::fs::read(&db).unwrap();
    for (i, b) in bytes.iter_mut().enumerate() {
        if i % 7 == 3 {
            *b ^= 0x5a;
        }
    }
    std::fs::write(&db, bytes).unwrap();
    let opened = SledStore::open(dir.path());
    let err = match opened {
        Err(e) => e,
        Ok(store) => store.load_active().expect_err("a garbled database must not read as valid"),
    };
    assert!(matches!(err, super::Error::Corrupt { .. }), "{err}");
}

#[test]
fn sled_store_finishes_an_interrupted_creation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    drop(SledStore::open(&path).unwrap());
    // As if the first start was killed before it wrote its marker.
    std::fs::remove_file(path.join("JOBCENTER")).unwrap();
    std::fs::write(path.join("JOBCENTER.creating"), "jobcenter data directory being created\n").unwrap();
    let store = SledStore::open(&path).expect("an interrupted creation is started over");
    assert!(store.load_active().unwrap().is_empty());
    assert!(path.join("JOBCENTER").exists());
    assert!(!path.join("JOBCENTER.creating").exists());
}

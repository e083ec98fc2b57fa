//! Tests of each backend's own promises: the in-memory store's crash, and a
//! sled data directory refused when it is locked, foreign or damaged. The
//! conformance suite that every backend passes is `conformance.rs`, run by
//! `tests/store_conformance.rs`.

use super::conformance::{record, spec};
use super::{Batch, MemoryStore, SledStore, Store};
use crate::model::JobState;

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
    // sled's background threads may hold the lock a few milliseconds past the drop.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let store = loop {
        match SledStore::open(&path) {
            Err(super::Error::Locked { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            opened => break opened.unwrap(),
        }
    };
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

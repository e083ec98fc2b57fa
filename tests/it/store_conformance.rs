//! The store conformance suite (`jobcenter::store::conformance`) against
//! every backend: the in-memory store, sled in a data directory, and a real
//! PostgreSQL that the test starts itself (a database per test).

use crate::support::postgres as pg;

use std::sync::Arc;

use jobcenter::store::{conformance, stored_v1, transfer};
use jobcenter::store::{Location, MemoryStore, PasswordSources, SledStore, Store};

/// A store to test and a way to open the same store again; dropping it drops what it kept.
struct Subject {
    store: Arc<dyn Store>,
    reopen: Box<dyn Fn() -> Arc<dyn Store>>,
    _dir: Option<tempfile::TempDir>,
}

fn memory() -> Subject {
    let store = MemoryStore::new();
    let again = store.clone();
    Subject { store: Arc::new(store), reopen: Box::new(move || Arc::new(again.clone())), _dir: None }
}

fn sled() -> Subject {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store: Arc<dyn Store> = Arc::new(SledStore::open(&path).unwrap());
    Subject { store, reopen: Box::new(move || Arc::new(reopen_sled(&path))), _dir: Some(dir) }
}

/// Opens a sled directory that a store dropped a moment ago: sled's background
/// threads may hold the directory's lock for a few milliseconds after the drop.
fn reopen_sled(path: &std::path::Path) -> SledStore {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match SledStore::open(path) {
            Err(jobcenter::store::Error::Locked { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            opened => return opened.unwrap(),
        }
    }
}

fn postgres() -> Subject {
    let cluster = pg::shared();
    let database = format!("conformance_{}", uuid::Uuid::new_v4().simple());
    cluster.create_database(&database);
    let location = Location::Database { url: cluster.url(&database), passwords: PasswordSources::default() };
    let store = location.open().unwrap();
    Subject { store, reopen: Box::new(move || location.open().unwrap()), _dir: None }
}

macro_rules! suite {
    ($backend:ident) => {
        mod $backend {
            use super::*;

            #[test]
            fn round_trips_a_new_job() {
                conformance::round_trips_a_new_job(&*super::$backend().store);
            }

            #[test]
            fn task_records_override_initial_state() {
                conformance::task_records_override_initial_state(&*super::$backend().store);
            }

            #[test]
            fn terminal_jobs_leave_the_active_set() {
                conformance::terminal_jobs_leave_the_active_set(&*super::$backend().store);
            }

            #[test]
            fn stores_a_large_spec_in_chunks() {
                conformance::stores_a_large_spec_in_chunks(&*super::$backend().store);
            }

            #[test]
            fn settings_are_kept_by_key() {
                conformance::settings_are_kept_by_key(&*super::$backend().store);
            }

            #[test]
            fn settings_in_a_batch_are_written_with_it() {
                conformance::settings_in_a_batch_are_written_with_it(&*super::$backend().store);
            }

            #[test]
            fn the_last_record_written_for_a_key_wins() {
                conformance::the_last_record_written_for_a_key_wins(&*super::$backend().store);
            }

            #[test]
            fn writing_a_batch_again_changes_nothing() {
                conformance::writing_a_batch_again_changes_nothing(&*super::$backend().store);
            }

            #[test]
            fn lists_jobs_by_state_name_and_fingerprint_newest_first() {
                conformance::lists_jobs_by_state_name_and_fingerprint_newest_first(&*super::$backend().store);
            }

            #[test]
            fn removes_ended_jobs_with_all_they_own() {
                let subject = super::$backend();
                conformance::removes_ended_jobs_with_all_they_own(subject.store, &*subject.reopen);
            }

            #[test]
            fn flushed_writes_survive_a_reopen() {
                let subject = super::$backend();
                conformance::flushed_writes_survive_a_reopen(subject.store, &*subject.reopen);
            }
        }
    };
}

suite!(memory);
suite!(sled);
suite!(postgres);

/// The fixtures of schema 1 under the crate's root (`stored_v1`).
fn fixture(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A sled data directory written by schema 1's first build opens and reads
/// back as written, the task held without a handler ready again.
#[test]
fn a_sled_directory_of_schema_1_reads_back_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    copy_dir(&fixture(stored_v1::SLED_DIR), &path);
    let store = SledStore::open(&path).unwrap();
    stored_v1::check(&store);
}

/// The rows a PostgreSQL database of schema 1 was given (a data-only
/// dump), loaded into a database this build set up, read back as written.
#[test]
fn a_postgresql_database_of_schema_1_reads_back_as_written() {
    let cluster = pg::shared();
    let database = format!("fixture_{}", uuid::Uuid::new_v4().simple());
    cluster.create_database(&database);
    let location = Location::Database { url: cluster.url(&database), passwords: PasswordSources::default() };
    drop(location.open().unwrap());
    let dump = std::fs::read_to_string(fixture(stored_v1::POSTGRES_DUMP)).unwrap();
    cluster.psql(&database, &dump);
    stored_v1::check(&*location.open().unwrap());
}

/// An export of version 1 imports and reads back as written.
#[test]
fn an_export_of_version_1_imports_as_written() {
    let store = MemoryStore::new();
    let summary = transfer::import(&store, &fixture(stored_v1::EXPORT)).unwrap();
    assert_eq!((summary.jobs, summary.settings), (2, 1), "{summary:?}");
    stored_v1::check(&store);
}

//! Tests of each backend's own promises: the in-memory store's crash, a
//! sled data directory refused when it is locked, foreign or damaged, and
//! its compaction: nothing lost, however it is interrupted. The
//! conformance suite that every backend passes is `conformance.rs`, run by
//! `tests/it/store_conformance.rs`.

use super::conformance::{record, spec};
use super::transfer::export;
use super::{Batch, MemoryStore, SledStore, Store};
use crate::clock::Timestamp;
use crate::model::{End, HandlerId, Hold, JobId, JobState, Phase, TaskIdx, TaskRecord};

const SUCCEEDED: Phase = Phase::Ended { end: End::Succeeded, at: Timestamp(1_500) };

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
    let store = reopen(&path);
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
    let db = dir.path().join("log.1").join("db");
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
    let db = dir.path().join("log.1").join("db");
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

/// Writes `jobs` ended jobs of `tasks` tasks each, with a record per task.
fn ended_jobs(store: &SledStore, jobs: usize, tasks: usize) -> Vec<JobId> {
    let spec = spec(tasks);
    let mut ids = Vec::new();
    for _ in 0..jobs {
        let job = record(&spec, JobState::Succeeded);
        let records = (0..tasks as u32)
            .map(|i| {
                (job.id, TaskIdx(i), TaskRecord { phase: SUCCEEDED, ..TaskRecord::initial(i > 0, Timestamp(1_000)) })
            })
            .collect();
        ids.push(job.id);
        store.write(&Batch { new_jobs: vec![(job, spec.clone())], tasks: records, ..Batch::default() }).unwrap();
    }
    store.flush().unwrap();
    ids
}

/// Writes every task record of `jobs` again, as changed as it is large.
fn rewrite_tasks(store: &SledStore, jobs: &[JobId], tasks: usize, round: usize) {
    for &job in jobs {
        let stage = format!("round {round:04}");
        let records = (0..tasks as u32)
            .map(|i| {
                let record = TaskRecord { phase: SUCCEEDED, ..TaskRecord::initial(i > 0, Timestamp(1_000)) };
                (job, TaskIdx(i), TaskRecord { stage: stage.as_str().into(), ..record })
            })
            .collect();
        store.write(&Batch { tasks: records, ..Batch::default() }).unwrap();
    }
    store.flush().unwrap();
}

/// The whole content, as `jobcenter export` writes it.
fn content(store: &dyn Store) -> String {
    let mut out = Vec::new();
    export(store, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

/// Opens a directory a store of this process just closed: sled's background
/// threads may hold its lock a few milliseconds past the drop.
fn open_once_unlocked(path: &std::path::Path) -> Result<SledStore, super::Error> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match SledStore::open(path) {
            Err(super::Error::Locked { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            opened => break opened,
        }
    }
}

fn reopen(path: &std::path::Path) -> SledStore {
    open_once_unlocked(path).unwrap()
}

fn reopen_err(path: &std::path::Path) -> super::Error {
    open_once_unlocked(path).err().expect("refused")
}

fn entries(path: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(path).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

#[test]
fn sled_compaction_keeps_the_live_data_and_drops_the_history() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = SledStore::open(&path).unwrap();
    store.put_setting("policy/noop", Some(b"{}")).unwrap();
    let removed = ended_jobs(&store, 300, 64);
    let kept = ended_jobs(&store, 20, 64);
    store.write(&Batch { removed, ..Batch::default() }).unwrap();
    store.flush().unwrap();
    let before = content(&store);
    let done = store.compact().unwrap();
    assert!(done.after_bytes < done.before_bytes, "{done:?}");
    assert_eq!(content(&store), before);
    assert_eq!(entries(&path), ["CURRENT", "JOBCENTER", "LOCK", "log.2"]);
    drop(store);
    let store = reopen(&path);
    assert_eq!(content(&store), before);
    assert_eq!(store.list_jobs(&super::JobFilter::default()).unwrap().len(), kept.len());
    assert!(store.reclaim().unwrap().is_none(), "a small directory just compacted is not due");
}

#[test]
fn sled_compaction_keeps_the_writes_made_while_it_copies() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = std::sync::Arc::new(SledStore::open(&path).unwrap());
    ended_jobs(&store, 200, 64);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (store, done) = (store.clone(), done.clone());
        std::thread::spawn(move || {
            let mut written = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) || written.len() < 50 {
                written.extend(ended_jobs(&store, 1, 8));
                store.put_setting(&format!("n/{}", written.len()), Some(b"x")).unwrap();
            }
            written
        })
    };
    for _ in 0..3 {
        store.compact().unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let written = writer.join().unwrap();
    let before = content(&*store);
    drop(store);
    let store = reopen(&path);
    assert_eq!(content(&store), before);
    for id in &written {
        let job = store.get_job(*id).unwrap().expect("a job written during a compaction is kept");
        assert_eq!(job.tasks.len(), 8);
    }
    assert_eq!(store.settings("n/").unwrap().len(), written.len());
    assert_eq!(entries(&path), ["CURRENT", "JOBCENTER", "LOCK", "log.4"]);
}

#[test]
fn sled_open_removes_the_generations_current_does_not_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = SledStore::open(&path).unwrap();
    let ids = ended_jobs(&store, 5, 4);
    store.compact().unwrap();
    drop(store);
    // As if killed while copying into generation 3, and before generation 1
    // (the one the copy replaced) was removed.
    for leftover in ["log.1", "log.3"] {
        std::fs::create_dir(path.join(leftover)).unwrap();
        std::fs::write(path.join(leftover).join("db"), b"partial").unwrap();
    }
    let store = reopen(&path);
    assert_eq!(entries(&path), ["CURRENT", "JOBCENTER", "LOCK", "log.2"]);
    for id in ids {
        assert!(store.get_job(id).unwrap().is_some());
    }
}

#[test]
fn sled_directory_from_before_generations_opens_and_compacts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = SledStore::open(&path).unwrap();
    let ids = ended_jobs(&store, 5, 4);
    let before = content(&store);
    drop(store);
    drop(reopen(&path));
    // The layout of earlier releases: sled's own files at the top.
    for entry in std::fs::read_dir(path.join("log.1")).unwrap() {
        let entry = entry.unwrap();
        std::fs::rename(entry.path(), path.join(entry.file_name())).unwrap();
    }
    std::fs::remove_dir(path.join("log.1")).unwrap();
    std::fs::remove_file(path.join("CURRENT")).unwrap();
    std::fs::remove_file(path.join("LOCK")).unwrap();
    let store = reopen(&path);
    assert_eq!(content(&store), before);
    store.compact().unwrap();
    assert_eq!(entries(&path), ["CURRENT", "JOBCENTER", "LOCK", "log.1"]);
    drop(store);
    let store = reopen(&path);
    assert_eq!(content(&store), before);
    for id in ids {
        assert!(store.get_job(id).unwrap().is_some());
    }
}

#[test]
fn sled_store_refuses_a_directory_whose_current_generation_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    drop(SledStore::open(dir.path()).unwrap());
    std::fs::write(dir.path().join("CURRENT"), "generation 7\nbytes 0\ncopied 0\n").unwrap();
    let err = reopen_err(dir.path());
    assert!(matches!(err, super::Error::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("database file is missing"), "{err}");
    std::fs::write(dir.path().join("CURRENT"), "generation x\n").unwrap();
    let err = reopen_err(dir.path());
    assert!(err.to_string().contains("CURRENT is damaged"), "{err}");
    assert!(dir.path().join("log.1").join("db").exists(), "a refused directory is left as it was");
}

#[test]
fn sled_compaction_is_due_when_the_log_is_twice_a_fresh_copy_of_its_live_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = SledStore::open(&path).unwrap();
    store.set_compact_floor(0);
    let jobs = ended_jobs(&store, 100, 64);
    assert!(store.reclaim().unwrap().is_some(), "a new directory's log has no size to compare with: due");
    assert!(store.reclaim().unwrap().is_none(), "just compacted: not due");
    store.write(&Batch { removed: jobs[..30].to_vec(), ..Batch::default() }).unwrap();
    store.flush().unwrap();
    assert!(store.reclaim().unwrap().is_none(), "30 of 100 jobs removed: not due");
    store.write(&Batch { removed: jobs[30..60].to_vec(), ..Batch::default() }).unwrap();
    store.flush().unwrap();
    let done = store.reclaim().unwrap().expect("60 of 100 jobs removed: due");
    assert!(done.after_bytes < done.before_bytes, "{done:?}");
    assert!(store.reclaim().unwrap().is_none());
    // Churn: as much added as removed leaves the live data as it was.
    let churned = ended_jobs(&store, 10, 64);
    store.write(&Batch { removed: churned, ..Batch::default() }).unwrap();
    store.flush().unwrap();
    assert!(store.reclaim().unwrap().is_none(), "10 of 40 jobs added and removed: not due");
    // New jobs alone make a log as large as a fresh copy of them would be.
    let grown = ended_jobs(&store, 400, 64);
    assert!(store.reclaim().unwrap().is_none(), "the log grew with its live data only: not due");
    // Rewriting the same records grows the log, not the live data (how far
    // the log grows is sled's: it reuses segments that are all dead, so
    // the rule itself is checked exactly in `sled::tests`). Two rounds leave
    // it well below twice a fresh copy; with writes reaching sled key by
    // key, a third comes within 10% of it, as near as the size of sled's own
    // copy varies from run to run.
    for round in 0..2 {
        rewrite_tasks(&store, &grown, 64, round);
        store.checkpoint().unwrap();
    }
    assert!(store.reclaim().unwrap().is_none(), "rewrites below twice a fresh copy: not due");
    store.write(&Batch { removed: grown[..300].to_vec(), ..Batch::default() }).unwrap();
    store.flush().unwrap();
    assert!(store.reclaim().unwrap().is_some(), "rewritten, then most of it removed: due");
    drop(store);
    // What it was written with is kept across a restart.
    let store = reopen(&path);
    store.set_compact_floor(0);
    let remaining = store.list_jobs(&super::JobFilter::default()).unwrap();
    let half: Vec<JobId> = remaining.iter().take(remaining.len() / 2 + 1).map(|r| r.id).collect();
    store.write(&Batch { removed: half, ..Batch::default() }).unwrap();
    store.flush().unwrap();
    assert!(store.reclaim().unwrap().is_some(), "half removed after a restart: due");
}

#[test]
fn sled_checkpoint_syncs_the_item_files_sled_writes_beside_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&dir.path().join("data")).unwrap();
    let blob_files = || {
        let blobs = dir.path().join("data").join("log.1").join("blobs");
        std::fs::read_dir(blobs).map(|d| d.count() as u64).unwrap_or(0)
    };
    ended_jobs(&store, 3, 16);
    assert_eq!((blob_files(), store.blobs_synced()), (0, (0, 0)), "small items stay in the log");
    // A spec of several MiB is stored in chunks of about 1 MiB: sled makes
    // each one a file of its own. The flush puts the chunks in the journal;
    // the checkpoint that makes sled's log durable syncs those files.
    let big = spec(40_000);
    let job = record(&big, JobState::Pending);
    store.write(&Batch { new_jobs: vec![(job, big)], ..Batch::default() }).unwrap();
    store.flush().unwrap();
    store.checkpoint().unwrap();
    let files = blob_files();
    let (synced, unsynced) = store.blobs_synced();
    assert!(files >= 2, "{files} item files");
    assert!(synced >= files && unsynced == 0, "{files} files, {synced} synced, {unsynced} not");
    // Later checkpoints sync what is new (sled may have made another file
    // of a node grown large), and nothing twice.
    ended_jobs(&store, 3, 16);
    store.flush().unwrap();
    store.checkpoint().unwrap();
    let (later, unsynced) = store.blobs_synced();
    assert!(later >= synced && unsynced == 0, "{later} synced, {unsynced} not");
    store.checkpoint().unwrap();
    assert_eq!(store.blobs_synced(), (later, 0));
}

/// The payloads of the current epoch of the live generation's journal.
fn journal_frames(path: &std::path::Path) -> Vec<Vec<u8>> {
    let (_, payloads) = super::journal::Journal::open(&path.join("log.1")).unwrap().expect("a journal");
    payloads
}

#[test]
fn sled_flush_appends_one_journal_frame_and_a_checkpoint_empties_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = SledStore::open(&path).unwrap();
    assert_eq!(journal_frames(&path).len(), 0, "creating the directory checkpoints");
    ended_jobs(&store, 2, 40);
    let jobs = ended_jobs(&store, 2, 40);
    let frames = journal_frames(&path);
    assert_eq!(frames.len(), 2, "one frame for each flush");
    let entries = super::journal::decode_payload(&frames[1]).unwrap();
    let job_key: Vec<u8> = [&[b'j'][..], jobs[1].as_bytes()].concat();
    assert!(
        entries.iter().flat_map(|e| &e.ops).any(|(key, value)| *key == job_key && value.is_some()),
        "the last flush's frame holds the job record it wrote"
    );
    store.checkpoint().unwrap();
    assert_eq!(journal_frames(&path).len(), 0);
    store.flush().unwrap();
    assert_eq!(journal_frames(&path).len(), 0, "a flush with nothing written appends nothing");
    ended_jobs(&store, 1, 4);
    assert_eq!(journal_frames(&path).len(), 1);
    drop(store);
    let store = reopen(&path);
    ended_jobs(&store, 1, 4);
    assert_eq!(journal_frames(&path).len(), 0, "the first flush after opening checkpoints");
}

#[test]
fn sled_directory_from_before_the_journal_opens_and_gets_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = SledStore::open(&path).unwrap();
    let before = ended_jobs(&store, 2, 40);
    store.checkpoint().unwrap();
    drop(store);
    // A generation written before the journal: sled's files alone.
    std::fs::remove_file(path.join("log.1").join(super::journal::FILE)).unwrap();
    let store = reopen(&path);
    assert!(path.join("log.1").join(super::journal::FILE).exists(), "opening made the journal");
    let after = ended_jobs(&store, 1, 40);
    ended_jobs(&store, 1, 40);
    assert_eq!(journal_frames(&path).len(), 1, "the first flush checkpointed, the next appended");
    drop(store);
    let store = reopen(&path);
    for id in before.iter().chain(&after) {
        assert!(store.get_job(*id).unwrap().is_some(), "job {id} kept");
    }
}

/// Copies the files of a data directory, all but the journal when `journal`
/// is false.
fn copy_data_dir(from: &std::path::Path, to: &std::path::Path, journal: bool) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name == "LOCK" || (!journal && name == super::journal::FILE) {
            continue;
        }
        if entry.file_type().unwrap().is_dir() {
            copy_data_dir(&entry.path(), &to.join(&name), journal);
        } else {
            std::fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
}

#[test]
fn sled_open_replays_the_journal_into_a_database_that_lost_its_last_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (path, crashed) = (dir.path().join("data"), dir.path().join("crashed"));
    let store = SledStore::open(&path).unwrap();
    let kept = ended_jobs(&store, 2, 40);
    store.checkpoint().unwrap();
    // sled's files as a checkpoint left them: what a crash leaves of sled
    // when it wrote nothing since.
    copy_data_dir(&path, &crashed, false);
    let journaled = ended_jobs(&store, 3, 40);
    rewrite_tasks(&store, &kept, 40, 0);
    drop(store);
    // The journal as the flushes left it, beside that older database.
    std::fs::copy(path.join("log.1").join(super::journal::FILE), crashed.join("log.1").join(super::journal::FILE))
        .unwrap();
    let store = reopen(&crashed);
    for id in kept.iter().chain(&journaled) {
        assert!(store.get_job(*id).unwrap().is_some(), "job {id} replayed");
    }
    let original = reopen(&path);
    assert_eq!(content(&store), content(&original), "the replayed directory holds what the flushed one does");
}

#[test]
fn sled_write_larger_than_the_journal_is_made_durable_by_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = SledStore::open(&path).unwrap();
    ended_jobs(&store, 1, 4);
    assert_eq!(journal_frames(&path).len(), 1);
    let big = spec(300_000);
    let job = record(&big, JobState::Pending);
    store.write(&Batch { new_jobs: vec![(job.clone(), big)], ..Batch::default() }).unwrap();
    store.flush().unwrap();
    assert_eq!(journal_frames(&path).len(), 0, "the flush checkpointed");
    assert_eq!(store.blobs_synced().1, 0, "and synced the item files");
    drop(store);
    let store = reopen(&path);
    assert_eq!(store.get_job(job.id).unwrap().unwrap().record, job);
}

#[test]
fn sled_holds_no_key_of_a_write_before_its_frame_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let (path, crashed) = (dir.path().join("data"), dir.path().join("crashed"));
    let store = SledStore::open(&path).unwrap();
    let kept = ended_jobs(&store, 2, 40);
    let before = content(&store);
    let spec = spec(40);
    let unflushed = record(&spec, JobState::Running);
    store.write(&Batch { new_jobs: vec![(unflushed.clone(), spec)], ..Batch::default() }).unwrap();
    assert!(store.get_job(unflushed.id).unwrap().is_none(), "a read sees only what is durable");
    // sled writes its log when it likes: what a crash leaves of it now
    // holds nothing of the write its journal has not got.
    store.sled_writes_its_log().unwrap();
    copy_data_dir(&path, &crashed, true);
    let recovered = reopen(&crashed);
    assert!(recovered.get_job(unflushed.id).unwrap().is_none());
    assert_eq!(content(&recovered), before);
    drop(recovered);
    store.flush().unwrap();
    assert_eq!(store.get_job(unflushed.id).unwrap().unwrap().record, unflushed);
    for id in &kept {
        assert!(store.get_job(*id).unwrap().is_some(), "job {id} kept");
    }
}

#[test]
fn sled_write_reads_what_the_writes_before_it_staged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = SledStore::open(&path).unwrap();
    let small = spec(8);
    let job = record(&small, JobState::Running);
    let done = |stage: &str| TaskRecord {
        phase: SUCCEEDED,
        stage: stage.into(),
        ..TaskRecord::initial(false, Timestamp(1_000))
    };
    store.write(&Batch { new_jobs: vec![(job.clone(), small)], ..Batch::default() }).unwrap();
    store.write(&Batch { tasks: vec![(job.id, TaskIdx(0), done("first"))], ..Batch::default() }).unwrap();
    // The same group of task records, before any flush.
    store.write(&Batch { tasks: vec![(job.id, TaskIdx(1), done("second"))], ..Batch::default() }).unwrap();
    // A write the journal cannot take goes to sled at once, after what was
    // staged before it, and reads it too.
    let big = spec(300_000);
    let large = record(&big, JobState::Pending);
    store
        .write(&Batch {
            new_jobs: vec![(large.clone(), big)],
            tasks: vec![(job.id, TaskIdx(2), done("third"))],
            ..Batch::default()
        })
        .unwrap();
    store.write(&Batch { tasks: vec![(job.id, TaskIdx(3), done("fourth"))], ..Batch::default() }).unwrap();
    store.flush().unwrap();
    drop(store);
    let store = reopen(&path);
    let stored = store.get_job(job.id).unwrap().unwrap();
    let stages: Vec<&str> = stored.tasks[..4].iter().map(|t| &*t.stage).collect();
    assert_eq!(stages, ["first", "second", "third", "fourth"]);
    assert_eq!(store.get_job(large.id).unwrap().unwrap().record, large);
}

#[test]
fn sled_compaction_keeps_a_write_staged_before_it_began() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = SledStore::open(&path).unwrap();
    store.set_compact_floor(0);
    let kept = ended_jobs(&store, 20, 16);
    let spec = spec(16);
    let staged = record(&spec, JobState::Running);
    store.write(&Batch { new_jobs: vec![(staged.clone(), spec)], ..Batch::default() }).unwrap();
    store.compact().unwrap();
    store.flush().unwrap();
    assert_eq!(store.get_job(staged.id).unwrap().unwrap().record, staged);
    drop(store);
    let store = reopen(&path);
    assert_eq!(entries(&path).iter().filter(|e| e.starts_with("log.")).count(), 1);
    assert_eq!(store.get_job(staged.id).unwrap().unwrap().record, staged, "the staged write survives the switch");
    for id in &kept {
        assert!(store.get_job(*id).unwrap().is_some(), "job {id} kept");
    }
}

/// Task groups rewritten a few records at a time (spliced into the bytes
/// written before, flushed or only staged) read back as every last record
/// at each flush and after a reopen.
#[test]
fn sled_task_groups_rewritten_piecemeal_read_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let tasks = 70;
    let spec = spec(tasks);
    let job = record(&spec, JobState::Running);
    let mut expected: Vec<TaskRecord> =
        (0..tasks as u32).map(|i| TaskRecord::initial(i > 0, Timestamp(1_000))).collect();
    {
        let store = SledStore::open(&path).unwrap();
        store.write(&Batch { new_jobs: vec![(job.clone(), spec.clone())], ..Batch::default() }).unwrap();
        let mut next = 0x9e37_79b9u32;
        let worker = HandlerId::new();
        for round in 0..300u32 {
            next = next.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let changed: Vec<(JobId, TaskIdx, TaskRecord)> = (0..1 + next % 4)
                .map(|k| {
                    let idx = (next >> 8).wrapping_add(k * 29) % tasks as u32;
                    let at = Timestamp(1_000 + i64::from(round));
                    let hold = Hold { handler: worker, assigned_at: at, started_at: None };
                    let held = [hold, Hold { started_at: Some(at), ..hold }].map(Phase::Held);
                    let task = TaskRecord {
                        phase: [held[0], held[1], Phase::Ended { end: End::Succeeded, at }][(round % 3) as usize],
                        attempt: round,
                        stage: format!("round {round}").as_str().into(),
                        error: (round % 5 == 0).then(|| format!("failed in round {round}").as_str().into()),
                        ..TaskRecord::initial(idx > 0, Timestamp(1_000 + i64::from(round)))
                    };
                    expected[idx as usize] = task.clone();
                    (job.id, TaskIdx(idx), task)
                })
                .collect();
            store.write(&Batch { tasks: changed, ..Batch::default() }).unwrap();
            // Reads see what was flushed; the writes between flushes read
            // through what is only staged.
            if round % 7 == 0 {
                store.flush().unwrap();
                assert_eq!(store.get_job(job.id).unwrap().unwrap().tasks, expected, "round {round}");
            }
        }
        store.flush().unwrap();
        assert_eq!(store.get_job(job.id).unwrap().unwrap().tasks, expected);
    }
    let store = reopen(&path);
    assert_eq!(store.get_job(job.id).unwrap().unwrap().tasks, expected);
}

fn batch_of(tasks: std::ops::Range<u32>, setting: &str) -> Batch {
    let job = JobId(uuid::Uuid::from_u128(7));
    Batch {
        tasks: tasks.map(|i| (job, TaskIdx(i), TaskRecord::initial(i % 2 == 0, Timestamp(i64::from(i))))).collect(),
        settings: vec![(setting.to_string(), Some(vec![1]))],
        released: vec![job],
        ..Batch::default()
    }
}

#[test]
fn batches_concatenated_are_the_batches_appended_in_turn() {
    let parts = || vec![batch_of(0..3, "a"), Batch::default(), batch_of(3..40, "b"), batch_of(40..41, "a")];
    let mut appended = Batch::default();
    for part in parts() {
        appended.append(part);
    }
    let all = Batch::concat(parts());
    assert_eq!(format!("{all:?}"), format!("{appended:?}"));
    assert_eq!(all.tasks.len(), 41);
    assert!(Batch::concat(Vec::new()).is_empty());
}

//! The embedded default store on sled 0.34: a reader sees all of a batch or
//! none of it (keys reach sled under a lock every read takes), and so does a
//! crash (each batch is one journal entry per tree, see below).
//!
//! The `meta` tree holds the schema version. The `data` tree holds four key
//! spaces, each a one-byte prefix and a job id: `j` the job record, `a` a
//! marker for non-terminal jobs, `s` + chunk number the spec in chunks, and
//! `t` + group number the records of the tasks of one group of
//! `TASKS_PER_GROUP` consecutive tasks that left their initial state. Tasks
//! change in clusters (a step touches a task and its children, a layer ends
//! together), and sled's cost is per key, so one key per group makes a step
//! a few writes rather than one per task.
//!
//! The data directory holds `JOBCENTER` (the marker and schema), `LOCK`
//! (held while a process has it open), `CURRENT` (which generation is live)
//! and the live generation's sled database in `log.N`. sled 0.34 reclaims a
//! log segment only once half of it is dead, so a server that adds and
//! removes jobs for months leaves a log many times its live data. Once the
//! live generation is twice what a fresh copy of its live data would take
//! (estimated from what its own copy took, and what was added and removed
//! since), a compaction copies the live trees into generation `N+1` while
//! writes go on, replays the writes made meanwhile, makes the copy
//! durable, and then switches `CURRENT`: the rename of `CURRENT` is the one
//! moment the new generation becomes the data directory, so a crash before
//! it leaves the old one whole and a crash after it the new one. Whatever
//! generation `CURRENT` does not name is removed when the directory is
//! opened. A directory from before generations (sled's files at its top)
//! is generation 0 until its first compaction.
//!
//! A flush makes writes durable through the generation's journal
//! (`journal.rs`): the entries written since the last flush go to its
//! preallocated file as one frame, one overwrite and one `fdatasync`. A
//! write is staged until then (the next write reads through what is
//! staged), and its keys go to sled one by one only after its frame is
//! durable: sled writes its log when it likes, so whatever part of a write
//! it holds after a crash, the journal has all of it. sled's own files are
//! made durable only at a checkpoint: a generation's first flush, and a
//! flush whose entries do not fit in what is left of the journal or were
//! more than it holds. Writes the journal will not hold go to sled at once
//! instead, each tree's keys as one atomic sled batch, and the checkpoint
//! makes them durable. The checkpoint then starts the journal's next epoch.
//! Opening a generation replays the entries its trees lack: the `journal`
//! tree holds, under each tree's name, the number of the last entry applied
//! to it, written right after the entry's keys.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockWriteGuard};
use std::time::Instant;

use super::codec::{self, decode_job, decode_spec, encode, encode_spec, split_task_key};
use super::journal::{self, EntryWriter, Journal};
use super::task_group::{self, Group, Old};
use super::{Batch, Error, JobFilter, Reclaimed, Store, StoredJob, SCHEMA_VERSION};
use crate::model::{JobId, JobRecord, TaskRecord};

/// The file that marks a directory as jobcenter's, written once at creation.
const MARKER_FILE: &str = "JOBCENTER";
/// Present only while a new data directory is being created.
const INIT_MARKER_FILE: &str = "JOBCENTER.creating";
/// Held locked by the process that has the directory open.
const LOCK_FILE: &str = "LOCK";
/// Names the live generation and the size it had when it was written.
const CURRENT_FILE: &str = "CURRENT";
/// A generation's directory is this prefix and its number.
const GENERATION_PREFIX: &str = "log.";
/// A generation's files (sled 0.34's and the journal): a generation 0 is
/// these at the top of the data directory.
const GENERATION_FILES: [&str; 5] = ["db", "conf", "blobs", journal::FILE, journal::TEMPORARY];
const SLED_SNAPSHOT_PREFIX: &str = "snap.";
/// A compaction is due once the live generation is this many times the size
/// a fresh copy of its live data would have (and at least
/// `COMPACT_AT_LEAST` bytes).
const COMPACT_GROWTH: u64 = 2;
const COMPACT_AT_LEAST: u64 = 8 * 1024 * 1024;
/// What a data directory keeps free on its disk unless told otherwise.
pub(super) const KEEP_FREE: u64 = 64 * 1024 * 1024;
/// A generous count of what a batch writes to sled per task it holds (a
/// new job's spec and records, a task record changed), a few times over.
const BYTES_PER_TASK_WRITTEN: u64 = 1024;
/// Keys per batch when a compaction copies a tree.
const COPY_BATCH: usize = 2_000;
const SCHEMA_KEY: &[u8] = b"schema_version";
/// The tree that holds, under each tree's name, the number of the last
/// journal entry applied to it: written right after the entry's batch, in
/// a tree of its own so that it never rewrites a leaf of large values.
const SEQ_TREE: &str = "journal";
/// Settings live in the `meta` tree under this prefix.
const SETTING_PREFIX: &str = "setting/";
/// The most memory sled's page cache holds. The engine keeps every active
/// job in memory itself; the cache serves listings, ended jobs read back
/// and the pages a step updates.
const CACHE_BYTES: u64 = 32 * 1024 * 1024;
/// How often sled's background thread flushes and then reclaims segments
/// (for at most half this long each time).
const SEGMENT_CLEANING_EVERY_MS: u64 = 1000;

pub struct SledStore {
    path: PathBuf,
    /// The live generation; a compaction replaces it whole.
    current: RwLock<Arc<Generation>>,
    /// Taken by every write, so that a compaction's switch falls between
    /// two; also the journal entries not yet flushed.
    writes: Mutex<WriteState>,
    /// One flush at a time, so that frames reach the journal in order; it
    /// holds the buffer the pending entries are swapped into.
    flushing: Mutex<Vec<u8>>,
    /// One compaction at a time.
    compacting: Mutex<()>,
    /// Held for writing while keys are applied to sled (from before a
    /// flush's work orders go out), and for reading by each read of the
    /// store: no read sees part of a write, nor a state older than a work
    /// order already sent.
    visible: RwLock<()>,
    /// The live generation's size when it was written (0: not known).
    baseline: AtomicU64,
    /// The bytes of keys and values the live generation was written with
    /// (0: not known), and since the copy began: those added (new jobs,
    /// task groups grown) and those of removed jobs.
    copied: AtomicU64,
    added: AtomicU64,
    removed: AtomicU64,
    /// No compaction below this size.
    compact_floor: AtomicU64,
    /// Bytes its disk keeps free: a write that would leave less waits.
    keep_free: AtomicU64,
    /// `compaction-copied` and `compaction-switched`, for crash tests.
    crash: crate::crash::CrashPoint,
    /// Locked for as long as the store is open.
    _lock: std::fs::File,
}

/// What the writes share, under one lock.
#[derive(Default)]
struct WriteState {
    /// While a compaction copies: the writes made meanwhile.
    held: Option<Held>,
    /// The journal entries written since the last flush: the payload of
    /// the next frame.
    pending: Vec<u8>,
    /// More was written since the last flush than the journal holds (or an
    /// entry was too large for it): the next flush is a checkpoint.
    overflow: bool,
    /// The number of the last journal entry.
    seq: u64,
    /// The writes whose entries are in `pending`: they reach sled only
    /// once their frame is durable.
    staged: Staged,
    /// Where the records lie in the task groups written last.
    recent_groups: task_group::Recent,
}

/// Writes journalled but not yet applied to sled: each key's last value
/// (`None`: removed) per tree, and the number of the last entry of each.
/// Applied at the flush that makes their frame durable (or atomically,
/// before a checkpoint), so that sled never holds part of an entry the
/// journal could not replay.
#[derive(Default)]
struct Staged {
    meta: BTreeMap<sled::IVec, Option<sled::IVec>>,
    data: BTreeMap<sled::IVec, Option<sled::IVec>>,
    meta_seq: Option<u64>,
    data_seq: Option<u64>,
}

impl Staged {
    fn tree(&self, name: TreeName) -> &BTreeMap<sled::IVec, Option<sled::IVec>> {
        match name {
            TreeName::Meta => &self.meta,
            TreeName::Data => &self.data,
        }
    }

    fn is_empty(&self) -> bool {
        self.meta_seq.is_none() && self.data_seq.is_none()
    }

    fn add(&mut self, tree: TreeName, seq: u64, ops: Vec<(sled::IVec, Option<sled::IVec>)>) {
        let (keys, last) = match tree {
            TreeName::Meta => (&mut self.meta, &mut self.meta_seq),
            TreeName::Data => (&mut self.data, &mut self.data_seq),
        };
        keys.extend(ops);
        *last = Some(seq);
    }
}

/// One sled database: the live data directory, or a compaction's copy.
struct Generation {
    number: u64,
    dir: PathBuf,
    db: sled::Db,
    meta: sled::Tree,
    data: sled::Tree,
    /// The journal entries applied to each tree (`SEQ_TREE`).
    seqs: sled::Tree,
    /// The item files (`blobs/`) made durable so far.
    blobs: Mutex<BlobsSynced>,
    /// sled's log file, synced after each of sled's flushes.
    log: std::fs::File,
    /// Whether the files and directory entries sled made at open are durable.
    entries_synced: std::sync::atomic::AtomicBool,
    /// This generation's journal; locked by whoever flushes.
    journal: Mutex<Journal>,
    /// The number of the last journal entry its trees hold when opened.
    opened_seq: u64,
}

/// sled 0.34 writes an item larger than a quarter of a log segment (a
/// spec chunk, a node grown large) to a file of its own, and its flush
/// does not sync that file. Each flush syncs the new ones: only when the
/// directory changed since it was last seen unchanged.
#[derive(Default)]
struct BlobsSynced {
    names: std::collections::HashSet<std::ffi::OsString>,
    /// The directory's modification time when every file in it was synced,
    /// once that time is old enough that no later creation can share it.
    unchanged_since: Option<std::time::SystemTime>,
    /// Files synced since the generation was opened (for tests).
    count: u64,
}

/// Modification times tick coarsely (a few milliseconds): a time younger
/// than this may still be shared by a file created after it was read.
const MTIME_SETTLED_MS: i64 = 100;

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum TreeName {
    Meta,
    Data,
}

/// The keys written while a compaction copies, each with its last value
/// (`None`: removed). Only the last value of a key matters to the copy, so
/// this holds at most one entry per key however long the copy takes.
type Held = std::collections::HashMap<(TreeName, sled::IVec), Option<sled::IVec>>;

impl Generation {
    fn tree(&self, name: TreeName) -> &sled::Tree {
        match name {
            TreeName::Meta => &self.meta,
            TreeName::Data => &self.data,
        }
    }
}

impl TreeName {
    fn name(self) -> &'static str {
        match self {
            TreeName::Meta => "meta",
            TreeName::Data => "data",
        }
    }

    fn in_journal(self) -> journal::Tree {
        match self {
            TreeName::Meta => journal::Tree::Meta,
            TreeName::Data => journal::Tree::Data,
        }
    }
}

/// The keys one write sets and removes (`None`: removed), in order; the
/// same keys as a journal entry (unless the journal cannot take them before
/// the next flush) and, only while a compaction copies, kept for it.
struct Writes {
    ops: Vec<(sled::IVec, Option<sled::IVec>)>,
    entry: Option<EntryWriter>,
    kept: Option<Vec<(sled::IVec, Option<sled::IVec>)>>,
}

impl Writes {
    fn new(state: &WriteState) -> Writes {
        Writes {
            ops: Vec::new(),
            entry: (!state.overflow).then(EntryWriter::default),
            kept: state.held.as_ref().map(|_| Vec::new()),
        }
    }

    fn insert(&mut self, key: impl Into<sled::IVec>, value: impl Into<sled::IVec>) {
        let (key, value) = (key.into(), value.into());
        if let Some(entry) = &mut self.entry {
            entry.insert(&key, &value);
            if entry.len() as u64 > journal::CAPACITY {
                self.entry = None;
            }
        }
        if let Some(kept) = &mut self.kept {
            kept.push((key.clone(), Some(value.clone())));
        }
        self.ops.push((key, Some(value)));
    }

    fn remove(&mut self, key: impl Into<sled::IVec>) {
        let key = key.into();
        if let Some(entry) = &mut self.entry {
            entry.remove(&key);
        }
        if let Some(kept) = &mut self.kept {
            kept.push((key.clone(), None));
        }
        self.ops.push((key, None));
    }
}

const JOB: u8 = b'j';
const ACTIVE: u8 = b'a';
const SPEC: u8 = b's';
const TASK: u8 = b't';
const TASKS_PER_GROUP: u32 = 32;

fn key(space: u8, job: JobId) -> [u8; 17] {
    let mut key = [0u8; 17];
    key[0] = space;
    key[1..].copy_from_slice(job.as_bytes());
    key
}

fn key_with(space: u8, job: JobId, number: u32) -> [u8; 21] {
    let mut key = [0u8; 21];
    key[0] = space;
    key[1..17].copy_from_slice(job.as_bytes());
    key[17..].copy_from_slice(&number.to_be_bytes());
    key
}

impl SledStore {
    /// Opens (or creates) a data directory. A directory that is not empty
    /// but holds no jobcenter data, a damaged one, or one held by another
    /// process gives an error naming the path; it is never re-initialized.
    /// Creation is itself crash-safe: `JOBCENTER.creating` is written first
    /// and `JOBCENTER` last, so a creation cut short is started over.
    /// Keeps `bytes` free on the data directory's disk from now on.
    pub fn keep_free(&self, bytes: u64) {
        self.keep_free.store(bytes, Ordering::Relaxed);
    }

    /// Refuses, as a wait, a write that would leave the disk with less than
    /// it keeps free: sled cannot go on after a write of its own fails for
    /// want of room, so none is let near that point. A batch is counted at
    /// a generous size for what it adds (its new jobs' tasks above all).
    fn room_for(&self, batch: &Batch) -> Result<(), Error> {
        let keep = self.keep_free.load(Ordering::Relaxed);
        if keep == 0 {
            return Ok(());
        }
        let Ok(stat) = nix::sys::statvfs::statvfs(&self.path) else { return Ok(()) };
        let free = stat.blocks_available().saturating_mul(stat.fragment_size());
        let tasks: usize = batch.new_jobs.iter().map(|(_, spec)| spec.len()).sum::<usize>() + batch.tasks.len();
        let needed = keep.saturating_add((tasks as u64).saturating_mul(BYTES_PER_TASK_WRITTEN));
        if free >= needed {
            return Ok(());
        }
        Err(Error::NoRoom { path: self.path.display().to_string(), free, needed, keep })
    }

    pub fn open(path: &Path) -> Result<SledStore, Error> {
        let display = path.display().to_string();
        let unusable = |detail: String| Error::Unusable { path: display.clone(), detail };
        let corrupt = |detail: String| Error::Corrupt { path: display.clone(), detail };
        if path.exists() && !path.is_dir() {
            return Err(unusable("not a directory".into()));
        }
        let marker = path.join(MARKER_FILE);
        let initializing = path.join(INIT_MARKER_FILE);
        let empty = match std::fs::read_dir(path) {
            Ok(mut entries) => entries.next().is_none(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => return Err(unusable(e.to_string())),
        };
        let fresh = if empty {
            std::fs::create_dir_all(path).map_err(|e| unusable(e.to_string()))?;
            write_atomically(path, INIT_MARKER_FILE, "jobcenter data directory being created\n")
                .map_err(|e| unusable(e.to_string()))?;
            true
        } else if !marker.exists() && initializing.exists() {
            true
        } else {
            match std::fs::read_to_string(&marker) {
                Ok(text) => check_marker(&text, &display)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(unusable(format!(
                        "it is not empty and has no {MARKER_FILE} file, so it is not a jobcenter data directory"
                    )))
                }
                Err(e) => return Err(corrupt(format!("cannot read {MARKER_FILE}: {e}"))),
            }
            false
        };
        let lock = lock_directory(path, &display)?;
        if fresh && !empty {
            // A previous start was stopped while it created the directory:
            // nothing was stored yet, so start the creation over.
            tracing::warn!(path = %path.display(), "finishing the interrupted creation of the data directory");
            clear_except(path, &[INIT_MARKER_FILE, LOCK_FILE]).map_err(|e| unusable(e.to_string()))?;
        }
        let (number, baseline, copied) = if fresh {
            (1, 0, 0)
        } else {
            match std::fs::read_to_string(path.join(CURRENT_FILE)) {
                Ok(text) => parse_current(&text).ok_or_else(|| corrupt(format!("{CURRENT_FILE} is damaged")))?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => (0, 0, 0),
                Err(e) => return Err(corrupt(format!("cannot read {CURRENT_FILE}: {e}"))),
            }
        };
        let dir = generation_dir(path, number);
        if !fresh && !dir.join("db").exists() {
            return Err(corrupt("its database file is missing".into()));
        }
        remove_other_generations(path, number)
            .map_err(|e| unusable(format!("cannot remove an old generation: {e}")))?;

        let generation = open_generation(number, &dir, &display)?;
        if fresh {
            generation.meta.insert(SCHEMA_KEY, &SCHEMA_VERSION.to_be_bytes()).map_err(|e| unusable(e.to_string()))?;
            generation.flush(|e| unusable(e.to_string()))?;
            write_atomically(path, CURRENT_FILE, &current_text(number, 0, 0))
                .and_then(|()| {
                    write_atomically(path, MARKER_FILE, &format!("jobcenter data directory\nschema {SCHEMA_VERSION}\n"))
                })
                .and_then(|()| std::fs::remove_file(&initializing))
                .and_then(|()| sync_parent(path))
                .map_err(|e| unusable(e.to_string()))?;
        } else {
            let found = generation.meta.get(SCHEMA_KEY).map_err(|e| corrupt(e.to_string()))?;
            let found = found
                .and_then(|v| <[u8; 4]>::try_from(v.as_ref()).ok())
                .map(u32::from_be_bytes)
                .ok_or_else(|| corrupt("its database has no schema version: it was truncated or damaged".into()))?;
            if found != SCHEMA_VERSION {
                return Err(Error::SchemaMismatch { path: display, found, expected: SCHEMA_VERSION });
            }
        }
        Ok(SledStore {
            path: path.to_path_buf(),
            writes: Mutex::new(WriteState { seq: generation.opened_seq, ..WriteState::default() }),
            flushing: Mutex::new(Vec::new()),
            current: RwLock::new(Arc::new(generation)),
            compacting: Mutex::new(()),
            visible: RwLock::new(()),
            baseline: AtomicU64::new(baseline),
            copied: AtomicU64::new(copied),
            added: AtomicU64::new(0),
            removed: AtomicU64::new(0),
            compact_floor: AtomicU64::new(COMPACT_AT_LEAST),
            keep_free: AtomicU64::new(KEEP_FREE),
            crash: crate::crash::CrashPoint::from_env(),
            _lock: lock,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn corrupt(&self, detail: impl Into<String>) -> Error {
        Error::Corrupt { path: self.path.display().to_string(), detail: detail.into() }
    }

    fn io(&self, e: sled::Error) -> Error {
        match e {
            sled::Error::Corruption { .. } | sled::Error::Unsupported(_) | sled::Error::ReportableBug(_) => {
                self.corrupt(e.to_string())
            }
            other => Error::Io(format!("{}: {other}", self.path.display())),
        }
    }

    /// The live generation, for one read or write.
    fn generation(&self) -> Arc<Generation> {
        self.current.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn read_spec(&self, generation: &Generation, id: JobId) -> Result<crate::model::JobSpec, Error> {
        let mut chunks = Vec::new();
        for entry in generation.data.scan_prefix(key(SPEC, id)) {
            let (_, value) = entry.map_err(|e| self.io(e))?;
            chunks.push(value.to_vec());
        }
        decode_spec(&chunks).map_err(|detail| self.corrupt(format!("job {id}: {detail}")))
    }

    fn read_job(&self, generation: &Generation, record: JobRecord) -> Result<StoredJob, Error> {
        let spec = std::sync::Arc::new(self.read_spec(generation, record.id)?);
        let mut stored = Vec::new();
        for entry in generation.data.scan_prefix(key(TASK, record.id)) {
            let (group_key, value) = entry.map_err(|e| self.io(e))?;
            let (_, group) = split_task_key(&group_key[1..]).ok_or_else(|| self.corrupt("malformed task key"))?;
            let tasks: Group = codec::decode(&value, "task records").map_err(|d| self.corrupt(d))?;
            stored.extend(tasks.into_iter().map(|(offset, task)| (group * TASKS_PER_GROUP + u32::from(offset), task)));
        }
        Ok(StoredJob::assemble(record, spec, stored))
    }

    fn job_record(&self, bytes: &[u8]) -> Result<JobRecord, Error> {
        decode_job(bytes).map_err(|e| self.corrupt(e.to_string()))
    }

    /// Writes one write's keys to one tree as the next journal entry: added
    /// to the next flush's frame and staged until that frame is durable.
    /// When the journal cannot take it, what is staged and then these keys
    /// go to sled at once, each as one atomic sled batch (with the entry's
    /// number stored after it), and the next flush is a checkpoint. The keys
    /// are also kept for a compaction that is copying meanwhile.
    fn apply(
        &self,
        state: &mut WriteState,
        generation: &Generation,
        tree: TreeName,
        keys: Writes,
    ) -> Result<(), Error> {
        if keys.ops.is_empty() {
            return Ok(());
        }
        let seq = state.seq + 1;
        if let (Some(held), Some(kept)) = (&mut state.held, keys.kept) {
            held.extend(kept.into_iter().map(|(key, value)| ((tree, key), value)));
        }
        match keys.entry {
            Some(entry) if !state.overflow && (state.pending.len() + entry.len()) as u64 <= journal::CAPACITY => {
                entry.finish_into(seq, tree.in_journal(), &mut state.pending);
                state.staged.add(tree, seq, keys.ops);
            }
            _ => {
                state.overflow = true;
                state.pending = Vec::new();
                let mut staged = std::mem::take(&mut state.staged);
                staged.add(tree, seq, keys.ops);
                self.apply_staged(generation, staged, true)?;
            }
        }
        state.seq = seq;
        Ok(())
    }

    /// Applies staged writes to a generation's trees, then stores the
    /// number of the last entry of each. `atomic`: each tree's keys as one
    /// sled batch, for writes whose frame is not durable (sled may write
    /// its log at any time, and must then hold all of them or none); else
    /// key by key, for writes the journal replays whole after a crash.
    fn apply_staged(&self, generation: &Generation, staged: Staged, atomic: bool) -> Result<(), Error> {
        let visible = self.visible.write().unwrap_or_else(PoisonError::into_inner);
        self.apply_visible(generation, staged, atomic, visible)
    }

    /// `apply_staged` with the readers already held off.
    fn apply_visible(
        &self,
        generation: &Generation,
        staged: Staged,
        atomic: bool,
        _visible: RwLockWriteGuard<'_, ()>,
    ) -> Result<(), Error> {
        let Staged { meta, data, meta_seq, data_seq } = staged;
        for (tree, keys, seq) in [(TreeName::Data, data, data_seq), (TreeName::Meta, meta, meta_seq)] {
            let Some(seq) = seq else { continue };
            let sled_tree = generation.tree(tree);
            if atomic {
                let mut batch = sled::Batch::default();
                for (key, value) in keys {
                    match value {
                        Some(value) => batch.insert(key, value),
                        None => batch.remove(key),
                    }
                }
                sled_tree.apply_batch(batch).map_err(|e| self.io(e))?;
            } else {
                for (key, value) in keys {
                    match value {
                        Some(value) => sled_tree.insert(key, value).map(|_| ()),
                        None => sled_tree.remove(key).map(|_| ()),
                    }
                    .map_err(|e| self.io(e))?;
                }
            }
            generation.seqs.insert(tree.name(), &seq.to_le_bytes()).map_err(|e| self.io(e))?;
        }
        Ok(())
    }

    /// A key's value as the writes so far left it: staged, or in sled.
    fn read_written(
        &self,
        state: &WriteState,
        generation: &Generation,
        tree: TreeName,
        key: &[u8],
    ) -> Result<Option<sled::IVec>, Error> {
        match state.staged.tree(tree).get(key) {
            Some(value) => Ok(value.clone()),
            None => generation.tree(tree).get(key).map_err(|e| self.io(e)),
        }
    }

    /// Item files synced by flushes of the live generation, and those in
    /// its directory now that were not (for tests).
    #[cfg(test)]
    pub(super) fn blobs_synced(&self) -> (u64, usize) {
        let generation = self.generation();
        let synced = generation.blobs.lock().unwrap_or_else(PoisonError::into_inner);
        let unsynced = std::fs::read_dir(generation.dir.join("blobs"))
            .map(|d| d.flatten().filter(|e| !synced.names.contains(&e.file_name())).count())
            .unwrap_or(0);
        (synced.count, unsynced)
    }

    /// Makes sled's log durable and empties the journal (for tests).
    #[cfg(test)]
    pub(super) fn checkpoint(&self) -> Result<(), Error> {
        let _one = self.flushing.lock().unwrap_or_else(PoisonError::into_inner);
        self.generation().flush(|e| self.io(e))
    }

    /// Has sled write its log now, as it does on its own every second or
    /// when a buffer fills (for tests).
    #[cfg(test)]
    pub(super) fn sled_writes_its_log(&self) -> Result<(), Error> {
        self.generation().db.flush().map(|_| ()).map_err(|e| self.io(e))
    }

    /// Lets a test compact below `COMPACT_AT_LEAST`.
    #[cfg(test)]
    pub(super) fn set_compact_floor(&self, bytes: u64) {
        self.compact_floor.store(bytes, Ordering::Relaxed);
    }

    /// The live generation's size on disk, in bytes.
    fn live_bytes(&self) -> u64 {
        dir_bytes(&self.generation().dir)
    }

    /// Copies the live data into a new generation while writes go on, and
    /// switches to it: the data directory then holds the live data and no
    /// history. Returns the sizes before and after.
    pub fn compact(&self) -> Result<Reclaimed, Error> {
        let _one = self.compacting.lock().unwrap_or_else(PoisonError::into_inner);
        let started = Instant::now();
        let old = self.generation();
        let before = dir_bytes(&old.dir);
        {
            let mut writes = self.writes.lock().unwrap_or_else(PoisonError::into_inner);
            // What is staged has not reached the trees the copy reads: it
            // is held from the start.
            let mut held = Held::new();
            for tree in [TreeName::Meta, TreeName::Data] {
                let staged = writes.staged.tree(tree).iter();
                held.extend(staged.map(|(key, value)| ((tree, key.clone()), value.clone())));
            }
            writes.held = Some(held);
            self.added.store(0, Ordering::Relaxed);
            self.removed.store(0, Ordering::Relaxed);
        }
        let number = old.number + 1;
        let dir = generation_dir(&self.path, number);
        let copied = self.copy_into(&old, number, &dir);
        let (new, copied) = match copied {
            Ok(copied) => copied,
            Err(e) => {
                self.writes.lock().unwrap_or_else(PoisonError::into_inner).held = None;
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let after = dir_bytes(&new.dir);
        {
            // The switch: no write falls between the last replay and it.
            let mut writes = self.writes.lock().unwrap_or_else(PoisonError::into_inner);
            let switched = self
                .replay(&new, writes.held.as_mut().map(std::mem::take).unwrap_or_default())
                .and_then(|()| new.flush(|e| self.io(e)))
                .and_then(|()| {
                    self.crash.reached("compaction-copied");
                    write_atomically(&self.path, CURRENT_FILE, &current_text(number, after, copied))
                        .map_err(|e| Error::Io(format!("{}: {e}", self.path.display())))
                });
            if switched.is_ok() {
                self.crash.reached("compaction-switched");
            }
            writes.held = None;
            // A failure after `CURRENT` was renamed (syncing its directory)
            // still switched: the new generation is the data directory now.
            let named = || {
                std::fs::read_to_string(self.path.join(CURRENT_FILE)).ok().and_then(|t| parse_current(&t))
                    == Some((number, after, copied))
            };
            if let Err(e) = switched {
                if !named() {
                    tracing::warn!(path = %self.path.display(), error = %e, "compaction abandoned; the data directory is as it was");
                    drop(writes);
                    drop(new);
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(e);
                }
            }
            *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(new);
            // The new generation's checkpoint holds every entry not flushed
            // yet (the writes staged among them too); its journal starts
            // with the next.
            writes.pending.clear();
            writes.overflow = false;
            writes.staged = Staged::default();
        }
        self.baseline.store(after, Ordering::Relaxed);
        self.copied.store(copied, Ordering::Relaxed);
        let old_number = old.number;
        drop(old);
        if let Err(e) = remove_generation(&self.path, old_number) {
            // It is removed at the next open.
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the compacted generation yet");
        }
        Ok(Reclaimed { before_bytes: before, after_bytes: after, took: started.elapsed() })
    }

    /// Opens generation `number` afresh and copies `old`'s trees into it,
    /// then the writes made meanwhile; durable when it returns. Also returns
    /// the bytes of keys and values it copied.
    fn copy_into(&self, old: &Generation, number: u64, dir: &Path) -> Result<(Generation, u64), Error> {
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(|e| Error::Io(format!("{}: {e}", dir.display())))?;
        }
        let new = open_generation(number, dir, &self.path.display().to_string())?;
        let mut copied = 0;
        for tree in [TreeName::Meta, TreeName::Data] {
            let mut batch = sled::Batch::default();
            let mut in_batch = 0;
            for entry in old.tree(tree).iter() {
                let (key, value) = entry.map_err(|e| self.io(e))?;
                copied += (key.len() + value.len()) as u64;
                batch.insert(key, value);
                in_batch += 1;
                if in_batch == COPY_BATCH {
                    new.tree(tree).apply_batch(std::mem::take(&mut batch)).map_err(|e| self.io(e))?;
                    in_batch = 0;
                }
            }
            new.tree(tree).apply_batch(batch).map_err(|e| self.io(e))?;
        }
        // Catch up outside the switch, so that the switch replays little.
        let held = self.writes.lock().unwrap_or_else(PoisonError::into_inner).held.as_mut().map(std::mem::take);
        self.replay(&new, held.unwrap_or_default())?;
        new.flush(|e| self.io(e))?;
        Ok((new, copied))
    }

    fn replay(&self, generation: &Generation, held: Held) -> Result<(), Error> {
        for ((tree, key), value) in held {
            let tree = generation.tree(tree);
            match value {
                Some(value) => tree.insert(key, value).map(|_| ()),
                None => tree.remove(key).map(|_| ()),
            }
            .map_err(|e| self.io(e))?;
        }
        Ok(())
    }
}

/// The directory of generation `number` (0: the data directory itself).
fn generation_dir(path: &Path, number: u64) -> PathBuf {
    if number == 0 {
        path.to_path_buf()
    } else {
        path.join(format!("{GENERATION_PREFIX}{number}"))
    }
}

/// Whether a generation of `size` bytes on disk is due for a compaction: it
/// was `baseline` bytes when `copied` bytes of keys and values were copied
/// into it, and `added` were added and `removed` removed since.
fn compaction_due(size: u64, baseline: u64, copied: u64, added: u64, removed: u64) -> bool {
    if copied == 0 {
        return size >= baseline.saturating_mul(COMPACT_GROWTH);
    }
    let live = (copied + added).saturating_sub(removed);
    let fresh = u128::from(live) * u128::from(baseline) / u128::from(copied);
    u128::from(size) >= fresh * u128::from(COMPACT_GROWTH)
}

fn current_text(number: u64, bytes: u64, copied: u64) -> String {
    format!("generation {number}\nbytes {bytes}\ncopied {copied}\n")
}

/// The generation `CURRENT` names, its size when written and the bytes of
/// keys and values it was written with.
fn parse_current(text: &str) -> Option<(u64, u64, u64)> {
    let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse().ok());
    Some((field("generation ")?, field("bytes ")?, field("copied ")?))
}

fn lock_directory(path: &Path, display: &str) -> Result<std::fs::File, Error> {
    let file =
        std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path.join(LOCK_FILE)).map_err(
            |e| Error::Unusable { path: display.to_string(), detail: format!("cannot create {LOCK_FILE}: {e}") },
        )?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::Locked { path: display.to_string() }),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(Error::Unusable { path: display.to_string(), detail: format!("cannot lock {LOCK_FILE}: {e}") })
        }
    }
}

/// Opens a generation's sled database and replays its journal into it, or
/// gives it a new journal when it has none.
fn open_generation(number: u64, dir: &Path, display: &str) -> Result<Generation, Error> {
    let db = open_guarded(dir, display)?;
    let corrupt = |detail: String| Error::Corrupt { path: display.to_string(), detail };
    let unusable = |detail: String| Error::Unusable { path: display.to_string(), detail };
    let meta = db.open_tree("meta").map_err(|e| corrupt(e.to_string()))?;
    let data = db.open_tree("data").map_err(|e| corrupt(e.to_string()))?;
    let seqs = db.open_tree(SEQ_TREE).map_err(|e| corrupt(e.to_string()))?;
    let (journal, opened_seq) = match Journal::open(dir).map_err(|d| corrupt(format!("its journal: {d}")))? {
        None => (Journal::create(dir).map_err(|e| unusable(format!("cannot create its journal: {e}")))?, 0),
        Some((journal, payloads)) => {
            let seq = replay_journal([&meta, &data], &seqs, &payloads).map_err(corrupt)?;
            (journal, seq)
        }
    };
    Ok(Generation {
        number,
        dir: dir.to_path_buf(),
        meta,
        data,
        seqs,
        log: std::fs::File::open(dir.join("db")).map_err(|e| unusable(format!("cannot open its log file: {e}")))?,
        db,
        blobs: Mutex::default(),
        entries_synced: std::sync::atomic::AtomicBool::new(false),
        journal: Mutex::new(journal),
        opened_seq,
    })
}

/// The number of the last journal entry applied to `tree` (0: none).
fn applied_seq(seqs: &sled::Tree, tree: TreeName) -> Result<u64, String> {
    match seqs.get(tree.name()).map_err(|e| e.to_string())? {
        None => Ok(0),
        Some(value) => <[u8; 8]>::try_from(value.as_ref())
            .map(u64::from_le_bytes)
            .map_err(|_| "its journal sequence number is damaged".to_string()),
    }
}

/// Applies the journal's entries that their trees (`[meta, data]`) do not
/// hold yet, each as the atomic batch it was; returns the number of the
/// last entry the trees or the journal know.
///
/// sled's log is recovered in the order it was written, so a tree holds
/// every entry up to the number `seqs` gives it, and perhaps the next
/// (written, its number not). Entries it holds are never applied again: a
/// later batch sled wrote on its own would be partly undone.
fn replay_journal(trees: [&sled::Tree; 2], seqs: &sled::Tree, payloads: &[Vec<u8>]) -> Result<u64, String> {
    let names = [TreeName::Meta, TreeName::Data];
    let mut applied = [applied_seq(seqs, names[0])?, applied_seq(seqs, names[1])?];
    let mut last = applied[0].max(applied[1]);
    let mut replayed = 0;
    for payload in payloads {
        for entry in journal::decode_payload(payload).map_err(|d| format!("its journal: {d}"))? {
            let i = entry.tree as usize;
            last = last.max(entry.seq);
            if entry.seq <= applied[i] {
                continue;
            }
            let mut batch = sled::Batch::default();
            for (key, value) in entry.ops {
                match value {
                    Some(value) => batch.insert(key, value),
                    None => batch.remove(key),
                }
            }
            trees[i].apply_batch(batch).map_err(|e| e.to_string())?;
            seqs.insert(names[i].name(), &entry.seq.to_le_bytes()).map_err(|e| e.to_string())?;
            applied[i] = entry.seq;
            replayed += 1;
        }
    }
    if replayed > 0 {
        tracing::info!(entries = replayed, "replayed the journal's entries the database did not hold");
    }
    Ok(last)
}

impl Generation {
    /// Makes everything written to this generation so far durable in
    /// sled's own files: a checkpoint.
    fn flush(&self, sled_error: impl Fn(sled::Error) -> Error) -> Result<(), Error> {
        let mut journal = self.journal.lock().unwrap_or_else(PoisonError::into_inner);
        self.checkpoint(&mut journal, sled_error)
    }

    /// Makes sled's log durable, then starts the journal's next epoch.
    ///
    /// sled 0.34's flush writes its log and waits with `sync_file_range`,
    /// which records neither the blocks and size of a file that grew nor
    /// empties the disk's write cache: a power loss could still take what it
    /// wrote. So the log file is synced (`fdatasync`) after it; then the
    /// item files made since the last checkpoint; and, at the first, the
    /// configuration file and the directory entries sled made at open, the
    /// journal's among them (and, for a generation's own directory, the data
    /// directory's). Only then may the journal forget its entries.
    fn checkpoint(&self, journal: &mut Journal, sled_error: impl Fn(sled::Error) -> Error) -> Result<(), Error> {
        self.db.flush().map_err(sled_error)?;
        let io = |e: std::io::Error| Error::Io(format!("{}: {e}", self.dir.display()));
        self.log.sync_data().map_err(io)?;
        self.sync_new_blobs().map_err(io)?;
        if !self.entries_synced.load(Ordering::Acquire) {
            sync_path(&self.dir.join("conf")).map_err(io)?;
            sync_path(&self.dir).map_err(io)?;
            if self.number > 0 {
                if let Some(parent) = self.dir.parent() {
                    sync_path(parent).map_err(io)?;
                }
            }
            self.entries_synced.store(true, Ordering::Release);
        }
        if !journal.is_empty() {
            journal.restart().map_err(io)?;
        }
        Ok(())
    }

    /// Syncs the item files created since the last call, and then the
    /// directory that names them.
    fn sync_new_blobs(&self) -> std::io::Result<()> {
        let mut synced = self.blobs.lock().unwrap_or_else(PoisonError::into_inner);
        let blobs = self.dir.join("blobs");
        let modified = match std::fs::metadata(&blobs) {
            Ok(meta) => meta.modified()?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        if synced.unchanged_since == Some(modified) {
            return Ok(());
        }
        let mut present = std::collections::HashSet::new();
        let mut any = false;
        for entry in std::fs::read_dir(&blobs)? {
            let entry = entry?;
            let name = entry.file_name();
            if !synced.names.contains(&name) {
                match sync_path(&entry.path()) {
                    Ok(()) => {}
                    // Removed meanwhile by sled's own clean-up.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
                synced.count += 1;
                any = true;
            }
            present.insert(name);
        }
        if any {
            sync_path(&blobs)?;
        }
        synced.names = present;
        let age_ms = crate::clock::Clock::now(&crate::clock::SystemClock).0 - millis_since_epoch(modified);
        synced.unchanged_since = (age_ms > MTIME_SETTLED_MS).then_some(modified);
        Ok(())
    }
}

fn millis_since_epoch(at: std::time::SystemTime) -> i64 {
    at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Removes a generation's files; generation 0 is sled's files at the top.
fn remove_generation(path: &Path, number: u64) -> std::io::Result<()> {
    if number > 0 {
        return std::fs::remove_dir_all(generation_dir(path, number));
    }
    remove_entries(path, |name| GENERATION_FILES.contains(&name) || name.starts_with(SLED_SNAPSHOT_PREFIX))
}

/// Removes every generation but `live`: a copy a compaction left unfinished,
/// or the one it replaced.
fn remove_other_generations(path: &Path, live: u64) -> std::io::Result<()> {
    let mut others = Vec::new();
    for entry in std::fs::read_dir(path)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some(number) = name.strip_prefix(GENERATION_PREFIX).and_then(|n| n.parse::<u64>().ok()) {
            others.push(number);
        }
    }
    if live > 0 && path.join("db").exists() {
        others.push(0);
    }
    for number in others.into_iter().filter(|&n| n != live) {
        tracing::info!(path = %path.display(), generation = number, "removing a generation the data directory no longer uses");
        remove_generation(path, number)?;
    }
    Ok(())
}

/// The bytes of every file under `path` but the journal, whose size is
/// fixed: what compaction weighs against the live data.
fn dir_bytes(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else { return 0 };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(m) if m.is_dir() => {
                let name = entry.file_name();
                // Generation 0 is the data directory itself: count sled's files only.
                if name.to_string_lossy().starts_with(GENERATION_PREFIX) {
                    0
                } else {
                    dir_bytes(&entry.path())
                }
            }
            Ok(_) if entry.file_name() == journal::FILE => 0,
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

fn check_marker(text: &str, display: &str) -> Result<(), Error> {
    let found = text
        .lines()
        .find_map(|l| l.strip_prefix("schema "))
        .and_then(|v| v.trim().parse::<u32>().ok())
        .ok_or_else(|| Error::Corrupt { path: display.to_string(), detail: format!("{MARKER_FILE} is damaged") })?;
    if found != SCHEMA_VERSION {
        return Err(Error::SchemaMismatch { path: display.to_string(), found, expected: SCHEMA_VERSION });
    }
    Ok(())
}

/// Writes a small file so that it is either absent or whole, even across a crash.
fn write_atomically(dir: &Path, name: &str, text: &str) -> std::io::Result<()> {
    let temporary = dir.join(format!("{name}.tmp"));
    let mut file = std::fs::File::create(&temporary)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&temporary, dir.join(name))?;
    sync_path(dir)
}

/// Syncs a file or a directory (its entries) by its path.
fn sync_path(path: &Path) -> std::io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

/// Syncs the directory that holds `path`, so that a data directory just
/// created survives a power loss with its name. A parent this process may
/// not read is left to the file system's next commit, with a warning.
fn sync_parent(path: &Path) -> std::io::Result<()> {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    match sync_path(parent) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            tracing::warn!(path = %parent.display(), error = %e, "cannot sync the directory that holds the new data directory");
            Ok(())
        }
        synced => synced,
    }
}

/// Removes everything in `dir` but the files `keep`.
fn clear_except(dir: &Path, keep: &[&str]) -> std::io::Result<()> {
    remove_entries(dir, |name| !keep.contains(&name))
}

/// Removes the files and directories in `dir` whose names `chosen` picks.
fn remove_entries(dir: &Path, chosen: impl Fn(&str) -> bool) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if !chosen(&entry.file_name().to_string_lossy()) {
            continue;
        }
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
        } else {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// sled 0.34 can panic on a damaged directory; turn that into an error.
fn open_guarded(path: &Path, display: &str) -> Result<sled::Db, Error> {
    // Every write is made durable by an explicit flush (group commit); the
    // background flusher is kept because sled 0.34 moves the live pages
    // out of mostly empty log segments mainly from that thread: without it,
    // the space of removed jobs is reused far too slowly and the log grows
    // for as long as the server runs.
    let config =
        sled::Config::new().path(path).cache_capacity(CACHE_BYTES).flush_every_ms(Some(SEGMENT_CLEANING_EVERY_MS));
    // The panic hook is the process's: one open at a time swaps it, or two
    // at once could leave it silenced for good.
    static HOOK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let opened = {
        let _one = HOOK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let previous_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || config.open()));
        std::panic::set_hook(previous_hook);
        opened
    };
    match opened {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(sled::Error::Io(e))) if e.kind() == std::io::ErrorKind::WouldBlock || e.to_string().contains("lock") => {
            Err(Error::Locked { path: display.to_string() })
        }
        Ok(Err(e)) => Err(Error::Corrupt { path: display.to_string(), detail: e.to_string() }),
        Err(panic) => {
            let detail = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "the database could not be read".into());
            Err(Error::Corrupt { path: display.to_string(), detail })
        }
    }
}

impl Store for SledStore {
    fn write(&self, batch: &Batch) -> Result<(), Error> {
        self.room_for(batch)?;
        let mut state = self.writes.lock().unwrap_or_else(PoisonError::into_inner);
        let generation = self.generation();
        let data = &generation.data;
        let mut writes = Writes::new(&state);
        let mut removed = 0;
        for &id in &batch.removed {
            let Some(bytes) = self.read_written(&state, &generation, TreeName::Data, &key(JOB, id))? else { continue };
            if !self.job_record(&bytes)?.state.is_terminal() {
                continue;
            }
            removed += (key(JOB, id).len() + bytes.len()) as u64;
            state.recent_groups.forget(id);
            writes.remove(&key(JOB, id)[..]);
            writes.remove(&key(ACTIVE, id)[..]);
            for space in [SPEC, TASK] {
                let prefix = key(space, id);
                for entry in data.scan_prefix(prefix) {
                    let (owned, value) = entry.map_err(|e| self.io(e))?;
                    removed += (owned.len() + value.len()) as u64;
                    writes.remove(owned);
                }
                let from = (std::ops::Bound::Included(&prefix[..]), std::ops::Bound::Unbounded);
                let staged = state.staged.data.range::<[u8], _>(from);
                for (owned, _) in staged.take_while(|(owned, _)| owned.starts_with(&prefix)) {
                    writes.remove(owned.clone());
                }
            }
        }
        let mut added = 0;
        for (record, spec) in &batch.new_jobs {
            for (number, bytes) in encode_spec(spec) {
                let chunk_key = key_with(SPEC, record.id, number);
                added += (chunk_key.len() + bytes.len()) as u64;
                writes.insert(&chunk_key[..], bytes);
            }
        }
        let new_records = batch.new_jobs.iter().map(|(record, _)| (record, true));
        for (record, new) in new_records.chain(batch.jobs.iter().map(|record| (record, false))) {
            let encoded = encode(record);
            if new {
                added += (key(JOB, record.id).len() + encoded.len()) as u64;
            }
            writes.insert(&key(JOB, record.id)[..], encoded);
            if record.state.is_terminal() {
                writes.remove(&key(ACTIVE, record.id)[..]);
            } else {
                writes.insert(&key(ACTIVE, record.id)[..], &[][..]);
            }
        }
        let mut groups: BTreeMap<(JobId, u32), BTreeMap<u8, &TaskRecord>> = BTreeMap::new();
        for (job, idx, task) in &batch.tasks {
            let offset = (idx.0 % TASKS_PER_GROUP) as u8;
            groups.entry((*job, idx.0 / TASKS_PER_GROUP)).or_default().insert(offset, task);
        }
        // Taken out until the keys are written: an error leaves nothing
        // remembered.
        let mut recent = std::mem::take(&mut state.recent_groups);
        for ((job, group), changed) in groups {
            let group_key = key_with(TASK, job, group);
            let (encoded, stored_len) = match recent.get(job, group) {
                Some(known) => {
                    debug_assert_eq!(
                        self.read_written(&state, &generation, TreeName::Data, &group_key)?.as_deref(),
                        Some(&known.bytes[..]),
                        "a remembered group is what is stored"
                    );
                    (task_group::encode(&known.records(), &changed), Some(known.bytes.len()))
                }
                None => match self.read_written(&state, &generation, TreeName::Data, &group_key)? {
                    None => (task_group::encode(&[], &changed), None),
                    Some(bytes) => {
                        let decoded: Group = codec::decode(&bytes, "task records").map_err(|d| self.corrupt(d))?;
                        let old: Vec<(u8, Old)> = decoded.iter().map(|(at, task)| (*at, Old::Record(task))).collect();
                        (task_group::encode(&old, &changed), Some(bytes.len()))
                    }
                },
            };
            added += match stored_len {
                Some(len) => encoded.bytes.len().saturating_sub(len) as u64,
                None => (group_key.len() + encoded.bytes.len()) as u64,
            };
            writes.insert(&group_key[..], &encoded.bytes[..]);
            recent.put(job, group, encoded);
        }
        self.apply(&mut state, &generation, TreeName::Data, writes)?;
        state.recent_groups = recent;
        self.added.fetch_add(added, Ordering::Relaxed);
        self.removed.fetch_add(removed, Ordering::Relaxed);
        let mut settings = Writes::new(&state);
        for (key, value) in &batch.settings {
            let key = format!("{SETTING_PREFIX}{key}");
            match value {
                Some(value) => settings.insert(key.as_bytes(), value.as_slice()),
                None => settings.remove(key.as_bytes()),
            }
        }
        self.apply(&mut state, &generation, TreeName::Meta, settings)
    }

    /// Appends the entries written since the last flush to the live
    /// generation's journal as one frame, synced, and then applies them to
    /// sled; or applies them and checkpoints when more was written than the
    /// journal takes, when the frame does not fit, or at the generation's
    /// first flush.
    fn flush(&self) -> Result<(), Error> {
        self.flush_then(&mut || {})
    }

    fn flush_then(&self, durable: &mut dyn FnMut()) -> Result<(), Error> {
        let mut payload = self.flushing.lock().unwrap_or_else(PoisonError::into_inner);
        payload.clear();
        // Held to the end: a compaction switches generations under the same
        // lock (its checkpoint of the new one holds every write made before
        // the switch), and a write reads what the last one left, staged or
        // applied.
        let mut state = self.writes.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::swap(&mut state.pending, &mut payload);
        let overflow = std::mem::take(&mut state.overflow);
        let staged = std::mem::take(&mut state.staged);
        let generation = self.generation();
        let mut journal = generation.journal.lock().unwrap_or_else(PoisonError::into_inner);
        if payload.is_empty() && !overflow {
            debug_assert!(staged.is_empty(), "writes are staged only with their entries");
            durable();
            return Ok(());
        }
        if overflow || !generation.entries_synced.load(Ordering::Acquire) || !journal.fits(payload.len()) {
            self.apply_staged(&generation, staged, true)?;
            generation.checkpoint(&mut journal, |e| self.io(e))?;
            durable();
            return Ok(());
        }
        journal
            .append(&payload)
            .map_err(|e| Error::Io(format!("{}: {e}", generation.dir.join(journal::FILE).display())))?;
        // Readers wait out the apply from before the work orders go out, so
        // that whoever learns of an order (its worker, then anyone it tells)
        // reads the state that made it.
        let visible = self.visible.write().unwrap_or_else(PoisonError::into_inner);
        durable();
        self.apply_visible(&generation, staged, false, visible)
    }

    fn load_active(&self) -> Result<Vec<StoredJob>, Error> {
        let _visible = self.visible.read().unwrap_or_else(PoisonError::into_inner);
        let generation = self.generation();
        let mut out = Vec::new();
        for entry in generation.data.scan_prefix([ACTIVE]) {
            let (active_key, _) = entry.map_err(|e| self.io(e))?;
            let id: [u8; 16] = active_key[1..].try_into().map_err(|_| self.corrupt("malformed active key"))?;
            let id = JobId::from_bytes(id);
            let bytes = generation
                .data
                .get(key(JOB, id))
                .map_err(|e| self.io(e))?
                .ok_or_else(|| self.corrupt("an active job has no record"))?;
            let record = self.job_record(&bytes)?;
            out.push(self.read_job(&generation, record)?);
        }
        Ok(out)
    }

    fn get_job(&self, id: JobId) -> Result<Option<StoredJob>, Error> {
        let _visible = self.visible.read().unwrap_or_else(PoisonError::into_inner);
        let generation = self.generation();
        match generation.data.get(key(JOB, id)).map_err(|e| self.io(e))? {
            Some(bytes) => Ok(Some(self.read_job(&generation, self.job_record(&bytes)?)?)),
            None => Ok(None),
        }
    }

    fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<JobRecord>, Error> {
        let _visible = self.visible.read().unwrap_or_else(PoisonError::into_inner);
        let generation = self.generation();
        let mut out = Vec::new();
        let end = match filter.before {
            Some(before) => key(JOB, before).to_vec(),
            None => vec![JOB + 1],
        };
        for entry in generation.data.range(vec![JOB]..end).rev() {
            if out.len() >= filter.limit.unwrap_or(usize::MAX) {
                break;
            }
            let (_, bytes) = entry.map_err(|e| self.io(e))?;
            let record = self.job_record(&bytes)?;
            if filter.matches(&record) {
                out.push(record);
            }
        }
        Ok(out)
    }

    fn put_setting(&self, key: &str, value: Option<&[u8]>) -> Result<(), Error> {
        let key = format!("{SETTING_PREFIX}{key}");
        {
            let mut state = self.writes.lock().unwrap_or_else(PoisonError::into_inner);
            let mut writes = Writes::new(&state);
            match value {
                Some(value) => writes.insert(key.as_bytes(), value),
                None => writes.remove(key.as_bytes()),
            }
            self.apply(&mut state, &self.generation(), TreeName::Meta, writes)?;
        }
        self.flush()
    }

    fn settings(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, Error> {
        let _visible = self.visible.read().unwrap_or_else(PoisonError::into_inner);
        let full = format!("{SETTING_PREFIX}{prefix}");
        let mut out = Vec::new();
        for entry in self.generation().meta.scan_prefix(full.as_bytes()) {
            let (key, value) = entry.map_err(|e| self.io(e))?;
            let key = String::from_utf8_lossy(&key[SETTING_PREFIX.len()..]).into_owned();
            out.push((key, value.to_vec()));
        }
        Ok(out)
    }

    /// Compacts when the live generation is `COMPACT_GROWTH` times what a
    /// fresh copy of its live data would take: the bytes it was written
    /// with, plus those added and less those removed since, at the size on
    /// disk per byte of its own copy. So steady churn (as much added as
    /// removed) compacts only once the log has doubled, and a large prune,
    /// which leaves the log as large as it was, compacts at once. A
    /// generation whose copy is not known (0, from before generations)
    /// compacts once it has doubled.
    fn reclaim(&self) -> Result<Option<Reclaimed>, Error> {
        let size = self.live_bytes();
        let due = compaction_due(
            size,
            self.baseline.load(Ordering::Relaxed),
            self.copied.load(Ordering::Relaxed),
            self.added.load(Ordering::Relaxed),
            self.removed.load(Ordering::Relaxed),
        );
        if size < self.compact_floor.load(Ordering::Relaxed) || !due {
            return Ok(None);
        }
        // The copy takes room beside the live generation: never so much
        // that the live one's own writes run short.
        let copy = self.copied.load(Ordering::Relaxed) + self.added.load(Ordering::Relaxed);
        let needed = self.keep_free.load(Ordering::Relaxed).saturating_add(copy.saturating_mul(2));
        if let Ok(stat) = nix::sys::statvfs::statvfs(&self.path) {
            let free = stat.blocks_available().saturating_mul(stat.fragment_size());
            if free < needed {
                tracing::info!(path = %self.path.display(), free, needed, "compaction put off: too little room on the disk for the copy");
                return Ok(None);
            }
        }
        self.compact().map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::journal::{EntryWriter, Tree};
    use super::*;

    /// One entry's number, tree and keys with their values.
    type TestEntry<'a> = (u64, Tree, &'a [(&'a str, &'a str)]);

    /// A journal payload of entries.
    fn payload(entries: &[TestEntry]) -> Vec<u8> {
        let mut payload = Vec::new();
        for (seq, tree, ops) in entries {
            let mut entry = EntryWriter::default();
            for (key, value) in *ops {
                entry.insert(key.as_bytes(), value.as_bytes());
            }
            entry.finish_into(*seq, *tree, &mut payload);
        }
        payload
    }

    fn value(tree: &sled::Tree, key: &str) -> Option<String> {
        tree.get(key).unwrap().map(|v| String::from_utf8(v.to_vec()).unwrap())
    }

    #[test]
    fn compaction_is_due_at_twice_what_a_fresh_copy_of_the_live_data_would_take() {
        // The live generation's copy: 1,000 bytes of keys and values, 2,000 on disk.
        assert!(!compaction_due(3_999, 2_000, 1_000, 0, 0), "rewrites alone, below twice the copy");
        assert!(compaction_due(4_000, 2_000, 1_000, 0, 0), "rewrites alone, twice the copy");
        assert!(!compaction_due(5_999, 2_000, 1_000, 500, 0), "grown by half: twice 3,000");
        assert!(compaction_due(6_000, 2_000, 1_000, 500, 0));
        assert!(!compaction_due(3_999, 2_000, 1_000, 300, 300), "churn: as it was");
        assert!(compaction_due(2_000, 2_000, 1_000, 0, 500), "half removed, the log as large: due");
        // A generation whose copy is not known compacts once it has doubled.
        assert!(!compaction_due(3_999, 2_000, 0, 5_000, 0));
        assert!(compaction_due(4_000, 2_000, 0, 0, 0));
    }

    #[test]
    fn replay_applies_what_each_tree_lacks_and_never_an_older_entry_over_a_newer_batch() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let (meta, data, seqs) =
            (db.open_tree("meta").unwrap(), db.open_tree("data").unwrap(), db.open_tree(SEQ_TREE).unwrap());
        // The data tree got entry 3 on its own (sled wrote it before the
        // crash; it was never acknowledged): k and m from the same batch.
        let mut batch = sled::Batch::default();
        batch.insert("k", "v3");
        batch.insert("m", "x3");
        data.apply_batch(batch).unwrap();
        seqs.insert("data", &3u64.to_le_bytes()).unwrap();
        let journal = [
            payload(&[(1, Tree::Data, &[("k", "v1")]), (2, Tree::Meta, &[("s", "one")])]),
            payload(&[(3, Tree::Data, &[("k", "v3"), ("m", "x3")]), (4, Tree::Meta, &[("s", "two")])]),
        ];
        // Only the journal's first frame reached the disk.
        let last = replay_journal([&meta, &data], &seqs, &journal[..1]).unwrap();
        assert_eq!(last, 3, "the trees know entry 3");
        assert_eq!(value(&data, "k").as_deref(), Some("v3"), "entry 1 is not applied over entry 3");
        assert_eq!(value(&data, "m").as_deref(), Some("x3"));
        assert_eq!(value(&meta, "s").as_deref(), Some("one"), "the meta tree lacked entry 2");
        assert_eq!(applied_seq(&seqs, TreeName::Meta).unwrap(), 2);
        // Both frames: entry 4 is applied, entry 3 is not applied twice.
        assert_eq!(replay_journal([&meta, &data], &seqs, &journal).unwrap(), 4);
        assert_eq!(value(&meta, "s").as_deref(), Some("two"));
        let applied = (applied_seq(&seqs, TreeName::Meta).unwrap(), applied_seq(&seqs, TreeName::Data).unwrap());
        assert_eq!(applied, (4, 3));
        let damaged = vec![9, 0, 0, 0, 1];
        let error = replay_journal([&meta, &data], &seqs, &[damaged]).unwrap_err();
        assert!(error.contains("its journal: entry 1"), "{error}");
    }
}

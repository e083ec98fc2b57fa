//! The embedded default store on sled 0.34: every batch is one atomic sled
//! batch on one tree, so a reader or a crash sees all of it or none of it.
//!
//! The `meta` tree holds the schema version. The `data` tree holds four key
//! spaces, each a one-byte prefix and a job id: `j` the job record, `a` a
//! marker for non-terminal jobs, `s` + chunk number the spec in chunks, and
//! `t` + group number the records of the tasks of one group of
//! `TASKS_PER_GROUP` consecutive tasks that left their initial state. Tasks
//! change in clusters (a step touches a task and its children, a layer ends
//! together), and sled's cost is per key, so one key per group makes a step
//! a few writes rather than one per task.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::codec::{self, decode_job, decode_spec, encode, encode_spec, split_task_key};
use super::{Batch, Error, JobFilter, Store, StoredJob, SCHEMA_VERSION};
use crate::model::{JobId, JobRecord, TaskRecord};

/// The file that marks a directory as jobcenter's, written once at creation.
const MARKER_FILE: &str = "JOBCENTER";
/// Present only while a new data directory is being created.
const INIT_MARKER_FILE: &str = "JOBCENTER.creating";
const SCHEMA_KEY: &[u8] = b"schema_version";
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
    db: sled::Db,
    meta: sled::Tree,
    data: sled::Tree,
}

const JOB: u8 = b'j';
const ACTIVE: u8 = b'a';
const SPEC: u8 = b's';
const TASK: u8 = b't';
const TASKS_PER_GROUP: u32 = 32;

/// The stored records of one group: (offset in the group, record).
type Group = Vec<(u8, TaskRecord)>;

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
            // A previous start was stopped while it created the directory:
            // nothing was stored yet, so start the creation over.
            tracing::warn!(path = %path.display(), "finishing the interrupted creation of the data directory");
            clear_except(path, INIT_MARKER_FILE).map_err(|e| unusable(e.to_string()))?;
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
            if !path.join("db").exists() {
                return Err(corrupt("its database file is missing".into()));
            }
            false
        };

        let db = open_guarded(path, &display)?;
        let open_tree = |name: &str| db.open_tree(name).map_err(|e| corrupt(e.to_string()));
        let store = SledStore { meta: open_tree("meta")?, data: open_tree("data")?, path: path.to_path_buf(), db };
        if fresh {
            store.meta.insert(SCHEMA_KEY, &SCHEMA_VERSION.to_be_bytes()).map_err(|e| unusable(e.to_string()))?;
            store.db.flush().map_err(|e| unusable(e.to_string()))?;
            write_atomically(path, MARKER_FILE, &format!("jobcenter data directory\nschema {SCHEMA_VERSION}\n"))
                .and_then(|()| std::fs::remove_file(&initializing))
                .map_err(|e| unusable(e.to_string()))?;
        } else {
            let found = store.meta.get(SCHEMA_KEY).map_err(|e| corrupt(e.to_string()))?;
            let found = found
                .and_then(|v| <[u8; 4]>::try_from(v.as_ref()).ok())
                .map(u32::from_be_bytes)
                .ok_or_else(|| corrupt("its database has no schema version: it was truncated or damaged".into()))?;
            if found != SCHEMA_VERSION {
                return Err(Error::SchemaMismatch { path: display, found, expected: SCHEMA_VERSION });
            }
        }
        Ok(store)
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

    fn read_spec(&self, id: JobId) -> Result<crate::model::JobSpec, Error> {
        let mut chunks = Vec::new();
        for entry in self.data.scan_prefix(key(SPEC, id)) {
            let (_, value) = entry.map_err(|e| self.io(e))?;
            chunks.push(value.to_vec());
        }
        decode_spec(&chunks).map_err(|detail| self.corrupt(format!("job {id}: {detail}")))
    }

    fn read_job(&self, record: JobRecord) -> Result<StoredJob, Error> {
        let spec = std::sync::Arc::new(self.read_spec(record.id)?);
        let mut stored = Vec::new();
        for entry in self.data.scan_prefix(key(TASK, record.id)) {
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
    std::fs::File::open(dir)?.sync_all()
}

/// Removes everything in `dir` but the file `keep`.
fn clear_except(dir: &Path, keep: &str) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name() == keep {
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
        let mut writes = sled::Batch::default();
        for &id in &batch.removed {
            let Some(bytes) = self.data.get(key(JOB, id)).map_err(|e| self.io(e))? else { continue };
            if !self.job_record(&bytes)?.state.is_terminal() {
                continue;
            }
            writes.remove(&key(JOB, id)[..]);
            writes.remove(&key(ACTIVE, id)[..]);
            for space in [SPEC, TASK] {
                for entry in self.data.scan_prefix(key(space, id)) {
                    let (owned, _) = entry.map_err(|e| self.io(e))?;
                    writes.remove(owned);
                }
            }
        }
        for (record, spec) in &batch.new_jobs {
            for (number, bytes) in encode_spec(spec) {
                writes.insert(&key_with(SPEC, record.id, number)[..], bytes);
            }
        }
        for record in batch.new_jobs.iter().map(|(r, _)| r).chain(batch.jobs.iter()) {
            writes.insert(&key(JOB, record.id)[..], encode(record));
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
        for ((job, group), changed) in groups {
            let group_key = key_with(TASK, job, group);
            let mut merged: BTreeMap<u8, TaskRecord> = match self.data.get(group_key).map_err(|e| self.io(e))? {
                Some(bytes) => {
                    let stored: Group = codec::decode(&bytes, "task records").map_err(|d| self.corrupt(d))?;
                    stored.into_iter().collect()
                }
                None => BTreeMap::new(),
            };
            for (offset, task) in changed {
                merged.insert(offset, task.clone());
            }
            let merged: Group = merged.into_iter().collect();
            writes.insert(&group_key[..], encode(&merged));
        }
        self.data.apply_batch(writes).map_err(|e| self.io(e))?;
        if !batch.settings.is_empty() {
            let mut settings = sled::Batch::default();
            for (key, value) in &batch.settings {
                let key = format!("{SETTING_PREFIX}{key}");
                match value {
                    Some(value) => settings.insert(key.as_bytes(), value.as_slice()),
                    None => settings.remove(key.as_bytes()),
                }
            }
            self.meta.apply_batch(settings).map_err(|e| self.io(e))?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), Error> {
        self.db.flush().map(|_| ()).map_err(|e| self.io(e))
    }

    fn load_active(&self) -> Result<Vec<StoredJob>, Error> {
        let mut out = Vec::new();
        for entry in self.data.scan_prefix([ACTIVE]) {
            let (active_key, _) = entry.map_err(|e| self.io(e))?;
            let id: [u8; 16] = active_key[1..].try_into().map_err(|_| self.corrupt("malformed active key"))?;
            let id = JobId::from_bytes(id);
            let bytes = self
                .data
                .get(key(JOB, id))
                .map_err(|e| self.io(e))?
                .ok_or_else(|| self.corrupt("an active job has no record"))?;
            let record = self.job_record(&bytes)?;
            out.push(self.read_job(record)?);
        }
        Ok(out)
    }

    fn get_job(&self, id: JobId) -> Result<Option<StoredJob>, Error> {
        match self.data.get(key(JOB, id)).map_err(|e| self.io(e))? {
            Some(bytes) => Ok(Some(self.read_job(self.job_record(&bytes)?)?)),
            None => Ok(None),
        }
    }

    fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<JobRecord>, Error> {
        let mut out = Vec::new();
        let end = match filter.before {
            Some(before) => key(JOB, before).to_vec(),
            None => vec![JOB + 1],
        };
        for entry in self.data.range(vec![JOB]..end).rev() {
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
        match value {
            Some(value) => self.meta.insert(key.as_bytes(), value).map(|_| ()),
            None => self.meta.remove(key.as_bytes()).map(|_| ()),
        }
        .map_err(|e| self.io(e))?;
        self.flush()
    }

    fn settings(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, Error> {
        let full = format!("{SETTING_PREFIX}{prefix}");
        let mut out = Vec::new();
        for entry in self.meta.scan_prefix(full.as_bytes()) {
            let (key, value) = entry.map_err(|e| self.io(e))?;
            let key = String::from_utf8_lossy(&key[SETTING_PREFIX.len()..]).into_owned();
            out.push((key, value.to_vec()));
        }
        Ok(out)
    }
}

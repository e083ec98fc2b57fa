//! The embedded default store on sled 0.34: one multi-tree transaction per batch.
//!
//! Trees: `meta` (schema version), `jobs` (id -> record), `active` (ids of
//! non-terminal jobs), `specs` (id + chunk number -> spec chunk) and `tasks`
//! (id + task index -> record of a task that left its initial state).

use std::io::Write;
use std::path::{Path, PathBuf};

use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;

use super::codec::{self, decode_job, decode_spec, encode, encode_spec, split_task_key, task_key};
use super::{Batch, Error, JobFilter, Store, StoredJob, SCHEMA_VERSION};
use crate::model::{JobId, JobRecord, TaskRecord};

/// The file that marks a directory as jobcenter's, written once at creation.
const MARKER_FILE: &str = "JOBCENTER";
const SCHEMA_KEY: &[u8] = b"schema_version";

pub struct SledStore {
    path: PathBuf,
    db: sled::Db,
    meta: sled::Tree,
    jobs: sled::Tree,
    active: sled::Tree,
    specs: sled::Tree,
    tasks: sled::Tree,
}

impl SledStore {
    /// Opens (or creates) a data directory. A directory that is not empty
    /// but holds no jobcenter data, a damaged one, or one held by another
    /// process gives an error naming the path; it is never re-initialized.
    pub fn open(path: &Path) -> Result<SledStore, Error> {
        let display = path.display().to_string();
        let unusable = |detail: String| Error::Unusable { path: display.clone(), detail };
        let corrupt = |detail: String| Error::Corrupt { path: display.clone(), detail };
        if path.exists() && !path.is_dir() {
            return Err(unusable("not a directory".into()));
        }
        let marker = path.join(MARKER_FILE);
        let fresh = match std::fs::read_dir(path) {
            Ok(mut entries) => entries.next().is_none(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => return Err(unusable(e.to_string())),
        };
        if !fresh {
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
        } else {
            std::fs::create_dir_all(path).map_err(|e| unusable(e.to_string()))?;
        }

        let db = open_guarded(path, &display)?;
        let open_tree = |name: &str| db.open_tree(name).map_err(|e| corrupt(e.to_string()));
        let store = SledStore {
            meta: open_tree("meta")?,
            jobs: open_tree("jobs")?,
            active: open_tree("active")?,
            specs: open_tree("specs")?,
            tasks: open_tree("tasks")?,
            path: path.to_path_buf(),
            db,
        };
        if fresh {
            store.meta.insert(SCHEMA_KEY, &SCHEMA_VERSION.to_be_bytes()).map_err(|e| unusable(e.to_string()))?;
            store.db.flush().map_err(|e| unusable(e.to_string()))?;
            write_marker(&marker).map_err(|e| unusable(e.to_string()))?;
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
        for entry in self.specs.scan_prefix(id.as_bytes()) {
            let (_, value) = entry.map_err(|e| self.io(e))?;
            chunks.push(value.to_vec());
        }
        decode_spec(&chunks).map_err(|detail| self.corrupt(format!("job {id}: {detail}")))
    }

    fn read_job(&self, record: JobRecord) -> Result<StoredJob, Error> {
        let spec = std::sync::Arc::new(self.read_spec(record.id)?);
        let mut stored = Vec::new();
        for entry in self.tasks.scan_prefix(record.id.as_bytes()) {
            let (key, value) = entry.map_err(|e| self.io(e))?;
            let (_, idx) = split_task_key(&key).ok_or_else(|| self.corrupt("malformed task key"))?;
            let task: TaskRecord = codec::decode(&value, "task record").map_err(|d| self.corrupt(d))?;
            stored.push((idx, task));
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

fn write_marker(marker: &Path) -> std::io::Result<()> {
    let mut file = std::fs::File::create(marker)?;
    writeln!(file, "jobcenter data directory\nschema {SCHEMA_VERSION}")?;
    file.sync_all()
}

/// sled 0.34 can panic on a damaged directory; turn that into an error.
fn open_guarded(path: &Path, display: &str) -> Result<sled::Db, Error> {
    let config = sled::Config::new().path(path).cache_capacity(128 * 1024 * 1024).flush_every_ms(None);
    let previous_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || config.open()));
    std::panic::set_hook(previous_hook);
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
        let new_specs: Vec<(JobId, Vec<(u32, Vec<u8>)>)> =
            batch.new_jobs.iter().map(|(record, spec)| (record.id, encode_spec(spec))).collect();
        let jobs: Vec<(JobId, bool, Vec<u8>)> = batch
            .new_jobs
            .iter()
            .map(|(r, _)| r)
            .chain(batch.jobs.iter())
            .map(|r| (r.id, r.state.is_terminal(), encode(r)))
            .collect();
        let tasks: Vec<([u8; 20], Vec<u8>)> =
            batch.tasks.iter().map(|(job, idx, task)| (task_key(*job, idx.0), encode(task))).collect();
        let result =
            (&self.jobs, &self.active, &self.specs, &self.tasks).transaction(|(jobs_t, active_t, specs_t, tasks_t)| {
                for (id, chunks) in &new_specs {
                    for (number, bytes) in chunks {
                        let mut key = [0u8; 20];
                        key[..16].copy_from_slice(id.as_bytes());
                        key[16..].copy_from_slice(&number.to_be_bytes());
                        specs_t.insert(&key[..], bytes.as_slice())?;
                    }
                }
                for (id, terminal, bytes) in &jobs {
                    jobs_t.insert(&id.as_bytes()[..], bytes.as_slice())?;
                    if *terminal {
                        active_t.remove(&id.as_bytes()[..])?;
                    } else {
                        active_t.insert(&id.as_bytes()[..], &[][..])?;
                    }
                }
                for (key, bytes) in &tasks {
                    tasks_t.insert(&key[..], bytes.as_slice())?;
                }
                Ok::<(), ConflictableTransactionError<()>>(())
            });
        match result {
            Ok(()) => Ok(()),
            Err(TransactionError::Storage(e)) => Err(self.io(e)),
            Err(TransactionError::Abort(())) => Err(Error::Io("transaction aborted".into())),
        }
    }

    fn flush(&self) -> Result<(), Error> {
        self.db.flush().map(|_| ()).map_err(|e| self.io(e))
    }

    fn load_active(&self) -> Result<Vec<StoredJob>, Error> {
        let mut out = Vec::new();
        for entry in self.active.iter() {
            let (key, _) = entry.map_err(|e| self.io(e))?;
            let bytes = self
                .jobs
                .get(&key)
                .map_err(|e| self.io(e))?
                .ok_or_else(|| self.corrupt("an active job has no record"))?;
            let record = self.job_record(&bytes)?;
            out.push(self.read_job(record)?);
        }
        Ok(out)
    }

    fn get_job(&self, id: JobId) -> Result<Option<StoredJob>, Error> {
        match self.jobs.get(id.as_bytes()).map_err(|e| self.io(e))? {
            Some(bytes) => Ok(Some(self.read_job(self.job_record(&bytes)?)?)),
            None => Ok(None),
        }
    }

    fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<JobRecord>, Error> {
        let mut out = Vec::new();
        for entry in self.jobs.iter().rev() {
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
}

//! Durable state behind one trait: jobs, their specs and task records.
//!
//! A `Batch` is written atomically (no reader sees part of it) and becomes
//! durable at the next `flush`; the engine dispatches nothing before that
//! flush has made it durable, and acknowledges nothing before it returns.
//! Two backends: sled in a data directory (the embedded default) and
//! PostgreSQL. Only `sled.rs` names sled, and only `postgres/` names the
//! database driver.

pub mod cluster;
mod codec;
#[cfg(any(test, feature = "testsuite"))]
pub mod conformance;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod journal;
mod memory;
mod postgres;
mod sled;
#[cfg(any(test, feature = "testsuite"))]
pub mod stored_v1;
mod task_group;
pub mod transfer;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use crate::model::{JobId, JobOrigin, JobRecord, JobSpec, JobState, TaskIdx, TaskRecord};

pub use self::memory::MemoryStore;
pub use self::postgres::{PasswordSources, PgStore, ScratchDatabase, ServerAddress, TlsMode};
pub use self::sled::SledStore;

/// Opens the embedded default store in a data directory.
pub fn open_data_dir(path: &std::path::Path) -> Result<Arc<dyn Store>, Error> {
    Ok(Arc::new(SledStore::open(path)?))
}

/// Where a store lives.
#[derive(Clone, Debug)]
pub enum Location {
    /// A sled data directory (the embedded default).
    DataDir(std::path::PathBuf),
    /// A PostgreSQL database.
    Database { url: String, passwords: PasswordSources },
}

impl Location {
    /// Opens the store; the error is one line naming the place and what to do.
    pub fn open(&self) -> Result<Arc<dyn Store>, Error> {
        self.open_keeping(self::sled::KEEP_FREE)
    }

    /// The same, a data directory keeping `keep_free` bytes free on its
    /// disk: a write that would leave less waits, as for a database away.
    pub fn open_keeping(&self, keep_free: u64) -> Result<Arc<dyn Store>, Error> {
        match self {
            Location::DataDir(path) => {
                let store = SledStore::open(path)?;
                store.keep_free(keep_free);
                Ok(Arc::new(store))
            }
            Location::Database { url, passwords } => Ok(Arc::new(PgStore::open(url, passwords)?)),
        }
    }
}

/// The schema version this build reads and writes.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("data directory {path} is locked by another process: stop it, or use another --data-dir")]
    Locked { path: String },
    #[error("data directory {path} is corrupt ({detail}): restore it from a backup, or move it aside to start empty")]
    Corrupt { path: String, detail: String },
    #[error("data directory {path} has schema version {found}, this build reads version {expected}: use a matching jobcenter build")]
    SchemaMismatch { path: String, found: u32, expected: u32 },
    #[error("data directory {path} cannot be used ({detail}): check its path and permissions")]
    Unusable { path: String, detail: String },
    #[error("storage failure: {0}")]
    Io(String),
    #[error("invalid database URL: {0}")]
    BadUrl(String),
    #[error("cannot reach the database at {database} ({detail}): check that PostgreSQL runs there and that the URL is right")]
    Unreachable { database: String, detail: String },
    #[error("the database at {database} refused user {user} ({detail}): check the password (in the URL, --database-password-file, PGPASSWORD or PGPASSFILE)")]
    Refused { database: String, user: String, detail: String },
    #[error("the database at {database} does not exist: create it (createdb {name}), or fix the URL")]
    NoDatabase { database: String, name: String },
    #[error("user {user} may not set up jobcenter's schema in the database at {database} ({detail}): grant it CREATE on the database, or run jobcenter once as the database's owner")]
    NoPrivilege { database: String, user: String, detail: String },
    #[error("the database at {database} has a schema \"jobcenter\" that jobcenter did not make ({detail}): use another database")]
    Foreign { database: String, detail: String },
    #[error("the database at {database} has schema version {found}, this build knows versions up to {expected}: use a jobcenter build of that version or newer")]
    Newer { database: String, found: u32, expected: u32 },
    #[error("the database at {database} is unavailable ({detail})")]
    Unavailable { database: String, detail: String },
    #[error("the database at {database} refused a request ({detail})")]
    Database { database: String, detail: String },
    #[error("this admin instance ({instance}) was deactivated by the cluster: it stops acting and registers again")]
    Fenced { instance: String },
    #[error("the disk holding data directory {path} has {free} bytes free, and a write needs {needed} (--min-free-space keeps {keep} free): writes wait until there is room")]
    NoRoom { path: String, free: u64, needed: u64, keep: u64 },
}

impl Error {
    /// The store is away for a while (a database restarting, a broken
    /// connection): the same write may be tried again later. Anything else
    /// is fail-stop.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Unavailable { .. } | Error::NoRoom { .. })
    }
}

/// Every change of one group commit, written atomically.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// Jobs created by this batch, with their whole spec.
    pub new_jobs: Vec<(JobRecord, Arc<JobSpec>)>,
    /// Job records that changed.
    pub jobs: Vec<JobRecord>,
    /// Task records that changed; a later entry for the same task wins.
    pub tasks: Vec<(JobId, TaskIdx, TaskRecord)>,
    /// Settings set (or, with `None`, removed); a later entry for a key wins.
    pub settings: Vec<(String, Option<Vec<u8>>)>,
    /// Jobs this instance stops leading (several instances on one store):
    /// once written, another instance may claim them.
    pub released: Vec<JobId>,
    /// Ended jobs removed (retention), with their spec and task records. A
    /// job that is not ended in the store by then is left alone.
    pub removed: Vec<JobId>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.new_jobs.is_empty()
            && self.jobs.is_empty()
            && self.tasks.is_empty()
            && self.settings.is_empty()
            && self.released.is_empty()
            && self.removed.is_empty()
    }

    /// The batches as one, in order: the first one's lists, grown once to
    /// hold the others', rather than doubling as each is added.
    pub fn concat(batches: impl IntoIterator<Item = Batch>) -> Batch {
        let mut batches = batches.into_iter();
        let Some(mut all) = batches.next() else { return Batch::default() };
        let rest: Vec<Batch> = batches.collect();
        all.new_jobs.reserve(rest.iter().map(|b| b.new_jobs.len()).sum());
        all.jobs.reserve(rest.iter().map(|b| b.jobs.len()).sum());
        all.tasks.reserve(rest.iter().map(|b| b.tasks.len()).sum());
        all.settings.reserve(rest.iter().map(|b| b.settings.len()).sum());
        all.released.reserve(rest.iter().map(|b| b.released.len()).sum());
        all.removed.reserve(rest.iter().map(|b| b.removed.len()).sum());
        for batch in rest {
            all.append(batch);
        }
        all
    }

    pub fn append(&mut self, other: Batch) {
        self.new_jobs.extend(other.new_jobs);
        self.jobs.extend(other.jobs);
        self.tasks.extend(other.tasks);
        self.settings.extend(other.settings);
        self.released.extend(other.released);
        self.removed.extend(other.removed);
    }
}

/// A job as stored: its record, spec and the record of every task.
#[derive(Clone, Debug)]
pub struct StoredJob {
    pub record: JobRecord,
    pub spec: Arc<JobSpec>,
    pub tasks: Vec<TaskRecord>,
}

impl StoredJob {
    /// Fills in the tasks that have no stored record with their initial record.
    pub fn assemble(record: JobRecord, spec: Arc<JobSpec>, stored: Vec<(u32, TaskRecord)>) -> StoredJob {
        let mut tasks: Vec<Option<TaskRecord>> = vec![None; spec.len()];
        for (idx, task) in stored {
            if let Some(slot) = tasks.get_mut(idx as usize) {
                *slot = Some(task);
            }
        }
        let tasks = tasks
            .into_iter()
            .enumerate()
            .map(|(idx, task)| {
                task.unwrap_or_else(|| TaskRecord::initial(spec.dag.in_degree(idx as u32) > 0, record.created_at))
            })
            .collect();
        StoredJob { record, spec, tasks }
    }
}

/// Which jobs `list_jobs` returns, newest first.
#[derive(Clone, Debug, Default)]
pub struct JobFilter {
    pub state: Option<JobState>,
    pub name: Option<String>,
    /// Part of the name.
    pub name_contains: Option<String>,
    /// Submitted by a user (`Some(false)`) or made by the scheduler (`Some(true)`).
    pub scheduled: Option<bool>,
    /// Only the periodic recovery check's jobs (`Some(true)`), or none of them.
    pub recovery_checks: Option<bool>,
    /// Only jobs created before this one (ids grow with time): the next page.
    pub before: Option<JobId>,
    pub fingerprint: Option<[u8; 32]>,
    pub limit: Option<usize>,
}

impl JobFilter {
    pub fn matches(&self, job: &JobRecord) -> bool {
        self.state.is_none_or(|s| s == job.state)
            && self.name.as_ref().is_none_or(|n| *n == job.name)
            && self.name_contains.as_ref().is_none_or(|n| job.name.contains(n.as_str()))
            && self.scheduled.is_none_or(|s| s == matches!(job.origin, JobOrigin::Scheduler { .. }))
            && self.recovery_checks.is_none_or(|r| r == crate::retention::is_recovery_check(job))
            && self.before.is_none_or(|b| job.id.0 < b.0)
            && self.fingerprint.is_none_or(|f| f == job.fingerprint)
    }
}

pub trait Store: Send + Sync + 'static {
    /// Applies a batch atomically; it is durable after the next `flush`.
    fn write(&self, batch: &Batch) -> Result<(), Error>;
    /// Makes every write so far durable.
    fn flush(&self) -> Result<(), Error>;
    /// A flush that calls `durable` as soon as the writes are durable, and
    /// returns once reads see them too: a store that makes them readable
    /// after they are durable calls it in between, so that what waits only
    /// for durability (work orders) goes out first; from just before the
    /// call, it holds every read off until the read sees the writes.
    fn flush_then(&self, durable: &mut dyn FnMut()) -> Result<(), Error> {
        self.flush()?;
        durable();
        Ok(())
    }
    /// Every job that is not terminal, with all its tasks (on a store that
    /// several instances share, those this instance leads).
    fn load_active(&self) -> Result<Vec<StoredJob>, Error>;
    fn get_job(&self, id: JobId) -> Result<Option<StoredJob>, Error>;
    /// Job records matching the filter, newest first.
    fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<JobRecord>, Error>;
    /// Sets (or with `None` removes) a setting, such as a job type's policy;
    /// durable when it returns.
    fn put_setting(&self, key: &str, value: Option<&[u8]>) -> Result<(), Error>;
    /// Every setting whose key starts with `prefix`, in key order.
    fn settings(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, Error>;
    /// Every setting whose key starts with any of `prefixes`, in key order,
    /// read at once (a database reads them in one statement).
    fn settings_any(&self, prefixes: &[&str]) -> Result<Vec<(String, Vec<u8>)>, Error> {
        let mut all = std::collections::BTreeMap::new();
        for prefix in prefixes {
            all.extend(self.settings(prefix)?);
        }
        Ok(all.into_iter().collect())
    }
    /// The cluster side of a store several admin instances share.
    fn cluster(&self) -> Option<&dyn cluster::Cluster> {
        None
    }
    /// Gives back the space the store's history holds, if that is due now
    /// (a sled directory compacts its log); `None` when nothing was done.
    fn reclaim(&self) -> Result<Option<Reclaimed>, Error> {
        Ok(None)
    }
}

/// What a `reclaim` did: the store's size on disk before and after.
#[derive(Clone, Debug)]
pub struct Reclaimed {
    pub before_bytes: u64,
    pub after_bytes: u64,
    pub took: std::time::Duration,
}

//! An in-memory store for tests and benchmarks, with the same durability
//! contract as the real ones: `crash` forgets every write since the last flush.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use super::{Batch, Error, JobFilter, Store, StoredJob};
use crate::model::{JobId, JobRecord, JobSpec, TaskRecord};

#[derive(Clone, Default)]
struct Tables {
    jobs: BTreeMap<JobId, JobRecord>,
    specs: HashMap<JobId, Arc<JobSpec>>,
    tasks: HashMap<JobId, BTreeMap<u32, TaskRecord>>,
    settings: BTreeMap<String, Vec<u8>>,
}

impl Tables {
    fn apply(&mut self, batch: &Batch) {
        for id in &batch.removed {
            if self.jobs.get(id).is_some_and(|r| r.state.is_terminal()) {
                self.jobs.remove(id);
                self.specs.remove(id);
                self.tasks.remove(id);
            }
        }
        for (record, spec) in &batch.new_jobs {
            self.jobs.insert(record.id, record.clone());
            self.specs.insert(record.id, spec.clone());
        }
        for record in &batch.jobs {
            self.jobs.insert(record.id, record.clone());
        }
        for (job, idx, task) in &batch.tasks {
            self.tasks.entry(*job).or_default().insert(idx.0, task.clone());
        }
        for (key, value) in &batch.settings {
            match value {
                Some(value) => self.settings.insert(key.clone(), value.clone()),
                None => self.settings.remove(key),
            };
        }
    }

    fn stored_job(&self, id: JobId) -> Option<StoredJob> {
        let record = self.jobs.get(&id)?.clone();
        let spec = self.specs.get(&id)?.clone();
        let stored = self.tasks.get(&id).map(|t| t.iter().map(|(i, r)| (*i, r.clone())).collect()).unwrap_or_default();
        Some(StoredJob::assemble(record, spec, stored))
    }
}

#[derive(Default)]
struct Inner {
    visible: Tables,
    durable: Tables,
    unflushed: Vec<Batch>,
}

#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// Forgets everything written since the last flush, as a crash would.
    pub fn crash(&self) {
        let mut inner = self.inner.lock().expect("memory store lock");
        inner.unflushed.clear();
        inner.visible = inner.durable.clone();
    }
}

impl Store for MemoryStore {
    fn write(&self, batch: &Batch) -> Result<(), Error> {
        let mut inner = self.inner.lock().expect("memory store lock");
        inner.visible.apply(batch);
        inner.unflushed.push(batch.clone());
        Ok(())
    }

    fn flush(&self) -> Result<(), Error> {
        let mut inner = self.inner.lock().expect("memory store lock");
        let unflushed = std::mem::take(&mut inner.unflushed);
        for batch in &unflushed {
            inner.durable.apply(batch);
        }
        Ok(())
    }

    fn load_active(&self) -> Result<Vec<StoredJob>, Error> {
        let inner = self.inner.lock().expect("memory store lock");
        let tables = &inner.visible;
        Ok(tables.jobs.values().filter(|j| !j.state.is_terminal()).filter_map(|j| tables.stored_job(j.id)).collect())
    }

    fn get_job(&self, id: JobId) -> Result<Option<StoredJob>, Error> {
        Ok(self.inner.lock().expect("memory store lock").visible.stored_job(id))
    }

    fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<JobRecord>, Error> {
        let inner = self.inner.lock().expect("memory store lock");
        Ok(inner
            .visible
            .jobs
            .values()
            .rev()
            .filter(|j| filter.matches(j))
            .take(filter.limit.unwrap_or(usize::MAX))
            .cloned()
            .collect())
    }

    fn put_setting(&self, key: &str, value: Option<&[u8]>) -> Result<(), Error> {
        let mut guard = self.inner.lock().expect("memory store lock");
        let inner = &mut *guard;
        for tables in [&mut inner.visible, &mut inner.durable] {
            match value {
                Some(value) => tables.settings.insert(key.to_string(), value.to_vec()),
                None => tables.settings.remove(key),
            };
        }
        Ok(())
    }

    fn settings(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, Error> {
        let inner = self.inner.lock().expect("memory store lock");
        Ok(inner
            .visible
            .settings
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}

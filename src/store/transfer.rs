//! A store's whole content as JSON lines, and back: every job (its record,
//! its spec, its task records) and every setting (policies, descriptors, the
//! activity log, run histories). `jobcenter export` and `jobcenter import`
//! move data between a sled directory and a database this way.
//!
//! A job is several lines (its record, its spec in chunks, its task records
//! in chunks, an end), so that a job of a million tasks never makes one huge
//! line. An import writes each job as one batch: whole or not at all.
//! Importing what a store already holds is a no-op; a job that exists with a
//! different record refuses the whole import before anything is written.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Batch, Error, JobFilter, Store, StoredJob};
use crate::dag::Dag;
use crate::model::{hex, JobId, JobRecord, JobSpec, TaskRecord, TaskSpec};

/// The first line's format name and the version this build writes and reads.
const FORMAT: &str = "jobcenter-export";
const VERSION: u32 = 1;
/// Tasks or records per line.
const PER_LINE: usize = 10_000;

#[derive(Serialize, Deserialize)]
struct ExportTask {
    spec: TaskSpec,
    parents: Vec<u32>,
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Line {
    Header { format: String, version: u32 },
    Job { record: JobRecord },
    Tasks { job: JobId, from: u32, tasks: Vec<ExportTask> },
    Records { job: JobId, records: Vec<(u32, TaskRecord)> },
    End { job: JobId },
    Setting { key: String, value: String },
}

/// What an export or an import moved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub jobs: usize,
    pub tasks: usize,
    pub settings: usize,
    /// Jobs an import found already there, the same: left as they were.
    pub unchanged: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error(transparent)]
    Store(#[from] Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("line {line}: {detail}")]
    Format { line: usize, detail: String },
    #[error("job {job} is already in the destination with another record ({detail}): nothing was imported")]
    Conflict { job: JobId, detail: String },
}

fn write_line(out: &mut dyn Write, line: &Line) -> Result<(), TransferError> {
    serde_json::to_writer(&mut *out, line).map_err(std::io::Error::from)?;
    out.write_all(b"\n")?;
    Ok(())
}

/// Writes every job and setting of `store` to `out`.
pub fn export(store: &dyn Store, out: &mut dyn Write) -> Result<Summary, TransferError> {
    let mut writer = ExportWriter::start(out)?;
    let mut records = store.list_jobs(&JobFilter::default())?;
    records.reverse();
    for record in records {
        if let Some(job) = store.get_job(record.id)? {
            writer.job(&job)?;
        }
    }
    writer.finish(store.settings("")?)
}

/// Writes an export job by job: the header first, each job whole, the
/// settings last. `jobcenter backup` builds its copy with it.
pub struct ExportWriter<'a> {
    out: &'a mut dyn Write,
    summary: Summary,
}

impl<'a> ExportWriter<'a> {
    pub fn start(out: &'a mut dyn Write) -> Result<ExportWriter<'a>, TransferError> {
        write_line(out, &Line::Header { format: FORMAT.into(), version: VERSION })?;
        Ok(ExportWriter { out, summary: Summary::default() })
    }

    pub fn job(&mut self, job: &StoredJob) -> Result<(), TransferError> {
        let out = &mut *self.out;
        let id = job.record.id;
        write_line(out, &Line::Job { record: job.record.clone() })?;
        for from in (0..job.spec.len()).step_by(PER_LINE) {
            let tasks = (from..(from + PER_LINE).min(job.spec.len()))
                .map(|i| ExportTask {
                    spec: job.spec.tasks[i].clone(),
                    parents: job.spec.dag.parents(i as u32).to_vec(),
                })
                .collect();
            write_line(out, &Line::Tasks { job: id, from: from as u32, tasks })?;
        }
        // Only records that left their initial state, as the stores keep them.
        let changed: Vec<(u32, TaskRecord)> = job
            .tasks
            .iter()
            .enumerate()
            .filter(|(i, t)| **t != TaskRecord::initial(job.spec.dag.in_degree(*i as u32) > 0, job.record.created_at))
            .map(|(i, t)| (i as u32, t.clone()))
            .collect();
        for chunk in changed.chunks(PER_LINE) {
            write_line(out, &Line::Records { job: id, records: chunk.to_vec() })?;
        }
        write_line(out, &Line::End { job: id })?;
        self.summary.jobs += 1;
        self.summary.tasks += job.spec.len();
        Ok(())
    }

    /// Writes the settings and ends the export.
    pub fn finish(self, settings: Vec<(String, Vec<u8>)>) -> Result<Summary, TransferError> {
        let mut summary = self.summary;
        for (key, value) in settings {
            write_line(self.out, &Line::Setting { key, value: hex(&value) })?;
            summary.settings += 1;
        }
        self.out.flush()?;
        Ok(summary)
    }
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

fn lines(path: &Path) -> Result<impl Iterator<Item = (usize, std::io::Result<String>)>, TransferError> {
    let file = std::fs::File::open(path)?;
    Ok(std::io::BufReader::with_capacity(1 << 20, file).lines().enumerate().map(|(i, l)| (i + 1, l)))
}

fn parse(number: usize, text: &str) -> Result<Line, TransferError> {
    serde_json::from_str(text).map_err(|e| TransferError::Format { line: number, detail: e.to_string() })
}

/// A job being read back.
struct Incoming {
    record: JobRecord,
    tasks: Vec<TaskSpec>,
    parents: Vec<Vec<u32>>,
    records: Vec<(u32, TaskRecord)>,
}

/// Reads an export into `store`. The whole file is checked first: a job
/// the store holds with another record refuses the import, and nothing is
/// written; a job it holds the same is left alone.
pub fn import(store: &dyn Store, path: &Path) -> Result<Summary, TransferError> {
    let mut summary = Summary::default();
    let mut skip: HashMap<JobId, bool> = HashMap::new();
    let mut first = true;
    for (number, text) in lines(path)? {
        let text = text?;
        if text.trim().is_empty() {
            continue;
        }
        if first {
            first = false;
            match parse(number, &text)? {
                Line::Header { format, version } if format == FORMAT && version == VERSION => continue,
                Line::Header { format, version } => {
                    return Err(TransferError::Format {
                        line: number,
                        detail: format!("{format} version {version}: this build reads {FORMAT} version {VERSION}"),
                    })
                }
                _ => {
                    return Err(TransferError::Format {
                        line: number,
                        detail: format!("not a jobcenter export: the first line must say {{\"kind\":\"header\",\"format\":\"{FORMAT}\"}}"),
                    })
                }
            }
        }
        if !text.starts_with(r#"{"kind":"job""#) {
            continue;
        }
        let Line::Job { record } = parse(number, &text)? else { continue };
        let same = match store.get_job(record.id)? {
            None => false,
            Some(existing) if existing.record == record => true,
            Some(existing) => {
                return Err(TransferError::Conflict {
                    job: record.id,
                    detail: format!("it is {} there and {} in the file", existing.record.state, record.state),
                })
            }
        };
        skip.insert(record.id, same);
    }
    if first {
        return Err(TransferError::Format { line: 1, detail: "the file is empty".into() });
    }

    let mut current: Option<Incoming> = None;
    let mut settings = Vec::new();
    for (number, text) in lines(path)?.skip(1) {
        let text = text?;
        if text.trim().is_empty() {
            continue;
        }
        let format_error = |detail: String| TransferError::Format { line: number, detail };
        match parse(number, &text)? {
            Line::Header { .. } => return Err(format_error("a second header".into())),
            Line::Job { record } => {
                if current.is_some() {
                    return Err(format_error("a job starts before the previous one ended".into()));
                }
                current = Some(Incoming { record, tasks: Vec::new(), parents: Vec::new(), records: Vec::new() });
            }
            Line::Tasks { job, from, tasks } => {
                let incoming = current
                    .as_mut()
                    .filter(|c| c.record.id == job)
                    .ok_or_else(|| format_error(format!("tasks of job {job} outside that job's lines")))?;
                if from as usize != incoming.tasks.len() {
                    return Err(format_error(format!("tasks from #{from}, expected #{}", incoming.tasks.len())));
                }
                for task in tasks {
                    incoming.tasks.push(task.spec);
                    incoming.parents.push(task.parents);
                }
            }
            Line::Records { job, records } => {
                let incoming = current
                    .as_mut()
                    .filter(|c| c.record.id == job)
                    .ok_or_else(|| format_error(format!("task records of job {job} outside that job's lines")))?;
                incoming.records.extend(records);
            }
            Line::End { job } => {
                let incoming = current
                    .take()
                    .filter(|c| c.record.id == job)
                    .ok_or_else(|| format_error(format!("the end of job {job} outside that job's lines")))?;
                if skip.get(&job).copied().unwrap_or(false) {
                    summary.unchanged += 1;
                    continue;
                }
                summary.tasks += incoming.tasks.len();
                write_job(store, incoming).map_err(|e| match e {
                    TransferError::Format { detail, .. } => format_error(detail),
                    other => other,
                })?;
                summary.jobs += 1;
            }
            Line::Setting { key, value } => {
                let value = unhex(&value).ok_or_else(|| format_error(format!("setting {key:?} is not hex")))?;
                settings.push((key, Some(value)));
            }
        }
    }
    if current.is_some() {
        return Err(TransferError::Format { line: 0, detail: "the file ends inside a job".into() });
    }
    summary.settings = settings.len();
    if !settings.is_empty() {
        store.write(&Batch { settings, ..Batch::default() })?;
        store.flush()?;
    }
    Ok(summary)
}

fn write_job(store: &dyn Store, incoming: Incoming) -> Result<(), TransferError> {
    let Incoming { record, tasks, parents, records } = incoming;
    let n = tasks.len() as u32;
    let bad = |detail: String| TransferError::Format { line: 0, detail: format!("job {}: {detail}", record.id) };
    if n != record.n_tasks {
        return Err(bad(format!("{n} tasks, its record says {}", record.n_tasks)));
    }
    if parents.iter().flatten().any(|&p| p >= n) {
        return Err(bad("a parent outside the job".into()));
    }
    if records.iter().any(|(i, _)| *i >= n) {
        return Err(bad("a task record outside the job".into()));
    }
    let dag = Dag::from_parents(&parents);
    if dag.check_acyclic().is_err() {
        return Err(bad("its tasks depend on each other in a cycle".into()));
    }
    let mut job_types: BTreeMap<String, Arc<str>> = BTreeMap::new();
    let tasks = tasks
        .into_iter()
        .map(|mut task| {
            task.job_type = job_types.entry(task.job_type.to_string()).or_insert(task.job_type).clone();
            task
        })
        .collect();
    let spec = Arc::new(JobSpec { name: record.name.clone(), tasks, dag, fingerprint: record.fingerprint });
    let id = record.id;
    let batch = Batch {
        new_jobs: vec![(record, spec)],
        tasks: records.into_iter().map(|(i, r)| (id, crate::model::TaskIdx(i), r)).collect(),
        ..Batch::default()
    };
    store.write(&batch)?;
    store.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Timestamp;
    use crate::model::{End, JobState, Phase, TaskIdx};
    use crate::store::conformance::{record, spec};
    use crate::store::MemoryStore;

    fn filled() -> MemoryStore {
        let store = MemoryStore::new();
        let spec = spec(25_000);
        let job = record(&spec, JobState::Running);
        let mut task = TaskRecord::initial(false, Timestamp(1_000));
        task.phase = Phase::Ended { end: End::Succeeded, at: Timestamp(1_500) };
        task.attempt = 1;
        let batch = Batch {
            new_jobs: vec![(job.clone(), spec)],
            tasks: vec![(job.id, TaskIdx(0), task)],
            settings: vec![("policy/noop".into(), Some(b"{}".to_vec()))],
            ..Batch::default()
        };
        store.write(&batch).unwrap();
        store.flush().unwrap();
        let small = crate::store::conformance::spec(2);
        let done = record(&small, JobState::Succeeded);
        store.write(&Batch { new_jobs: vec![(done, small)], ..Batch::default() }).unwrap();
        store.flush().unwrap();
        store
    }

    #[test]
    fn a_store_round_trips_and_a_second_import_changes_nothing() {
        let source = filled();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("export.jsonl");
        let mut file = std::fs::File::create(&path).unwrap();
        let exported = export(&source, &mut file).unwrap();
        assert_eq!((exported.jobs, exported.tasks, exported.settings), (2, 25_002, 1));
        let destination = MemoryStore::new();
        let imported = import(&destination, &path).unwrap();
        assert_eq!((imported.jobs, imported.tasks, imported.settings, imported.unchanged), (2, 25_002, 1, 0));
        for record in source.list_jobs(&JobFilter::default()).unwrap() {
            let (a, b) =
                (source.get_job(record.id).unwrap().unwrap(), destination.get_job(record.id).unwrap().unwrap());
            assert_eq!((a.record, &*a.spec, a.tasks), (b.record, &*b.spec, b.tasks));
        }
        assert_eq!(destination.settings("").unwrap(), source.settings("").unwrap());
        let again = import(&destination, &path).unwrap();
        assert_eq!((again.jobs, again.unchanged), (0, 2));
        assert_eq!(destination.list_jobs(&JobFilter::default()).unwrap().len(), 2, "never a duplicate");
    }

    #[test]
    fn a_conflicting_job_refuses_the_whole_import() {
        let source = filled();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("export.jsonl");
        export(&source, &mut std::fs::File::create(&path).unwrap()).unwrap();
        let destination = MemoryStore::new();
        let newest = source.list_jobs(&JobFilter::default()).unwrap()[0].clone();
        let mut changed = source.get_job(newest.id).unwrap().unwrap();
        changed.record.state = JobState::Failed;
        destination.write(&Batch { new_jobs: vec![(changed.record, changed.spec)], ..Batch::default() }).unwrap();
        destination.flush().unwrap();
        let error = import(&destination, &path).unwrap_err();
        assert!(matches!(error, TransferError::Conflict { job, .. } if job == newest.id), "{error}");
        assert_eq!(destination.list_jobs(&JobFilter::default()).unwrap().len(), 1, "nothing was imported");
        assert!(destination.settings("").unwrap().is_empty());
    }

    #[test]
    fn a_damaged_file_is_refused_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.jsonl");
        std::fs::write(&path, "{\"kind\":\"job\"}\n").unwrap();
        let error = import(&MemoryStore::new(), &path).unwrap_err().to_string();
        assert!(error.starts_with("line 1: "), "{error}");
        std::fs::write(&path, format!("{{\"kind\":\"header\",\"format\":\"{FORMAT}\",\"version\":9}}\n")).unwrap();
        let error = import(&MemoryStore::new(), &path).unwrap_err().to_string();
        assert!(error.contains("version 9"), "{error}");
    }
}

//! Binary encoding of records and specs for the key-value backends, and their keys.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::Error;
use crate::dag::Dag;
use crate::model::{JobId, JobRecord, JobSpec, TaskSpec};

/// A spec is stored in chunks of about this many bytes, so that a job of a
/// million tasks is a few dozen values rather than one huge one.
const SPEC_CHUNK_BYTES: usize = 1 << 20;

#[derive(Serialize, Deserialize)]
struct StoredTaskSpec {
    spec: TaskSpec,
    parents: Vec<u32>,
}

/// A `StoredTaskSpec` as it is written: the same bytes, borrowed from the
/// job's spec rather than copied out of it.
#[derive(Serialize)]
struct StoredTaskSpecRef<'a> {
    spec: &'a TaskSpec,
    parents: &'a [u32],
}

#[derive(Serialize, Deserialize)]
struct SpecHeader {
    name: String,
    n_tasks: u32,
    n_chunks: u32,
    fingerprint: [u8; 32],
}

pub(super) fn encode<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    postcard::to_allocvec(value).expect("postcard encodes plain data")
}

pub(super) fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8], what: &str) -> Result<T, String> {
    postcard::from_bytes(bytes).map_err(|e| format!("undecodable {what}: {e}"))
}

pub(super) fn split_task_key(key: &[u8]) -> Option<(JobId, u32)> {
    let job: [u8; 16] = key.get(..16)?.try_into().ok()?;
    let idx: [u8; 4] = key.get(16..20)?.try_into().ok()?;
    Some((JobId::from_bytes(job), u32::from_be_bytes(idx)))
}

/// The spec as (key suffix, value) pairs: chunk `u32::MAX` is the header.
pub(super) fn encode_spec(spec: &JobSpec) -> Vec<(u32, Vec<u8>)> {
    let mut chunks = Vec::new();
    let mut current: Vec<StoredTaskSpecRef<'_>> = Vec::new();
    let mut current_bytes = 0usize;
    let flush = |current: &mut Vec<StoredTaskSpecRef<'_>>, chunks: &mut Vec<(u32, Vec<u8>)>| {
        let number = chunks.len() as u32;
        chunks.push((number, encode(current)));
        current.clear();
    };
    for (idx, task) in spec.tasks.iter().enumerate() {
        current_bytes += task.parameters.len() + task.id.len() + 16;
        current.push(StoredTaskSpecRef { spec: task, parents: spec.dag.parents(idx as u32) });
        if current_bytes >= SPEC_CHUNK_BYTES {
            flush(&mut current, &mut chunks);
            current_bytes = 0;
        }
    }
    if !current.is_empty() {
        flush(&mut current, &mut chunks);
    }
    let header = SpecHeader {
        name: spec.name.clone(),
        n_tasks: spec.len() as u32,
        n_chunks: chunks.len() as u32,
        fingerprint: spec.fingerprint,
    };
    chunks.push((u32::MAX, encode(&header)));
    chunks
}

/// Rebuilds a spec from its chunks in key order (header last).
pub(super) fn decode_spec(chunks: &[Vec<u8>]) -> Result<JobSpec, String> {
    let (header_bytes, bodies) = chunks.split_last().ok_or("spec has no chunks")?;
    let header: SpecHeader = decode(header_bytes, "spec header")?;
    if bodies.len() != header.n_chunks as usize {
        return Err(format!("spec has {} chunks, its header says {}", bodies.len(), header.n_chunks));
    }
    // Every task takes at least a byte of its chunk: a damaged header that
    // claims more tasks sizes nothing beyond what the chunks hold.
    let capacity = (header.n_tasks as usize).min(bodies.iter().map(Vec::len).sum());
    let mut tasks = Vec::with_capacity(capacity);
    let mut parent_lists = Vec::with_capacity(capacity);
    let mut job_types: Vec<Arc<str>> = Vec::new();
    for body in bodies {
        let stored: Vec<StoredTaskSpec> = decode(body, "spec chunk")?;
        for mut entry in stored {
            match job_types.iter().find(|t| t.as_ref() == entry.spec.job_type.as_ref()) {
                Some(shared) => entry.spec.job_type = shared.clone(),
                None => job_types.push(entry.spec.job_type.clone()),
            }
            tasks.push(entry.spec);
            parent_lists.push(entry.parents);
        }
    }
    if tasks.len() != header.n_tasks as usize {
        return Err(format!("spec has {} tasks, its header says {}", tasks.len(), header.n_tasks));
    }
    let n = tasks.len() as u32;
    if parent_lists.iter().flatten().any(|&p| p >= n) {
        return Err("spec names a parent outside the job".into());
    }
    let dag = Dag::from_parents(&parent_lists);
    Ok(JobSpec { name: header.name, tasks, dag, fingerprint: header.fingerprint })
}

pub(super) fn decode_job(bytes: &[u8]) -> Result<JobRecord, Error> {
    decode(bytes, "job record").map_err(Error::Io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_spec_borrowed_is_written_as_one_owned() {
        let spec = crate::jobfile::parse(
            br#"{"name": "x", "tasks": [{"id": "a", "job_type": "noop", "parameters": {"k": 1}, "labels": {"server": "s:8080"}},
                {"id": "b", "job_type": "vacuum", "depends_on": ["a"], "priority": "high", "retry_limit": 2}]}"#,
            crate::jobfile::Format::Json,
            "x",
            &Default::default(),
        )
        .unwrap();
        for (idx, task) in spec.tasks.iter().enumerate() {
            let parents = spec.dag.parents(idx as u32);
            let owned = StoredTaskSpec { spec: task.clone(), parents: parents.to_vec() };
            assert_eq!(encode(&StoredTaskSpecRef { spec: task, parents }), encode(&owned));
        }
        assert_eq!(decode_spec(&encode_spec(&spec).into_iter().map(|(_, v)| v).collect::<Vec<_>>()).unwrap(), spec);
    }

    #[test]
    fn a_header_claiming_more_tasks_than_its_chunks_hold_is_refused_without_allocating_for_them() {
        let header = SpecHeader { name: "x".into(), n_tasks: u32::MAX, n_chunks: 1, fingerprint: [0; 32] };
        let chunks = vec![encode(&Vec::<StoredTaskSpec>::new()), encode(&header)];
        assert_eq!(decode_spec(&chunks).unwrap_err(), "spec has 0 tasks, its header says 4294967295");
    }
}

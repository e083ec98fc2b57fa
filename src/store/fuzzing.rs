//! The stored forms as the fuzz targets reach them (feature `fuzzing`,
//! hidden from the documentation): the codecs of records, specs and task
//! groups, the task groups' splice, and the journal's entries, frames and
//! file, each the very function the stores use.

use std::collections::BTreeMap;

use serde::Serialize;

use super::journal::{self, EntryWriter};
use super::task_group::{self, Old};
use super::{codec, Error};
use crate::model::{JobId, JobRecord, JobSpec, TaskRecord};

/// The bytes a store keeps for a record, as postcard encodes it.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    codec::encode(value)
}

/// A task record as the PostgreSQL store reads one.
pub fn decode_task_record(bytes: &[u8]) -> Result<TaskRecord, String> {
    codec::decode(bytes, "task record")
}

/// A job record as both stores read one.
pub fn decode_job_record(bytes: &[u8]) -> Result<JobRecord, Error> {
    codec::decode_job(bytes)
}

/// A task group as the sled store reads one: (offset in the group, record).
pub fn decode_task_group(bytes: &[u8]) -> Result<Vec<(u8, TaskRecord)>, String> {
    codec::decode(bytes, "task records")
}

/// A spec as its stored chunks, header last.
pub fn encode_spec(spec: &JobSpec) -> Vec<(u32, Vec<u8>)> {
    codec::encode_spec(spec)
}

/// A spec read back from its chunks in key order (header last).
pub fn decode_spec(chunks: &[Vec<u8>]) -> Result<JobSpec, String> {
    codec::decode_spec(chunks)
}

/// The job and task index a task key names.
pub fn split_task_key(key: &[u8]) -> Option<(JobId, u32)> {
    codec::split_task_key(key)
}

/// Writes a group as the sled store does: first `changed` over `old` (its
/// records in offset order, given decoded), then `again` over the layout
/// the first write left. Returns the bytes of both writes.
pub fn splice_twice(
    old: &[(u8, TaskRecord)],
    changed: &BTreeMap<u8, TaskRecord>,
    again: &BTreeMap<u8, TaskRecord>,
) -> (Vec<u8>, Vec<u8>) {
    let old: Vec<(u8, Old<'_>)> = old.iter().map(|(at, task)| (*at, Old::Record(task))).collect();
    let first = task_group::encode(&old, &changed.iter().map(|(at, task)| (*at, task)).collect());
    let second = task_group::encode(&first.records(), &again.iter().map(|(at, task)| (*at, task)).collect());
    (first.bytes, second.bytes)
}

/// One journal entry: its number, its tree (0 meta, 1 data), and each key
/// with its new value, `None` when removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalEntry {
    pub seq: u64,
    pub tree: u8,
    pub ops: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

/// A frame's payload read back into its entries, as replay reads it.
pub fn decode_journal_payload(payload: &[u8]) -> Result<Vec<JournalEntry>, String> {
    let entries = journal::decode_payload(payload)?;
    Ok(entries.into_iter().map(|e| JournalEntry { seq: e.seq, tree: e.tree as u8, ops: e.ops }).collect())
}

/// Entries encoded as a frame's payload, as the sled store writes them.
/// Trees other than 0 (meta) are written as 1 (data).
pub fn encode_journal_payload(entries: &[JournalEntry]) -> Vec<u8> {
    let mut payload = Vec::new();
    for entry in entries {
        let mut writer = EntryWriter::default();
        for (key, value) in &entry.ops {
            match value {
                Some(value) => writer.insert(key, value),
                None => writer.remove(key),
            }
        }
        let tree = if entry.tree == 0 { journal::Tree::Meta } else { journal::Tree::Data };
        writer.finish_into(entry.seq, tree, &mut payload);
    }
    payload
}

/// A journal file's contents as opening it reads them: the epoch of its
/// newest whole header, its frames' payloads, and where the next frame goes.
pub fn read_journal(bytes: &[u8]) -> Option<(u64, Vec<Vec<u8>>, u64)> {
    journal::read(bytes)
        .map(|(epoch, payloads, next)| (epoch, payloads.into_iter().map(<[u8]>::to_vec).collect(), next))
}

/// The bytes of a journal file of `epoch` holding `payloads` as frames,
/// as creating it and appending them writes them.
pub fn journal_file(epoch: u64, payloads: &[Vec<u8>]) -> Vec<u8> {
    let (at, slot) = journal::header(epoch);
    let mut file = vec![0u8; journal::BLOCK as usize];
    file[at as usize..at as usize + slot.len()].copy_from_slice(&slot);
    for payload in payloads {
        file.extend(journal::encode_frame(epoch, payload));
    }
    file
}

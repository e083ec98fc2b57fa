//! The store codec target: the stored forms read back from any bytes, as
//! the stores read them. The first byte of an input picks the form (its
//! value modulo 8); the rest is the stored bytes:
//!
//! 0. a task record; 1. a job record; 2. a task group: each read back must
//!    encode to bytes that read back to the same record, which encodes to
//!    the same bytes again.
//! 3. a task group written over: three groups (each a 2-byte length, then
//!    the bytes), the first the stored group, spliced with the second and
//!    then the third as the sled store writes them; each write must give
//!    the bytes of encoding the merged group whole.
//! 4. a spec in chunks (each a 2-byte length, then the bytes; the header
//!    last): read back, it must encode to chunks that read back the same.
//! 5. a task key: the job and index it names are the bytes it holds.
//! 6. a journal frame's payload: read back into entries, they must encode
//!    to exactly the payload; refused, the error names the entry.
//! 7. a journal file: read back, its frames written into a new file of the
//!    same epoch must read back the same, and where the next frame goes
//!    must follow from their sizes. Made up of entries taken from the
//!    input, a file must read back to exactly those entries.
//!
//! No form may panic, loop or allocate beyond what its bytes justify
//! (libFuzzer's `-rss_limit_mb` and `-malloc_limit_mb` bound a run).

use std::collections::BTreeMap;

use jobcenter::model::TaskRecord;
use jobcenter::store::fuzzing::{self as stored, JournalEntry};

/// A journal's frames start on blocks of this many bytes, after one of header.
const BLOCK: u64 = 4096;
/// Magic, epoch, length, CRC.
const FRAME_HEAD: u64 = 20;

pub fn run(data: &[u8]) {
    let Some((&choice, bytes)) = data.split_first() else { return };
    match choice % 8 {
        0 => {
            if let Ok(record) = stored::decode_task_record(bytes) {
                stable(&record, |b| stored::decode_task_record(b).ok());
            }
        }
        1 => {
            if let Ok(record) = stored::decode_job_record(bytes) {
                let encoded = stored::encode(&record);
                let again = stored::decode_job_record(&encoded).expect("a job record reads back from its own bytes");
                assert_eq!(again, record, "a job record reads back otherwise");
                assert_eq!(stored::encode(&again), encoded);
            }
        }
        2 => {
            if let Ok(group) = stored::decode_task_group(bytes) {
                stable(&group, |b| stored::decode_task_group(b).ok());
            }
        }
        3 => splice(bytes),
        4 => spec(bytes),
        5 => {
            if let Some((job, idx)) = stored::split_task_key(bytes) {
                assert_eq!(&bytes[..16], job.as_bytes());
                assert_eq!(bytes[16..20], idx.to_be_bytes());
            } else {
                assert!(bytes.len() < 20, "a key of 20 bytes or more names no task");
            }
        }
        6 => match stored::decode_journal_payload(bytes) {
            Ok(entries) => assert_eq!(stored::encode_journal_payload(&entries), bytes, "entries encode otherwise"),
            Err(error) => assert!(error.starts_with("entry "), "a refusal that names no entry: {error}"),
        },
        _ => journal(bytes),
    }
}

/// A value read back encodes to bytes that read back to a value encoding
/// to the same bytes (compared as bytes: a record's progress may be NaN).
fn stable<T: serde::Serialize>(value: &T, read: impl Fn(&[u8]) -> Option<T>) {
    let encoded = stored::encode(value);
    let again = read(&encoded).expect("a stored value reads back from its own bytes");
    assert_eq!(stored::encode(&again), encoded, "a stored value reads back otherwise");
}

/// Pieces of an input, each a 2-byte length and then that many bytes.
fn pieces(mut bytes: &[u8], most: usize) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while out.len() < most && bytes.len() >= 2 {
        let n = usize::from(u16::from_le_bytes([bytes[0], bytes[1]])).min(bytes.len() - 2);
        out.push(&bytes[2..2 + n]);
        bytes = &bytes[2 + n..];
    }
    out
}

fn splice(bytes: &[u8]) {
    let groups: Vec<Vec<(u8, TaskRecord)>> =
        pieces(bytes, 3).into_iter().map(|b| stored::decode_task_group(b).unwrap_or_default()).collect();
    let [old, changed, again] = <[_; 3]>::try_from(groups).unwrap_or_default();
    // The store keeps a group's records in offset order, each once.
    if !old.windows(2).all(|w| w[0].0 < w[1].0) {
        return;
    }
    let changed: BTreeMap<u8, TaskRecord> = changed.into_iter().collect();
    let again: BTreeMap<u8, TaskRecord> = again.into_iter().collect();
    let (first, second) = stored::splice_twice(&old, &changed, &again);
    let mut merged: BTreeMap<u8, TaskRecord> = old.into_iter().collect();
    merged.extend(changed);
    assert_eq!(first, stored::encode(&merged.clone().into_iter().collect::<Vec<_>>()), "a spliced group");
    merged.extend(again);
    assert_eq!(second, stored::encode(&merged.into_iter().collect::<Vec<_>>()), "a group spliced again");
}

fn spec(bytes: &[u8]) {
    let chunks: Vec<Vec<u8>> = pieces(bytes, 8).into_iter().map(<[u8]>::to_vec).collect();
    let Ok(spec) = stored::decode_spec(&chunks) else { return };
    assert_eq!(spec.dag.len(), spec.tasks.len());
    let encoded: Vec<Vec<u8>> = stored::encode_spec(&spec).into_iter().map(|(_, chunk)| chunk).collect();
    let again = stored::decode_spec(&encoded).expect("a spec reads back from its own chunks");
    assert_eq!(again, spec, "a spec reads back otherwise");
    assert_eq!(stored::encode_spec(&again).into_iter().map(|(_, c)| c).collect::<Vec<_>>(), encoded);
}

fn padded(len: u64) -> u64 {
    len.div_ceil(BLOCK) * BLOCK
}

fn journal(bytes: &[u8]) {
    if let Some((epoch, payloads, next)) = stored::read_journal(bytes) {
        let expected_next = BLOCK + payloads.iter().map(|p| padded(FRAME_HEAD + p.len() as u64)).sum::<u64>();
        assert_eq!(next, expected_next, "where the next frame goes");
        let file = stored::journal_file(epoch, &payloads);
        let (epoch_again, again, next_again) = stored::read_journal(&file).expect("a journal file reads back");
        assert_eq!((epoch_again, &again, next_again), (epoch, &payloads, next), "a journal file written again");
    }
    // A file made of entries taken from the input.
    let mut entries = Vec::new();
    for (n, piece) in pieces(bytes, 16).into_iter().enumerate() {
        let ops = piece
            .chunks(7)
            .map(|op| {
                let (key, value) = op.split_at(op.len().min(3));
                (key.to_vec(), (!value.is_empty()).then(|| value.to_vec()))
            })
            .collect();
        entries.push(JournalEntry { seq: n as u64 + 1, tree: (n % 2) as u8, ops });
    }
    let payloads: Vec<Vec<u8>> = entries.chunks(3).map(stored::encode_journal_payload).collect();
    let epoch = u64::from(bytes.first().copied().unwrap_or(1));
    let (_, read, _) = stored::read_journal(&stored::journal_file(epoch, &payloads)).expect("a made file reads");
    assert_eq!(read, payloads, "a made journal's frames");
    let decoded: Vec<JournalEntry> =
        read.iter().flat_map(|p| stored::decode_journal_payload(p).expect("a made payload decodes")).collect();
    assert_eq!(decoded, entries, "a made journal's entries");
}

//! The sled store's journal: a preallocated file that makes each flush one
//! overwrite and one `fdatasync`, with sled's own log made durable only at
//! checkpoints.
//!
//! Every atomic write to one of the store's sled trees is also encoded as
//! an *entry*: its sequence number, the tree, and the keys it sets and
//! removes with their whole values. A flush appends the entries written
//! since the last one as one *frame* (magic, epoch, length, CRC, payload),
//! padded to a block so that no later write touches the blocks of a frame
//! already synced, and syncs the file. The file is zero-filled when it is
//! made, so an append changes neither its size nor its blocks' allocation
//! and the sync has no metadata to commit.
//!
//! A *checkpoint* makes sled's log durable and then starts a new epoch: the
//! header at the start of the file names it (in one of two slots, in turn,
//! so that a header torn by a power loss leaves the one before), and frames
//! of older epochs left further on are ignored. Reading stops at the first
//! frame that is not whole and of the header's epoch (a torn last append,
//! which was never acknowledged, or the end of what this epoch wrote).
//!
//! Replay is exact because the store keeps, for each tree, the number of the
//! last entry applied to it, written right after the entry's keys: an entry
//! is applied again, whole and in order, only if its tree has not got it.
//! The keys of an entry reach sled only after its frame is durable, so any
//! part of one that sled holds is replayed whole. Writes the journal did not
//! take went to sled as whole batches, with their numbers after them, and
//! are durable by the checkpoint that follows them; replay never applies an
//! older entry over them.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The journal's file name inside a generation's directory.
pub(super) const FILE: &str = "journal";
/// The name a new journal is written under before it is renamed to `FILE`.
pub(super) const TEMPORARY: &str = "journal.tmp";
/// The journal's size; a flush that does not fit checkpoints instead.
pub(super) const CAPACITY: u64 = 4 * 1024 * 1024;
/// Frames start on block boundaries, the header has a block of its own.
pub(super) const BLOCK: u64 = 4096;
/// Each of the header's two slots, a disk sector.
const HEADER_SLOT: u64 = 512;
const HEADER_MAGIC: &[u8; 8] = b"JCJOURN1";
const FRAME_MAGIC: u32 = 0x4a43_4652;
/// Magic, epoch, payload length, CRC.
const FRAME_HEAD: usize = 4 + 8 + 4 + 4;
/// An entry's operations: a key removed, or set with its value after it.
const OP_REMOVE: u8 = 0;
const OP_SET: u8 = 1;

/// Which sled tree an entry writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tree {
    Meta = 0,
    Data = 1,
}

/// One atomic write to one tree, as read back from the journal.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Entry {
    pub seq: u64,
    pub tree: Tree,
    /// Each key with its new value, or `None` when it is removed.
    pub ops: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

/// Encodes the operations of one entry as they are added.
#[derive(Default)]
pub(super) struct EntryWriter {
    ops: Vec<u8>,
}

impl EntryWriter {
    pub(super) fn insert(&mut self, key: &[u8], value: &[u8]) {
        self.ops.push(OP_SET);
        put_bytes(&mut self.ops, key);
        put_bytes(&mut self.ops, value);
    }

    pub(super) fn remove(&mut self, key: &[u8]) {
        self.ops.push(OP_REMOVE);
        put_bytes(&mut self.ops, key);
    }

    pub(super) fn len(&self) -> usize {
        self.ops.len()
    }

    /// Appends the entry, numbered `seq`, to a frame's payload.
    pub(super) fn finish_into(self, seq: u64, tree: Tree, payload: &mut Vec<u8>) {
        let len = 8 + 1 + self.ops.len();
        payload.extend_from_slice(&(len as u32).to_le_bytes());
        payload.extend_from_slice(&seq.to_le_bytes());
        payload.push(tree as u8);
        payload.extend_from_slice(&self.ops);
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Reads the fields of one entry or one payload in order.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

/// The entries of one frame's payload, or what is wrong with it.
pub(super) fn decode_payload(payload: &[u8]) -> Result<Vec<Entry>, String> {
    let mut entries = Vec::new();
    let mut cursor = Cursor(payload);
    while !cursor.0.is_empty() {
        let number = entries.len() + 1;
        let bytes = cursor.bytes().ok_or_else(|| format!("entry {number} is cut short"))?;
        let mut entry = Cursor(bytes);
        let seq = entry.u64().ok_or_else(|| format!("entry {number} has no sequence number"))?;
        let tree = match entry.take(1) {
            Some([0]) => Tree::Meta,
            Some([1]) => Tree::Data,
            _ => return Err(format!("entry {number} names no tree")),
        };
        let mut ops = Vec::new();
        while let Some(kind) = entry.take(1) {
            let bad = || format!("entry {number} has an operation cut short");
            let key = entry.bytes().ok_or_else(bad)?.to_vec();
            let value = match kind[0] {
                OP_SET => Some(entry.bytes().ok_or_else(bad)?.to_vec()),
                OP_REMOVE => None,
                _ => return Err(format!("entry {number} has an operation of unknown kind")),
            };
            ops.push((key, value));
        }
        entries.push(Entry { seq, tree, ops });
    }
    Ok(entries)
}

fn frame_crc(epoch: u64, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&epoch.to_le_bytes());
    hasher.update(&(payload.len() as u32).to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

/// One frame, padded with zeros to a whole number of blocks.
#[cfg(any(test, feature = "fuzzing"))]
pub(super) fn encode_frame(epoch: u64, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::new();
    encode_frame_into(epoch, payload, &mut frame);
    frame
}

/// One frame into `frame` (emptied first), padded with zeros to a whole
/// number of blocks.
fn encode_frame_into(epoch: u64, payload: &[u8], frame: &mut Vec<u8>) {
    let len = FRAME_HEAD + payload.len();
    frame.clear();
    frame.reserve(padded(len as u64) as usize);
    frame.extend_from_slice(&FRAME_MAGIC.to_le_bytes());
    frame.extend_from_slice(&epoch.to_le_bytes());
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(&frame_crc(epoch, payload).to_le_bytes());
    frame.extend_from_slice(payload);
    frame.resize(padded(len as u64) as usize, 0);
}

fn padded(len: u64) -> u64 {
    len.div_ceil(BLOCK) * BLOCK
}

/// The payloads of the whole frames of `epoch` at the start of `bytes`
/// (the file after its header), and where the next frame goes.
fn read_frames(bytes: &[u8], epoch: u64) -> (Vec<&[u8]>, u64) {
    let mut payloads = Vec::new();
    let mut at = 0usize;
    loop {
        let mut head = Cursor(&bytes[at..]);
        let (Some(magic), Some(found), Some(len), Some(crc)) = (head.u32(), head.u64(), head.u32(), head.u32()) else {
            break;
        };
        if magic != FRAME_MAGIC || found != epoch {
            break;
        }
        let Some(payload) = head.take(len as usize) else { break };
        if frame_crc(epoch, payload) != crc {
            break;
        }
        payloads.push(payload);
        at += padded((FRAME_HEAD + payload.len()) as u64) as usize;
        if at >= bytes.len() {
            break;
        }
    }
    (payloads, BLOCK + at as u64)
}

/// The header of `epoch`, and where it goes: epochs alternate between two
/// slots, so that a header torn while it was written leaves the other,
/// whose epoch's entries the checkpoint before made durable anyway.
pub(super) fn header(epoch: u64) -> (u64, Vec<u8>) {
    let mut slot = Vec::with_capacity(HEADER_SLOT as usize);
    slot.extend_from_slice(HEADER_MAGIC);
    slot.extend_from_slice(&epoch.to_le_bytes());
    let crc = crc32fast::hash(&slot);
    slot.extend_from_slice(&crc.to_le_bytes());
    slot.resize(HEADER_SLOT as usize, 0);
    ((epoch % 2) * HEADER_SLOT, slot)
}

/// The epoch of the newest whole header in the first block.
fn parse_header(block: &[u8]) -> Option<u64> {
    let slot = |at: usize| -> Option<u64> {
        let slot = block.get(at..at + HEADER_SLOT as usize)?;
        let epoch = u64::from_le_bytes(slot[8..16].try_into().ok()?);
        let crc = u32::from_le_bytes(slot[16..20].try_into().ok()?);
        (&slot[..8] == HEADER_MAGIC && crc32fast::hash(&slot[..16]) == crc).then_some(epoch)
    };
    slot(0).max(slot(HEADER_SLOT as usize))
}

/// The payloads of a journal's frames, in order.
pub(super) type Frames = Vec<Vec<u8>>;

/// A journal file's contents: the epoch of its newest whole header, the
/// payloads of that epoch's whole frames in order, and where the next frame
/// goes; `None` when no header is whole.
pub(super) fn read(bytes: &[u8]) -> Option<(u64, Vec<&[u8]>, u64)> {
    let epoch = parse_header(bytes)?;
    let body = bytes.get(BLOCK as usize..).unwrap_or_default();
    let (payloads, next) = read_frames(body, epoch);
    Some((epoch, payloads, next))
}

/// The open journal of one generation.
pub(super) struct Journal {
    file: File,
    epoch: u64,
    /// Where the next frame goes.
    next: u64,
    /// The last frame written, kept for its capacity.
    frame: Vec<u8>,
}

impl Journal {
    /// Makes a new, empty journal in `dir` (replacing any), durable when it
    /// returns but for its directory entry, which the generation's first
    /// checkpoint syncs.
    pub(super) fn create(dir: &Path) -> std::io::Result<Journal> {
        let temporary = dir.join(TEMPORARY);
        let mut file =
            std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&temporary)?;
        let (at, slot) = header(1);
        let mut first = vec![0u8; BLOCK as usize];
        first[at as usize..(at + HEADER_SLOT) as usize].copy_from_slice(&slot);
        file.write_all(&first)?;
        let zeros = vec![0u8; 256 * 1024];
        let mut written = BLOCK;
        while written < CAPACITY {
            let n = zeros.len().min((CAPACITY - written) as usize);
            file.write_all(&zeros[..n])?;
            written += n as u64;
        }
        file.sync_all()?;
        std::fs::rename(&temporary, dir.join(FILE))?;
        Ok(Journal { file, epoch: 1, next: BLOCK, frame: Vec::new() })
    }

    /// Opens the journal in `dir` and returns it with the payloads of its
    /// current epoch's frames, in order. `Ok(None)`: there is no journal.
    pub(super) fn open(dir: &Path) -> Result<Option<(Journal, Frames)>, String> {
        let path = dir.join(FILE);
        let mut file = match std::fs::OpenOptions::new().read(true).write(true).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
        };
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let (epoch, payloads, next) = read(&bytes).ok_or_else(|| format!("{} has a damaged header", path.display()))?;
        let payloads = payloads.into_iter().map(<[u8]>::to_vec).collect();
        Ok(Some((Journal { file, epoch, next, frame: Vec::new() }, payloads)))
    }

    /// Whether a frame of `payload_len` bytes fits before the end.
    pub(super) fn fits(&self, payload_len: usize) -> bool {
        self.next + padded((FRAME_HEAD + payload_len) as u64) <= CAPACITY
    }

    /// Appends one frame and syncs it.
    pub(super) fn append(&mut self, payload: &[u8]) -> std::io::Result<()> {
        encode_frame_into(self.epoch, payload, &mut self.frame);
        self.file.write_all_at(&self.frame, self.next)?;
        self.file.sync_data()?;
        self.next += self.frame.len() as u64;
        Ok(())
    }

    /// Starts a new epoch: every frame written so far is ignored from now
    /// on. Only after a checkpoint made their entries durable in sled.
    pub(super) fn restart(&mut self) -> std::io::Result<()> {
        let (at, slot) = header(self.epoch + 1);
        self.file.write_all_at(&slot, at)?;
        self.file.sync_data()?;
        self.epoch += 1;
        self.next = BLOCK;
        Ok(())
    }

    /// Whether nothing was appended in this epoch.
    pub(super) fn is_empty(&self) -> bool {
        self.next == BLOCK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64, tree: Tree, ops: &[(&[u8], Option<&[u8]>)], payload: &mut Vec<u8>) {
        let mut writer = EntryWriter::default();
        for (key, value) in ops {
            match value {
                Some(value) => writer.insert(key, value),
                None => writer.remove(key),
            }
        }
        writer.finish_into(seq, tree, payload);
    }

    #[test]
    fn entries_round_trip_through_a_frame() {
        let mut payload = Vec::new();
        entry(7, Tree::Data, &[(b"a", Some(b"one")), (b"b", None)], &mut payload);
        entry(8, Tree::Meta, &[(b"k", Some(b""))], &mut payload);
        let mut body = encode_frame(3, &payload);
        assert_eq!(body.len() as u64 % BLOCK, 0);
        body.extend(encode_frame(3, b""));
        let (payloads, next) = read_frames(&body, 3);
        assert_eq!(payloads.len(), 2);
        assert_eq!(next, BLOCK + body.len() as u64);
        let entries = decode_payload(payloads[0]).expect("decodes");
        assert_eq!(
            entries,
            vec![
                Entry {
                    seq: 7,
                    tree: Tree::Data,
                    ops: vec![(b"a".to_vec(), Some(b"one".to_vec())), (b"b".to_vec(), None)]
                },
                Entry { seq: 8, tree: Tree::Meta, ops: vec![(b"k".to_vec(), Some(Vec::new()))] },
            ]
        );
    }

    #[test]
    fn reading_stops_at_a_torn_frame_and_at_an_older_epoch() {
        let mut payload = Vec::new();
        entry(1, Tree::Data, &[(b"a", Some(&[9; 5000]))], &mut payload);
        let whole = encode_frame(2, &payload);
        let mut torn = encode_frame(2, &payload);
        torn[FRAME_HEAD + 4000] ^= 1;
        let older = encode_frame(1, &payload);
        let body: Vec<u8> = [whole.clone(), torn, whole.clone()].concat();
        let (payloads, next) = read_frames(&body, 2);
        assert_eq!(payloads.len(), 1, "a frame whose CRC fails ends the journal");
        assert_eq!(next, BLOCK + whole.len() as u64);
        let body: Vec<u8> = [whole.clone(), older].concat();
        assert_eq!(read_frames(&body, 2).0.len(), 1, "a frame of an earlier epoch is not read");
        assert_eq!(read_frames(&vec![0; 3 * BLOCK as usize], 2).0.len(), 0, "zeros hold no frame");
    }

    #[test]
    fn a_damaged_payload_is_named() {
        let mut payload = Vec::new();
        entry(1, Tree::Data, &[(b"key", Some(b"value"))], &mut payload);
        payload.truncate(payload.len() - 2);
        let error = decode_payload(&payload).expect_err("cut short");
        assert!(error.contains("entry 1"), "{error}");
    }

    #[test]
    fn a_journal_is_created_appended_restarted_and_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut journal = Journal::create(dir.path()).expect("create");
        assert_eq!(std::fs::metadata(dir.path().join(FILE)).expect("file").len(), CAPACITY);
        journal.append(b"first").expect("append");
        journal.append(b"second").expect("append");
        let (opened, payloads) = Journal::open(dir.path()).expect("open").expect("present");
        assert_eq!(payloads, vec![b"first".to_vec(), b"second".to_vec()]);
        assert_eq!(opened.next, journal.next);
        journal.restart().expect("restart");
        journal.append(b"third").expect("append");
        let (_, payloads) = Journal::open(dir.path()).expect("open").expect("present");
        assert_eq!(payloads, vec![b"third".to_vec()], "the frames of the last epoch are ignored");
        assert_eq!(std::fs::metadata(dir.path().join(FILE)).expect("file").len(), CAPACITY);
        // A header torn while epoch 3 was written leaves epoch 2's, whose
        // frames are read (their entries were durable in sled anyway).
        journal.restart().expect("restart");
        let mut torn = std::fs::read(dir.path().join(FILE)).expect("read");
        let (at, _) = header(3);
        torn[at as usize + 12] ^= 1;
        std::fs::write(dir.path().join(FILE), &torn).expect("write");
        let (opened, payloads) = Journal::open(dir.path()).expect("open").expect("present");
        assert_eq!((opened.epoch, payloads), (2, vec![b"third".to_vec()]));
        let (other, _) = header(2);
        torn[other as usize + 3] ^= 1;
        std::fs::write(dir.path().join(FILE), torn).expect("write");
        let error = Journal::open(dir.path()).err().expect("a journal with no whole header is refused");
        assert!(error.contains("damaged header"), "{error}");
    }

    #[test]
    fn a_frame_that_does_not_fit_is_reported() {
        let dir = tempfile::tempdir().expect("tempdir");
        let journal = Journal::create(dir.path()).expect("create");
        assert!(journal.fits(1000));
        assert!(!journal.fits((CAPACITY - BLOCK) as usize));
    }
}

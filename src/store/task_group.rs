//! The sled store's task groups: the records of up to `TASKS_PER_GROUP`
//! consecutive tasks under one key, encoded as one postcard sequence of
//! (offset in the group, record). A group written again is spliced: the
//! records that did not change keep their bytes and only the changed ones
//! are encoded, giving byte for byte what encoding the merged group whole
//! gives. The value and where each record lies in it are remembered for
//! the groups written last, so that a group a step touches again is neither
//! read, decoded nor encoded whole.

use std::collections::{BTreeMap, HashMap};

use crate::model::{JobId, TaskRecord};

/// The stored records of one group, decoded: (offset in the group, record).
pub(super) type Group = Vec<(u8, TaskRecord)>;

/// How many groups' layouts are remembered; past it, all are forgotten.
const REMEMBERED: usize = 1024;

/// A group's encoded value and where each record's bytes lie in it.
#[derive(Clone, Debug)]
pub(super) struct Encoded {
    pub bytes: Vec<u8>,
    /// (offset in the group, start, end) of each record, in offset order.
    spans: Vec<(u8, u32, u32)>,
}

/// A record of the group as stored: its encoded bytes, or decoded.
#[derive(Clone, Copy)]
pub(super) enum Old<'a> {
    Bytes(&'a [u8]),
    Record(&'a TaskRecord),
}

impl Encoded {
    /// The stored records as they lie in the value.
    pub(super) fn records(&self) -> Vec<(u8, Old<'_>)> {
        self.spans.iter().map(|&(at, start, end)| (at, Old::Bytes(&self.bytes[start as usize..end as usize]))).collect()
    }
}

/// The groups written last, by job and group number: each one's value as
/// stored, and its layout. Every write of a group passes through here, and
/// a removed job's groups are forgotten, so what is remembered is what is
/// stored.
#[derive(Default)]
pub(super) struct Recent {
    groups: HashMap<(JobId, u32), Encoded>,
}

impl Recent {
    /// The stored value and layout of a group written lately.
    pub(super) fn get(&self, job: JobId, group: u32) -> Option<&Encoded> {
        self.groups.get(&(job, group))
    }

    /// Forgets the groups of a job removed.
    pub(super) fn forget(&mut self, job: JobId) {
        self.groups.retain(|(of, _), _| *of != job);
    }

    pub(super) fn put(&mut self, job: JobId, group: u32, encoded: Encoded) {
        if self.groups.len() >= REMEMBERED && !self.groups.contains_key(&(job, group)) {
            self.groups.clear();
        }
        self.groups.insert((job, group), encoded);
    }
}

/// Encodes the group that holds `old` (in offset order) with `changed`
/// replacing or adding records: the bytes `postcard` gives for the merged
/// `Group`, and where each record lies in them.
pub(super) fn encode(old: &[(u8, Old<'_>)], changed: &BTreeMap<u8, &TaskRecord>) -> Encoded {
    let added = changed.keys().filter(|at| old.binary_search_by_key(*at, |(o, _)| *o).is_err()).count();
    let count = old.len() + added;
    // The sequence's length, as postcard prefixes it.
    let out = Vec::with_capacity(2 + old.len() * 48 + changed.len() * 48);
    let mut out = postcard::to_extend(&count, out).expect("postcard encodes a length");
    let mut spans = Vec::with_capacity(count);
    let mut olds = old.iter().peekable();
    let mut news = changed.iter().peekable();
    loop {
        let new = match (olds.peek().map(|(o, _)| *o), news.peek().map(|(c, _)| **c)) {
            (None, None) => break,
            (Some(_), None) => false,
            (None, Some(_)) => true,
            (Some(o), Some(c)) => {
                if o == c {
                    // The changed record takes the stored one's place.
                    olds.next();
                }
                c <= o
            }
        };
        let (at, record) = if new {
            news.next().map(|(at, task)| (*at, Old::Record(task)))
        } else {
            olds.next().map(|(at, record)| (*at, *record))
        }
        .expect("peeked");
        out.push(at);
        let start = out.len();
        match record {
            Old::Bytes(bytes) => out.extend_from_slice(bytes),
            Old::Record(task) => task.encode_stored(&mut out),
        }
        spans.push((at, start as u32, out.len() as u32));
    }
    Encoded { bytes: out, spans }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;
    use crate::clock::Timestamp;
    use crate::model::{End, HandlerId, Hold, Phase};

    fn record(seed: u32) -> TaskRecord {
        let mut task = TaskRecord::initial(seed.is_multiple_of(2), Timestamp(1_700_000_000_000 + i64::from(seed)));
        let at = Timestamp(1_700_000_000_500 + i64::from(seed));
        let hold = Hold { handler: HandlerId::new(), assigned_at: at, started_at: Some(at) };
        let ended = |end| Phase::Ended { end, at };
        task.phase = [Phase::Pending, Phase::Held(hold), ended(End::Succeeded), ended(End::Failed)][seed as usize % 4];
        task.attempt = seed % 5;
        if seed.is_multiple_of(3) {
            task.last_attempt.handler = task.hold().is_none().then(HandlerId::new);
            task.error = Some(Arc::from(format!("error {seed}").as_str()));
            task.output = vec![Arc::from("a line"), Arc::from(format!("line {seed}").as_str())].into();
        }
        task
    }

    fn whole(group: &Group) -> Vec<u8> {
        super::super::codec::encode(group)
    }

    proptest! {
        /// Splicing gives the bytes of encoding the merged group whole,
        /// whether the old records come decoded or as spliced bytes.
        #[test]
        fn spliced_groups_encode_as_whole_ones(
            old in proptest::collection::btree_map(0u8..32, 0u32..1000, 0..32),
            changed in proptest::collection::btree_map(0u8..32, 0u32..1000, 0..32),
            again in proptest::collection::btree_map(0u8..32, 0u32..1000, 0..8),
        ) {
            let old: Group = old.into_iter().map(|(at, seed)| (at, record(seed))).collect();
            let changed: BTreeMap<u8, TaskRecord> = changed.into_iter().map(|(at, seed)| (at, record(seed))).collect();
            let mut merged: BTreeMap<u8, TaskRecord> = old.iter().cloned().collect();
            merged.extend(changed.clone());
            let merged: Group = merged.into_iter().collect();

            let decoded: Vec<(u8, Old)> = old.iter().map(|(at, task)| (*at, Old::Record(task))).collect();
            let first = encode(&decoded, &changed.iter().map(|(at, task)| (*at, task)).collect());
            prop_assert_eq!(&first.bytes[..], &whole(&merged)[..]);

            let again: BTreeMap<u8, TaskRecord> = again.into_iter().map(|(at, seed)| (at, record(seed + 7))).collect();
            let second = encode(&first.records(), &again.iter().map(|(at, task)| (*at, task)).collect());
            let mut expected: BTreeMap<u8, TaskRecord> = merged.into_iter().collect();
            expected.extend(again);
            let expected: Group = expected.into_iter().collect();
            prop_assert_eq!(&second.bytes[..], &whole(&expected)[..]);
            let back: Group = super::super::codec::decode(&second.bytes, "task records").unwrap();
            prop_assert_eq!(back.len(), expected.len());
        }
    }

    #[test]
    fn a_group_is_remembered_by_job_and_number_until_its_job_is_forgotten() {
        let (job, other) = (JobId::new(), JobId::new());
        let task = record(3);
        let encoded = encode(&[], &BTreeMap::from([(4u8, &task)]));
        let mut recent = Recent::default();
        recent.put(job, 0, encoded.clone());
        recent.put(other, 0, encoded.clone());
        assert_eq!(recent.get(job, 0).map(|known| &known.bytes), Some(&encoded.bytes));
        assert!(recent.get(job, 1).is_none(), "another group");
        recent.forget(job);
        assert!(recent.get(job, 0).is_none(), "a removed job's group");
        assert!(recent.get(other, 0).is_some(), "another job's group stays");
    }

    #[test]
    fn remembering_is_bounded() {
        let task = record(1);
        let encoded = encode(&[], &BTreeMap::from([(0u8, &task)]));
        let mut recent = Recent::default();
        let first = JobId::new();
        recent.put(first, 0, encoded.clone());
        for group in 1..REMEMBERED as u32 + 5 {
            recent.put(JobId::new(), group, encoded.clone());
        }
        assert!(recent.groups.len() <= REMEMBERED);
        assert!(recent.get(first, 0).is_none());
    }
}

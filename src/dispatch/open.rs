//! Who `Dispatch::pick_handler` looks at: for each job type, the handlers
//! that declare it and have a slot free for it, least loaded first; the
//! handlers that take any type; and the handlers by host and by rack. A
//! pick then costs about the same with ten thousand handlers as with ten.

use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::sync::Arc;

use foldhash::HashMap;

use crate::model::{HandlerId, Place};

/// Where a handler stands in a job type's order: its load (attempts held
/// per thousand slots), then its free slots for the type (most first),
/// then its id.
pub(super) type Standing = (u64, Reverse<u32>, HandlerId);

#[derive(Default)]
pub(super) struct Open {
    by_type: HashMap<Arc<str>, BTreeSet<Standing>>,
    /// Each handler's standing in every type it has a slot free for.
    standing: HashMap<HandlerId, Vec<(Arc<str>, Standing)>>,
    /// Handlers that take any job type (the in-process executors).
    any: BTreeSet<HandlerId>,
    by_host: HashMap<Arc<str>, BTreeSet<HandlerId>>,
    by_rack: HashMap<Arc<str>, BTreeSet<HandlerId>>,
}

impl Open {
    /// A handler connected, at `place`; `any` when it takes every job type.
    pub(super) fn join(&mut self, handler: HandlerId, place: &Place, any: bool) {
        if any {
            self.any.insert(handler);
        }
        for (index, key) in [(&mut self.by_host, &place.host), (&mut self.by_rack, &place.rack)] {
            if let Some(key) = key {
                index.entry(key.clone()).or_default().insert(handler);
            }
        }
    }

    /// A handler left (or joins again): it is no longer looked at.
    pub(super) fn leave(&mut self, handler: HandlerId, place: &Place) {
        self.any.remove(&handler);
        for (index, key) in [(&mut self.by_host, &place.host), (&mut self.by_rack, &place.rack)] {
            let Some(key) = key else { continue };
            if let Some(set) = index.get_mut(key) {
                set.remove(&handler);
                if set.is_empty() {
                    index.remove(key);
                }
            }
        }
        self.stand(handler, 0, std::iter::empty());
    }

    /// Where the handler stands now, with its `load` and its free slots by
    /// job type (a type with none leaves its order).
    pub(super) fn stand(&mut self, handler: HandlerId, load: u64, free: impl Iterator<Item = (Arc<str>, u32)>) {
        let mut entries = self.standing.remove(&handler).unwrap_or_default();
        for (job_type, standing) in entries.drain(..) {
            if let Some(set) = self.by_type.get_mut(&job_type) {
                set.remove(&standing);
            }
        }
        for (job_type, free) in free.filter(|(_, free)| *free > 0) {
            // A type declared twice stands once.
            if entries.iter().any(|(t, _)| *t == job_type) {
                continue;
            }
            let standing = (load, Reverse(free), handler);
            self.by_type.entry(job_type.clone()).or_default().insert(standing);
            entries.push((job_type, standing));
        }
        if !entries.is_empty() {
            self.standing.insert(handler, entries);
        }
    }

    /// The handlers with a slot free for the type, least loaded first.
    pub(super) fn least_loaded(&self, job_type: &str) -> impl Iterator<Item = HandlerId> + '_ {
        self.by_type.get(job_type).into_iter().flatten().map(|(_, _, handler)| *handler)
    }

    /// How many handlers have a slot free for the type.
    pub(super) fn free_for(&self, job_type: &str) -> usize {
        self.by_type.get(job_type).map_or(0, BTreeSet::len)
    }

    pub(super) fn any(&self) -> impl Iterator<Item = HandlerId> + '_ {
        self.any.iter().copied()
    }

    /// The handlers on the host of `place`, then those in its rack.
    pub(super) fn beside<'a>(&'a self, place: &'a Place) -> impl Iterator<Item = HandlerId> + 'a {
        let on = |index: &'a HashMap<Arc<str>, BTreeSet<HandlerId>>, key: &'a Option<Arc<str>>| {
            key.as_ref().and_then(|key| index.get(key)).into_iter().flatten().copied()
        };
        on(&self.by_host, &place.host).chain(on(&self.by_rack, &place.rack))
    }

    /// Each handler's standings, for the tests' check that they are as
    /// computed afresh.
    #[cfg(test)]
    pub(super) fn standings(&self) -> std::collections::BTreeMap<HandlerId, Vec<(Arc<str>, Standing)>> {
        let mut all: std::collections::BTreeMap<_, Vec<_>> = self.standing.clone().into_iter().collect();
        for entries in all.values_mut() {
            entries.sort();
        }
        let listed: usize = self.by_type.values().map(BTreeSet::len).sum();
        assert_eq!(listed, all.values().map(Vec::len).sum::<usize>(), "every standing is in its type's order");
        all
    }
}

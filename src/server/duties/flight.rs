//! Single-flight gates whose pass is given back when its holder is
//! dropped: a duty cut short (a client that hangs up, a request that times
//! out, a task aborted) frees the gate as surely as one that runs to its end.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// One duty at a time.
#[derive(Debug, Default)]
pub(super) struct Gate {
    taken: AtomicBool,
}

/// The right to run a gate's duty; dropping it opens the gate again.
#[must_use = "the gate opens again when the pass is dropped"]
#[derive(Debug)]
pub(super) struct Pass<'a> {
    gate: &'a Gate,
}

impl Gate {
    /// A pass, unless another holder has one.
    pub(super) fn enter(&self) -> Option<Pass<'_>> {
        (!self.taken.swap(true, Ordering::AcqRel)).then(|| Pass { gate: self })
    }

    pub(super) fn is_taken(&self) -> bool {
        self.taken.load(Ordering::Acquire)
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.gate.taken.store(false, Ordering::Release);
    }
}

/// One duty at a time per key (a job type, say).
#[derive(Debug)]
pub(super) struct Gates<K: Eq + Hash> {
    taken: Mutex<HashSet<K>>,
}

impl<K: Eq + Hash> Default for Gates<K> {
    fn default() -> Gates<K> {
        Gates { taken: Mutex::new(HashSet::new()) }
    }
}

/// The right to run one key's duty; dropping it opens that key's gate again.
#[must_use = "the key's gate opens again when the pass is dropped"]
pub(super) struct KeyPass<'a, K: Eq + Hash + Clone> {
    gates: &'a Gates<K>,
    key: K,
}

impl<K: Eq + Hash + Clone> Gates<K> {
    /// A pass for `key`, unless another holder has one.
    pub(super) fn enter(&self, key: &K) -> Option<KeyPass<'_, K>> {
        let inserted = self.taken.lock().expect("gates lock").insert(key.clone());
        inserted.then(|| KeyPass { gates: self, key: key.clone() })
    }

    pub(super) fn is_taken<Q>(&self, key: &Q) -> bool
    where
        K: std::borrow::Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.taken.lock().expect("gates lock").contains(key)
    }

    /// How many keys are taken now.
    pub(super) fn len(&self) -> usize {
        self.taken.lock().expect("gates lock").len()
    }
}

impl<K: Eq + Hash + Clone> Drop for KeyPass<'_, K> {
    fn drop(&mut self) {
        self.gates.taken.lock().expect("gates lock").remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_dropped_opens_the_gate() {
        let gate = Gate::default();
        let pass = gate.enter().expect("open at first");
        assert!(gate.enter().is_none(), "single flight");
        assert!(gate.is_taken(), "a refused entry leaves the holder's pass alone");
        drop(pass);
        assert!(gate.enter().is_some(), "open again");
    }

    #[test]
    fn a_duty_cut_short_gives_its_pass_back() {
        let gate = Gate::default();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        runtime.block_on(async {
            let duty = async {
                let _pass = gate.enter().expect("open");
                tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
            };
            // The caller gives up after 10 ms: the future is dropped mid-await.
            let cut = tokio::time::timeout(std::time::Duration::from_millis(10), duty).await;
            assert!(cut.is_err());
        });
        assert!(!gate.is_taken(), "the dropped duty gave its pass back");
    }

    #[test]
    fn keys_are_gated_apart() {
        let gates: Gates<String> = Gates::default();
        let a = gates.enter(&"a".to_string()).expect("a open");
        assert!(gates.enter(&"a".to_string()).is_none());
        assert!(gates.is_taken("a"), "a refused entry leaves the holder's pass alone");
        let b = gates.enter(&"b".to_string()).expect("b open beside a");
        assert_eq!(gates.len(), 2);
        drop(a);
        assert!(!gates.is_taken("a") && gates.is_taken("b"));
        drop(b);
        assert_eq!(gates.len(), 0);
    }
}

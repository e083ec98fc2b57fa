//! Why a server cannot go on, carried from where it is found (the
//! committer, the cluster's heartbeat) to `main`, which alone ends the
//! process or starts it over. Library code records a fate and stops its own
//! part; it never exits.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tokio_util::sync::CancellationToken;

/// What ends a server that cannot go on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Fatal {
    /// A store write failed in a way waiting cannot mend: nothing written
    /// after it may be acknowledged.
    #[error("store write failed: {0}; stopping so that nothing unwritten is acknowledged")]
    Store(String),
    /// The other instances deactivated this one: it must start over under
    /// a new id, keeping nothing of the old one.
    #[error("this instance was deactivated by the others; starting over as a new instance")]
    Deactivated,
    /// The engine's loop panicked: no step would be taken any more, so the
    /// server stops rather than accept work it cannot do.
    #[error("the engine's loop stopped: {0}; stopping rather than accept work nothing would do")]
    Engine(String),
}

/// What a task that ended abnormally said: its panic's message, or why it ended.
pub fn panic_text(error: tokio::task::JoinError) -> String {
    match error.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".into()),
        Err(error) => error.to_string(),
    }
}

/// The first fatal condition a server met, shared by its parts. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Fate {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    fatal: OnceLock<Fatal>,
    met: CancellationToken,
    leaving: AtomicBool,
}

impl Fate {
    /// Records `fatal` unless one was recorded first, and wakes every waiter.
    /// A refusal met while the instance leaves on purpose is not fatal: it
    /// was stopping anyway.
    pub fn meet(&self, fatal: Fatal) {
        if fatal == Fatal::Deactivated && self.inner.leaving.load(Ordering::Acquire) {
            tracing::debug!("write refused after this instance left the cluster");
            return;
        }
        if self.inner.fatal.set(fatal).is_ok() {
            tracing::error!(error = %self.inner.fatal.get().expect("just set"), "cannot go on");
        }
        self.inner.met.cancel();
    }

    /// The instance is leaving its cluster on purpose (a clean stop): a
    /// write refused from now on ends nothing.
    pub fn leaving(&self) {
        self.inner.leaving.store(true, Ordering::Release);
    }

    /// The fatal condition met, if any.
    pub fn fatal(&self) -> Option<&Fatal> {
        self.inner.fatal.get()
    }

    /// Resolves once a fatal condition is met.
    pub async fn met(&self) -> Fatal {
        self.inner.met.cancelled().await;
        self.inner.fatal.get().cloned().expect("set before cancel")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_fatal_condition_is_kept() {
        let fate = Fate::default();
        assert_eq!(fate.fatal(), None);
        fate.meet(Fatal::Store("disk full".into()));
        fate.meet(Fatal::Deactivated);
        assert_eq!(fate.fatal(), Some(&Fatal::Store("disk full".into())));
    }

    #[test]
    fn a_refusal_after_leaving_is_not_fatal() {
        let fate = Fate::default();
        fate.leaving();
        fate.meet(Fatal::Deactivated);
        assert_eq!(fate.fatal(), None);
        fate.meet(Fatal::Store("io".into()));
        assert_eq!(fate.fatal(), Some(&Fatal::Store("io".into())));
    }
}

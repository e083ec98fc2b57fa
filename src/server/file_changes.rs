//! A file the server reads again while it runs (the credentials file, the
//! notifications file): at each SIGHUP, and when its modification time,
//! size or inode change, looked at every half second.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use tokio::signal::unix::{signal, Signal, SignalKind};

/// How often the file is looked at for a change.
const POLL: Duration = Duration::from_millis(500);

/// What says a file changed: its modification time, size and inode.
type Stamp = Option<(SystemTime, u64, u64)>;

fn stamp(path: &std::path::Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len(), metadata.ino()))
}

/// When a file is to be read again.
pub(crate) struct FileChanges {
    path: PathBuf,
    hangups: Option<Signal>,
    seen: Stamp,
    polls: tokio::time::Interval,
}

impl FileChanges {
    /// Watches `path` as it is now; `what` names it in the warning when
    /// SIGHUP cannot be caught.
    pub(crate) fn new(path: PathBuf, what: &str) -> FileChanges {
        let hangups = signal(SignalKind::hangup())
            .inspect_err(|e| tracing::warn!(error = %e, "SIGHUP cannot be caught; {what} is read again on change only"))
            .ok();
        let mut polls = tokio::time::interval(POLL);
        polls.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        FileChanges { seen: stamp(&path), path, hangups, polls }
    }

    /// Waits for a SIGHUP or a change of the file since it was last seen.
    pub(crate) async fn next(&mut self) {
        loop {
            let hangup = async {
                match &mut self.hangups {
                    Some(hangups) => hangups.recv().await,
                    None => std::future::pending().await,
                }
            };
            let forced = tokio::select! {
                _ = self.polls.tick() => false,
                Some(()) = hangup => true,
            };
            let now = stamp(&self.path);
            if forced || now != self.seen {
                self.seen = now;
                return;
            }
        }
    }
}

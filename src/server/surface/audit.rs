//! The audit trail on the server: who a request comes from (`Who`, which
//! both ports' guards hand on), the records the API and the guards write,
//! and the reads of the trail. A change the engine makes carries its record
//! into the same step (`EngineHandle::*_recorded`); anything else (a
//! refusal, a sign-in, a request that changed nothing in the engine) is
//! written on its own, durable before the answer leaves. Nothing here, nor
//! anywhere in the API, rewrites or removes a record: only retention does.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::access::{Caller, Refusal, Role};
use crate::clock::Clock;
use crate::engine::EngineHandle;
use crate::model::audit::{self, Filter, Record};

/// Who made a request: the credential's name and role (none when the
/// credential is not known), and its address; and whether the request
/// has been recorded (clones share it), so that the HTTP guard records a
/// write refused before it reached the API.
#[derive(Clone, Debug)]
pub(crate) struct Who {
    pub(crate) name: Arc<str>,
    pub(crate) role: Option<Role>,
    pub(crate) from: Option<IpAddr>,
    recorded: Arc<AtomicBool>,
}

impl Who {
    pub(crate) fn of(caller: &Caller, from: Option<IpAddr>) -> Who {
        Who { name: caller.name.clone(), role: Some(caller.role), from, recorded: Arc::default() }
    }

    /// Whether a record of this request was begun.
    pub(crate) fn is_recorded(&self) -> bool {
        self.recorded.load(Ordering::Relaxed)
    }

    /// A caller whose credential is not known.
    pub(crate) fn unknown(from: Option<IpAddr>) -> Who {
        Who { name: "unknown".into(), role: None, from, recorded: Arc::default() }
    }

    /// The caller a refusal names, if it names one.
    pub(crate) fn refused(refusal: &Refusal, from: Option<IpAddr>) -> Who {
        match refusal {
            Refusal::Unauthenticated => Who::unknown(from),
            Refusal::Forbidden { name, role, .. } => {
                Who { name: name.clone(), role: Some(*role), from, recorded: Arc::default() }
            }
        }
    }

    /// A record of `action` on `target` by this caller, taken at `at_ms`, `ok` until ended otherwise.
    fn record(&self, at_ms: u64, action: &str, target: &str) -> Record {
        Record {
            id: audit::new_id(at_ms),
            at_ms,
            who: self.name.to_string(),
            role: self.role.map(|r| r.name().to_string()).unwrap_or_default(),
            from: self.from.map(|a| a.to_string()).unwrap_or_default(),
            action: action.into(),
            target: target.into(),
            args: Default::default(),
            outcome: audit::OK.into(),
        }
    }
}

/// Writes and reads the trail. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Trail {
    pub(crate) engine: EngineHandle,
    pub(crate) clock: Arc<dyn Clock>,
}

impl Trail {
    /// A record of `action` on `target` by `who`, now.
    pub(crate) fn begin(&self, who: &Who, action: &str, target: &str) -> Record {
        let at_ms = u64::try_from(self.clock.now().as_millis()).unwrap_or(0);
        who.recorded.store(true, Ordering::Relaxed);
        who.record(at_ms, action, target)
    }

    /// Writes a record on its own; it is durable when this returns. A
    /// store that takes no write is logged (the request's own answer says
    /// the same).
    pub(crate) async fn write(&self, record: Record) {
        let (action, who) = (record.action.clone(), record.who.clone());
        if let Err(e) = self.engine.put_settings(vec![record.entry().into_setting()]).await {
            tracing::warn!(error = %e, action, who, "an audit record could not be written");
        }
    }

    /// Writes the record of a request that ended with `result`: `ok`, or the error.
    pub(crate) async fn end<T, E: std::fmt::Display>(&self, record: Record, result: &Result<T, E>) {
        let record = match result {
            Ok(_) => record,
            Err(e) => record.ended(e.to_string()),
        };
        self.write(record).await;
    }

    /// Writes the record of a request that failed; one that succeeded was
    /// written with its change.
    pub(crate) async fn refused<T, E: std::fmt::Display>(&self, record: Record, result: &Result<T, E>) {
        if let Err(e) = result {
            self.write(record.ended(e.to_string())).await;
        }
    }

    /// The records `filter` takes, oldest first.
    pub(crate) async fn read(&self, filter: Filter) -> Result<Vec<Record>, crate::store::Error> {
        let store = self.engine.store().clone();
        tokio::task::spawn_blocking(move || Ok(filter.select(&store.settings(audit::PREFIX)?)))
            .await
            .map_err(|e| crate::store::Error::Io(e.to_string()))?
    }
}

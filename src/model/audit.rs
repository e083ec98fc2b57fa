//! The audit trail's record: who did what, from where, and how it ended.
//!
//! Each record is a setting of its own under `audit/`, keyed by a UUIDv7 so
//! that key order is time order across instances; it is written once (with
//! the change it records, when there is one) and never rewritten. What
//! retention removes is chosen here too, without I/O.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The settings prefix of the audit trail.
pub const PREFIX: &str = "audit/";

/// One audited request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// UUIDv7: its time and its place in the trail.
    pub id: uuid::Uuid,
    /// When the request was taken, ms since the epoch.
    pub at_ms: u64,
    /// The credential's name or the certificate's identity; `unknown` for
    /// a credential that is not known.
    pub who: String,
    /// The role it had (empty when not known).
    pub role: String,
    /// The address the request came from.
    pub from: String,
    /// What was asked, `noun.verb` (`job.cancel`, `policy.set`, `session.sign_in`).
    pub action: String,
    /// What it was asked of: a job id, a job type; empty when nothing in particular.
    pub target: String,
    /// Its arguments, secrets left out.
    #[serde(default)]
    pub args: BTreeMap<String, String>,
    /// `ok`, or why it was refused or failed.
    pub outcome: String,
}

/// A record as the store keeps it: its key and its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub bytes: Vec<u8>,
}

impl Entry {
    pub fn into_setting(self) -> (String, Option<Vec<u8>>) {
        (self.key, Some(self.bytes))
    }
}

/// The outcome of what succeeded.
pub const OK: &str = "ok";

/// Argument names whose values are never recorded.
const SECRET_WORDS: [&str; 5] = ["secret", "password", "token", "credential", "private"];

impl Record {
    pub fn key(&self) -> String {
        format!("{PREFIX}{}", self.id)
    }

    pub fn is_ok(&self) -> bool {
        self.outcome == OK
    }

    pub fn entry(&self) -> Entry {
        Entry { key: self.key(), bytes: serde_json::to_vec(self).expect("an audit record is JSON") }
    }

    /// The same request, ended otherwise.
    pub fn ended(mut self, outcome: impl Into<String>) -> Record {
        self.outcome = outcome.into();
        self
    }

    /// The same request, of `target`.
    pub fn on(mut self, target: &str) -> Record {
        self.target = target.into();
        self
    }

    /// Adds an argument; a value whose name speaks of a secret is left out.
    pub fn arg(mut self, name: &str, value: impl Into<String>) -> Record {
        let lower = name.to_ascii_lowercase();
        let value = if SECRET_WORDS.iter().any(|w| lower.contains(w)) { "(not recorded)".into() } else { value.into() };
        self.args.insert(name.to_string(), value);
        self
    }

    pub fn decode(bytes: &[u8]) -> Option<Record> {
        serde_json::from_slice(bytes).ok()
    }
}

/// Which records a reader wants, oldest first.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Taken at or after this time, ms since the epoch.
    pub since_ms: Option<u64>,
    /// By this credential or certificate.
    pub who: Option<String>,
    /// At most this many: the newest of those that match.
    pub limit: Option<usize>,
}

impl Filter {
    pub fn matches(&self, record: &Record) -> bool {
        self.since_ms.is_none_or(|since| record.at_ms >= since) && self.who.as_ref().is_none_or(|w| *w == record.who)
    }

    /// The records of `stored` (key order) that match, oldest first; a
    /// value that cannot be read is skipped.
    pub fn select(&self, stored: &[(String, Vec<u8>)]) -> Vec<Record> {
        let mut records: Vec<Record> =
            stored.iter().filter_map(|(_, bytes)| Record::decode(bytes)).filter(|r| self.matches(r)).collect();
        if let Some(limit) = self.limit {
            let skip = records.len().saturating_sub(limit);
            records.drain(..skip);
        }
        records
    }
}

/// How long the trail is kept, and how much of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keep {
    /// A record older than this goes.
    pub age: Duration,
    /// Beyond this many newest records, older ones go.
    pub count: usize,
}

impl Default for Keep {
    fn default() -> Keep {
        Keep { age: Duration::from_secs(90 * 24 * 3600), count: 100_000 }
    }
}

/// The keys (in key order, as `settings` lists them) that `keep` removes at `now_ms`.
pub fn expired(keys: &[String], now_ms: u64, keep: Keep) -> Vec<String> {
    let oldest_kept = now_ms.saturating_sub(u64::try_from(keep.age.as_millis()).unwrap_or(u64::MAX));
    let beyond = keys.len().saturating_sub(keep.count);
    keys.iter()
        .enumerate()
        .filter(|(i, key)| *i < beyond || time_of(key).is_some_and(|at| at < oldest_kept))
        .map(|(_, key)| key.clone())
        .collect()
}

/// A key's time, ms since the epoch, from its UUIDv7.
fn time_of(key: &str) -> Option<u64> {
    let id: uuid::Uuid = key.strip_prefix(PREFIX)?.parse().ok()?;
    let (seconds, nanos) = id.get_timestamp()?.to_unix();
    Some(seconds * 1000 + u64::from(nanos) / 1_000_000)
}

/// A new record's id at `at_ms`.
pub fn new_id(at_ms: u64) -> uuid::Uuid {
    let ts = uuid::Timestamp::from_unix(uuid::NoContext, at_ms / 1000, ((at_ms % 1000) * 1_000_000) as u32);
    uuid::Uuid::new_v7(ts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(at_ms: u64, who: &str) -> Record {
        Record {
            id: new_id(at_ms),
            at_ms,
            who: who.into(),
            role: "operator".into(),
            from: "127.0.0.1".into(),
            action: "job.cancel".into(),
            target: String::new(),
            args: BTreeMap::new(),
            outcome: OK.into(),
        }
    }

    #[test]
    fn a_record_reads_back_as_written_and_its_key_sorts_by_time() {
        let early = record(1_700_000_000_000, "ana");
        let late = record(1_700_000_000_001, "ana");
        assert_eq!(Record::decode(&early.entry().bytes), Some(early.clone()));
        assert!(early.key() < late.key());
        assert_eq!(time_of(&early.key()), Some(1_700_000_000_000));
    }

    #[test]
    fn secrets_are_never_recorded() {
        let r = record(1, "ana").arg("s3_secret_key", "hunter2").arg("Password", "x").arg("job_type", "vacuum");
        assert_eq!(r.args["s3_secret_key"], "(not recorded)");
        assert_eq!(r.args["Password"], "(not recorded)");
        assert_eq!(r.args["job_type"], "vacuum");
        assert!(!String::from_utf8(r.entry().bytes).unwrap().contains("hunter2"));
    }

    #[test]
    fn a_filter_takes_by_time_and_by_who_and_keeps_the_newest() {
        let stored: Vec<(String, Vec<u8>)> = [(10, "ana"), (20, "bo"), (30, "ana"), (40, "ana")]
            .into_iter()
            .map(|(at, who)| {
                let e = record(at, who).entry();
                (e.key, e.bytes)
            })
            .chain([("audit/broken".to_string(), b"{".to_vec())])
            .collect();
        let at = |records: Vec<Record>| records.iter().map(|r| r.at_ms).collect::<Vec<_>>();
        assert_eq!(at(Filter::default().select(&stored)), [10, 20, 30, 40]);
        assert_eq!(at(Filter { since_ms: Some(20), ..Filter::default() }.select(&stored)), [20, 30, 40]);
        assert_eq!(at(Filter { who: Some("ana".into()), ..Filter::default() }.select(&stored)), [10, 30, 40]);
        let newest = Filter { who: Some("ana".into()), limit: Some(2), ..Filter::default() };
        assert_eq!(at(newest.select(&stored)), [30, 40]);
    }

    #[test]
    fn retention_removes_what_is_too_old_and_what_is_beyond_the_count() {
        let day = 24 * 3600 * 1000;
        let now = 100 * day;
        let keys: Vec<String> = [now - 10 * day, now - 3 * day, now - 2 * day, now - day, now]
            .into_iter()
            .map(|at| record(at, "ana").key())
            .collect();
        let keep = Keep { age: Duration::from_secs(5 * 24 * 3600), count: 10 };
        assert_eq!(expired(&keys, now, keep), keys[..1]);
        let keep = Keep { age: Duration::from_secs(50 * 24 * 3600), count: 2 };
        assert_eq!(expired(&keys, now, keep), keys[..3]);
        assert!(expired(&keys, now, Keep::default()).is_empty());
    }
}

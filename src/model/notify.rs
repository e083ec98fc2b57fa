//! Webhook notifications as the outbox keeps them: the kinds of event, which
//! endpoints want each kind (`Routes`), and the event itself.
//!
//! Each event is a setting of its own under `outbox/`, keyed by a UUIDv7 so
//! that key order is time order; its value names the endpoints it still
//! goes to. A job's end is written in the same engine step as the end
//! itself (`job_ended`, pure: its id is made of the step's time and the
//! job's id, no clock and no randomness); the other kinds are written where
//! they are seen. Delivery takes an endpoint off once it answered 2xx, and
//! removes the event with the last.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{JobRecord, JobState};
use crate::clock::Timestamp;

/// The settings prefix of the outbox.
pub const PREFIX: &str = "outbox/";

/// At most this many failed tasks are named in a job's event.
pub const MOST_TASKS_NAMED: usize = 20;

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Kind {
    #[serde(rename = "job.failed")]
    JobFailed,
    /// Sent only to the endpoints that ask for it.
    #[serde(rename = "job.succeeded")]
    JobSucceeded,
    #[serde(rename = "recovery.findings")]
    RecoveryFindings,
    #[serde(rename = "instance.lost")]
    InstanceLost,
    /// A worker lost while it ran work.
    #[serde(rename = "worker.lost")]
    WorkerLost,
    #[serde(rename = "detection.failed")]
    DetectionFailed,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::JobFailed,
        Kind::JobSucceeded,
        Kind::RecoveryFindings,
        Kind::InstanceLost,
        Kind::WorkerLost,
        Kind::DetectionFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::JobFailed => "job.failed",
            Kind::JobSucceeded => "job.succeeded",
            Kind::RecoveryFindings => "recovery.findings",
            Kind::InstanceLost => "instance.lost",
            Kind::WorkerLost => "worker.lost",
            Kind::DetectionFailed => "detection.failed",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Kind {
    type Err = String;

    fn from_str(text: &str) -> Result<Kind, String> {
        Kind::ALL.into_iter().find(|k| k.as_str() == text).ok_or_else(|| {
            let known: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
            format!("unknown event {text:?}: an event is one of {}", known.join(", "))
        })
    }
}

/// Which endpoints (by name) want each kind of event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Routes {
    by_kind: BTreeMap<Kind, Vec<String>>,
}

impl Routes {
    /// From each endpoint's name and the kinds it asks for.
    pub fn new<'a>(endpoints: impl IntoIterator<Item = (&'a str, &'a [Kind])>) -> Routes {
        let mut by_kind: BTreeMap<Kind, Vec<String>> = BTreeMap::new();
        for (name, kinds) in endpoints {
            for kind in kinds {
                let names = by_kind.entry(*kind).or_default();
                if !names.iter().any(|n| n == name) {
                    names.push(name.to_string());
                }
            }
        }
        Routes { by_kind }
    }

    /// The endpoints an event of `kind` goes to, in the file's order.
    pub fn endpoints(&self, kind: Kind) -> &[String] {
        self.by_kind.get(&kind).map(Vec::as_slice).unwrap_or_default()
    }

    pub fn wants(&self, kind: Kind) -> bool {
        !self.endpoints(kind).is_empty()
    }
}

/// One event in the outbox.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// UUIDv7: its time and its place in the outbox; the idempotency key of
    /// every delivery of it.
    pub id: uuid::Uuid,
    pub kind: Kind,
    /// When it happened, ms since the epoch.
    pub at_ms: u64,
    /// What happened, by kind (operations.md, "Notifications").
    pub payload: serde_json::Value,
    /// The endpoints it has still to reach.
    pub endpoints: Vec<String>,
}

/// What an endpoint receives: the event without the endpoints it goes to.
#[derive(Serialize)]
struct Body<'a> {
    id: &'a uuid::Uuid,
    kind: Kind,
    at_ms: u64,
    payload: &'a serde_json::Value,
}

impl Event {
    /// An event of `kind` for the endpoints that want it; `None` when none does.
    pub fn new(id: uuid::Uuid, kind: Kind, at_ms: u64, payload: serde_json::Value, routes: &Routes) -> Option<Event> {
        routes.wants(kind).then(|| Event { id, kind, at_ms, payload, endpoints: routes.endpoints(kind).to_vec() })
    }

    pub fn key(&self) -> String {
        format!("{PREFIX}{}", self.id)
    }

    /// The setting that keeps it (or, without endpoints left, removes it).
    pub fn into_setting(self) -> (String, Option<Vec<u8>>) {
        let key = self.key();
        if self.endpoints.is_empty() {
            return (key, None);
        }
        (key, Some(serde_json::to_vec(&self).expect("an outbox event is JSON")))
    }

    pub fn decode(bytes: &[u8]) -> Option<Event> {
        serde_json::from_slice(bytes).ok()
    }

    /// The JSON an endpoint receives; the same bytes on every try.
    pub fn body(&self) -> Vec<u8> {
        let body = Body { id: &self.id, kind: self.kind, at_ms: self.at_ms, payload: &self.payload };
        serde_json::to_vec(&body).expect("an outbox event is JSON")
    }
}

/// A task of an ended job that did not succeed, as its event names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FailedTask {
    pub id: String,
    pub job_type: String,
    pub attempt: u32,
    pub error: String,
}

/// The event of a job that ended failed or succeeded, for the endpoints that
/// want it; its id is made of the end's time and the job's id, so that the
/// same step always makes the same event. `failed` gives every task that
/// failed, asked only when an endpoint wants the event (the first
/// [`MOST_TASKS_NAMED`] are named).
pub fn job_ended(
    record: &JobRecord,
    failed: impl FnOnce() -> Vec<FailedTask>,
    routes: &Routes,
    now: Timestamp,
) -> Option<Event> {
    let kind = match record.state {
        JobState::Failed => Kind::JobFailed,
        JobState::Succeeded => Kind::JobSucceeded,
        _ => return None,
    };
    if !routes.wants(kind) {
        return None;
    }
    let failed = failed();
    let at_ms = u64::try_from(now.as_millis()).unwrap_or(0);
    let job = record.id.0.as_bytes();
    let mut random = [0u8; 10];
    random.copy_from_slice(&job[6..]);
    let id = uuid::Builder::from_unix_timestamp_millis(at_ms, &random).into_uuid();
    let failed_total = failed.len();
    let named: Vec<FailedTask> = failed.into_iter().take(MOST_TASKS_NAMED).collect();
    let payload = serde_json::json!({
        "job": {
            "id": record.id.to_string(),
            "name": record.name,
            "state": record.state.as_str(),
            "tasks": record.n_tasks,
            "created_at_ms": record.created_at.as_millis(),
            "finished_at_ms": at_ms,
        },
        "failed_tasks": named,
        "failed_tasks_total": failed_total,
    });
    Event::new(id, kind, at_ms, payload, routes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{JobId, JobOrigin};

    fn record(state: JobState) -> JobRecord {
        JobRecord {
            id: JobId::new(),
            name: "nightly".into(),
            state,
            origin: JobOrigin::User,
            n_tasks: 3,
            fingerprint: [0; 32],
            created_at: Timestamp(1_000),
            updated_at: Timestamp(2_000),
            finished_at: Some(Timestamp(2_000)),
            cancel_requested: false,
            handler: None,
        }
    }

    #[test]
    fn an_event_goes_to_the_endpoints_that_ask_for_its_kind_and_success_only_when_asked() {
        let ops = [Kind::JobFailed, Kind::WorkerLost];
        let all = [Kind::JobFailed, Kind::JobSucceeded];
        let routes = Routes::new([("ops", &ops[..]), ("audit", &all[..])]);
        assert_eq!(routes.endpoints(Kind::JobFailed), ["ops", "audit"]);
        assert_eq!(routes.endpoints(Kind::JobSucceeded), ["audit"]);
        assert!(!routes.wants(Kind::DetectionFailed));
        let failed = job_ended(&record(JobState::Failed), Vec::new, &routes, Timestamp(2_000)).unwrap();
        assert_eq!((failed.kind, failed.endpoints.clone()), (Kind::JobFailed, vec!["ops".into(), "audit".into()]));
        let only_failures = Routes::new([("ops", &ops[..])]);
        assert_eq!(job_ended(&record(JobState::Succeeded), Vec::new, &only_failures, Timestamp(2_000)), None);
        assert_eq!(job_ended(&record(JobState::Canceled), Vec::new, &routes, Timestamp(2_000)), None);
        assert_eq!(job_ended(&record(JobState::Failed), Vec::new, &Routes::default(), Timestamp(2_000)), None);
    }

    #[test]
    fn a_jobs_event_is_the_same_for_the_same_step_and_names_at_most_twenty_tasks() {
        let kinds = [Kind::JobFailed];
        let routes = Routes::new([("ops", &kinds[..])]);
        let job = record(JobState::Failed);
        let task =
            |i: usize| FailedTask { id: format!("t{i}"), job_type: "noop".into(), attempt: 1, error: "no".into() };
        let failed: Vec<FailedTask> = (0..25).map(task).collect();
        let one = job_ended(&job, || failed.clone(), &routes, Timestamp(5_000)).unwrap();
        let again = job_ended(&job, || failed, &routes, Timestamp(5_000)).unwrap();
        assert_eq!(one, again);
        assert_eq!(one.id.get_version_num(), 7);
        assert_eq!(one.payload["failed_tasks"].as_array().unwrap().len(), MOST_TASKS_NAMED);
        assert_eq!(one.payload["failed_tasks_total"], 25);
        assert_eq!(one.payload["job"]["name"], "nightly");
        let later = job_ended(&job, Vec::new, &routes, Timestamp(6_000)).unwrap();
        assert!(later.key() > one.key(), "key order is time order");
    }

    #[test]
    fn an_event_without_endpoints_left_is_removed_and_its_body_leaves_them_out() {
        let kinds = [Kind::DetectionFailed];
        let routes = Routes::new([("ops", &kinds[..])]);
        let id = uuid::Uuid::now_v7();
        let mut event =
            Event::new(id, Kind::DetectionFailed, 7, serde_json::json!({"job_type": "vacuum"}), &routes).unwrap();
        let (key, bytes) = event.clone().into_setting();
        assert_eq!(key, format!("outbox/{id}"));
        assert_eq!(Event::decode(&bytes.unwrap()).as_ref(), Some(&event));
        let body: serde_json::Value = serde_json::from_slice(&event.body()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"id": id, "kind": "detection.failed", "at_ms": 7, "payload": {"job_type": "vacuum"}})
        );
        event.endpoints.clear();
        assert_eq!(event.into_setting(), (format!("outbox/{id}"), None));
        assert_eq!("job.failed".parse::<Kind>(), Ok(Kind::JobFailed));
        assert!("job.exploded".parse::<Kind>().unwrap_err().starts_with("unknown event \"job.exploded\""));
    }
}

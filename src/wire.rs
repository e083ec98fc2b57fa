//! Conventions shared by the admin server, its workers and its clients:
//! how a task attempt is named on the worker stream, how JSON parameters
//! map to the stream's typed `ConfigValue`s and back, and how a client finds
//! the gRPC port behind an admin's HTTP address.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Number, Value};

use crate::model::Priority;
use crate::proto::api;
use crate::proto::plugin::{config_value::Kind, ConfigValue, JobPriority};

/// A label the admin sets on a `JobSpec` to give the task's id in its job
/// (`TaskContext::task_id`); without it the task index stands in.
pub const TASK_ID_LABEL: &str = "jobcenter.task_id";
/// A label the admin sets on a `JobSpec` to give the job's name
/// (`TaskContext::job_name`); without it the spec's summary stands in.
pub const JOB_NAME_LABEL: &str = "jobcenter.job_name";
/// A label the admin sets on a `JobSpec`, when it exports traces, to the
/// W3C `traceparent` of the attempt's span: the worker's execution span
/// joins it as its child. A worker that knows nothing of it (a `weed
/// worker`) takes it for one more label.
pub const TRACEPARENT_LABEL: &str = "traceparent";
/// The job type of the periodic recovery check, run as a cluster task.
pub const RECOVERY_CHECK_JOB_TYPE: &str = "recovery_check";
/// The HTTP path that tells a worker which port the worker stream listens on.
pub const PLUGIN_STATUS_PATH: &str = "/api/plugin/status";
/// Without an answer from `PLUGIN_STATUS_PATH`, the gRPC port is the HTTP port plus this.
pub const GRPC_PORT_OFFSET: u16 = 10_000;
/// What a SeaweedFS worker answers when it has no free execution slot.
pub const AT_CAPACITY: &str = "executor is at capacity";

/// Hello metadata a jobcenter worker sets to its lease, in milliseconds. Such
/// a worker keeps running its work when its stream breaks, gives each
/// attempt up once it has reached no admin for its lease, and keeps each
/// outcome until an admin acknowledges it. A worker without it (a SeaweedFS
/// worker) gets none of the messages below.
pub const LEASE_METADATA: &str = "jobcenter.lease_ms";
/// The `request_id` prefix of the admin's answer to the hello and to each
/// heartbeat of a worker with a lease: an `AdminToWorkerMessage` without a
/// body, `jobcenter.lease/N`, that renews the lease as of the moment the
/// worker sent heartbeat N (0: its hello). The worker counts its lease from
/// that moment, not from the renewal's arrival, and the admin from when the
/// heartbeat arrived: a renewal held up on the way never stretches the
/// worker's lease past the admin's count.
pub const LEASE_RENEWAL: &str = "jobcenter.lease";
/// Heartbeat metadata a worker with a lease sets, while the lease binds
/// (it runs executions under it), to how many milliseconds of it are left
/// as it sends: what an admin that cannot tell yet whether an attempt is
/// covered may take to find out.
pub const LEASE_LEFT_METADATA: &str = "jobcenter.lease_left_ms";

/// The lease a heartbeat says is left, if it says.
pub fn lease_left_of(metadata: &BTreeMap<String, String>) -> Option<Duration> {
    metadata.get(LEASE_LEFT_METADATA)?.trim().parse().ok().map(Duration::from_millis)
}

/// Heartbeat metadata a worker with a lease sets to the heartbeat's number
/// in its session (1, 2, ...), which the renewal names.
pub const HEARTBEAT_METADATA: &str = "jobcenter.heartbeat";

/// The renewal of the lease as of heartbeat `heartbeat` (0: the hello).
pub fn lease_renewal(heartbeat: u64) -> String {
    format!("{LEASE_RENEWAL}/{heartbeat}")
}

/// The heartbeat a renewal names, if `request_id` is a renewal.
pub fn parse_lease_renewal(request_id: &str) -> Option<u64> {
    request_id.strip_prefix(LEASE_RENEWAL)?.strip_prefix('/')?.parse().ok()
}
/// The `request_id` prefix of the admin's acknowledgement of an outcome, an
/// `AdminToWorkerMessage` without a body: `jobcenter.outcome/ATTEMPT_ID/applied`
/// once the step behind it is durable, or `.../refused/REASON`. Either way
/// the worker forgets the outcome.
pub const OUTCOME_ACK: &str = "jobcenter.outcome";
/// The error of an execution that a worker gave back because it is stopping.
pub const STOPPING: &str = "given back: the worker is stopping";
/// The reason of the cancel an admin sends for an attempt a worker runs
/// that nothing covers there (`server/workers/cover.rs`), so that the rest
/// of the worker's lease can be renewed; and the error of the execution so
/// canceled. The attempt is given back, not failed: the task runs again.
pub const UNCOVERED: &str = "given back: the worker's lease could not be renewed with it";
/// The error of an execution that a worker gave up when its lease ran out.
pub const LEASE_EXPIRED: &str = "abandoned: the worker reached no admin within its lease";

/// How long the admin keeps the attempts of a worker with `lease` after its
/// stream ended: the lease, plus a margin for the worker to stop them.
pub fn take_back_after(lease: Duration) -> Duration {
    lease + (lease / 4).max(Duration::from_millis(500))
}

/// A worker's lease from its hello metadata, if it declares one.
pub fn lease_of(metadata: &BTreeMap<String, String>) -> Result<Option<Duration>, String> {
    match metadata.get(LEASE_METADATA) {
        None => Ok(None),
        Some(text) => match text.trim().parse::<u64>() {
            Ok(millis) if millis > 0 => Ok(Some(Duration::from_millis(millis))),
            _ => Err(format!(
                "hello: metadata {LEASE_METADATA} is {text:?}; it must be a whole number of milliseconds above 0"
            )),
        },
    }
}

/// An outcome's acknowledgement, as `request_id`.
pub fn outcome_ack(attempt: &str, refused: Option<&str>) -> String {
    // Joined rather than formatted: one is sent for every report.
    match refused {
        None => [OUTCOME_ACK, "/", attempt, "/applied"].concat(),
        Some(reason) => [OUTCOME_ACK, "/", attempt, "/refused/", reason].concat(),
    }
}

/// Reads back an `outcome_ack`: the attempt id, and the refusal if it was refused.
pub fn parse_outcome_ack(request_id: &str) -> Option<(&str, Option<&str>)> {
    let rest = request_id.strip_prefix(OUTCOME_ACK)?.strip_prefix('/')?;
    let (attempt, verdict) = rest.split_once('/')?;
    match verdict {
        "applied" => Some((attempt, None)),
        _ => Some((attempt, Some(verdict.strip_prefix("refused/")?))),
    }
}

/// Reads a shared token from the first line of a file (for servers, clients and workers).
pub fn read_token(path: &std::path::Path) -> std::io::Result<String> {
    let text = std::fs::read_to_string(path)?;
    Ok(text.lines().next().unwrap_or("").trim().to_string())
}

pub fn priority_to_wire(priority: Priority) -> JobPriority {
    match priority {
        Priority::Low => JobPriority::Low,
        Priority::Normal => JobPriority::Normal,
        Priority::High => JobPriority::High,
        Priority::Critical => JobPriority::Critical,
    }
}

pub fn priority_from_wire(priority: i32) -> Priority {
    match JobPriority::try_from(priority) {
        Ok(JobPriority::Low) => Priority::Low,
        Ok(JobPriority::High) => Priority::High,
        Ok(JobPriority::Critical) => Priority::Critical,
        _ => Priority::Normal,
    }
}

/// Keys that mark the JSON form of the typed values JSON has no type for.
const BYTES_KEY: &str = "$bytes";
const DURATION_KEY: &str = "$duration_ms";

/// A JSON parameters object as the stream's typed values. Integers become
/// `int64`, other numbers `double`, lists of one scalar type the typed list,
/// other lists and objects nested values; `null` members are left out.
pub fn json_to_values(parameters: &Map<String, Value>) -> BTreeMap<String, ConfigValue> {
    parameters.iter().filter_map(|(k, v)| json_to_value(v).map(|v| (k.clone(), v))).collect()
}

pub fn json_to_value(value: &Value) -> Option<ConfigValue> {
    use crate::proto::plugin::{BoolList, DoubleList, Int64List, StringList, ValueList, ValueMap};
    let kind = match value {
        Value::Null => return None,
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Kind::Int64Value(i),
            None => Kind::DoubleValue(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_string) => {
            Kind::StringList(StringList { values: items.iter().filter_map(|v| v.as_str().map(String::from)).collect() })
        }
        Value::Array(items) if !items.is_empty() && items.iter().all(|v| v.as_i64().is_some()) => {
            Kind::Int64List(Int64List { values: items.iter().filter_map(Value::as_i64).collect() })
        }
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_number) => {
            Kind::DoubleList(DoubleList { values: items.iter().filter_map(Value::as_f64).collect() })
        }
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_boolean) => {
            Kind::BoolList(BoolList { values: items.iter().filter_map(Value::as_bool).collect() })
        }
        Value::Array(items) => Kind::ListValue(ValueList { values: items.iter().filter_map(json_to_value).collect() }),
        Value::Object(map) => {
            let bytes = match (map.len(), map.get(BYTES_KEY)) {
                (1, Some(Value::String(encoded))) => decode_hex(encoded),
                _ => None,
            };
            if let Some(bytes) = bytes {
                // `{"$bytes": HEX}`; anything else (bad hex included) stays a map, visibly.
                Kind::BytesValue(bytes)
            } else if let (1, Some(millis)) = (map.len(), map.get(DURATION_KEY).and_then(Value::as_i64)) {
                Kind::DurationValue(prost_types::Duration {
                    seconds: millis.div_euclid(1000),
                    nanos: (millis.rem_euclid(1000) * 1_000_000) as i32,
                })
            } else {
                Kind::MapValue(ValueMap { fields: json_to_values(map) })
            }
        }
    };
    Some(ConfigValue { kind: Some(kind) })
}

/// The stream's typed values as a JSON object, the inverse of `json_to_values`
/// for every kind JSON can hold; bytes and durations take a tagged form.
pub fn values_to_json(values: &BTreeMap<String, ConfigValue>) -> Map<String, Value> {
    values.iter().map(|(k, v)| (k.clone(), value_to_json(v))).collect()
}

pub fn value_to_json(value: &ConfigValue) -> Value {
    let Some(kind) = &value.kind else { return Value::Null };
    match kind {
        Kind::BoolValue(b) => Value::Bool(*b),
        Kind::Int64Value(i) => Value::Number((*i).into()),
        Kind::DoubleValue(d) => Number::from_f64(*d).map(Value::Number).unwrap_or(Value::Null),
        Kind::StringValue(s) => Value::String(s.clone()),
        Kind::BytesValue(bytes) => serde_json::json!({ BYTES_KEY: encode_hex(bytes) }),
        Kind::DurationValue(d) => {
            serde_json::json!({ DURATION_KEY: d.seconds * 1000 + i64::from(d.nanos) / 1_000_000 })
        }
        Kind::StringList(l) => Value::Array(l.values.iter().cloned().map(Value::String).collect()),
        Kind::Int64List(l) => Value::Array(l.values.iter().map(|i| Value::Number((*i).into())).collect()),
        Kind::DoubleList(l) => {
            Value::Array(l.values.iter().filter_map(|d| Number::from_f64(*d)).map(Value::Number).collect())
        }
        Kind::BoolList(l) => Value::Array(l.values.iter().map(|b| Value::Bool(*b)).collect()),
        Kind::ListValue(l) => Value::Array(l.values.iter().map(value_to_json).collect()),
        Kind::MapValue(m) => Value::Object(values_to_json(&m.fields)),
    }
}

fn encode_hex(bytes: &[u8]) -> String {
    crate::model::hex(bytes)
}

pub fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

/// An admin address given as its gRPC address, with no lookup: `grpc://host:port`.
pub const GRPC_SCHEME: &str = "grpc://";

/// Resolves the gRPC address behind an admin's HTTP `host:port`: asks
/// `PLUGIN_STATUS_PATH` for `worker_grpc_port`, and falls back to the HTTP
/// port plus `GRPC_PORT_OFFSET`. `grpc://host:port` is taken as it is.
pub async fn resolve_grpc_address(admin: &str) -> Result<String, AddressError> {
    if let Some(address) = admin.strip_prefix(GRPC_SCHEME) {
        split_host_port(address)?;
        return Ok(address.to_string());
    }
    let (host, port) = split_host_port(admin)?;
    let port = match fetch_grpc_port(&host, port).await {
        Ok(port) => port,
        Err(e) => {
            tracing::debug!(admin, error = %e, "no plugin status; assuming the gRPC port is the HTTP port + 10000");
            port.checked_add(GRPC_PORT_OFFSET).ok_or(AddressError::NoRoomForOffset(port))?
        }
    };
    Ok(format!("{host}:{port}"))
}

/// An address that cannot be used as `HOST:PORT`.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    #[error("{0:?} is not HOST:PORT")]
    NotHostPort(String),
    #[error("{0:?} has no valid port")]
    BadPort(String),
    #[error("port {0} leaves no room for +10000")]
    NoRoomForOffset(u16),
}

pub fn split_host_port(address: &str) -> Result<(String, u16), AddressError> {
    let (host, port) = address.rsplit_once(':').ok_or_else(|| AddressError::NotHostPort(address.into()))?;
    let port: u16 = port.parse().map_err(|_| AddressError::BadPort(address.into()))?;
    Ok((host.trim_start_matches('[').trim_end_matches(']').to_string(), port))
}

async fn fetch_grpc_port(host: &str, port: u16) -> Result<u16, FetchError> {
    let status = http_get_json(&format!("{host}:{port}"), PLUGIN_STATUS_PATH).await?;
    let port = status.get("worker_grpc_port").and_then(Value::as_u64).unwrap_or(0);
    u16::try_from(port).ok().filter(|p| *p > 0).ok_or(FetchError::Missing("worker_grpc_port"))
}

/// Why a plain HTTP GET of a JSON document gave nothing.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(transparent)]
    Address(#[from] AddressError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("no answer within 3 s")]
    TimedOut(#[from] tokio::time::error::Elapsed),
    #[error("malformed HTTP answer")]
    Malformed,
    #[error("{path} answered {status}")]
    Status { path: String, status: String },
    #[error("the answer is not JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("no {0} in the answer")]
    Missing(&'static str),
}

/// A plain HTTP/1.1 GET of a JSON document from `host:port`, bounded in time and size.
pub async fn http_get_json(address: &str, path: &str) -> Result<Value, FetchError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (host, port) = split_host_port(address)?;
    let connect = tokio::net::TcpStream::connect((host.as_str(), port));
    let mut stream = tokio::time::timeout(Duration::from_secs(3), connect).await??;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(3), stream.take(1024 * 1024).read_to_end(&mut response)).await??;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n").ok_or(FetchError::Malformed)?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        let status = head.lines().next().unwrap_or("").to_string();
        return Err(FetchError::Status { path: path.to_string(), status });
    }
    Ok(serde_json::from_str(body.trim())?)
}

/// Tasks per part when a job travels in parts (`ReadJob`, a watch snapshot).
pub const TASKS_PER_PART: usize = 10_000;

/// The task ranges of a job of `len` tasks sent in parts: at least one part,
/// so that even a job without tasks sends its own fields.
pub fn part_ranges(len: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..len.max(1)).step_by(TASKS_PER_PART).map(move |start| start..(start + TASKS_PER_PART).min(len))
}

/// Puts a job sent in parts back together: a part from task 0 starts a
/// job again, each next one must follow on where the last ended.
#[derive(Debug, Default)]
pub struct JobAssembly {
    job: Option<api::Job>,
}

impl JobAssembly {
    /// Takes the next part; answers the whole job once its last part is in.
    pub fn push(&mut self, part: api::Job) -> Result<Option<api::Job>, String> {
        if part.first_task == 0 {
            self.job = Some(part);
        } else {
            let Some(job) = self.job.as_mut() else {
                return Err(format!(
                    "a part of job {} from task {} came before its first part",
                    part.id, part.first_task
                ));
            };
            if part.id != job.id || part.first_task as usize != job.tasks.len() {
                return Err(format!(
                    "a part of job {} from task {} does not follow on job {} at task {}",
                    part.id,
                    part.first_task,
                    job.id,
                    job.tasks.len()
                ));
            }
            job.tasks.extend(part.tasks);
        }
        let whole = self.job.as_ref().is_some_and(|job| job.tasks.len() >= job.task_count as usize);
        Ok(if whole { self.job.take() } else { None })
    }

    /// The fields of the job being put together (from its first part).
    pub fn pending(&self) -> Option<&api::Job> {
        self.job.as_ref()
    }
}

/// Writes a job that comes in parts as one JSON object, part by part: the
/// job's fields, then `"tasks":[…]`, each part's tasks as they come, so a
/// job of any size is never held whole. `short` keeps what `jobcenter run
/// --json` prints: the job's id, name and state, and each task's id,
/// job type, state, attempt and error.
#[derive(Debug, Default)]
pub struct JobJson {
    short: bool,
    written: usize,
}

impl JobJson {
    pub fn new(short: bool) -> JobJson {
        JobJson { short, written: 0 }
    }

    /// The JSON text of the next part (the object's opening with the first).
    pub fn part(&mut self, mut part: api::Job) -> String {
        let mut out = String::new();
        let tasks = std::mem::take(&mut part.tasks);
        if part.first_task == 0 {
            let fields = if self.short {
                serde_json::json!({ "id": part.id, "name": part.name, "state": part.state })
            } else {
                let mut fields = serde_json::to_value(&part).unwrap_or_default();
                if let Value::Object(fields) = &mut fields {
                    fields.remove("tasks");
                    fields.remove("first_task");
                }
                fields
            };
            let text = fields.to_string();
            out.push_str(text.strip_suffix('}').unwrap_or("{"));
            out.push_str(if text.len() > 2 { ",\"tasks\":[" } else { "\"tasks\":[" });
        }
        for task in &tasks {
            if self.written > 0 {
                out.push(',');
            }
            self.written += 1;
            let text = if self.short {
                serde_json::json!({
                    "id": task.id, "job_type": task.job_type, "state": task.state, "attempt": task.attempt,
                    "error": (!task.error.is_empty()).then_some(&task.error),
                })
                .to_string()
            } else {
                serde_json::to_string(task).unwrap_or_else(|_| "null".into())
            };
            out.push_str(&text);
        }
        out
    }

    /// The object's closing.
    pub fn end(&self) -> &'static str {
        "]}"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_parameters_round_trip_through_typed_values() {
        let json = serde_json::json!({
            "volume_id": 7, "ratio": 0.3, "server": "127.0.0.1:8080", "force": true,
            "servers": ["a", "b"], "ids": [1, 2, 3], "weights": [0.5, 1.5], "flags": [true, false],
            "mixed": [1, "a"], "nested": {"depth": {"x": 1}}, "blob": {"$bytes": "00ff10"},
            "wait": {"$duration_ms": 1500}, "empty": []
        });
        let map = json.as_object().unwrap();
        let values = json_to_values(map);
        assert!(matches!(values["volume_id"].kind, Some(Kind::Int64Value(7))));
        assert!(matches!(values["blob"].kind, Some(Kind::BytesValue(ref b)) if b == &[0, 255, 16]));
        assert!(
            matches!(values["wait"].kind, Some(Kind::DurationValue(ref d)) if d.seconds == 1 && d.nanos == 500_000_000)
        );
        assert_eq!(Value::Object(values_to_json(&values)), json);
    }

    #[test]
    fn outcome_acknowledgements_round_trip() {
        let task = crate::model::TaskRef { job: crate::model::JobId::new(), idx: crate::model::TaskIdx(4) };
        let id = crate::model::AttemptId::new(task, 2).to_string();
        assert_eq!(parse_outcome_ack(&outcome_ack(&id, None)), Some((id.as_str(), None)));
        let refused = outcome_ack(&id, Some("stale attempt: the task is on attempt 3"));
        assert_eq!(parse_outcome_ack(&refused), Some((id.as_str(), Some("stale attempt: the task is on attempt 3"))));
        assert_eq!(parse_outcome_ack("jobcenter.outcome/x/maybe"), None);
        assert_eq!(parse_outcome_ack(LEASE_RENEWAL), None);
        assert_eq!(parse_outcome_ack(&lease_renewal(3)), None);
        assert_eq!(parse_lease_renewal(&lease_renewal(3)), Some(3));
        assert_eq!(parse_lease_renewal(&lease_renewal(0)), Some(0));
        assert_eq!(parse_lease_renewal(LEASE_RENEWAL), None);
        assert_eq!(parse_lease_renewal("jobcenter.lease/x"), None);
        assert_eq!(parse_lease_renewal(&outcome_ack("a", None)), None);
    }

    #[test]
    fn leases_come_from_the_hello_and_leave_a_margin() {
        let with = |v: &str| BTreeMap::from([(LEASE_METADATA.to_string(), v.to_string())]);
        assert_eq!(lease_of(&BTreeMap::new()), Ok(None));
        assert_eq!(lease_of(&with("20000")), Ok(Some(Duration::from_secs(20))));
        assert!(lease_of(&with("0")).is_err());
        assert!(lease_of(&with("soon")).is_err());
        assert_eq!(take_back_after(Duration::from_secs(20)), Duration::from_secs(25));
        assert_eq!(take_back_after(Duration::from_secs(1)), Duration::from_millis(1500));
    }

    #[test]
    fn splits_host_and_port() {
        assert_eq!(split_host_port("127.0.0.1:23646").unwrap(), ("127.0.0.1".to_string(), 23646));
        assert_eq!(split_host_port("[::1]:80").unwrap(), ("::1".to_string(), 80));
        assert!(split_host_port("localhost").is_err());
    }

    fn part(first_task: u32, ids: &[&str], count: u32) -> api::Job {
        let tasks = ids.iter().map(|id| api::Task { id: id.to_string(), ..api::Task::default() }).collect();
        api::Job { id: "j".into(), first_task, task_count: count, tasks, ..api::Job::default() }
    }

    #[test]
    fn a_job_in_parts_comes_back_whole_and_in_order() {
        let mut assembly = JobAssembly::default();
        let mut first = part(0, &["a", "b"], 5);
        first.state = "running".into();
        assert_eq!(assembly.push(first).unwrap(), None);
        assert_eq!(assembly.push(part(2, &["c", "d"], 5)).unwrap(), None);
        let job = assembly.push(part(4, &["e"], 5)).unwrap().expect("the last part completes the job");
        assert_eq!(job.state, "running");
        assert_eq!(job.tasks.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["a", "b", "c", "d", "e"]);
        assert!(assembly.pending().is_none());
        // A job in one part (or from a server that sends no count) is whole at once.
        assert!(assembly.push(part(0, &["a"], 0)).unwrap().is_some());
    }

    #[test]
    fn a_part_out_of_place_is_an_error_and_a_new_first_part_starts_again() {
        let mut assembly = JobAssembly::default();
        let err = assembly.push(part(2, &["c"], 3)).unwrap_err();
        assert!(err.contains("came before its first part"), "{err}");
        assembly.push(part(0, &["a"], 3)).unwrap();
        let err = assembly.push(part(2, &["c"], 3)).unwrap_err();
        assert!(err.contains("from task 2 does not follow on job j at task 1"), "{err}");
        // A fresh snapshot in the middle replaces what was gathered.
        assembly.push(part(0, &["x", "y"], 3)).unwrap();
        let job = assembly.push(part(2, &["z"], 3)).unwrap().unwrap();
        assert_eq!(job.tasks.len(), 3);
        assert_eq!(job.tasks[0].id, "x");
    }

    #[test]
    fn a_job_in_parts_is_written_as_one_json_object() {
        for short in [false, true] {
            let mut writer = JobJson::new(short);
            let mut first = part(0, &["a", "b"], 3);
            first.name = "nine".into();
            let mut text = writer.part(first);
            text += &writer.part(part(2, &["c"], 3));
            text += writer.end();
            let job: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert_eq!(job["name"], "nine");
            let ids: Vec<&str> = job["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
            assert_eq!(ids, ["a", "b", "c"]);
            assert!(job.get("first_task").is_none());
            assert_eq!(job.get("task_count").is_some(), !short);
        }
    }
}

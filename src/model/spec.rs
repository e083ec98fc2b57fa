//! The validated, immutable description of a job: its tasks and their graph.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::dag::Dag;
use crate::proto::worker::{task_params, TaskParams};
use prost::Message;

/// Dispatch priority among ready tasks; the highest goes first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    Low,
    #[default]
    Normal,
    High,
    Critical,
}

impl Priority {
    /// The priority of a name (`low`, `normal`, `high`, `critical`).
    pub fn from_name(name: &str) -> Option<Priority> {
        Some(match name {
            "low" => Priority::Low,
            "normal" => Priority::Normal,
            "high" => Priority::High,
            "critical" => Priority::Critical,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
            Priority::Critical => "critical",
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One task as the job file declared it, after validation. Stored as the
/// fields before `placement`, which is read from them whenever a task is
/// read (from a job file, or back from the store).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "TaskSpecV1")]
pub struct TaskSpec {
    pub id: Box<str>,
    pub job_type: Arc<str>,
    /// The parameters object as JSON text (validated, at most 64 KiB).
    pub parameters: Box<str>,
    pub priority: Priority,
    pub labels: BTreeMap<String, String>,
    pub retry_limit: u32,
    pub retry_backoff_seconds: u64,
    pub execution_timeout_seconds: Option<u64>,
    /// What its labels and parameters say of where its work lies; none for
    /// a task that says nothing of it.
    #[serde(skip_serializing)]
    pub placement: Option<Box<Placement>>,
}

/// A task's spec as stored (a spec chunk, an export): the fields of
/// `TaskSpec` but its placement, frozen.
#[derive(Deserialize)]
struct TaskSpecV1 {
    id: Box<str>,
    job_type: Arc<str>,
    parameters: Box<str>,
    priority: Priority,
    labels: BTreeMap<String, String>,
    retry_limit: u32,
    retry_backoff_seconds: u64,
    execution_timeout_seconds: Option<u64>,
}

impl From<TaskSpecV1> for TaskSpec {
    fn from(stored: TaskSpecV1) -> TaskSpec {
        TaskSpec {
            placement: Placement::of(&stored.labels, &stored.parameters),
            id: stored.id,
            job_type: stored.job_type,
            parameters: stored.parameters,
            priority: stored.priority,
            labels: stored.labels,
            retry_limit: stored.retry_limit,
            retry_backoff_seconds: stored.retry_backoff_seconds,
            execution_timeout_seconds: stored.execution_timeout_seconds,
        }
    }
}

impl TaskSpec {
    /// The volume it locks while it runs, as `volume:ID`.
    pub fn lock(&self) -> Option<&str> {
        self.placement.as_ref()?.lock.as_deref()
    }

    /// The volume servers it moves data through (`Placement::servers`).
    pub fn servers(&self) -> &[Arc<str>] {
        self.placement.as_ref().map_or(&[], |p| &p.servers)
    }

    /// The copy rate it asks for itself (`Placement::own_rate`).
    pub fn own_rate(&self) -> Option<u64> {
        self.placement.as_ref()?.own_rate
    }

    /// Where its data lives; unknown if it does not say.
    pub fn place(&self) -> Place {
        self.placement.as_ref().map(|p| p.place.clone()).unwrap_or_default()
    }
}

/// What a task's labels and parameters say of where its work lies, read
/// once when the task is read, so that the engine reads no label by name
/// and parses no parameters. The names are those SeaweedFS's detectors set.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placement {
    /// The volume it locks while it runs: label `volume_id`, as `volume:ID`.
    pub lock: Option<Box<str>>,
    /// Its data's host (label `source_node`, else `server`) and rack (`rack`).
    pub place: Place,
    /// The volume server it must run beside: label `node`.
    pub node: Option<Box<str>>,
    /// What detections are deduplicated by: label `dedupe_key`, if not empty.
    pub dedupe_key: Option<Box<str>>,
    /// How long it should take: parameter `estimated_runtime_seconds`, in ms.
    pub estimated_runtime_ms: Option<i64>,
    /// The volume servers it moves data through (`host:port`, sorted):
    /// labels `source_node`, `target_node` and `server`, parameters
    /// `source_server` and `target_server`, and the sources, targets and
    /// moves of parameter `task_params_pb`. What a volume server's
    /// bandwidth budget counts.
    pub servers: Box<[Arc<str>]>,
    /// The copy rate it asks for itself, in bytes per second: parameter
    /// `io_byte_per_second`, when above 0. Under a bandwidth budget it holds
    /// no more of it than that.
    pub own_rate: Option<u64>,
}

impl Placement {
    /// None when the task says nothing of where its work lies.
    pub fn of(labels: &BTreeMap<String, String>, parameters: &str) -> Option<Box<Placement>> {
        // Parameters are read only when they name what a placement takes.
        let named = ["estimated_runtime_seconds", "_server", "task_params_pb", RATE];
        let json = (parameters.len() > 2 && named.iter().any(|name| parameters.contains(name)))
            .then(|| serde_json::from_str::<serde_json::Value>(parameters).ok())
            .flatten();
        if labels.is_empty() && json.is_none() {
            return None;
        }
        let text = |key: &str| labels.get(key).filter(|v| !v.is_empty()).map(|v| Box::<str>::from(v.as_str()));
        let placement = Placement {
            lock: labels.get("volume_id").map(|v| format!("volume:{v}").into_boxed_str()),
            place: Place {
                host: labels.get("source_node").or_else(|| labels.get("server")).and_then(|a| Place::host_of(a)),
                rack: labels.get("rack").filter(|r| !r.is_empty()).map(|r| Arc::from(r.as_str())),
            },
            node: labels.get("node").map(|v| Box::<str>::from(v.as_str())),
            dedupe_key: text("dedupe_key"),
            estimated_runtime_ms: estimated_runtime_ms(json.as_ref()),
            servers: servers_of(labels, json.as_ref()),
            own_rate: json.as_ref().and_then(|v| v.get(RATE)?.as_u64()).filter(|rate| *rate > 0),
        };
        (placement != Placement::default()).then(|| Box::new(placement))
    }
}

/// The parameter of a task's own copy rate (`budget::PARAMETER`).
const RATE: &str = "io_byte_per_second";

/// Parameter `estimated_runtime_seconds` (a number, or a number as text), in milliseconds.
fn estimated_runtime_ms(parameters: Option<&serde_json::Value>) -> Option<i64> {
    let seconds = match parameters?.get("estimated_runtime_seconds")? {
        serde_json::Value::Number(n) => n.as_f64()?,
        serde_json::Value::String(s) => s.trim().parse().ok()?,
        _ => return None,
    };
    (seconds > 0.0).then(|| (seconds * 1000.0).min(i64::MAX as f64 / 4.0) as i64)
}

/// The volume servers a task moves data through (see `Placement::servers`).
fn servers_of(labels: &BTreeMap<String, String>, parameters: Option<&serde_json::Value>) -> Box<[Arc<str>]> {
    let mut servers: Vec<&str> = ["source_node", "target_node", "server"]
        .iter()
        .filter_map(|key| labels.get(*key))
        .map(String::as_str)
        .collect();
    let mut from_parameters: Vec<String> = Vec::new();
    if let Some(value) = parameters {
        for key in ["source_server", "target_server"] {
            if let Some(server) = value.get(key).and_then(serde_json::Value::as_str) {
                from_parameters.push(server.to_string());
            }
        }
        let bytes = value.get("task_params_pb").and_then(|v| v.get("$bytes")).and_then(serde_json::Value::as_str);
        if let Some(params) = bytes.and_then(decode_hex).and_then(|b| TaskParams::decode(b.as_slice()).ok()) {
            from_parameters.extend(params.sources.into_iter().map(|s| s.node));
            from_parameters.extend(params.targets.into_iter().map(|t| t.node));
            if let Some(task_params::TaskParams::BalanceParams(balance)) = params.task_params {
                for spec in balance.moves {
                    from_parameters.extend([spec.source_node, spec.target_node]);
                }
            }
        }
    }
    servers.extend(from_parameters.iter().map(String::as_str));
    let mut servers: Vec<Arc<str>> = servers.into_iter().filter_map(server_address).collect();
    servers.sort();
    servers.dedup();
    servers.into_boxed_slice()
}

/// A volume server's `host:port`, from SeaweedFS's `host:port` or
/// `host:port.grpcPort`; none when empty.
fn server_address(address: &str) -> Option<Arc<str>> {
    let address = address.trim();
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let address = match address.rsplit_once('.') {
        Some((host_port, grpc)) if digits(grpc) && host_port.rsplit_once(':').is_some_and(|(_, p)| digits(p)) => {
            host_port
        }
        _ => address,
    };
    (!address.is_empty()).then(|| Arc::from(address))
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

/// Where a handler runs, or where a task's data lives.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Place {
    /// Host name or IP address, without a port.
    pub host: Option<Arc<str>>,
    pub rack: Option<Arc<str>>,
}

impl Place {
    /// How far `self` (a handler) is from `data`: 0 on its host, 1 in its
    /// rack, 2 elsewhere or unknown.
    pub fn distance(&self, data: &Place) -> u8 {
        let same = |a: &Option<Arc<str>>, b: &Option<Arc<str>>| a.is_some() && a == b;
        if same(&self.host, &data.host) {
            0
        } else if same(&self.rack, &data.rack) {
            1
        } else {
            2
        }
    }

    /// The host of `host:port`, `[v6]:port` or a bare host.
    pub fn host_of(address: &str) -> Option<Arc<str>> {
        let address = address.trim();
        let host = match address.strip_prefix('[') {
            Some(rest) => rest.split(']').next().unwrap_or_default(),
            None if address.matches(':').count() == 1 => address.split(':').next().unwrap_or_default(),
            None => address,
        };
        (!host.is_empty()).then(|| Arc::from(host))
    }
}

/// A validated job: tasks in a fixed order (their `TaskIdx`) and the graph over them.
#[derive(Clone, Debug, PartialEq)]
pub struct JobSpec {
    pub name: String,
    pub tasks: Vec<TaskSpec>,
    pub dag: Dag,
    /// BLAKE3 of the source the job was read from (`jobfile::fingerprint`);
    /// lets `jobcenter run` resume its own job.
    pub fingerprint: [u8; 32],
}

impl JobSpec {
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    pub fn task(&self, idx: super::TaskIdx) -> &TaskSpec {
        &self.tasks[idx.index()]
    }

    /// Job types used by this job, sorted, each once.
    pub fn job_types(&self) -> Vec<Arc<str>> {
        let mut types: Vec<Arc<str>> = Vec::new();
        for task in &self.tasks {
            if !types.iter().any(|t| Arc::ptr_eq(t, &task.job_type) || **t == *task.job_type) {
                types.push(task.job_type.clone());
            }
        }
        types.sort();
        types
    }

    pub fn fingerprint_hex(&self) -> String {
        hex(&self.fingerprint)
    }
}

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(labels: &[(&str, &str)], parameters: &str) -> TaskSpec {
        let labels: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        TaskSpec {
            id: "t".into(),
            job_type: Arc::from("balance"),
            parameters: parameters.into(),
            priority: Priority::High,
            placement: Placement::of(&labels, parameters),
            labels,
            retry_limit: 2,
            retry_backoff_seconds: 5,
            execution_timeout_seconds: Some(60),
        }
    }

    #[test]
    fn a_detection_s_labels_and_parameters_are_read_once_into_its_placement() {
        let spec = task(
            &[
                ("volume_id", "7"),
                ("source_node", "10.0.0.1:8080"),
                ("rack", "r1"),
                ("node", "10.0.0.1:8080"),
                ("dedupe_key", "balance:7"),
            ],
            r#"{"volume_id":7,"estimated_runtime_seconds":"90"}"#,
        );
        assert_eq!(spec.lock(), Some("volume:7"));
        assert_eq!(spec.place(), Place { host: Some(Arc::from("10.0.0.1")), rack: Some(Arc::from("r1")) });
        let placement = spec.placement.as_deref().unwrap();
        assert_eq!(placement.node.as_deref(), Some("10.0.0.1:8080"));
        assert_eq!(placement.dedupe_key.as_deref(), Some("balance:7"));
        assert_eq!(placement.estimated_runtime_ms, Some(90_000));
        let server = task(&[("server", "[::1]:8080"), ("dedupe_key", "")], r#"{"estimated_runtime_seconds":1.5}"#);
        assert_eq!(server.place().host.as_deref(), Some("::1"));
        let placement = server.placement.as_deref().unwrap();
        assert_eq!((placement.dedupe_key.as_deref(), placement.estimated_runtime_ms), (None, Some(1_500)));
    }

    #[test]
    fn the_volume_servers_a_task_moves_data_through_come_from_labels_parameters_and_task_params() {
        use crate::proto::worker::{BalanceMoveSpec, BalanceTaskParams, TaskSource, TaskTarget};
        let labelled = task(&[("source_node", "10.0.0.1:8080"), ("target_node", "10.0.0.2:8080.18080")], "{}");
        let servers: Vec<&str> = labelled.placement.as_deref().unwrap().servers.iter().map(|s| &**s).collect();
        assert_eq!(servers, ["10.0.0.1:8080", "10.0.0.2:8080"], "a gRPC port after the port is left out");
        let params = TaskParams {
            sources: vec![TaskSource { node: "a:8080".into(), ..Default::default() }],
            targets: vec![TaskTarget { node: "b:8080".into(), ..Default::default() }],
            task_params: Some(task_params::TaskParams::BalanceParams(BalanceTaskParams {
                moves: vec![BalanceMoveSpec {
                    source_node: "c:8080".into(),
                    target_node: "a:8080".into(),
                    ..Default::default()
                }],
                ..Default::default()
            })),
            ..Default::default()
        };
        let parameters = serde_json::json!({
            "task_params_pb": {"$bytes": hex(&params.encode_to_vec())},
            "target_server": "d:8080",
        });
        let spec = task(&[], &parameters.to_string());
        let servers: Vec<&str> = spec.placement.as_deref().unwrap().servers.iter().map(|s| &**s).collect();
        assert_eq!(servers, ["a:8080", "b:8080", "c:8080", "d:8080"]);
        let unreadable = task(&[], r#"{"task_params_pb":{"$bytes":"zz"},"source_server":""}"#);
        assert_eq!(unreadable.placement, None, "nothing readable, no servers");
        let own = |parameters: &str| task(&[], parameters).own_rate();
        assert_eq!(
            [own(r#"{"io_byte_per_second":2000000}"#), own(r#"{"io_byte_per_second":0}"#), own("{}")],
            [Some(2_000_000), None, None],
            "a rate of its own, 0 being the server's own"
        );
    }

    #[test]
    fn a_task_that_says_nothing_of_where_it_runs_has_no_placement() {
        let spec = task(&[("team", "storage")], r#"{"estimated_runtime_seconds":0,"n":1}"#);
        assert_eq!(spec.placement, None);
        assert_eq!((spec.lock(), spec.place()), (None, Place::default()));
    }

    #[test]
    fn the_placement_is_not_stored_and_is_read_again_from_what_is() {
        let spec = task(&[("volume_id", "7"), ("rack", "r1")], "{}");
        let bytes = postcard::to_allocvec(&spec).unwrap();
        let without = TaskSpec { placement: None, ..spec.clone() };
        assert_eq!(bytes, postcard::to_allocvec(&without).unwrap(), "the stored bytes are those of TaskSpecV1");
        assert_eq!(postcard::from_bytes::<TaskSpec>(&bytes).unwrap(), spec);
    }
}

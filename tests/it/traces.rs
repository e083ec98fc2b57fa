//! Traces over OTLP: a real server and a real worker export their spans to
//! an OTLP trace receiver on loopback (the generated gRPC service, in this
//! process), and a job's spans arrive: the job's, one for each task
//! attempt, the store's commits, and the worker's executions, each the
//! child of its attempt's span on the admin; a detection run's and a
//! recovery check's arrive too. An endpoint where nothing listens slows
//! nothing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;

use jobcenter::proto::plugin::JobProposal;

use crate::support::{self, start_worker, wait_until, Server};

/// A diamond of `noop` tasks: `a` first, `b` and `c` after it, `d` last.
const DIAMOND: &str = r#"{"name": "traced", "tasks": [
    {"id": "a", "job_type": "noop", "parameters": {"sleep_ms": 20}},
    {"id": "b", "job_type": "noop", "parameters": {"sleep_ms": 20}, "depends_on": ["a"]},
    {"id": "c", "job_type": "noop", "parameters": {"sleep_ms": 20}, "depends_on": ["a"]},
    {"id": "d", "job_type": "noop", "parameters": {"sleep_ms": 20}, "depends_on": ["b", "c"]}
]}"#;

/// Every span received, with the `service.name` of the process that sent it.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .as_ref()
                .and_then(|resource| resource.attributes.iter().find(|kv| kv.key == "service.name"))
                .and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                spans.extend(scope.spans.into_iter().map(|span| (service.clone(), span)));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

/// The OTLP trace receiver on a loopback port, served by a runtime of its
/// own (which the test's detector uses too).
struct Receiver {
    endpoint: String,
    collector: Collector,
    runtime: tokio::runtime::Runtime,
}

impl Receiver {
    fn start() -> Receiver {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let collector = Collector::default();
        let service = TraceServiceServer::new(collector.clone());
        runtime.spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        Receiver { endpoint, collector, runtime }
    }

    fn spans(&self) -> Vec<(String, Span)> {
        self.collector.spans.lock().unwrap().clone()
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::StringValue(text) => Some(text.clone()),
        Value::IntValue(n) => Some(n.to_string()),
        Value::BoolValue(b) => Some(b.to_string()),
        Value::DoubleValue(x) => Some(x.to_string()),
        _ => None,
    }
}

/// A span's attribute, as text.
fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|kv| kv.key == key).and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?))
}

/// The spans named `name` from `service` whose `job.id` is `job`.
fn named<'a>(spans: &'a [(String, Span)], service: &str, name: &str, job: &str) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|(from, span)| {
            from == service && span.name == name && attribute(span, "job.id").as_deref() == Some(job)
        })
        .map(|(_, span)| span)
        .collect()
}

fn submit_and_wait(server: &Server, dir: &std::path::Path) -> (String, Duration) {
    let file = dir.join("diamond.json");
    std::fs::write(&file, DIAMOND).unwrap();
    let started = Instant::now();
    let output = server.cli(&["submit", file.to_str().unwrap(), "--wait", "--json"]);
    let took = started.elapsed();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let job: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(job["state"], "succeeded", "{job}");
    (job["id"].as_str().unwrap().to_string(), took)
}

#[test]
fn a_job_s_spans_reach_the_endpoint_and_the_worker_s_join_its_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start();
    let otlp = ["--otlp-endpoint", receiver.endpoint.as_str()];
    let server = Server::start(&dir.path().join("data"), &otlp);
    let _worker = start_worker(&server, "traced-worker", &otlp, None);
    // A detector of two `noop` proposals, asked only when the test asks.
    assert!(server.cli(&["policy", "set", "noop", "detection_enabled=0"]).status.success());
    let proposal = |id: &str| JobProposal {
        proposal_id: id.into(),
        dedupe_key: format!("noop:{id}"),
        job_type: "noop".into(),
        ..JobProposal::default()
    };
    let _detector = receiver.runtime.block_on(support::proposing_detector(
        &server,
        "traced-detector",
        vec![proposal("one"), proposal("two")],
    ));
    server.wait_for_workers(2);
    let (job, _) = submit_and_wait(&server, dir.path());
    let shown = server.cli_json(&["detect", "noop", "--json"]);
    assert_eq!(shown["proposals"].as_array().map(Vec::len), Some(2), "{shown}");
    let recovered = server.cli(&["recover"]);
    assert!(recovered.status.success(), "{}", String::from_utf8_lossy(&recovered.stderr));

    // Spans leave in batches every 2 s: each kind is waited for, 30 s at most.
    let everything = wait_until(Duration::from_secs(30), || {
        let spans = receiver.spans();
        let jobs = named(&spans, "jobcenter-server", "job", &job);
        let attempts = named(&spans, "jobcenter-server", "attempt", &job);
        let executions = named(&spans, "jobcenter-worker", "execution", &job);
        let server_spans =
            |name: &str| spans.iter().filter(|(from, span)| from == "jobcenter-server" && span.name == name).count();
        let (commits, detections, checks) =
            (server_spans("commit"), server_spans("detection"), server_spans("recovery_check"));
        let all = jobs.len() == 1 && attempts.len() == 4 && executions.len() == 4;
        (all && commits > 0 && detections > 0 && checks > 0).then_some(spans)
    })
    .unwrap_or_else(|| {
        let names: Vec<(String, String)> =
            receiver.spans().iter().map(|(from, span)| (from.clone(), span.name.clone())).collect();
        panic!("the job's spans did not all arrive within 30 s; received {names:?}")
    });

    let job_span = named(&everything, "jobcenter-server", "job", &job)[0];
    assert_eq!(attribute(job_span, "outcome").as_deref(), Some("succeeded"));
    assert_eq!(attribute(job_span, "job.name").as_deref(), Some("traced"));
    assert_eq!(attribute(job_span, "tasks").as_deref(), Some("4"));
    assert!(job_span.parent_span_id.is_empty(), "a job's span is a root");

    let mut attempts: BTreeMap<String, &Span> = BTreeMap::new();
    for attempt in named(&everything, "jobcenter-server", "attempt", &job) {
        assert_eq!(attempt.trace_id, job_span.trace_id, "an attempt is in its job's trace");
        assert_eq!(attempt.parent_span_id, job_span.span_id, "an attempt is a child of its job");
        assert_eq!(attribute(attempt, "attempt").as_deref(), Some("1"));
        assert_eq!(attribute(attempt, "job.type").as_deref(), Some("noop"));
        assert_eq!(attribute(attempt, "outcome").as_deref(), Some("succeeded"));
        assert!(attribute(attempt, "handler").is_some_and(|h| !h.is_empty()), "the attempt names its handler");
        attempts.insert(attribute(attempt, "task.id").unwrap(), attempt);
    }
    assert_eq!(attempts.keys().map(String::as_str).collect::<Vec<_>>(), ["a", "b", "c", "d"]);

    for execution in named(&everything, "jobcenter-worker", "execution", &job) {
        let task = attribute(execution, "task.id").unwrap();
        let attempt = attempts[&task];
        assert_eq!(execution.trace_id, attempt.trace_id, "task {task}: the execution is in its attempt's trace");
        assert_eq!(execution.parent_span_id, attempt.span_id, "task {task}: the execution is a child of its attempt");
        assert_eq!(attribute(execution, "outcome").as_deref(), Some("succeeded"));
        assert_eq!(attribute(execution, "worker.id").as_deref(), Some("traced-worker"));
    }

    let commit = everything.iter().find(|(_, span)| span.name == "commit").map(|(_, span)| span).unwrap();
    assert!(attribute(commit, "batch.size").is_some_and(|n| n.parse::<u64>().unwrap() > 0), "{commit:?}");
    assert!(attribute(commit, "duration_ms").is_some(), "{commit:?}");

    let detection = everything.iter().find(|(_, span)| span.name == "detection").map(|(_, span)| span).unwrap();
    assert_eq!(attribute(detection, "job.type").as_deref(), Some("noop"), "{detection:?}");
    assert_eq!(attribute(detection, "proposals").as_deref(), Some("2"), "{detection:?}");
    let check = everything.iter().find(|(_, span)| span.name == "recovery_check").map(|(_, span)| span).unwrap();
    assert!(attribute(check, "findings").is_some(), "{check:?}");
}

#[test]
fn an_endpoint_where_nothing_listens_slows_nothing() {
    // A port just free: nothing listens there, and connecting is refused.
    let port = crate::support::free_port();
    jobs_go_on_and_the_server_stops_promptly(&format!("http://127.0.0.1:{port}"));
}

#[test]
fn an_endpoint_that_never_answers_slows_nothing() {
    // Connections are taken into the backlog and never answered.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    jobs_go_on_and_the_server_stops_promptly(&format!("http://{}", silent.local_addr().unwrap()));
    drop(silent);
}

/// Jobs run as fast as without traces while the spans go to `endpoint`, and
/// the server stops on SIGTERM within its flush's bound (5 s), exiting 0.
fn jobs_go_on_and_the_server_stops_promptly(endpoint: &str) {
    let dir = tempfile::tempdir().unwrap();
    let otlp = ["--otlp-endpoint", endpoint];
    let mut server = Server::start(&dir.path().join("data"), &otlp);
    let _worker = start_worker(&server, "unheard-worker", &otlp, None);
    server.wait_for_workers(1);
    // Past the first batch's export (2 s), so that later jobs run while it hangs.
    for _ in 0..4 {
        let (_, took) = submit_and_wait(&server, dir.path());
        assert!(took < Duration::from_secs(5), "a four-task job took {took:?} with its spans going nowhere");
    }
    let pid = server.process.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let stopping = Instant::now();
    let status = wait_until(Duration::from_secs(20), || server.process.child.try_wait().unwrap())
        .expect("the server did not stop within 20 s of SIGTERM");
    let log = std::fs::read_to_string(&server.log).unwrap_or_default();
    assert!(status.success(), "{status:?}: {log}");
    assert!(stopping.elapsed() < Duration::from_secs(12), "stopping took {:?}: {log}", stopping.elapsed());
}

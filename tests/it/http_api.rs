//! The HTTP side of a real server: every route under `/api/` against its
//! OpenAPI description (`/api/openapi.json`, which must name every route the
//! router has and nothing else), errors as JSON with their codes, and the
//! Prometheus metrics at `/metrics`.

use crate::support;
use crate::support::raw_http;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{json, Value};
use support::{nine_tasks, start_worker, wait_until, Server};

/// One HTTP/1.1 request; returns the status and the body.
fn http(address: &str, method: &str, path: &str, body: Option<(&str, &str)>, token: Option<&str>) -> (u16, String) {
    let bearer = token.map(|token| format!("Bearer {token}"));
    let mut headers: Vec<(&str, &str)> = Vec::new();
    if let Some(bearer) = &bearer {
        headers.push(("Authorization", bearer));
    }
    if let Some((content_type, _)) = body {
        headers.push(("Content-Type", content_type));
    }
    let answer = raw_http::request(address, method, path, &headers, body.map(|(_, body)| body));
    (answer.status, answer.body)
}

fn json(address: &str, method: &str, path: &str, body: Option<(&str, &str)>) -> (u16, Value) {
    let (status, text) = http(address, method, path, body, None);
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text}"));
    (status, value)
}

/// Every (path, method) the router serves, read from its source.
pub(crate) fn routed() -> BTreeSet<(String, String)> {
    let source = include_str!("../../src/server/surface/http.rs");
    let mut routes = BTreeSet::new();
    for part in source.split(".route(").skip(1) {
        let (path, handlers) = part.split_once(',').expect("route(path, handlers)");
        let path = match path.trim() {
            "PLUGIN_STATUS_PATH" => "/api/plugin/status".to_string(),
            quoted => quoted.trim_matches('"').to_string(),
        };
        let handlers = handlers.split(")\n").next().unwrap();
        for method in ["get", "post", "put", "delete", "patch"] {
            if handlers.contains(&format!("{method}(")) {
                routes.insert((path.clone(), method.to_string()));
            }
        }
    }
    routes
}

/// The required fields of a schema of the description.
fn required(doc: &Value, schema: &str) -> Vec<String> {
    doc["components"]["schemas"][schema]["required"]
        .as_array()
        .unwrap_or_else(|| panic!("schema {schema} has required fields"))
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

fn assert_shape(doc: &Value, schema: &str, value: &Value) {
    for field in required(doc, schema) {
        assert!(value.get(&field).is_some(), "{schema} lacks {field:?}: {value}");
    }
    if let Some(properties) = doc["components"]["schemas"][schema]["properties"].as_object() {
        for key in value.as_object().expect("an object").keys() {
            assert!(properties.contains_key(key), "{schema} does not describe {key:?}");
        }
    }
}

fn refs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                if key == "$ref" {
                    out.push(v.as_str().unwrap().to_string());
                }
                refs(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

fn wait_for_state(address: &str, id: &str, state: &str) -> Value {
    wait_until(Duration::from_secs(60), || {
        let (_, job) = json(address, "GET", &format!("/api/jobs/{id}"), None);
        (job["state"] == state).then_some(job)
    })
    .unwrap_or_else(|| panic!("job {id} never got to {state}"))
}

#[test]
fn the_openapi_description_names_every_route_and_the_api_answers_as_it_says() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let _worker = start_worker(&server, "worker-1", &[], None);
    server.wait_for_workers(1);
    let address = server.http.as_str();

    let (status, doc) = json(address, "GET", "/api/openapi.json", None);
    assert_eq!(status, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| item.as_object().unwrap().keys().map(move |m| (path.clone(), m.clone())))
        .collect();
    let routed = routed();
    assert!(routed.len() >= 14, "{routed:?}");
    assert_eq!(documented, routed, "the description and the router disagree");
    let mut references = Vec::new();
    refs(&doc, &mut references);
    for reference in references {
        let name = reference.strip_prefix("#/components/schemas/").expect("a schema reference");
        assert!(doc["components"]["schemas"].get(name).is_some(), "{reference} is not defined");
    }

    // Health.
    assert_eq!(http(address, "GET", "/healthz", None, None), (200, "ok\n".into()));
    assert_eq!(http(address, "GET", "/readyz", None, None), (200, "ready\n".into()));
    let (status, plugin) = json(address, "GET", "/api/plugin/status", None);
    assert_eq!(status, 200);
    assert_eq!(plugin["worker_grpc_port"].as_u64().unwrap().to_string(), server.grpc.rsplit(':').next().unwrap());

    // Submit, read, list.
    let (status, created) =
        json(address, "POST", "/api/jobs?name=nine.json", Some(("application/json", &nine_tasks(Some(4), 200))));
    assert_eq!(status, 201, "{created}");
    let id = created["job_id"].as_str().unwrap().to_string();
    let (status, job) = json(address, "GET", &format!("/api/jobs/{id}"), None);
    assert_eq!(status, 200);
    assert_shape(&doc, "Job", &job);
    let tasks = job["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 9);
    for task in tasks {
        assert_shape(&doc, "Task", task);
    }
    let seven = tasks.iter().find(|t| t["id"] == "7").unwrap();
    assert_eq!(seven["depends_on"], serde_json::json!(["1", "2", "4"]));
    let job = wait_for_state(address, &id, "failed");
    let by_id: BTreeMap<&str, &str> = job["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_str().unwrap(), t["state"].as_str().unwrap()))
        .collect();
    assert_eq!((by_id["4"], by_id["7"], by_id["8"]), ("failed", "upstream_failed", "succeeded"));

    let (status, list) = json(address, "GET", "/api/jobs?state=failed&limit=5", None);
    assert_eq!(status, 200);
    let jobs = list["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1);
    assert_shape(&doc, "JobSummary", &jobs[0]);
    assert_eq!(jobs[0]["id"], id.as_str());
    assert_eq!(jobs[0]["tasks"], 9);
    let (_, list) = json(address, "GET", "/api/jobs?state=succeeded", None);
    assert!(list["jobs"].as_array().unwrap().is_empty());

    // Errors are JSON with the documented codes.
    let (status, error) = json(address, "GET", "/api/jobs?state=bogus", None);
    assert_eq!(status, 400);
    assert_shape(&doc, "Error", &error);
    assert_eq!(json(address, "GET", "/api/jobs/not-a-uuid", None).0, 400);
    assert_eq!(json(address, "GET", "/api/jobs/0190a2b4-0000-7000-8000-000000000009", None).0, 404);
    let (status, error) = json(address, "POST", &format!("/api/jobs/{id}/cancel"), None);
    assert_eq!(status, 409, "{error}");
    let (status, error) = json(
        address,
        "POST",
        "/api/jobs",
        Some(("application/json", r#"{"name":"bad","tasks":[{"id":"a","job_type":"noop","depends_on":["b"]}]}"#)),
    );
    assert_eq!(status, 400);
    assert!(error["error"].as_str().unwrap().contains("\"b\""), "{error}");

    // Retry the failed part; it fails again the same way.
    let (status, retried) = json(address, "POST", &format!("/api/jobs/{id}/retry"), None);
    assert_eq!((status, &retried["retried"]), (200, &Value::Bool(true)), "{retried}");
    let job = wait_for_state(address, &id, "failed");
    let four = job["tasks"].as_array().unwrap().iter().find(|t| t["id"] == "4").unwrap();
    assert_eq!(four["attempt"], 2);
    assert_eq!(json(address, "POST", &format!("/api/jobs/{id}/retry"), None).0, 200);
    wait_for_state(address, &id, "failed");

    // A TOML job, canceled while it runs.
    let toml = "name = \"slow\"\n[[tasks]]\nid = \"sleep\"\njob_type = \"noop\"\nparameters = { sleep_ms = 30000 }\n";
    let (status, created) = json(address, "POST", "/api/jobs?format=toml", Some(("application/toml", toml)));
    assert_eq!(status, 201, "{created}");
    let slow = created["job_id"].as_str().unwrap().to_string();
    // While it runs: its worker lists the attempt, and the task answers alone.
    let attempt = wait_until(Duration::from_secs(20), || {
        let (_, workers) = json(address, "GET", "/api/workers", None);
        let first = workers["workers"][0]["running"].as_array().and_then(|r| r.first().cloned());
        first.filter(|a| a["state"] == "running")
    })
    .expect("the worker lists what it runs");
    assert_eq!((attempt["job_id"].as_str(), attempt["task_id"].as_str()), (Some(slow.as_str()), Some("sleep")));
    let (status, task) = json(address, "GET", &format!("/api/jobs/{slow}/tasks/sleep"), None);
    assert_eq!((status, task["state"].as_str(), task["worker_id"].as_str()), (200, Some("running"), Some("worker-1")));
    assert_eq!(json(address, "GET", &format!("/api/jobs/{slow}/tasks/nothing"), None).0, 404);
    let (status, canceled) = json(address, "POST", &format!("/api/jobs/{slow}/cancel"), None);
    assert_eq!((status, &canceled["canceled"]), (200, &Value::Bool(true)));
    wait_for_state(address, &slow, "canceled");

    // Workers, stats, policies, recovery.
    let (status, workers) = json(address, "GET", "/api/workers", None);
    assert_eq!(status, 200);
    let workers = workers["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 1);
    assert_shape(&doc, "Worker", &workers[0]);
    assert_eq!(workers[0]["worker_id"], "worker-1");
    let (status, stats) = json(address, "GET", "/api/stats", None);
    assert_eq!(status, 200);
    assert!(stats["dispatch"]["count"].as_u64().unwrap() > 0, "{stats}");
    let (status, policy) = json(address, "GET", "/api/policies/noop", None);
    assert_eq!(status, 200);
    assert_shape(&doc, "Policy", &policy);
    let (status, policy) = json(
        address,
        "PUT",
        "/api/policies/noop",
        Some(("application/json", r#"{"retry_limit": 2, "global_execution_concurrency": "8"}"#)),
    );
    assert_eq!(status, 200, "{policy}");
    assert_eq!((policy["retry_limit"].as_u64(), policy["sources"]["retry_limit"].as_str()), (Some(2), Some("set")));
    assert_eq!(policy["global_execution_concurrency"], 8);
    let (status, error) =
        json(address, "PUT", "/api/policies/noop", Some(("application/json", r#"{"no_such_setting": 1}"#)));
    assert_eq!(status, 400, "{error}");
    let (status, recovered) = json(address, "POST", "/api/recover?dry_run=true", None);
    assert_eq!(status, 200, "{recovered}");
    assert_shape(&doc, "RecoverResponse", &recovered);
    assert_eq!(recovered["dry_run"], true);
}

/// `name{labels} value` lines of a text exposition.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').expect("name value");
            (name.to_string(), value.parse().unwrap_or_else(|_| panic!("{l}")))
        })
        .collect()
}

#[test]
fn metrics_describe_jobs_tasks_workers_and_latencies() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let _worker = start_worker(&server, "worker-1", &[], None);
    server.wait_for_workers(1);
    let address = server.http.as_str();

    let (status, created) = json(address, "POST", "/api/jobs", Some(("application/json", &nine_tasks(Some(4), 20))));
    assert_eq!(status, 201);
    wait_for_state(address, created["job_id"].as_str().unwrap(), "failed");
    let slow = r#"{"name":"slow","tasks":[{"id":"a","job_type":"noop","parameters":{"sleep_ms":30000}}]}"#;
    let (_, created) = json(address, "POST", "/api/jobs", Some(("application/json", slow)));
    let slow = created["job_id"].as_str().unwrap().to_string();

    // While the slow task runs, its worker reports the slot in use.
    let scrape = || {
        let (status, text) = http(address, "GET", "/metrics", None, None);
        assert_eq!(status, 200, "{text}");
        text
    };
    let text = wait_until(Duration::from_secs(30), || {
        let text = scrape();
        (samples(&text).get("jobcenter_worker_slots_used{job_type=\"noop\"}") == Some(&1.0)).then_some(text)
    })
    .unwrap_or_else(|| panic!("no slot in use:\n{}", scrape()));
    let values = samples(&text);
    let value = |name: &str| *values.get(name).unwrap_or_else(|| panic!("no {name} in\n{text}"));
    assert_eq!(value("jobcenter_workers_connected"), 1.0);
    assert_eq!(value("jobcenter_jobs{state=\"failed\"}"), 1.0);
    assert_eq!(value("jobcenter_jobs{state=\"running\"}") + value("jobcenter_jobs{state=\"pending\"}"), 1.0);
    assert_eq!(value("jobcenter_jobs{state=\"succeeded\"}"), 0.0);
    assert_eq!(value("jobcenter_active_jobs"), 1.0);
    assert_eq!(value("jobcenter_tasks{state=\"running\"}") + value("jobcenter_tasks{state=\"assigned\"}"), 1.0);
    assert!(value("jobcenter_worker_slots_offered{job_type=\"noop\"}") >= 1.0);
    // Level-1 and level-2 tasks were released by completions: their dispatch was measured.
    let dispatched = value("jobcenter_dispatch_latency_seconds_count");
    assert!(dispatched >= 3.0, "{dispatched}");
    assert_eq!(value("jobcenter_dispatch_latency_seconds_bucket{le=\"+Inf\"}"), dispatched);
    // Buckets are cumulative: counts never go down as the bound goes up.
    let mut buckets: Vec<(f64, f64)> = values
        .iter()
        .filter_map(|(name, count)| {
            let bound = name.strip_prefix("jobcenter_dispatch_latency_seconds_bucket{le=\"")?.strip_suffix("\"}")?;
            Some((if bound == "+Inf" { f64::INFINITY } else { bound.parse().unwrap() }, *count))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert!(buckets.len() >= 10, "{buckets:?}");
    assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{buckets:?}");
    assert!(value("jobcenter_commit_seconds_count") >= 2.0, "both submissions waited to be durable");
    assert!(value("jobcenter_store_flush_seconds_count") >= 1.0);
    assert_eq!(value("jobcenter_detections_total{job_type=\"noop\"}"), 0.0);
    assert_eq!(value("jobcenter_proposals_total{job_type=\"noop\"}"), 0.0);
    for family in [
        "jobcenter_dispatch_latency_seconds histogram",
        "jobcenter_commit_seconds histogram",
        "jobcenter_store_flush_seconds histogram",
        "jobcenter_worker_slots_used gauge",
        "jobcenter_detections_total counter",
    ] {
        assert!(text.contains(&format!("# TYPE {family}")), "no {family} in\n{text}");
    }

    // Canceled, the slow job is no longer active and its slot is free again.
    assert_eq!(json(address, "POST", &format!("/api/jobs/{slow}/cancel"), None).0, 200);
    wait_for_state(address, &slow, "canceled");
    let values = wait_until(Duration::from_secs(30), || {
        let values = samples(&scrape());
        (values.get("jobcenter_worker_slots_used{job_type=\"noop\"}") == Some(&0.0)).then_some(values)
    })
    .expect("the slot is given back");
    assert_eq!(values["jobcenter_active_jobs"], 0.0);
    assert_eq!(values["jobcenter_jobs{state=\"canceled\"}"], 1.0);
    assert_eq!(values["jobcenter_tasks{state=\"running\"}"], 0.0);
}

#[test]
fn with_a_token_metrics_and_the_api_need_it_and_the_description_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret-token-for-tests\n").unwrap();
    let server = Server::start(&dir.path().join("data"), &["--token-file", token_file.to_str().unwrap()]);
    let address = server.http.as_str();
    assert_eq!(http(address, "GET", "/metrics", None, None).0, 401);
    assert_eq!(http(address, "GET", "/api/jobs", None, None).0, 401);
    assert_eq!(http(address, "GET", "/metrics", None, Some("wrong")).0, 401);
    let (status, text) = http(address, "GET", "/metrics", None, Some("s3cret-token-for-tests"));
    assert_eq!(status, 200);
    assert!(text.contains("jobcenter_workers_connected 0"), "{text}");
    assert_eq!(http(address, "GET", "/api/openapi.json", None, None).0, 200);
    assert_eq!(http(address, "GET", "/healthz", None, None).0, 200);
}

/// A job of `n` independent tasks of a type nobody serves, as JSON text.
fn parked_job(name: &str, n: usize) -> String {
    let tasks: Vec<String> = (0..n)
        .map(|i| format!(r#"{{"id":"task-{i:06}","job_type":"parked","parameters":{{"note":"padding padding"}}}}"#))
        .collect();
    format!(r#"{{"name":"{name}","tasks":[{}]}}"#, tasks.join(","))
}

#[test]
fn a_job_file_larger_than_one_request_is_streamed_and_the_limits_left_name_their_options() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--max-request-bytes", "1000000", "--max-job-bytes", "4000000"];
    let server = Server::start(&dir.path().join("data"), &args);

    // About 1.6 MB: past what one request takes, within what a submission does.
    let big = parked_job("streamed", 20_000);
    assert!(big.len() > 1_000_000 && big.len() < 4_000_000, "{} bytes", big.len());
    let file = dir.path().join("streamed.json");
    std::fs::write(&file, &big).unwrap();
    let output = server.cli(&["submit", file.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let id = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let job = server.cli_json(&["job", &id, "--json"]);
    assert_eq!(job["tasks"].as_array().map(Vec::len), Some(20_000), "every task arrived");

    // The same file in one HTTP request: refused by jobcenter, naming the option.
    let (status, body) = http(&server.http, "POST", "/api/jobs", Some(("application/json", &big)), None);
    assert_eq!(status, 413, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    assert!(error["error"].as_str().unwrap().contains("--max-request-bytes"), "{error}");

    // Past the submission limit: refused, naming its option, nothing stored.
    let bigger = dir.path().join("too-big.json");
    std::fs::write(&bigger, parked_job("too-big", 50_000)).unwrap();
    let output = server.cli(&["submit", bigger.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("file too large") && stderr.contains("--max-job-bytes"), "{stderr}");
    assert!(!stderr.contains("transport"), "a transport message leaked: {stderr}");
    let jobs = server.cli_json(&["jobs", "--json"]);
    assert_eq!(jobs.as_array().map(Vec::len), Some(1), "only the first job is stored: {jobs}");
}

/// Waits for a child's output to be written to its file and returns it.
fn read_when(path: &std::path::Path, what: &str, mut done: impl FnMut(&str) -> bool) -> String {
    wait_until(Duration::from_secs(60), || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        done(&text).then_some(text)
    })
    .unwrap_or_else(|| panic!("{what}: {}", std::fs::read_to_string(path).unwrap_or_default()))
}

#[test]
fn a_job_of_more_tasks_than_one_part_is_read_watched_and_waited_for_whole_and_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    // Three parts of at most 10,000 tasks.
    let n = 25_000;
    let file = dir.path().join("wide.json");
    std::fs::write(&file, parked_job("wide", n)).unwrap();
    let ids: Vec<String> = (0..n).map(|i| format!("task-{i:06}")).collect();
    let task_ids = |job: &Value| -> Vec<String> {
        job["tasks"].as_array().expect("tasks").iter().map(|t| t["id"].as_str().unwrap().to_string()).collect()
    };

    // `submit --wait --json` and `watch --plain`, running until the job ends.
    let (wait_out, watch_out) = (dir.path().join("wait.out"), dir.path().join("watch.out"));
    let mut submit = std::process::Command::new(support::binary());
    submit.args(["submit", file.to_str().unwrap(), "--wait", "--json", "--admin", &server.http]);
    submit.stdout(std::fs::File::create(&wait_out).unwrap()).stderr(std::process::Stdio::piped());
    let mut submit = submit.spawn().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(submit.stderr.take().unwrap()), &mut line).unwrap();
    let id = line.trim().strip_prefix("submitted job ").unwrap_or_else(|| panic!("{line}")).to_string();
    let mut watch = std::process::Command::new(support::binary());
    watch.args(["watch", &id, "--plain", "--admin", &server.http]);
    watch.stdout(std::fs::File::create(&watch_out).unwrap()).stderr(std::process::Stdio::null());
    let watch = watch.spawn().unwrap();
    let first = read_when(&watch_out, "the watch's snapshot", |t| t.contains("watching job"));
    assert!(first.contains(&format!("{n} tasks")), "the whole snapshot was put together: {first}");

    // `jobcenter job --json` and `/api/jobs/{id}`: every task, in order.
    let job = server.cli_json(&["job", &id, "--json"]);
    assert_eq!(job["task_count"], n);
    assert_eq!(task_ids(&job), ids);
    assert_eq!(job["tasks"][n - 1]["state"], "ready");
    let (status, job) = json(&server.http, "GET", &format!("/api/jobs/{id}"), None);
    assert_eq!(status, 200);
    assert_eq!((job["name"].as_str(), job["state"].as_str()), (Some("wide"), Some("pending")));
    assert_eq!(task_ids(&job), ids);
    let table = server.cli(&["job", &id]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert_eq!(table.lines().count(), n + 2, "a header line, the column names, a row per task");
    assert!(table.lines().nth(n + 1).unwrap().starts_with(&ids[n - 1]));

    let output = server.cli(&["cancel", &id]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let waited = support::wait_with_timeout(submit, Duration::from_secs(60)).expect("submit --wait ended");
    assert_eq!(waited.status.code(), Some(1), "a canceled job is not a success");
    let text = std::fs::read_to_string(&wait_out).unwrap();
    let job: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not one JSON object ({e})"));
    assert_eq!(job["state"], "canceled");
    assert_eq!(task_ids(&job), ids);
    assert!(job["tasks"].as_array().unwrap().iter().all(|t| t["state"] == "canceled"));
    let watched = support::wait_with_timeout(watch, Duration::from_secs(60)).expect("watch ended");
    assert_eq!(watched.status.code(), Some(1));
    let text = std::fs::read_to_string(&watch_out).unwrap();
    assert!(text.contains("job canceled"), "{text}");
}

/// A canceled job of one task of a type nobody serves; its id.
fn ended_job(address: &str, name: &str) -> String {
    let job = format!(r#"{{"name":"{name}","tasks":[{{"id":"a","job_type":"parked"}}]}}"#);
    let created = raw_http::request(address, "POST", "/api/jobs", &[("Content-Type", "application/json")], Some(&job));
    assert_eq!(created.status, 201, "{}", created.body);
    let id = created.json()["job_id"].as_str().unwrap().to_string();
    assert_eq!(raw_http::request(address, "POST", &format!("/api/jobs/{id}/cancel"), &[], None).status, 200);
    id
}

/// The error of a 400 answer, which must name `what`.
fn refused(answer: raw_http::Answer, what: &str) -> String {
    assert_eq!(answer.status, 400, "{}", answer.body);
    let error = answer.json()["error"].as_str().expect("an error").to_string();
    assert!(error.contains(what), "{error:?} does not name {what:?}");
    error
}

#[test]
fn a_query_parameter_that_breaks_its_rule_or_is_not_taken_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    // Every ended job is due for removal after a second; no prune of its own.
    let server = Server::start(&dir.path().join("data"), &["--keep-ended-for", "1s", "--prune-interval", "1h"]);
    let address = server.http.as_str();
    let id = ended_job(address, "kept");
    std::thread::sleep(Duration::from_millis(1200));
    let post = |path: &str| raw_http::request(address, "POST", path, &[], None);
    let get = |path: &str| raw_http::request(address, "GET", path, &[], None);

    // A misspelt or unreadable dry run removes nothing (both were read as
    // "not a dry run" before).
    refused(post("/api/prune?dry-run=true"), "\"dry-run\"");
    let error = refused(post("/api/prune?dry_run=yes"), "dry_run");
    assert!(error.contains("\"yes\"") && error.contains("true or false"), "{error}");
    refused(post("/api/prune?dry_run="), "dry_run");
    let (_, list) = json(address, "GET", "/api/jobs", None);
    assert_eq!(list["jobs"].as_array().unwrap().len(), 1, "nothing was removed: {list}");
    let named = post("/api/prune?dry_run=1");
    assert_eq!((named.status, &named.json()["dry_run"]), (200, &Value::Bool(true)), "{}", named.body);
    assert_eq!(named.json()["jobs"][0]["job"]["id"], id.as_str());
    let (_, list) = json(address, "GET", "/api/jobs", None);
    assert_eq!(list["jobs"].as_array().unwrap().len(), 1, "a dry run removes nothing: {list}");

    // The recovery check runs for real only when asked in so many words.
    refused(post("/api/recover?dry_run=null"), "dry_run");
    refused(post("/api/recover?here_only=2"), "here_only");
    refused(post("/api/recover?dryrun=true"), "\"dryrun\"");
    let (_, overview) = json(address, "GET", "/api/overview", None);
    assert_eq!(overview["recovery"], Value::Null, "no check ran: {overview}");
    refused(post("/api/detect/noop?run=yes"), "run");

    // Counts are whole numbers from 0; a negative one was read as 0 (all).
    let error = refused(get("/api/jobs?limit=-1"), "limit");
    assert!(error.contains("\"-1\"") && error.contains("whole number"), "{error}");
    refused(get("/api/activities?limit=ten"), "limit");
    refused(get("/api/jobs?stat=failed"), "\"stat\"");
    let (status, list) = json(address, "GET", "/api/jobs?limit=1&state=", None);
    assert_eq!((status, list["jobs"].as_array().map(Vec::len)), (200, Some(1)), "an empty state is no filter");

    // A write that takes no query parameter takes none.
    refused(post(&format!("/api/jobs/{id}/retry?force=1")), "this route takes no query parameter");
    let (_, job) = json(address, "GET", &format!("/api/jobs/{id}"), None);
    assert_eq!(job["state"], "canceled", "not retried: {job}");
}

#[test]
fn a_json_body_that_is_not_json_or_not_of_its_shape_is_refused_as_json_naming_the_place() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "body-token\n").unwrap();
    let server = Server::start(&dir.path().join("data"), &["--token-file", token_file.to_str().unwrap()]);
    let address = server.http.as_str();
    let bearer = ("Authorization", "Bearer body-token");
    let json_type = ("Content-Type", "application/json");
    let put = |headers: &[(&str, &str)], body: &str| {
        raw_http::request(address, "PUT", "/api/policies/noop", headers, Some(body))
    };

    // Before: answers in plain text (415, 400, 422) that the document did not name.
    let untyped = put(&[bearer], r#"{"retry_limit": 2}"#);
    assert_eq!(untyped.status, 415, "{}", untyped.body);
    assert!(untyped.json()["error"].as_str().unwrap().contains("content-type: application/json"), "{}", untyped.body);
    let error = refused(put(&[bearer, json_type], r#"{"retry_limit": 2"#), "line 1 column");
    assert!(error.starts_with("the body is not JSON"), "{error}");
    let error = refused(put(&[bearer, json_type], r#"[2]"#), "line 1 column");
    assert!(error.starts_with("the body does not fit"), "{error}");
    let policy = raw_http::request(address, "GET", "/api/policies/noop", &[bearer], None).json();
    assert_eq!(policy["sources"]["retry_limit"], "default", "nothing was set: {policy}");

    let sign_in =
        |headers: &[(&str, &str)], body: &str| raw_http::request(address, "POST", "/api/session", headers, Some(body));
    assert_eq!(sign_in(&[], r#"{"token": "body-token"}"#).status, 415);
    refused(sign_in(&[json_type], r#"{"token": 7}"#), "token");
    refused(sign_in(&[json_type], "\u{0}"), "line 1 column 1");
    let signed_in = sign_in(&[json_type], r#"{"token": "body-token"}"#);
    assert_eq!(signed_in.status, 200, "{}", signed_in.body);
    assert!(signed_in.header("set-cookie").is_some_and(|c| c.starts_with("jobcenter_session=")));
}

#[test]
fn an_admin_running_alone_pauses_its_scheduler_by_the_id_it_lists() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let address = server.http.as_str();
    let post = |path: &str| raw_http::request(address, "POST", path, &[], None);
    let paused = || json(address, "GET", "/api/instances", None).1["instances"][0].clone();
    let instance = paused();
    assert_eq!((&instance["id"], &instance["paused"]), (&json!("local"), &json!(false)), "{instance}");

    // The console pauses an instance by the id it lists: `local` was refused as not a UUID.
    let answer = post("/api/scheduler/pause?instance=local");
    assert_eq!((answer.status, &answer.json()["changed"]), (200, &json!(1)), "{}", answer.body);
    assert_eq!(paused()["paused"], true);
    let answer = post("/api/scheduler/resume?instance=local");
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(paused()["paused"], false);

    // Another instance's id is no instance here; a word that is no id is refused.
    let answer = post("/api/scheduler/pause?instance=0190a2b4-0000-7000-8000-000000000009");
    assert_eq!(answer.status, 404, "{}", answer.body);
    assert!(answer.json()["error"].as_str().unwrap().contains("\"local\""), "{}", answer.body);
    refused(post("/api/scheduler/pause?instance=everyone"), "\"everyone\"");
    assert_eq!(paused()["paused"], false, "neither paused it");
}

#[test]
fn a_method_or_path_the_api_does_not_serve_is_405_or_404_whoever_asks() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "route-token\n").unwrap();
    let server = Server::start(&dir.path().join("data"), &["--token-file", token_file.to_str().unwrap()]);
    let address = server.http.as_str();
    let signed_in = raw_http::request(
        address,
        "POST",
        "/api/session",
        &[("Content-Type", "application/json")],
        Some(r#"{"token": "route-token"}"#),
    );
    let cookie = signed_in.header("set-cookie").and_then(|c| c.split(';').next()).unwrap().to_string();

    // A session without its anti-forgery token got 403 for a method no route serves.
    let trace = raw_http::request(address, "TRACE", "/api/session", &[("Cookie", &cookie)], None);
    assert_eq!(trace.status, 405, "{}", trace.body);
    assert_eq!(trace.header("allow"), Some("GET,HEAD,POST,DELETE"));
    // Without a credential: 401 before, whatever the method or path.
    let delete = raw_http::request(address, "DELETE", "/api/jobs", &[], None);
    assert_eq!((delete.status, delete.header("allow")), (405, Some("GET,HEAD,POST")));
    assert_eq!(raw_http::request(address, "GET", "/api/no-such-route", &[], None).status, 404);

    // What is served is guarded as before.
    let listed = raw_http::request(address, "GET", "/api/jobs", &[], None);
    assert_eq!(listed.status, 401, "{}", listed.body);
    let write = raw_http::request(address, "POST", "/api/scheduler/pause", &[("Cookie", &cookie)], None);
    assert_eq!(write.status, 403, "{}", write.body);
    let read = raw_http::request(address, "GET", "/api/jobs", &[("Cookie", &cookie)], None);
    assert_eq!(read.status, 200, "{}", read.body);
}

#[test]
fn a_path_parameter_that_is_not_utf8_is_a_json_400_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let address = server.http.as_str();
    // Before: `Invalid URL: Invalid UTF-8 in `id`` in plain text.
    refused(raw_http::request(address, "GET", "/api/jobs/%FF", &[], None), "path parameter id");
    refused(raw_http::request(address, "GET", "/api/policies/%C0%AF", &[], None), "path parameter job_type");
    let (task, file) = ("/api/jobs/0190a2b4-0000-7000-8000-000000000009/tasks/%FF", "/console/%FF.js");
    refused(raw_http::request(address, "GET", task, &[], None), "path parameter task");
    let console = raw_http::request(address, "GET", file, &[], None);
    assert_eq!((console.status, console.body.as_str()), (404, "no such file\n"));
}

#[test]
fn workers_are_listed_a_page_at_a_time_in_the_order_of_their_ids() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let _fleet = support::fleet::Fleet::connect(&server.grpc, 7);
    let address = &server.http;
    let ids = |page: &Value| -> Vec<String> {
        page["workers"].as_array().unwrap().iter().map(|w| w["worker_id"].as_str().unwrap().to_string()).collect()
    };
    let (status, first) = json(address, "GET", "/api/workers?limit=3", None);
    assert_eq!(status, 200, "{first}");
    assert_eq!(
        (ids(&first), &first["total"], &first["offset"]),
        (vec!["fleet-0".into(), "fleet-1".into(), "fleet-2".into()], &json!(7), &json!(0))
    );
    let (_, last) = json(address, "GET", "/api/workers?offset=6&limit=3", None);
    assert_eq!((ids(&last), &last["total"]), (vec!["fleet-6".to_string()], &json!(7)));
    let (_, all) = json(address, "GET", "/api/workers", None);
    assert_eq!(ids(&all).len(), 7, "a page of 500 when the request names no limit");
    let (_, beyond) = json(address, "GET", "/api/workers?offset=9", None);
    assert_eq!((ids(&beyond).len(), &beyond["total"]), (0, &json!(7)));

    let (status, refused) = json(address, "GET", "/api/workers?limit=5001", None);
    assert_eq!(status, 400);
    assert_eq!(refused["error"], "limit 5001: a page holds at most 5000 workers; page on with offset", "{refused}");
    let (status, refused) = json(address, "GET", "/api/workers?offset=-1", None);
    assert_eq!(status, 400);
    assert!(
        refused["error"].as_str().unwrap().starts_with("query parameter offset: \"-1\" is not a whole number"),
        "{refused}"
    );

    // The client reads every page.
    let listed = server.workers();
    assert_eq!(listed.len(), 7, "{listed:?}");
}

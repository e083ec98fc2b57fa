//! Webhook notifications on real servers, against a real HTTP receiver on
//! loopback: a job's end is in the outbox before its delivery, survives a
//! SIGKILL of the admin, and reaches the endpoint exactly once per event
//! (by idempotency key) once it answers 2xx, signed with its secret; an
//! endpoint that does not answer slows no job and shows its error; a
//! broken notifications file is refused at start with its line, and read
//! again on SIGHUP (a broken one keeping the endpoints before it); a worker
//! killed while it runs a task is told as `worker.lost`; and on one
//! database, an instance lost is told once, by the one instance that delivers;
//! a detection that gets no answer is told as `detection.failed`, and a
//! recovery check that takes a silent worker's attempt back as
//! `recovery.findings`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{self, wait_until, Server};

/// One request the receiver took: its headers (names lowercased), its body,
/// and the status it answered.
#[derive(Clone, Debug)]
struct Delivery {
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
    answered: u16,
}

/// An HTTP endpoint on loopback that records what it is sent and answers
/// the status it is told to; it stops when dropped.
struct Receiver {
    port: u16,
    status: Arc<AtomicU16>,
    seen: Arc<Mutex<Vec<Delivery>>>,
    stop: Arc<AtomicBool>,
}

impl Receiver {
    fn start(status: u16) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let status = Arc::new(AtomicU16::new(status));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (answer, record, halt) = (status.clone(), seen.clone(), stop.clone());
        std::thread::spawn(move || {
            while !halt.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        if let Some(delivery) = serve(stream, answer.load(Ordering::Relaxed)) {
                            record.lock().unwrap().push(delivery);
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Receiver { port, status, seen, stop }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    fn answer(&self, status: u16) {
        self.status.store(status, Ordering::Relaxed);
    }

    fn seen(&self) -> Vec<Delivery> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Reads one request from `stream` and answers `status`.
fn serve(stream: std::net::TcpStream, status: u16) -> Option<Delivery> {
    stream.set_nonblocking(false).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut headers = BTreeMap::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    let length: usize = headers.get("content-length")?.parse().ok()?;
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    let mut stream = stream;
    let answer = format!("HTTP/1.1 {status} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
    stream.write_all(answer.as_bytes()).ok()?;
    Some(Delivery { headers, body, answered: status })
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// `jobcenter notifications --json`: each endpoint by name.
fn listing(server: &Server) -> BTreeMap<String, Value> {
    let endpoints = server.cli_json(&["notifications", "--json"]);
    endpoints.as_array().unwrap().iter().map(|e| (e["name"].as_str().unwrap().to_string(), e.clone())).collect()
}

fn signature(secret: &[u8], body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret).unwrap();
    mac.update(body);
    let hex: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

const DOOMED: &str =
    r#"{"name":"doomed","tasks":[{"id":"t","job_type":"noop","parameters":{"fail":true},"retry_limit":0}]}"#;
const FINE: &str = r#"{"name":"fine","tasks":[{"id":"t","job_type":"noop"}]}"#;

#[test]
fn job_ends_survive_a_kill_of_the_admin_and_each_is_delivered_once_signed() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(500);
    let secret = "a-webhook-secret-7c1f";
    write(dir.path(), "ops.key", &format!("{secret}\n"));
    let notify = write(
        dir.path(),
        "notify.toml",
        &format!(
            "[[endpoint]]\nname = \"ops\"\nurl = \"{}\"\nevents = [\"job.failed\", \"job.succeeded\"]\nsecret_file = \"ops.key\"\n",
            receiver.url()
        ),
    );
    let data = dir.path().join("data");
    let args = ["--local-workers", "1", "--notify", notify.as_str()];
    let mut server = Server::start(&data, &args);
    let doomed = server.submit_file(dir.path(), "doomed", DOOMED);
    let fine = server.submit_file(dir.path(), "fine", FINE);
    let pending = wait_until(Duration::from_secs(30), || {
        let ops = listing(&server).remove("ops")?;
        // The receiver records a try as it answers; the admin counts it once the answer is read.
        let tried = !receiver.seen().is_empty() && ops["failures"].as_u64().is_some_and(|n| n > 0);
        (ops["pending"] == 2 && tried).then_some(ops)
    });
    let ops = pending.unwrap_or_else(|| panic!("both ends wait in the outbox: {:?}", listing(&server)));
    assert!(ops["last_error"].as_str().unwrap().contains("500"), "{ops}");
    assert_eq!(ops["signed"], true);
    assert!(!ops.to_string().contains(secret), "the listing shows no secret");
    server.process.kill();

    receiver.answer(200);
    let server = Server::start(&data, &args);
    let delivered = wait_until(Duration::from_secs(60), || {
        let ops = listing(&server).remove("ops")?;
        let ok = receiver.seen().iter().filter(|d| d.answered == 200).count();
        (ops["pending"] == 0 && ok >= 2).then_some(ops)
    });
    let ops = delivered.unwrap_or_else(|| panic!("delivered after the restart: {:?}", listing(&server)));
    assert_eq!(ops["last_error"], "", "{ops}");
    assert!(ops["last_delivery_ms"].as_i64().unwrap() > 0);
    // Nothing more comes.
    std::thread::sleep(Duration::from_secs(2));
    let seen = receiver.seen();
    let mut ok_by_key: BTreeMap<String, usize> = BTreeMap::new();
    let mut jobs = BTreeSet::new();
    for delivery in &seen {
        let key = delivery.headers["idempotency-key"].clone();
        let body: Value = serde_json::from_slice(&delivery.body).unwrap();
        assert_eq!(body["id"], key.as_str(), "the key is the event's id");
        assert_eq!(delivery.headers["x-jobcenter-event"], body["kind"].as_str().unwrap());
        assert_eq!(delivery.headers["x-jobcenter-signature"], signature(secret.as_bytes(), &delivery.body));
        assert_eq!(delivery.headers["content-type"], "application/json");
        let job = body["payload"]["job"]["id"].as_str().unwrap().to_string();
        let kind = if job == doomed { "job.failed" } else { "job.succeeded" };
        assert_eq!(body["kind"], kind, "{body}");
        if job == doomed {
            assert_eq!(body["payload"]["failed_tasks"][0]["id"], "t");
            assert_eq!(body["payload"]["job"]["state"], "failed");
        }
        jobs.insert(job);
        if delivery.answered == 200 {
            *ok_by_key.entry(key).or_default() += 1;
        }
    }
    assert_eq!(
        jobs,
        BTreeSet::from([doomed.clone(), fine.clone()]),
        "only these jobs' events, the tries before the kill included"
    );
    assert_eq!(ok_by_key.len(), 2, "{ok_by_key:?}");
    assert!(ok_by_key.values().all(|n| *n == 1), "one successful delivery per event: {ok_by_key:?}");
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(!log.contains(secret), "the log shows no secret");
    let metrics = support::raw_http::request(&server.http, "GET", "/metrics", &[], None);
    assert!(!metrics.body.contains(secret), "the metrics show no secret");
}

#[test]
fn an_endpoint_that_does_not_answer_slows_no_job_and_shows_its_error() {
    let dir = tempfile::tempdir().unwrap();
    // Connections are taken by the kernel but nobody reads or answers them.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = crate::support::free_port();
    let notify = write(
        dir.path(),
        "notify.yaml",
        &format!(
            "endpoint:\n  - name: silent\n    url: http://{}/hook\n    events: [job.succeeded]\n  \
             - name: closed\n    url: http://127.0.0.1:{closed}/\n    events: [job.succeeded, job.failed]\n",
            silent.local_addr().unwrap()
        ),
    );
    let server = Server::start(&dir.path().join("data"), &["--local-workers", "1", "--notify", notify.as_str()]);
    for n in 0..3 {
        let began = Instant::now();
        let file = dir.path().join(format!("fine{n}.json"));
        std::fs::write(&file, FINE).unwrap();
        let output = server.cli(&["submit", file.to_str().unwrap(), "--wait"]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        assert!(began.elapsed() < Duration::from_secs(5), "job {n} took {:?}", began.elapsed());
    }
    let shown = wait_until(Duration::from_secs(40), || {
        let endpoints = listing(&server);
        let (silent, closed) = (endpoints.get("silent")?, endpoints.get("closed")?);
        let errors = (silent["last_error"].as_str()?, closed["last_error"].as_str()?);
        (errors.0.contains("no answer") && errors.1.contains("connecting")).then(|| endpoints.clone())
    });
    let endpoints = shown.unwrap_or_else(|| panic!("both errors shown: {:?}", listing(&server)));
    assert_eq!(endpoints["silent"]["pending"], 3);
    assert_eq!(endpoints["closed"]["pending"], 3);
    assert_eq!(endpoints["silent"]["events"], serde_json::json!(["job.succeeded"]));
    let http = support::raw_http::request(&server.http, "GET", "/api/notifications", &[], None);
    assert_eq!(http.status, 200);
    let body: Value = serde_json::from_str(&http.body).unwrap();
    assert_eq!(body["endpoints"].as_array().unwrap().len(), 2);
    drop(silent);
}

#[test]
fn a_broken_notifications_file_is_refused_at_start_naming_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "n.toml",
            "# hooks\n[[endpoint]]\nname = \"ops\"\nurl = \"http://h/\"\nevents = [\"job.exploded\"]\n".to_string(),
            ":2: endpoint ops: unknown event \"job.exploded\"",
        ),
        (
            "u.toml",
            "[[endpoint]]\nname = \"ops\"\nurl = \"http://h/\"\nevents = [\"job.failed\"]\nretries = 3\n".to_string(),
            ":5: unknown field `retries`",
        ),
        (
            "s.yaml",
            "endpoint:\n  - name: ops\n    url: http://h/\n    events: [job.failed]\n    secret_file: missing.key\n"
                .to_string(),
            ":2: endpoint ops: the secret_file ",
        ),
    ];
    for (name, text, rule) in cases {
        let file = write(dir.path(), name, &text);
        let mut command = std::process::Command::new(support::binary());
        command.args(["server", "--data-dir", dir.path().join("data").to_str().unwrap(), "--http", "127.0.0.1:0"]);
        command.args(["--grpc", "0", "--notify", &file]);
        let output = support::run_with_timeout(command, Duration::from_secs(30));
        assert_eq!(output.status.code(), Some(2), "the usage exit code");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(stderr.trim().starts_with(&format!("jobcenter: {file}{rule}")), "{stderr}");
    }
}

#[test]
fn a_file_read_again_on_sighup_and_a_worker_lost_while_running_is_told() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(200);
    let endpoint =
        |events: &str| format!("[[endpoint]]\nname = \"ops\"\nurl = \"{}\"\nevents = [{events}]\n", receiver.url());
    let notify = write(dir.path(), "notify.toml", &endpoint("\"job.failed\""));
    let server = Server::start(&dir.path().join("data"), &["--notify", notify.as_str()]);
    let events = |server: &Server| listing(server).get("ops").map(|ops| ops["events"].clone());
    assert_eq!(events(&server), Some(serde_json::json!(["job.failed"])));
    write(
        dir.path(),
        "notify.toml",
        "[[endpoint]]\nname = \"ops\"\nurl = \"gopher://h/\"\nevents = [\"worker.lost\"]\n",
    );
    let pid = nix::unistd::Pid::from_raw(server.process.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(events(&server), Some(serde_json::json!(["job.failed"])), "a broken file keeps the endpoints before it");
    write(dir.path(), "notify.toml", &endpoint("\"worker.lost\""));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    let read =
        wait_until(Duration::from_secs(10), || (events(&server)? == serde_json::json!(["worker.lost"])).then_some(()));
    assert!(read.is_some(), "read again: {:?}", listing(&server));

    let mut worker = support::start_worker(&server, "w1", &[], None);
    server.wait_for_workers(1);
    let job = server.submit_file(
        dir.path(),
        "long",
        r#"{"name":"long","tasks":[{"id":"t","job_type":"noop","parameters":{"sleep_ms":60000}}]}"#,
    );
    let running = wait_until(Duration::from_secs(20), || {
        let job = server.cli_json(&["job", &job, "--json"]);
        (support::states(&job) == [("t".to_string(), "running".to_string())]).then_some(())
    });
    assert!(running.is_some(), "the task runs on w1");
    worker.kill();
    let told = wait_until(Duration::from_secs(20), || {
        receiver
            .seen()
            .into_iter()
            .find(|d| d.headers.get("x-jobcenter-event").map(String::as_str) == Some("worker.lost"))
    });
    let delivery = told.unwrap_or_else(|| panic!("worker.lost delivered: {:?}", listing(&server)));
    let body: Value = serde_json::from_slice(&delivery.body).unwrap();
    assert_eq!(body["payload"]["worker"], "w1", "{body}");
    assert_eq!(body["payload"]["attempts"][0]["job"], job.as_str(), "{body}");
    assert!(!delivery.headers.contains_key("x-jobcenter-signature"), "no secret, no signature");
}

#[test]
fn on_one_database_an_instance_lost_is_told_once_by_the_instance_that_delivers() {
    let pg = support::postgres::shared();
    let database = pg.new_database();
    let url = pg.url(&database);
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(200);
    let file = format!(
        "[[endpoint]]\nname = \"ops\"\nurl = \"{}\"\nevents = [\"instance.lost\", \"job.failed\"]\n",
        receiver.url()
    );
    let notify = write(dir.path(), "notify.toml", &file);
    let start = |name: &str| {
        let free = crate::support::free_port;
        let (http, grpc) = (format!("127.0.0.1:{}", free()), free().to_string());
        let args = [
            "--database-url",
            &url,
            "--grpc",
            &grpc,
            "--notify",
            &notify,
            "--cluster-heartbeat",
            "1s",
            "--lag-threshold",
            "4s",
        ];
        Server::start_on(&dir.path().join(name), &http, &args)
    };
    let (a, b, mut c) = (start("a"), start("b"), start("c"));
    let id_of = |server: &Server| {
        let instances = server.cli_json(&["instances", "--json"]);
        let me = instances.as_array().unwrap().iter().find(|i| i["answering"] == true).cloned();
        me.unwrap()["id"].as_str().unwrap().to_string()
    };
    let gone = id_of(&c);
    // A job that fails, at a, with its worker.
    let _worker = support::start_worker(&a, "w1", &[], None);
    a.wait_for_workers(1);
    let job = a.submit_file(dir.path(), "doomed", DOOMED);
    c.process.kill();

    let told = wait_until(Duration::from_secs(60), || {
        let seen = receiver.seen();
        let lost = seen.iter().any(|d| d.headers.get("x-jobcenter-event").map(String::as_str) == Some("instance.lost"));
        let failed = seen.iter().any(|d| d.headers.get("x-jobcenter-event").map(String::as_str) == Some("job.failed"));
        (lost && failed).then_some(seen)
    });
    assert!(told.is_some(), "both told: {:?}", receiver.seen());
    // Give a second deliverer, were there one, the time to deliver again.
    std::thread::sleep(Duration::from_secs(3));
    let seen = receiver.seen();
    let by_key: BTreeMap<String, usize> = seen.iter().fold(BTreeMap::new(), |mut counts, d| {
        *counts.entry(d.headers["idempotency-key"].clone()).or_default() += 1;
        counts
    });
    assert!(by_key.values().all(|n| *n == 1), "each event delivered once: {by_key:?}");
    let lost: Vec<Value> = seen
        .iter()
        .filter(|d| d.headers["x-jobcenter-event"] == "instance.lost")
        .map(|d| serde_json::from_slice(&d.body).unwrap())
        .collect();
    assert_eq!(lost.len(), 1, "one instance lost, told once: {lost:?}");
    assert_eq!(lost[0]["payload"]["instance"], gone.as_str());
    let failed: Vec<Value> = seen
        .iter()
        .filter(|d| d.headers["x-jobcenter-event"] == "job.failed")
        .map(|d| serde_json::from_slice(&d.body).unwrap())
        .collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["payload"]["job"]["id"], job.as_str());
    for server in [&a, &b] {
        let pending = listing(server)["ops"]["pending"].as_u64();
        assert_eq!(pending, Some(0), "nothing left in the outbox");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detection_that_fails_is_told() {
    use jobcenter::proto::plugin::plugin_control_service_client::PluginControlServiceClient;
    use jobcenter::proto::plugin::worker_to_admin_message::Body;
    use jobcenter::proto::plugin::{JobTypeCapability, WorkerHello, WorkerToAdminMessage};
    use tokio_stream::wrappers::ReceiverStream;

    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(200);
    let file = format!("[[endpoint]]\nname = \"ops\"\nurl = \"{}\"\nevents = [\"detection.failed\"]\n", receiver.url());
    let notify = write(dir.path(), "notify.toml", &file);
    let server = Server::start(&dir.path().join("data"), &["--notify", notify.as_str()]);
    let set = server.cli(&["policy", "set", "noop", "detection_enabled=0", "detection_timeout_seconds=1"]);
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    // A detector that takes detection requests and never answers them.
    let mut client = PluginControlServiceClient::connect(format!("http://{}", server.grpc)).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let hello = WorkerHello {
        worker_id: "mute".into(),
        worker_instance_id: uuid::Uuid::new_v4().to_string(),
        capabilities: vec![JobTypeCapability { job_type: "noop".into(), can_detect: true, ..Default::default() }],
        ..WorkerHello::default()
    };
    tx.send(WorkerToAdminMessage { body: Some(Body::Hello(hello)), ..Default::default() }).await.unwrap();
    let mut inbound = client.worker_stream(ReceiverStream::new(rx)).await.unwrap().into_inner();
    tokio::spawn(async move { while let Ok(Some(_)) = inbound.message().await {} });
    server.wait_for_workers(1);

    assert!(!server.cli(&["detect", "noop", "--run"]).status.success());
    let told = wait_until(Duration::from_secs(20), || {
        let seen = receiver.seen();
        seen.into_iter().find(|d| d.headers.get("x-jobcenter-event").map(String::as_str) == Some("detection.failed"))
    });
    let delivery = told.unwrap_or_else(|| panic!("detection.failed delivered: {:?}", listing(&server)));
    let body: Value = serde_json::from_slice(&delivery.body).unwrap();
    assert_eq!(body["payload"]["job_type"], "noop", "{body}");
    assert!(body["payload"]["error"].as_str().unwrap().contains("no detection result"), "{body}");
    drop(tx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_check_that_acts_is_told_with_its_findings() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(200);
    let file =
        format!("[[endpoint]]\nname = \"ops\"\nurl = \"{}\"\nevents = [\"recovery.findings\"]\n", receiver.url());
    let notify = write(dir.path(), "notify.toml", &file);
    let server = Server::start(
        &dir.path().join("data"),
        &["--notify", notify.as_str(), "--silence-timeout", "3s", "--heartbeat", "1s", "--recovery-interval", "500ms"],
    );
    // A worker that starts what it is given and then says nothing, its stream open: rule R3's.
    let _silent = crate::recovery_e2e::silent_worker(&server).await;
    server.wait_for_workers(1);
    let job = server.submit_file(
        dir.path(),
        "one",
        r#"{"name":"one","tasks":[{"id":"work","job_type":"noop","parameters":{"sleep_ms":60000}}]}"#,
    );
    let told = wait_until(Duration::from_secs(30), || {
        let seen = receiver.seen();
        seen.into_iter().find(|d| d.headers.get("x-jobcenter-event").map(String::as_str) == Some("recovery.findings"))
    });
    let delivery = told.unwrap_or_else(|| panic!("recovery.findings delivered: {:?}", listing(&server)));
    let body: Value = serde_json::from_slice(&delivery.body).unwrap();
    let findings = body["payload"]["findings"].as_array().unwrap();
    assert!(
        findings.iter().any(|f| f["rule"] == "R3" && f["job_id"] == job.as_str() && f["applied"] == true),
        "the silent worker's attempt taken back: {body}"
    );
}

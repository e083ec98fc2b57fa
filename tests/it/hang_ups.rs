//! Clients that hang up, vanish or read slowly, against a real server
//! process. Every HTTP route and every gRPC method is called and the client
//! gives up at a spread of moments (before the answer, mid-answer, mid-body,
//! mid-stream); afterwards nothing is latched (the recovery check, the prune
//! and detection run again, the periodic check too), no duty is left running
//! and no task of the server's is left behind. A thousand watchers over SSE
//! and a thousand over gRPC that connect and vanish leave no task nor
//! subscription behind. A client that reads a byte a second holds its
//! connection no longer than `--send-timeout`, while other clients are
//! served meanwhile.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use jobcenter::proto::api::job_service_client::JobServiceClient;
use jobcenter::proto::api::{self as api};
use jobcenter::proto::peer::peer_service_client::PeerServiceClient;
use jobcenter::proto::peer::{self as peer};
use jobcenter::proto::plugin::plugin_control_service_client::PluginControlServiceClient;
use jobcenter::proto::plugin::{worker_to_admin_message::Body, WorkerHello, WorkerToAdminMessage};
use support::{wait_until, Server};

/// The moments, after the request went out, at which a client gives up.
const CUTS_MS: [u64; 8] = [0, 1, 3, 10, 30, 100, 300, 1000];

/// A job of `n` independent `noop` tasks that no worker runs: it stays
/// pending, every task ready, so that reading it and checking it take a while.
fn wide_job(n: usize) -> String {
    let tasks: Vec<String> =
        (0..n).map(|i| format!(r#"{{"id":"t{i}","job_type":"noop","parameters":{{"sleep_ms":1}}}}"#)).collect();
    format!(r#"{{"name":"wide","tasks":[{}]}}"#, tasks.join(","))
}

fn submit(server: &Server, dir: &std::path::Path, text: &str) -> String {
    let file = dir.join(format!("job-{}.json", uuid::Uuid::new_v4()));
    std::fs::write(&file, text).unwrap();
    let output = server.cli(&["submit", file.to_str().unwrap()]);
    assert!(output.status.success(), "submit: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

/// One HTTP/1.1 request's bytes; the connection is kept alive, as
/// browsers and curl keep it.
fn request(method: &str, path: &str, body: &str) -> Vec<u8> {
    let mut text = format!("{method} {path} HTTP/1.1\r\nHost: test\r\n");
    if !body.is_empty() || method != "GET" {
        text.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
    }
    text.push_str("\r\n");
    text.push_str(body);
    text.into_bytes()
}

/// Sends `bytes` (all of them, or only up to `keep`) and closes the
/// connection `cut` later without reading the answer.
fn hang_up(address: &str, bytes: &[u8], keep: Option<usize>, cut: Duration) {
    let Ok(mut stream) = TcpStream::connect(address) else { return };
    let sent = &bytes[..keep.unwrap_or(bytes.len()).min(bytes.len())];
    let _ = stream.write_all(sent);
    std::thread::sleep(cut);
    drop(stream);
}

/// A whole HTTP exchange: status and body.
fn http(address: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut bytes = request(method, path, body);
    let head_end = bytes.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
    bytes.splice(head_end..head_end, b"Connection: close\r\n".iter().copied());
    stream.write_all(&bytes).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).expect("read the answer");
    let text = String::from_utf8_lossy(&answer).to_string();
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

/// A metric's value, summed over its label sets when `label` is empty.
fn metric(server: &Server, name: &str, label: &str) -> f64 {
    let (_, text) = http(&server.http, "GET", "/metrics", "");
    text.lines()
        .filter(|line| {
            line.starts_with(name)
                && line[name.len()..].starts_with(['{', ' '])
                && (label.is_empty() || line.contains(label))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn duties_running(server: &Server) -> f64 {
    metric(server, "jobcenter_duties_running", "")
}

/// The server's resident memory, in KiB.
fn rss_kib(server: &mut Server) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.process.child.id())).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Waits until the server's runtime holds no more tasks than `at_most`.
fn tasks_settle(server: &Server, at_most: f64, limit: Duration) -> f64 {
    let mut last = 0.0;
    let settled = wait_until(limit, || {
        last = metric(server, "jobcenter_runtime_tasks", "");
        (last <= at_most).then_some(last)
    });
    settled.unwrap_or_else(|| panic!("the server's runtime holds {last} tasks, more than {at_most}, {limit:?} on"))
}

fn start(dir: &std::path::Path, extra: &[&str]) -> Server {
    let mut args = vec!["--recovery-interval", "5s", "--prune-interval", "1h", "--send-timeout", "3s"];
    args.extend_from_slice(extra);
    Server::start(&dir.join("data"), &args)
}

/// A detector for `noop` that answers every detection a second late.
async fn slow_detector(server: &Server) -> tokio::task::JoinHandle<()> {
    use jobcenter::proto::plugin::{admin_to_worker_message, DetectionComplete};
    let (tx, mut inbound) = support::noop_detector(server, "slow-detector").await;
    tokio::spawn(async move {
        while let Ok(Some(message)) = inbound.message().await {
            if let Some(admin_to_worker_message::Body::RunDetectionRequest(request)) = message.body {
                let tx = tx.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let done = DetectionComplete {
                        request_id: message.request_id,
                        job_type: request.job_type,
                        success: true,
                        ..DetectionComplete::default()
                    };
                    let _ = tx
                        .send(WorkerToAdminMessage { body: Some(Body::DetectionComplete(done)), ..Default::default() })
                        .await;
                });
            }
        }
    })
}

/// Every gRPC method, called at once, each given up on after `cut`.
async fn grpc_hang_ups(address: &str, job: &str, cut: Duration) {
    let endpoint = format!("http://{address}");
    let client = JobServiceClient::connect(endpoint.clone()).await.unwrap();
    let peers = PeerServiceClient::connect(endpoint.clone()).await.unwrap();
    let workers = PluginControlServiceClient::connect(endpoint).await.unwrap();
    let job: &'static str = Box::leak(job.to_string().into_boxed_str());
    let job_ref = move || api::JobRef { job_id: job.to_string() };
    let mut calls = tokio::task::JoinSet::new();
    // A call on a clone of `$client`, given up on after `cut`.
    macro_rules! cut {
        ($client:ident, $call:expr) => {{
            let mut $client = $client.clone();
            calls.spawn(async move {
                let _ = tokio::time::timeout(cut, $call).await;
            });
        }};
    }
    // A server stream: taken, read for `cut`, then dropped.
    macro_rules! cut_stream {
        ($client:ident, $call:expr) => {{
            let mut $client = $client.clone();
            calls.spawn(async move {
                let read = async {
                    if let Ok(response) = $call.await {
                        let mut stream = response.into_inner();
                        while let Ok(Some(_)) = stream.message().await {}
                    }
                };
                let _ = tokio::time::timeout(cut, read).await;
            });
        }};
    }
    let job_file = wide_job(2_000);
    let content = job_file.clone().into_bytes();
    cut!(
        client,
        client.submit_job(api::SubmitJobRequest { content, format: "json".into(), source_name: "cut.json".into() })
    );
    // A streamed submission whose sender hangs up after its first chunk.
    let half = job_file.as_bytes()[..job_file.len() / 2].to_vec();
    cut!(client, async {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let chunk = api::SubmitJobChunk { content: half, format: "json".into(), source_name: "cut.json".into() };
        tx.send(chunk).await.unwrap();
        let sent = client.submit_job_stream(tokio_stream::wrappers::ReceiverStream::new(rx)).await;
        drop(tx);
        sent
    });
    cut!(client, client.get_job(job_ref()));
    cut_stream!(client, client.read_job(job_ref()));
    cut!(client, client.list_jobs(api::ListJobsRequest::default()));
    cut_stream!(client, client.watch_job(job_ref()));
    cut!(client, client.wait_job(job_ref()));
    cut!(client, client.list_workers(api::ListWorkersRequest::default()));
    cut!(client, client.get_policy(api::PolicyRef { job_type: "noop".into() }));
    let values = [("detection_interval_seconds".to_string(), "3600".to_string())].into();
    cut!(client, client.set_policy(api::SetPolicyRequest { job_type: "noop".into(), values }));
    cut!(client, client.recover(api::RecoverRequest { dry_run: false, here_only: false }));
    cut!(client, client.recover(api::RecoverRequest { dry_run: true, here_only: true }));
    cut!(client, client.detect(api::DetectRequest { job_type: "noop".into(), run: false }));
    cut!(client, client.list_activities(api::ListActivitiesRequest::default()));
    cut!(client, client.list_runs(api::PolicyRef { job_type: "noop".into() }));
    cut!(client, client.list_instances(api::ListInstancesRequest::default()));
    cut!(client, client.get_capacity(api::CapacityRequest::default()));
    let pause = api::SetSchedulerPausedRequest { paused: false, instance: String::new() };
    cut!(client, client.set_scheduler_paused(pause));
    cut!(client, client.prune(api::PruneRequest { dry_run: false }));
    cut!(client, client.prune(api::PruneRequest { dry_run: true }));
    cut_stream!(client, client.backup(api::BackupRequest::default()));
    cut!(peers, peers.dedupe_keys(peer::DedupeKeysRequest::default()));
    let handler = uuid::Uuid::new_v4().to_string();
    cut!(peers, peers.knows(peer::KnowsRequest { handler, attempt_ids: vec![] }));
    cut!(peers, peers.lend(peer::LendRequest::default()));
    cut!(peers, peers.report(peer::PeerReport::default()));
    cut!(peers, peers.cancel(peer::PeerCancel::default()));
    // A worker that hangs up before, with or after its hello.
    let hello = WorkerHello {
        worker_id: "cut-worker".into(),
        worker_instance_id: uuid::Uuid::new_v4().to_string(),
        ..WorkerHello::default()
    };
    let say_hello = cut > Duration::from_millis(10);
    cut_stream!(workers, async {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        if say_hello {
            let _ = tx.send(WorkerToAdminMessage { body: Some(Body::Hello(hello)), ..Default::default() }).await;
        }
        let opened = workers.worker_stream(tokio_stream::wrappers::ReceiverStream::new(rx)).await;
        tokio::spawn(async move {
            tokio::time::sleep(cut).await;
            drop(tx);
        });
        opened
    });
    while calls.join_next().await.is_some() {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_hang_up_leave_nothing_latched_or_running() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let _detector = slow_detector(&server).await;
    // 100,000 ready tasks: a recovery check takes long enough to be cut.
    let job = submit(&server, dir.path(), &wide_job(100_000));
    // A job with one task, canceled and retried through the API below.
    let small = submit(&server, dir.path(), &wide_job(1));
    // Settled: the periodic check has run at least once.
    let overview =
        || serde_json::from_str::<serde_json::Value>(&http(&server.http, "GET", "/api/overview", "").1).unwrap();
    wait_until(Duration::from_secs(20), || overview()["recovery"]["at_ms"].as_i64())
        .expect("the periodic recovery check ran");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let baseline = metric(&server, "jobcenter_runtime_tasks", "");
    let subscribers = metric(&server, "jobcenter_event_subscribers", "");
    assert!(baseline > 0.0, "the server reports its tasks");

    let policy = r#"{"detection_interval_seconds":"3600"}"#;
    let session = r#"{"token":"x"}"#;
    let routes: Vec<(&str, String, String)> = vec![
        ("GET", "/".into(), String::new()),
        ("GET", "/console/app.js".into(), String::new()),
        ("GET", "/api/session".into(), String::new()),
        ("POST", "/api/session".into(), session.into()),
        ("DELETE", "/api/session".into(), String::new()),
        ("GET", "/api/overview".into(), String::new()),
        ("GET", format!("/api/jobs/{job}/graph"), String::new()),
        ("GET", format!("/api/jobs/{job}/tasks/t7"), String::new()),
        ("GET", format!("/api/jobs/{job}/events"), String::new()),
        ("GET", "/api/job-types".into(), String::new()),
        ("GET", "/api/job-types/noop".into(), String::new()),
        ("GET", "/api/plugin/status".into(), String::new()),
        ("GET", "/healthz".into(), String::new()),
        ("GET", "/readyz".into(), String::new()),
        ("GET", "/api/jobs".into(), String::new()),
        ("POST", "/api/jobs".into(), wide_job(2_000)),
        ("GET", format!("/api/jobs/{job}"), String::new()),
        ("POST", format!("/api/jobs/{small}/cancel"), String::new()),
        ("POST", format!("/api/jobs/{small}/retry"), String::new()),
        ("GET", "/api/workers".into(), String::new()),
        ("GET", "/api/instances".into(), String::new()),
        ("GET", "/api/capacity".into(), String::new()),
        ("POST", "/api/scheduler/pause".into(), String::new()),
        ("POST", "/api/scheduler/resume".into(), String::new()),
        ("GET", "/api/stats".into(), String::new()),
        ("POST", "/api/recover".into(), String::new()),
        ("POST", "/api/recover?dry_run=true".into(), String::new()),
        ("POST", "/api/prune".into(), String::new()),
        ("POST", "/api/prune?dry_run=true".into(), String::new()),
        ("POST", "/api/detect/noop".into(), String::new()),
        ("POST", "/api/detect/noop?run=true".into(), String::new()),
        ("GET", "/api/activities".into(), String::new()),
        ("GET", "/api/runs/noop".into(), String::new()),
        ("GET", "/api/policies/noop".into(), String::new()),
        ("PUT", "/api/policies/noop".into(), policy.into()),
        ("GET", "/api/openapi.json".into(), String::new()),
        ("GET", "/metrics".into(), String::new()),
    ];
    // Each round: every route at once, HTTP and gRPC, all given up on at
    // the same moment after they went out.
    let mut calls = 0;
    for cut in CUTS_MS.map(Duration::from_millis) {
        let mut hang_ups = Vec::new();
        for (method, path, body) in &routes {
            let bytes = request(method, path, body);
            let mut keeps = vec![None];
            if !body.is_empty() {
                // Hung up mid-body: the headers promise more than comes.
                keeps.push(Some(bytes.len() - body.len() / 2));
            }
            for keep in keeps {
                let (address, bytes) = (server.http.clone(), bytes.clone());
                hang_ups.push(std::thread::spawn(move || hang_up(&address, &bytes, keep, cut)));
                calls += 1;
            }
        }
        grpc_hang_ups(&server.grpc, &job, cut).await;
        for hang_up in hang_ups {
            hang_up.join().unwrap();
        }
    }
    assert!(calls > routes.len() * CUTS_MS.len());
    // The single-flight duties alone, one call at a time, so that a cut
    // falls inside the duty: a recovery check over 100,000 ready tasks, a
    // detection whose detector answers a second late.
    let mut client = JobServiceClient::connect(format!("http://{}", server.grpc)).await.unwrap();
    for cut in (0..12).map(|n| Duration::from_millis(n * 15)) {
        for path in ["/api/recover", "/api/detect/noop"] {
            hang_up(&server.http, &request("POST", path, ""), None, cut);
        }
        let recover = client.recover(api::RecoverRequest { dry_run: false, here_only: false });
        let _ = tokio::time::timeout(cut, recover).await;
        let detect = client.detect(api::DetectRequest { job_type: "noop".into(), run: true });
        let _ = tokio::time::timeout(cut, detect).await;
        calls += 4;
    }

    // Nothing latched: every duty ends, and each runs again when asked.
    let mut running = 0.0;
    wait_until(Duration::from_secs(20), || {
        running = duties_running(&server);
        (running == 0.0).then_some(())
    })
    .unwrap_or_else(|| panic!("{running} duties still run 20 s after their clients hung up"));
    let recovered = server.cli(&["recover", "--json"]);
    assert!(recovered.status.success(), "recover: {}", String::from_utf8_lossy(&recovered.stderr));
    let pruned = server.cli(&["prune", "--json"]);
    assert!(pruned.status.success(), "prune: {}", String::from_utf8_lossy(&pruned.stderr));
    let (status, body) = http(&server.http, "POST", "/api/detect/noop", "");
    assert_eq!(status, 200, "a detection runs again: {body}");
    // The periodic check too.
    let before = overview()["recovery"]["at_ms"].as_i64().unwrap();
    wait_until(Duration::from_secs(20), || (overview()["recovery"]["at_ms"].as_i64()? > before).then_some(()))
        .expect("the periodic recovery check runs again");

    // Nothing left running: the server's tasks and subscriptions return
    // to where they were (a margin of 2 for a periodic duty under way).
    let tasks = tasks_settle(&server, baseline + 2.0, Duration::from_secs(30));
    let now_subscribed = metric(&server, "jobcenter_event_subscribers", "");
    assert!(now_subscribed <= subscribers, "subscriptions left behind: {now_subscribed} against {subscribers}");
    eprintln!(
        "hang-ups: {calls} HTTP calls and {} gRPC rounds cut; tasks {baseline} before, {tasks} after",
        CUTS_MS.len()
    );

    // Every job the server holds is whole: a cut submission is stored
    // whole (2,000 tasks) or not at all.
    let jobs = server.cli_json(&["jobs", "--json"]);
    let jobs = jobs.as_array().expect("a list of jobs");
    assert!(jobs.len() >= 2);
    for summary in jobs {
        let id = summary["id"].as_str().unwrap();
        let whole = server.cli_json(&["job", id, "--json"]);
        let stored = whole["tasks"].as_array().map_or(0, Vec::len);
        assert!([1, 2_000, 100_000].contains(&stored), "job {id} holds {stored} tasks");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_that_vanish_leave_no_task_or_subscription_behind() {
    const WATCHERS: usize = 1_000;
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), &[]);
    // A quiet job: nobody runs its task, so no event reminds a watcher's
    // task that its watcher is gone.
    let job = submit(&server, dir.path(), &wide_job(1));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (tasks_before, subscribed_before, rss_before) = (
        metric(&server, "jobcenter_runtime_tasks", ""),
        metric(&server, "jobcenter_event_subscribers", ""),
        rss_kib(&mut server),
    );

    // 1,000 over SSE, each on its own connection, each reading its first event.
    let address = server.http.clone();
    let path = format!("/api/jobs/{job}/events");
    let sse = tokio::task::spawn_blocking(move || {
        (0..WATCHERS)
            .map(|_| {
                let mut stream = TcpStream::connect(&address).expect("connect");
                stream.write_all(&request("GET", &path, "")).unwrap();
                stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let mut first = [0u8; 64];
                let n = stream.read(&mut first).expect("the events begin");
                assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
                stream
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    // 1,000 over gRPC, on one connection, each having read its snapshot.
    let mut client = JobServiceClient::connect(format!("http://{}", server.grpc)).await.unwrap();
    let mut streams = Vec::with_capacity(WATCHERS);
    for _ in 0..WATCHERS {
        let mut stream = client.watch_job(api::JobRef { job_id: job.clone() }).await.unwrap().into_inner();
        stream.message().await.unwrap().expect("the snapshot");
        streams.push(stream);
    }
    let (tasks_during, subscribed_during, rss_during) = (
        metric(&server, "jobcenter_runtime_tasks", ""),
        metric(&server, "jobcenter_event_subscribers", ""),
        rss_kib(&mut server),
    );
    assert!(
        subscribed_during >= subscribed_before + (2 * WATCHERS) as f64,
        "{subscribed_during} subscriptions with {} watchers, {subscribed_before} before",
        2 * WATCHERS
    );

    // They vanish: sockets closed, streams dropped, the connection too.
    drop(sse);
    drop(streams);
    drop(client);
    let tasks_after = tasks_settle(&server, tasks_before + 2.0, Duration::from_secs(30));
    let subscribed_after = wait_until(Duration::from_secs(30), || {
        let now = metric(&server, "jobcenter_event_subscribers", "");
        (now <= subscribed_before).then_some(now)
    })
    .expect("every watcher's subscription ends with it");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_after = rss_kib(&mut server);
    eprintln!(
        "watchers: tasks {tasks_before} / {tasks_during} / {tasks_after}; subscriptions {subscribed_before} / \
         {subscribed_during} / {subscribed_after}; RSS {rss_before} / {rss_during} / {rss_after} KiB \
         (before / with {} watchers / after)",
        2 * WATCHERS
    );
}

#[test]
fn a_client_that_reads_a_byte_a_second_is_cut_off_while_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let job = submit(&server, dir.path(), &wide_job(20_000));
    // A large answer, the whole job (several MB of JSON), asked for on a
    // connection whose receive buffer is small.
    let slow = small_buffer_connection(&server.http);
    (&slow).write_all(&request("GET", &format!("/api/jobs/{job}"), "")).unwrap();
    let started = Instant::now();
    let reader = std::thread::spawn(move || {
        let mut stream = slow;
        stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut got = Vec::new();
        let mut byte = [0u8; 1];
        // A byte a second for 8 s (past the 3 s send timeout)...
        for _ in 0..8 {
            match stream.read(&mut byte) {
                Ok(0) | Err(_) => return got,
                Ok(_) => got.push(byte[0]),
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        // ...then whatever is left, at once: a closed connection ends early.
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest);
        got.extend(rest);
        got
    });
    // Meanwhile others are served.
    let mut slowest = Duration::ZERO;
    for _ in 0..40 {
        let asked = Instant::now();
        let (status, _) = http(&server.http, "GET", "/api/overview", "");
        assert_eq!(status, 200);
        slowest = slowest.max(asked.elapsed());
        std::thread::sleep(Duration::from_millis(100));
    }
    let got = reader.join().unwrap();
    let text = String::from_utf8_lossy(&got);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no answer's head: {text:?}"));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // The answer is chunked: a whole one ends with the last, empty chunk.
    assert!(head.to_ascii_lowercase().contains("transfer-encoding: chunked"), "{head}");
    let whole = body.ends_with("\r\n0\r\n\r\n");
    assert!(!whole, "the slow client got the whole answer ({} bytes): it was not cut off", body.len());
    eprintln!(
        "slow reader: cut off with {} bytes of the answer after {:?}; the slowest of 40 other requests meanwhile took {slowest:?}",
        body.len(),
        started.elapsed()
    );
    drop(server);
}

/// A connection whose receive buffer is small, so that the server's sends
/// stall soon after the reader stops taking bytes.
fn small_buffer_connection(address: &str) -> TcpStream {
    let address: std::net::SocketAddr = address.parse().unwrap();
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(&address.into()).expect("connect");
    socket.into()
}

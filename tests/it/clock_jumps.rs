//! The wall clock of one instance stepped while it leads jobs: an hour back,
//! then an hour ahead, then back where it was (libfaketime, its offset read
//! again from a file every second; the monotonic clock left alone, as a
//! real step leaves it). No deadline fires early (a task within its
//! execution timeout is not failed), none is lost (a task past its timeout
//! is failed on time), and no detection interval is detected twice or
//! before its time.

use crate::support;
use crate::support::postgres as pg_common;

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_common::shared as pg;
use support::{exec_events, start_worker, wait_until, Server};

/// Runs a program with its wall clock offset by what `file` holds (`+0`,
/// `-1h`, `+1h`), read again every second; its monotonic clock is not moved.
fn stepping_clock(file: &Path) -> Vec<String> {
    let library = ["x86_64-linux-gnu", "aarch64-linux-gnu"]
        .iter()
        .map(|arch| format!("/usr/lib/{arch}/faketime/libfaketimeMT.so.1"))
        .find(|path| Path::new(path).exists())
        .expect("libfaketime is installed (Debian's faketime package)");
    vec![
        "env".into(),
        format!("LD_PRELOAD={library}"),
        format!("FAKETIME_TIMESTAMP_FILE={}", file.display()),
        "FAKETIME_CACHE_DURATION=1".into(),
        "FAKETIME_DONT_FAKE_MONOTONIC=1".into(),
    ]
}

fn start(dir: &Path, name: &str, url: &str, wrapper: &[&str]) -> Server {
    let args = [
        "--database-url",
        url,
        "--cluster-heartbeat",
        "1s",
        "--lag-threshold",
        "4s",
        "--heartbeat",
        "1s",
        "--recovery-interval",
        "2s",
        "--orphan-grace",
        "10s",
        "--silence-timeout",
        "60s",
    ];
    Server::start_wrapped(wrapper, &dir.join(name), "127.0.0.1:0", &args)
}

/// A `noop` detector on `server` that answers every request with nothing
/// and counts the requests.
async fn detector(server: &Server, name: &str, requests: Arc<AtomicU32>) {
    use jobcenter::proto::plugin::{admin_to_worker_message, worker_to_admin_message::Body, DetectionComplete};
    let (tx, mut inbound) = support::noop_detector(server, name).await;
    tokio::spawn(async move {
        while let Ok(Some(message)) = inbound.message().await {
            if let Some(admin_to_worker_message::Body::RunDetectionRequest(request)) = message.body {
                requests.fetch_add(1, Ordering::SeqCst);
                let done = DetectionComplete {
                    request_id: message.request_id,
                    job_type: request.job_type,
                    success: true,
                    ..DetectionComplete::default()
                };
                let message = jobcenter::proto::plugin::WorkerToAdminMessage {
                    body: Some(Body::DetectionComplete(done)),
                    ..Default::default()
                };
                if tx.send(message).await.is_err() {
                    return;
                }
            }
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_whose_clock_steps_an_hour_back_and_ahead_keeps_every_deadline_and_interval() {
    let dir = tempfile::tempdir().unwrap();
    let database = pg().new_database();
    let url = pg().url(&database);
    let offset = dir.path().join("offset");
    std::fs::write(&offset, "+0\n").unwrap();
    let stepping = stepping_clock(&offset);
    let stepping: Vec<&str> = stepping.iter().map(String::as_str).collect();
    let stepped = start(dir.path(), "stepped", &url, &stepping);
    let steady = start(dir.path(), "steady", &url, &[]);
    for server in [&stepped, &steady] {
        let set = server.cli(&["policy", "set", "noop", "detection_enabled=1", "detection_interval_seconds=3"]);
        assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    }
    let requests = Arc::new(AtomicU32::new(0));
    detector(&stepped, "det-stepped", requests.clone()).await;
    detector(&steady, "det-steady", requests.clone()).await;
    let log = dir.path().join("exec.log");
    let _worker = start_worker(&stepped, "w", &["--max-execute", "4", "--lease", "3s"], Some(&log));
    stepped.wait_for_workers(1);
    // Led by the instance whose clock steps: a task well within its
    // timeout, and one that overruns it.
    let file = dir.path().join("job.json");
    std::fs::write(
        &file,
        r#"{"name":"deadlines","tasks":[
            {"id":"within","job_type":"noop","parameters":{"sleep_ms":16000},"execution_timeout_seconds":40},
            {"id":"overrun","job_type":"noop","parameters":{"sleep_ms":60000},"execution_timeout_seconds":9}]}"#,
    )
    .unwrap();
    let output = stepped.cli(&["submit", file.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let job = String::from_utf8(output.stdout).unwrap().trim().to_string();
    let started = wait_until(Duration::from_secs(20), || {
        (exec_events(&log, &job).iter().filter(|e| e.2 == "start").count() == 2).then(Instant::now)
    })
    .expect("both tasks run");
    let from_slot: i64 =
        pg().psql(&database, "SELECT floor(extract(epoch FROM now()) * 1000 / 3000)::int8").trim().parse().unwrap();

    // An hour back, an hour ahead, back where it was: 5 s each.
    let mut overrun_ended = None;
    for step in ["-1h", "+1h", "+0"] {
        std::fs::write(&offset, format!("{step}\n")).unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if overrun_ended.is_none() && exec_events(&log, &job).iter().any(|e| e.0 == "overrun" && e.2 != "start") {
                overrun_ended = Some(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let done = wait_until(Duration::from_secs(40), || {
        let done = stepped.cli_json(&["job", &job, "--json"]);
        matches!(done["state"].as_str(), Some("succeeded" | "failed")).then_some(done)
    })
    .expect("the job ended");
    let overrun_ended = overrun_ended.or_else(|| {
        exec_events(&log, &job).iter().any(|e| e.0 == "overrun" && e.2 != "start").then(|| started.elapsed())
    });
    let tasks = support::states(&done);
    assert_eq!(
        tasks,
        vec![("overrun".to_string(), "failed".to_string()), ("within".to_string(), "succeeded".to_string())],
        "{done}"
    );
    let error = done["tasks"].as_array().unwrap().iter().find(|t| t["id"] == "overrun").unwrap()["error"].clone();
    assert!(error.as_str().unwrap_or("").contains("timed out"), "{error}");
    // The overrun is stopped after its 9 s (the worker's own copy of the
    // timeout may end it first), not an hour early or late.
    let overrun_ended = overrun_ended.expect("the overrun task was stopped");
    assert!(
        overrun_ended >= Duration::from_secs(8) && overrun_ended <= Duration::from_secs(14),
        "the overrun task was stopped {overrun_ended:?} after it started, against a 9 s timeout"
    );

    // Every interval detected once, none before its time.
    drop(stepped);
    drop(steady);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rows = pg().psql(
        &database,
        &format!("SELECT slot FROM jobcenter.detections WHERE job_type = 'noop' AND slot >= {from_slot} ORDER BY slot"),
    );
    let slots: Vec<i64> = rows.lines().filter(|l| !l.is_empty()).map(|l| l.trim().parse().unwrap()).collect();
    assert!(slots.len() >= 5, "too few detections in 15 s at a 3 s interval: {slots:?}");
    for pair in slots.windows(2) {
        assert_eq!(pair[1], pair[0] + 1, "an interval was skipped or claimed out of its turn: {slots:?}");
    }
    let now_slot: i64 =
        pg().psql(&database, "SELECT floor(extract(epoch FROM now()) * 1000 / 3000)::int8").trim().parse().unwrap();
    assert!(*slots.last().unwrap() <= now_slot, "an interval was claimed before its time: {slots:?}");
    let all: u32 = pg()
        .psql(&database, "SELECT count(*) FROM jobcenter.detections WHERE job_type = 'noop'")
        .trim()
        .parse()
        .unwrap();
    let requests = requests.load(Ordering::SeqCst);
    assert!(requests <= all && requests + 1 >= all, "{requests} detection requests for {all} claimed intervals");
    eprintln!(
        "clock stepped an hour back and ahead: the overrun task stopped {overrun_ended:?} after it started (9 s timeout), \
         the other succeeded; {} intervals detected once each",
        slots.len()
    );
}

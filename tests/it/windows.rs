//! Maintenance windows, end to end: a closed window holds a job's tasks
//! and its opening releases them; drain and cancel when a window closes
//! (the task waits for the next window, no try spent), and an idle server
//! that does not spin while its window is closed; bad windows refused with
//! one line and nothing stored; both daylight-saving changes of a year with
//! the server's clock set there (libfaketime); detections held outside the
//! window; in a cluster, an instance whose clock is off opens and closes by
//! the database's clock.

use crate::support;
use crate::support::postgres::shared as pg;

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use jobcenter::clock::{Clock, SystemClock};
use serde_json::Value;
use support::{clock_ahead, exec_events, start_worker, wait_until, Server};

/// An instant given as `YYYY-MM-DD HH:MM:SS` UTC, in ms since the epoch.
fn utc(text: &str) -> i64 {
    chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S").expect("a time").and_utc().timestamp_millis()
}

/// A server whose clock reads `text` (UTC) as it starts, and runs on from there.
fn server_at(dir: &Path, text: &str, extra: &[&str]) -> Server {
    let offset = (utc(text) - SystemClock.now().as_millis()) / 1000;
    let wrapper = clock_ahead(&format!("{offset:+}"));
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    Server::start_wrapped(&wrapper, &dir.join("data"), "127.0.0.1:0", extra)
}

/// `jobcenter policy set JOB_TYPE SETTINGS...`, which must succeed.
fn set(server: &Server, job_type: &str, settings: &[&str]) {
    let output = server.cli(&[&["policy", "set", job_type][..], settings].concat());
    assert!(output.status.success(), "policy set {settings:?}: {}", String::from_utf8_lossy(&output.stderr));
}

/// What `jobcenter windows JOB_TYPE --json` says of it, with the time it was read.
fn window(server: &Server, job_type: &str) -> (Value, i64) {
    let listing = server.cli_json(&["windows", job_type, "--json"]);
    (listing["windows"][0].clone(), listing["now_ms"].as_i64().expect("now_ms"))
}

fn task(server: &Server, job: &str, id: &str) -> Value {
    let job = server.cli_json(&["job", job, "--json"]);
    job["tasks"].as_array().unwrap().iter().find(|t| t["id"] == id).cloned().unwrap_or_else(|| panic!("no {id}: {job}"))
}

fn shell_job(tasks: &[(&str, String)]) -> String {
    let tasks: Vec<String> = tasks
        .iter()
        .map(|(id, command)| format!(r#"{{"id":"{id}","job_type":"shell","parameters":{{"command":"{command}"}}}}"#))
        .collect();
    format!(r#"{{"name":"maintenance","tasks":[{}]}}"#, tasks.join(","))
}

/// CPU time the process used so far, in clock ticks (user and system).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the process's stat");
    let after_name = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn a_closed_window_holds_a_jobs_tasks_until_it_opens() {
    let dir = tempfile::tempdir().unwrap();
    // 21:59:30 in Berlin on a Tuesday: the nightly window opens at 22:00.
    let server = server_at(dir.path(), "2026-12-01 20:59:30", &[]);
    let log = dir.path().join("exec.log");
    let _worker = start_worker(&server, "w", &[], Some(&log));
    server.wait_for_workers(1);
    set(&server, "shell", &["windows=Mon-Fri 22:00-06:00 Europe/Berlin"]);
    let (shell, now) = window(&server, "shell");
    assert_eq!(shell["open"], false, "{shell}");
    let opens = utc("2026-12-01 21:00:00");
    assert_eq!(shell["next_open_ms"].as_i64(), Some(opens), "{shell}");
    assert_eq!(shell["next_open_local"], "2026-12-01 22:00 CET");
    assert_eq!(shell["next_close_local"], "2026-12-02 06:00 CET");
    assert!(opens - now > 8_000, "the test needs the window closed for a while yet: {now}");

    let job = server.submit_file(dir.path(), "job", &shell_job(&[("a", "true".into()), ("b", "true".into())]));
    std::thread::sleep(Duration::from_secs(3));
    assert!(exec_events(&log, &job).is_empty(), "nothing runs while the window is closed");
    assert_eq!(task(&server, &job, "a")["state"], "ready");
    let (_, now) = window(&server, "shell");
    assert!(now < opens, "the window opened while the test looked: {now}");

    let done = wait_until(Duration::from_secs(40), || {
        let done = server.cli_json(&["job", &job, "--json"]);
        (done["state"] == "succeeded").then_some(done)
    })
    .expect("the window's opening releases the tasks");
    for t in done["tasks"].as_array().unwrap() {
        let started = t["started_at_ms"].as_i64().unwrap_or(t["assigned_at_ms"].as_i64().unwrap());
        assert!(started >= opens, "{} started before the window opened: {t}", t["id"]);
        assert!(started < opens + 5_000, "{} started late: {t}", t["id"]);
        assert_eq!(t["attempt"], 1);
    }
}

/// A server at 05:59:30 in Berlin on a Wednesday, in the nightly window
/// that closes at 06:00, with `shell` given `settings`, and a worker.
fn closing_soon(dir: &Path, settings: &[&str]) -> (Server, support::Process, i64) {
    let server = server_at(dir, "2026-12-02 04:59:30", &[]);
    let log = dir.join("exec.log");
    let worker = start_worker(&server, "w", &[], Some(&log));
    server.wait_for_workers(1);
    set(&server, "shell", &[&["windows=Mon-Fri 22:00-06:00 Europe/Berlin"][..], settings].concat());
    let (shell, now) = window(&server, "shell");
    let closes = utc("2026-12-02 05:00:00");
    assert_eq!((shell["open"].as_bool(), shell["next_close_ms"].as_i64()), (Some(true), Some(closes)), "{shell}");
    assert!(closes - now > 10_000, "the test needs the window open for a while yet: {now}");
    (server, worker, closes)
}

#[test]
fn a_closing_window_drains_within_its_grace_then_cancels_without_spending_a_try_and_the_server_idles() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _worker, closes) = closing_soon(dir.path(), &["window_grace_seconds=15"]);
    let log = dir.path().join("exec.log");
    // One task ends 5 s into the grace, the other would run long past it.
    let (_, now) = window(&server, "shell");
    let short = format!("sleep {}", (closes + 5_000 - now) / 1000);
    let job = server.submit_file(dir.path(), "job", &shell_job(&[("short", short), ("long", "sleep 300".into())]));
    wait_until(Duration::from_secs(10), || (exec_events(&log, &job).len() == 2).then_some(()))
        .expect("both start while the window is open");

    let long = wait_until(Duration::from_secs(60), || {
        let long = task(&server, &job, "long");
        (long["state"] == "ready").then_some(long)
    })
    .expect("the long task is canceled at the grace's end");
    let short = task(&server, &job, "short");
    assert_eq!((short["state"].as_str(), short["attempt"].as_i64()), (Some("succeeded"), Some(1)), "{short}");
    let canceled_at = long["updated_at_ms"].as_i64().unwrap();
    assert!(
        canceled_at >= closes + 15_000 && canceled_at < closes + 18_000,
        "canceled {} ms after the window closed, with a grace of 15 s",
        canceled_at - closes
    );
    assert_eq!(
        (long["attempt"].as_i64(), long["failures"].as_i64(), long["lost"].as_i64()),
        (Some(1), Some(0), Some(0))
    );
    assert!(long["error"].as_str().unwrap().contains("maintenance window of shell"), "{long}");
    wait_until(Duration::from_secs(10), || {
        exec_events(&log, &job).iter().any(|(t, a, e)| t == "long" && *a == 1 && e == "canceled").then_some(())
    })
    .unwrap_or_else(|| panic!("the worker stopped the long task: {:?}", exec_events(&log, &job)));

    // Closed, with a task waiting and the grace over: the server sleeps.
    let pid = server.process.child.id();
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(5));
    let used = cpu_ticks(pid) - before;
    assert!(used < 100, "an idle server with a closed window used {used} ticks of CPU in 5 s");
    eprintln!("an idle server with a closed window used {used} ticks of CPU in 5 s");

    // Windows set to always: it runs again at once, as its second attempt.
    set(&server, "shell", &["windows=always"]);
    wait_until(Duration::from_secs(10), || {
        exec_events(&log, &job).iter().any(|(t, a, e)| t == "long" && *a == 2 && e == "start").then_some(())
    })
    .expect("a window set to always applies at once");
    assert_eq!(task(&server, &job, "long")["failures"], 0);
}

#[test]
fn a_closing_window_with_cancel_stops_what_runs_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _worker, closes) = closing_soon(dir.path(), &["on_window_close=cancel"]);
    let log = dir.path().join("exec.log");
    let job = server.submit_file(dir.path(), "job", &shell_job(&[("long", "sleep 300".into())]));
    wait_until(Duration::from_secs(10), || (exec_events(&log, &job).len() == 1).then_some(())).expect("it starts");
    let long = wait_until(Duration::from_secs(40), || {
        let long = task(&server, &job, "long");
        (long["state"] == "ready").then_some(long)
    })
    .expect("the task is canceled when the window closes");
    let canceled_at = long["updated_at_ms"].as_i64().unwrap();
    assert!(canceled_at >= closes && canceled_at < closes + 3_000, "canceled {} ms after", canceled_at - closes);
    assert_eq!(
        (long["attempt"].as_i64(), long["failures"].as_i64(), long["lost"].as_i64()),
        (Some(1), Some(0), Some(0))
    );
    let (shell, _) = window(&server, "shell");
    assert_eq!(shell["open"], false);
    assert_eq!(shell["next_open_local"], "2026-12-02 22:00 CET", "{shell}");
    assert_eq!(server.cli_json(&["job", &job, "--json"])["state"], "running", "the job waits for the next window");
}

#[test]
fn bad_windows_are_refused_with_one_line_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    set(&server, "shell", &["windows=Mon-Fri 22:00-06:00 UTC"]);
    let refused = [
        (
            "windows=Mon-Fry 22:00-06:00 UTC",
            r#"policy setting windows: "Mon-Fry 22:00-06:00 UTC": "Mon-Fry" is not a day; days are Mon..Sun"#,
        ),
        (
            "windows=Mon 22:00-06:00 Mars/Olympus",
            r#"policy setting windows: "Mon 22:00-06:00 Mars/Olympus": "Mars/Olympus" is not a time zone; zones are IANA names such as UTC or Europe/Berlin"#,
        ),
        (
            "blackouts=2026-12-24T00:00..2026-12-24T25:00 UTC",
            r#"policy setting blackouts: "2026-12-24T00:00..2026-12-24T25:00 UTC": "2026-12-24T25:00" is not a date and time; write YYYY-MM-DDTHH:MM, or YYYY-MM-DD for midnight"#,
        ),
        (
            "on_window_close=pause",
            r#"policy setting on_window_close: "pause" is not what to do when a window closes; it is drain or cancel"#,
        ),
        (
            "window_grace_seconds=a while",
            r#"policy setting window_grace_seconds must be a whole number, not "a while""#,
        ),
        (
            "blackouts=Mon-Sat 00:00-24:00 UTC",
            r#"policy setting blackouts: with windows "Mon-Fri 22:00-06:00 UTC" and blackouts "Mon-Sat 00:00-24:00 UTC" the job type never opens in the next 400 days"#,
        ),
    ];
    let before = server.cli_json(&["policy", "get", "shell", "--json"]);
    for (setting, message) in refused {
        let output = server.cli(&["policy", "set", "shell", setting]);
        assert!(!output.status.success(), "{setting} was taken");
        assert_eq!(String::from_utf8_lossy(&output.stderr), format!("jobcenter: {message}\n"));
        assert_eq!(server.cli_json(&["policy", "get", "shell", "--json"]), before, "{setting} changed the policy");
    }
    assert_eq!(before["terms"]["windows"], "Mon-Fri 22:00-06:00 UTC");
    assert_eq!(
        (before["terms"]["blackouts"].as_str(), before["sources"]["blackouts"].as_str()),
        (Some("none"), Some("default"))
    );
    // Over HTTP the same refusal, as a 400 with the line.
    let body = r#"{"windows":"Mon-Fry 22:00-06:00 UTC"}"#;
    let headers = [("content-type", "application/json")];
    let answer = support::raw_http::request(&server.http, "PUT", "/api/policies/shell", &headers, Some(body));
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert_eq!(answer.json()["error"], refused[0].1);
    assert_eq!(server.cli_json(&["policy", "get", "shell", "--json"]), before);
}

/// The server's clock at `start` (UTC), `shell` with `windows`: closed
/// then, it opens at `opens` (UTC), which `jobcenter windows` says as
/// `opens_local`, and closes at `closes` (UTC); a job submitted while
/// closed starts when it opens.
fn across_a_change(start: &str, windows: &str, opens: &str, opens_local: &str, closes: &str, closes_local: &str) {
    let dir = tempfile::tempdir().unwrap();
    let server = server_at(dir.path(), start, &[]);
    let log = dir.path().join("exec.log");
    let _worker = start_worker(&server, "w", &[], Some(&log));
    server.wait_for_workers(1);
    set(&server, "shell", &[&format!("windows={windows}")]);
    let (shell, now) = window(&server, "shell");
    let (opens, closes) = (utc(opens), utc(closes));
    assert_eq!(shell["open"], false, "{shell}");
    assert_eq!((shell["next_open_ms"].as_i64(), shell["next_open_local"].as_str()), (Some(opens), Some(opens_local)));
    assert_eq!(
        (shell["next_close_ms"].as_i64(), shell["next_close_local"].as_str()),
        (Some(closes), Some(closes_local))
    );
    assert!(opens - now > 5_000, "the test needs the window closed for a while yet: {now}");
    let job = server.submit_file(dir.path(), "job", &shell_job(&[("a", "true".into())]));
    let done = wait_until(Duration::from_secs(40), || {
        let done = server.cli_json(&["job", &job, "--json"]);
        (done["state"] == "succeeded").then_some(done)
    })
    .expect("the window opens");
    let started = done["tasks"][0]["assigned_at_ms"].as_i64().unwrap();
    assert!(started >= opens && started < opens + 5_000, "started {} ms after the window opened", started - opens);
    // Open now, it closes once, at its end: the repeated or skipped hour makes no second span.
    let (shell, _) = window(&server, "shell");
    assert_eq!((shell["open"].as_bool(), shell["next_close_ms"].as_i64()), (Some(true), Some(closes)), "{shell}");
}

#[test]
fn spring_forward_in_berlin_a_window_from_the_skipped_hour_opens_an_hour_later() {
    // 2026-03-29: 02:00 CET is 03:00 CEST (01:00 UTC). 02:30 does not
    // exist: it is read with the offset before the change, 03:30 CEST.
    across_a_change(
        "2026-03-29 01:29:35",
        "daily 02:30-05:00 Europe/Berlin",
        "2026-03-29 01:30:00",
        "2026-03-29 03:30 CEST",
        "2026-03-29 03:00:00",
        "2026-03-29 05:00 CEST",
    );
}

#[test]
fn fall_back_in_new_york_a_window_from_the_repeated_hour_opens_once() {
    // 2026-11-01: 02:00 EDT is 01:00 EST (06:00 UTC). 01:30 comes twice: the
    // window opens at the first, and stays open through the second.
    across_a_change(
        "2026-11-01 05:29:35",
        "daily 01:30-04:00 America/New_York",
        "2026-11-01 05:30:00",
        "2026-11-01 01:30 EDT",
        "2026-11-01 09:00:00",
        "2026-11-01 04:00 EST",
    );
}

/// A `noop` detector on `server` that answers every request with nothing,
/// and counts the requests.
async fn detector(server: &Server, requests: Arc<AtomicU32>) {
    use jobcenter::proto::plugin::{admin_to_worker_message, worker_to_admin_message::Body, DetectionComplete};
    let (tx, mut inbound) = support::noop_detector(server, "detector").await;
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
async fn outside_its_window_a_job_type_is_not_detected() {
    let dir = tempfile::tempdir().unwrap();
    // A Sunday noon: a weekday night window is closed.
    let server = server_at(dir.path(), "2026-11-29 12:00:00", &[]);
    let windows = "windows=Mon-Fri 22:00-06:00 UTC";
    set(&server, "noop", &[windows, "detection_enabled=1", "detection_interval_seconds=1"]);
    let requests = Arc::new(AtomicU32::new(0));
    detector(&server, requests.clone()).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(requests.load(Ordering::SeqCst), 0, "detected outside the window");
    set(&server, "noop", &["windows=always"]);
    let detected = wait_until(Duration::from_secs(10), || (requests.load(Ordering::SeqCst) > 0).then_some(()));
    assert!(detected.is_some(), "the window set to always did not let detections run");
}

#[test]
fn in_a_cluster_an_instance_whose_clock_is_off_opens_and_closes_by_the_databases_clock() {
    let dir = tempfile::tempdir().unwrap();
    let database = pg().new_database();
    let url = pg().url(&database);
    let db_now = || -> i64 {
        pg().psql(&database, "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8").trim().parse().unwrap()
    };
    // A one-minute window from the first minute at least 20 s ahead on the database's clock.
    let opens = (db_now() + 20_000).div_euclid(60_000) * 60_000 + 60_000;
    let [start, end] = [opens, opens + 60_000].map(|ms| {
        let at = chrono::DateTime::from_timestamp_millis(ms).unwrap();
        at.format("%H:%M").to_string()
    });
    let day = chrono::DateTime::from_timestamp_millis(opens).unwrap().format("%a").to_string();
    // Five minutes ahead, this instance's own clock is in the window
    // already, and past it once the window opens.
    let wrapper = clock_ahead("+300");
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let args = ["--database-url", url.as_str(), "--cluster-heartbeat", "1s", "--lag-threshold", "4s"];
    let server = Server::start_wrapped(&wrapper, &dir.path().join("ahead"), "127.0.0.1:0", &args);
    let log = dir.path().join("exec.log");
    let _worker = start_worker(&server, "w", &[], Some(&log));
    server.wait_for_workers(1);
    set(&server, "shell", &[&format!("windows={day} {start}-{end} UTC"), "on_window_close=cancel"]);
    let (shell, now) = window(&server, "shell");
    assert_eq!((shell["open"].as_bool(), shell["next_open_ms"].as_i64()), (Some(false), Some(opens)), "{shell}");
    assert!((now - db_now()).abs() < 2_000, "windows are read on the database's clock: {now}");

    let job = server.submit_file(dir.path(), "job", &shell_job(&[("long", "sleep 300".into())]));
    let started =
        wait_until(Duration::from_secs(100), || exec_events(&log, &job).iter().any(|e| e.2 == "start").then(db_now))
            .expect("the window opens");
    assert!(started >= opens && started < opens + 4_000, "started {} ms after the window opened", started - opens);
    let ended =
        wait_until(Duration::from_secs(80), || exec_events(&log, &job).iter().any(|e| e.2 == "canceled").then(db_now))
            .expect("the window closes");
    let closes = opens + 60_000;
    assert!(ended >= closes && ended < closes + 4_000, "canceled {} ms after the window closed", ended - closes);
    let long = task(&server, &job, "long");
    assert_eq!((long["state"].as_str(), long["failures"].as_i64()), (Some("ready"), Some(0)), "{long}");
}

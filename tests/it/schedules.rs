//! Schedules on real servers: an interval schedule runs its job file as
//! jobs whose origin names the schedule and the slot; pause stops the runs
//! and resume starts them again with none of the paused slots; run-now and
//! remove; each overlap policy with a long shell task; bad input refused in
//! one line with nothing stored; runs missed while the server was down
//! caught up (the last, once) or not; and on PostgreSQL with three
//! instances, the instance that claims a run dies before the run is
//! durable (a crash point) and the run still starts exactly once; and the
//! instance that claims a run SIGKILLed at its due time leaves one run per slot.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::postgres::shared as pg;
use crate::support::{start_worker, wait_until, Server};

const NOOP_JOB: &str = r#"{"name":"tick","tasks":[{"id":"a","job_type":"noop","parameters":{"sleep_ms":50}}]}"#;

/// A job of one shell task that sleeps `seconds`.
fn sleeping_job(seconds: u32) -> String {
    format!(
        r#"{{"name":"long","tasks":[{{"id":"sleep","job_type":"shell","parameters":{{"argv":["sleep","{seconds}"]}}}}]}}"#
    )
}

/// `jobcenter schedule add NAME FILE --calendar CALENDAR EXTRA...`.
fn add(
    server: &Server,
    dir: &std::path::Path,
    name: &str,
    calendar: &str,
    job: &str,
    extra: &[&str],
) -> std::process::Output {
    let file = dir.join(format!("{name}.json"));
    std::fs::write(&file, job).unwrap();
    let mut args = vec!["schedule", "add", name, file.to_str().unwrap(), "--calendar", calendar];
    args.extend(extra);
    server.cli(&args)
}

fn added(server: &Server, dir: &std::path::Path, name: &str, calendar: &str, job: &str, extra: &[&str]) {
    let output = add(server, dir, name, calendar, job, extra);
    assert!(output.status.success(), "schedule add {name}: {}", String::from_utf8_lossy(&output.stderr));
}

/// A run of a schedule: its job, the slot (from its origin), its state and times.
#[derive(Clone, Debug)]
struct Run {
    job: String,
    slot: String,
    state: String,
    created_at_ms: i64,
    finished_at_ms: i64,
}

/// The runs of schedule `name`, oldest first.
fn runs(server: &Server, name: &str) -> Vec<Run> {
    let jobs = server.cli_json(&["jobs", "--json", "--all", "--limit", "1000"]);
    let prefix = format!("schedule:{name}:");
    let mut runs: Vec<Run> = jobs
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|j| {
            let slot = j["origin"].as_str()?.strip_prefix(&prefix)?.to_string();
            Some(Run {
                job: j["id"].as_str()?.to_string(),
                slot,
                state: j["state"].as_str()?.to_string(),
                created_at_ms: j["created_at_ms"].as_i64()?,
                finished_at_ms: j["finished_at_ms"].as_i64().unwrap_or(0),
            })
        })
        .collect();
    runs.sort_by_key(|r| r.created_at_ms);
    runs
}

/// The schedule as `schedule list --json` shows it.
fn listed(server: &Server, name: &str) -> Option<serde_json::Value> {
    let all = server.cli_json(&["schedule", "list", "--json"]);
    all.as_array().unwrap().iter().find(|s| s["name"] == name).cloned()
}

fn now_ms() -> i64 {
    std::time::SystemTime::UNIX_EPOCH.elapsed().unwrap().as_millis() as i64
}

fn slot_ms(slot: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(slot).unwrap().timestamp_millis()
}

fn one_server(dir: &std::path::Path) -> (Server, crate::support::Process) {
    let server = Server::start(&dir.join("data"), &[]);
    let worker = start_worker(&server, "w1", &["--max-execute", "8"], None);
    server.wait_for_workers(1);
    (server, worker)
}

#[test]
fn an_interval_schedule_runs_pauses_resumes_runs_now_and_goes() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _worker) = one_server(dir.path());
    added(&server, dir.path(), "tick", "2s", NOOP_JOB, &[]);

    // Runs come at the interval's multiples, each an ordinary job named by its file, one per slot.
    let first = wait_until(Duration::from_secs(15), || {
        let runs = runs(&server, "tick");
        (runs.len() >= 3).then_some(runs)
    })
    .expect("three runs within 15 s");
    let slots: Vec<i64> = first.iter().map(|r| slot_ms(&r.slot)).collect();
    assert!(slots.iter().all(|s| s % 2000 == 0), "slots on the interval's multiples: {slots:?}");
    assert!(slots.windows(2).all(|w| w[1] > w[0]), "one run per slot: {slots:?}");
    let job = server.cli_json(&["job", &first[0].job, "--json"]);
    assert_eq!(job["name"], "tick");
    assert!(job["origin"].as_str().unwrap().starts_with("schedule:tick:"), "{job}");

    // Paused: no run starts.
    let output = server.cli(&["schedule", "pause", "tick"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let paused_at = now_ms();
    let count = runs(&server, "tick").len();
    std::thread::sleep(Duration::from_secs(5));
    let after = runs(&server, "tick");
    assert!(after.len() <= count + 1, "a run started while paused: {after:?}");
    let stopped = after.len();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(runs(&server, "tick").len(), stopped, "runs go on while paused");
    let shown = listed(&server, "tick").unwrap();
    assert_eq!((shown["paused"].as_bool(), shown["next_run_ms"].as_i64()), (Some(true), Some(0)), "{shown}");

    // Resumed: the next slot runs, none of those due while paused.
    let resumed_at = now_ms();
    assert!(server.cli(&["schedule", "resume", "tick"]).status.success());
    let more = wait_until(Duration::from_secs(10), || {
        let runs = runs(&server, "tick");
        (runs.len() > stopped).then_some(runs)
    })
    .expect("a run after resume");
    for run in &more[stopped..] {
        assert!(slot_ms(&run.slot) >= resumed_at - 1, "a slot due while paused ran: {run:?} (paused at {paused_at})");
    }

    // Run now: a run at once, whatever the calendar says.
    let output = server.cli(&["schedule", "run-now", "tick", "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let now: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let job = server.cli_json(&["job", now["job_id"].as_str().unwrap(), "--json"]);
    assert!(job["origin"].as_str().unwrap().starts_with("schedule:tick:"), "{job}");
    assert_eq!(listed(&server, "tick").unwrap()["last_outcome"], "run_now");

    // Removed: gone, and no more runs; the runs' jobs stay.
    assert!(server.cli(&["schedule", "remove", "tick"]).status.success());
    assert!(listed(&server, "tick").is_none());
    let count = runs(&server, "tick").len();
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(runs(&server, "tick").len(), count, "a removed schedule ran");
    let output = server.cli(&["schedule", "pause", "tick"]);
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr).trim(),
        "jobcenter: no schedule \"tick\": see `jobcenter schedule list`"
    );

    // Every change is in the audit trail.
    let audit = server.cli_json(&["audit", "--json"]);
    let actions: Vec<&str> = audit.as_array().unwrap().iter().filter_map(|r| r["action"].as_str()).collect();
    for action in ["schedule.add", "schedule.pause", "schedule.resume", "schedule.run_now", "schedule.remove"] {
        assert!(actions.contains(&action), "{action} not audited: {actions:?}");
    }
}

#[test]
fn bad_schedules_are_refused_in_one_line_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _worker) = one_server(dir.path());
    let cases: [(&str, &[&str], &str); 6] = [
        ("61 * * * *", &[], r#"schedule calendar: "61 * * * *": minute 61 is out of range 0..59"#),
        (
            "0 3 * * *",
            &["--time-zone", "Mars/Olympus"],
            r#"schedule time_zone: "Mars/Olympus": unknown time zone: use an IANA name such as Europe/Berlin, or UTC"#,
        ),
        (
            "15m",
            &["--overlap", "sometimes"],
            r#"schedule overlap: "sometimes": use skip, queue_one, cancel_running or allow"#,
        ),
        ("15m", &["--catch-up", "all"], r#"schedule catch_up: "all": use last (run the last missed run once) or none"#),
        (
            "15m",
            &["--jitter", "20m"],
            r#"schedule jitter: "20m": must be less than the shortest gap between runs (900 s)"#,
        ),
        ("0 0 30 2 *", &[], r#"schedule calendar: "0 0 30 2 *": never comes due"#),
    ];
    for (calendar, extra, expected) in cases {
        let output = add(&server, dir.path(), "bad", calendar, NOOP_JOB, extra);
        assert_eq!(output.status.code(), Some(2), "{calendar} {extra:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr.lines().collect::<Vec<_>>(), [format!("jobcenter: {expected}")], "{calendar} {extra:?}");
    }
    // A job file that breaks its rules is refused with its problems.
    let cycle = r#"{"name":"cycle","tasks":[{"id":"a","job_type":"noop","depends_on":["b"]},{"id":"b","job_type":"noop","depends_on":["a"]}]}"#;
    let output = add(&server, dir.path(), "bad", "15m", cycle, &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("cycle"), "{}", String::from_utf8_lossy(&output.stderr));
    // Over HTTP too: 400, one line naming the field.
    let body = format!(r#"{{"name":"bad","calendar":"*/5 * * * *","time_zone":"Nowhere","job_file":{NOOP_JOB}}}"#);
    let (status, answer) = http_post(&server.http, "/api/schedules", &body);
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"].as_str().unwrap().starts_with("schedule time_zone: \"Nowhere\""), "{answer}");

    // Nothing was stored, and nothing runs.
    assert_eq!(server.cli_json(&["schedule", "list", "--json"]), serde_json::json!([]));
    added(&server, dir.path(), "good", "15m", NOOP_JOB, &[]);
    let output = add(&server, dir.path(), "good", "15m", NOOP_JOB, &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("schedule \"good\" exists"));
    assert_eq!(server.cli_json(&["schedule", "list", "--json"]).as_array().unwrap().len(), 1);
}

/// `POST path` with a JSON body; the status and the JSON answer.
fn http_post(address: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {address}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer.split_whitespace().nth(1).unwrap().parse().unwrap();
    let json = answer.split("\r\n\r\n").nth(1).and_then(|b| serde_json::from_str(b.trim()).ok()).unwrap_or_default();
    (status, json)
}

#[test]
fn each_overlap_policy_meets_a_run_that_outlasts_the_interval() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _worker) = one_server(dir.path());
    // Each run sleeps 5 s; a run comes due every 2 s.
    for (name, overlap) in [("skip", "skip"), ("queue", "queue_one"), ("cancel", "cancel_running")] {
        added(&server, dir.path(), name, "2s", &sleeping_job(5), &["--overlap", overlap]);
    }
    let started = Instant::now();
    let mut outcomes: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    while started.elapsed() < Duration::from_secs(16) {
        for name in ["skip", "queue", "cancel"] {
            let outcome = listed(&server, name).unwrap()["last_outcome"].as_str().unwrap_or("").to_string();
            outcomes.entry(name).or_default().push(outcome);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    for name in ["skip", "queue", "cancel"] {
        assert!(server.cli(&["schedule", "pause", name]).status.success());
    }
    let seen = |name: &str, outcome: &str| outcomes[name].iter().any(|o| o == outcome);

    // skip: never two at once, and slots were skipped.
    let skip = runs(&server, "skip");
    assert!(seen("skip", "skipped"), "{outcomes:?}");
    assert!(skip.len() >= 2 && skip.len() <= 4, "{skip:?}");
    for pair in skip.windows(2) {
        assert!(pair[0].finished_at_ms > 0 && pair[1].created_at_ms >= pair[0].finished_at_ms, "overlap: {pair:?}");
        assert_eq!(pair[0].state, "succeeded");
    }
    // queue_one: never two at once, and the waiting one starts as the one before ends.
    let queue = runs(&server, "queue");
    assert!(seen("queue", "queued"), "{outcomes:?}");
    assert!(queue.len() >= 2, "{queue:?}");
    for pair in queue.windows(2) {
        assert!(pair[0].finished_at_ms > 0 && pair[1].created_at_ms >= pair[0].finished_at_ms, "overlap: {pair:?}");
        assert!(pair[1].created_at_ms - pair[0].finished_at_ms < 1500, "the queued run waited: {pair:?}");
    }
    // cancel_running: each run is canceled by the next.
    let cancel = runs(&server, "cancel");
    assert!(cancel.len() >= 5, "{cancel:?}");
    for run in &cancel[..cancel.len() - 1] {
        let job = crate::support::rig::ended(&server, &run.job, Duration::from_secs(20));
        assert_eq!(job["state"], "canceled", "{run:?}");
    }
}

#[test]
fn runs_missed_while_the_server_was_down_are_caught_up_once_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data, &[]);
    // No worker: runs stay active, and `allow` starts each regardless.
    let last_terms = ["--catch-up", "last", "--catch-up-window", "1m", "--overlap", "allow"];
    added(&server, dir.path(), "last", "5s", NOOP_JOB, &last_terms);
    added(&server, dir.path(), "none", "5s", NOOP_JOB, &["--catch-up", "none", "--overlap", "allow"]);
    for name in ["last", "none"] {
        wait_until(Duration::from_secs(10), || (!runs(&server, name).is_empty()).then_some(()))
            .unwrap_or_else(|| panic!("{name} did not run"));
    }
    let mut server = server;
    server.process.kill();
    let stopped = now_ms();
    // Down across at least two due times.
    std::thread::sleep(Duration::from_secs(12));
    let restarted = now_ms();
    let server = Server::start(&data, &[]);
    let up = now_ms();
    std::thread::sleep(Duration::from_secs(3));
    let last = runs(&server, "last");
    let none = runs(&server, "none");
    let missed = |runs: &[Run], until: i64| -> Vec<i64> {
        runs.iter().map(|r| slot_ms(&r.slot)).filter(|s| *s > stopped && *s <= until).collect()
    };
    // `last`: of the two or more slots missed, exactly one ran, the latest, after the restart.
    assert!(restarted - stopped >= 10_000);
    let caught = missed(&last, up);
    assert_eq!(caught.len(), 1, "{last:?}");
    assert!(caught[0] >= (restarted / 5000) * 5000, "the last missed slot ran: {caught:?}");
    assert!(last.iter().any(|r| slot_ms(&r.slot) == caught[0] && r.created_at_ms >= restarted));
    assert_eq!(
        listed(&server, "last").unwrap()["last_outcome"].as_str().map(|o| o == "caught_up" || o == "started"),
        Some(true)
    );
    // `none`: none did.
    assert_eq!(missed(&none, restarted), Vec::<i64>::new(), "{none:?}");
    // No slot ran twice, across the restart.
    for runs in [&last, &none] {
        let mut slots: Vec<&str> = runs.iter().map(|r| r.slot.as_str()).collect();
        slots.dedup();
        assert_eq!(slots.len(), runs.len(), "a slot ran twice: {runs:?}");
    }
    // Both go on at their next slots.
    for name in ["last", "none"] {
        wait_until(Duration::from_secs(10), || {
            runs(&server, name).iter().any(|r| slot_ms(&r.slot) > restarted).then_some(())
        })
        .unwrap_or_else(|| panic!("{name} did not run after the restart"));
    }
}

/// The active instances' ids by HTTP address.
fn active_ids(database: &str) -> Vec<(String, String)> {
    let rows = pg().psql(database, "SELECT http_address || '|' || id FROM jobcenter.instances WHERE status = 'active'");
    rows.lines().filter_map(|l| l.trim().split_once('|')).map(|(http, id)| (http.to_string(), id.to_string())).collect()
}

#[test]
fn in_a_cluster_a_run_whose_claimer_dies_before_it_is_durable_starts_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let database = pg().new_database();
    let url = pg().url(&database);
    // Every instance dies the first time it claims a run fresh (before the
    // run is submitted); a claim taken over from a dead instance goes on.
    let crash = ["env", "JOBCENTER_CRASH_AT=schedule-claimed:1"];
    let args = ["--database-url", &url, "--cluster-heartbeat", "1s", "--lag-threshold", "4s"];
    let mut servers: Vec<Server> = (0..3)
        .map(|i| Server::start_wrapped(&crash, &dir.path().join(format!("a{i}")), "127.0.0.1:0", &args))
        .collect();
    wait_until(Duration::from_secs(20), || (active_ids(&database).len() == 3).then_some(()))
        .unwrap_or_else(|| panic!("3 instances did not register: {:?}", active_ids(&database)));
    // One run every 30 s: the first comes due within 30 s, the next 30 s later.
    added(&servers[0], dir.path(), "once", "30s", NOOP_JOB, &[]);
    let dead = wait_until(Duration::from_secs(40), || {
        let dead: Vec<usize> = (0..3).filter(|i| !servers[*i].process.is_running()).collect();
        (!dead.is_empty()).then_some(dead)
    })
    .expect("an instance claimed the run and died");
    assert_eq!(dead.len(), 1, "one instance died at its claim: {dead:?}");
    let died_at = now_ms();
    let log = std::fs::read_to_string(&servers[dead[0]].log).unwrap();
    assert!(log.contains("crashing on purpose at schedule-claimed"), "{log}");
    let live = (0..3).find(|i| !dead.contains(i)).unwrap();
    // A survivor takes the claim over once the dead instance is deactivated, and starts the run.
    let run = wait_until(Duration::from_secs(20), || runs(&servers[live], "once").first().cloned())
        .expect("the run started on a survivor");
    let slot = slot_ms(&run.slot);
    assert_eq!(slot % 30_000, 0);
    assert!(slot <= died_at, "the run is of the slot the dead instance claimed");
    // Until just before the next slot: still exactly one run of that slot.
    let next = slot + 30_000;
    while now_ms() < next - 3_000 {
        std::thread::sleep(Duration::from_millis(500));
    }
    let all = runs(&servers[live], "once");
    let of_slot = all.iter().filter(|r| slot_ms(&r.slot) == slot).count();
    assert_eq!(of_slot, 1, "{all:?}");
    assert_eq!(all.len(), 1, "{all:?}");
    let claims = pg().psql(
        &database,
        &format!("SELECT count(*) FROM jobcenter.schedule_runs WHERE schedule = 'once' AND slot = {slot}"),
    );
    assert_eq!(claims.trim(), "1");
    for server in servers.iter_mut() {
        server.process.kill();
    }
}

#[test]
fn in_a_cluster_the_instance_that_claims_a_run_sigkilled_at_its_due_time_leaves_one_run_per_slot() {
    let dir = tempfile::tempdir().unwrap();
    let database = pg().new_database();
    let url = pg().url(&database);
    let args = ["--database-url", &url, "--cluster-heartbeat", "1s", "--lag-threshold", "4s"];
    let mut servers: Vec<Server> = (0..3).map(|i| Server::start(&dir.path().join(format!("a{i}")), &args)).collect();
    wait_until(Duration::from_secs(20), || (active_ids(&database).len() == 3).then_some(()))
        .unwrap_or_else(|| panic!("3 instances did not register: {:?}", active_ids(&database)));
    // No worker runs the jobs: `allow` starts each run whatever the last is doing.
    added(&servers[0], dir.path(), "owned", "20s", NOOP_JOB, &["--overlap", "allow"]);
    // The instance that claims the first run is SIGKILLed as soon as its claim shows.
    let (slot, owner) = wait_until(Duration::from_secs(30), || {
        let row = pg()
            .psql(&database, "SELECT slot || '|' || instance FROM jobcenter.schedule_runs WHERE schedule = 'owned'");
        let (slot, owner) = row.trim().split_once('|')?;
        Some((slot.parse::<i64>().ok()?, owner.to_string()))
    })
    .expect("a claim of the first run");
    let http = active_ids(&database).into_iter().find(|(_, id)| *id == owner).map(|(http, _)| http).unwrap();
    let killed = servers.iter().position(|s| s.http == http).unwrap();
    servers[killed].process.kill();
    let live = (0..3).find(|i| *i != killed).unwrap();
    // The next slot comes and goes on the survivors; every slot runs exactly once.
    let next = slot + 20_000;
    wait_until(Duration::from_secs(40), || {
        runs(&servers[live], "owned").iter().any(|r| slot_ms(&r.slot) == next).then_some(())
    })
    .expect("the next slot ran on a survivor");
    std::thread::sleep(Duration::from_secs(2));
    let all = runs(&servers[live], "owned");
    let per_slot = |s: i64| all.iter().filter(|r| slot_ms(&r.slot) == s).count();
    assert_eq!((per_slot(slot), per_slot(next)), (1, 1), "{all:?}");
    assert_eq!(all.len(), 2, "{all:?}");
    for server in servers.iter_mut() {
        server.process.kill();
    }
}

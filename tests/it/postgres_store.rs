//! jobcenter on a real PostgreSQL: every way a database can refuse to be
//! used at start gives one line naming the database (never its password)
//! and leaves nothing half-created; TLS to the database; PostgreSQL
//! restarted (fast, then immediate) under a running 2,000-task job loses no
//! acknowledged work and runs nothing twice; export and import move
//! everything between a sled directory and a database; the bench counts the
//! round trips a job takes to its database.

use crate::support;
use crate::support::postgres as pg;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use support::{binary, exec_events, run_with_timeout, start_worker, wait_until, Server};

/// Runs `jobcenter server` on `url` and expects it to refuse at once.
fn refused(url: &str, password: &str) -> String {
    let mut command = Command::new(binary());
    command.args(["server", "--database-url", url, "--http", "127.0.0.1:0", "--grpc", "0"]);
    command.env_remove("PGPASSWORD").env("PGPASSFILE", "/nonexistent");
    let output = run_with_timeout(command, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_eq!(output.status.code(), Some(2), "the server should refuse {url}: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(!stderr.contains(password), "the password is never shown: {stderr}");
    lines[0].to_string()
}

fn jobcenter_schema_exists(cluster: &pg::PgCluster, database: &str) -> bool {
    cluster.psql(database, "SELECT count(*) FROM pg_namespace WHERE nspname = 'jobcenter'").trim() == "1"
}

#[test]
fn a_database_that_cannot_be_used_is_refused_in_one_line() {
    let cluster = pg::shared();
    let password = cluster.password().to_string();

    let nothing_there = crate::support::free_port();
    let url = format!("postgres://jobcenter:{password}@127.0.0.1:{nothing_there}/jobs");
    let line = refused(&url, &password);
    assert!(
        line.contains(&format!("cannot reach the database at postgres://jobcenter@127.0.0.1:{nothing_there}/jobs")),
        "{line}"
    );

    let database = cluster.new_database();
    let line = refused(&cluster.url_as("jobcenter", Some("not-the-password"), &database), "not-the-password");
    assert!(line.contains("refused user jobcenter") && line.contains("check the password"), "{line}");

    let line = refused(&cluster.url("no_such_database"), &password);
    assert!(line.contains("does not exist") && line.contains("createdb no_such_database"), "{line}");

    let weak = cluster.create_role("weak", "weak-password", &database, "");
    let line = refused(&weak, "weak-password");
    assert!(line.contains("user weak may not set up jobcenter's schema"), "{line}");
    assert!(!jobcenter_schema_exists(cluster, &database), "nothing was created");

    let foreign = cluster.new_database();
    cluster.psql(&foreign, "CREATE SCHEMA jobcenter; CREATE TABLE jobcenter.jobs (x int)");
    let line = refused(&cluster.url(&foreign), &password);
    assert!(line.contains("jobcenter did not make"), "{line}");

    // A database a newer jobcenter upgraded.
    let dir = tempfile::tempdir().unwrap();
    let newer = cluster.new_database();
    let server = Server::start(&dir.path().join("unused"), &["--database-url", &cluster.url(&newer)]);
    drop(server);
    cluster.psql(
        &newer,
        "INSERT INTO jobcenter.schema_history (version, name, applied_on, checksum) VALUES (99, 'later', '', '0')",
    );
    let line = refused(&cluster.url(&newer), &password);
    // This build knows the migrations under src/store/postgres/migrations.
    let latest = std::fs::read_dir("src/store/postgres/migrations").unwrap().count();
    let knows = format!("knows versions up to {latest}");
    assert!(line.contains("has schema version 99") && line.contains(&knows), "{line}");
}

#[test]
fn the_admin_reaches_its_database_over_tls() {
    let cluster = pg::PgCluster::start();
    let ca = cluster.enable_tls();
    cluster.require_tls();
    let database = cluster.new_database();
    let base = cluster.url(&database);
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("nine.json");
    std::fs::write(&job, support::nine_tasks(None, 0)).unwrap();
    for (n, query) in
        ["sslmode=require".to_string(), format!("sslmode=verify-full&sslrootcert={}", ca.display())].iter().enumerate()
    {
        let url = format!("{base}?{query}");
        let server =
            Server::start(&dir.path().join(format!("unused{n}")), &["--database-url", &url, "--local-workers", "1"]);
        let output = server.cli(&["submit", job.to_str().unwrap(), "--wait"]);
        assert!(output.status.success(), "{query}: {}", String::from_utf8_lossy(&output.stderr));
    }
    let line = refused(&format!("{base}?sslmode=disable"), cluster.password());
    assert!(line.contains(&format!("postgres://jobcenter@127.0.0.1:{}/{database}", cluster.port())), "{line}");
    // A certificate the root does not vouch for is refused under verify-full.
    let other = tempfile::tempdir().unwrap();
    let stranger = other.path().join("stranger.crt");
    let key = rcgen::KeyPair::generate().unwrap();
    let certificate = rcgen::CertificateParams::new(vec!["127.0.0.1".into()]).unwrap().self_signed(&key).unwrap();
    std::fs::write(&stranger, certificate.pem()).unwrap();
    let line = refused(&format!("{base}?sslmode=verify-full&sslrootcert={}", stranger.display()), cluster.password());
    assert!(line.contains("cannot reach the database"), "{line}");
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A layered job of `n` tasks, some failing for good: its text, and each task's expected final state.
fn layered(n: usize, width: usize, seed: u64) -> (String, Vec<&'static str>) {
    let mut rng = Rng(seed);
    let mut states: Vec<&'static str> = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..n {
        let layer = i / width;
        let mut deps: Vec<usize> = Vec::new();
        while layer > 0 && deps.len() < 3 {
            let d = (layer - 1) * width + rng.below(width as u64) as usize;
            if !deps.contains(&d) {
                deps.push(d);
            }
        }
        let fail = layer >= n / width - 3 && rng.below(100) == 0;
        let sleep = 20 + rng.below(40);
        states.push(if deps.iter().any(|&d| states[d] != "succeeded") {
            "upstream_failed"
        } else if fail {
            "failed"
        } else {
            "succeeded"
        });
        let deps: Vec<String> = deps.iter().map(|d| format!("\"t{d}\"")).collect();
        tasks.push(format!(
            r#"{{"id":"t{i}","job_type":"noop","parameters":{{"fail":{fail},"sleep_ms":{sleep}}},"depends_on":[{}]}}"#,
            deps.join(",")
        ));
    }
    (format!(r#"{{"name":"layered","tasks":[{}]}}"#, tasks.join(",")), states)
}

/// `/readyz`: true for 200, false for 503, `None` if the server did not answer.
fn ready(http: &str) -> Option<bool> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(http).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    write!(stream, "GET /readyz HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    match answer.split_whitespace().nth(1) {
        Some("200") => Some(true),
        Some("503") => Some(false),
        _ => None,
    }
}

#[test]
fn postgres_restarted_under_load_loses_nothing_acknowledged_and_runs_nothing_twice() {
    let cluster = pg::PgCluster::start();
    let database = cluster.new_database();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &dir.path().join("unused"),
        &["--database-url", &cluster.url(&database), "--heartbeat", "1s", "--recovery-interval", "1s"],
    );
    let log = dir.path().join("exec.log");
    let _workers: Vec<_> = (0..2)
        .map(|n| start_worker(&server, &format!("w{n}"), &["--max-execute", "4", "--lease", "20s"], Some(&log)))
        .collect();
    server.wait_for_workers(2);
    let (text, expected) = layered(2000, 100, 7);
    let file = dir.path().join("layered.json");
    std::fs::write(&file, text).unwrap();
    let output = server.cli(&["submit", file.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let job = String::from_utf8(output.stdout).unwrap().trim().to_string();
    let small = dir.path().join("small.json");
    std::fs::write(&small, r#"{"name":"small","tasks":[{"id":"a","job_type":"noop"}]}"#).unwrap();
    let mut acknowledged = Vec::new();

    for (round, mode) in [pg::Shutdown::Fast, pg::Shutdown::Immediate].into_iter().enumerate() {
        wait_until(Duration::from_secs(60), || (exec_events(&log, &job).len() > 600 * (round + 1)).then_some(()))
            .expect("the job makes progress");
        cluster.stop(mode);
        // While the database is away the admin acknowledges nothing and says it is not ready.
        let not_ready = wait_until(Duration::from_secs(20), || (ready(&server.http) == Some(false)).then_some(()));
        assert!(not_ready.is_some(), "/readyz says not ready while the database is away ({mode:?})");
        let mut command = Command::new(binary());
        command.args(["submit", small.to_str().unwrap(), "--admin", &server.http]);
        let waiting = std::thread::spawn(move || run_with_timeout(command, Duration::from_secs(120)));
        std::thread::sleep(Duration::from_secs(2));
        cluster.start_again();
        let output = waiting.join().unwrap();
        if output.status.success() {
            acknowledged.push(String::from_utf8(output.stdout).unwrap().trim().to_string());
        }
        let back = wait_until(Duration::from_secs(30), || (ready(&server.http) == Some(true)).then_some(()));
        assert!(back.is_some(), "ready again once the database is back ({mode:?})");
    }
    assert!(!acknowledged.is_empty(), "a submit made while the database was away was acknowledged once it came back");

    let done = wait_until(Duration::from_secs(180), || {
        let job = server.cli_json(&["job", &job, "--json"]);
        matches!(job["state"].as_str(), Some("succeeded" | "failed")).then_some(job)
    })
    .expect("the job ends");
    let states: BTreeMap<usize, String> = done["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_str().unwrap()[1..].parse().unwrap(), t["state"].as_str().unwrap().to_string()))
        .collect();
    let mismatches: Vec<String> = expected
        .iter()
        .enumerate()
        .filter(|(i, s)| states[i] != **s)
        .map(|(i, s)| format!("t{i}: {} (expected {s})", states[&i]))
        .collect();
    assert!(
        mismatches.is_empty(),
        "{} tasks differ from the model: {:?}",
        mismatches.len(),
        &mismatches[..mismatches.len().min(10)]
    );
    // Every task that ran, ran once.
    let mut starts: BTreeMap<String, usize> = BTreeMap::new();
    for (task, _, event) in exec_events(&log, &job) {
        if event == "start" {
            *starts.entry(task).or_default() += 1;
        }
    }
    let twice: Vec<_> = starts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "ran more than once: {twice:?}");
    assert_eq!(starts.len(), expected.iter().filter(|s| **s != "upstream_failed").count());
    for id in &acknowledged {
        let job = server.cli_json(&["job", id, "--json"]);
        assert_eq!(job["id"], id.as_str(), "an acknowledged submit is in the database");
    }
}

fn cli(args: &[&str]) -> std::process::Output {
    let mut command = Command::new(binary());
    command.args(args);
    run_with_timeout(command, Duration::from_secs(120))
}

#[test]
fn export_and_import_move_everything_between_a_data_directory_and_a_database() {
    let cluster = pg::shared();
    let database = cluster.new_database();
    let url = cluster.url(&database);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Jobs and settings in a data directory: a job that failed part way, and a policy set by hand.
    let server = Server::start(&data, &["--local-workers", "1"]);
    let job_file = dir.path().join("nine.json");
    std::fs::write(&job_file, support::nine_tasks(Some(4), 0)).unwrap();
    let output = server.cli(&["submit", job_file.to_str().unwrap(), "--wait", "--json"]);
    let original: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(server.cli(&["policy", "set", "noop", "retry_limit=2"]).status.success());
    drop(server);

    let first = dir.path().join("from-sled.jsonl");
    let output = cli(&["export", "--data-dir", data.to_str().unwrap(), "--output", first.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let output = cli(&["import", first.to_str().unwrap(), "--database-url", &url]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let again = cli(&["import", first.to_str().unwrap(), "--database-url", &url]);
    assert!(again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("imported 0 jobs"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let count = cluster.psql(&database, "SELECT count(*) FROM jobcenter.jobs");
    assert_eq!(count.trim(), "1", "never a duplicate");

    let id = original["id"].as_str().unwrap();
    let job_json = |place: &[&str]| -> serde_json::Value {
        let mut args = vec!["job", id, "--json"];
        args.extend_from_slice(place);
        serde_json::from_slice(&cli(&args).stdout).unwrap()
    };
    let in_database = job_json(&["--database-url", &url]);
    assert_eq!(support::states(&in_database), support::states(&original));
    assert_eq!(in_database["state"], "failed");

    // And back into a fresh data directory, with the policy.
    let second = dir.path().join("from-postgres.jsonl");
    assert!(cli(&["export", "--database-url", &url, "--output", second.to_str().unwrap()]).status.success());
    let back = dir.path().join("back");
    let output = cli(&["import", second.to_str().unwrap(), "--data-dir", back.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let in_back = job_json(&["--data-dir", back.to_str().unwrap()]);
    assert_eq!(in_back, job_json(&["--data-dir", data.to_str().unwrap()]), "the job came back as it left");
    let server = Server::start(&back, &[]);
    let policy = String::from_utf8_lossy(&server.cli(&["policy", "get", "noop"]).stdout).to_string();
    assert!(policy.contains("retry_limit") && policy.contains('2'), "{policy}");
}

#[test]
fn on_postgres_prune_removes_rows_and_a_backup_restores_into_a_data_directory() {
    let cluster = pg::shared();
    let database = cluster.new_database();
    let url = cluster.url(&database);
    let dir = tempfile::tempdir().unwrap();
    let args = ["--database-url", url.as_str(), "--local-workers", "1", "--keep-ended", "1", "--prune-interval", "1h"];
    let server = Server::start(&dir.path().join("unused"), &args);
    let job_file = dir.path().join("nine.json");
    std::fs::write(&job_file, support::nine_tasks(None, 0)).unwrap();
    let ids: Vec<String> = (0..3)
        .map(|_| {
            let output = server.cli(&["submit", job_file.to_str().unwrap(), "--wait", "--json"]);
            let job: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
            job["id"].as_str().unwrap().to_string()
        })
        .collect();
    let rows = |table: &str, id: &str| {
        cluster.psql(
            &database,
            &format!(
                "SELECT count(*) FROM jobcenter.{table} WHERE {} = '{id}'",
                if table == "jobs" { "id" } else { "job_id" }
            ),
        )
    };
    assert_eq!(rows("tasks", &ids[0]).trim(), "9", "the task rows are there before");

    let pruned = server.cli(&["prune", "--json"]);
    let pruned: serde_json::Value = serde_json::from_slice(&pruned.stdout).unwrap();
    assert_eq!(pruned["jobs"].as_array().map(Vec::len), Some(2), "{pruned}");
    for id in &ids[..2] {
        for table in ["jobs", "job_specs", "tasks"] {
            assert_eq!(rows(table, id).trim(), "0", "{table} rows of {id} are gone");
        }
    }
    assert_eq!(rows("tasks", &ids[2]).trim(), "9", "the newest ended job is kept");

    // A copy of the database's server, restored into a data directory.
    let copy = dir.path().join("copy.jsonl");
    let output = server.cli(&["backup", copy.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    drop(server);
    let restored = dir.path().join("restored");
    let output = cli(&["restore", copy.to_str().unwrap(), "--data-dir", restored.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let job: serde_json::Value =
        serde_json::from_slice(&cli(&["job", &ids[2], "--json", "--data-dir", restored.to_str().unwrap()]).stdout)
            .unwrap();
    assert_eq!(job["state"], "succeeded");
    assert_eq!(job["tasks"].as_array().map(Vec::len), Some(9));
}

/// A write the database refuses for good (here a constraint added under the
/// server's feet) is not waited out: the server acknowledges nothing after
/// it and stops with exit code 74 and one line that names the failure. What
/// was acknowledged before is kept.
#[test]
fn a_write_refused_for_good_stops_the_server_with_74_and_acknowledges_nothing() {
    let cluster = pg::shared();
    let database = cluster.new_database();
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(&dir.path().join("unused"), &["--database-url", &cluster.url(&database)]);
    let job = r#"{"name": "kept", "tasks": [{"id": "a", "job_type": "noop"}]}"#;
    let kept = server.submit_file(dir.path(), "kept", job);

    cluster.psql(&database, "ALTER TABLE jobcenter.jobs ADD CONSTRAINT no_more_jobs CHECK (false) NOT VALID");
    let file = dir.path().join("refused.json");
    std::fs::write(&file, job.replace("kept", "refused")).unwrap();
    let refused = server.cli(&["submit", file.to_str().unwrap()]);
    assert!(!refused.status.success(), "a submission the store refused was acknowledged");

    let status = wait_until(Duration::from_secs(30), || server.process.child.try_wait().ok().flatten())
        .unwrap_or_else(|| panic!("the server still runs after a write refused for good"));
    // The log is copied from the server's stderr by a thread that may lag its exit.
    let read_log = || std::fs::read_to_string(&server.log).unwrap();
    let log = wait_until(Duration::from_secs(10), || {
        Some(read_log()).filter(|l| l.contains("jobcenter: store write failed:"))
    })
    .unwrap_or_else(read_log);
    assert_eq!(status.code(), Some(74), "{log}");
    assert!(log.contains("jobcenter: store write failed:") && log.contains("no_more_jobs"), "{log}");
    let names = cluster.psql(&database, "SELECT string_agg(id::text || ' ' || name, ',') FROM jobcenter.jobs");
    assert_eq!(names.trim(), format!("{kept} kept"), "only the acknowledged job is stored");
}

/// `jobcenter bench --count-round-trips` counts on the wire between the
/// instance and its database: a chain commits each step before the next is
/// dispatched, so it takes at least one round trip a step, and a step costs
/// no second one.
#[test]
fn the_bench_counts_the_round_trips_a_chain_takes_to_its_database() {
    let cluster = pg::shared();
    let steps = 150;
    let tasks: Vec<serde_json::Value> = (0..steps)
        .map(|i| {
            let after: Vec<String> = if i == 0 { vec![] } else { vec![format!("t{}", i - 1)] };
            serde_json::json!({ "id": format!("t{i}"), "job_type": "noop", "parameters": {}, "depends_on": after })
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("chain.json");
    std::fs::write(&file, serde_json::json!({ "name": "chain", "tasks": tasks }).to_string()).unwrap();
    let url = cluster.url("postgres");
    let mut command = Command::new(binary());
    command.arg("bench").arg(&file).args(["--workers", "1", "--database-url", &url, "--count-round-trips"]);
    let output = run_with_timeout(command, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "bench failed: {stdout}{}", String::from_utf8_lossy(&output.stderr));
    let result: serde_json::Value = serde_json::from_str(stdout.trim().lines().last().unwrap()).unwrap();
    assert_eq!(result["tasks"], steps, "{result}");
    let per_task = result["db_round_trips_per_task"].as_f64().expect("round trips counted");
    assert!((1.0..2.0).contains(&per_task), "{per_task} round trips a step: {result}");
    assert!(result["db_transactions_per_task"].as_f64().unwrap() >= 1.0, "{result}");
}

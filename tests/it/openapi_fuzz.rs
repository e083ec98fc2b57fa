//! The HTTP API fuzzed against its own OpenAPI document by schemathesis: a
//! real server with a token and a worker, every operation of
//! `/api/openapi.json` called without a credential, with the token, and in a
//! console session. No answer may be a 5xx or differ from the document
//! (status code, content type, schema), and no invalid input may be taken.
//! What is stored (every job and setting, as `jobcenter backup` writes them),
//! the activity log and the scheduler's pause must be the same after every
//! phase whose requests may change nothing: those without a credential, the
//! reads, and the writes that lack the session's anti-forgery token or come
//! from another site. In every phase, a write the server refuses (4xx) must
//! commit nothing to the store and leave the pause as it was
//! (`tests/openapi_fuzz/hooks.py` reads both after each write).

use crate::support;
use crate::support::raw_http;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{start_worker, wait_until, Server};

/// The schemathesis release this test is written for (`.ci/setup` installs it).
const SCHEMATHESIS_VERSION: &str = "4.32.5";
/// Examples per operation in each phase's fuzzing, and the seed: about a
/// minute in all on two cores. `JOBCENTER_FUZZ_EXAMPLES` and
/// `JOBCENTER_FUZZ_SEED` change them for a longer or another run.
const EXAMPLES: u32 = 10;
const SEED: u64 = 20261126;
const TOKEN: &str = "fuzz-token-7d1c0e";

/// A JSON request with the token; the status and the JSON answer.
fn api(address: &str, method: &str, path: &str, body: Option<(&str, &str)>) -> (u16, Value) {
    let bearer = format!("Bearer {TOKEN}");
    let mut headers = vec![("Authorization", bearer.as_str())];
    if let Some((content_type, _)) = body {
        headers.push(("Content-Type", content_type));
    }
    let answer = raw_http::request(address, method, path, &headers, body.map(|(_, b)| b));
    (answer.status, answer.json())
}

fn submit(address: &str, job: &str) -> String {
    let (status, created) = api(address, "POST", "/api/jobs", Some(("application/json", job)));
    assert_eq!(status, 201, "{created}");
    created["job_id"].as_str().unwrap().to_string()
}

fn wait_for_end(address: &str, id: &str) -> String {
    wait_until(Duration::from_secs(60), || {
        let (_, job) = api(address, "GET", &format!("/api/jobs/{id}"), None);
        let state = job["state"].as_str().unwrap_or_default().to_string();
        ["succeeded", "failed", "canceled"].contains(&state.as_str()).then_some(state)
    })
    .unwrap_or_else(|| panic!("job {id} did not end"))
}

/// What no request of a phase that changes nothing may change: every job
/// and setting the store holds (a backup, which is byte for byte the same
/// when nothing changed), the activity log, and whether the scheduler is
/// paused (kept in memory).
fn snapshot(server: &Server, token_file: &Path, dir: &Path) -> String {
    let file = dir.join("snapshot.jsonl");
    let output = server.cli(&["backup", "--token-file", token_file.to_str().unwrap(), file.to_str().unwrap()]);
    assert!(output.status.success(), "backup: {}", String::from_utf8_lossy(&output.stderr));
    // The audit trail grows with each refusal (and each backup): `refusals_only` checks it.
    let stored: String = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .filter(|line| !line.contains(r#""key":"audit/"#))
        .map(|line| format!("{line}\n"))
        .collect();
    let (_, activities) = api(&server.http, "GET", "/api/activities", None);
    let (_, instances) = api(&server.http, "GET", "/api/instances", None);
    let paused: Vec<&Value> = instances["instances"].as_array().unwrap().iter().map(|i| &i["paused"]).collect();
    format!("{stored}activities {activities}\npaused {}\n", json!(paused))
}

/// The audit records taken since `seen` of them were: each a refusal, a
/// read that records itself (a backup), or a sign-in refused; never a change.
fn refusals_only(server: &Server, seen: usize) -> usize {
    let records = trail(server);
    for record in &records[seen..] {
        let action = record["action"].as_str().unwrap();
        let refused = record["outcome"] != "ok";
        assert!(refused || action == "backup", "a request of the fuzz that was not refused: {record}");
    }
    records.len()
}

fn trail(server: &Server) -> Vec<Value> {
    let (_, trail) = api(&server.http, "GET", "/api/audit?limit=0", None);
    trail["records"].as_array().unwrap().clone()
}

/// The first lines where two snapshots differ, for the failure message.
fn difference(before: &str, after: &str) -> String {
    let (before, after): (Vec<&str>, Vec<&str>) = (before.lines().collect(), after.lines().collect());
    let first = before.iter().zip(&after).position(|(a, b)| a != b).unwrap_or(before.len().min(after.len()));
    let cut = |line: Option<&&str>| line.map_or("(none)".to_string(), |l| l.chars().take(600).collect());
    format!(
        "{} lines before, {} after; first difference at line {}:\n  before: {}\n  after:  {}",
        before.len(),
        after.len(),
        first + 1,
        cut(before.get(first)),
        cut(after.get(first))
    )
}

/// Runs schemathesis's version check; a missing or other release fails with one line.
fn schemathesis_present() {
    let install =
        format!("install it with `python3 -m pip install schemathesis=={SCHEMATHESIS_VERSION}` (or run `. .ci/setup`)");
    let output = Command::new("schemathesis").arg("--version").output();
    let version = match output {
        Ok(output) if output.status.success() => String::from_utf8_lossy(&output.stdout).trim().to_string(),
        _ => panic!("schemathesis is not installed: {install}"),
    };
    assert!(
        version.ends_with(&format!("version {SCHEMATHESIS_VERSION}")),
        "this test needs schemathesis {SCHEMATHESIS_VERSION}, not {version:?}: {install}"
    );
}

/// One schemathesis run over the operations `args` picks, sending `headers`
/// with every request.
struct Phase<'a> {
    name: &'a str,
    headers: Vec<String>,
    args: &'a [&'a str],
    /// Every write it sends must be refused (401 or 403): the hooks' `write_refused` check.
    writes_refused: bool,
}

struct Fuzz<'a> {
    address: &'a str,
    dir: &'a Path,
    /// Ids the hooks put in path parameters, so that reads reach real records.
    jobs: String,
    tasks: String,
    examples: String,
    seed: String,
}

impl Fuzz<'_> {
    fn run(&self, phase: &Phase) -> Duration {
        let url = format!("http://{}", self.address);
        let mut command = Command::new("schemathesis");
        command
            .current_dir(self.dir)
            .env("SCHEMATHESIS_HOOKS", concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openapi_fuzz/hooks.py"))
            .env("JOBCENTER_FUZZ_JOBS", &self.jobs)
            .env("JOBCENTER_FUZZ_TASKS", &self.tasks)
            .env("JOBCENTER_FUZZ_JOB_TYPES", "noop")
            .env("JOBCENTER_FUZZ_ADDRESS", self.address)
            .env("JOBCENTER_FUZZ_TOKEN", TOKEN)
            .env_remove("JOBCENTER_FUZZ_REFUSED")
            .args(["run", &format!("{url}/api/openapi.json"), "--url", &url])
            // Every check but `positive_data_acceptance`, which wants every
            // schema-valid request to succeed: some rules cannot be written
            // in a schema (a job's dependencies name tasks of the job and
            // form no cycle; a job type with no detector cannot detect).
            .args(["--checks", "all", "--exclude-checks", "positive_data_acceptance"])
            .args(["--max-examples", &self.examples, "--seed", &self.seed])
            .args(["--request-timeout", "10", "--workers", "1", "--generation-database", "none"])
            .args(["--no-color", "--output-truncate", "true"])
            .args(phase.args);
        if phase.writes_refused {
            command.env("JOBCENTER_FUZZ_REFUSED", "1");
        }
        for header in &phase.headers {
            command.args(["--header", header]);
        }
        let started = Instant::now();
        // Five minutes for the default examples, longer for more.
        let examples: u64 = self.examples.parse().unwrap_or(u64::from(EXAMPLES));
        let limit = Duration::from_secs(30 * examples.max(u64::from(EXAMPLES)));
        let output = support::run_with_timeout(command, limit);
        let took = started.elapsed();
        let stdout = String::from_utf8_lossy(&output.stdout);
        // Each phase's whole report is kept in target/openapi-fuzz/.
        let reports = Path::new(env!("CARGO_MANIFEST_DIR")).join("target").join("openapi-fuzz");
        std::fs::create_dir_all(&reports).unwrap();
        let kept = reports.join(format!("{}.txt", phase.name));
        std::fs::write(&kept, format!("{stdout}{}", String::from_utf8_lossy(&output.stderr))).unwrap();
        // The report from its failures and errors on (each found once), or whole.
        let found = stdout.find("=== FAILURES ===").or_else(|| stdout.find("=== ERRORS ===")).unwrap_or(0);
        let report = stdout[found..].lines().filter(|l| !l.trim().is_empty()).collect::<Vec<_>>().join("\n");
        let sent: Vec<&str> = phase.headers.iter().filter_map(|h| h.split(':').next()).collect();
        assert!(
            output.status.success(),
            "phase {:?} (headers sent: {}) failed; the whole report is in {}:\n{report}\n{}",
            phase.name,
            if sent.is_empty() { "none".to_string() } else { sent.join(", ") },
            kept.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        let tested = stdout.lines().find(|l| l.trim_start().starts_with("Tested:")).unwrap_or("").trim();
        let cases = stdout.lines().skip_while(|l| !l.starts_with("Test cases:")).nth(1).unwrap_or("").trim();
        eprintln!("phase {}: {tested}, {cases}, in {took:.1?}", phase.name);
        took
    }
}

#[test]
fn every_operation_answers_as_the_openapi_document_says_and_changes_nothing_it_should_not() {
    schemathesis_present();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let token_arg = token_file.to_str().unwrap();
    // No recovery check (its first would come after --orphan-grace) and no
    // prune of its own during the test: the store changes only by requests.
    let server = Server::start(
        &dir.path().join("data"),
        // The anonymous phase presents hundreds of made-up credentials from
        // one address: the slowdown they earn is `access.rs`'s to test, not
        // this test's, which would wait it out past its time.
        &[
            "--token-file",
            token_arg,
            "--recovery-interval",
            "1h",
            "--orphan-grace",
            "1h",
            "--prune-interval",
            "1h",
            "--free-credential-failures",
            "1000000",
        ],
    );
    let address = server.http.as_str();
    // Only `noop`: a fuzzed job of the built-in `shell` type would run a command.
    let mut worker = start_worker(&server, "fuzz-worker", &["--token-file", token_arg, "--job-types", "noop"], None);
    wait_until(Duration::from_secs(30), || {
        let (_, workers) = api(address, "GET", "/api/workers", None);
        (workers["workers"].as_array().map_or(0, Vec::len) == 1).then_some(())
    })
    .expect("the worker connects");

    // State to read: a failed job, a succeeded one, a canceled one, a policy set.
    let failing = submit(
        address,
        r#"{"name":"fails","tasks":[{"id":"a","job_type":"noop"},{"id":"b","job_type":"noop","parameters":{"fail":true},"depends_on":["a"]},{"id":"c","job_type":"noop","depends_on":["b"]}]}"#,
    );
    let succeeding = submit(
        address,
        r#"{"name":"succeeds","tasks":[{"id":"a","job_type":"noop","labels":{"volume_id":7}},{"id":"b","job_type":"noop","depends_on":["a"]}]}"#,
    );
    let canceled = submit(
        address,
        r#"{"name":"canceled","tasks":[{"id":"a","job_type":"noop","parameters":{"sleep_ms":60000}}]}"#,
    );
    let (status, answer) = api(address, "POST", &format!("/api/jobs/{canceled}/cancel"), None);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(wait_for_end(address, &failing), "failed");
    assert_eq!(wait_for_end(address, &succeeding), "succeeded");
    assert_eq!(wait_for_end(address, &canceled), "canceled");
    let (status, policy) =
        api(address, "PUT", "/api/policies/noop", Some(("application/json", r#"{"retry_backoff_seconds": 1}"#)));
    assert_eq!(status, 200, "{policy}");

    // A console session, signed in as the console signs in.
    let signed_in = raw_http::request(
        address,
        "POST",
        "/api/session",
        &[("Content-Type", "application/json")],
        Some(&json!({ "token": TOKEN }).to_string()),
    );
    assert_eq!(signed_in.status, 200, "{}", signed_in.body);
    let cookie =
        signed_in.header("set-cookie").and_then(|v| v.split(';').next()).expect("a session cookie").to_string();
    let csrf = signed_in.json()["csrf"].as_str().unwrap().to_string();
    let session_live = || {
        raw_http::request(address, "GET", "/api/session", &[("Cookie", &cookie)], None).json()["csrf"] == csrf.as_str()
    };
    assert!(session_live());

    let fuzz = Fuzz {
        address,
        dir: dir.path(),
        jobs: [&failing, &succeeding, &canceled].map(|s| s.as_str()).join(","),
        tasks: "a,b,c".into(),
        examples: std::env::var("JOBCENTER_FUZZ_EXAMPLES").unwrap_or_else(|_| EXAMPLES.to_string()),
        seed: std::env::var("JOBCENTER_FUZZ_SEED").unwrap_or_else(|_| SEED.to_string()),
    };
    let bearer = format!("Authorization: Bearer {TOKEN}");
    let session = format!("Cookie: {cookie}");
    let reads = ["--include-method", "GET", "--generation-with-security-parameters", "false"];
    let writes = ["--exclude-method", "GET", "--generation-with-security-parameters", "false"];
    // Phases whose requests may change nothing, each checked against the state before.
    let unchanging = [
        // With no credential, or a made-up one: every operation.
        Phase { name: "anonymous", headers: vec![], args: &[], writes_refused: false },
        Phase { name: "token-reads", headers: vec![bearer.clone()], args: &reads, writes_refused: false },
        Phase { name: "session-reads", headers: vec![session.clone()], args: &reads, writes_refused: false },
        // A session's writes without its anti-forgery token.
        Phase {
            name: "session-writes-without-csrf",
            headers: vec![session.clone()],
            args: &writes,
            writes_refused: true,
        },
        // The token's writes from another site.
        Phase {
            name: "token-writes-from-another-site",
            headers: vec![bearer.clone(), "Origin: http://elsewhere.example".into()],
            args: &writes,
            writes_refused: true,
        },
    ];
    let before = snapshot(&server, &token_file, dir.path());
    let mut seen = trail(&server).len();
    let mut took = Duration::ZERO;
    for phase in &unchanging {
        took += fuzz.run(phase);
        let after = snapshot(&server, &token_file, dir.path());
        assert!(before == after, "phase {:?} changed the server's state: {}", phase.name, difference(&before, &after));
        seen = refusals_only(&server, seen);
        assert!(session_live(), "phase {:?} ended the console session", phase.name);
    }

    // Writes that may change state: the answers are checked, and that a
    // refused write changes nothing. Without a worker, a job submitted now
    // stays as its requests leave it, so the store changes only by them. The
    // events stream of a job that has not ended lasts as long as the job, so
    // it is fuzzed above, on ended jobs; signing out would end the session.
    worker.kill();
    wait_until(Duration::from_secs(30), || {
        let (_, workers) = api(address, "GET", "/api/workers", None);
        workers["workers"].as_array().is_some_and(Vec::is_empty).then_some(())
    })
    .expect("the worker is gone");
    let changing = [
        // Invalid input with the token: each must be refused (`negative_data_rejection`).
        Phase {
            name: "token-writes-invalid",
            headers: vec![bearer.clone()],
            args: &["--exclude-method", "GET", "--mode", "negative", "--generation-with-security-parameters", "false"],
            writes_refused: false,
        },
        Phase {
            name: "session-everything",
            headers: vec![session.clone(), format!("X-CSRF-Token: {csrf}")],
            args: &[
                "--exclude-operation-id",
                "signOut",
                "--exclude-operation-id",
                "jobEvents",
                "--generation-with-security-parameters",
                "false",
            ],
            writes_refused: false,
        },
        Phase {
            name: "token-everything",
            headers: vec![bearer.clone()],
            args: &["--exclude-operation-id", "jobEvents", "--generation-with-security-parameters", "false"],
            writes_refused: false,
        },
    ];
    for phase in &changing {
        took += fuzz.run(phase);
    }
    eprintln!("schemathesis ran {took:.1?} in all");

    assert_eq!(raw_http::request(address, "GET", "/readyz", &[], None).status, 200, "the server still takes requests");
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(!log.contains("panicked"), "the server panicked: {log}");
}

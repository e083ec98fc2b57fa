//! The audit trail on real servers: every change, sign-in, sign-out and
//! refused credential is recorded with who (name and role), from where,
//! what and how it ended, over both ports; it survives a SIGKILL; `--who`
//! and `--since` select; only an admin reads it; no route alters it; no
//! secret reaches it, the log or the metrics; a write refused before the
//! API reads it is recorded too; retention keeps its newest;
//! and on PostgreSQL every instance reads the one trail.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::access::add;
use crate::support::{self, raw_http, wait_until, Server};

/// A job id no job has.
const NO_JOB: &str = "0190b0c8-0000-7000-8000-000000000000";

/// A job whose one task nobody serves: it stays running until canceled.
const PARKED: &str = r#"{"name":"parked","tasks":[{"id":"t","job_type":"parked"}]}"#;

fn token_file(dir: &Path, name: &str, token: &str) -> String {
    let path = dir.join(format!("{name}.token"));
    std::fs::write(&path, token).unwrap();
    path.to_str().unwrap().to_string()
}

fn http(server: &Server, method: &str, path: &str, token: &str, body: Option<&str>) -> raw_http::Answer {
    let bearer = format!("Bearer {token}");
    raw_http::request(
        &server.http,
        method,
        path,
        &[("Content-Type", "application/json"), ("Authorization", &bearer)],
        body,
    )
}

/// `jobcenter audit --json` with `args`, as `token_file`'s credential.
fn audit(server: &Server, token_file: &str, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["audit", "--json", "--token-file", token_file];
    all.extend_from_slice(args);
    let output = server.cli(&all);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice::<Value>(&output.stdout).unwrap().as_array().cloned().unwrap()
}

/// The record of `action` on `target`, the one there is.
fn one<'a>(records: &'a [Value], action: &str, target: &str) -> &'a Value {
    let found: Vec<&Value> = records.iter().filter(|r| r["action"] == action && r["target"] == target).collect();
    assert_eq!(found.len(), 1, "one {action} of {target:?} in {records:#?}");
    found[0]
}

#[test]
fn every_change_and_refusal_is_recorded_with_who_from_where_and_how_it_ended() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("credentials.toml");
    let tokens: BTreeMap<&str, String> =
        [("ana", "operator"), ("vic", "viewer"), ("root", "admin")].map(|(n, r)| (n, add(&file, n, r))).into();
    let data = dir.path().join("data");
    let mut server = Server::start(&data, &["--credentials", file.to_str().unwrap()]);
    let (ana, root) = (token_file(dir.path(), "ana", &tokens["ana"]), token_file(dir.path(), "root", &tokens["root"]));

    // ana, over gRPC: a submit, a retry of what she canceled over HTTP, a policy change.
    let job_file = dir.path().join("parked.json");
    std::fs::write(&job_file, PARKED).unwrap();
    let output = server.cli(&["submit", job_file.to_str().unwrap(), "--token-file", &ana]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let job = String::from_utf8(output.stdout).unwrap().trim().to_string();
    let canceled = http(&server, "POST", &format!("/api/jobs/{job}/cancel"), &tokens["ana"], None);
    assert_eq!(canceled.status, 200, "{}", canceled.body);
    let retried = server.cli(&["retry", &job, "--token-file", &ana]);
    assert!(retried.status.success(), "{}", String::from_utf8_lossy(&retried.stderr));
    let set = server.cli(&["policy", "set", "noop", "retry_limit=7", "--token-file", &ana]);
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    // A cancel of no job is refused, and recorded as refused.
    assert_eq!(http(&server, "POST", &format!("/api/jobs/{NO_JOB}/cancel"), &tokens["ana"], None).status, 404);
    // A write the API never reads (a parameter it does not take) is recorded as refused.
    let bogus = http(&server, "POST", &format!("/api/jobs/{job}/cancel?dry_run=1"), &tokens["ana"], None);
    assert_eq!(bogus.status, 400, "{}", bogus.body);
    // vic may not cancel; a made-up token is no credential.
    assert_eq!(http(&server, "POST", &format!("/api/jobs/{job}/cancel"), &tokens["vic"], None).status, 403);
    assert_eq!(http(&server, "GET", "/api/jobs", "vic.made-up-secret", None).status, 401);
    // vic signs in to the console, and out again.
    let signed_in = raw_http::request(
        &server.http,
        "POST",
        "/api/session",
        &[("Content-Type", "application/json")],
        Some(&serde_json::json!({ "token": tokens["vic"] }).to_string()),
    );
    assert_eq!(signed_in.status, 200, "{}", signed_in.body);
    let cookie = signed_in.header("set-cookie").unwrap().split(';').next().unwrap().to_string();
    let csrf = signed_in.json()["csrf"].as_str().unwrap().to_string();
    let signed_out = raw_http::request(
        &server.http,
        "DELETE",
        "/api/session",
        &[("Cookie", &cookie), ("X-CSRF-Token", &csrf), ("Content-Type", "application/json")],
        None,
    );
    assert_eq!(signed_out.status, 200, "{}", signed_out.body);

    // Acknowledged means recorded: the trail is there after a SIGKILL.
    server.process.kill();
    let server = Server::start(&data, &["--credentials", file.to_str().unwrap()]);
    let records = audit(&server, &root, &[]);

    let submit = one(&records, "job.submit", &job);
    assert_eq!(
        (&submit["who"], &submit["role"], &submit["from"]),
        (&"ana".into(), &"operator".into(), &"127.0.0.1".into())
    );
    assert_eq!(submit["outcome"], "ok");
    assert_eq!((&submit["args"]["name"], &submit["args"]["tasks"]), (&"parked".into(), &"1".into()));
    for action in ["job.cancel", "job.retry"] {
        let record = one(&records, action, &job);
        assert_eq!((&record["who"], &record["outcome"]), (&"ana".into(), &"ok".into()), "{record}");
    }
    let policy = one(&records, "policy.set", "noop");
    assert_eq!(
        (&policy["who"], &policy["args"]["retry_limit"], &policy["outcome"]),
        (&"ana".into(), &"7".into(), &"ok".into())
    );
    let missing = one(&records, "job.cancel", NO_JOB);
    assert!(missing["outcome"].as_str().unwrap().contains("unknown job"), "{missing}");
    let unread = one(&records, "request.refused", "POST /api/jobs/{id}/cancel");
    assert_eq!((&unread["who"], &unread["outcome"]), (&"ana".into(), &"400 Bad Request".into()));
    let forbidden = one(&records, "access.refused", "POST /api/jobs/{id}/cancel");
    assert_eq!((&forbidden["who"], &forbidden["role"]), (&"vic".into(), &"viewer".into()));
    assert!(forbidden["outcome"].as_str().unwrap().contains("needs the role operator"), "{forbidden}");
    let unknown = one(&records, "access.refused", "GET /api/jobs");
    assert_eq!((&unknown["who"], &unknown["role"]), (&"unknown".into(), &"".into()));
    for action in ["session.sign_in", "session.sign_out"] {
        let record = one(&records, action, "");
        assert_eq!(
            (&record["who"], &record["role"], &record["outcome"]),
            (&"vic".into(), &"viewer".into(), &"ok".into())
        );
    }
    // Oldest first, in the order they were taken.
    let order: Vec<&str> = records.iter().map(|r| r["action"].as_str().unwrap()).collect();
    let at = |action: &str| order.iter().position(|a| *a == action).unwrap();
    assert!(
        at("job.submit") < at("job.retry")
            && at("job.retry") < at("policy.set")
            && at("policy.set") < at("session.sign_in")
    );

    // --who and --since select; --since in the future selects nothing.
    let by_vic = audit(&server, &root, &["--who", "vic"]);
    assert_eq!(by_vic.len(), 3, "{by_vic:#?}");
    assert!(by_vic.iter().all(|r| r["who"] == "vic"));
    assert!(audit(&server, &root, &["--since", "2999-01-01T00:00:00Z"]).is_empty());
    assert_eq!(audit(&server, &root, &["--since", "1h"]).len(), records.len());

    // Only an admin reads it, and no route alters it.
    let output = server.cli(&["audit", "--token-file", &ana]);
    assert!(String::from_utf8_lossy(&output.stderr).contains("needs the role admin"), "an operator reads no audit");
    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        assert_eq!(http(&server, method, "/api/audit", &tokens["root"], Some("{}")).status, 405, "{method} /api/audit");
    }
    // Over HTTP, ana's records are those read before and her refused read.
    let over_http = http(&server, "GET", "/api/audit?who=ana", &tokens["root"], None).json();
    let over_http = over_http["records"].as_array().unwrap();
    assert_eq!(over_http.len(), records.iter().filter(|r| r["who"] == "ana").count() + 1);
    let refused = one(over_http, "access.refused", "/jobcenter.v1.JobService/ListAudit");
    assert_eq!((&refused["who"], &refused["role"]), (&"ana".into(), &"operator".into()));

    // No secret anywhere: the trail, the log, the metrics.
    let metrics = http(&server, "GET", "/metrics", &tokens["root"], None).body;
    let trail = serde_json::to_string(&records).unwrap();
    let log = std::fs::read_to_string(&server.log).unwrap();
    for token in tokens.values().map(String::as_str).chain(["vic.made-up-secret"]) {
        let secret = token.rsplit_once('.').unwrap().1;
        for (name, text) in [("the trail", &trail), ("the log", &log), ("the metrics", &metrics)] {
            assert!(!text.contains(secret), "a secret in {name}");
        }
    }
}

#[test]
fn retention_keeps_the_newest_records() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path(), "admin", "an-admin-token-of-this-test");
    let server = Server::start(
        &dir.path().join("data"),
        &["--token-file", &token, "--keep-audit", "3", "--prune-interval", "1s"],
    );
    for _ in 0..6 {
        let output = server.cli(&["cancel", NO_JOB, "--token-file", &token]);
        assert!(!output.status.success());
    }
    let kept = wait_until(Duration::from_secs(30), || {
        let records = audit(&server, &token, &["--limit", "0"]);
        (records.len() == 3).then_some(records)
    });
    let kept = kept.expect("the trail is cut to its newest 3");
    assert!(kept.iter().all(|r| r["action"] == "job.cancel" && r["who"] == "token-file"), "{kept:#?}");
    // The log line comes after the removal is durable, through the server's stderr.
    let said = wait_until(Duration::from_secs(10), || {
        std::fs::read_to_string(&server.log).unwrap().contains("audit records removed").then_some(())
    });
    assert!(said.is_some(), "the prune says what it removed");
}

#[test]
fn every_instance_on_one_database_reads_the_one_trail() {
    let pg = support::postgres::shared();
    let database = pg.new_database();
    let url = pg.url(&database);
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path(), "admin", "an-admin-token-of-this-test");
    let start = |name: &str| {
        let free = crate::support::free_port;
        let (http, grpc) = (format!("127.0.0.1:{}", free()), free().to_string());
        let args = ["--database-url", &url, "--grpc", &grpc, "--token-file", &token, "--peer-token-file", &token];
        Server::start_on(&dir.path().join(name), &http, &args)
    };
    let (a, b) = (start("a"), start("b"));
    let set = a.cli(&["policy", "set", "noop", "retry_limit=5", "--token-file", &token]);
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    let records = audit(&b, &token, &[]);
    let record = one(&records, "policy.set", "noop");
    assert_eq!((&record["who"], &record["outcome"]), (&"token-file".into(), &"ok".into()));
    let stored = pg.psql(&database, "SELECT count(*) FROM jobcenter.settings WHERE key LIKE 'audit/%'");
    assert_eq!(stored.trim(), "1", "the record is a row of the database");
}

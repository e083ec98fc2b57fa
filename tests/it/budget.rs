//! Bandwidth budgets on a real server: set, shown, kept across a SIGKILL and
//! cleared over the command line and HTTP; bad rates and budgets under the
//! minimum share refused with one line and nothing stored; every change
//! and refusal in the audit trail; and a worker handed its share as
//! `io_byte_per_second` while the shares of what runs never exceed the budget.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{raw_http, start_worker, wait_until, Server};

fn budget(server: &Server) -> Value {
    server.cli_json(&["budget", "--json"])
}

/// Runs `jobcenter budget ARGS`; answers its exit code, stdout and stderr.
fn budget_cli(server: &Server, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["budget"];
    all.extend_from_slice(args);
    let output = server.cli(&all);
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).trim().to_string();
    (output.status.code().unwrap_or(-1), text(&output.stdout), text(&output.stderr))
}

fn put(server: &Server, body: &Value) -> raw_http::Answer {
    let body = body.to_string();
    raw_http::request(&server.http, "PUT", "/api/budget", &[("Content-Type", "application/json")], Some(&body))
}

#[test]
fn a_budget_is_set_shown_kept_across_a_kill_and_cleared_and_bad_ones_are_refused_with_nothing_stored() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data, &[]);

    let (code, shown, _) = budget_cli(&server, &[]);
    assert_eq!(code, 0);
    assert_eq!(
        shown,
        "bandwidth budget: none: the tasks that move data (ec_balance, erasure_coding, volume_balance) run at their workers' own rates"
    );
    let (code, _, error) = budget_cli(&server, &["set", "--minimum", "5MB/s"]);
    assert_eq!((code, error.as_str()), (2, "jobcenter: budget cluster: required when no budget is set: the bytes per second every budgeted task shares, such as 200MB/s"));

    let (code, shown, error) =
        budget_cli(&server, &["set", "--cluster", "20MB/s", "--per-server", "10MiB/s", "--minimum", "5MB/s"]);
    assert_eq!(code, 0, "{error}");
    assert!(
        shown.starts_with("bandwidth budget: 20MB/s over the cluster, 10MiB/s through each volume server; each task starts with at least 5MB/s\nshared by: ec_balance, erasure_coding, volume_balance\nused: 0B/s, free: 20MB/s, by 0 task(s)"),
        "{shown}"
    );
    let set = budget(&server);
    let expected = json!({
        "set": true,
        "cluster_bytes_per_second": 20_000_000,
        "per_server_bytes_per_second": 10 << 20,
        "minimum_bytes_per_second": 5_000_000,
        "used_bytes_per_second": 0,
        "free_bytes_per_second": 20_000_000,
        "shares": [],
        "servers": [],
        "job_types": ["ec_balance", "erasure_coding", "volume_balance"],
    });
    assert_eq!(set, expected);

    // Refusals, each one line naming the field and the rule; nothing changes.
    for (args, refusal) in [
        (
            &["set", "--cluster", "fast"][..],
            "jobcenter: budget cluster: \"fast\" is not a rate: give bytes per second as a number and a unit, such as 200MB/s or 20MiB/s (units B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)",
        ),
        (
            &["set", "--cluster", "4MB/s"],
            "jobcenter: budget cluster: 4MB/s is below the minimum share of one task, 5MB/s: no task could start (lower the minimum or raise the budget)",
        ),
        (
            &["set", "--minimum", "11MiB/s"],
            "jobcenter: budget per_server: 10MiB/s is below the minimum share of one task, 11MiB/s: no task could start (lower the minimum or raise the budget)",
        ),
        (&["set", "--per-server", "0"], "jobcenter: budget per_server: must be more than 0 B/s (`jobcenter budget clear` removes the budget)"),
    ] {
        let (code, _, error) = budget_cli(&server, args);
        assert_eq!((code, error.as_str()), (2, refusal), "{args:?}");
    }
    for (body, refusal) in [
        (json!({"minimum": "lots"}), "budget minimum: \"lots\" is not a rate"),
        (json!({"speed": "1MB/s"}), "budget: unknown field \"speed\"; fields are cluster, per_server, minimum, clear"),
        (json!({"clear": true, "cluster": "1GB/s"}), "budget clear: takes no rates (give either clear or the rates)"),
    ] {
        let answer = put(&server, &body);
        assert_eq!(answer.status, 400, "{body}: {}", answer.body);
        let error = answer.json()["error"].as_str().unwrap().to_string();
        assert!(error.starts_with(refusal), "{body}: {error}");
    }
    assert_eq!(budget(&server), expected, "nothing of a refused change is stored");

    // Over HTTP: a change of one part keeps the others; numbers are bytes per second.
    let answer = put(&server, &json!({"cluster": 30_000_000, "per_server": "none"}));
    assert_eq!(answer.status, 200, "{}", answer.body);
    let changed = answer.json();
    assert_eq!(
        (
            &changed["cluster_bytes_per_second"],
            &changed["per_server_bytes_per_second"],
            &changed["minimum_bytes_per_second"]
        ),
        (&json!(30_000_000), &json!(0), &json!(5_000_000))
    );
    let read = raw_http::request(&server.http, "GET", "/api/budget", &[], None);
    assert_eq!((read.status, read.json()), (200, changed.clone()));

    // A policy marks another job type as sharing it; only 0 and 1 are taken.
    assert!(server.cli(&["policy", "set", "shell", "uses_bandwidth_budget=1"]).status.success());
    let marked = server.cli(&["policy", "set", "vacuum", "uses_bandwidth_budget=2"]);
    assert_eq!(
        String::from_utf8_lossy(&marked.stderr).trim(),
        "jobcenter: policy setting uses_bandwidth_budget: must be 0 or 1, not 2"
    );
    let changed = budget(&server);
    assert_eq!(changed["job_types"], json!(["ec_balance", "erasure_coding", "shell", "volume_balance"]));

    // Acknowledged means kept: the budget is there after a SIGKILL.
    server.process.kill();
    let mut server = Server::start(&data, &[]);
    assert_eq!(budget(&server), changed);

    // Every change and refusal is in the audit trail.
    let output = server.cli(&["audit", "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let records: Vec<Value> = serde_json::from_slice::<Value>(&output.stdout).unwrap().as_array().cloned().unwrap();
    let sets: Vec<&Value> = records.iter().filter(|r| r["action"] == "budget.set").collect();
    let outcomes: Vec<&str> = sets.iter().map(|r| r["outcome"].as_str().unwrap()).collect();
    assert_eq!(sets.len(), 9, "{sets:#?}");
    assert_eq!(outcomes.iter().filter(|o| **o == "ok").count(), 2, "{outcomes:?}");
    assert!(outcomes.iter().any(|o| o.contains("4MB/s is below the minimum share of one task, 5MB/s")), "{outcomes:?}");
    let first = sets.iter().find(|r| r["outcome"] == "ok").unwrap();
    assert_eq!(
        (&first["target"], &first["args"]["cluster"], &first["args"]["per_server"], &first["args"]["minimum"]),
        (&json!("bandwidth"), &json!("20MB/s"), &json!("10MiB/s"), &json!("5MB/s"))
    );
    assert!(
        records.iter().any(|r| r["action"] == "request.refused" && r["target"] == "PUT /api/budget"),
        "the unknown field, refused before the API read it: {records:#?}"
    );

    let (code, shown, _) = budget_cli(&server, &["clear"]);
    assert_eq!((code, shown.starts_with("bandwidth budget: none")), (0, true), "{shown}");
    server.process.kill();
    let server = Server::start(&data, &[]);
    assert_eq!(budget(&server)["set"], false, "cleared for good");
}

/// A job of `n` shell tasks that print the share they were given and wait.
fn printing_their_share(n: usize, sleep_seconds: u32) -> String {
    let tasks: Vec<Value> = (0..n)
        .map(|i| {
            json!({
                "id": format!("t{i}"),
                "job_type": "shell",
                "parameters": {"command": format!("echo rate=$JOBCENTER_IO_BYTE_PER_SECOND; sleep {sleep_seconds}")},
            })
        })
        .collect();
    json!({"name": "shares", "tasks": tasks}).to_string()
}

#[test]
fn a_worker_is_handed_its_share_as_io_byte_per_second_and_the_shares_never_exceed_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let _worker = start_worker(&server, "mover", &[], None);
    server.wait_for_workers(1);
    assert!(server.cli(&["policy", "set", "shell", "uses_bandwidth_budget=1"]).status.success());
    let (code, _, error) = budget_cli(&server, &["set", "--cluster", "20MB/s", "--minimum", "8MB/s"]);
    assert_eq!(code, 0, "{error}");

    // Three tasks: an even split (6.67 MB/s) is under the minimum, so two
    // run at 8 MB/s each and the third waits until one ends.
    let job = server.submit_file(dir.path(), "shares", &printing_their_share(3, 3));
    let running = wait_until(Duration::from_secs(30), || {
        let now = budget(&server);
        (now["shares"].as_array().unwrap().len() == 2).then_some(now)
    })
    .expect("two tasks take their shares");
    assert_eq!(
        (&running["used_bytes_per_second"], &running["free_bytes_per_second"]),
        (&json!(16_000_000), &json!(4_000_000))
    );
    for share in running["shares"].as_array().unwrap() {
        assert_eq!((&share["job_type"], &share["bytes_per_second"]), (&json!("shell"), &json!(8_000_000)), "{share}");
        assert!(share["attempt"].as_str().unwrap().starts_with(&job), "{share}");
    }
    let mut most = 0;
    let done = wait_until(Duration::from_secs(60), || {
        let now = budget(&server);
        most = most.max(now["used_bytes_per_second"].as_u64().unwrap());
        let job = server.cli_json(&["job", &job, "--json"]);
        (job["state"] != "running").then_some(job)
    })
    .expect("the job ends");
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(most <= 20_000_000, "the shares together never exceeded the budget: {most}");
    let mut rates: Vec<String> = done["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["output"].as_array().unwrap().iter().map(|l| l.as_str().unwrap().to_string()))
        .filter(|line| line.starts_with("rate="))
        .collect();
    rates.sort();
    // The third started when one of 8 MB/s ended: half of the budget for
    // each of the two then wanting it, 10 MB/s, within the 12 MB/s free.
    assert_eq!(rates, ["rate=10000000", "rate=8000000", "rate=8000000"]);
    let after = budget(&server);
    assert_eq!(
        (&after["used_bytes_per_second"], &after["shares"]),
        (&json!(0), &json!([])),
        "every share is given back"
    );
}

//! Bandwidth budgets on a real server: set, shown, kept across a SIGKILL and
//! cleared over the command line and HTTP; bad rates and budgets under the
//! minimum share refused with one line and nothing stored; every change
//! and refusal in the audit trail; a worker handed its share as
//! `io_byte_per_second` while the shares of what runs never exceed the
//! budget; on one PostgreSQL database, a budget set through one instance
//! applied by the other, and the shares of both instances' tasks together
//! within it; and on a real SeaweedFS cluster, two volume moves by a real
//! `weed worker` under a 20 MB/s budget copying no faster than it allows,
//! as the target volume servers' disks show, and the same moves without a
//! budget copying far faster.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::seaweedfs::{self, task_params, Cluster, ClusterOptions, WAIT};
use crate::support::{self, raw_http, start_worker, wait_until, Process, Server};

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

/// A job of shell tasks that print the share they were given and wait,
/// task `t<i>` for `sleeps[i]` seconds.
fn printing_their_share(sleeps: &[u32]) -> String {
    let tasks: Vec<Value> = sleeps
        .iter()
        .enumerate()
        .map(|(i, sleep_seconds)| {
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

    // Three tasks: an even split (6.67 MB/s) is under the minimum, so the
    // first two run at 8 MB/s each and the third waits until one ends (the
    // first, well before the second).
    let job = server.submit_file(dir.path(), "shares", &printing_their_share(&[2, 8, 1]));
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

/// A SeaweedFS cluster, a jobcenter server on its master, and a `weed
/// worker` that runs `volume_balance`, two moves at once.
struct Moves {
    cluster: Cluster,
    server: Server,
    dir: tempfile::TempDir,
    _worker: Process,
}

const MIB: u64 = 1 << 20;
/// What each moved volume holds: large enough that a copy at 10 MB/s spans
/// several of the volume server's throttle windows (see `paced`).
const VOLUME_MIB: usize = 96;
const BUDGET: f64 = 20e6;

impl Moves {
    fn start() -> Moves {
        let cluster =
            Cluster::start(ClusterOptions { volume_servers: 3, volume_size_limit_mb: 128, ..Default::default() });
        let dir = tempfile::tempdir().unwrap();
        let master = cluster.master_address();
        let server = Server::start(&dir.path().join("data"), &["--master", &master]);
        let policy = ["detection_enabled=0", "global_execution_concurrency=2", "per_worker_execution_concurrency=2"];
        let output = server.cli(&[&["policy", "set", "volume_balance"][..], &policy].concat());
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let working = dir.path().join("weed-worker");
        std::fs::create_dir_all(&working).unwrap();
        let log = std::fs::File::create(dir.path().join("weed-worker.log")).unwrap();
        let child = Command::new(seaweedfs::weed())
            .args([
                "worker",
                &format!("-admin={}", server.http),
                "-id=mover",
                "-jobType=volume_balance",
                "-heartbeat=1s",
            ])
            .arg(format!("-workingDir={}", working.display()))
            .current_dir(&working)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start weed worker");
        let worker = Process { child, name: "mover".into() };
        server.wait_for_workers(1);
        Moves { cluster, server, dir, _worker: worker }
    }

    /// One volume of `collection`, grown and filled with `VOLUME_MIB` files
    /// of 1 MiB: its id, its server, and its `.dat` file's size.
    fn filled_volume(&self, collection: &str) -> (u32, String, u64) {
        let master = self.cluster.master_address();
        let grow = format!("/vol/grow?count=1&collection={collection}&replication=000");
        let grown = seaweedfs::http("GET", &master, &grow, None).expect("vol/grow");
        assert!(grown.is_success(), "{}", grown.text());
        let files = self.cluster.write_files_to_one_volume(VOLUME_MIB, 1024, collection);
        let (id, server) = (files[0].volume_id, files[0].url.clone());
        let size = std::fs::metadata(self.dir_of(&server).join(format!("{collection}_{id}.dat"))).unwrap().len();
        assert!(size >= VOLUME_MIB as u64 * MIB, "volume {id} holds {size} bytes");
        (id, server, size)
    }

    fn dir_of(&self, server: &str) -> PathBuf {
        self.cluster.volume_server(server).dir.clone()
    }

    /// Moves each volume to another server, as one job of two tasks: the
    /// first as a balance detection proposes it (`task_params_pb`), the
    /// second with loose parameters. Answers the job and where each copy lands.
    fn submit(&self, name: &str, volumes: &[(u32, String, String)]) -> (String, Vec<PathBuf>) {
        let servers = self.cluster.volume_server_addresses();
        let mut tasks = Vec::new();
        let mut copies = Vec::new();
        for (i, (id, source, collection)) in volumes.iter().enumerate() {
            let others: Vec<&String> = servers.iter().filter(|s| *s != source).collect();
            let target = others[i % others.len()].clone();
            let labels = json!({"volume_id": id.to_string(), "source_node": source, "target_node": target});
            let parameters = match i {
                0 => {
                    json!({"task_params_pb": {"$bytes": task_params::hex(&task_params::balance(*id, collection, source, &target))}})
                }
                _ => {
                    json!({"volume_id": id, "collection": collection, "source_server": source, "target_server": target})
                }
            };
            tasks.push(json!({"id": format!("move{id}"), "job_type": "volume_balance", "parameters": parameters, "labels": labels}));
            copies.push(self.dir_of(&target).join(format!("{collection}_{id}.dat")));
        }
        let job = json!({"name": name, "tasks": tasks}).to_string();
        (self.server.submit_file(self.dir.path(), name, &job), copies)
    }
}

/// What a copy holds on its target's disk: `.dat.copying` while it is
/// copied, then the `.dat`; `None` before it starts.
fn copied(dat: &Path) -> Option<u64> {
    let copying = dat.with_extension("dat.copying");
    std::fs::metadata(&copying).or_else(|_| std::fs::metadata(dat)).ok().map(|m| m.len())
}

/// Samples every copy's bytes on disk every 10 ms until each is whole:
/// (seconds since the first copy began, bytes per copy).
fn watch(copies: &[PathBuf], sizes: &[u64]) -> Vec<(f64, Vec<Option<u64>>)> {
    let patience = Instant::now();
    let mut samples = Vec::new();
    let mut started: Option<Instant> = None;
    loop {
        let now: Vec<Option<u64>> = copies.iter().map(|c| copied(c)).collect();
        if started.is_none() && now.iter().any(Option::is_some) {
            started = Some(Instant::now());
        }
        if let Some(at) = started {
            samples.push((at.elapsed().as_secs_f64(), now.clone()));
        }
        if now.iter().zip(sizes).all(|(n, size)| n.is_some_and(|n| n >= *size)) {
            return samples;
        }
        assert!(patience.elapsed() < WAIT, "the copies did not end: {:?}", samples.last());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One copy as its samples show it: when it began, when it was whole, and
/// the pauses of the volume server's throttle. SeaweedFS's throttle lets
/// each window of about 100 ms copy at full speed, then pauses until the
/// bytes so far fit the rate: at the end of each pause, bytes = rate x time
/// since the copy began. The last window is never paid back: a copy of few
/// windows ends faster than its rate, which is why the volumes are large.
struct Copy {
    began: f64,
    whole: f64,
    /// (end of a pause, bytes then), for pauses of at least 300 ms.
    pauses: Vec<(f64, u64)>,
    /// The most one window copied.
    window: u64,
}

fn copies_of(samples: &[(f64, Vec<Option<u64>>)], sizes: &[u64]) -> Vec<Copy> {
    (0..sizes.len())
        .map(|i| {
            let seen: Vec<(f64, u64)> = samples.iter().filter_map(|(t, bytes)| Some((*t, bytes[i]?))).collect();
            let began = seen.first().map_or(0.0, |s| s.0);
            let whole = seen.iter().find(|s| s.1 >= sizes[i]).map_or(f64::MAX, |s| s.0);
            let (mut pauses, mut window, mut burst_from) = (Vec::new(), 0, 0u64);
            let mut run_start = 0;
            for j in 1..=seen.len() {
                if j < seen.len() && seen[j].1 == seen[run_start].1 {
                    continue;
                }
                let (from, to) = (seen[run_start], seen[j - 1]);
                if to.0 - from.0 >= 0.3 && to.1 < sizes[i] {
                    pauses.push((to.0, to.1));
                    window = window.max(to.1 - burst_from);
                    burst_from = to.1;
                }
                run_start = j;
            }
            window = window.max(sizes[i] - burst_from);
            Copy { began, whole, pauses, window }
        })
        .collect()
}

#[test]
fn two_balance_moves_under_a_20_mb_s_budget_copy_no_faster_than_it_allows_and_run_faster_without_it() {
    let moves = Moves::start();
    let volumes: Vec<(u32, String, u64, String)> = ["held1", "held2", "free1", "free2"]
        .iter()
        .map(|collection| {
            let (id, server, size) = moves.filled_volume(collection);
            (id, server, size, collection.to_string())
        })
        .collect();
    let pick = |range: std::ops::Range<usize>| -> (Vec<(u32, String, String)>, Vec<u64>) {
        let chosen = &volumes[range];
        (chosen.iter().map(|(id, s, _, c)| (*id, s.clone(), c.clone())).collect(), chosen.iter().map(|v| v.2).collect())
    };

    // Under the budget: the two share it, 10 MB/s each.
    let output = moves.server.cli(&["budget", "set", "--cluster", "20MB/s", "--minimum", "1MB/s"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let (held, sizes) = pick(0..2);
    let (job, copies) = moves.submit("held", &held);
    let samples = watch(&copies, &sizes);
    let budget = moves.server.cli_json(&["budget", "--json"]);
    let shares: Vec<u64> =
        budget["shares"].as_array().unwrap().iter().map(|s| s["bytes_per_second"].as_u64().unwrap()).collect();
    assert_eq!(
        (shares, &budget["used_bytes_per_second"]),
        (vec![10_000_000, 10_000_000], &json!(20_000_000)),
        "{budget}"
    );
    let held_copies = copies_of(&samples, &sizes);
    assert!(moves.server.cli(&["cancel", &job]).status.success(), "the moves' long tails are not waited for");

    // Without it: the same moves of volumes as large.
    assert!(moves.server.cli(&["budget", "clear"]).status.success());
    let (free, free_sizes) = pick(2..4);
    let (free_job, free_copies) = moves.submit("free", &free);
    let free_samples = watch(&free_copies, &free_sizes);
    let free_copies = copies_of(&free_samples, &free_sizes);
    assert!(moves.server.cli(&["cancel", &free_job]).status.success());

    let span = |copies: &[Copy]| {
        let began = copies.iter().map(|c| c.began).fold(f64::MAX, f64::min);
        copies.iter().map(|c| c.whole).fold(0.0, f64::max) - began
    };
    let (held_span, free_span) = (span(&held_copies), span(&free_copies));
    let (held_bytes, free_bytes) = (sizes.iter().sum::<u64>() as f64, free_sizes.iter().sum::<u64>() as f64);
    // Each copy paced at its share: at the end of each pause of the
    // throttle, what it copied fits 10 MB/s over the time since it began.
    let mut paced = 0.0;
    for (i, copy) in held_copies.iter().enumerate() {
        let (end, bytes) = *copy.pauses.last().unwrap_or_else(|| {
            panic!("copy {i} never paused: it fit in one throttle window ({} bytes): {samples:?}", copy.window)
        });
        let rate = bytes as f64 / (end - copy.began);
        eprintln!(
            "held copy {i}: {} pauses, paced at {:.2} MB/s, window {:.1} MB",
            copy.pauses.len(),
            rate / 1e6,
            copy.window as f64 / 1e6
        );
        paced += rate;
    }
    let windows: f64 = held_copies.iter().map(|c| c.window as f64).sum();
    eprintln!(
        "budget 20 MB/s: {:.1} MB in {held_span:.2} s ({:.2} MB/s end to end, paced {:.2} MB/s); without: {:.1} MB in {free_span:.2} s ({:.1} MB/s)",
        held_bytes / 1e6,
        held_bytes / held_span / 1e6,
        paced / 1e6,
        free_bytes / 1e6,
        free_bytes / free_span / 1e6
    );
    assert!(paced <= BUDGET * 1.1, "the two copies together were paced at {:.2} MB/s", paced / 1e6);
    assert!(
        held_bytes <= BUDGET * 1.1 * held_span + windows,
        "together they copied {held_bytes} bytes in {held_span:.2} s: more than 20 MB/s allows, and one throttle window each ({windows})"
    );
    assert!(
        free_span * 3.0 < held_span,
        "without the budget the same moves copy far faster: {free_span:.2} s against {held_span:.2} s"
    );
    assert!(free_bytes / free_span > 3.0 * BUDGET, "{:.1} MB/s without a budget", free_bytes / free_span / 1e6);
}

/// An admin of a cluster on `url`: beats every second, dead after 4 s of silence.
fn cluster_instance(dir: &Path, name: &str, url: &str) -> Server {
    let free = crate::support::free_port;
    let (http, grpc) = (format!("127.0.0.1:{}", free()), free().to_string());
    let args = ["--database-url", url, "--grpc", &grpc, "--cluster-heartbeat", "1s", "--lag-threshold", "4s"];
    Server::start_on(&dir.join(name), &http, &args)
}

#[test]
fn a_budget_set_through_one_instance_holds_across_the_instances_of_one_database() {
    let dir = tempfile::tempdir().unwrap();
    let database = crate::support::postgres::shared().new_database();
    let url = crate::support::postgres::shared().url(&database);
    let servers: Vec<Server> = ["a", "b"].iter().map(|n| cluster_instance(dir.path(), n, &url)).collect();
    let log = dir.path().join("exec.log");
    let _workers: Vec<Process> = servers
        .iter()
        .enumerate()
        .map(|(n, s)| start_worker(s, &format!("w{n}"), &["--max-execute", "4"], Some(&log)))
        .collect();
    for server in &servers {
        server.wait_for_workers(1);
    }

    // Set through a; b reads it from the database at its next heartbeat.
    assert!(servers[0].cli(&["policy", "set", "shell", "uses_bandwidth_budget=1"]).status.success());
    let (code, _, error) = budget_cli(&servers[0], &["set", "--cluster", "20MB/s", "--minimum", "5MB/s"]);
    assert_eq!(code, 0, "{error}");
    let seen = wait_until(Duration::from_secs(10), || {
        let there = budget(&servers[1]);
        (there["cluster_bytes_per_second"] == 20_000_000 && there["job_types"].to_string().contains("shell"))
            .then_some(there)
    });
    assert!(seen.is_some(), "b does not apply the budget: {}", budget(&servers[1]));

    // Four tasks submitted to each: 20 MB/s at 5 MB/s at least is four at
    // once over the cluster, each instance handing out the part it holds.
    let mut jobs = Vec::new();
    for (n, server) in servers.iter().enumerate() {
        jobs.push(server.submit_file(dir.path(), &format!("moves-{n}"), &printing_their_share(&[3, 3, 3, 3])));
    }
    let mut most_used = 0;
    let mut shares_seen = 0;
    let ended = wait_until(Duration::from_secs(90), || {
        // Every instance shows every share: each reads them from the database.
        for server in &servers {
            let now = budget(server);
            most_used = most_used.max(now["used_bytes_per_second"].as_u64().unwrap());
            shares_seen = shares_seen.max(now["shares"].as_array().unwrap().len());
        }
        let state = |(id, server): (&String, &Server)| server.cli_json(&["job", id, "--json"])["state"].clone();
        let states: Vec<Value> = jobs.iter().zip(&servers).map(state).collect();
        states.iter().all(|s| ["succeeded", "failed", "canceled"].iter().any(|end| s == end)).then_some(states)
    })
    .expect("the jobs end");
    assert_eq!(ended, [json!("succeeded"), json!("succeeded")]);
    let (most, starts) = support::most_at_once(&log, |_| true);
    eprintln!("most used {most_used} B/s, {shares_seen} shares seen at once, {most} tasks at once of {starts}");
    assert_eq!(starts, 8, "each task ran once");
    assert!(most_used <= 20_000_000, "the shares of both instances' tasks came to {most_used} B/s, past the budget");
    assert!(most <= 4, "{most} budgeted tasks ran at once, more than 20 MB/s holds at 5 MB/s each");
    assert!(shares_seen >= 2, "the shares were shown while the tasks ran");
    for (id, server) in jobs.iter().zip(&servers) {
        let job = server.cli_json(&["job", id, "--json"]);
        for task in job["tasks"].as_array().unwrap() {
            let rate: u64 = task["output"]
                .as_array()
                .unwrap()
                .iter()
                .find_map(|l| l.as_str()?.strip_prefix("rate=")?.parse().ok())
                .unwrap();
            assert!((5_000_000..=20_000_000).contains(&rate), "a share of {rate}: {task}");
        }
    }
}

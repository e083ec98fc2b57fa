//! `jobcenter import-weed-admin` reads what a real `weed admin` (4.48,
//! installed by `.ci/setup`) keeps in its `-dataDir`: job types configured
//! through weed admin's own HTTP API become the policies of a running
//! jobcenter server, value by value; `--dry-run` prints the same plan and
//! changes nothing; a directory that is not weed admin's, or a malformed
//! file in it, is one error line naming the file and changes nothing.

use std::path::Path;

use prost::Message;
use serde_json::{json, Value};

use crate::support::seaweedfs::{get_json, http, Cluster, ClusterOptions, WeedAdmin, WAIT};
use crate::support::{wait_until, Server};
use jobcenter::proto::plugin::{AdminRuntimeConfig, PersistedJobTypeConfig};

/// The job types the test configures in weed admin.
const JOB_TYPES: [&str; 3] = ["vacuum", "erasure_coding", "admin_script"];

/// Runtime settings whose value weed admin stores is the policy's (seconds, counts).
const SAME_VALUE: [&str; 7] = [
    "detection_timeout_seconds",
    "max_jobs_per_detection",
    "per_worker_execution_concurrency",
    "retry_limit",
    "retry_backoff_seconds",
    "job_type_max_runtime_seconds",
    "execution_timeout_seconds",
];

fn config_path(job_type: &str) -> String {
    format!("/api/plugin/job-types/{job_type}/config")
}

/// Changes a job type's configuration through weed admin's API (read it,
/// edit it, write it back, as its UI does); returns what weed admin stored.
fn configure(admin: &WeedAdmin, job_type: &str, edit: impl FnOnce(&mut Value)) -> Value {
    let mut config = get_json(&admin.address(), &config_path(job_type));
    edit(&mut config);
    let body = serde_json::to_vec(&config).unwrap();
    let response = http("PUT", &admin.address(), &config_path(job_type), Some(("application/json", &body)))
        .unwrap_or_else(|e| panic!("PUT {job_type} config: {e}"));
    assert!(response.is_success(), "PUT {job_type} config: {} {}", response.status, response.text());
    response.json()
}

/// Starts weed admin with a worker for [`JOB_TYPES`], waits for their
/// descriptors, configures them with distinctive values, stops both, and
/// returns weed admin's data directory with what it stored per job type.
fn configured_weed_admin(cluster: &Cluster, dir: &Path) -> (std::path::PathBuf, Vec<Value>) {
    let admin = WeedAdmin::start(&cluster.master_address(), dir);
    let _worker = admin.start_worker(&JOB_TYPES.join(","));
    let described = wait_until(WAIT, || {
        JOB_TYPES
            .iter()
            .all(|t| {
                let path = format!("/api/plugin/job-types/{t}/descriptor");
                http("GET", &admin.address(), &path, None).is_ok_and(|r| r.is_success())
            })
            .then_some(())
    });
    assert!(described.is_some(), "weed admin never had the descriptors: {}", admin.logs());

    let vacuum = configure(&admin, "vacuum", |c| {
        c["admin_runtime"]["detection_interval_minutes"] = json!(23);
        c["admin_runtime"]["global_execution_concurrency"] = json!(3);
        c["admin_runtime"]["job_type_max_runtime_seconds"] = json!(1234);
        c["admin_runtime"]["retry_limit"] = json!(2);
        c["worker_config_values"]["garbage_threshold"] = json!({"double_value": 0.42});
    });
    let erasure_coding = configure(&admin, "erasure_coding", |c| {
        c["admin_runtime"]["enabled"] = json!(false);
        c["admin_runtime"]["per_worker_execution_concurrency"] = json!(2);
        c["admin_runtime"]["execution_timeout_seconds"] = json!(45);
        c["worker_config_values"]["fullness_ratio"] = json!({"double_value": 0.77});
        c["worker_config_values"]["min_size_mb"] = json!({"int64_value": "31"});
        c["admin_config_values"]["collection_filter"] = json!({"string_value": "ec_only"});
    });
    let admin_script = configure(&admin, "admin_script", |c| {
        c["admin_runtime"]["detection_interval_minutes"] = json!(29);
        c["admin_runtime"]["max_jobs_per_detection"] = json!(7);
        c["admin_runtime"]["global_execution_concurrency"] = json!(200);
        c["admin_config_values"]["script"] = json!({"string_value": "volume.list\ncluster.check"});
    });
    for job_type in JOB_TYPES {
        let file = admin.data_dir.join(format!("plugin/job_types/{job_type}/config.pb"));
        assert!(file.is_file(), "weed admin wrote no {}", file.display());
    }
    (admin.data_dir.clone(), vec![vacuum, erasure_coding, admin_script])
}

fn policy(server: &Server, job_type: &str) -> Value {
    server.cli_json(&["policy", "get", job_type, "--json"])
}

fn policies(server: &Server) -> Vec<Value> {
    JOB_TYPES.iter().map(|t| policy(server, t)).collect()
}

/// Runs the import against `server`; returns its exit code, stdout and stderr.
fn import(server: &Server, dir: &Path, extra: &[&str]) -> (Option<i32>, String, String) {
    let mut args = vec!["import-weed-admin", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    let output = server.cli(&args);
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code(), text(&output.stdout), text(&output.stderr))
}

/// Every runtime value weed admin stored above 0 is the policy's, set by the import.
fn assert_runtime_imported(policy: &Value, stored: &Value) {
    let job_type = policy["job_type"].as_str().unwrap();
    let runtime = &stored["admin_runtime"];
    let minutes = runtime["detection_interval_minutes"].as_i64().unwrap();
    assert_eq!(policy["detection_interval_seconds"], json!(minutes * 60), "{job_type}");
    assert_eq!(policy["detection_enabled"], runtime["enabled"], "{job_type}");
    for name in SAME_VALUE {
        let weed = runtime[name].as_i64().unwrap();
        let raised = name == "execution_timeout_seconds" && weed < 90;
        if weed > 0 && !raised {
            assert_eq!(policy[name], json!(weed), "{job_type} {name}");
            assert_eq!(policy["sources"][name], "set", "{job_type} {name}");
        }
    }
}

#[test]
fn what_weed_admin_stored_becomes_jobcenter_policies_and_a_dry_run_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(ClusterOptions { volume_servers: 0, ..ClusterOptions::default() });
    let (weed_data, stored) = configured_weed_admin(&cluster, &dir.path().join("weed-admin"));
    let server = Server::start(&dir.path().join("jobcenter"), &[]);
    let before = policies(&server);

    let (code, plan, stderr) = import(&server, &weed_data, &["--dry-run"]);
    assert_eq!(code, Some(0), "{stderr}");
    for expected in [
        "vacuum: admin_runtime.detection_interval_minutes = 23 -> detection_interval_seconds = 1380",
        "vacuum: worker_config_values.garbage_threshold = 0.42 -> worker.garbage_threshold = 0.42",
        "erasure_coding: admin_runtime.enabled = false -> detection_enabled = 0",
        "erasure_coding: admin_runtime.execution_timeout_seconds = 45 -> execution_timeout_seconds = 90 (weed admin gives an execution at least 90 s)",
        "erasure_coding: admin_config_values.collection_filter = \"ec_only\" -> admin.collection_filter = \"ec_only\"",
        "admin_script: admin_runtime.global_execution_concurrency = 200 -> global_execution_concurrency = 128 (weed admin runs at most 128 at once)",
        "(--dry-run: nothing changed)",
    ] {
        assert!(plan.lines().any(|l| l.ends_with(expected)), "no line {expected:?} in:\n{plan}");
    }
    assert_eq!(policies(&server), before, "a dry run changed a policy");

    let (code, applied, stderr) = import(&server, &weed_data, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    let plan_lines: Vec<&str> = plan.lines().collect();
    let applied_lines: Vec<&str> = applied.lines().collect();
    assert_eq!(plan_lines[..plan_lines.len() - 1], applied_lines[..applied_lines.len() - 1], "the same plan");

    let [vacuum, erasure_coding, admin_script] = [0, 1, 2].map(|i| policy(&server, JOB_TYPES[i]));
    for (policy, stored) in [(&vacuum, &stored[0]), (&erasure_coding, &stored[1]), (&admin_script, &stored[2])] {
        assert_runtime_imported(policy, stored);
    }
    assert_eq!(vacuum["detection_interval_seconds"], 1380);
    assert_eq!(vacuum["global_execution_concurrency"], 3);
    assert_eq!(vacuum["job_type_max_runtime_seconds"], 1234);
    assert_eq!(vacuum["retry_limit"], 2);
    assert_eq!(vacuum["worker_config"]["garbage_threshold"], "0.42");
    assert_eq!(erasure_coding["detection_enabled"], false);
    assert_eq!(erasure_coding["per_worker_execution_concurrency"], 2);
    assert_eq!(erasure_coding["execution_timeout_seconds"], 90);
    assert_eq!(erasure_coding["worker_config"]["fullness_ratio"], "0.77");
    assert_eq!(erasure_coding["worker_config"]["min_size_mb"], "31");
    assert_eq!(erasure_coding["admin_config"]["collection_filter"], "\"ec_only\"");
    assert_eq!(admin_script["detection_interval_seconds"], 29 * 60);
    assert_eq!(admin_script["max_jobs_per_detection"], 7);
    assert_eq!(admin_script["global_execution_concurrency"], 128);
    assert_eq!(admin_script["admin_config"]["script"], json!("volume.list\ncluster.check").to_string());
}

/// A weed admin job type configuration, as weed admin writes `config.pb`.
fn config_pb(job_type: &str, detection_interval_minutes: i32) -> Vec<u8> {
    let runtime = AdminRuntimeConfig { enabled: true, detection_interval_minutes, ..AdminRuntimeConfig::default() };
    PersistedJobTypeConfig { job_type: job_type.into(), admin_runtime: Some(runtime), ..Default::default() }
        .encode_to_vec()
}

/// The import is refused with one error line starting `expected`, and no policy changed.
fn assert_refused(server: &Server, dir: &Path, before: &[Value], expected: &str) {
    let (code, stdout, stderr) = import(server, dir, &[]);
    assert_eq!(code, Some(2), "{expected}: {stdout}{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one error line: {stderr}");
    assert!(stderr.starts_with(&format!("jobcenter: {expected}")), "expected {expected:?}, got {stderr}");
    assert_eq!(stdout, "", "nothing planned: {stdout}");
    assert_eq!(policies(server), before, "a policy changed: {expected}");
}

#[test]
fn a_directory_that_is_not_weed_admin_s_or_a_malformed_file_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("jobcenter"), &[]);
    let before = policies(&server);
    let weed_data = dir.path().join("weed-data");
    let job_types = weed_data.join("plugin/job_types");
    let write = |job_type: &str, bytes: &[u8]| {
        std::fs::create_dir_all(job_types.join(job_type)).unwrap();
        std::fs::write(job_types.join(job_type).join("config.pb"), bytes).unwrap();
    };
    let erasure_coding = job_types.join("erasure_coding/config.pb");

    // No plugin/job_types: not weed admin's.
    std::fs::create_dir_all(&weed_data).unwrap();
    assert_refused(&server, &weed_data, &before, &format!("{}: not a weed admin data directory", weed_data.display()));

    // A config.pb that is no protobuf, beside a good one that is not set either.
    write("vacuum", &config_pb("vacuum", 23));
    write("erasure_coding", b"this is not protobuf");
    let garbled = "not a weed admin job type configuration (PersistedJobTypeConfig)";
    assert_refused(&server, &weed_data, &before, &format!("{}: {garbled}", erasure_coding.display()));

    // A config.pb of another job type than its directory's.
    write("erasure_coding", &config_pb("volume_balance", 29));
    let misplaced = "holds the configuration of job type \"volume_balance\"";
    assert_refused(&server, &weed_data, &before, &format!("{}: {misplaced}", erasure_coding.display()));

    // Fixed, it imports.
    write("erasure_coding", &config_pb("erasure_coding", 29));
    let (code, _, stderr) = import(&server, &weed_data, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(policy(&server, "vacuum")["detection_interval_seconds"], 23 * 60);
    assert_eq!(policy(&server, "erasure_coding")["detection_interval_seconds"], 29 * 60);
}

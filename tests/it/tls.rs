//! TLS and mutual TLS on the gRPC port, with certificates made for the test:
//! a worker and the CLI with a certificate from the trusted CA get in; a
//! client without one, or without TLS, does not. The same with SeaweedFS:
//! a `weed worker` configured by `security.toml` vacuums a cluster whose
//! gRPC is all TLS, its certificate given the role `worker` by the
//! server's credentials file.

use crate::support;
use crate::support::seaweedfs;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use support::{run_with_timeout, wait_until, Process, Server};

/// Where `make_certificates` wrote each file.
struct Certificates {
    ca: String,
    server_cert: String,
    server_key: String,
    client_cert: String,
    client_key: String,
}

/// Writes `ca.pem`, `server.pem`/`server.key` (for 127.0.0.1) and `client.pem`/`client.key`.
fn make_certificates(dir: &Path) -> Certificates {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "jobcenter test CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    for (name, sans) in
        [("server", vec!["127.0.0.1".to_string(), "localhost".to_string()]), ("client", vec!["worker".to_string()])]
    {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.signed_by(&key, &issuer).unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
    Certificates {
        ca: path(dir, "ca.pem"),
        server_cert: path(dir, "server.pem"),
        server_key: path(dir, "server.key"),
        client_cert: path(dir, "client.pem"),
        client_key: path(dir, "client.key"),
    }
}

fn path(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

#[test]
fn mutual_tls_lets_in_only_clients_with_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path();
    make_certificates(certs);
    let server = Server::start(
        &certs.join("data"),
        &[
            "--tls-cert",
            &path(certs, "server.pem"),
            "--tls-key",
            &path(certs, "server.key"),
            "--tls-client-ca",
            &path(certs, "ca.pem"),
        ],
    );
    let client_tls = [
        "--tls-ca".to_string(),
        path(certs, "ca.pem"),
        "--tls-cert".to_string(),
        path(certs, "client.pem"),
        "--tls-key".to_string(),
        path(certs, "client.key"),
    ];
    let cli = |extra: &[String], args: &[&str]| {
        let mut command = Command::new(support::binary());
        command.args(args).args(["--admin", &server.http]).args(extra);
        run_with_timeout(command, Duration::from_secs(60))
    };

    // A worker with a client certificate connects and runs a job.
    let child = Command::new(support::binary())
        .args(["worker", "--admin", &server.http, "--id", "tls-worker", "--heartbeat", "1s"])
        .args(&client_tls)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _worker = Process { child, name: "tls-worker".into() };
    let connected = wait_until(Duration::from_secs(30), || {
        let output = cli(&client_tls, &["workers", "--json"]);
        let workers: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
        (workers.as_array()?.len() == 1).then_some(())
    });
    assert!(connected.is_some(), "the worker with a certificate connected");
    let file = certs.join("nine.json");
    std::fs::write(&file, support::nine_tasks(None, 0)).unwrap();
    let output = cli(&client_tls, &["submit", file.to_str().unwrap(), "--wait", "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let job: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(job["state"], "succeeded");

    // Trusting the CA is not enough: the server wants a client certificate.
    let ca_only = [client_tls[0].clone(), client_tls[1].clone()];
    let refused = cli(&ca_only, &["jobs"]);
    assert!(!refused.status.success(), "a client without a certificate got in");
    // Nor does plain text get in.
    let plain = cli(&[], &["jobs"]);
    assert!(!plain.status.success(), "a plain-text client got in");
}

/// A SeaweedFS cluster whose gRPC is all TLS (one `security.toml`), a
/// jobcenter server serving mutual TLS and reaching the master with TLS,
/// and two `weed worker`s: the one with a certificate in its
/// `security.toml` registers and runs a real vacuum; the one without is
/// refused.
#[test]
fn a_weed_worker_with_a_certificate_vacuums_over_mutual_tls_and_one_without_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path();
    let Certificates { ca, server_cert, server_key, client_cert, client_key } = make_certificates(certs);
    // Every SeaweedFS component presents the 127.0.0.1 certificate; the
    // worker presents its own, which jobcenter's client CA also signed.
    let security = certs.join("security.toml");
    let mut toml = format!("[grpc]\nca = \"{ca}\"\n");
    for component in ["master", "volume", "client", "filer", "admin"] {
        toml.push_str(&format!("\n[grpc.{component}]\ncert = \"{server_cert}\"\nkey = \"{server_key}\"\n"));
    }
    toml.push_str(&format!("\n[grpc.worker]\ncert = \"{client_cert}\"\nkey = \"{client_key}\"\n"));
    std::fs::write(&security, toml).unwrap();
    let cluster = seaweedfs::Cluster::start(seaweedfs::ClusterOptions {
        volume_servers: 1,
        security: Some(security.clone()),
        ..seaweedfs::ClusterOptions::default()
    });
    let master = cluster.master_address();
    // The worker's certificate (its alternative name `worker`) is a worker's;
    // the CLI presents an admin's token besides.
    let credentials = certs.join("credentials.toml");
    std::fs::write(&credentials, "[[certificate]]\nsan = \"worker\"\nrole = \"worker\"\n").unwrap();
    let token = certs.join("admin.token");
    std::fs::write(&token, "tls-test-admin-token\n").unwrap();
    let server = Server::start(
        &certs.join("data"),
        &[
            "--credentials",
            credentials.to_str().unwrap(),
            "--token-file",
            token.to_str().unwrap(),
            "--tls-cert",
            &server_cert,
            "--tls-key",
            &server_key,
            "--tls-client-ca",
            &ca,
            "--master",
            &master,
            "--master-tls-ca",
            &ca,
            "--master-tls-cert",
            &server_cert,
            "--master-tls-key",
            &server_key,
        ],
    );
    let client_tls = ["--tls-ca", ca.as_str(), "--tls-cert", client_cert.as_str(), "--tls-key", client_key.as_str()];
    let cli_as = |args: &[&str], token: Option<&Path>| {
        let mut command = Command::new(support::binary());
        command.args(args).args(["--admin", &server.http]).args(client_tls);
        if let Some(token) = token {
            command.arg("--token-file").arg(token);
        }
        run_with_timeout(command, Duration::from_secs(120))
    };
    let cli = |args: &[&str]| cli_as(args, Some(&token));
    // The certificate alone is a worker's: it reads no job.
    let as_worker = cli_as(&["jobs"], None);
    assert!(!as_worker.status.success());
    assert!(String::from_utf8_lossy(&as_worker.stderr).contains("the role worker may not do this"));
    let detection_off = cli(&["policy", "set", "vacuum", "detection_enabled=0"]);
    assert!(detection_off.status.success(), "{}", String::from_utf8_lossy(&detection_off.stderr));

    let weed_worker = |id: &str, with_certificate: bool| {
        let working = certs.join(id);
        std::fs::create_dir_all(&working).unwrap();
        if with_certificate {
            std::fs::copy(&security, working.join("security.toml")).unwrap();
        }
        let log = std::fs::File::create(certs.join(format!("{id}.log"))).unwrap();
        let child = Command::new(seaweedfs::weed())
            .args(["worker", &format!("-admin={}", server.http), &format!("-id={id}"), "-jobType=vacuum"])
            .args(["-heartbeat=1s", &format!("-workingDir={}", working.display())])
            .current_dir(&working)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start weed worker");
        Process { child, name: id.to_string() }
    };
    let worker_ids = || -> Vec<String> {
        let output = cli(&["workers", "--json"]);
        let workers: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
        workers.as_array().into_iter().flatten().filter_map(|w| w["worker_id"].as_str().map(String::from)).collect()
    };
    let _with = weed_worker("with-certificate", true);
    let _without = weed_worker("without-certificate", false);
    let registered =
        wait_until(Duration::from_secs(60), || worker_ids().contains(&"with-certificate".into()).then_some(()));
    let log = |id: &str| seaweedfs::log_tail(&certs.join(format!("{id}.log")));
    assert!(registered.is_some(), "{:?}\n{}", worker_ids(), log("with-certificate"));

    // Garbage on the volume, then a vacuum through the worker with the certificate.
    let files = cluster.write_files_to_one_volume(40, 16, "");
    let (_, kept) = cluster.delete_percent(&files, 60);
    let volume_id = kept[0].volume_id;
    let volume_server = &cluster.volume_servers[0];
    let dirty = wait_until(Duration::from_secs(30), || {
        volume_server.volumes().into_iter().find(|v| v.id == volume_id && v.deleted_bytes > 0)
    });
    assert!(dirty.is_some(), "no garbage on volume {volume_id}");
    let job = certs.join("vacuum.json");
    let task = serde_json::json!({"name": "vacuum-over-tls", "tasks": [{"id": "vacuum", "job_type": "vacuum",
        "parameters": {"volume_id": volume_id, "server": volume_server.address(), "collection": ""}}]});
    std::fs::write(&job, task.to_string()).unwrap();
    let output = cli(&["submit", job.to_str().unwrap(), "--wait", "--json"]);
    let finished: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
    assert_eq!(finished["state"], "succeeded", "{finished}\n{}", log("with-certificate"));
    let clean = wait_until(Duration::from_secs(30), || {
        volume_server.volumes().into_iter().find(|v| v.id == volume_id && v.deleted_bytes == 0)
    });
    assert!(clean.is_some(), "volume {volume_id} kept its garbage: {finished}");
    for file in kept.iter().filter(|f| f.volume_id == volume_id) {
        assert_eq!(cluster.read(file).unwrap(), file.content(), "{}", file.fid);
    }

    // The worker without a certificate tried and was turned away, and is not listed.
    let turned_away =
        wait_until(Duration::from_secs(30), || log("without-certificate").contains("stream ended").then_some(()));
    assert!(turned_away.is_some(), "{}", log("without-certificate"));
    assert_eq!(worker_ids(), vec!["with-certificate".to_string()], "{}", log("without-certificate"));
}

/// Three instances with TLS on every link: workers and clients reach them
/// over mutual TLS, each reaches the others so (its certificate given the
/// role `instance` by the credentials file), and all reach PostgreSQL with
/// `sslmode=verify-full`. A job led by an instance with no worker runs on
/// the worker of another, and is canceled through the third.
#[test]
fn three_instances_with_tls_everywhere_lend_tasks_to_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path();
    let Certificates { ca, server_cert, server_key, client_cert, client_key } = make_certificates(certs);
    let postgres = support::postgres::PgCluster::start();
    let database_ca = postgres.enable_tls();
    postgres.require_tls();
    let database = postgres.new_database();
    let url = format!("{}?sslmode=verify-full&sslrootcert={}", postgres.url(&database), database_ca.display());
    // The instances present the server certificate (its alternative name
    // `localhost`) to each other, with no token; the worker presents
    // `worker`'s; the CLI an admin's token besides its certificate.
    let credentials = certs.join("credentials.toml");
    let token = certs.join("admin.token");
    std::fs::write(&token, crate::access::add(&credentials, "ops", "admin")).unwrap();
    let rules = "\n[[certificate]]\nsan = \"localhost\"\nrole = \"instance\"\n\n[[certificate]]\nsan = \"worker\"\nrole = \"worker\"\n";
    let file = std::fs::read_to_string(&credentials).unwrap();
    std::fs::write(&credentials, format!("{file}{rules}")).unwrap();
    let free = crate::support::free_port;
    let start = |name: &str| {
        let (http, grpc) = (format!("127.0.0.1:{}", free()), free().to_string());
        let args = [
            "--database-url",
            &url,
            "--grpc",
            &grpc,
            "--cluster-heartbeat",
            "1s",
            "--lag-threshold",
            "4s",
            "--tls-cert",
            &server_cert,
            "--tls-key",
            &server_key,
            "--tls-client-ca",
            &ca,
            "--credentials",
            credentials.to_str().unwrap(),
        ];
        Server::start_on(&certs.join(name), &http, &args)
    };
    let instances: Vec<Server> = ["a", "b", "c"].iter().map(|name| start(name)).collect();
    let client_tls = ["--tls-ca", ca.as_str(), "--tls-cert", client_cert.as_str(), "--tls-key", client_key.as_str()];
    let cli = |server: &Server, args: &[&str]| {
        let mut command = Command::new(support::binary());
        command.args(args).args(["--admin", &server.http]).args(client_tls).arg("--token-file").arg(&token);
        run_with_timeout(command, Duration::from_secs(120))
    };
    let json = |server: &Server, args: &[&str]| -> serde_json::Value {
        let output = cli(server, args);
        serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|e| panic!("{args:?} ({e}): {}", String::from_utf8_lossy(&output.stderr)))
    };
    let active = wait_until(Duration::from_secs(30), || {
        let listed = json(&instances[0], &["instances", "--json"]);
        (listed.as_array()?.iter().filter(|i| i["status"] == "active").count() == 3).then_some(())
    });
    assert!(active.is_some(), "three instances: {}", json(&instances[0], &["instances", "--json"]));

    // The one worker, connected to c over mutual TLS with its certificate alone.
    let exec_log = certs.join("exec.log");
    let mut worker = Command::new(support::binary());
    worker.args(["worker", "--id", "w-c", "--heartbeat", "1s", "--admin", &instances[2].http]).args(client_tls);
    worker.env("JOBCENTER_EXEC_LOG", &exec_log).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    let _worker = Process { child: worker.spawn().unwrap(), name: "w-c".into() };
    let connected = wait_until(Duration::from_secs(30), || {
        (json(&instances[2], &["workers", "--json"]).as_array()?.len() == 1).then_some(())
    });
    assert!(connected.is_some(), "the worker connects to c over mutual TLS");

    // a leads the job (it has no worker): c's worker runs every task.
    let job = certs.join("nine.json");
    std::fs::write(&job, support::nine_tasks(None, 20)).unwrap();
    let finished = json(&instances[0], &["submit", job.to_str().unwrap(), "--wait", "--json"]);
    assert_eq!(finished["state"], "succeeded", "{finished}");
    let id = finished["id"].as_str().unwrap().to_string();
    let owner = postgres.psql(&database, &format!("SELECT owner FROM jobcenter.jobs WHERE id = '{id}'"));
    let ids: Vec<String> = instances
        .iter()
        .map(|s| {
            let listed = json(s, &["instances", "--json"]);
            let me = listed.as_array().unwrap().iter().find(|i| i["answering"] == true).unwrap().clone();
            me["id"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(owner.trim(), ids[0], "a leads the job it was given");
    let events = support::exec_events(&exec_log, &id);
    support::each_succeeded_once(&events);
    assert_eq!(support::executions(&events).len(), 9, "every task ran on c's worker: {events:?}");

    // A job a leads is canceled through b, which asks a over TLS as an instance.
    let slow = certs.join("slow.json");
    std::fs::write(&slow, r#"{"name":"slow","tasks":[{"id":"s","job_type":"noop","parameters":{"sleep_ms":60000}}]}"#)
        .unwrap();
    let output = cli(&instances[0], &["submit", slow.to_str().unwrap()]);
    let slow_id = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let running = wait_until(Duration::from_secs(30), || {
        (json(&instances[0], &["job", &slow_id, "--json"])["tasks"][0]["state"] == "running").then_some(())
    });
    assert!(running.is_some(), "the slow task runs on c's worker");
    let cancel = cli(&instances[1], &["cancel", &slow_id]);
    assert!(cancel.status.success(), "cancel through b: {}", String::from_utf8_lossy(&cancel.stderr));
    let canceled = wait_until(Duration::from_secs(30), || {
        (json(&instances[1], &["job", &slow_id, "--json"])["state"] == "canceled").then_some(())
    });
    assert!(canceled.is_some(), "{}", json(&instances[1], &["job", &slow_id, "--json"]));
}

//! TLS and mutual TLS on the gRPC port, with certificates made for the test:
//! a worker and the CLI with a certificate from the trusted CA get in; a
//! client without one, or without TLS, does not.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{run_with_timeout, wait_until, Process, Server};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// Writes `ca.pem`, `server.pem`/`server.key` (for 127.0.0.1) and `client.pem`/`client.key`.
fn make_certificates(dir: &Path) {
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
        let mut command = Command::new(common::binary());
        command.args(args).args(["--admin", &server.http]).args(extra);
        run_with_timeout(command, Duration::from_secs(60))
    };

    // A worker with a client certificate connects and runs a job.
    let child = Command::new(common::binary())
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
    std::fs::write(&file, common::nine_tasks(None, 0)).unwrap();
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

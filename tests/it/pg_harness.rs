//! The PostgreSQL harness (`tests/it/support/postgres.rs`) against the real
//! server it starts: databases and SQL, the password over TCP, roles without
//! privileges, fast and immediate stops that keep committed data, TLS with
//! certificate verification and a TLS-only `pg_hba.conf`, and no server left
//! running once a cluster is dropped or its test process exits or is killed.
//! These tests are the proof that the harness works on a fresh machine.

use crate::support::postgres;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use postgres::{port_open, shared, try_psql, PgCluster, ProcessId, Shutdown, WAIT};

fn wait_for(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    check()
}

#[test]
fn a_fresh_database_takes_sql_with_durable_settings() {
    let cluster = shared();
    let database = cluster.new_database();
    cluster.psql(
        &database,
        "CREATE TABLE t (id int PRIMARY KEY, name text);\nINSERT INTO t VALUES (1, 'one'), (2, 'two');",
    );
    assert_eq!(cluster.psql(&database, "SELECT id, name FROM t ORDER BY id"), "1|one\n2|two");
    assert_eq!(cluster.psql(&database, "SELECT current_database()"), database);

    let settings = cluster.psql(
        &database,
        "SELECT name || '=' || setting FROM pg_settings WHERE name IN \
         ('fsync', 'synchronous_commit', 'max_connections', 'listen_addresses', 'port', 'password_encryption') \
         ORDER BY name",
    );
    let expected = format!(
        "fsync=on\nlisten_addresses=127.0.0.1\nmax_connections=200\npassword_encryption=scram-sha-256\nport={}\nsynchronous_commit=on",
        cluster.port()
    );
    assert_eq!(settings, expected);

    // Another database of the same cluster does not see the table.
    let other = cluster.new_database();
    assert_ne!(other, database);
    assert_eq!(cluster.psql(&other, "SELECT count(*) FROM pg_tables WHERE tablename = 't'"), "0");

    // A failing statement panics with the server's error.
    let failure = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cluster.psql(&database, "SELECT * FROM no_such_table")
    }));
    let message = failure.expect_err("a failing statement panics");
    let message = message.downcast_ref::<String>().expect("a formatted panic message");
    assert!(message.contains("relation \"no_such_table\" does not exist"), "{message}");
}

#[test]
fn tcp_connections_need_the_password() {
    let cluster = shared();
    let database = cluster.new_database();
    let plain = cluster.url_without_password(&database);
    assert_eq!(plain, format!("postgres://jobcenter@127.0.0.1:{}/{database}", cluster.port()));

    assert_eq!(try_psql(&plain, Some(cluster.password()), "SELECT current_user").unwrap(), "jobcenter");
    assert_eq!(try_psql(&cluster.url(&database), None, "SELECT 1").unwrap(), "1");

    let wrong = try_psql(&plain, Some("not-the-password"), "SELECT 1").unwrap_err();
    assert!(wrong.contains("password authentication failed for user \"jobcenter\""), "{wrong}");
    let missing = try_psql(&plain, None, "SELECT 1").unwrap_err();
    assert!(missing.contains("no password supplied"), "{missing}");
    assert!(cluster.log().contains("password authentication failed"), "the server logs the refusal: {}", cluster.log());
}

#[test]
fn a_role_without_privileges_is_refused_what_it_was_not_granted() {
    let cluster = shared();
    let database = cluster.new_database();
    cluster.psql(&database, "CREATE TABLE secret (x int);\nINSERT INTO secret VALUES (7);");

    // A password that needs percent-encoding in the URL.
    let reader = cluster.create_role("harness_reader", "p@ss:w/rd 'quoted'", &database, "");
    assert_eq!(try_psql(&reader, None, "SELECT current_user").unwrap(), "harness_reader");
    let create = try_psql(&reader, None, "CREATE TABLE mine (x int)").unwrap_err();
    assert!(create.contains("permission denied for schema public"), "{create}");
    let select = try_psql(&reader, None, "SELECT * FROM secret").unwrap_err();
    assert!(select.contains("permission denied for table secret"), "{select}");
    let wrong = try_psql(&reader.replace("rd%20", "rd%21"), None, "SELECT 1").unwrap_err();
    assert!(wrong.contains("password authentication failed"), "{wrong}");

    let writer = cluster.create_role(
        "harness_writer",
        "writer-password",
        &database,
        "GRANT CREATE, USAGE ON SCHEMA public TO harness_writer;\nGRANT SELECT ON secret TO harness_writer;",
    );
    assert_eq!(try_psql(&writer, None, "CREATE TABLE mine (x int);\nSELECT x FROM secret").unwrap(), "7");
}

#[test]
fn a_fast_stop_keeps_the_data_and_the_port() {
    let cluster = PgCluster::start();
    let database = cluster.new_database();
    cluster.psql(&database, "CREATE TABLE t (x int);\nINSERT INTO t SELECT generate_series(1, 1000);");
    let port = cluster.port();

    cluster.stop(Shutdown::Fast);
    assert!(!cluster.is_running());
    assert!(!port_open(port), "nothing listens on {port} once stopped");
    assert!(try_psql(&cluster.url(&database), None, "SELECT 1").is_err());

    cluster.start_again();
    assert_eq!(cluster.port(), port);
    assert!(cluster.is_running());
    assert_eq!(try_psql(&cluster.url(&database), None, "SELECT count(*), sum(x) FROM t").unwrap(), "1000|500500");
}

#[test]
fn an_immediate_stop_keeps_committed_data_and_drops_uncommitted() {
    let cluster = PgCluster::start();
    let database = cluster.new_database();
    cluster.psql(&database, "CREATE TABLE t (x int);\nINSERT INTO t SELECT generate_series(1, 100);");

    // A session that inserts a row and holds its transaction open.
    let mut open = postgres::psql_command();
    open.arg("-d").arg(cluster.url(&database)).args(["-c", "BEGIN", "-c", "INSERT INTO t VALUES (-1)"]);
    open.args(["-c", "SELECT pg_sleep(120)"]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    let mut open = open.spawn().expect("start psql");
    let sleeping = wait_for(WAIT, || {
        cluster.psql(&database, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%'") == "1"
    });
    assert!(sleeping, "the open transaction did not start");
    // Committed by a separate session just before the stop.
    cluster.psql(&database, "INSERT INTO t VALUES (101)");

    let postmaster = cluster.server_processes();
    assert!(!postmaster.is_empty());
    cluster.stop(Shutdown::Immediate);
    assert!(postmaster.iter().all(|p| !p.is_alive()), "every server process is gone after an immediate stop");
    let status = open.wait().expect("wait for psql");
    assert!(!status.success(), "the open session lost its server");

    cluster.start_again();
    assert_eq!(cluster.psql(&database, "SELECT count(*), min(x), max(x) FROM t"), "101|1|101");
}

#[test]
fn tls_verifies_the_server_and_can_be_required() {
    let cluster = PgCluster::start();
    let ca = cluster.enable_tls();
    assert!(ca.is_file());
    assert_eq!(cluster.ca_certificate(), Some(ca.clone()));
    let password = Some(cluster.password());
    let ssl_in_use = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()";

    let verified = format!("{} sslmode=verify-full sslrootcert={}", cluster.conninfo("postgres"), ca.display());
    assert_eq!(try_psql(&verified, password, ssl_in_use).unwrap(), "t");
    // The certificate names localhost too.
    let by_name = format!(
        "host=localhost hostaddr=127.0.0.1 port={} user=jobcenter dbname=postgres sslmode=verify-full sslrootcert={}",
        cluster.port(),
        ca.display()
    );
    assert_eq!(try_psql(&by_name, password, ssl_in_use).unwrap(), "t");

    // Another CA's certificate does not verify the server.
    let other_dir = tempfile::tempdir().unwrap();
    let other_ca = other_dir.path().join("other-ca.crt");
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    std::fs::write(&other_ca, params.self_signed(&key).unwrap().pem()).unwrap();
    let unverified = format!("{} sslmode=verify-full sslrootcert={}", cluster.conninfo("postgres"), other_ca.display());
    let refused = try_psql(&unverified, password, "SELECT 1").unwrap_err();
    assert!(refused.contains("certificate verify failed"), "{refused}");

    // Plain TCP works until TLS is required, then is refused.
    let plain = format!("{} sslmode=disable", cluster.conninfo("postgres"));
    assert_eq!(try_psql(&plain, password, ssl_in_use).unwrap(), "f");
    cluster.require_tls();
    let refused = try_psql(&plain, password, "SELECT 1").unwrap_err();
    assert!(refused.contains("no pg_hba.conf entry"), "{refused}");
    assert_eq!(try_psql(&verified, password, ssl_in_use).unwrap(), "t");
    // The unix socket stays open to the superuser.
    assert_eq!(cluster.psql("postgres", "SELECT 1"), "1");

    // TLS and the TLS-only rule survive a restart.
    cluster.stop(Shutdown::Fast);
    cluster.start_again();
    assert_eq!(try_psql(&verified, password, ssl_in_use).unwrap(), "t");
    assert!(try_psql(&plain, password, "SELECT 1").unwrap_err().contains("no pg_hba.conf entry"));
}

#[test]
fn dropping_a_cluster_stops_its_server_and_removes_its_directory() {
    let cluster = PgCluster::start();
    let root = cluster.root().to_path_buf();
    let port = cluster.port();
    let processes = cluster.server_processes();
    assert!(processes.len() > 1, "a postmaster and its children: {processes:?}");
    // Only the postmaster surely still runs: a backend may be on its way out.
    assert!(processes[0].is_alive(), "the postmaster runs: {processes:?}");

    drop(cluster);
    assert!(processes.iter().all(|p| !p.is_alive()), "a server process outlived drop: {processes:?}");
    assert!(!root.exists(), "{} outlived drop", root.display());
    assert!(!port_open(port));
}

// ---------------------------------------------------------------------------
// The watchdog: a test process that ends without dropping its cluster.

/// Set in a child test process: `exit` or `kill`.
const CHILD: &str = "JOBCENTER_PG_HARNESS_CHILD";
/// How the child's line that names its cluster starts.
const CLUSTER_LINE: &str = "harness-cluster";

/// In a child test process: starts the shared cluster (never dropped),
/// prints its directory and server processes (on stderr), and returns (the process
/// exits) or waits to be killed (or for its stdin to close). False in the parent.
fn run_as_child() -> bool {
    let Ok(how) = std::env::var(CHILD) else { return false };
    let cluster = shared();
    let processes: Vec<String> =
        cluster.server_processes().iter().map(|p| format!("{}:{}", p.pid, p.start_time)).collect();
    eprintln!("{CLUSTER_LINE} {} {}", cluster.root().display(), processes.join(" "));
    if how == "kill" {
        // Until the parent kills this process, or ends and so closes stdin.
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
    }
    true
}

/// Runs `test` of this binary as a child that ends as `how` says, and
/// checks that its cluster's server stops and its directory goes.
fn check_child_leaves_no_server(test: &str, how: &str) {
    // The test's full name in the binary: this module's path without the crate.
    let module = module_path!().split_once("::").map_or("", |(_, module)| module);
    let name = format!("{module}::{test}");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, how)
        // The child's stdin closes with this process, so a failed check here never leaves it running.
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the child test");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + WAIT * 2;
    let mut printed = Vec::new();
    let line = loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => match line.strip_prefix(CLUSTER_LINE) {
                Some(rest) => break rest.to_string(),
                None => printed.push(line),
            },
            Err(_) => {
                let _ = child.kill();
                panic!("the child test printed no cluster:\n{}", printed.join("\n"));
            }
        }
    };
    let mut parts = line.split_whitespace();
    let root = std::path::PathBuf::from(parts.next().unwrap());
    let processes: Vec<ProcessId> = parts
        .map(|p| {
            let (pid, start_time) = p.split_once(':').unwrap();
            ProcessId { pid: pid.parse().unwrap(), start_time: start_time.parse().unwrap() }
        })
        .collect();
    assert!(processes.len() > 1, "a postmaster and its children: {line}");

    if how == "kill" {
        assert!(processes[0].is_alive(), "the postmaster runs while its test process does");
        child.kill().expect("SIGKILL the child test");
    }
    let status = child.wait().unwrap();
    if how == "exit" {
        assert!(status.success(), "the child test passed");
    }
    let gone = wait_for(WAIT, || processes.iter().all(|p| !p.is_alive()) && !root.exists());
    let alive: Vec<&ProcessId> = processes.iter().filter(|p| p.is_alive()).collect();
    assert!(gone, "after the child test ended ({how}): alive {alive:?}, {} exists: {}", root.display(), root.exists());
}

#[test]
fn a_test_process_that_exits_leaves_no_server() {
    if run_as_child() {
        return;
    }
    check_child_leaves_no_server("a_test_process_that_exits_leaves_no_server", "exit");
}

#[test]
fn a_killed_test_process_leaves_no_server() {
    if run_as_child() {
        return;
    }
    check_child_leaves_no_server("a_killed_test_process_leaves_no_server", "kill");
}

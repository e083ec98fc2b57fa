//! The rig of the tests that cross a network: admin instances, workers and
//! PostgreSQL, each on a host of its own (`net.rs`), and the checks those
//! tests share. It uses the rest of the harness: the processes
//! (`support`), `net`, `postgres` and `proxy`.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use super::{exec_events, executions, start_worker_with, wait_until, Process, Server};
use super::{net, postgres, proxy};

/// The lease every worker here declares, and the heartbeat interval.
pub const LEASE: Duration = Duration::from_secs(3);

/// `n` independent `noop` tasks of `sleep_ms` each: the model's final
/// state is every task succeeded.
pub fn independent(n: usize, sleep_ms: u64) -> String {
    let tasks: Vec<String> = (0..n)
        .map(|i| format!(r#"{{"id":"t{i}","job_type":"noop","parameters":{{"sleep_ms":{sleep_ms}}}}}"#))
        .collect();
    format!(r#"{{"name":"independent","tasks":[{}]}}"#, tasks.join(","))
}

pub fn submit(server: &Server, dir: &Path, text: &str) -> String {
    let file = dir.join(format!("job-{}.json", uuid::Uuid::new_v4()));
    std::fs::write(&file, text).unwrap();
    let output = server.cli(&["submit", file.to_str().unwrap()]);
    assert!(output.status.success(), "submit: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

/// Waits for the job to end and returns it.
pub fn ended(server: &Server, job: &str, limit: Duration) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    wait_until(limit, || {
        last = server.cli_json(&["job", job, "--json"]);
        matches!(last["state"].as_str(), Some("succeeded" | "failed" | "canceled")).then(|| last.clone())
    })
    .unwrap_or_else(|| panic!("job {job} did not end within {limit:?}: {last}"))
}

/// A worker on `host`, with the lease, logging to `dir/ID.log`.
pub fn worker(host: &net::Host, admin: &str, id: &str, dir: &Path, exec_log: &Path, slots: u32) -> Process {
    let lease = format!("{}ms", LEASE.as_millis());
    let slots = slots.to_string();
    let extra = ["--lease", &lease, "--max-execute", &slots];
    start_worker_with(&host.wrapper(), admin, id, &extra, Some(exec_log), &dir.join(format!("{id}.log")))
}

pub fn connected(server: &Server, id: &str) -> bool {
    server.workers().iter().any(|w| w["worker_id"].as_str() == Some(id) || w["id"].as_str() == Some(id))
}

/// The cluster's timing here: a heartbeat a second, deactivation after 4 s
/// of silence; an instance fences itself after 3 s without a heartbeat.
pub const CLUSTER: [&str; 4] = ["--cluster-heartbeat", "1s", "--lag-threshold", "4s"];
/// A slower cluster heartbeat: what an instance learns of the others' workers
/// from the database comes later than a worker's lease runs out.
pub const SLOW_CLUSTER: [&str; 4] = ["--cluster-heartbeat", "3s", "--lag-threshold", "12s"];
pub const LAG: Duration = Duration::from_secs(4);

/// Admin instances and workers, each on a host of its own, and PostgreSQL
/// on another: every instance `aN` has a worker `wN` that tries `aN` first,
/// then the others in turn.
pub struct Cluster {
    pub network: net::Network,
    pub dir: tempfile::TempDir,
    pub database: postgres::PgCluster,
    /// The streaming replica, when there is one.
    pub replica: Option<postgres::PgCluster>,
    pub replica_host: Option<net::Host>,
    pub db_host: net::Host,
    pub admin_hosts: Vec<net::Host>,
    pub worker_hosts: Vec<net::Host>,
    pub admins: Vec<Server>,
    pub workers: Vec<Process>,
    pub log: std::path::PathBuf,
    /// The slow links every link goes through, when there are.
    pub links: Vec<proxy::SlowLink>,
}

pub fn cluster(n: usize) -> Cluster {
    cluster_with(n, &CLUSTER, false)
}

/// `n` instances with `timing`; with `slow`, every link (worker to
/// instance, instance to instance, instance to database) goes through a
/// `SlowLink` of the test process, which the rig keeps.
pub fn cluster_with(n: usize, timing: &[&str], slow: bool) -> Cluster {
    build(Setup { instances: n, timing: timing.iter().map(|t| t.to_string()).collect(), slow, ..Setup::default() })
}

/// What a rig is made of.
#[derive(Default)]
pub struct Setup {
    pub instances: usize,
    /// The cluster's timing options (`--cluster-heartbeat`, `--lag-threshold`).
    pub timing: Vec<String>,
    /// Every link goes through a `SlowLink` (`links`, the database's first).
    pub slow: bool,
    /// Only the link to the database goes through a `SlowLink` (`links[0]`).
    pub database_link: bool,
    /// A synchronous streaming replica on a host of its own (`replica`), the
    /// instances given both addresses, writing to whichever is the primary.
    pub replica: bool,
    /// The instances reach the database as this role (no superuser), made
    /// with the right to create jobcenter's schema; else as the superuser.
    pub role: Option<&'static str>,
    /// Slots of each worker.
    pub slots: Option<u32>,
    /// The database's `max_connections`, set before any instance starts.
    pub max_connections: Option<u32>,
}

/// Builds a rig and waits until every worker is connected.
pub fn build(setup: Setup) -> Cluster {
    let n = setup.instances;
    let network = net::Network::new();
    let db_host = network.host("db");
    let database = postgres::PgCluster::start_on_host(&db_host.address, &db_host.wrapper());
    database.create_database("jobcenter");
    if let Some(max) = setup.max_connections {
        database.psql("postgres", &format!("ALTER SYSTEM SET max_connections = {max}"));
        database.stop(postgres::Shutdown::Fast);
        database.start_again();
    }
    let dir = tempfile::tempdir().unwrap();
    if std::env::var_os("JOBCENTER_TEST_KEEP").is_some() {
        eprintln!("keeping {}", dir.path().display());
    }
    let (replica_host, replica) = match setup.replica {
        true => {
            let host = network.host("db2");
            let replica = postgres::PgCluster::replica_of(&database, &host.address, &host.wrapper(), true);
            (Some(host), Some(replica))
        }
        false => (None, None),
    };
    let admin_hosts: Vec<net::Host> = (0..n).map(|i| network.host(&format!("a{i}"))).collect();
    let worker_hosts: Vec<net::Host> = (0..n).map(|i| network.host(&format!("w{i}"))).collect();
    let here = format!("{}:0", network.here());
    let mut links = Vec::new();
    let mut url = match setup.role {
        Some(role) => {
            database.create_role(role, "secret", "jobcenter", &format!("GRANT CREATE ON DATABASE jobcenter TO {role}"))
        }
        None => database.url("jobcenter"),
    };
    let primary_at = format!("{}:5432", db_host.address);
    if setup.slow || setup.database_link {
        let link = proxy::SlowLink::start(&here, &primary_at);
        url = url.replace(&primary_at, &link.address);
        links.push(link);
    }
    if let Some(host) = &replica_host {
        // Both addresses; the driver takes the one that takes writes.
        let both = format!("{},{}", url.split('@').nth(1).unwrap().split('/').next().unwrap(), host.at(5432));
        let first = url.split('@').nth(1).unwrap().split('/').next().unwrap().to_string();
        url = format!("{}?target_session_attrs=read-write", url.replacen(&first, &both, 1));
    }
    // Each instance's gRPC port, as the others and the workers reach it.
    let grpc: Vec<String> = admin_hosts
        .iter()
        .map(|host| match setup.slow {
            true => {
                let link = proxy::SlowLink::start(&here, &host.at(33646));
                let address = link.address.clone();
                links.push(link);
                address
            }
            false => host.at(33646),
        })
        .collect();
    let admins: Vec<Server> = admin_hosts
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let mut extra: Vec<&str> = setup.timing.iter().map(String::as_str).collect();
            if setup.slow {
                extra.extend(["--advertise-grpc", &grpc[i]]);
            }
            start_admin(host, dir.path(), i, &url, &extra)
        })
        .collect();
    let log = dir.path().join("exec.log");
    let mut rig = Cluster {
        network,
        dir,
        database,
        replica,
        db_host,
        replica_host,
        admin_hosts,
        worker_hosts,
        admins,
        workers: Vec::new(),
        log,
        links,
    };
    for i in 0..n {
        let order: Vec<String> = (0..n)
            .map(|k| match setup.slow {
                true => format!("grpc://{}", grpc[(i + k) % n]),
                false => rig.admins[(i + k) % n].http.clone(),
            })
            .collect();
        let slots = setup.slots.unwrap_or(4);
        let worker = worker(&rig.worker_hosts[i], &order.join(","), &format!("w{i}"), rig.dir.path(), &rig.log, slots);
        rig.workers.push(worker);
    }
    wait_until(Duration::from_secs(30), || {
        (rig.admins.iter().map(|a| a.workers().len()).sum::<usize>() == n).then_some(())
    })
    .unwrap_or_else(|| panic!("the workers did not connect"));
    rig
}

/// Instance `i` on its host, on fixed ports (an instance that starts over
/// listens where it did).
pub fn start_admin(host: &net::Host, dir: &Path, i: usize, url: &str, extra: &[&str]) -> Server {
    let wrapper = host.wrapper();
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let mut args = vec![
        "--database-url",
        url,
        "--grpc",
        "33646",
        "--allow-insecure-bind",
        "--heartbeat",
        "1s",
        "--orphan-grace",
        "10s",
        "--silence-timeout",
        "60s",
        "--recovery-interval",
        "2s",
        "--delivery-grace",
        "5s",
    ];
    args.extend(extra);
    Server::start_wrapped(&wrapper, &dir.join(format!("a{i}")), &host.at(23646), &args)
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::env::var_os("JOBCENTER_TEST_KEEP").is_some() {
            let kept = std::path::PathBuf::from("/tmp/kept").join(self.dir.path().file_name().unwrap());
            let _ = std::fs::create_dir_all("/tmp/kept");
            let _ = std::process::Command::new("cp").arg("-r").arg(self.dir.path()).arg(&kept).status();
        }
    }
}

impl Cluster {
    /// The database that takes writes now: the replica once the primary
    /// has stopped.
    pub fn database_now(&self) -> &postgres::PgCluster {
        match &self.replica {
            Some(replica) if !self.database.is_running() => replica,
            _ => &self.database,
        }
    }

    pub fn active(&self) -> Vec<(String, String)> {
        let rows = self.database.psql(
            "jobcenter",
            "SELECT http_address || '|' || id FROM jobcenter.instances WHERE status = 'active' ORDER BY id",
        );
        rows.lines().filter_map(|l| l.trim().split_once('|')).map(|(h, id)| (h.to_string(), id.to_string())).collect()
    }

    pub fn owner(&self, job: &str) -> String {
        self.database_now()
            .psql("jobcenter", &format!("SELECT coalesce(owner::text, '') FROM jobcenter.jobs WHERE id = '{job}'"))
            .trim()
            .to_string()
    }

    /// Which instance leads `job` now, if a live one does.
    pub fn leader(&self, job: &str) -> Option<usize> {
        let owner = self.owner(job);
        let http = self.active().into_iter().find(|(_, id)| *id == owner)?.0;
        self.admins.iter().position(|a| a.http == http)
    }

    /// The job as an instance other than `except` reports it, once ended
    /// (an instance that does not answer is asked no more this time round).
    pub fn ended(&self, job: &str, except: &[usize], limit: Duration) -> serde_json::Value {
        let mut last = serde_json::Value::Null;
        wait_until(limit, || {
            for i in (0..self.admins.len()).filter(|i| !except.contains(i)) {
                let output = self.admins[i].cli(&["job", job, "--json"]);
                let Ok(answer) = serde_json::from_slice::<serde_json::Value>(&output.stdout) else { continue };
                last = answer;
                return matches!(last["state"].as_str(), Some("succeeded" | "failed")).then(|| last.clone());
            }
            None
        })
        .unwrap_or_else(|| {
            let mut states: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
            for task in last["tasks"].as_array().into_iter().flatten() {
                *states.entry(task["state"].as_str().unwrap_or("?").to_string()).or_default() += 1;
            }
            panic!(
                "job {job} did not end within {limit:?}: {} with tasks {states:?}\n{}",
                last["state"],
                self.what_holds(&last)
            )
        })
    }

    /// A job that makes no progress, as the first instance to answer
    /// reports it, with what holds it (`what_holds`).
    pub fn stalled(&self, job: &str) -> String {
        for admin in &self.admins {
            let output = admin.cli(&["job", job, "--json"]);
            if let Ok(answer) = serde_json::from_slice::<serde_json::Value>(&output.stdout) {
                return format!("job {job} is {}\n{}", answer["state"], self.what_holds(&answer));
            }
        }
        format!("no instance answers for job {job}")
    }

    /// For a job that did not end: its tasks under way (at most five), and
    /// what each instance's log says of them.
    fn what_holds(&self, job: &serde_json::Value) -> String {
        let waiting = ["pending", "succeeded", "failed", "upstream_failed", "canceled"];
        let under_way: Vec<&serde_json::Value> = job["tasks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| !waiting.contains(&t["state"].as_str().unwrap_or("")))
            .take(5)
            .collect();
        let logs: Vec<String> =
            self.admins.iter().map(|a| std::fs::read_to_string(&a.log).unwrap_or_default()).collect();
        let mut said = String::new();
        for task in under_way {
            said.push_str(&format!("task under way: {task}\n"));
            let Some(id) = task["id"].as_str() else { continue };
            let (within, at_end) = (format!("={id} "), format!("={id}"));
            tails(&logs, |l| l.contains(&within) || l.ends_with(&at_end), 15, &mut said);
        }
        tails(&logs, |l| l.contains(" WARN ") || l.contains(" ERROR "), 20, &mut said);
        said
    }

    pub fn ready(&self, i: usize) -> bool {
        http_status(&self.admins[i].http, "/readyz") == Some(200)
    }

    /// Names (worker ids) of the workers connected to instance `i`.
    pub fn workers_of(&self, i: usize) -> Vec<String> {
        self.admins[i].workers().iter().filter_map(|w| w["worker_id"].as_str().map(String::from)).collect()
    }

    /// User jobs in the store (the recovery check's own left out).
    pub fn user_jobs(&self) -> Vec<String> {
        let rows = self
            .database_now()
            .psql("jobcenter", "SELECT id FROM jobcenter.jobs WHERE name <> 'recovery_check' ORDER BY id");
        rows.lines().map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect()
    }
}

/// The status of `GET path` at `address`, if it answered within 3 s.
pub fn http_status(address: &str, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let address: std::net::SocketAddr = address.parse().ok()?;
    let mut stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(3)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer.split_whitespace().nth(1)?.parse().ok()
}

/// Every task of `job` succeeded exactly once, and no two executions of
/// one task overlapped.
pub fn each_task_succeeded_once(log: &Path, job: &str, n: usize) -> std::collections::BTreeMap<String, (u32, u32)> {
    let events = exec_events(log, job);
    let counts = executions(&events);
    assert_eq!(counts.len(), n, "tasks that ran: {counts:?}");
    for (task, (_, successes)) in &counts {
        assert_eq!(*successes, 1, "task {task} succeeded {successes} times: {events:?}");
    }
    counts
}

/// The last `n` lines of each instance's log that `pick` picks, each
/// named by its instance.
fn tails(logs: &[String], pick: impl Fn(&str) -> bool, n: usize, said: &mut String) {
    for (i, log) in logs.iter().enumerate() {
        let lines: Vec<&str> = log.lines().filter(|l| pick(l)).collect();
        for line in &lines[lines.len().saturating_sub(n)..] {
            said.push_str(&format!("a{i}: {line}\n"));
        }
    }
}

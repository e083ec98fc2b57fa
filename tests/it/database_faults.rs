//! The database failing under a cluster of real instances and workers, each
//! on a host of its own: PostgreSQL stopped (fast, then at once) and started
//! again during a 10,000-task job; a primary replaced by a promoted
//! streaming replica at another address; PostgreSQL out of connections; a
//! restart under jobs held to a global limit.
//! What must hold: no acknowledged submission lost, the job as the
//! reference model says, no task run again because of the fault, never two
//! executions of one task at once, a global limit kept, and every instance
//! ready again soon after the database is.

use crate::support;
use crate::support::layered;
use crate::support::postgres as pg_common;
use crate::support::rig;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use layered::{layered_job, Rng, Work};
use rig::{build, http_status, submit, Cluster, Setup};
use support::{exec_events, executions, wait_until};

/// A heartbeat a second, and a lag threshold (10 s) longer than a restart
/// of the database takes: an instance fences itself after 7.5 s without a
/// heartbeat.
fn timing() -> Vec<String> {
    ["--cluster-heartbeat", "1s", "--lag-threshold", "10s"].iter().map(|t| t.to_string()).collect()
}

/// Submits one-task jobs to the instances in turn until stopped, and keeps
/// the ids of those whose submission was acknowledged.
struct Submitter {
    stop: Arc<AtomicBool>,
    acknowledged: Arc<Mutex<Vec<String>>>,
    refused: Arc<Mutex<usize>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Submitter {
    fn start(rig: &Cluster) -> Submitter {
        let stop = Arc::new(AtomicBool::new(false));
        let acknowledged = Arc::new(Mutex::new(Vec::new()));
        let refused = Arc::new(Mutex::new(0));
        let admins: Vec<String> = rig.admins.iter().map(|a| a.http.clone()).collect();
        let file = rig.dir.path().join("small.json");
        std::fs::write(&file, rig::independent(1, 1)).unwrap();
        let (stop_, acknowledged_, refused_) = (stop.clone(), acknowledged.clone(), refused.clone());
        let thread = std::thread::spawn(move || {
            let mut n = 0;
            while !stop_.load(Ordering::SeqCst) {
                let admin = &admins[n % admins.len()];
                n += 1;
                let mut command = std::process::Command::new(support::binary());
                command.args(["submit", file.to_str().unwrap(), "--admin", admin]);
                let output = support::run_with_timeout(command, Duration::from_secs(60));
                let id = String::from_utf8_lossy(&output.stdout).trim().to_string();
                if output.status.success() && !id.is_empty() {
                    acknowledged_.lock().unwrap().push(id);
                } else {
                    *refused_.lock().unwrap() += 1;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        Submitter { stop, acknowledged, refused, thread: Some(thread) }
    }

    /// Stops; the acknowledged ids and how many were not acknowledged.
    fn stop(mut self) -> (Vec<String>, usize) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
        let acknowledged = self.acknowledged.lock().unwrap().clone();
        let refused = *self.refused.lock().unwrap();
        (acknowledged, refused)
    }
}

/// Connections the database still takes from clients that are not
/// superusers. The session that asks is not counted: it ends with the
/// question, and the slot it held is free again.
fn free_connections(rig: &Cluster) -> i64 {
    rig.database
        .psql(
            "postgres",
            "SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int \
             - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid())",
        )
        .trim()
        .parse()
        .unwrap()
}

/// Waits until every instance answers `/readyz` with 200; how long it took.
fn all_ready(rig: &Cluster, limit: Duration) -> Duration {
    let from = Instant::now();
    wait_until(limit, || {
        rig.admins.iter().all(|a| http_status(&a.http, "/readyz") == Some(200)).then(|| from.elapsed())
    })
    .unwrap_or_else(|| {
        let states: Vec<_> = rig.admins.iter().map(|a| http_status(&a.http, "/readyz")).collect();
        panic!("not every instance was ready {limit:?} after the database: {states:?}")
    })
}

/// The layered job ended as its model says, nothing ran again, no two
/// executions of a task overlapped.
fn as_modelled_and_run_once(rig: &Cluster, job: &layered::Layered, id: &str) {
    let done = rig.ended(id, &[], Duration::from_secs(300));
    job.assert_as_modelled(&done);
    let events = exec_events(&rig.log, id);
    job.assert_each_succeeded_once(&events);
    job.assert_orderly_executions(&done, &events);
    executions(&events);
    let (reruns, _) = job.reruns(&events);
    assert!(
        reruns.is_empty(),
        "{} tasks ran again because of the fault: {:?}",
        reruns.len(),
        &reruns[..reruns.len().min(5)]
    );
}

/// Every acknowledged submission is in the database.
fn all_stored(rig: &Cluster, acknowledged: &[String]) {
    let stored = rig.database_now().psql("jobcenter", "SELECT id FROM jobcenter.jobs");
    let stored: std::collections::HashSet<&str> = stored.lines().map(str::trim).collect();
    let lost: Vec<&String> = acknowledged.iter().filter(|id| !stored.contains(id.as_str())).collect();
    assert!(lost.is_empty(), "{} acknowledged submissions are not stored: {lost:?}", lost.len());
}

#[test]
fn the_database_restarted_fast_then_at_once_under_a_10000_task_job_loses_nothing_and_reruns_nothing() {
    let rig = build(Setup { instances: 3, timing: timing(), ..Setup::default() });
    let job = layered_job(&mut Rng(0xdb_5709), "restarts", 10_000, 100, &Work::Sleep { from: 1, spread: 10 });
    let id = submit(&rig.admins[0], rig.dir.path(), &job.text);
    let submitter = Submitter::start(&rig);
    let mut back = Vec::new();
    for (n, mode) in [pg_common::Shutdown::Fast, pg_common::Shutdown::Immediate].into_iter().enumerate() {
        wait_until(Duration::from_secs(120), || (exec_events(&rig.log, &id).len() >= 4_000 * (n + 1)).then_some(()))
            .unwrap_or_else(|| panic!("the job makes no progress: {}", rig.stalled(&id)));
        rig.database.stop(mode);
        std::thread::sleep(Duration::from_secs(1));
        rig.database.start_again();
        back.push(all_ready(&rig, Duration::from_secs(10)));
    }
    as_modelled_and_run_once(&rig, &job, &id);
    let (acknowledged, refused) = submitter.stop();
    assert!(!acknowledged.is_empty());
    all_stored(&rig, &acknowledged);
    eprintln!(
        "database restarted (fast, then at once) under a 10,000-task job: every instance ready {back:?} after it; \
         {} submissions acknowledged (all stored), {refused} not",
        acknowledged.len()
    );
}

#[test]
fn a_primary_replaced_by_a_promoted_replica_at_another_address_loses_nothing_and_reruns_nothing() {
    let rig = build(Setup { instances: 3, timing: timing(), replica: true, ..Setup::default() });
    let job = layered_job(&mut Rng(0xfa11_0fe7), "failover", 5_000, 100, &Work::Sleep { from: 1, spread: 10 });
    let id = submit(&rig.admins[0], rig.dir.path(), &job.text);
    let submitter = Submitter::start(&rig);
    wait_until(Duration::from_secs(120), || (exec_events(&rig.log, &id).len() >= 3_000).then_some(()))
        .unwrap_or_else(|| panic!("the job makes no progress: {}", rig.stalled(&id)));
    rig.database.stop(pg_common::Shutdown::Immediate);
    let replica = rig.replica.as_ref().unwrap();
    replica.promote();
    let back = all_ready(&rig, Duration::from_secs(10));
    as_modelled_and_run_once(&rig, &job, &id);
    let (acknowledged, refused) = submitter.stop();
    assert!(!acknowledged.is_empty());
    all_stored(&rig, &acknowledged);
    eprintln!(
        "primary replaced by a promoted replica at another address: every instance ready {back:?} after the promotion; \
         {} submissions acknowledged (all stored), {refused} not",
        acknowledged.len()
    );
}

/// A job type's global limit lives in the database (`jobcenter.permits`),
/// and each instance remembers what it holds there: a restart of the
/// database, at once, in the middle of the work, makes every instance read
/// its permits again, and the limit holds throughout.
#[test]
fn a_global_limit_holds_across_the_instances_while_the_database_restarts_at_once() {
    let rig = build(Setup { instances: 3, timing: timing(), ..Setup::default() });
    support::set_global_limit(&rig.admins, "noop", 2);
    // Three jobs of eight 250 ms tasks, one led by each instance.
    let ids: Vec<String> =
        rig.admins.iter().map(|admin| submit(admin, rig.dir.path(), &rig::independent(8, 250))).collect();
    let started = |rig: &Cluster| ids.iter().map(|id| exec_events(&rig.log, id).len()).sum::<usize>();
    wait_until(Duration::from_secs(60), || (started(&rig) >= 8).then_some(()))
        .unwrap_or_else(|| panic!("the jobs make no progress: {}", rig.stalled(&ids[0])));
    rig.database.stop(pg_common::Shutdown::Immediate);
    std::thread::sleep(Duration::from_secs(1));
    rig.database.start_again();
    let back = all_ready(&rig, Duration::from_secs(10));
    for id in &ids {
        let done = rig.ended(id, &[], Duration::from_secs(120));
        assert_eq!(done["state"], "succeeded", "{done}");
    }
    let (most, starts) = support::most_at_once(&rig.log, |job| ids.iter().any(|id| id == job));
    assert!(starts >= 24, "{starts} executions for the 24 tasks");
    assert!(most <= 2, "{most} noop tasks ran at once over the cluster, past its limit of 2");
    assert_eq!(most, 2, "the limit was used");
    eprintln!("a global limit of 2 over 3 instances held while the database restarted: {starts} executions, every instance ready {back:?} after it");
}

#[test]
fn postgres_out_of_connections_acknowledges_nothing_and_the_job_resumes() {
    let rig = build(Setup {
        instances: 1,
        timing: ["--cluster-heartbeat", "1s", "--lag-threshold", "60s"].iter().map(|t| t.to_string()).collect(),
        database_link: true,
        role: Some("jc"),
        max_connections: Some(24),
        ..Setup::default()
    });
    let job = layered_job(&mut Rng(0xc0_77ec), "connections", 2_000, 100, &Work::Sleep { from: 1, spread: 10 });
    let id = submit(&rig.admins[0], rig.dir.path(), &job.text);
    wait_until(Duration::from_secs(60), || (exec_events(&rig.log, &id).len() >= 400).then_some(()))
        .unwrap_or_else(|| panic!("the job makes no progress: {}", rig.stalled(&id)));
    // Others take every connection the instance's role could have: its
    // connections are cut, and its new ones wait long enough at the link
    // for the others to take the slots they leave.
    let free = free_connections(&rig).max(0) as usize;
    rig.links[0].delay_connects(Duration::from_secs(3));
    let mut others = Hogs::start(&rig, free.saturating_sub(2));
    rig.links[0].drop_all();
    others.add(&rig, 8);
    wait_until(Duration::from_secs(10), || {
        let left = rig.database.psql("postgres", "SELECT count(*) FROM pg_stat_activity WHERE usename = 'jc'");
        (left.trim() == "0").then_some(())
    })
    .expect("the instance's connections ended");
    let full = others.fill(&rig);
    rig.links[0].delay_connects(Duration::ZERO);
    // Nothing acknowledged, and it says so.
    let refused = wait_until(Duration::from_secs(10), || {
        (http_status(&rig.admins[0].http, "/readyz") == Some(503)).then_some(())
    });
    assert!(refused.is_some(), "the instance says it is ready without a connection to its database");
    let file = rig.dir.path().join("meanwhile.json");
    std::fs::write(&file, rig::independent(1, 1)).unwrap();
    let mut meanwhile = std::process::Command::new(support::binary());
    meanwhile.args(["submit", file.to_str().unwrap(), "--admin", &rig.admins[0].http]);
    let meanwhile =
        meanwhile.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let meanwhile = std::thread::spawn(move || support::wait_with_timeout(meanwhile, Duration::from_secs(5)));
    let answered = meanwhile.join().unwrap();
    if let Some(output) = &answered {
        assert!(!output.status.success(), "a submission was acknowledged without a connection to the database");
    }
    let log = std::fs::read_to_string(&rig.admins[0].log).unwrap_or_default();
    let why = log.contains("the store is away") && (log.contains("too many") || log.contains("connection slots"));
    assert!(why, "no line in the log says why: {}", &log[log.len().saturating_sub(2000)..]);
    let progress = exec_events(&rig.log, &id).len();
    // The others let go: the job resumes and ends as the model says.
    others.stop(&rig);
    let resumed = Instant::now();
    all_ready(&rig, Duration::from_secs(20));
    as_modelled_and_run_once(&rig, &job, &id);
    eprintln!(
        "PostgreSQL out of connections ({full} taken by others): not ready, nothing acknowledged, {progress} events before; \
         ended {:?} after they let go",
        resumed.elapsed()
    );
}

/// Sessions of another role that hold connections to the database until stopped.
struct Hogs {
    sessions: Vec<support::Process>,
}

impl Hogs {
    /// Ends every session (a backend asleep does not notice its client gone).
    fn stop(mut self, rig: &Cluster) {
        self.sessions.clear();
        rig.database
            .psql("postgres", "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = 'hog'");
    }

    fn start(rig: &Cluster, n: usize) -> Hogs {
        rig.database.psql(
            "postgres",
            "DO $$ BEGIN CREATE ROLE hog LOGIN PASSWORD 'hog'; EXCEPTION WHEN duplicate_object THEN NULL; END $$",
        );
        let mut hogs = Hogs { sessions: Vec::new() };
        hogs.add(rig, n);
        hogs
    }

    fn add(&mut self, rig: &Cluster, n: usize) {
        for _ in 0..n {
            let mut command = pg_common::psql_command();
            command.env("PGPASSWORD", "hog");
            command.arg("-d").arg(format!("host={} port=5432 user=hog dbname=postgres", rig.db_host.address));
            command.args(["-c", "SELECT pg_sleep(600)"]);
            command.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
            let child = command.spawn().expect("start a session");
            self.sessions.push(support::Process { child, name: "hog".into() });
        }
    }

    /// Adds sessions until the database refuses more; how many there are.
    fn fill(&mut self, rig: &Cluster) -> usize {
        for _ in 0..50 {
            let free = free_connections(rig);
            if free <= 0 {
                return self.sessions.len();
            }
            self.add(rig, free as usize);
            std::thread::sleep(Duration::from_millis(300));
        }
        panic!("the database kept free connections")
    }
}

//! Networks that fail, between real processes on hosts of their own
//! (network namespaces, `support/net.rs`): links cut and healed, hosts
//! partitioned from each other, one way or both. For each fault: the
//! reference model's final states, no task succeeding twice, never two
//! executions of one task at once (the execution log every worker appends
//! to), and progress again within a stated time once the fault heals.

use crate::support;
use crate::support::layered;
use crate::support::net;
use crate::support::rig;

use std::time::{Duration, Instant};

use rig::{
    cluster, cluster_with, connected, each_task_succeeded_once, ended, independent, submit, worker, CLUSTER, LAG,
    LEASE, SLOW_CLUSTER,
};
use support::{exec_events, executions, wait_until, Server};

/// A worker cut off (its host's link down at the router, the process alive)
/// for three times its lease, then healed. It gives its attempts up once
/// its lease runs out; the admin runs each again exactly once, not before
/// the lease has run out since the cut, and within lease + margin + a few
/// seconds; the worker's late reports on them are refused; once healed it
/// is back within 10 s.
#[test]
fn a_worker_cut_off_gives_its_attempts_up_and_each_runs_again_exactly_once() {
    let network = net::Network::new();
    let (admin_host, w1_host, w2_host) = (network.host("admin"), network.host("w1"), network.host("w2"));
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_wrapped(
        &admin_host.wrapper().iter().map(String::as_str).collect::<Vec<_>>(),
        &dir.path().join("data"),
        &admin_host.at(0),
        &["--allow-insecure-bind", "--heartbeat", "1s", "--orphan-grace", "10s", "--silence-timeout", "60s"],
    );
    let log = dir.path().join("exec.log");
    let _w1 = worker(&w1_host, &server.http, "w1", dir.path(), &log, 4);
    server.wait_for_workers(1);
    // Eight tasks of 8 s: w1 takes four, then w2 (started after) the rest.
    let job = submit(&server, dir.path(), &independent(8, 8_000));
    wait_until(Duration::from_secs(30), || (exec_events(&log, &job).len() >= 4).then_some(()))
        .expect("w1 started four tasks");
    let on_w1: Vec<String> = exec_events(&log, &job).into_iter().map(|(task, _, _)| task).collect();
    let _w2 = worker(&w2_host, &server.http, "w2", dir.path(), &log, 8);
    wait_until(Duration::from_secs(30), || {
        (exec_events(&log, &job).iter().filter(|e| e.2 == "start").count() >= 8).then_some(())
    })
    .expect("w2 started the other four");

    network.cut(&w1_host);
    let cut = Instant::now();
    // Each of w1's tasks runs again (attempt 2), on w2: when it starts.
    let mut again_at = None;
    wait_until(LEASE * 3, || {
        let events = exec_events(&log, &job);
        let again = on_w1.iter().all(|t| events.iter().any(|e| &e.0 == t && e.1 == 2 && e.2 == "start"));
        if again && again_at.is_none() {
            again_at = Some(cut.elapsed());
        }
        again_at
    })
    .unwrap_or_else(|| panic!("w1's tasks did not run again within {:?}: {:?}", LEASE * 3, exec_events(&log, &job)));
    let again_at = again_at.unwrap();
    let remaining = (LEASE * 3).saturating_sub(cut.elapsed());
    std::thread::sleep(remaining);
    network.heal(&w1_host);
    let healed = Instant::now();
    let back = wait_until(Duration::from_secs(10), || connected(&server, "w1").then(|| healed.elapsed()))
        .unwrap_or_else(|| panic!("w1 did not come back within 10 s of the heal: {:?}", server.workers()));

    let finished = ended(&server, &job, Duration::from_secs(60));
    assert_eq!(finished["state"], "succeeded", "{finished}");
    let events = exec_events(&log, &job);
    let counts = executions(&events);
    for (task, (starts, successes)) in &counts {
        assert_eq!(*successes, 1, "task {task} succeeded {successes} times: {events:?}");
        let expected = if on_w1.contains(task) { 2 } else { 1 };
        assert_eq!(*starts, expected, "task {task} ran {starts} times: {events:?}");
    }
    for task in &on_w1 {
        assert!(
            events.iter().any(|e| &e.0 == task && e.1 == 1 && e.2 == "abandoned"),
            "w1 did not give up task {task} once its lease ran out: {events:?}"
        );
    }
    // Not before w1's lease can have run out, and soon after the take-back.
    assert!(again_at >= LEASE, "w1's tasks ran again {again_at:?} after the cut, inside its lease");
    let bound = common_take_back(LEASE) + Duration::from_secs(5);
    assert!(again_at <= bound, "w1's tasks ran again only {again_at:?} after the cut (bound {bound:?})");
    // Its late reports on the attempts it gave up were refused.
    wait_until(Duration::from_secs(10), || {
        let text = std::fs::read_to_string(dir.path().join("w1.log")).unwrap_or_default();
        text.contains("the admin refused an outcome").then_some(())
    })
    .unwrap_or_else(|| {
        panic!("w1's late reports were not refused: {}", std::fs::read_to_string(dir.path().join("w1.log")).unwrap())
    });
    for task in finished["tasks"].as_array().unwrap() {
        let expected = if on_w1.iter().any(|t| Some(t.as_str()) == task["id"].as_str()) { 2 } else { 1 };
        assert_eq!(task["attempt"], expected, "{task}");
    }
    eprintln!(
        "worker cut off: its tasks ran again {again_at:?} after the cut (lease {LEASE:?}); back {back:?} after the heal"
    );
}

/// How long the admin keeps a silent worker's attempts: `wire::take_back_after`.
fn common_take_back(lease: Duration) -> Duration {
    jobcenter::wire::take_back_after(lease)
}

/// An instance cut off from PostgreSQL but not from its worker: within the
/// lag threshold it reports itself not ready, ends its worker's stream and
/// takes none; the worker goes to the live instance; a submission to the
/// cut-off instance is never acknowledged; the live instance deactivates it
/// and finishes its job; once the network heals, the cut-off instance finds
/// itself deactivated, and nothing it did meanwhile is in the store.
#[test]
fn an_instance_cut_off_from_its_database_fences_itself_and_its_worker_moves() {
    let rig = cluster(2);
    let job = submit(&rig.admins[0], rig.dir.path(), &independent(12, 3_000));
    assert_eq!(rig.leader(&job), Some(0));
    wait_until(Duration::from_secs(20), || (exec_events(&rig.log, &job).len() >= 4).then_some(()))
        .expect("the job runs");
    let instance_before = rig.active().into_iter().find(|(h, _)| *h == rig.admins[0].http).unwrap().1;

    rig.network.partition(&[&rig.admin_hosts[0].address], &[&rig.db_host.address]);
    let cut = Instant::now();
    // A client submits to the cut-off instance meanwhile: never acknowledged.
    let submit_file = rig.dir.path().join("during.json");
    std::fs::write(&submit_file, independent(1, 10)).unwrap();
    let mut during = std::process::Command::new(support::binary());
    during.args(["submit", submit_file.to_str().unwrap(), "--admin", &rig.admins[0].http]);
    let during = during.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let during = std::thread::spawn(move || support::wait_with_timeout(during, LAG * 4));
    let fenced = wait_until(LAG * 2, || (!rig.ready(0)).then(|| cut.elapsed()))
        .unwrap_or_else(|| panic!("the cut-off instance still says it is ready {:?} after the cut", LAG * 2));
    let moved = wait_until(LAG * 3, || {
        (rig.workers_of(0).is_empty() && rig.workers_of(1).contains(&"w0".to_string())).then(|| cut.elapsed())
    })
    .unwrap_or_else(|| {
        panic!("w0 did not move to the live instance: {:?} / {:?}", rig.workers_of(0), rig.workers_of(1))
    });
    assert!(fenced < LAG, "the cut-off instance fenced itself only {fenced:?} after the cut (lag {LAG:?})");
    let finished = rig.ended(&job, &[0], Duration::from_secs(90));
    assert_eq!(finished["state"], "succeeded", "{finished}");
    each_task_succeeded_once(&rig.log, &job, 12);
    if let Some(output) = &during.join().unwrap() {
        assert!(!output.status.success(), "a submission to the cut-off instance was acknowledged: {:?}", output);
    }

    rig.network.unblock_all();
    let healed = Instant::now();
    // It finds itself deactivated and starts over under a new id.
    let back = wait_until(Duration::from_secs(30), || {
        rig.active().iter().any(|(h, id)| *h == rig.admins[0].http && *id != instance_before).then(|| healed.elapsed())
    })
    .expect("the cut-off instance started over once healed");
    // Nothing it did while cut off is in the store: no job but the one
    // submitted before, and nothing of its old id written after the cut.
    assert_eq!(rig.user_jobs(), vec![job.clone()], "the submission made while cut off is stored");
    let late = rig.database.psql(
        "jobcenter",
        &format!("SELECT count(*) FROM jobcenter.instances WHERE id = '{instance_before}' AND status = 'active'"),
    );
    assert_eq!(late.trim(), "0", "the cut-off instance is still active");
    eprintln!(
        "instance cut off from its database: not ready {fenced:?} after the cut, its worker at the live instance {moved:?} after; started over {back:?} after the heal"
    );
}

/// An instance cut off from its worker but not from the database: the
/// worker goes to the other instance and carries on; the job's leader keeps
/// leading it and the worker's reports reach it through the other instance.
/// The other instance renews the worker's lease only once the leader
/// vouched for its attempts (the cluster's heartbeats here are too slow to
/// tell the leader in time that the worker is alive elsewhere): nothing is
/// taken back, nothing runs twice.
#[test]
fn an_instance_cut_off_from_its_worker_keeps_leading_while_the_worker_moves() {
    let rig = cluster_with(2, &SLOW_CLUSTER, false);
    let job = submit(&rig.admins[0], rig.dir.path(), &independent(12, 4_000));
    assert_eq!(rig.leader(&job), Some(0));
    wait_until(Duration::from_secs(20), || (exec_events(&rig.log, &job).len() >= 4).then_some(()))
        .expect("the job runs");
    rig.network.partition(&[&rig.admin_hosts[0].address], &[&rig.worker_hosts[0].address]);
    let cut = Instant::now();
    let moved = wait_until(LAG * 3, || rig.workers_of(1).contains(&"w0".to_string()).then(|| cut.elapsed()))
        .unwrap_or_else(|| panic!("w0 did not move to the other instance: {:?}", rig.workers_of(1)));
    let finished = rig.ended(&job, &[], Duration::from_secs(90));
    assert_eq!(finished["state"], "succeeded", "{finished}");
    assert!(rig.ready(0), "the instance cut off from a worker only stays ready");
    assert_eq!(rig.leader(&job).or(Some(0)), Some(0), "the job's leadership did not move");
    // The worker carried its attempts through the move: nothing ran twice,
    // and no attempt was handed out in vain meanwhile.
    for (task, (starts, _)) in each_task_succeeded_once(&rig.log, &job, 12) {
        assert_eq!(starts, 1, "task {task} ran {starts} times");
    }
    for task in finished["tasks"].as_array().unwrap() {
        assert!(task["attempt"].as_u64().unwrap() <= 3, "attempts handed out in vain: {task}");
    }
    rig.network.unblock_all();
    eprintln!("instance cut off from its worker: the worker at the other instance {moved:?} after the cut");
}

/// An instance cut off from the other instances, but from neither its
/// database nor its worker: both stay active, each keeps its own workers;
/// what crosses between them (tasks lent, reports on them) waits, and the
/// job finishes once healed, nothing run twice.
#[test]
fn instances_cut_off_from_each_other_go_on_and_finish_once_healed() {
    let rig = cluster(2);
    let job = submit(&rig.admins[0], rig.dir.path(), &independent(16, 3_000));
    wait_until(Duration::from_secs(20), || (exec_events(&rig.log, &job).len() >= 8).then_some(()))
        .expect("the job runs on both workers");
    let before: Vec<String> = rig.active().into_iter().map(|(_, id)| id).collect();
    rig.network.partition(&[&rig.admin_hosts[0].address], &[&rig.admin_hosts[1].address]);
    std::thread::sleep(LAG * 3);
    // Neither was deactivated: both reach the database.
    let during: Vec<String> = rig.active().into_iter().map(|(_, id)| id).collect();
    assert_eq!(during, before, "an instance was deactivated though it reached the database");
    assert!(rig.ready(0) && rig.ready(1), "both stay ready");
    assert_eq!(rig.workers_of(0), ["w0"]);
    assert_eq!(rig.workers_of(1), ["w1"]);
    rig.network.unblock_all();
    let healed = Instant::now();
    let finished = rig.ended(&job, &[], Duration::from_secs(90));
    assert_eq!(finished["state"], "succeeded", "{finished}");
    let done = healed.elapsed();
    each_task_succeeded_once(&rig.log, &job, 16);
    eprintln!("instances cut off from each other for {:?}: the job ended {done:?} after the heal", LAG * 3);
}

/// Three instances split 1 + 2 (the database with the two), each side with
/// its workers, for longer than the lag threshold: the one fences itself
/// and writes nothing, the two deactivate it and lead every job; the
/// attempts its worker held run again once, after that worker's lease; once
/// healed, the one starts over and every job finishes.
#[test]
fn a_partition_of_one_against_two_leaves_every_job_to_the_two() {
    let rig = cluster(3);
    let jobs: Vec<String> = (0..3).map(|i| submit(&rig.admins[i], rig.dir.path(), &independent(8, 3_000))).collect();
    wait_until(Duration::from_secs(30), || jobs.iter().all(|job| exec_events(&rig.log, job).len() >= 2).then_some(()))
        .expect("every job runs");
    let minority = rig.active().into_iter().find(|(h, _)| *h == rig.admins[0].http).unwrap().1;
    let one = [rig.admin_hosts[0].address.as_str(), rig.worker_hosts[0].address.as_str()];
    let two = [
        rig.admin_hosts[1].address.as_str(),
        rig.admin_hosts[2].address.as_str(),
        rig.worker_hosts[1].address.as_str(),
        rig.worker_hosts[2].address.as_str(),
        rig.db_host.address.as_str(),
    ];
    let cut_at_ms: i64 =
        rig.database.psql("jobcenter", "SELECT (extract(epoch FROM now()) * 1000)::int8").trim().parse().unwrap();
    rig.network.partition(&one, &two);
    let cut = Instant::now();
    // Past the lag threshold (and the few seconds the database takes to end
    // the one's sessions), the two lead every job that has not ended.
    let settled = wait_until(LAG * 4, || {
        let active = rig.active();
        if active.iter().any(|(_, id)| *id == minority) {
            return None;
        }
        let owners =
            rig.database.psql("jobcenter", "SELECT coalesce(owner::text, '-') FROM jobcenter.jobs WHERE active");
        owners.lines().all(|o| active.iter().any(|(_, id)| id == o.trim())).then(|| cut.elapsed())
    })
    .unwrap_or_else(|| {
        panic!(
            "the two did not take every job over: {}",
            rig.database.psql("jobcenter", "SELECT id, owner FROM jobcenter.jobs WHERE active")
        )
    });
    assert!(!rig.ready(0), "the one says it is ready while cut off");
    std::thread::sleep((LAG * 3).saturating_sub(cut.elapsed()));
    // The one wrote nothing after the cut: its last heartbeat is older.
    let last_beat: i64 = rig
        .database
        .psql(
            "jobcenter",
            &format!(
                "SELECT (extract(epoch FROM heartbeat) * 1000)::int8 FROM jobcenter.instances WHERE id = '{minority}'"
            ),
        )
        .trim()
        .parse()
        .unwrap_or(0);
    assert!(last_beat <= cut_at_ms + 500, "the one wrote a heartbeat after the cut ({last_beat} > {cut_at_ms})");
    rig.network.unblock_all();
    let healed = Instant::now();
    for job in &jobs {
        let finished = rig.ended(job, &[], Duration::from_secs(90));
        assert_eq!(finished["state"], "succeeded", "{finished}");
        each_task_succeeded_once(&rig.log, job, 8);
    }
    let done = healed.elapsed();
    let back = wait_until(Duration::from_secs(30), || {
        rig.active().iter().any(|(h, id)| *h == rig.admins[0].http && *id != minority).then(|| healed.elapsed())
    })
    .expect("the one started over once healed");
    eprintln!("partition 1 + 2: the two led every job {settled:?} after the cut; every job ended {done:?} after the heal, the one back {back:?} after it");
}

/// A slow, lossy network: 50 ms ± 20 ms on every link (worker to instance,
/// instance to instance, instance to database) and a connection dropped
/// every 2 s, through a 2,000-task layered job on three instances. It ends
/// as the reference model says, nothing succeeds twice, no task runs twice
/// at once; the same job on the same rig without the delay is the measure
/// of the slowdown.
#[test]
fn a_slow_lossy_network_slows_a_job_down_and_changes_nothing_else() {
    let rig = cluster_with(3, &CLUSTER, true);
    let run = |name: &str| {
        let job = layered::layered_job(
            &mut layered::Rng(0x5105_11e7),
            name,
            2_000,
            200,
            &layered::Work::Sleep { from: 1, spread: 10 },
        );
        let started = Instant::now();
        let id = submit(&rig.admins[0], rig.dir.path(), &job.text);
        let done = rig.ended(&id, &[], Duration::from_secs(240));
        let took = started.elapsed();
        job.assert_as_modelled(&done);
        let events = exec_events(&rig.log, &id);
        job.assert_each_succeeded_once(&events);
        job.assert_orderly_executions(&done, &events);
        executions(&events);
        took
    };
    let fast = run("fast");
    for link in &rig.links {
        link.set(Duration::from_millis(50), Duration::from_millis(20), Some(Duration::from_secs(2)));
    }
    let slow = run("slow");
    let dropped: u64 = rig.links.iter().map(|l| l.dropped()).sum();
    assert!(dropped > 0, "no connection was dropped");
    eprintln!(
        "slow network: a 2,000-task layered job took {fast:?} without the delay, {slow:?} with 50 ms ± 20 ms on every link \
         and {dropped} connections dropped ({:.1} times as long)",
        slow.as_secs_f64() / fast.as_secs_f64()
    );
}

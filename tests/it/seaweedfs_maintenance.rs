//! Real maintenance through jobcenter: a SeaweedFS cluster on loopback
//! (`tests/it/support/seaweedfs.rs`), a `jobcenter server --master` pointing at
//! it, and a real `weed worker` executing hand-submitted vacuum and erasure
//! coding tasks, and the job types of SeaweedFS's default lane as the
//! scheduler detects them. Each test checks the effect on the cluster as the
//! master and the volume servers report it, not only the job's state.

use crate::support;
use crate::support::seaweedfs;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use seaweedfs::{task_params, Cluster, ClusterOptions, StoredFile, WAIT};
use support::{wait_until, Process, Server};

/// A cluster, a jobcenter server that hands its master to workers, and the
/// directory holding the server's data, job files and worker logs.
struct Setup {
    cluster: Cluster,
    server: Server,
    dir: tempfile::TempDir,
}

/// The job types of SeaweedFS's default lane, which a `weed worker` here runs.
const JOB_TYPES: [&str; 5] = ["vacuum", "erasure_coding", "volume_balance", "ec_balance", "admin_script"];

impl Setup {
    fn start(options: ClusterOptions) -> Setup {
        Setup::on(Cluster::start(options))
    }

    fn on(cluster: Cluster) -> Setup {
        Setup::with_args(cluster, &[])
    }

    /// A setup whose server also takes `args`.
    fn with_args(cluster: Cluster, args: &[&str]) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let master = cluster.master_address();
        let server = Server::start(&dir.path().join("data"), &[&["--master", master.as_str()], args].concat());
        // Only the tasks these tests submit touch the cluster: no detection
        // proposes work of its own while they look.
        for job_type in JOB_TYPES {
            let output = server.cli(&["policy", "set", job_type, "detection_enabled=0"]);
            assert!(output.status.success(), "policy set {job_type}: {}", String::from_utf8_lossy(&output.stderr));
        }
        Setup { cluster, server, dir }
    }

    fn worker_log(&self, id: &str) -> PathBuf {
        self.dir.path().join(format!("{id}.log"))
    }

    /// Starts `weed worker` with the default lane's job types and waits
    /// until jobcenter lists it.
    fn start_weed_worker(&self, id: &str) -> Process {
        self.start_weed_worker_with(id, &JOB_TYPES)
    }

    /// Starts `weed worker` with `job_types` and waits until jobcenter
    /// lists it with every one of them.
    fn start_weed_worker_with(&self, id: &str, job_types: &[&str]) -> Process {
        let working = self.dir.path().join(id);
        std::fs::create_dir_all(&working).unwrap();
        let log = std::fs::File::create(self.worker_log(id)).unwrap();
        let child = Command::new(seaweedfs::weed())
            .args([
                "worker",
                &format!("-admin={}", self.server.http),
                &format!("-id={id}"),
                &format!("-jobType={}", job_types.join(",")),
                "-heartbeat=1s",
                &format!("-workingDir={}", working.display()),
            ])
            .current_dir(&working)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start weed worker");
        let process = Process { child, name: id.to_string() };
        let registered = wait_until(WAIT, || {
            let workers = self.server.workers();
            workers.iter().any(|w| w["worker_id"] == id && capability_types(w).len() == job_types.len()).then_some(())
        });
        assert!(
            registered.is_some(),
            "{id} did not register: {:?}\n{}",
            self.server.workers(),
            seaweedfs::log_tail(&self.worker_log(id))
        );
        process
    }

    fn handler_of(&self, worker_id: &str) -> String {
        let workers = self.server.workers();
        let worker = workers.iter().find(|w| w["worker_id"] == worker_id).expect("the worker is listed");
        worker["handler"].as_str().unwrap_or_default().to_string()
    }

    fn write_job(&self, job: &Value) -> PathBuf {
        let path = self.dir.path().join(format!("{}.json", job["name"].as_str().unwrap()));
        std::fs::write(&path, serde_json::to_vec_pretty(job).unwrap()).unwrap();
        path
    }

    /// `submit FILE --wait --json`: the final job (id, state, tasks).
    fn submit_and_wait(&self, job: &Value) -> Value {
        let path = self.write_job(job);
        let output = self.server.cli(&["submit", path.to_str().unwrap(), "--wait", "--json"]);
        let stdout = String::from_utf8_lossy(&output.stdout);
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
            panic!("submit printed no JSON ({e}): {stdout}\nstderr: {}", String::from_utf8_lossy(&output.stderr))
        })
    }

    /// `submit FILE --json` without waiting: the job id.
    fn submit(&self, job: &Value) -> String {
        let path = self.write_job(job);
        let answer = self.server.cli_json(&["submit", path.to_str().unwrap(), "--json"]);
        answer["job_id"].as_str().expect("job_id").to_string()
    }

    /// `job ID --json`: every task with its attempt, handler, times, output.
    fn job(&self, id: &str) -> Value {
        self.server.cli_json(&["job", id, "--json"])
    }

    /// What to print when an assertion about a job fails.
    fn context(&self, worker_ids: &[&str]) -> String {
        let mut out = String::new();
        for id in worker_ids {
            out.push_str(&format!("== {id}\n{}\n", seaweedfs::log_tail(&self.worker_log(id))));
        }
        out.push_str(&format!("== server\n{}\n", seaweedfs::log_tail(&self.server.log)));
        out
    }
}

/// Waits until the job has ended (succeeded, failed or canceled) and returns it.
fn wait_for_end(setup: &Setup, job_id: &str, patience: Duration) -> Value {
    let ended = wait_until(patience, || {
        let job = setup.job(job_id);
        matches!(job["state"].as_str(), Some("succeeded" | "failed" | "canceled")).then_some(job)
    });
    ended.unwrap_or_else(|| panic!("the job did not end: {}\n{}", setup.job(job_id), setup.context(&[])))
}

/// One volume of `collection` with 40 files of 64 KiB, half of them
/// deleted, once the master knows of the deletions: the volume and the files kept.
fn half_garbage(cluster: &Cluster, collection: &str) -> (seaweedfs::Volume, Vec<StoredFile>) {
    let files = cluster.write_files_to_one_volume(40, 64, collection);
    let id = files[0].volume_id;
    let (_, kept) = cluster.delete_percent(&files, 50);
    let volume =
        cluster.wait_for("the deletions reach the master", |t| t.volume(id).filter(|v| v.delete_count == 20).cloned());
    (volume, kept)
}

/// A job of one task, `vacuum`, of `volume` in `collection`, with `more` parameters.
fn one_vacuum(name: &str, volume: &seaweedfs::Volume, collection: &str, more: Value) -> Value {
    let mut parameters = json!({"volume_id": volume.id, "server": volume.server, "collection": collection});
    parameters.as_object_mut().unwrap().extend(more.as_object().cloned().unwrap_or_default());
    json!({
        "name": name,
        "tasks": [{"id": "vacuum", "job_type": "vacuum", "labels": {"volume_id": volume.id.to_string()},
                   "parameters": parameters}]
    })
}

fn capability_types(worker: &Value) -> Vec<String> {
    worker["capabilities"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["job_type"].as_str().map(String::from))
        .collect()
}

fn task<'a>(job: &'a Value, id: &str) -> &'a Value {
    job["tasks"]
        .as_array()
        .and_then(|tasks| tasks.iter().find(|t| t["id"] == id))
        .unwrap_or_else(|| panic!("no task {id} in {job}"))
}

fn bytes_param(bytes: &[u8]) -> Value {
    json!({ "$bytes": task_params::hex(bytes) })
}

/// The files of `volume_id` still read back with what was written.
fn assert_readable(cluster: &Cluster, files: &[StoredFile], volume_id: u32) {
    let on_volume: Vec<&StoredFile> = files.iter().filter(|f| f.volume_id == volume_id).collect();
    assert!(!on_volume.is_empty(), "no kept file on volume {volume_id}");
    for file in on_volume {
        let data = cluster.read(file).unwrap_or_else(|e| panic!("read {}: {e}", file.fid));
        assert!(data == file.content(), "{} reads back {} bytes, not the {} written", file.fid, data.len(), file.len);
    }
}

#[test]
fn a_vacuum_submitted_by_hand_reclaims_the_garbage_of_a_volume() {
    let started = Instant::now();
    let setup = Setup::start(ClusterOptions::default());
    let cluster = &setup.cluster;
    let _worker = setup.start_weed_worker("weed-vacuum");
    eprintln!("cluster, server and worker up in {:?}", started.elapsed());

    // Files spread over the volumes the master grows; 60% deleted.
    let files = cluster.write_files(120, 64, "");
    let (deleted, kept) = cluster.delete_percent(&files, 60);
    // One more volume, with a fifth of its files deleted: below the loose
    // path's 0.3 threshold.
    let cool = cluster.write_files_to_one_volume(10, 64, "cool");
    let (_, cool_kept) = cluster.delete_percent(&cool, 20);
    let cool_id = cool[0].volume_id;

    let n_deleted_on = |id: u32| deleted.iter().filter(|f| f.volume_id == id).count() as u64;
    let before = cluster.wait_for("the deletions reach the master", |t| {
        let settled = t.volumes.iter().all(|v| v.delete_count == n_deleted_on(v.id) || v.collection == "cool")
            && t.volume(cool_id).is_some_and(|v| v.delete_count == 2);
        settled.then(|| t.clone())
    });
    let volume = before
        .volumes
        .iter()
        .filter(|v| v.collection.is_empty() && v.garbage_ratio() > 0.4)
        .max_by_key(|v| v.deleted_bytes)
        .unwrap_or_else(|| panic!("no volume with garbage: {before:#?}"))
        .clone();
    let id = volume.id;

    // 1. The loose parameters: volume_id, server, collection.
    let job = setup.submit_and_wait(&json!({
        "name": format!("vacuum-{id}"),
        "tasks": [{"id": format!("vacuum-{id}"), "job_type": "vacuum",
                   "parameters": {"volume_id": id, "server": volume.server, "collection": ""}}]
    }));
    assert_eq!(job["state"], "succeeded", "{job}\n{}", setup.context(&["weed-vacuum"]));

    // The volume server compacted it: no deleted bytes, smaller by about as much.
    let server = cluster.volume_server(&volume.server);
    let now = server.volumes().into_iter().find(|v| v.id == id).expect("the volume is still on its server");
    eprintln!(
        "vacuum-{id}: size {} garbage {:.2} -> size {} deleted bytes {} ({:?})",
        volume.size,
        volume.garbage_ratio(),
        now.size,
        now.deleted_bytes,
        started.elapsed()
    );
    assert_eq!(now.deleted_bytes, 0, "garbage left on the volume server: {now:?}");
    assert!(now.size + volume.deleted_bytes / 2 <= volume.size, "size {} -> {}", volume.size, now.size);
    // The master learns it from the next heartbeat.
    cluster.wait_for(&format!("volume {id} vacuumed at the master"), |t| {
        t.volume(id).filter(|v| v.deleted_bytes == 0 && v.size < volume.size).map(|_| ())
    });
    // The kept files survived the compaction; the deleted ones are gone.
    assert_readable(cluster, &kept, id);
    let gone = deleted.iter().find(|f| f.volume_id == id).expect("a deleted file of the volume");
    assert!(cluster.read(gone).is_err(), "{} was deleted but reads back", gone.fid);
    // Nothing else was vacuumed.
    let other = before.volumes.iter().find(|v| v.id != id && v.deleted_bytes > 0).expect("another volume with garbage");
    let other_now = cluster.volume_server(&other.server).volumes().into_iter().find(|v| v.id == other.id).unwrap();
    assert_eq!(other_now.deleted_bytes, other.deleted_bytes, "volume {} was vacuumed too", other.id);

    // 2. Below 0.3 the loose path skips the volume, and still succeeds.
    let cool_volume = before.volume(cool_id).unwrap().clone();
    assert!(cool_volume.garbage_ratio() > 0.1 && cool_volume.garbage_ratio() < 0.3, "{cool_volume:?}");
    let job = setup.submit_and_wait(&json!({
        "name": format!("vacuum-{cool_id}-loose"),
        "tasks": [{"id": format!("vacuum-{cool_id}"), "job_type": "vacuum",
                   "parameters": {"volume_id": cool_id, "server": cool_volume.server, "collection": "cool"}}]
    }));
    assert_eq!(job["state"], "succeeded", "{job}");
    let cool_server = cluster.volume_server(&cool_volume.server);
    let cool_now = cool_server.volumes().into_iter().find(|v| v.id == cool_id).unwrap();
    assert_eq!(cool_now.deleted_bytes, cool_volume.deleted_bytes, "the loose path vacuumed below 0.3");

    // 3. task_params_pb carries a threshold of its own.
    let params = task_params::vacuum(cool_id, "cool", std::slice::from_ref(&cool_volume.server), 0.05);
    let job = setup.submit_and_wait(&json!({
        "name": format!("vacuum-{cool_id}-pb"),
        "tasks": [{"id": format!("vacuum-{cool_id}"), "job_type": "vacuum",
                   "parameters": {"volume_id": cool_id, "server": cool_volume.server, "collection": "cool",
                                  "task_params_pb": bytes_param(&params)}}]
    }));
    assert_eq!(job["state"], "succeeded", "{job}");
    let cool_now = cool_server.volumes().into_iter().find(|v| v.id == cool_id).unwrap();
    assert_eq!(cool_now.deleted_bytes, 0, "task_params_pb with threshold 0.05 left garbage: {cool_now:?}");
    assert_readable(cluster, &cool_kept, cool_id);
    eprintln!("vacuum test done in {:?}", started.elapsed());
}

#[test]
fn a_vacuum_then_an_erasure_coding_of_the_same_volume_run_in_order() {
    let started = Instant::now();
    let setup = Setup::start(ClusterOptions { volume_size_limit_mb: 16, ..ClusterOptions::default() });
    let cluster = &setup.cluster;
    let _worker = setup.start_weed_worker("weed-ec");

    // A full and quiet volume, as erasure coding detection wants one; then
    // half of it deleted so that the vacuum has work.
    let full = cluster.fill_volume("ec", 512, Duration::from_secs(2));
    let id = full.volume.id;
    let source = full.volume.server.clone();
    let (_, kept) = cluster.delete_percent(&full.files, 50);
    let before = cluster
        .wait_for("the deletions reach the master", |t| t.volume(id).filter(|v| v.garbage_ratio() > 0.3).cloned());
    let targets = cluster.volume_server_addresses();
    eprintln!(
        "volume {id}: {} files, full at {} bytes, garbage {:.2} after deleting half ({:?})",
        full.files.len(),
        full.volume.size,
        before.garbage_ratio(),
        started.elapsed()
    );

    // By loose parameters, erasure coding wants 14 distinct target servers:
    // four are refused before anything is touched.
    let job = setup.submit_and_wait(&json!({
        "name": format!("ec-{id}-loose"),
        "tasks": [{"id": format!("ec-{id}"), "job_type": "erasure_coding", "retry_limit": 0,
                   "parameters": {"volume_id": id, "source_server": source, "collection": "ec",
                                  "target_servers": targets}}]
    }));
    assert_eq!(job["state"], "failed", "{job}");
    let error = task(&job, &format!("ec-{id}"))["error"].as_str().unwrap_or_default().to_string();
    assert!(error.contains("insufficient target_servers: got 4, need at least 14"), "{error}");
    let untouched = cluster.topology();
    let volume = untouched.volume(id).expect("the volume is still there");
    assert!(!volume.read_only, "{volume:?}");

    // Vacuum, then erasure coding with task_params_pb: 14 shards dealt over
    // the four servers.
    let vacuum_id = format!("vacuum-{id}");
    let ec_id = format!("ec-{id}");
    let params = task_params::erasure_coding(id, "ec", &source, &targets);
    let job = setup.submit_and_wait(&json!({
        "name": format!("vacuum-then-ec-{id}"),
        "tasks": [
            {"id": vacuum_id, "job_type": "vacuum",
             "parameters": {"volume_id": id, "server": source, "collection": "ec"}},
            {"id": ec_id, "job_type": "erasure_coding", "depends_on": [vacuum_id],
             "parameters": {"volume_id": id, "source_server": source, "collection": "ec",
                            "task_params_pb": bytes_param(&params)}}
        ]
    }));
    assert_eq!(job["state"], "succeeded", "{job}\n{}", setup.context(&["weed-ec"]));
    let job = setup.job(job["id"].as_str().unwrap());
    let (vacuum, ec) = (task(&job, &vacuum_id), task(&job, &ec_id));
    let vacuum_finished = vacuum["finished_at_ms"].as_i64().unwrap_or(0);
    let ec_started = ec["started_at_ms"].as_i64().unwrap_or(0);
    assert!(
        vacuum_finished > 0 && ec_started >= vacuum_finished,
        "ec started {ec_started}, vacuum finished {vacuum_finished}"
    );
    assert_eq!(vacuum["attempt"], 1);
    assert_eq!(ec["attempt"], 1);
    let output = |t: &Value| t["output"].as_array().map(|o| format!("{o:?}")).unwrap_or_default();
    assert!(output(vacuum).contains(&format!("vacuum completed for volume {id}")), "{}", output(vacuum));
    assert!(output(ec).contains(&format!("erasure coding completed for volume {id}")), "{}", output(ec));

    // The master no longer has the volume, only its 14 shards, on every server.
    let after = cluster.wait_for(&format!("volume {id} as EC shards"), |t| {
        (t.volume(id).is_none() && t.total_ec_shards() >= 14).then(|| t.clone())
    });
    assert!(after.ec_shard_counts.values().all(|&n| n >= 3), "{:?}", after.ec_shard_counts);
    let ec_volumes = cluster.ec_shards();
    let ec_volume = ec_volumes.get(&id).unwrap_or_else(|| panic!("no EC shards of volume {id}: {ec_volumes:?}"));
    let mut all: Vec<u32> = ec_volume.shards.values().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..14).collect::<Vec<u32>>(), "{ec_volume:?}");
    assert_eq!(ec_volume.shards.len(), 4, "{ec_volume:?}");
    // The vacuum ran first: the ten data shards (1 MiB blocks) hold the
    // half that was kept, less than the volume held before the vacuum.
    let data_bytes = ec_volume.bytes * 10 / 14;
    assert!(data_bytes < before.size, "data shards {data_bytes} bytes, volume before the vacuum {}", before.size);
    assert_readable(cluster, &kept, id);
    eprintln!(
        "vacuum-then-ec-{id}: vacuum {} ms, ec {} ms, shards {} bytes; test done in {:?}",
        vacuum_finished - vacuum["started_at_ms"].as_i64().unwrap_or(0),
        ec["finished_at_ms"].as_i64().unwrap_or(0) - ec_started,
        ec_volume.bytes,
        started.elapsed()
    );
}

#[test]
fn a_weed_worker_killed_during_a_vacuum_loses_its_attempt_and_a_second_worker_runs_it() {
    let started = Instant::now();
    let setup = Setup::start(ClusterOptions::default());
    let cluster = &setup.cluster;
    let mut first = setup.start_weed_worker("weed-first");
    let first_handler = setup.handler_of("weed-first");

    let (volume, kept) = half_garbage(cluster, "kill");
    let id = volume.id;
    let server = cluster.volume_server(&volume.server);

    // The volume server is stopped: the worker's vacuum check waits on it,
    // so the task stays running for as long as the test needs.
    let frozen = server.freeze();
    let task_id = format!("vacuum-{id}");
    let job_id = setup.submit(&json!({
        "name": format!("interrupted-vacuum-{id}"),
        "tasks": [{"id": task_id, "job_type": "vacuum",
                   "parameters": {"volume_id": id, "server": volume.server, "collection": "kill"}}]
    }));
    let running = wait_until(WAIT, || {
        let job = setup.job(&job_id);
        let t = task(&job, &task_id);
        (t["state"] == "running" && t["progress_percent"].as_f64().unwrap_or(0.0) >= 10.0).then(|| t.clone())
    });
    let running = running.unwrap_or_else(|| panic!("{}\n{}", setup.job(&job_id), setup.context(&["weed-first"])));
    assert_eq!(running["attempt"], 1);
    assert_eq!(running["handler"], first_handler.as_str());
    std::thread::sleep(Duration::from_millis(500));
    let still = setup.job(&job_id);
    assert_eq!(task(&still, &task_id)["state"], "running", "{still}");
    first.kill();
    eprintln!("killed weed-first while {task_id} ran (stage {:?}) at {:?}", running["stage"], started.elapsed());

    // The attempt is lost with its stream: the task waits, nothing runs.
    let lost = wait_until(WAIT, || {
        let job = setup.job(&job_id);
        let t = task(&job, &task_id).clone();
        (t["state"] != "running" && t["lost"] == 1).then_some((job, t))
    });
    let (job, lost) = lost.unwrap_or_else(|| panic!("the attempt was not lost: {}", setup.job(&job_id)));
    assert_eq!(job["state"], "running", "the job ended without a worker: {job}");
    assert_ne!(lost["state"], "failed", "{lost}");
    eprintln!("{task_id} lost its attempt and is {} at {:?}", lost["state"], started.elapsed());
    assert!(setup.server.workers().is_empty(), "{:?}", setup.server.workers());
    drop(frozen);

    // A second worker runs it again, as attempt 2, to the end.
    let _second = setup.start_weed_worker("weed-second");
    let second_handler = setup.handler_of("weed-second");
    let job = wait_for_end(&setup, &job_id, WAIT);
    assert_eq!(job["state"], "succeeded", "{job}\n{}", setup.context(&["weed-first", "weed-second"]));
    let t = task(&job, &task_id);
    assert_eq!(t["attempt"], 2, "{t}");
    assert_eq!(t["lost"], 1, "{t}");
    assert_eq!(t["failures"], 0, "{t}");
    assert_eq!(t["handler"], second_handler.as_str(), "{t}");
    let listed = setup.server.cli_json(&["jobs", "--json"]);
    let unfinished: Vec<&Value> =
        listed.as_array().into_iter().flatten().filter(|j| j["state"] != "succeeded").collect();
    assert!(unfinished.is_empty(), "{unfinished:?}");

    // The second attempt really vacuumed the volume.
    let now = server.volumes().into_iter().find(|v| v.id == id).expect("the volume is still on its server");
    assert_eq!(now.deleted_bytes, 0, "{now:?}");
    assert!(now.size < volume.size, "{} -> {}", volume.size, now.size);
    assert!(!now.read_only, "{now:?}");
    assert_readable(cluster, &kept, id);
    eprintln!("{task_id} succeeded as attempt 2; test done in {:?}", started.elapsed());
}

/// The main job: jobcenter's own scheduler asks the weed worker what needs
/// vacuum, makes the run one job, and the garbage is really reclaimed.
#[test]
fn the_scheduler_detects_and_runs_vacuum_on_its_own() {
    let started = Instant::now();
    let setup = Setup::start(ClusterOptions::default());
    let cluster = &setup.cluster;
    let _worker = setup.start_weed_worker("weed-scheduled");
    // A fifth of the files deleted: below the worker's default vacuum
    // threshold (0.3), above the one set through jobcenter's policy.
    let files = cluster.write_files(120, 64, "");
    let (deleted, kept) = cluster.delete_percent(&files, 20);
    let n_deleted_on = |id: u32| deleted.iter().filter(|f| f.volume_id == id).count() as u64;
    let before = cluster.wait_for("the deletions reach the master", |t| {
        t.volumes.iter().all(|v| v.delete_count == n_deleted_on(v.id)).then(|| t.clone())
    });
    let dirty: Vec<_> = before.volumes.iter().filter(|v| v.garbage_ratio() > 0.1).cloned().collect();
    assert!(!dirty.is_empty(), "no volume with garbage: {before:#?}");
    let below_default = dirty.iter().filter(|v| v.garbage_ratio() < 0.3).count();
    assert!(below_default > 0, "every volume is above the default threshold: {dirty:#?}");

    // Threshold lowered and detection on, every 2 s: the scheduler does the rest.
    let lowered = setup.server.cli(&["policy", "set", "vacuum", "worker.garbage_threshold=0.1"]);
    assert!(lowered.status.success(), "{}", String::from_utf8_lossy(&lowered.stderr));
    let policy = setup.server.cli_json(&["policy", "get", "vacuum", "--json"]);
    assert_eq!(policy["worker_config"]["garbage_threshold"], "0.1", "{policy}");
    let on = setup.server.cli(&["policy", "set", "vacuum", "detection_enabled=1", "detection_interval_seconds=2"]);
    assert!(on.status.success(), "{}", String::from_utf8_lossy(&on.stderr));
    let job = wait_until(Duration::from_secs(90), || {
        let jobs = setup.server.cli_json(&["jobs", "--json"]);
        jobs.as_array()?
            .iter()
            .find(|j| j["name"].as_str().unwrap_or("").starts_with("vacuum-") && j["state"] == "succeeded")
            .cloned()
    })
    .unwrap_or_else(|| panic!("no scheduled vacuum job succeeded\n{}", setup.context(&["weed-scheduled"])));
    let job = setup.job(job["id"].as_str().unwrap());
    assert!(job["origin"].as_str().unwrap().starts_with("scheduler:vacuum:"), "{}", job["origin"]);
    for volume in &dirty {
        let server = cluster.volume_server(&volume.server);
        let reclaimed = wait_until(Duration::from_secs(60), || {
            let now = server.volumes().into_iter().find(|v| v.id == volume.id)?;
            (now.deleted_bytes == 0).then_some(now)
        });
        assert!(reclaimed.is_some(), "volume {} kept its garbage: {job}", volume.id);
    }
    for volume in &dirty {
        assert_readable(cluster, &kept, volume.id);
    }
    let runs = setup.server.cli_json(&["runs", "vacuum", "--json"]);
    let succeeded = runs["succeeded"].as_array().unwrap();
    let run = succeeded.iter().find(|r| r["job_id"] == job["id"]).unwrap_or_else(|| panic!("{runs}"));
    // From the detection being due to the last vacuum finishing, against the
    // workers' own execution time.
    let tasks = job["tasks"].as_array().unwrap();
    let last_end = tasks.iter().filter_map(|t| t["finished_at_ms"].as_i64()).max().unwrap();
    let executing: i64 =
        tasks.iter().map(|t| t["finished_at_ms"].as_i64().unwrap() - t["started_at_ms"].as_i64().unwrap()).sum();
    eprintln!(
        "scheduled vacuum: {} tasks; detection due to last vacuum finished {} ms (detection {} ms); \
         execution {} ms summed; {:?} in all",
        tasks.len(),
        last_end - run["at_ms"].as_i64().unwrap(),
        run["duration_ms"],
        executing,
        started.elapsed()
    );
}

/// Turns a job type's detection on (every 2 s) or off, with `changes` beside it.
fn detection(setup: &Setup, job_type: &str, on: bool, changes: &[&str]) {
    let enabled = format!("detection_enabled={}", u8::from(on));
    let mut args = vec!["policy", "set", job_type, enabled.as_str(), "detection_interval_seconds=2"];
    args.extend_from_slice(changes);
    let output = setup.server.cli(&args);
    assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
}

/// The first job the scheduler made for `job_type` that succeeded, in full.
fn scheduled_success(setup: &Setup, job_type: &str, patience: Duration) -> Value {
    let prefix = format!("{job_type}-");
    let found = wait_until(patience, || {
        let jobs = setup.server.cli_json(&["jobs", "--json", "--origin", "scheduler"]);
        jobs.as_array()?
            .iter()
            .find(|j| j["name"].as_str().unwrap_or("").starts_with(&prefix) && j["state"] == "succeeded")
            .cloned()
    });
    let job = found.unwrap_or_else(|| {
        let jobs = setup.server.cli_json(&["jobs", "--json", "--origin", "scheduler"]);
        let activity = setup.server.cli(&["activities"]);
        panic!(
            "no scheduled {job_type} job succeeded: {jobs}\n{}\n{}",
            String::from_utf8_lossy(&activity.stdout),
            setup.context(&["weed-all"])
        )
    });
    let job = setup.job(job["id"].as_str().unwrap());
    assert!(job["origin"].as_str().unwrap().starts_with(&format!("scheduler:{job_type}:")), "{}", job["origin"]);
    job
}

/// Every shard id of the EC volume once, and how many shards each server holds.
fn shard_spread(cluster: &Cluster, id: u32) -> Option<BTreeMap<String, usize>> {
    let volumes = cluster.ec_shards();
    let volume = volumes.get(&id)?;
    let mut all: Vec<u32> = volume.shards.values().flatten().copied().collect();
    all.sort_unstable();
    (all == (0..14).collect::<Vec<u32>>())
        .then(|| volume.shards.iter().map(|(s, ids)| (s.clone(), ids.len())).collect())
}

#[test]
fn the_scheduler_detects_and_runs_erasure_coding_ec_balance_and_an_admin_script() {
    let started = Instant::now();
    let mut setup =
        Setup::start(ClusterOptions { volume_servers: 5, volume_size_limit_mb: 16, ..ClusterOptions::default() });
    let _worker = setup.start_weed_worker("weed-all");

    // The fifth server is down while the volume is written and encoded: the
    // fourteen shards land on the other four, which leaves work for ec_balance.
    setup.cluster.stop_volume_server(4);
    let fifth = setup.cluster.volume_servers[4].address();
    let files = setup.cluster.write_files_to_one_volume(40, 64, "ecs");
    let id = files[0].volume_id;
    setup.cluster.wait_for("the volume's size reaches the master", |t| {
        t.volume(id).filter(|v| v.size > 2 * 1024 * 1024).cloned()
    });

    // erasure_coding: quiet at once, and small volumes count as full.
    detection(
        &setup,
        "erasure_coding",
        true,
        &[
            "worker.quiet_for_seconds=0",
            "worker.fullness_ratio=0.01",
            "worker.min_size_mb=1",
            "admin.collection_filter=ecs",
        ],
    );
    let encoded = scheduled_success(&setup, "erasure_coding", Duration::from_secs(120));
    detection(&setup, "erasure_coding", false, &[]);
    let encoded_tasks = encoded["tasks"].as_array().unwrap();
    assert_eq!(encoded_tasks.len(), 1, "{encoded}");
    assert_eq!(encoded_tasks[0]["labels"]["volume_id"], id.to_string(), "{encoded}");
    let spread = setup.cluster.wait_for(&format!("volume {id} as 14 EC shards"), |t| {
        t.volume(id).is_none().then(|| shard_spread(&setup.cluster, id)).flatten()
    });
    assert_eq!(spread.len(), 4, "{spread:?}");
    assert!(!spread.contains_key(&fifth), "{spread:?}");
    assert_readable(&setup.cluster, &files, id);
    eprintln!("erasure_coding through the scheduler: volume {id} as {spread:?} ({:?})", started.elapsed());

    // ec_balance: with the fifth server back, shards move to it.
    setup.cluster.restart_volume_server(4);
    detection(&setup, "ec_balance", true, &[]);
    let balanced = scheduled_success(&setup, "ec_balance", Duration::from_secs(120));
    let spread = setup.cluster.wait_for(&format!("shards of volume {id} on the fifth server"), |_| {
        shard_spread(&setup.cluster, id).filter(|s| s.contains_key(&fifth))
    });
    detection(&setup, "ec_balance", false, &[]);
    assert!(spread.values().all(|&n| n <= 4), "{spread:?}");
    assert_readable(&setup.cluster, &files, id);
    eprintln!(
        "ec_balance through the scheduler: {} move(s), now {spread:?} ({:?})",
        balanced["tasks"].as_array().unwrap().len(),
        started.elapsed()
    );

    // admin_script: shell commands, run by the worker under jobcenter's
    // cluster lock, with their effect on the master.
    let plain = setup.cluster.write_files_to_one_volume(2, 4, "");
    let plain_id = plain[0].volume_id;
    let holder = setup.cluster.topology().volume(plain_id).expect("the plain volume").server.clone();
    let script = format!("volume.mark -node={holder} -volumeId={plain_id} -readonly;cluster.status");
    detection(&setup, "admin_script", true, &[&format!("admin.script={script}"), "admin.run_interval_minutes=60"]);
    let scripted = scheduled_success(&setup, "admin_script", Duration::from_secs(120));
    detection(&setup, "admin_script", false, &[]);
    let output = scripted["tasks"][0]["output"].as_array().map(|o| format!("{o:?}")).unwrap_or_default();
    assert!(output.contains("LOCKED by jobcenter"), "{output}");
    setup
        .cluster
        .wait_for(&format!("volume {plain_id} read-only"), |t| t.volume(plain_id).filter(|v| v.read_only).cloned());
    // One run per interval: the detections after it propose nothing.
    let runs = setup.server.cli_json(&["runs", "admin_script", "--json"]);
    let with_job = runs["succeeded"].as_array().unwrap().iter().filter(|r| !r["job_id"].is_null()).count();
    assert_eq!(with_job, 1, "{runs}");
    eprintln!("admin_script through the scheduler: done ({:?})", started.elapsed());
}

#[test]
fn the_scheduler_balances_volumes_piled_on_one_server() {
    let started = Instant::now();
    let setup = Setup::start(ClusterOptions::default());
    let cluster = &setup.cluster;
    let _worker = setup.start_weed_worker("weed-all");
    // Four volumes of one collection, all grown on the first server.
    let crowded = cluster.volume_servers[0].address();
    let grow = format!("/vol/grow?count=4&collection=bal&dataCenter=dc1&rack=rack1&dataNode={crowded}&replication=000");
    let grown = seaweedfs::http("GET", &cluster.master_address(), &grow, None).expect("vol/grow");
    assert!(grown.is_success(), "{}", grown.text());
    let files = cluster.write_files(24, 16, "bal");
    let on = |t: &seaweedfs::Topology, server: &str| {
        t.volumes.iter().filter(|v| v.collection == "bal" && v.server == server).count()
    };
    let before = cluster.wait_for("the four volumes on one server", |t| (on(t, &crowded) == 4).then(|| t.clone()));
    assert!(before.volumes.iter().filter(|v| v.collection == "bal").all(|v| v.server == crowded), "{before:#?}");

    detection(&setup, "volume_balance", true, &["admin.collection_filter=bal"]);
    // A move waits for its source to be idle a while: about two minutes each.
    let job = scheduled_success(&setup, "volume_balance", Duration::from_secs(400));
    detection(&setup, "volume_balance", false, &[]);
    let servers = cluster.volume_server_addresses();
    let spread = cluster.wait_for("volumes moved off the crowded server", |t| {
        let spread: BTreeMap<String, usize> = servers.iter().map(|s| (s.clone(), on(t, s))).collect();
        (spread[&crowded] < 4 && spread.values().sum::<usize>() == 4).then_some(spread)
    });
    assert!(spread.values().all(|&n| n <= 2), "{spread:?}\n{job}");
    for id in files.iter().map(|f| f.volume_id).collect::<std::collections::BTreeSet<_>>() {
        assert_readable(cluster, &files, id);
    }
    let tasks = job["tasks"].as_array().unwrap();
    let moved: i64 = tasks
        .iter()
        .map(|t| t["finished_at_ms"].as_i64().unwrap() - t["started_at_ms"].as_i64().unwrap())
        .max()
        .unwrap();
    eprintln!(
        "volume_balance through the scheduler: {} task(s), {spread:?}, longest {moved} ms ({:?})",
        tasks.len(),
        started.elapsed()
    );
}

/// An encode submitted by hand: one volume of `collection` with `count`
/// files of 64 KiB, encoded by `task_params_pb` over every server; its one
/// task `ec` is labelled with the volume and with the dedupe key the
/// detector gives it (`erasure_coding:VOLUME:COLLECTION`).
struct Encode {
    job_id: String,
    id: u32,
    source: String,
    files: Vec<StoredFile>,
}

fn submit_encode(setup: &Setup, collection: &str, count: usize) -> Encode {
    let cluster = &setup.cluster;
    let files = cluster.write_files_to_one_volume(count, 64, collection);
    let id = files[0].volume_id;
    let source = cluster.wait_for("the volume at the master", |t| t.volume(id).cloned()).server;
    let params = task_params::erasure_coding(id, collection, &source, &cluster.volume_server_addresses());
    let labels = json!({"volume_id": id.to_string(), "dedupe_key": format!("erasure_coding:{id}:{collection}")});
    let job_id = setup.submit(&json!({
        "name": format!("ec-{collection}-{id}"),
        "tasks": [{"id": "ec", "job_type": "erasure_coding", "labels": labels,
                   "parameters": {"volume_id": id, "source_server": source, "collection": collection,
                                  "task_params_pb": bytes_param(&params)}}]
    }));
    Encode { job_id, id, source, files }
}

/// Holds a running encode while it distributes its shards: once the worker
/// has cleared stale state and copies the volume (25%), one target other
/// than the source is stopped, and the shards then wait on it. Returns the
/// stopped server's guard (SIGCONT when dropped) and the stage reached.
fn hold_while_distributing(setup: &Setup, encode: &Encode, worker: &str) -> (seaweedfs::Frozen, String) {
    let progress = || {
        let t = seaweedfs::get_json(&setup.server.http, &format!("/api/jobs/{}/tasks/ec", encode.job_id));
        (t["progress_percent"].as_f64().unwrap_or(0.0), t["stage"].as_str().unwrap_or("").to_string())
    };
    let context = || format!("{}\n{}", setup.job(&encode.job_id), setup.context(&[worker]));
    let copying = wait_until(WAIT, || (progress().0 >= 25.0).then_some(()));
    assert!(copying.is_some(), "{}", context());
    let targets = setup.cluster.volume_server_addresses();
    let stuck = targets.iter().find(|t| **t != encode.source).unwrap();
    let frozen = setup.cluster.volume_server(stuck).freeze();
    let halfway = wait_until(WAIT, || {
        let (_, stage) = progress();
        stage.contains("Distributing").then_some(stage)
    });
    (frozen, halfway.unwrap_or_else(|| panic!("{}", context())))
}

/// The first of the last 500 activity messages that `wanted` accepts,
/// waited for up to a minute.
fn activity_matching(setup: &Setup, wanted: impl Fn(&str) -> bool) -> Option<String> {
    wait_until(Duration::from_secs(60), || {
        let activities = setup.server.cli_json(&["activities", "--json", "--limit", "500"]);
        let messages = activities.as_array()?.iter().filter_map(|a| a["message"].as_str().map(String::from));
        messages.into_iter().find(|m| wanted(m))
    })
}

/// The names of a descriptor form's fields, from `/api/job-types/TYPE`.
fn form_fields(job_type: &Value, form: &str) -> Vec<String> {
    job_type["descriptor"][form]["sections"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["fields"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f["name"].as_str().map(String::from))
        .collect()
}

#[test]
fn lifecycle_and_iceberg_workers_register_and_lifecycle_runs_on_its_share_of_the_delete_budget() {
    let started = Instant::now();
    let mut cluster = Cluster::start(ClusterOptions { volume_servers: 1, ..ClusterOptions::default() });
    cluster.start_filer();
    let setup = Setup::on(cluster);
    // No detection before the budget is set (s3_lifecycle's descriptor turns it on).
    for job_type in ["s3_lifecycle", "iceberg_maintenance"] {
        detection(&setup, job_type, false, &[]);
    }
    let _first = setup.start_weed_worker_with("lifecycle-1", &["s3_lifecycle", "iceberg_maintenance"]);
    let _second = setup.start_weed_worker_with("lifecycle-2", &["s3_lifecycle"]);

    // Their descriptors are stored, with their forms, and shown.
    let lifecycle = seaweedfs::get_json(&setup.server.http, "/api/job-types/s3_lifecycle");
    let admin_fields = form_fields(&lifecycle, "admin_config_form");
    assert!(admin_fields.iter().any(|f| f == "cluster_deletes_per_second"), "{lifecycle}");
    assert!(admin_fields.iter().any(|f| f == "cluster_deletes_burst"), "{lifecycle}");
    let iceberg = seaweedfs::get_json(&setup.server.http, "/api/job-types/iceberg_maintenance");
    assert!(!form_fields(&iceberg, "worker_config_form").is_empty(), "{iceberg}");
    assert!(!form_fields(&iceberg, "admin_config_form").is_empty(), "{iceberg}");
    let listed = seaweedfs::get_json(&setup.server.http, "/api/job-types");
    let entry = |t: &str| listed["job_types"].as_array().unwrap().iter().find(|j| j["job_type"] == t).cloned();
    assert_eq!(entry("s3_lifecycle").map(|e| e["executors"].clone()), Some(json!(2)), "{listed}");
    assert_eq!(entry("iceberg_maintenance").map(|e| e["has_descriptor"].clone()), Some(json!(true)), "{listed}");
    let described = setup.server.cli(&["policy", "get", "s3_lifecycle"]);
    assert!(String::from_utf8_lossy(&described.stdout).contains("admin.cluster_deletes_per_second"), "{described:?}");

    // An operator holds the cluster's `shell` lock throughout: the lifecycle
    // lane never waits for it (only the default lane does).
    let operator = OperatorLock::take(&setup.cluster.master_address());

    // 100 deletes/s and a burst of 10 for the cluster, two executors, at
    // most two jobs a detection: each execution gets half.
    detection(
        &setup,
        "s3_lifecycle",
        true,
        &["admin.cluster_deletes_per_second=100", "admin.cluster_deletes_burst=10", "max_jobs_per_detection=2"],
    );
    let job = scheduled_success(&setup, "s3_lifecycle", Duration::from_secs(120));
    detection(&setup, "s3_lifecycle", false, &[]);
    let task = &job["tasks"][0];
    let stage = task["stage"].as_str().unwrap_or_default();
    assert!(stage.contains("rate=50/s burst=5"), "{task}\n{}", setup.context(&["lifecycle-1", "lifecycle-2"]));
    let output = task["output"].as_array().map(|o| format!("{o:?}")).unwrap_or_default();
    assert!(output.contains("s3 lifecycle daily replay completed"), "{output}");
    assert_eq!(operator.holder(), "operator", "the operator's lock was never let go meanwhile");
    drop(operator);
    eprintln!("s3_lifecycle through the scheduler: stage {stage:?} ({:?})", started.elapsed());
}

/// The cluster's `shell` lock, held by an operator as `weed shell` holds it
/// (renewed every 2 s, the master's lease being 10 s) until dropped.
struct OperatorLock {
    runtime: tokio::runtime::Runtime,
    master: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl OperatorLock {
    fn take(master: &str) -> OperatorLock {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let address = format!("http://{}", jobcenter::server::seaweedfs::master::grpc_address(master).unwrap());
        let connect = jobcenter::proto::master::seaweed_client::SeaweedClient::connect(address.clone());
        let mut client = runtime.block_on(connect).expect("reach the master");
        let mut lease = runtime.block_on(seaweedfs::operator_lease(&mut client));
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        runtime.spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
                let renewal = seaweedfs::operator_lease_request(Some(&lease));
                if let Ok(renewed) = client.lease_admin_token(renewal).await {
                    lease = renewed.into_inner();
                }
            }
        });
        OperatorLock { runtime, master: address, stop: Some(stop) }
    }

    /// Who holds the lock now, by the master's word.
    fn holder(&self) -> String {
        self.runtime.block_on(seaweedfs::shell_lock_holder(&self.master))
    }
}

impl Drop for OperatorLock {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

#[test]
fn a_weed_worker_killed_halfway_through_an_encode_leaves_the_volume_encoded_exactly_once() {
    let started = Instant::now();
    let setup = Setup::start(ClusterOptions { volume_servers: 5, ..ClusterOptions::default() });
    let cluster = &setup.cluster;
    let mut first = setup.start_weed_worker("weed-first");
    // About 30 MB, so that copying and encoding it take a while.
    let encode = submit_encode(&setup, "eck", 480);
    let (job_id, id) = (encode.job_id.clone(), encode.id);
    let (frozen, halfway) = hold_while_distributing(&setup, &encode, "weed-first");
    std::thread::sleep(Duration::from_millis(500));
    first.kill();
    drop(frozen);
    eprintln!("killed weed-first during {halfway:?} at {:?}", started.elapsed());
    let lost = wait_until(WAIT, || {
        let job = setup.job(&job_id);
        (task(&job, "ec")["lost"] == 1).then_some(())
    });
    assert!(lost.is_some(), "the attempt was not lost: {}", setup.job(&job_id));

    // Another worker encodes it again, as attempt 2.
    let _second = setup.start_weed_worker("weed-second");
    let second_handler = setup.handler_of("weed-second");
    let job = wait_for_end(&setup, &job_id, Duration::from_secs(120));
    assert_eq!(job["state"], "succeeded", "{job}\n{}", setup.context(&["weed-first", "weed-second"]));
    let t = task(&job, "ec");
    assert_eq!((t["attempt"].clone(), t["lost"].clone()), (json!(2), json!(1)), "{t}");
    assert_eq!(t["handler"], second_handler.as_str(), "{t}");

    // Encoded exactly once: the volume is gone, each of the 14 shards is on
    // exactly one server, and the files read back.
    let spread = cluster.wait_for(&format!("volume {id} as 14 EC shards"), |t| {
        t.volume(id).is_none().then(|| shard_spread(cluster, id)).flatten()
    });
    assert_eq!(spread.values().sum::<usize>(), 14, "{spread:?}");
    // On disk too: no shard file of the interrupted run left beside them.
    let mut on_disk: Vec<u32> = Vec::new();
    for server in &cluster.volume_servers {
        for entry in std::fs::read_dir(&server.dir).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            // Shard files are .ec00 to .ec13 (beside them: .ecx, .ecj, .vif).
            let shard = name.strip_prefix(&format!("eck_{id}.ec")).filter(|s| s.len() == 2);
            if let Some(shard) = shard.and_then(|s| s.parse::<u32>().ok()) {
                on_disk.push(shard);
            }
        }
    }
    on_disk.sort_unstable();
    assert_eq!(on_disk, (0..14).collect::<Vec<u32>>(), "shard files on the servers' disks");
    assert_readable(cluster, &encode.files, id);
    eprintln!("volume {id} encoded once after the kill: {spread:?} ({:?})", started.elapsed());
}

#[test]
fn the_same_encode_from_a_submitted_job_and_the_scheduler_runs_once() {
    let started = Instant::now();
    let setup = Setup::start(ClusterOptions { volume_servers: 5, ..ClusterOptions::default() });
    let cluster = &setup.cluster;
    let _worker = setup.start_weed_worker("weed-all");
    // A submitted encode, carrying the dedupe key the detector gives the
    // same volume (about 30 MB, to be held halfway).
    let encode = submit_encode(&setup, "dup", 480);
    let (job_id, id) = (encode.job_id.clone(), encode.id);
    let key = format!("erasure_coding:{id}:dup");
    let (frozen, _) = hold_while_distributing(&setup, &encode, "weed-all");

    // The scheduler's detection proposes the same volume meanwhile: dropped.
    detection(
        &setup,
        "erasure_coding",
        true,
        &[
            "worker.quiet_for_seconds=0",
            "worker.fullness_ratio=0.01",
            "worker.min_size_mb=1",
            "admin.collection_filter=dup",
        ],
    );
    let dropped = activity_matching(&setup, |m| m.contains("dropped") && m.contains(&key));
    let dropped = dropped.unwrap_or_else(|| {
        let activity = setup.server.cli(&["activities"]);
        panic!("no detection dropped {key}:\n{}", String::from_utf8_lossy(&activity.stdout))
    });
    detection(&setup, "erasure_coding", false, &[]);
    drop(frozen);
    let job = wait_for_end(&setup, &job_id, Duration::from_secs(120));
    assert_eq!(job["state"], "succeeded", "{job}\n{}", setup.context(&["weed-all"]));

    // One encode ran: the scheduler made no job of its own for the volume,
    // and the 14 shards are there once each.
    let scheduled = setup.server.cli_json(&["jobs", "--json", "--origin", "scheduler"]);
    let runs: Vec<&Value> = scheduled.as_array().into_iter().flatten().collect();
    for run in &runs {
        let full = setup.job(run["id"].as_str().unwrap());
        let tasks = full["tasks"].as_array().unwrap();
        assert!(tasks.iter().all(|t| t["labels"]["dedupe_key"] != key.as_str()), "{full}");
    }
    let spread = cluster.wait_for(&format!("volume {id} as 14 EC shards"), |t| {
        t.volume(id).is_none().then(|| shard_spread(cluster, id)).flatten()
    });
    assert_readable(cluster, &encode.files, id);
    eprintln!("{dropped}\nvolume {id} encoded once: {spread:?} ({:?})", started.elapsed());
}

#[test]
fn a_hung_vacuum_worker_is_taken_for_silent_and_another_worker_vacuums_the_volume() {
    let started = Instant::now();
    let cluster = Cluster::start(ClusterOptions::default());
    let mut setup =
        Setup::with_args(cluster, &["--heartbeat", "1s", "--silence-timeout", "4s", "--recovery-interval", "1s"]);
    let cluster = &setup.cluster;
    let hung = setup.start_weed_worker("weed-hung");
    let (volume, kept) = half_garbage(cluster, "hung");
    let id = volume.id;
    let server = cluster.volume_server(&volume.server);

    // The vacuum is under way (its volume server answers slowly), then its
    // worker hangs (SIGSTOP): no heartbeat, no progress, its stream still open.
    let slow = server.freeze();
    let job_id = setup.submit(&one_vacuum(&format!("hung-vacuum-{id}"), &volume, "hung", json!({})));
    let running = wait_until(WAIT, || (task(&setup.job(&job_id), "vacuum")["state"] == "running").then_some(()));
    assert!(running.is_some(), "{}\n{}", setup.job(&job_id), setup.context(&["weed-hung"]));
    let stopped = seaweedfs::freeze(&hung);
    drop(slow);
    let _second = setup.start_weed_worker("weed-second");
    let second_handler = setup.handler_of("weed-second");

    // Silent past the timeout: its attempt is lost, and the other worker runs it.
    let job = wait_for_end(&setup, &job_id, Duration::from_secs(90));
    assert_eq!(job["state"], "succeeded", "{job}\n{}", setup.context(&["weed-second"]));
    let t = task(&job, "vacuum");
    assert_eq!((t["attempt"].clone(), t["lost"].clone()), (json!(2), json!(1)), "{t}");
    assert_eq!(t["handler"], second_handler.as_str(), "{t}");
    let silent_for = t["finished_at_ms"].as_i64().unwrap_or(0) - t["created_at_ms"].as_i64().unwrap_or(0);
    let clean = wait_until(WAIT, || server.volumes().into_iter().find(|v| v.id == id && v.deleted_bytes == 0));
    assert!(clean.is_some(), "volume {id} kept its garbage");
    assert_readable(cluster, &kept, id);

    // The hung worker wakes up; whatever it finishes late changes nothing
    // in jobcenter: the task stays the second worker's.
    drop(stopped);
    std::thread::sleep(Duration::from_secs(3));
    let after = setup.job(&job_id);
    assert_eq!(task(&after, "vacuum")["handler"], second_handler.as_str(), "{after}");
    assert_eq!(after["state"], "succeeded", "{after}");
    // Its vacuum's commit may still reach the volume server before the
    // worker sees its stream gone; SeaweedFS then fails that commit and
    // leaves the volume unloaded until the server starts again. No data
    // is lost either way: after a restart every kept file reads back.
    let late_commit = kept.iter().filter(|f| f.volume_id == id).any(|f| cluster.read(f).is_err());
    let index = cluster.volume_server_addresses().iter().position(|a| *a == volume.server).unwrap();
    setup.cluster.stop_volume_server(index);
    setup.cluster.restart_volume_server(index);
    let cluster = &setup.cluster;
    let clean = wait_until(WAIT, || {
        cluster.volume_server(&volume.server).volumes().into_iter().find(|v| v.id == id && v.deleted_bytes == 0)
    });
    assert!(clean.is_some(), "volume {id} is not clean after its server restarted");
    assert_readable(cluster, &kept, id);
    eprintln!(
        "hung worker: job ended {silent_for} ms after it was submitted; its late commit {} the volume ({:?})",
        if late_commit { "unloaded" } else { "did not reach" },
        started.elapsed()
    );
}

#[test]
fn a_master_restarted_during_an_encode_gets_its_lock_back_and_the_volume_is_encoded_once() {
    let started = Instant::now();
    let mut setup = Setup::start(ClusterOptions { volume_servers: 5, ..ClusterOptions::default() });
    let _worker = setup.start_weed_worker("weed-all");
    let encode = submit_encode(&setup, "mre", 480);
    let (job_id, id) = (encode.job_id.clone(), encode.id);
    let master_grpc = format!(
        "http://{}",
        jobcenter::server::seaweedfs::master::grpc_address(&setup.cluster.master_address()).unwrap()
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // Held while its shards go out, under jobcenter's lock.
    let (frozen, _) = hold_while_distributing(&setup, &encode, "weed-all");
    assert_eq!(runtime.block_on(seaweedfs::shell_lock_holder(&master_grpc)), "jobcenter");

    // The master restarts and has forgotten every lock: jobcenter's next
    // renewal of its lease is granted afresh, while the encode is still
    // under way (an operator's `weed shell` could have taken it first).
    setup.cluster.restart_master();
    let back = wait_until(Duration::from_secs(30), || {
        (runtime.block_on(seaweedfs::shell_lock_holder(&master_grpc)) == "jobcenter").then_some(())
    });
    assert!(back.is_some(), "jobcenter did not take the lock again\n{}", setup.context(&[]));
    assert_eq!(task(&setup.job(&job_id), "ec")["state"], "running");
    eprintln!("lock taken again after the master's restart ({:?})", started.elapsed());
    drop(frozen);
    setup.cluster.wait_for_volume_servers(5);

    // Nothing ran twice: one attempt, and each shard once.
    let job = wait_for_end(&setup, &job_id, Duration::from_secs(120));
    assert_eq!(job["state"], "succeeded", "{job}\n{}", setup.context(&["weed-all"]));
    let t = task(&job, "ec");
    assert_eq!((t["attempt"].clone(), t["lost"].clone()), (json!(1), json!(0)), "{t}");
    let cluster = &setup.cluster;
    let spread = cluster.wait_for(&format!("volume {id} as 14 EC shards"), |t| {
        t.volume(id).is_none().then(|| shard_spread(cluster, id)).flatten()
    });
    assert_readable(cluster, &encode.files, id);
    eprintln!("volume {id} encoded once across a master restart: {spread:?} ({:?})", started.elapsed());
}

/// Milliseconds since the epoch, on the clock the server stamps tasks with.
fn now_ms() -> i64 {
    jobcenter::clock::Clock::now(&jobcenter::clock::SystemClock).as_millis()
}

/// A real `weed shell` an operator types into.
struct WeedShell {
    process: Process,
    stdin: std::process::ChildStdin,
}

impl WeedShell {
    fn start(setup: &Setup, log: &str) -> WeedShell {
        let log = std::fs::File::create(setup.dir.path().join(log)).unwrap();
        let mut child = Command::new(seaweedfs::weed())
            .args(["shell", &format!("-master={}", setup.cluster.master_address())])
            .stdin(Stdio::piped())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start weed shell");
        let stdin = child.stdin.take().unwrap();
        WeedShell { process: Process { child, name: "weed shell".into() }, stdin }
    }

    fn type_line(&mut self, line: &str) {
        use std::io::Write;
        writeln!(self.stdin, "{line}").and_then(|()| self.stdin.flush()).expect("type into weed shell");
    }
}

#[test]
fn an_operators_weed_shell_gets_the_lock_between_jobs_while_maintenance_is_busy() {
    let started = Instant::now();
    let cluster = Cluster::start(ClusterOptions::default());
    let setup = Setup::with_args(cluster, &["--cluster-lock-turn", "1s"]);
    let cluster = &setup.cluster;
    let _worker = setup.start_weed_worker("weed-turns");
    let files = cluster.write_files(120, 64, "");
    let (deleted, kept) = cluster.delete_percent(&files, 60);
    let n_deleted_on = |id: u32| deleted.iter().filter(|f| f.volume_id == id).count() as u64;
    let topology = cluster.wait_for("the deletions reach the master", |t| {
        t.volumes.iter().all(|v| v.delete_count == n_deleted_on(v.id)).then(|| t.clone())
    });
    let volumes = &topology.volumes;

    // A chain of vacuums over the cluster's volumes, one after another: more
    // work than one turn with the lock. A step of these small volumes can
    // take as little as 3 ms, so 300 could all fit in one 1 s turn.
    const STEPS: usize = 1_000;
    let tasks: Vec<Value> = (0..STEPS)
        .map(|i| {
            let v = &volumes[i % volumes.len()];
            let mut task = json!({"id": format!("vacuum-{i}"), "job_type": "vacuum",
                "parameters": {"volume_id": v.id, "server": v.server, "collection": v.collection}});
            if i > 0 {
                task["depends_on"] = json!([format!("vacuum-{}", i - 1)]);
            }
            task
        })
        .collect();
    let job_id = setup.submit(&json!({"name": "vacuum-chain", "tasks": tasks}));
    let master_grpc =
        format!("http://{}", jobcenter::server::seaweedfs::master::grpc_address(&cluster.master_address()).unwrap());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let holder = || runtime.block_on(seaweedfs::shell_lock_holder(&master_grpc));
    let busy = wait_until(WAIT, || (holder() == "jobcenter").then_some(()));
    assert!(busy.is_some(), "jobcenter never held the lock\n{}", setup.context(&["weed-turns"]));

    // The operator asks for the lock while the chain runs.
    let mut shell = WeedShell::start(&setup, "weed-shell.log");
    shell.type_line("lock");
    let asked = Instant::now();
    let operator = wait_until(Duration::from_secs(60), || {
        let h = holder();
        (!h.is_empty() && h != "jobcenter").then_some(h)
    })
    .unwrap_or_else(|| panic!("the operator never got the lock\n{}", setup.context(&["weed-turns"])));
    let got_ms = now_ms();
    let waited = asked.elapsed();
    let job = setup.job(&job_id);
    let unassigned = job["tasks"].as_array().unwrap().iter().filter(|t| t["assigned_at_ms"] == 0).count();
    assert_eq!(job["state"], "running", "the operator got the lock only once the chain had ended: {job}");
    assert!(unassigned > 0, "every step was already dispatched: {job}");
    eprintln!("{operator} got the lock after {waited:?}, with {unassigned} of {STEPS} steps still to go");

    // The operator works for 3 s; meanwhile no step is dispatched.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(holder(), operator, "the operator lost the lock while holding it");
    let unlock_ms = now_ms();
    shell.type_line("unlock");
    shell.type_line("exit");
    let job = wait_for_end(&setup, &job_id, Duration::from_secs(120));
    assert_eq!(job["state"], "succeeded", "{job}\n{}", setup.context(&["weed-turns"]));
    let mut after = 0;
    for t in job["tasks"].as_array().unwrap() {
        let (assigned, finished) = (t["assigned_at_ms"].as_i64().unwrap(), t["finished_at_ms"].as_i64().unwrap());
        assert!(
            finished <= got_ms || assigned >= unlock_ms,
            "{} ran from {assigned} to {finished} while the operator held the lock ({got_ms}..{unlock_ms})",
            t["id"]
        );
        after += usize::from(assigned >= unlock_ms);
    }
    assert!(after > 0, "no step ran after the operator let go");
    for id in kept.iter().map(|f| f.volume_id).collect::<std::collections::BTreeSet<_>>() {
        assert_readable(cluster, &kept, id);
    }
    drop(shell.process);
    eprintln!("chain of {STEPS} vacuums: {after} ran after the operator's turn ({:?})", started.elapsed());
}

/// `jobcenter capacity --json`.
fn capacity(setup: &Setup) -> Value {
    setup.server.cli_json(&["capacity", "--json"])
}

/// The disks of a capacity view whose server is `server`.
fn disk_of<'a>(capacity: &'a Value, server: &str) -> &'a Value {
    capacity["disks"].as_array().unwrap().iter().find(|d| d["server"] == server).unwrap_or_else(|| {
        panic!("no disk of {server} in {capacity}");
    })
}

fn pending_shards(capacity: &Value) -> i64 {
    capacity["disks"].as_array().unwrap().iter().map(|d| d["pending_shards"].as_i64().unwrap_or(0)).sum()
}

/// A disk's EC shards, shown by the master or still to come.
fn shards_with_pending(disk: &Value) -> i64 {
    disk["ec_shards"].as_i64().unwrap_or(0) + disk["pending_shards"].as_i64().unwrap_or(0)
}

#[test]
fn the_capacity_view_counts_an_encode_under_way_across_a_master_restart_until_the_master_shows_it() {
    let started = Instant::now();
    let mut setup = Setup::start(ClusterOptions { volume_servers: 5, ..ClusterOptions::default() });
    let _worker = setup.start_weed_worker("weed-all");

    // At rest: the master's figures, nothing pending.
    let files = setup.cluster.write_files(20, 64, "");
    let topology = setup.cluster.wait_for("the files' volumes at the master", |t| {
        files.iter().all(|f| t.volume(f.volume_id).is_some()).then(|| t.clone())
    });
    let at_rest = capacity(&setup);
    assert_eq!(at_rest["disks"].as_array().unwrap().len(), 5, "{at_rest}");
    for server in setup.cluster.volume_server_addresses() {
        let disk = disk_of(&at_rest, &server);
        let volumes = topology.volumes.iter().filter(|v| v.server == server).count() as i64;
        assert_eq!(disk["volumes"].as_i64(), Some(volumes), "{server}: {disk}");
        assert_eq!(disk["max_volumes"], 20, "{disk}");
        assert_eq!(disk["free_slots_after"], disk["free_slots"], "{disk}");
    }
    assert_eq!(at_rest["changes"].as_array().map_or(0, Vec::len), 0, "{at_rest}");

    // An encode held halfway: its 14 shards are counted on their targets
    // (those the master shows there already, and the rest as pending), its
    // source keeps its volume until it is done.
    let encode = submit_encode(&setup, "cap", 480);
    let (frozen, _) = hold_while_distributing(&setup, &encode, "weed-all");
    let key = format!("{}/ec", encode.job_id);
    // (Planned as soon as it starts; its bytes once the master knows the
    // volume's size.)
    let under_way = wait_until(WAIT, || {
        Some(capacity(&setup)).filter(|c| {
            let all: i64 = c["disks"].as_array().unwrap().iter().map(shards_with_pending).sum();
            all == 14 && pending_shards(c) > 0 && disk_of(c, &encode.source)["pending_bytes"].as_i64() > Some(0)
        })
    })
    .unwrap_or_else(|| panic!("the encode is not counted: {}", capacity(&setup)));
    let change = &under_way["changes"][0];
    assert_eq!((change["key"].as_str(), change["kind"].as_str()), (Some(key.as_str()), Some("encode")), "{under_way}");
    assert_eq!((change["volume"].as_u64(), change["finished_at_ms"].as_i64()), (Some(u64::from(encode.id)), Some(0)));
    let source = disk_of(&under_way, &encode.source);
    assert_eq!(source["pending_volumes"], 0, "nothing is freed while the encode runs: {source}");
    assert!(source["work"][0].as_str().unwrap().starts_with(&key), "{source}");
    eprintln!("encode under way counted: {under_way} ({:?})", started.elapsed());

    // The master restarts: the view is asked of the new one, and still
    // counts the encode under way.
    setup.cluster.restart_master();
    let after_restart = wait_until(WAIT, || {
        Some(capacity(&setup)).filter(|c| {
            c["error"].as_str().unwrap_or("").is_empty() && c["disks"].as_array().is_some_and(|d| d.len() >= 4)
        })
    })
    .expect("the capacity view after the master's restart");
    // Every disk the new master lists counts what it counted before (the
    // stopped server is not listed until it is back).
    assert_eq!(after_restart["changes"][0]["key"].as_str(), Some(key.as_str()), "{after_restart}");
    for disk in after_restart["disks"].as_array().unwrap() {
        let before = disk_of(&under_way, disk["server"].as_str().unwrap());
        assert_eq!(shards_with_pending(disk), shards_with_pending(before), "{disk}");
    }
    drop(frozen);
    setup.cluster.wait_for_volume_servers(5);

    // Done: counted as done until the master shows the volume as shards
    // only, then the master's own figures say it.
    let job = wait_for_end(&setup, &encode.job_id, Duration::from_secs(120));
    assert_eq!(job["state"], "succeeded", "{job}\n{}", setup.context(&["weed-all"]));
    let settled = wait_until(Duration::from_secs(60), || {
        Some(capacity(&setup)).filter(|c| c["changes"].as_array().is_some_and(Vec::is_empty))
    })
    .unwrap_or_else(|| panic!("the finished encode is still counted: {}", capacity(&setup)));
    let shards: i64 = settled["disks"].as_array().unwrap().iter().map(|d| d["ec_shards"].as_i64().unwrap()).sum();
    assert_eq!((shards, pending_shards(&settled)), (14, 0), "{settled}");
    assert_readable(&setup.cluster, &encode.files, encode.id);
    let text = setup.server.cli(&["capacity"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("FREE AFTER"), "{text:?}");
    eprintln!("capacity view after the encode: {settled} ({:?})", started.elapsed());
}

#[test]
fn a_detection_sets_aside_an_encode_onto_a_disk_that_the_encode_under_way_fills() {
    let started = Instant::now();
    // The fifth server has one volume slot: room for ten EC shards.
    let mut setup = Setup::start(ClusterOptions {
        volume_servers: 5,
        max_volumes: vec![20, 20, 20, 20, 1],
        ..ClusterOptions::default()
    });
    let _worker = setup.start_weed_worker("weed-all");
    // It is down while the volumes are written, so it holds none of them.
    setup.cluster.stop_volume_server(4);
    let small = setup.cluster.volume_servers[4].address();
    let first = setup.cluster.write_files_to_one_volume(40, 64, "fill1");
    let second = setup.cluster.write_files_to_one_volume(40, 64, "fill2");
    let (a, b) = (first[0].volume_id, second[0].volume_id);
    let topology = setup.cluster.wait_for("both volumes' sizes at the master", |t| {
        let sized = |id| t.volume(id).is_some_and(|v| v.size > 2 * 1024 * 1024);
        (sized(a) && sized(b)).then(|| t.clone())
    });
    setup.cluster.restart_volume_server(4);
    let at_rest =
        wait_until(WAIT, || Some(capacity(&setup)).filter(|c| c["disks"].as_array().is_some_and(|d| d.len() == 5)))
            .expect("five disks");
    assert_eq!(disk_of(&at_rest, &small)["free_slots"], 1, "{at_rest}");

    // An encode of the first volume puts ten shards on the small server. Its
    // source is stopped first, so the encode waits before any shard moves.
    let source = topology.volume(a).unwrap().server.clone();
    let others: Vec<String> =
        setup.cluster.volume_server_addresses().into_iter().filter(|s| *s != source && *s != small).collect();
    let targets = vec![
        (small.clone(), (0..10).collect::<Vec<u32>>()),
        (others[0].clone(), vec![10, 11]),
        (others[1].clone(), vec![12, 13]),
    ];
    let params = task_params::erasure_coding_onto(a, "fill1", &source, &targets);
    let frozen = setup.cluster.volume_server(&source).freeze();
    let job_id = setup.submit(&json!({
        "name": format!("ec-fill1-{a}"),
        "tasks": [{"id": "ec", "job_type": "erasure_coding",
                   "labels": {"volume_id": a.to_string(), "dedupe_key": format!("erasure_coding:{a}:fill1")},
                   "parameters": {"volume_id": a, "source_server": source, "collection": "fill1",
                                  "task_params_pb": bytes_param(&params)}}]
    }));
    let filled = wait_until(WAIT, || Some(capacity(&setup)).filter(|c| shards_with_pending(disk_of(c, &small)) == 10))
        .unwrap_or_else(|| panic!("the encode under way is not counted: {}", capacity(&setup)));
    assert_eq!(disk_of(&filled, &small)["free_slots_after"], 0, "{filled}");

    // The scheduler's detection proposes the second volume with shards on
    // the small server too; the view has no room left there, so it is set aside.
    detection(
        &setup,
        "erasure_coding",
        true,
        &[
            "worker.quiet_for_seconds=0",
            "worker.fullness_ratio=0.01",
            "worker.min_size_mb=1",
            "admin.collection_filter=fill2",
        ],
    );
    let set_aside =
        activity_matching(&setup, |m| m.contains("set aside, its target is too full") && m.contains(&small))
            .unwrap_or_else(|| {
                let activity = setup.server.cli(&["activities"]);
                panic!("no proposal was set aside:\n{}", String::from_utf8_lossy(&activity.stdout))
            });
    eprintln!("{set_aside} ({:?})", started.elapsed());
    let scheduled = setup.server.cli_json(&["jobs", "--json", "--origin", "scheduler"]);
    assert_eq!(scheduled.as_array().map_or(0, Vec::len), 0, "a job was made while the disk had no room: {scheduled}");

    // The first encode ends; the small server holds its ten shards and no
    // more, whatever the scheduler does with the second volume meanwhile.
    drop(frozen);
    let job = wait_for_end(&setup, &job_id, Duration::from_secs(120));
    assert_eq!(job["state"], "succeeded", "{job}\n{}", setup.context(&["weed-all"]));
    let second_done = wait_until(Duration::from_secs(60), || {
        let jobs = setup.server.cli_json(&["jobs", "--json", "--origin", "scheduler"]);
        jobs.as_array()?.iter().find(|j| j["state"] == "succeeded").cloned()
    });
    detection(&setup, "erasure_coding", false, &[]);
    let shards = setup.cluster.ec_shards();
    let on_small = |id: u32| shards.get(&id).and_then(|v| v.shards.get(&small)).map_or(0, Vec::len);
    assert_eq!((on_small(a), on_small(b)), (10, 0), "{shards:?}");
    assert_readable(&setup.cluster, &first, a);
    eprintln!(
        "the second volume {}; the small server holds 10 shards ({:?})",
        if second_done.is_some() { "was encoded elsewhere" } else { "waits" },
        started.elapsed()
    );
}

#[test]
fn a_vacuum_without_progress_for_twice_its_estimate_is_canceled_on_its_live_worker_and_run_again() {
    let started = Instant::now();
    let cluster = Cluster::start(ClusterOptions::default());
    let setup = Setup::with_args(cluster, &["--heartbeat", "1s", "--recovery-interval", "1s"]);
    let cluster = &setup.cluster;
    let _worker = setup.start_weed_worker("weed-stuck");
    let (volume, kept) = half_garbage(cluster, "stuck");
    let id = volume.id;
    let server = cluster.volume_server(&volume.server);

    // The volume server hangs (SIGSTOP): the worker stays alive and keeps
    // its heartbeat, but its vacuum makes no progress. The task declares
    // an estimated runtime of 2 s, as SeaweedFS's detectors do.
    let frozen = server.freeze();
    let estimate = json!({"estimated_runtime_seconds": 2});
    let job_id = setup.submit(&one_vacuum(&format!("stuck-vacuum-{id}"), &volume, "stuck", estimate));
    let submitted = Instant::now();
    // After 4 s without progress the attempt is taken back (not counted as
    // lost: its worker is alive) and the worker is told to cancel it.
    let again = wait_until(Duration::from_secs(30), || {
        let t = task(&setup.job(&job_id), "vacuum").clone();
        (t["attempt"].as_u64() >= Some(2)).then_some(t)
    })
    .unwrap_or_else(|| {
        panic!("the stuck attempt was not taken back: {}\n{}", setup.job(&job_id), setup.context(&["weed-stuck"]))
    });
    let taken_back_after = submitted.elapsed();
    assert_eq!(again["lost"], 0, "{again}");
    let findings = setup.server.cli(&["activities"]);
    let log = std::fs::read_to_string(&setup.server.log).unwrap_or_default();
    let canceled = wait_until(WAIT, || {
        let log = std::fs::read_to_string(&setup.server.log).unwrap_or_default();
        log.lines()
            .any(|l| l.contains("worker answered a cancel") && l.contains("cancel request accepted"))
            .then_some(())
    });
    assert!(canceled.is_some(), "the worker did not accept a cancel:\n{}", seaweedfs::log_tail(&setup.server.log));
    assert!(
        log.contains("twice its estimated runtime"),
        "no R3-progress finding names the estimate:\n{}\n{}",
        String::from_utf8_lossy(&findings.stdout),
        seaweedfs::log_tail(&setup.server.log)
    );

    // The volume server comes back: the attempt now running vacuums the
    // volume, and the volume is clean and whole.
    drop(frozen);
    let job = wait_for_end(&setup, &job_id, Duration::from_secs(60));
    assert_eq!(job["state"], "succeeded", "{job}\n{}", setup.context(&["weed-stuck"]));
    let clean = wait_until(WAIT, || server.volumes().into_iter().find(|v| v.id == id && v.deleted_bytes == 0));
    assert!(clean.is_some(), "volume {id} kept its garbage");
    assert_readable(cluster, &kept, id);
    let t = task(&job, "vacuum");
    eprintln!(
        "stuck vacuum: taken back {taken_back_after:?} after its submission, done as attempt {} ({:?})",
        t["attempt"],
        started.elapsed()
    );
}

/// The admin SIGKILLed while a `weed worker` encodes a volume, and started
/// again at once. The worker, which cancelled the encode when its stream
/// broke (its rollback then runs on its own 60 s clock and wipes the
/// volume's EC state), comes back within seconds: the attempt ends then,
/// uncounted, and the activity log says why, rather than after the orphan
/// grace as if the worker had not come back. The encode runs again only
/// once the rollback window of the volume has passed, and the volume ends
/// encoded exactly once.
#[test]
fn a_weed_worker_back_after_an_admin_restart_settles_its_encode_and_no_encode_starts_during_its_rollback() {
    let started = Instant::now();
    let cluster = Cluster::start(ClusterOptions { volume_servers: 5, ..ClusterOptions::default() });
    let dir = tempfile::tempdir().unwrap();
    let free = crate::support::free_port;
    let (http, grpc) = (format!("127.0.0.1:{}", free()), free().to_string());
    let master = cluster.master_address();
    let args = ["--master", master.as_str(), "--grpc", grpc.as_str(), "--orphan-grace", "30s"];
    let data = dir.path().join("data");
    let server = Server::start_on(&data, &http, &args);
    for job_type in JOB_TYPES {
        let output = server.cli(&["policy", "set", job_type, "detection_enabled=0"]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    }
    let mut setup = Setup { cluster, server, dir };
    let _worker = setup.start_weed_worker("weed-ec");
    let encode = submit_encode(&setup, "ecr", 480);
    let (job_id, id) = (encode.job_id.clone(), encode.id);
    let (frozen, halfway) = hold_while_distributing(&setup, &encode, "weed-ec");

    // The admin dies and starts again at once, where it listened.
    setup.server.process.kill();
    setup.server = Server::start_on(&data, &http, &args);
    let restarted = Instant::now();
    drop(frozen);
    eprintln!("admin killed during {halfway:?}, started again at {:?}", started.elapsed());
    let back = wait_until(WAIT, || {
        setup.server.workers().iter().any(|w| w["worker_id"] == "weed-ec").then(|| restarted.elapsed())
    })
    .unwrap_or_else(|| panic!("weed-ec did not come back: {}", setup.context(&["weed-ec"])));
    // Settled as soon as the worker is back, not after the 30 s grace.
    let settled = wait_until(Duration::from_secs(20), || {
        let job = setup.job(&job_id);
        (task(&job, "ec")["attempt"] == 1 && task(&job, "ec")["state"] == "ready").then(|| restarted.elapsed())
    })
    .unwrap_or_else(|| panic!("attempt 1 was not settled: {}\n{}", setup.job(&job_id), setup.context(&["weed-ec"])));
    let settled_at = Instant::now();
    assert!(
        settled < Duration::from_secs(25),
        "settled {settled:?} after the restart: the orphan grace was waited out"
    );
    let job = setup.job(&job_id);
    assert_eq!(task(&job, "ec")["lost"], 0, "an admin restart is not counted against the task: {job}");
    let line = activity_matching(&setup, |m| m.contains("came back without task ec"))
        .unwrap_or_else(|| panic!("the activity log does not say what happened"));
    assert!(line.contains("weed-ec"), "{line}");

    // The encode runs again, but not while the worker's rollback may run.
    let job = wait_for_end(&setup, &job_id, Duration::from_secs(240));
    assert_eq!(job["state"], "succeeded", "{job}\n{}", setup.context(&["weed-ec"]));
    let again = task(&job, "ec");
    assert_eq!((again["attempt"].clone(), again["lost"].clone()), (json!(2), json!(0)), "{again}");
    let assigned_ms = again["assigned_at_ms"].as_i64().unwrap();
    let waited =
        Duration::from_millis((assigned_ms - (now_ms() - settled_at.elapsed().as_millis() as i64)).max(0) as u64);
    assert!(
        waited >= Duration::from_secs(60),
        "the encode ran again {waited:?} after the settle, inside the 60 s rollback"
    );
    let spread = setup.cluster.wait_for(&format!("volume {id} as 14 EC shards"), |t| {
        t.volume(id).is_none().then(|| shard_spread(&setup.cluster, id)).flatten()
    });
    assert_eq!(spread.values().sum::<usize>(), 14, "{spread:?}");
    assert_readable(&setup.cluster, &encode.files, id);
    eprintln!(
        "admin restarted during an encode: weed-ec back {back:?} after, its attempt settled {settled:?} after; \
         encoded again {waited:?} after the settle: {spread:?} ({:?})",
        started.elapsed()
    );
}

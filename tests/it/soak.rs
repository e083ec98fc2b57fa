//! The long-life soak, behind a flag: a day of an admin compressed into
//! minutes. Detections every second, the recovery check every second, and
//! `JOBCENTER_SOAK_JOBS` (100,000) small jobs submitted evenly over
//! `JOBCENTER_SOAK_MINUTES` (10) and ended, with the server's default
//! retention (10,000 ended jobs; `JOBCENTER_SOAK_KEEP` sets another)
//! pruning every second. It checks that every job
//! ended and that the scheduler still detects on time at the end, and
//! prints what docs/PERFORMANCE.md records: the data directory beside a
//! fresh copy of the same data, the admin's memory over the second half
//! (sampled every quarter second: the peak and the mean of each tenth, so
//! that a passing compaction is seen as what it is), and how fast `jobs`
//! and `/api/jobs` answer at the start and at the end.
//!
//! `cargo test --release --test it soak:: -- --ignored --nocapture` (the figures
//! go to stderr, each line starting with `soak:`).

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use jobcenter::proto::api::{self, job_service_client::JobServiceClient};
use jobcenter::proto::plugin::JobProposal;
use support::{start_worker, Server};
use tokio::sync::Semaphore;

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// The admin's RSS every quarter second, on a thread of its own.
struct RssSampler {
    samples: Arc<std::sync::Mutex<Vec<(f64, f64)>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl RssSampler {
    fn start(pid: u32, started: Instant) -> RssSampler {
        let samples = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (into, stopped) = (samples.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                into.lock().unwrap().push((started.elapsed().as_secs_f64(), rss_mib(pid)));
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        RssSampler { samples, stop }
    }

    /// The peak and the mean of each tenth of `seconds`.
    fn tenths(&self, seconds: f64) -> Vec<(f64, f64)> {
        let samples = self.samples.lock().unwrap();
        (0..10)
            .map(|k| {
                let (from, to) = (seconds * k as f64 / 10.0, seconds * (k + 1) as f64 / 10.0);
                let inside: Vec<f64> = samples.iter().filter(|(t, _)| *t >= from && *t < to).map(|s| s.1).collect();
                assert!(!inside.is_empty(), "no RSS sample in tenth {}", k + 1);
                let peak = inside.iter().copied().fold(0.0, f64::max);
                (peak, inside.iter().sum::<f64>() / inside.len() as f64)
            })
            .collect()
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

fn dir_mib(path: &std::path::Path) -> f64 {
    fn walk(path: &std::path::Path) -> u64 {
        std::fs::read_dir(path)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| match e.metadata() {
                        Ok(m) if m.is_dir() => walk(&e.path()),
                        Ok(m) => m.len(),
                        Err(_) => 0,
                    })
                    .sum()
            })
            .unwrap_or(0)
    }
    walk(path) as f64 / (1024.0 * 1024.0)
}

/// What the data directory is made of: its log, its snapshots and its blobs.
fn dir_parts(path: &std::path::Path) -> String {
    let mut parts = Vec::new();
    for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let (mib, files) = if entry.path().is_dir() {
            let files = std::fs::read_dir(entry.path()).map(|d| d.count()).unwrap_or(0);
            (dir_mib(&entry.path()), files)
        } else {
            (entry.metadata().map(|m| m.len()).unwrap_or(0) as f64 / (1024.0 * 1024.0), 1)
        };
        parts.push(format!("{name} {mib:.1} MiB/{files}"));
    }
    parts.sort();
    parts.join(", ")
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Median milliseconds of `jobs` over gRPC and of `GET /api/jobs`, 15 calls each.
async fn list_latency(client: &mut JobServiceClient<tonic::transport::Channel>, http: &str) -> (f64, f64) {
    let (mut grpc, mut rest) = (Vec::new(), Vec::new());
    for _ in 0..15 {
        let started = Instant::now();
        let listed = client.list_jobs(api::ListJobsRequest { limit: 50, ..Default::default() }).await.unwrap();
        assert!(!listed.into_inner().jobs.is_empty());
        grpc.push(started.elapsed().as_secs_f64() * 1000.0);
        let started = Instant::now();
        let page = jobcenter::wire::http_get_json(http, "/api/jobs?limit=50").await.unwrap();
        assert!(page["jobs"].as_array().is_some_and(|j| !j.is_empty()));
        rest.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    (median(grpc), median(rest))
}

/// Whether any soak job has not ended.
async fn soak_jobs_active(client: &mut JobServiceClient<tonic::transport::Channel>) -> bool {
    for state in ["pending", "running"] {
        let request =
            api::ListJobsRequest { state: state.into(), name: "soak-".into(), limit: 1, ..Default::default() };
        if !client.list_jobs(request).await.unwrap().into_inner().jobs.is_empty() {
            return true;
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak of minutes: cargo test --release --test it soak:: -- --ignored"]
async fn a_day_compressed_into_minutes() {
    let total: usize = std::env::var("JOBCENTER_SOAK_JOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let minutes: f64 = std::env::var("JOBCENTER_SOAK_MINUTES").ok().and_then(|v| v.parse().ok()).unwrap_or(10.0);
    let pace = Duration::from_secs_f64(minutes * 60.0 / total as f64);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let keep = std::env::var("JOBCENTER_SOAK_KEEP").unwrap_or_else(|_| "10000".into());
    let args = ["--recovery-interval", "1s", "--prune-interval", "1s", "--keep-recovery-checks-for", "1m"];
    let server = Server::start(&data, &[&args[..], &["--keep-ended", keep.as_str()]].concat());
    let pid = server.process.child.id();
    let _workers: Vec<_> =
        (0..2).map(|n| start_worker(&server, &format!("w{n}"), &["--max-execute", "16"], None)).collect();
    let proposal = JobProposal {
        proposal_id: "v7".into(),
        dedupe_key: "noop:v7".into(),
        job_type: "noop".into(),
        ..Default::default()
    };
    support::proposing_detector(&server, "detector", vec![proposal]).await;
    server.wait_for_workers(3);
    let set = server.cli(&["policy", "set", "noop", "detection_enabled=1", "detection_interval_seconds=1"]);
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));

    let channel =
        tonic::transport::Channel::from_shared(format!("http://{}", server.grpc)).unwrap().connect().await.unwrap();
    let client = JobServiceClient::new(channel);
    let started = Instant::now();
    let sampler = RssSampler::start(pid, started);
    let in_flight = Arc::new(Semaphore::new(32));
    let mut samples = Vec::new();
    let mut first_latency = None;
    let paced = tokio::time::Instant::now();
    for n in 0..total {
        tokio::time::sleep_until(paced + pace * n as u32).await;
        let permit = in_flight.clone().acquire_owned().await.unwrap();
        let mut submitter = client.clone();
        tokio::spawn(async move {
            let content = format!(r#"{{"name":"soak-{n}","tasks":[{{"id":"a","job_type":"noop"}}]}}"#).into_bytes();
            let request = api::SubmitJobRequest { content, format: "json".into(), source_name: String::new() };
            submitter.submit_job(request).await.expect("submitted");
            drop(permit);
        });
        if (n + 1) % (total / 10).max(1) == 0 {
            let mut probe = client.clone();
            let latency = list_latency(&mut probe, &server.http).await;
            first_latency.get_or_insert(latency);
            let sample = (started.elapsed().as_secs_f64(), n + 1, rss_mib(pid), dir_mib(&data), latency);
            eprintln!(
                "soak: {:>6.1} s {:>7} jobs  rss {:>6.1} MiB  data {:>6.1} MiB  jobs {:.2} ms  /api/jobs {:.2} ms",
                sample.0,
                sample.1,
                sample.2,
                sample.3,
                (sample.4).0,
                (sample.4).1
            );
            eprintln!("soak:          data directory: {}", dir_parts(&data));
            samples.push(sample);
        }
    }
    let _ = in_flight.acquire_many(32).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut probe = client.clone();
    while soak_jobs_active(&mut probe).await {
        assert!(Instant::now() < deadline, "jobs still active 10 minutes after the last submission");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();

    // The scheduler still detects every second at the end.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let runs = server.cli_json(&["runs", "noop", "--json"]);
    let mut at: Vec<i64> = runs["succeeded"].as_array().unwrap().iter().map(|r| r["at_ms"].as_i64().unwrap()).collect();
    at.sort_unstable();
    let recent: Vec<i64> = at.windows(2).rev().take(8).map(|w| w[1] - w[0]).collect();
    assert!(recent.len() >= 8, "too few recent detection runs: {at:?}");
    let slowest_gap = *recent.iter().max().unwrap();
    assert!(slowest_gap <= 2_500, "detections fell behind at the end: gaps {recent:?} ms");

    let mut probe = client.clone();
    let end_latency = list_latency(&mut probe, &server.http).await;
    let end_rss = rss_mib(pid);
    let half_rss = samples[samples.len() / 2 - 1].2;
    let tenths = sampler.tenths(minutes * 60.0);
    for (k, (peak, mean)) in tenths.iter().enumerate() {
        eprintln!("soak: rss in tenth {:>2}: peak {peak:>6.1} MiB, mean {mean:>6.1} MiB", k + 1);
    }
    let (sixth, last) = (tenths[5], tenths[9]);
    let data_mib = dir_mib(&data);
    let kept = server.cli_json(&["jobs", "--all", "--json", "--limit", "1000000"]).as_array().unwrap().len();
    drop(server);

    // The same data, freshly written: what the store holds, without its history.
    let export = dir.path().join("live.jsonl");
    let fresh = dir.path().join("fresh");
    let run = |args: &[&str]| {
        let output = std::process::Command::new(support::binary()).args(args).output().unwrap();
        assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
    };
    run(&["export", "--data-dir", data.to_str().unwrap(), "--output", export.to_str().unwrap()]);
    run(&["import", export.to_str().unwrap(), "--data-dir", fresh.to_str().unwrap()]);
    let fresh_mib = dir_mib(&fresh);
    let first = first_latency.unwrap();
    eprintln!(
        "soak: {}",
        serde_json::json!({
            "jobs_submitted": total,
            "minutes_paced": minutes,
            "elapsed_s": elapsed,
            "jobs_kept_at_end": kept,
            "data_dir_mib": data_mib,
            "fresh_copy_mib": fresh_mib,
            "data_dir_over_fresh_copy": data_mib / fresh_mib,
            "rss_mib_at_half": half_rss,
            "rss_mib_at_end": end_rss,
            "rss_growth_second_half": (end_rss - half_rss) / half_rss,
            "rss_peak_growth_second_half": (last.0 - sixth.0) / sixth.0,
            "rss_mean_growth_second_half": (last.1 - sixth.1) / sixth.1,
            "jobs_ms_first": first.0,
            "jobs_ms_end": end_latency.0,
            "api_jobs_ms_first": first.1,
            "api_jobs_ms_end": end_latency.1,
            "detection_gap_ms_max_at_end": slowest_gap,
        })
    );
}

//! Prometheus metrics, served at `/metrics` on the HTTP port.
//!
//! | metric | type | labels | source |
//! |---|---|---|---|
//! | `jobcenter_jobs` | gauge | `state` | every stored job, counted at each scrape |
//! | `jobcenter_tasks` | gauge | `state` | tasks of the active jobs, from the engine at each scrape |
//! | `jobcenter_active_jobs` | gauge | | jobs the engine holds (not ended) |
//! | `jobcenter_workers_connected` | gauge | | workers holding a stream |
//! | `jobcenter_worker_slots_offered` | gauge | `job_type` | execution slots the connected workers offer for the type |
//! | `jobcenter_worker_slots_used` | gauge | `job_type` | executions of the type the workers report running |
//! | `jobcenter_dispatch_latency_seconds` | histogram | | a completion reaching the server to the execute request of a task it released leaving |
//! | `jobcenter_commit_seconds` | histogram | | one group commit of leader and follower steps: the batch's write and flush |
//! | `jobcenter_store_flush_seconds` | histogram | | the flush of one group commit |
//! | `jobcenter_recovery_findings_total` | counter | `rule` | findings of the recovery check |
//! | `jobcenter_detections_total` | counter | `job_type` | detection runs |
//! | `jobcenter_proposals_total` | counter | `job_type` | jobs proposed by detections |
//! | `jobcenter_instances_deactivated_total` | counter | | silent instances this one deactivated (several on one database) |
//! | `jobcenter_runtime_tasks` | gauge | | tasks alive in the server's runtime: sessions, watchers, duties, requests |
//! | `jobcenter_event_subscribers` | gauge | | subscriptions to the engine's changes (watchers among them) |
//! | `jobcenter_duties_running` | gauge | `duty` | single-flight duties under way: `recovery`, `prune`, `detection`, and routes open to detectors (`detection_route`) |
//! | `jobcenter_detection_failures_total` | counter | `job_type` | detection runs that failed (no answer, an error) |
//! | `jobcenter_notifications_delivered_total` | counter | `endpoint` | webhook deliveries answered 2xx (`--notify`) |
//! | `jobcenter_notification_failures_total` | counter | `endpoint` | webhook deliveries that failed (no answer, not 2xx) |
//! | `jobcenter_jobs_ended_total` | counter | `state` | jobs that ended here (led here), by how |
//! | `jobcenter_worker_sessions_total` | counter | | worker streams opened (a worker that reconnects opens another) |
//! | `jobcenter_ready` | gauge | | 1 while the store takes writes and this instance reaches its database (as `/readyz`), else 0 |
//! | `jobcenter_recovery_last_check_timestamp_seconds` | gauge | | when the last recovery check ran here (its start before the first) |
//! | `jobcenter_recovery_interval_seconds` | gauge | | how often the recovery check is due (`--recovery-interval`) |
//!
//! `docs/alerts.yml` holds the alert rules over them; `tests/it/alerts.rs`
//! checks them with `promtool` against a real server's names.
//!
//! Gauges are computed when scraped, so they cost nothing between scrapes.
//! The committer reports its timings through `commit_observer`; until the
//! engine takes one, commits are timed from the API calls that wait for a
//! step to be durable (submit, cancel, retry) and flushes by a flush at scrape.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::proto::{Bucket, Histogram as HistogramValue, Metric, MetricFamily, MetricType};
use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::engine::EngineHandle;
use crate::model::{JobState, TaskState};
use crate::server::duties::scheduler::Board;
use crate::server::duties::{recovery, retention};
use crate::server::policies::Policies;
use crate::server::Stats;
use crate::store::JobFilter;

/// Upper bounds, in seconds, of the latency histograms.
const LATENCY_BUCKETS: [f64; 16] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

const JOB_STATES: [JobState; 5] =
    [JobState::Pending, JobState::Running, JobState::Succeeded, JobState::Failed, JobState::Canceled];

/// The server's metrics; counters and histograms are fed as things happen,
/// gauges are set at each scrape.
pub(crate) struct Metrics {
    registry: Registry,
    jobs: IntGaugeVec,
    tasks: IntGaugeVec,
    active_jobs: IntGauge,
    workers_connected: IntGauge,
    runtime_tasks: IntGauge,
    subscribers: IntGauge,
    duties: IntGaugeVec,
    slots_total: IntGaugeVec,
    slots_used: IntGaugeVec,
    commit_seconds: Histogram,
    flush_seconds: Histogram,
    recovery_findings: IntCounterVec,
    detections: IntCounterVec,
    detection_failures: IntCounterVec,
    notifications_delivered: IntCounterVec,
    notification_failures: IntCounterVec,
    ready: IntGauge,
    recovery_last: prometheus::Gauge,
    recovery_interval: prometheus::Gauge,
    proposals: IntCounterVec,
    deactivations: prometheus::IntCounter,
    pruned: prometheus::IntCounter,
    compactions: prometheus::IntCounter,
    reclaimed: prometheus::IntCounter,
    /// Whether the committer reports its timings (see `commit_observer`).
    committer_reports: Arc<AtomicBool>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, label: &str) -> IntGaugeVec {
    let gauge = IntGaugeVec::new(Opts::new(name, help), &[label]).expect("valid metric");
    registry.register(Box::new(gauge.clone())).expect("metric registered once");
    gauge
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let gauge = IntGauge::new(name, help).expect("valid metric");
    registry.register(Box::new(gauge.clone())).expect("metric registered once");
    gauge
}

fn float_gauge(registry: &Registry, name: &str, help: &str) -> prometheus::Gauge {
    let gauge = prometheus::Gauge::new(name, help).expect("valid metric");
    registry.register(Box::new(gauge.clone())).expect("metric registered once");
    gauge
}

fn counter(registry: &Registry, name: &str, help: &str) -> prometheus::IntCounter {
    let counter = prometheus::IntCounter::new(name, help).expect("valid metric");
    registry.register(Box::new(counter.clone())).expect("metric registered once");
    counter
}

fn counter_vec(registry: &Registry, name: &str, help: &str, label: &str) -> IntCounterVec {
    let counter = IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid metric");
    registry.register(Box::new(counter.clone())).expect("metric registered once");
    counter
}

fn histogram(registry: &Registry, name: &str, help: &str) -> Histogram {
    let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
    let histogram = Histogram::with_opts(opts).expect("valid metric");
    registry.register(Box::new(histogram.clone())).expect("metric registered once");
    histogram
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let registry = Registry::new();
        Metrics {
            jobs: gauge_vec(&registry, "jobcenter_jobs", "Stored jobs by state.", "state"),
            tasks: gauge_vec(&registry, "jobcenter_tasks", "Tasks of the active jobs by state.", "state"),
            active_jobs: gauge(&registry, "jobcenter_active_jobs", "Jobs the engine holds: not ended."),
            workers_connected: gauge(&registry, "jobcenter_workers_connected", "Workers holding a worker stream."),
            runtime_tasks: gauge(
                &registry,
                "jobcenter_runtime_tasks",
                "Tasks alive in the server's runtime: sessions, watchers, duties, requests.",
            ),
            subscribers: gauge(
                &registry,
                "jobcenter_event_subscribers",
                "Subscriptions to the engine's changes, watchers among them.",
            ),
            duties: gauge_vec(&registry, "jobcenter_duties_running", "Single-flight duties under way.", "duty"),
            slots_total: gauge_vec(
                &registry,
                "jobcenter_worker_slots_offered",
                "Execution slots the connected workers offer for a job type.",
                "job_type",
            ),
            slots_used: gauge_vec(
                &registry,
                "jobcenter_worker_slots_used",
                "Executions of a job type the connected workers report running.",
                "job_type",
            ),
            commit_seconds: histogram(
                &registry,
                "jobcenter_commit_seconds",
                "One group commit of leader and follower steps: the write of the batch and its flush.",
            ),
            flush_seconds: histogram(&registry, "jobcenter_store_flush_seconds", "The flush of one group commit."),
            recovery_findings: counter_vec(
                &registry,
                "jobcenter_recovery_findings_total",
                "Findings of the recovery check, by rule.",
                "rule",
            ),
            detections: counter_vec(
                &registry,
                "jobcenter_detections_total",
                "Detection runs, by job type.",
                "job_type",
            ),
            detection_failures: counter_vec(
                &registry,
                "jobcenter_detection_failures_total",
                "Detection runs that failed: no answer in time, or an error.",
                "job_type",
            ),
            notifications_delivered: counter_vec(
                &registry,
                "jobcenter_notifications_delivered_total",
                "Webhook deliveries answered 2xx, by endpoint.",
                "endpoint",
            ),
            notification_failures: counter_vec(
                &registry,
                "jobcenter_notification_failures_total",
                "Webhook deliveries that failed (no answer in time, not 2xx), by endpoint.",
                "endpoint",
            ),
            ready: gauge(
                &registry,
                "jobcenter_ready",
                "1 while the store takes writes and this instance reaches its database, else 0.",
            ),
            recovery_last: float_gauge(
                &registry,
                "jobcenter_recovery_last_check_timestamp_seconds",
                "When the last recovery check ran here (the server's start before the first).",
            ),
            recovery_interval: float_gauge(
                &registry,
                "jobcenter_recovery_interval_seconds",
                "How often the recovery check is due.",
            ),
            proposals: counter_vec(
                &registry,
                "jobcenter_proposals_total",
                "Jobs proposed by detection runs, by job type.",
                "job_type",
            ),
            deactivations: counter(
                &registry,
                "jobcenter_instances_deactivated_total",
                "Silent admin instances this instance deactivated.",
            ),
            pruned: counter(
                &registry,
                "jobcenter_jobs_pruned_total",
                "Ended jobs removed by the retention rules (background and `prune`).",
            ),
            compactions: counter(
                &registry,
                "jobcenter_store_compactions_total",
                "Compactions of the data directory's log while the server ran.",
            ),
            reclaimed: counter(
                &registry,
                "jobcenter_store_reclaimed_bytes_total",
                "Bytes of disk the data directory's compactions gave back.",
            ),
            registry,
            committer_reports: Arc::new(AtomicBool::new(false)),
        }
    }

    /// One finding of the recovery check under `rule` (its invariant id).
    pub(crate) fn record_recovery_finding(&self, rule: &str) {
        self.recovery_findings.with_label_values(&[rule]).inc();
    }

    /// Makes rules appear at 0 before their first finding.
    pub(crate) fn declare_recovery_rules(&self, rules: &[&str]) {
        for rule in rules {
            self.recovery_findings.with_label_values(&[*rule]);
        }
    }

    pub(crate) fn note_deactivation(&self) {
        self.deactivations.inc();
    }

    pub(crate) fn jobs_pruned(&self, n: u64) {
        self.pruned.inc_by(n);
    }

    pub(crate) fn store_compacted(&self, done: &crate::store::Reclaimed) {
        self.compactions.inc();
        self.reclaimed.inc_by(done.before_bytes.saturating_sub(done.after_bytes));
    }

    pub(crate) fn record_detection(&self, job_type: &str) {
        self.detections.with_label_values(&[job_type]).inc();
    }

    /// A detection run of `job_type` that failed.
    pub(crate) fn record_detection_failure(&self, job_type: &str) {
        self.detection_failures.with_label_values(&[job_type]).inc();
    }

    /// A delivery of a notification to `endpoint`, answered 2xx or not.
    pub(crate) fn notification_delivered(&self, endpoint: &str, ok: bool) {
        let counter = if ok { &self.notifications_delivered } else { &self.notification_failures };
        counter.with_label_values(&[endpoint]).inc();
    }

    pub(crate) fn record_proposals(&self, job_type: &str, n: u64) {
        self.proposals.with_label_values(&[job_type]).inc_by(n);
    }

    /// What the engine's committer calls after each group commit with the
    /// time of the whole commit (write and flush) and of the flush alone.
    /// From its first call on, the stand-in measurements stop.
    pub(crate) fn commit_observer(&self) -> impl Fn(Duration, Duration) + Send + Sync + 'static {
        let (commit, flush) = (self.commit_seconds.clone(), self.flush_seconds.clone());
        let reported = self.committer_reports.clone();
        move |commit_latency, flush_latency| {
            reported.store(true, Ordering::Relaxed);
            commit.observe(commit_latency.as_secs_f64());
            flush.observe(flush_latency.as_secs_f64());
        }
    }

    /// Stand-in for the committer's own timing: an API call that waited for
    /// its step to be durable (submit, cancel, retry).
    pub(crate) fn observe_api_step(&self, latency: Duration) {
        if !self.committer_reports.load(Ordering::Relaxed) {
            self.commit_seconds.observe(latency.as_secs_f64());
        }
    }

    /// Sets the gauges from the engine, the store and the registry.
    async fn refresh(&self, scrape: &Scrape) {
        // Every stored job, by state (a scan of job records, without their tasks).
        let mut jobs: BTreeMap<JobState, i64> = JOB_STATES.iter().map(|s| (*s, 0)).collect();
        match scrape.engine.list(JobFilter::default()).await {
            Ok(records) => {
                for record in records {
                    *jobs.entry(record.state).or_default() += 1;
                }
            }
            Err(e) => tracing::warn!(error = %e, "metrics: cannot list the jobs"),
        }
        for (state, n) in jobs {
            self.jobs.with_label_values(&[state.as_str()]).set(n);
        }

        let mut counts = [0i64; TaskState::ALL.len()];
        let active = scrape.engine.active_jobs().await.unwrap_or_default();
        self.active_jobs.set(active.len() as i64);
        for record in &active {
            if let Ok(Some(summary)) = scrape.engine.summary(record.id).await {
                for (slot, state) in TaskState::ALL.iter().enumerate() {
                    counts[slot] += i64::from(summary.counts.get(*state));
                }
            }
        }
        for (slot, state) in TaskState::ALL.iter().enumerate() {
            self.tasks.with_label_values(&[state.as_str()]).set(counts[slot]);
        }

        let workers = scrape.registry.workers();
        self.workers_connected.set(workers.len() as i64);
        self.runtime_tasks.set(tokio::runtime::Handle::current().metrics().num_alive_tasks() as i64);
        self.subscribers.set(scrape.engine.subscribers() as i64);
        let (detections, routes) = scrape.scheduler.in_flight();
        for (duty, running) in [
            ("recovery", usize::from(scrape.recovery.is_running())),
            ("prune", usize::from(scrape.prune.is_running())),
            ("detection", detections),
            ("detection_route", routes),
        ] {
            self.duties.with_label_values(&[duty]).set(running as i64);
        }
        let mut total: BTreeMap<String, i64> = BTreeMap::new();
        let mut used: BTreeMap<String, i64> = BTreeMap::new();
        for job_type in scrape.policies.job_types().iter().map(String::as_str).chain(["noop", "shell"]) {
            total.entry(job_type.to_string()).or_default();
            used.entry(job_type.to_string()).or_default();
        }
        for worker in &workers {
            for capability in worker.capabilities.iter().filter(|c| c.can_execute && !c.job_type.is_empty()) {
                let worker_slots = i64::from(worker.execution_slots_total.max(0));
                let type_slots = i64::from(capability.max_execution_concurrency.max(0));
                let slots = match (type_slots, worker_slots) {
                    (0, w) => w,
                    (t, 0) => t,
                    (t, w) => t.min(w),
                };
                *total.entry(capability.job_type.clone()).or_default() += slots;
            }
            for (job_type, n) in &worker.running_by_type {
                *used.entry(job_type.clone()).or_default() += i64::from(*n);
            }
        }
        self.slots_total.reset();
        self.slots_used.reset();
        for (job_type, n) in &total {
            self.slots_total.with_label_values(&[job_type]).set(*n);
            self.detections.with_label_values(&[job_type]);
            self.detection_failures.with_label_values(&[job_type]);
            self.proposals.with_label_values(&[job_type]);
        }
        for (job_type, n) in &used {
            self.slots_used.with_label_values(&[job_type]).set(*n);
        }

        let reaches_database = scrape.topology.member().is_none_or(|node| !node.is_fenced());
        self.ready.set(i64::from(scrape.engine.is_ready() && reaches_database));
        let last_ms = scrape.recovery.last().map_or(scrape.started_ms, |(at, _)| at);
        self.recovery_last.set(last_ms as f64 / 1000.0);
        self.recovery_interval.set(scrape.recovery_interval.as_secs_f64());

        // Until the committer reports its own timings, time a flush here.
        if !self.committer_reports.load(Ordering::Relaxed) {
            let store = scrape.engine.store().clone();
            let flushed = tokio::task::spawn_blocking(move || {
                let started = Instant::now();
                store.flush().map(|()| started.elapsed())
            })
            .await;
            if let Ok(Ok(latency)) = flushed {
                self.flush_seconds.observe(latency.as_secs_f64());
            }
        }
    }

    /// The text exposition of every metric, gauges refreshed.
    async fn render(&self, scrape: &Scrape) -> String {
        self.refresh(scrape).await;
        let mut families = self.registry.gather();
        families.push(dispatch_family(&scrape.stats));
        let ended = scrape.engine.endings().map(|(state, n)| (Some(("state", state.as_str())), n));
        families.push(counter_family("jobcenter_jobs_ended_total", "Jobs that ended here, by how.", &ended));
        families.push(counter_family(
            "jobcenter_worker_sessions_total",
            "Worker streams opened; a worker that reconnects opens another.",
            &[(None, scrape.registry.sessions_opened())],
        ));
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&families, &mut out) {
            tracing::warn!(error = %e, "metrics: cannot encode");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

/// What a scrape reads besides the metrics fed as things happen: the
/// engine and the store behind it, the workers connected, the job types
/// of the policy book, the single-flight duties under way, and the
/// dispatch figures.
pub(crate) struct Scrape {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) engine: EngineHandle,
    pub(crate) registry: crate::server::workers::registry::Registry,
    pub(crate) policies: Policies,
    /// Detections under way, and routes open to their detectors.
    pub(crate) scheduler: Board,
    pub(crate) recovery: Arc<recovery::Gate>,
    pub(crate) prune: Arc<retention::Gate>,
    pub(crate) stats: Arc<Stats>,
    /// Whether this instance reaches its database.
    pub(crate) topology: crate::server::Topology,
    pub(crate) recovery_interval: Duration,
    /// When the server started (milliseconds since the epoch).
    pub(crate) started_ms: i64,
}

impl Scrape {
    /// The text exposition of every metric, gauges refreshed.
    pub(crate) async fn render(&self) -> String {
        self.metrics.render(self).await
    }
}

/// A counter kept elsewhere (the engine, the registry), as a family: a
/// value per label (name, value), or one without.
fn counter_family(name: &str, help: &str, values: &[(Option<(&str, &str)>, u64)]) -> MetricFamily {
    let metrics = values
        .iter()
        .map(|(label, n)| {
            let mut counter = prometheus::proto::Counter::default();
            counter.set_value(*n as f64);
            let mut metric = Metric::default();
            metric.set_counter(counter);
            if let Some((label, value)) = label {
                let mut pair = prometheus::proto::LabelPair::default();
                pair.set_name(label.to_string());
                pair.set_value(value.to_string());
                metric.set_label(vec![pair]);
            }
            metric
        })
        .collect();
    let mut family = MetricFamily::default();
    family.set_name(name.into());
    family.set_help(help.into());
    family.set_field_type(MetricType::COUNTER);
    family.set_metric(metrics);
    family
}

/// The dispatch latency the server keeps in an HDR histogram (microseconds), as a Prometheus histogram.
fn dispatch_family(stats: &crate::server::Stats) -> MetricFamily {
    let h = stats.dispatch_us.lock().expect("stats lock");
    let mut buckets = Vec::with_capacity(LATENCY_BUCKETS.len());
    for bound in LATENCY_BUCKETS {
        let micros = (bound * 1e6) as u64;
        let mut bucket = Bucket::default();
        bucket.set_upper_bound(bound);
        bucket.set_cumulative_count(if h.is_empty() { 0 } else { h.count_between(0, micros) });
        buckets.push(bucket);
    }
    let mut value = HistogramValue::default();
    value.set_sample_count(h.len());
    value.set_sample_sum(h.mean() * h.len() as f64 / 1e6);
    value.set_bucket(buckets);
    let mut metric = Metric::default();
    metric.set_histogram(value);
    let mut family = MetricFamily::default();
    family.set_name("jobcenter_dispatch_latency_seconds".into());
    family
        .set_help("From a completion reaching the server to the execute request of a task it released leaving.".into());
    family.set_field_type(MetricType::HISTOGRAM);
    family.set_metric(vec![metric]);
    family
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_histograms_are_exposed() {
        let metrics = Metrics::new();
        metrics.record_recovery_finding("R3");
        metrics.record_recovery_finding("R3");
        metrics.declare_recovery_rules(&["R1"]);
        metrics.record_detection("vacuum");
        metrics.record_proposals("vacuum", 3);
        metrics.observe_api_step(Duration::from_millis(3));
        let observe = metrics.commit_observer();
        observe(Duration::from_millis(20), Duration::from_millis(15));
        // Once the committer reports, the stand-in stops counting.
        metrics.observe_api_step(Duration::from_millis(3));
        let mut out = Vec::new();
        TextEncoder::new().encode(&metrics.registry.gather(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        for line in [
            "jobcenter_recovery_findings_total{rule=\"R3\"} 2",
            "jobcenter_recovery_findings_total{rule=\"R1\"} 0",
            "jobcenter_detections_total{job_type=\"vacuum\"} 1",
            "jobcenter_proposals_total{job_type=\"vacuum\"} 3",
            "jobcenter_commit_seconds_bucket{le=\"0.005\"} 1",
            "jobcenter_commit_seconds_bucket{le=\"0.0025\"} 0",
            "jobcenter_commit_seconds_bucket{le=\"0.025\"} 2",
            "jobcenter_commit_seconds_count 2",
            "jobcenter_store_flush_seconds_bucket{le=\"0.01\"} 0",
            "jobcenter_store_flush_seconds_count 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no line {line:?} in\n{text}");
        }
    }

    #[test]
    fn the_dispatch_histogram_is_converted_to_buckets() {
        let stats = crate::server::Stats::default();
        for micros in [50, 400, 2_000, 2_000, 700_000] {
            stats.record_dispatch(Duration::from_micros(micros));
        }
        let family = dispatch_family(&stats);
        let histogram = family.get_metric()[0].get_histogram();
        assert_eq!(histogram.get_sample_count(), 5);
        let cumulative: Vec<(f64, u64)> =
            histogram.get_bucket().iter().map(|b| (b.upper_bound(), b.cumulative_count())).collect();
        let at = |bound: f64| cumulative.iter().find(|(b, _)| *b == bound).unwrap().1;
        assert_eq!(at(0.0001), 1);
        assert_eq!(at(0.0005), 2);
        assert_eq!(at(0.0025), 4);
        assert_eq!(at(0.5), 4);
        assert_eq!(at(1.0), 5);
        assert!((histogram.get_sample_sum() - 0.704_45).abs() < 0.01, "{}", histogram.get_sample_sum());
    }
}

//! This admin as one instance of several on one database: it registers, beats
//! its heartbeat on the database's clock, deactivates instances silent past
//! the lag threshold, leads its even share of the jobs (claiming jobs nobody
//! leads, releasing idle ones above its share), and starts over under a new
//! id once it finds itself deactivated.
//!
//! The database decides everything that must hold cluster-wide: the fence on
//! every write, who leads a job, which instance detects a job type in an
//! interval. Each instance computes its own share from the same membership,
//! so there is no central distributor.
//!
//! The calls between instances (lending, reports to a job's leader,
//! vouching for attempts) are in `peer`.

mod outbox;
pub(crate) mod peer;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::backoff::Backoff;
use crate::clock::Clock;
use crate::engine::EngineHandle;
use crate::model::HandlerId;
use crate::server::duties::recovery::Recovery;
use crate::server::duties::Duties;
use crate::server::policies::Policies;
use crate::server::surface::metrics::Metrics;
use crate::server::workers::registry::Registry;
use crate::store::cluster::{Beat, Instance, Introduction, Membership, Role};
use crate::store::{self, Store};

/// How often an instance beats, and how long silence deactivates it.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub heartbeat: Duration,
    pub lag: Duration,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing { heartbeat: Duration::from_secs(5), lag: Duration::from_secs(20) }
    }
}

/// This instance's view of the cluster.
pub struct Node {
    pub id: HandlerId,
    pub timing: Timing,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    membership: Mutex<Option<Membership>>,
    /// The database's clock minus this machine's, in milliseconds, as of the
    /// last heartbeat: every cluster time is the database's.
    offset_ms: AtomicI64,
    paused: AtomicBool,
    /// Bumped whenever jobs are adopted: worker sessions then compare what
    /// their worker runs with what it now holds.
    adoptions: AtomicU64,
    /// Job types this instance claimed a detection of, and when.
    detected: Mutex<BTreeMap<String, Instant>>,
    /// Work arrived: take the permits it needs now.
    permits_wake: tokio::sync::Notify,
    /// When the last heartbeat that went through began, on this machine's
    /// monotonic clock: the database's record of it is no older.
    beat_ok: Mutex<Instant>,
    /// Set while this instance is fenced by itself: see `spawn_fence`.
    fenced: tokio::sync::watch::Sender<bool>,
    /// Since when its heartbeats have all gone through (the first of the
    /// run began then); `None` after one failed.
    streak: Mutex<Option<Instant>>,
    /// Held by each heartbeat and claim for as long as its transaction runs,
    /// on the blocking thread that runs it (a duty aborted at its await does
    /// not stop that thread): leaving takes it, so that no claim commits
    /// after the jobs were handed over.
    writing: Arc<tokio::sync::Mutex<()>>,
}

impl Node {
    /// Leaves the cluster on a clean stop, once no heartbeat or claim of
    /// this instance is still being written: its jobs are released at once
    /// and its row removed.
    pub async fn leave(&self) -> Result<(), store::Error> {
        let _writing = self.writing.lock().await;
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.cluster().expect("cluster").leave())
            .await
            .map_err(|e| store::Error::Io(e.to_string()))?
    }

    /// Registers this process as a new instance of the cluster the store holds.
    pub fn join(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        role: Role,
        grpc: String,
        http: String,
        timing: Timing,
    ) -> Result<Node, store::Error> {
        let cluster = store.cluster().ok_or_else(|| store::Error::Io("this store serves one instance".into()))?;
        let id = cluster.register(&Introduction { role, grpc_address: grpc, http_address: http })?;
        tracing::info!(instance = %id, role = role.as_str(), "joined the cluster");
        Ok(Node {
            id,
            timing,
            store,
            clock,
            membership: Mutex::new(None),
            offset_ms: AtomicI64::new(0),
            paused: AtomicBool::new(false),
            adoptions: AtomicU64::new(0),
            detected: Mutex::new(BTreeMap::new()),
            permits_wake: tokio::sync::Notify::new(),
            beat_ok: Mutex::new(Instant::now()),
            fenced: tokio::sync::watch::Sender::new(false),
            streak: Mutex::new(None),
            writing: Arc::default(),
        })
    }

    /// This instance fenced itself: no heartbeat went through for long
    /// enough that the others may have deactivated it.
    pub fn is_fenced(&self) -> bool {
        *self.fenced.borrow()
    }

    /// A heartbeat that began at `began` went through: this instance was
    /// not deactivated, and is not silent as of then.
    fn heartbeat_went_through(&self, began: Instant) {
        let mut ok = self.beat_ok.lock().expect("beat lock");
        *ok = (*ok).max(began);
        drop(ok);
        self.streak.lock().expect("streak lock").get_or_insert(began);
        if self.fenced.send_replace(false) {
            tracing::warn!(instance = %self.id, "the heartbeat went through again: this instance takes workers again");
        }
    }

    /// Changes of `is_fenced`, for what must stop at once when it is set.
    pub fn fencing(&self) -> tokio::sync::watch::Receiver<bool> {
        self.fenced.subscribe()
    }

    /// How long without a heartbeat this instance fences itself after: the
    /// lag threshold less a margin of one heartbeat (at least a quarter of
    /// the lag), so that it has stopped before another instance can
    /// deactivate it.
    pub fn fence_after(&self) -> Duration {
        let margin = self.timing.heartbeat.max(self.timing.lag / 4);
        self.timing.lag.saturating_sub(margin)
    }

    /// New work arrived here: its permits are asked for at once.
    pub fn wake_permits(&self) {
        self.permits_wake.notify_one();
    }

    /// The database's clock now, in milliseconds since the epoch.
    pub fn db_now_ms(&self) -> i64 {
        self.clock.now().as_millis() + self.offset_ms.load(Ordering::Relaxed)
    }

    /// A time on the database's clock, on this machine's.
    pub fn local_ms(&self, db_ms: i64) -> i64 {
        db_ms - self.offset_ms.load(Ordering::Relaxed)
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }

    pub fn set_paused_here(&self, paused: bool) {
        self.paused.store(paused, Ordering::Relaxed);
    }

    pub fn adoptions(&self) -> u64 {
        self.adoptions.load(Ordering::Acquire)
    }

    /// The live servers that have a detector for `job_type`, by id; this
    /// instance is among them when `here` says it has one.
    pub fn detecting_servers(&self, job_type: &str, here: bool) -> Vec<HandlerId> {
        let mut ids: BTreeSet<HandlerId> = self
            .membership
            .lock()
            .expect("membership lock")
            .iter()
            .flat_map(|m| m.servers())
            .filter(|i| i.id != self.id && i.detectors.iter().any(|d| d == job_type))
            .map(|i| i.id)
            .collect();
        if here {
            ids.insert(self.id);
        }
        ids.into_iter().collect()
    }

    pub fn note_detection(&self, job_type: &str) {
        self.detected.lock().expect("detected lock").insert(job_type.to_string(), Instant::now());
    }

    /// Jobs not ended that nobody led, as of the last heartbeat.
    pub fn unowned_jobs(&self) -> usize {
        self.membership.lock().expect("membership lock").as_ref().map_or(0, |m| m.unowned_jobs)
    }

    /// The live instances as of the last heartbeat.
    pub fn live(&self) -> Vec<Instance> {
        self.membership.lock().expect("membership lock").as_ref().map(|m| m.instances.clone()).unwrap_or_default()
    }
}

/// Whether this server runs alone or as a member of a cluster of
/// instances sharing one database. Cheap to clone.
#[derive(Clone)]
pub enum Topology {
    Alone,
    Member(Arc<Node>),
}

impl Topology {
    /// This instance's place in its cluster, when it is a member.
    pub fn member(&self) -> Option<&Arc<Node>> {
        match self {
            Topology::Alone => None,
            Topology::Member(node) => Some(node),
        }
    }

    /// A member that fenced itself (no heartbeat went through for too
    /// long) takes no workers and no requests that need the database.
    pub fn is_fenced(&self) -> bool {
        self.member().is_some_and(|node| node.is_fenced())
    }

    /// The time maintenance windows are read at: the database's in a
    /// cluster, this machine's alone.
    pub(crate) fn calendar_now(&self, clock: &dyn Clock) -> crate::clock::Timestamp {
        match self {
            Topology::Alone => clock.now(),
            Topology::Member(node) => crate::clock::Timestamp(node.db_now_ms()),
        }
    }
}

/// This instance as a member of its cluster: its node, and what its loops
/// use (`permits`, `heartbeats` with its share of the jobs, `fence`).
pub(crate) struct Member {
    pub(crate) node: Arc<Node>,
    pub(crate) engine: EngineHandle,
    /// The workers connected here: the heartbeats list them, the fence ends
    /// their sessions.
    pub(crate) registry: Registry,
    /// Read again at each heartbeat: another instance may have changed them.
    pub(crate) policies: Policies,
    pub(crate) metrics: Arc<Metrics>,
    /// Run on the jobs adopted, once their delivery grace has passed.
    pub(crate) recovery: Arc<Recovery>,
    pub(crate) duties: Duties,
    pub(crate) delivery_grace: Duration,
    /// An instance this one deactivated is a notification (`instance.lost`).
    pub(crate) notifier: Arc<crate::server::notify::Notifier>,
}

/// How often an instance settles its permits when nothing wakes it.
const PERMITS_EVERY: Duration = Duration::from_millis(250);
/// How long settlements that find nothing changed here, and hear no news,
/// may go without reading the database (news can be lost with its
/// connection before anyone knows).
const PERMITS_CHECK: Duration = Duration::from_secs(1);
/// What a type wanted over this many ticks of the loop counts: permits are
/// not given back the moment a queue runs dry between two tasks.
const WANT_WINDOW: usize = 8;

/// The permits loop of a server instance: each job type's global limit is
/// split over the instances that have its tasks to run (slots in the
/// database, `jobcenter.permits`), so the limit holds cluster-wide; this
/// instance dispatches a type's tasks only within the slots it holds. A
/// settlement reads the database only when the split may have changed
/// (`Settled::must_read`); news of the other instances wakes it at once.
pub(crate) async fn permits(member: Arc<Member>) {
    let node = &member.node;
    let mut news = node.store.cluster().and_then(|cluster| cluster.permit_news());
    // The server set no permits at all before it listened (`server::run`).
    let mut last = Settled::default();
    loop {
        match settle_permits(&member, &mut last, news.as_mut()).await {
            Ok(()) => {}
            Err(store::Error::Fenced { .. }) => return deactivated(&member.engine, node),
            Err(e) => tracing::warn!(error = %e, "cannot settle the permits"),
        }
        tokio::select! {
            () = tokio::time::sleep(PERMITS_EVERY) => {}
            () = node.permits_wake.notified() => {}
            () = heard(&mut news) => {}
        }
    }
}

/// Resolves when there is permit news; never once nobody can send any.
async fn heard(news: &mut Option<store::cluster::PermitNews>) {
    if let Some(receiver) = news.as_mut() {
        if receiver.changed().await.is_ok() {
            return;
        }
        *news = None;
    }
    std::future::pending::<()>().await;
}

/// A job type's permit key.
const TYPE_KEY: &str = "type:";
/// What the bandwidth budget's permit keys start with (`budget::CLUSTER_KEY`, `budget::SERVER_KEY`).
const BUDGET_KEY: &str = "budget:";

/// What the settlements so far left: per key, what was wanted at each of
/// the last `WANT_WINDOW` ticks; the slots held; the keys the database was
/// last told this instance wants; and the last read of the database.
#[derive(Debug, Default)]
struct Settled {
    recent: BTreeMap<String, std::collections::VecDeque<u32>>,
    held: BTreeMap<String, u32>,
    wanting: BTreeSet<String>,
    /// When the window last moved on.
    ticked: Option<Instant>,
    /// The last settlement that read the database.
    read: Option<Read>,
}

/// A settlement that read the database: what it asked, what it was
/// granted, when, and in which turn of the split.
#[derive(Debug)]
struct Read {
    requests: Vec<store::cluster::PermitRequest>,
    grants: Vec<store::cluster::Grant>,
    at: Instant,
    turn: i64,
}

impl Settled {
    /// The requests of the next settlement, from this instance's demand.
    /// A key's want is the most it wanted over the window. A key held, or
    /// last told as wanted, is asked for until the database has its want of
    /// 0: an instance that gave its slots back while it still wanted them,
    /// and then ran out of work, must not stay on record as wanting (the
    /// split would keep slots for it that nobody takes).
    fn requests(&mut self, demand: crate::dispatch::Demand, now: Instant) -> Vec<store::cluster::PermitRequest> {
        // (key, capacity, wanted now, running)
        let mut asks: Vec<(String, u32, u32, u32)> = Vec::new();
        for crate::dispatch::TypeDemand { job_type, limit, queued, running } in demand.types {
            asks.push((format!("{TYPE_KEY}{job_type}"), limit, queued.saturating_add(running).min(limit), running));
        }
        // A resource's permit key is the resource itself (`volume:<id>`).
        for (resource, locked) in demand.resources {
            asks.push((resource, 1, 1, u32::from(locked)));
        }
        // The bandwidth budget's keys: split evenly between the instances
        // with budgeted work (each wants every slot).
        for ask in demand.budget {
            asks.push((ask.key, ask.capacity, if ask.wants { ask.capacity } else { 0 }, ask.running));
        }
        let asked: BTreeSet<String> = asks.iter().map(|a| a.0.clone()).collect();
        let gone: BTreeSet<String> =
            self.held.keys().chain(&self.wanting).filter(|k| !asked.contains(*k)).cloned().collect();
        asks.extend(gone.into_iter().map(|key| (key, 1, 0, 0)));
        // A key still held is wanted over the window, so that its slots are
        // not given back the moment a queue runs dry between two tasks.
        self.recent.retain(|key, _| asked.contains(key) || self.held.contains_key(key));
        let mut requests = Vec::new();
        // The window moves on with the ticks of the loop; a settlement woken
        // between two (new work) only raises the current entry, so that the
        // window keeps its length in time however often work arrives.
        let next_entry = self.ticked.is_none_or(|at| now.saturating_duration_since(at) >= PERMITS_EVERY);
        if next_entry {
            self.ticked = Some(now);
        }
        for (key, capacity, wanted, running) in asks {
            let window = self.recent.entry(key.clone()).or_default();
            match window.back_mut() {
                Some(last) if !next_entry => *last = (*last).max(wanted),
                _ => window.push_back(wanted),
            }
            if window.len() > WANT_WINDOW {
                window.pop_front();
            }
            let want = window.iter().copied().max().unwrap_or(0);
            let known = self.held.contains_key(&key) || self.wanting.contains(&key);
            if want == 0 && running == 0 && !known {
                continue;
            }
            requests.push(store::cluster::PermitRequest { key, capacity, want, running });
        }
        requests
    }

    /// Whether settling `requests` must read the database. It need not
    /// when nothing the split depends on can have changed since the last
    /// read: no news of the other instances (`heard` is also true while
    /// none can be heard), the same keys with the same capacities and wants,
    /// every key held at its share (not waiting for slots, not keeping
    /// slots for tasks past it), the same turn of the split, and a read
    /// within `PERMITS_CHECK`.
    fn must_read(&self, requests: &[store::cluster::PermitRequest], heard: bool, now: Instant, turn: i64) -> bool {
        let Some(read) = &self.read else { return true };
        let same = |a: &store::cluster::PermitRequest, b: &store::cluster::PermitRequest| {
            a.key == b.key && a.capacity == b.capacity && a.want == b.want
        };
        heard
            || now.saturating_duration_since(read.at) >= PERMITS_CHECK
            || read.turn != turn
            || read.grants.iter().any(|grant| grant.held != grant.target)
            || read.requests.len() != requests.len()
            || !read.requests.iter().zip(requests).all(|(a, b)| same(a, b))
    }

    /// Records a settlement that read the database.
    fn record(
        &mut self,
        requests: Vec<store::cluster::PermitRequest>,
        grants: Vec<store::cluster::Grant>,
        at: Instant,
        turn: i64,
    ) {
        self.granted(&requests, &grants);
        self.read = Some(Read { requests, grants, at, turn });
    }

    /// Records what the database granted for `requests`.
    fn granted(&mut self, requests: &[store::cluster::PermitRequest], granted: &[store::cluster::Grant]) {
        self.held.clear();
        self.wanting.clear();
        for (request, grant) in requests.iter().zip(granted) {
            if grant.held > 0 {
                self.held.insert(request.key.clone(), grant.held);
            }
            if request.want > 0 {
                self.wanting.insert(request.key.clone());
            }
        }
    }
}

async fn settle_permits(
    member: &Member,
    last: &mut Settled,
    news: Option<&mut store::cluster::PermitNews>,
) -> Result<(), store::Error> {
    let node = &member.node;
    // Whatever is heard from here on is news to the next settlement.
    let heard = news.is_none_or(|news| {
        let changed = news.has_changed().unwrap_or(true);
        let listening = *news.borrow_and_update();
        changed || !listening
    });
    let demand = member.engine.permit_demand().await.map_err(engine_error)?;
    let requests = last.requests(demand, Instant::now());
    let turn = node.db_now_ms().div_euclid(10_000);
    if last.must_read(&requests, heard, Instant::now(), turn) {
        last.read = None;
        let store = node.store.clone();
        let (requests, grants) = tokio::task::spawn_blocking(move || {
            store.cluster().expect("cluster").permits(&requests).map(|grants| (requests, grants))
        })
        .await
        .map_err(|e| store::Error::Io(e.to_string()))??;
        last.record(requests, grants, Instant::now(), turn);
    }
    // The engine trimmed what it holds to what runs when it told its demand
    // (`Dispatch::demand`): it is told again what this instance holds.
    let held = &last.held;
    let types = held.iter().filter_map(|(key, n)| key.strip_prefix(TYPE_KEY).map(|t| (Arc::from(t), *n))).collect();
    let resources = held.keys().filter(|k| !k.starts_with(TYPE_KEY) && !k.starts_with(BUDGET_KEY)).cloned().collect();
    let budget = crate::budget::Held {
        cluster: held.get(crate::budget::CLUSTER_KEY).copied().unwrap_or(0),
        servers: held
            .iter()
            .filter_map(|(key, n)| Some((Arc::from(key.strip_prefix(crate::budget::SERVER_KEY)?), *n)))
            .collect(),
    };
    member.engine.set_permits(types, resources).await.map_err(engine_error)?;
    member.engine.set_budget_permits(budget).await.map_err(engine_error)
}

/// The loop of a server instance: heartbeat, then its share of the jobs.
pub(crate) async fn heartbeats(member: Arc<Member>) {
    let node = &member.node;
    // A beat that failed (most often a connection the network dropped) is
    // tried again soon on another connection, not a whole interval later:
    // a lossy link must not let the fence's silence build up.
    let mut again = Backoff::doubling(Duration::from_millis(100), node.timing.heartbeat);
    loop {
        let started = Instant::now();
        let pause = match beat(&member).await {
            Ok(()) => {
                again.reset();
                node.timing.heartbeat.saturating_sub(started.elapsed())
            }
            Err(store::Error::Fenced { .. }) => return deactivated(&member.engine, node),
            Err(e) => {
                let silent = node.beat_ok.lock().expect("beat lock").elapsed();
                tracing::warn!(error = %e, silent_for_ms = silent.as_millis() as u64, "heartbeat failed");
                again.next_pause()
            }
        };
        tokio::time::sleep(pause).await;
    }
}

/// An instance that cannot reach its database never hears that it was
/// deactivated: it judges its own lease. Once no heartbeat has gone through
/// for `Node::fence_after` (the lag less a margin), it fences itself before
/// any other instance may deactivate it: it ends every worker stream and
/// takes no new one (its workers go to another instance, and no lease is
/// renewed here), and reports itself not ready. Its writes, which the
/// database fences anyway, simply wait. A heartbeat that goes through again
/// (it was not deactivated) lifts the fence; one refused (it was) starts it
/// over as a new instance.
pub(crate) async fn fence(member: Arc<Member>) {
    let node = &member.node;
    let after = node.fence_after();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let silent = node.beat_ok.lock().expect("beat lock").elapsed();
        if silent > after && !node.fenced.send_replace(true) {
            tracing::error!(
                instance = %node.id,
                silent_for_ms = silent.as_millis() as u64,
                lag_ms = node.timing.lag.as_millis() as u64,
                workers = member.registry.len(),
                "no heartbeat reached the database for too long: this instance fences itself, lets its workers go and takes none until a heartbeat goes through"
            );
            member.registry.stop_all();
        }
    }
}

async fn beat(member: &Member) -> Result<(), store::Error> {
    let node = &member.node;
    let led = member.engine.active_jobs().await.map(|jobs| jobs.len()).unwrap_or(0);
    let workers = member.registry.workers();
    let mut detectors: BTreeSet<String> = BTreeSet::new();
    for worker in &workers {
        detectors.extend(worker.capabilities.iter().filter(|c| c.can_detect).map(|c| c.job_type.clone()));
    }
    let horizon = Duration::from_secs(60);
    let detections: Vec<String> = node
        .detected
        .lock()
        .expect("detected lock")
        .iter()
        .filter(|(_, at)| at.elapsed() < horizon)
        .map(|(t, _)| t.clone())
        .collect();
    let handlers: Vec<HandlerId> = workers.iter().map(|w| w.handler).collect();
    let beat = Beat {
        jobs_led: led,
        workers: workers.len(),
        detectors: detectors.into_iter().collect(),
        detections,
        handlers: handlers.clone(),
        may_judge: node.streak.lock().expect("streak lock").is_some_and(|since| since.elapsed() >= node.timing.lag),
    };
    let store = node.store.clone();
    let lag = node.timing.lag;
    let sent = node.clock.now().as_millis();
    let began = Instant::now();
    let writing = node.writing.clone().lock_owned().await;
    let membership = tokio::task::spawn_blocking(move || {
        let _writing = writing;
        store.cluster().expect("cluster").heartbeat(&beat, lag)
    })
    .await
    .map_err(|e| store::Error::Io(e.to_string()))
    .and_then(|beat| beat)
    .inspect_err(|_| *node.streak.lock().expect("streak lock") = None)?;
    // The database holds a heartbeat no older than `began`: whatever else
    // this beat does may fail, this instance is not silent.
    node.heartbeat_went_through(began);
    let returned = node.clock.now().as_millis();
    let midpoint = sent + (returned - sent) / 2;
    node.offset_ms.store(membership.now_ms - midpoint, Ordering::Relaxed);
    // The engine's maintenance windows follow the database's clock.
    let _ = member.engine.database_clock(membership.now_ms - midpoint).await;
    for gone in &membership.deactivated {
        tracing::warn!(instance = %gone, lag_ms = lag.as_millis() as u64, "deactivated a silent instance; its jobs are free to claim");
        member.metrics.note_deactivation();
        let payload = serde_json::json!({ "instance": gone.to_string(), "lag_ms": lag.as_millis() as u64 });
        member.notifier.record(crate::model::notify::Kind::InstanceLost, payload).await;
    }
    if let Some(me) = membership.instances.iter().find(|i| i.id == node.id) {
        node.paused.store(me.paused, Ordering::Relaxed);
    }
    // Workers connected to the other live instances are alive, though not here.
    let elsewhere = membership.instances.iter().filter(|i| i.id != node.id).flat_map(|i| i.handlers.iter().copied());
    let elsewhere: std::collections::HashSet<HandlerId> = elsewhere.filter(|h| !handlers.contains(h)).collect();
    let _ = member.engine.peer_handlers(elsewhere).await;
    let servers = membership.servers().count().max(1);
    let share = membership.active_jobs.div_ceil(servers);
    let unowned = membership.unowned_jobs;
    *node.membership.lock().expect("membership lock") = Some(membership);

    // Policies set through another instance apply here from the next beat.
    let (store, policies) = (node.store.clone(), member.policies.clone());
    match tokio::task::spawn_blocking(move || policies.refresh(&*store)).await {
        Ok(Ok(changed)) => {
            for job_type in changed {
                tracing::info!(job_type, "policy changed by another instance: applied here");
                member.policies.push_limits(&member.engine, &job_type).await;
            }
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "cannot read the policies again"),
        Err(e) => tracing::warn!(error = %e, "cannot read the policies again"),
    }
    // And the bandwidth budget.
    member.policies.push_budget(&member.engine).await;

    if led > share {
        let released = member.engine.release(led - share).await.map_err(engine_error)?;
        if !released.is_empty() {
            tracing::info!(released = released.len(), led, share, "released jobs above this instance's share");
        }
    } else if unowned > 0 {
        let store = node.store.clone();
        let up_to = share - led;
        let writing = node.writing.clone().lock_owned().await;
        let (claimed, shares) = tokio::task::spawn_blocking(move || {
            let _writing = writing;
            let claimed = store.cluster().expect("cluster").claim(up_to, &handlers)?;
            // The shares of the bandwidth budget their attempts were given.
            let shares = match claimed.is_empty() {
                true => Vec::new(),
                false => store.settings(crate::engine::SHARE_SETTINGS)?,
            };
            Ok::<_, store::Error>((claimed, shares))
        })
        .await
        .map_err(|e| store::Error::Io(e.to_string()))??;
        if !claimed.is_empty() {
            let n = claimed.len();
            member.engine.keep_shares(shares).await.map_err(engine_error)?;
            let adopted = member.engine.adopt(claimed).await.map_err(engine_error)?;
            node.adoptions.fetch_add(1, Ordering::AcqRel);
            node.wake_permits();
            tracing::info!(claimed = n, adopted, led = led + adopted, share, "took the lead of jobs nobody led");
            check_adopted(member);
        }
    }
    Ok(())
}

/// An adopted job may hold attempts its dead leader made durable and never
/// handed over: once the delivery grace has passed for all of them, this
/// instance runs its part of the recovery check (R2-undelivered takes them
/// back), rather than waiting for the periodic check, which can come up to
/// an interval later. The part runs single-flight here, as it does when the
/// periodic check asks for it.
fn check_adopted(member: &Member) {
    let (recovery, grace) = (member.recovery.clone(), member.delivery_grace);
    member.duties.spawn(async move {
        tokio::time::sleep(grace + Duration::from_millis(100)).await;
        match recovery.check(false).await {
            Ok(findings) => {
                tracing::info!(n_findings = findings.len(), "checked the jobs adopted a delivery grace ago")
            }
            Err(e) => tracing::debug!(error = %e, "the check of adopted jobs did not run"),
        }
    });
}

fn engine_error(e: crate::engine::Error) -> store::Error {
    match e {
        crate::engine::Error::Store(e) => e,
        other => store::Error::Io(other.to_string()),
    }
}

/// This instance was deactivated: it stops acting at once, and `main`
/// starts the process over as a new instance (a new id), as if restarted.
/// Its workers keep their attempts through it, as through any restart.
pub(crate) fn deactivated(engine: &EngineHandle, node: &Node) {
    tracing::error!(instance = %node.id, "deactivated by the cluster: its writes are refused");
    engine.fate().meet(crate::fate::Fatal::Deactivated);
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::Settled;
    use crate::dispatch::{Demand, TypeDemand};
    use crate::store::cluster::{Grant, PermitRequest};

    impl Settled {
        /// Requests one tick of the loop after the last.
        fn requests_at(&mut self, demand: Demand) -> Vec<PermitRequest> {
            let now = self.ticked.map_or_else(Instant::now, |at| at + super::PERMITS_EVERY);
            self.requests(demand, now)
        }
    }

    /// Grants at their share, holding `held`.
    fn at_share(held: &[u32]) -> Vec<Grant> {
        held.iter().map(|&held| Grant { held, target: held }).collect()
    }

    fn volume(locked: bool) -> Demand {
        Demand { types: vec![], resources: [("volume:7".to_string(), locked)].into(), budget: vec![] }
    }

    fn wants(requests: &[PermitRequest]) -> Vec<(&str, u32)> {
        requests.iter().map(|r| (r.key.as_str(), r.want)).collect()
    }

    #[test]
    fn an_instance_that_gave_its_slot_back_while_wanting_it_says_when_it_no_longer_does() {
        let mut settled = Settled::default();
        // Its task on the volume runs under the slot it holds.
        let requests = settled.requests_at(volume(true));
        assert_eq!(wants(&requests), [("volume:7", 1)]);
        settled.granted(&requests, &at_share(&[1]));
        // The task ended; the slot is still wanted over the window, but the
        // split now gives it to another instance, so it is given back.
        let requests = settled.requests_at(Demand::default());
        assert_eq!(wants(&requests), [("volume:7", 1)], "wanted over the window while held");
        settled.granted(&requests, &at_share(&[0]));
        // Nothing held, nothing to run: the database is told the want is 0,
        // once, and then the key is forgotten.
        let requests = settled.requests_at(Demand::default());
        assert_eq!(wants(&requests), [("volume:7", 0)], "the want ends in the database");
        settled.granted(&requests, &at_share(&[0]));
        assert!(settled.requests_at(Demand::default()).is_empty());
        assert!(settled.recent.is_empty() && settled.held.is_empty() && settled.wanting.is_empty());
    }

    #[test]
    fn a_type_that_ran_dry_after_giving_its_slots_back_ends_its_want() {
        let noop = |queued, running| Demand {
            types: vec![TypeDemand { job_type: "noop".into(), limit: 2, queued, running }],
            resources: Default::default(),
            budget: vec![],
        };
        let mut settled = Settled::default();
        let requests = settled.requests_at(noop(3, 0));
        assert_eq!(wants(&requests), [("type:noop", 2)]);
        // Another instance has the slots at every settlement, then the queue
        // is emptied (its jobs canceled): the want lasts the window, then 0
        // is sent even though no slot was ever held here.
        settled.granted(&requests, &at_share(&[0]));
        let mut sent = Vec::new();
        for _ in 0..super::WANT_WINDOW + 2 {
            let requests = settled.requests_at(noop(0, 0));
            sent.push(requests.first().map(|r| r.want));
            settled.granted(&requests, &at_share(&vec![0; requests.len()]));
        }
        // The first want of 2 is in the window for its next 7 settlements.
        let mut expected = vec![Some(2); super::WANT_WINDOW - 1];
        expected.extend([Some(0), None, None]);
        assert_eq!(sent, expected);
    }

    #[test]
    fn a_key_held_and_asked_for_no_more_is_given_back() {
        let mut settled = Settled::default();
        let requests = settled.requests_at(volume(false));
        settled.granted(&requests, &at_share(&[1]));
        // The job was canceled: its volume is asked for no more.
        for _ in 0..super::WANT_WINDOW {
            let requests = settled.requests_at(Demand::default());
            assert_eq!(requests.len(), 1);
            settled.granted(&requests, &at_share(&[1]));
        }
        let requests = settled.requests_at(Demand::default());
        assert_eq!(wants(&requests), [("volume:7", 0)]);
        assert_eq!(requests[0].running, 0);
    }

    #[test]
    fn a_settlement_reads_the_database_only_when_the_split_may_have_changed() {
        let noop = |limit, queued, running| Demand {
            types: vec![TypeDemand { job_type: "noop".into(), limit, queued, running }],
            resources: Default::default(),
            budget: vec![],
        };
        let grant = |held, target| vec![Grant { held, target }];
        let start = Instant::now();
        let later = start + super::PERMITS_CHECK;
        let mut settled = Settled::default();
        let requests = settled.requests_at(noop(4, 10, 0));
        assert!(settled.must_read(&requests, false, start, 1), "nothing read yet");
        settled.record(requests, grant(2, 2), start, 1);
        // The same want, its share held, no news: what runs changes nothing.
        let requests = settled.requests_at(noop(4, 8, 2));
        assert!(!settled.must_read(&requests, false, later - Duration::from_millis(1), 1));
        assert!(settled.must_read(&requests, true, start, 1), "news of another instance");
        assert!(settled.must_read(&requests, false, start, 2), "a new turn of the split");
        assert!(settled.must_read(&requests, false, start + super::PERMITS_CHECK, 1), "the check is due");
        let other_limit = settled.requests_at(noop(3, 8, 2));
        assert!(settled.must_read(&other_limit, false, start, 1), "the capacity changed");
        // Waiting for slots, or keeping slots past the share: read each time.
        let requests = settled.requests_at(noop(4, 8, 2));
        settled.record(requests, grant(1, 2), start, 1);
        let requests = settled.requests_at(noop(4, 8, 1));
        assert!(settled.must_read(&requests, false, start, 1), "waiting for a slot");
        settled.record(requests, grant(3, 2), start, 1);
        let requests = settled.requests_at(noop(4, 8, 3));
        assert!(settled.must_read(&requests, false, start, 1), "keeping a slot past the share");
        // The queue runs dry: the want falls once the window has passed.
        settled.record(requests, grant(2, 2), start, 1);
        let mut reads = 0;
        for _ in 0..super::WANT_WINDOW {
            let requests = settled.requests_at(noop(4, 0, 0));
            if settled.must_read(&requests, false, start, 1) {
                reads += 1;
                settled.record(requests, grant(0, 0), start, 1);
            }
        }
        assert_eq!(reads, 1, "the want of 0 is read once, when the window has passed");
    }

    #[test]
    fn settlements_between_two_ticks_do_not_move_the_window() {
        let noop = |queued| Demand {
            types: vec![TypeDemand { job_type: "noop".into(), limit: 4, queued, running: 0 }],
            resources: Default::default(),
            budget: vec![],
        };
        let start = Instant::now();
        let mut settled = Settled::default();
        assert_eq!(wants(&settled.requests(noop(9), start)), [("type:noop", 4)]);
        // The queue ran dry; twenty settlements within the tick still want 4.
        for k in 1..=20 {
            let requests = settled.requests(noop(0), start + Duration::from_millis(10 * k));
            assert_eq!(wants(&requests), [("type:noop", 4)]);
        }
        // The window then moves one entry a tick: 4 is wanted for the rest
        // of it, and then nothing is asked (no database was ever told).
        let mut sent = Vec::new();
        for k in 1..=super::WANT_WINDOW as u32 {
            let requests = settled.requests(noop(0), start + super::PERMITS_EVERY * k);
            sent.push(requests.first().map(|r| r.want));
        }
        let mut expected = vec![Some(4); super::WANT_WINDOW - 1];
        expected.push(None);
        assert_eq!(sent, expected);
    }
}

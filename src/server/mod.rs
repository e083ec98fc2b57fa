//! The admin server: the engine behind a gRPC port (the worker stream and
//! the client API) and an HTTP port (JSON API, health, the port lookup that
//! workers make first), plus optional in-process workers.

pub(crate) mod cluster;
pub(crate) mod duties;
mod file_changes;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod notify;
pub(crate) mod policies;
pub mod seaweedfs;
pub(crate) mod surface;
pub(crate) mod workers;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::StreamExt;

pub use surface::access::table as access;
pub use workers::registry::Registry;
pub use workers::stream::handler_of;

use crate::clock::{Clock, SystemClock};
use crate::engine::{Engine, EngineHandle, Options, Orphans};
use crate::jobfile::Limits;
use crate::proto::api::job_service_server::JobServiceServer;
use crate::proto::peer::peer_service_server::PeerServiceServer;
use crate::proto::plugin::plugin_control_service_server::PluginControlServiceServer;
use crate::store::cluster::Role;
use crate::store::Store;
use crate::worker::{builtin_handlers, LocalExecutor, Registry as HandlerRegistry};
pub use cluster::Topology;
use duties::Stage;

#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// The SeaweedFS masters: given to workers in the cluster context, and
    /// acted on (locks, the master's vacuum, its filers and S3 servers).
    pub masters: seaweedfs::master::Masters,
    pub heartbeat_interval: Duration,
    /// How long after a start attempts held by workers of the previous run
    /// wait for their worker to come back before they run again elsewhere.
    pub orphan_grace: Duration,
    pub local_workers: u32,
    pub local_worker_slots: u32,
    /// The `--token-file` token, an admin's: what a client presents, and
    /// what this instance presents to the others unless `peer_token` is given.
    pub token: Option<String>,
    /// The credentials file: named tokens with their roles.
    pub credentials: Option<std::path::PathBuf>,
    /// The notifications file: webhook endpoints and the events each wants.
    pub notify: Option<std::path::PathBuf>,
    /// The token this instance presents to the others (role `instance`).
    pub peer_token: Option<String>,
    /// TLS to the others, when they serve it: the CA that signed their
    /// certificates, and this instance's certificate to present.
    pub peer_tls: Option<crate::tls::ClientTls>,
    /// Unknown credentials an address may present in a minute before its
    /// answers slow down.
    pub free_credential_failures: u32,
    pub limits: Limits,
    /// The largest request (a submitted job file) the API takes.
    pub max_request_bytes: usize,
    /// The largest message a worker may send on its stream.
    pub max_worker_message_bytes: usize,
    pub lost_attempt_limit: u32,
    /// Workers connected at once; more are refused until one leaves.
    pub max_workers: usize,
    /// TLS (and mutual TLS) on the gRPC port.
    pub tls: Option<tonic::transport::ServerTlsConfig>,
    /// A worker silent for longer loses its attempts (recovery R3).
    pub silence_timeout: Duration,
    /// How often the recovery check runs.
    pub recovery_interval: Duration,
    /// A job whose tasks all ended is finalized by recovery after this (R5).
    pub finalize_grace: Duration,
    /// A held task without progress for longer is taken back (R3-progress).
    pub progress_timeout: Duration,
    /// A held task its connected worker never got is taken back after this (R2-undelivered).
    pub delivery_grace: Duration,
    /// Heartbeat and lag threshold of the instances sharing a database.
    pub cluster: cluster::Timing,
    /// How long and how many ended jobs are kept.
    pub retention: crate::retention::Retention,
    /// How often ended jobs past the retention rules are removed.
    pub prune_interval: Duration,
    /// How long jobcenter holds the cluster's `shell` lock at a stretch.
    pub cluster_lock_turn: Duration,
    /// A connection whose client takes no bytes for this long is closed.
    pub send_timeout: Duration,
    /// The gRPC address other instances reach this one at, when it is not
    /// the one it listens on.
    pub advertise_grpc: Option<String>,
    /// Spans of jobs, attempts and store commits are made for the trace
    /// export (`--otlp-endpoint`), and attempts carry theirs to the workers.
    pub traces: bool,
    /// How long a wait makes up for one level of priority.
    pub priority_aging: Duration,
}

impl Default for ServerOptions {
    fn default() -> ServerOptions {
        ServerOptions {
            masters: seaweedfs::master::Masters::default(),
            heartbeat_interval: Duration::from_secs(15),
            orphan_grace: Duration::from_secs(30),
            local_workers: 0,
            local_worker_slots: 4,
            token: None,
            credentials: None,
            notify: None,
            peer_token: None,
            peer_tls: None,
            free_credential_failures: 5,
            limits: Limits::default(),
            max_request_bytes: 64 * 1024 * 1024,
            max_worker_message_bytes: 16 * 1024 * 1024,
            lost_attempt_limit: 3,
            max_workers: 16_384,
            tls: None,
            silence_timeout: Duration::from_secs(300),
            recovery_interval: Duration::from_secs(60),
            finalize_grace: Duration::from_secs(60),
            progress_timeout: Duration::from_secs(24 * 3600),
            delivery_grace: Duration::from_secs(30),
            cluster: cluster::Timing::default(),
            retention: crate::retention::Retention::default(),
            prune_interval: Duration::from_secs(60),
            cluster_lock_turn: seaweedfs::master::Turns::default().turn,
            send_timeout: Duration::from_secs(30),
            advertise_grpc: None,
            traces: false,
            priority_aging: Duration::from_secs(600),
        }
    }
}

/// Measurements the server keeps about itself.
pub struct Stats {
    /// From a completion reaching the server to the execute request of a task it released leaving.
    dispatch_us: std::sync::Mutex<hdrhistogram::Histogram<u64>>,
}

impl Default for Stats {
    fn default() -> Stats {
        let histogram = hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
        Stats { dispatch_us: std::sync::Mutex::new(histogram) }
    }
}

impl Stats {
    pub fn record_dispatch(&self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX).clamp(1, 60_000_000);
        let _ = self.dispatch_us.lock().expect("stats lock").record(micros);
    }

    /// (count, p50, p99) of dispatch latency in microseconds.
    pub fn dispatch(&self) -> (u64, u64, u64) {
        let h = self.dispatch_us.lock().expect("stats lock");
        (h.len(), h.value_at_quantile(0.5), h.value_at_quantile(0.99))
    }
}

/// Runs the server on listeners that are already bound until `shutdown`
/// resolves, then stops in order: it takes no more work (the listeners
/// close, worker streams end, the duties that take work end); it hands its
/// jobs over (the engine writes its last steps, then the instance leaves
/// its cluster); it flushes the store; it closes (every duty has ended).
/// A fatal condition ends it at once, as the error `crate::fate::Fatal`.
pub async fn run(
    store: Arc<dyn Store>,
    options: ServerOptions,
    http: TcpListener,
    grpc: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    surface::descriptors::raise_limit(options.max_workers);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let grpc_addr: SocketAddr = grpc.local_addr()?;
    let http_addr: SocketAddr = http.local_addr()?;
    let topology = match store.cluster() {
        Some(_) => {
            let (store, clock, timing) = (store.clone(), clock.clone(), options.cluster);
            let advertised = options.advertise_grpc.clone();
            let join = move || {
                let (grpc, http) = (advertised.unwrap_or_else(|| grpc_addr.to_string()), http_addr.to_string());
                cluster::Node::join(store, clock, Role::Server, grpc, http, timing)
            };
            Topology::Member(Arc::new(tokio::task::spawn_blocking(join).await.map_err(Error::from_join)??))
        }
        None => Topology::Alone,
    };
    let (parts, loops) = assemble(store.clone(), &options, clock, topology, grpc_addr.port()).await?;
    let engine = parts.engine.clone();
    let fate = engine.fate().clone();
    if let Topology::Member(_) = &parts.topology {
        // Nothing of a limited type, and nothing on a volume, runs here
        // before the permits duty holds its first permits.
        engine.set_permits(Default::default(), Default::default()).await?;
        // Nor anything that shares the bandwidth budget.
        engine.set_budget_permits(Default::default()).await?;
    }
    for _ in 0..options.local_workers {
        let handlers = HandlerRegistry::new(builtin_handlers());
        LocalExecutor::start(engine.clone(), handlers, options.local_worker_slots, None).await?;
    }
    keep_duties(&parts, loops);

    let worker_service = PluginControlServiceServer::new(parts.workers.clone())
        .max_decoding_message_size(options.max_worker_message_bytes)
        .max_encoding_message_size(options.max_worker_message_bytes);
    // A streamed submission's chunks (1 MiB) always fit in one message.
    let job_service = JobServiceServer::new(parts.jobs.clone())
        .max_decoding_message_size(options.max_request_bytes.max(2 * 1024 * 1024))
        .max_encoding_message_size(options.max_request_bytes.max(64 * 1024 * 1024));

    let closing = tokio_util::sync::CancellationToken::new();
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = options.tls.clone() {
        builder = builder.tls_config(tls)?;
    }
    let grpc_server = builder
        .layer(surface::access::grpc::Guard { access: parts.access.clone(), trail: parts.http.api.trail.clone() })
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .max_concurrent_streams(Some(u32::try_from(options.max_workers).unwrap_or(u32::MAX).saturating_add(256)))
        .add_service(worker_service)
        .add_service(job_service)
        .add_service(PeerServiceServer::new(parts.peer.clone()))
        // Small messages (an acknowledgement, then a work order) must not wait
        // for each other's TCP acknowledgement: no Nagle on the worker streams.
        .serve_with_incoming_shutdown(
            // An accept that fails (out of descriptors) is said and waited
            // out here: tonic would try again at once, and spin.
            tonic::transport::server::TcpIncoming::from(grpc).with_nodelay(Some(true)).then(
                move |accepted| async move {
                    if let Err(e) = &accepted {
                        surface::descriptors::accept_failed(e, "grpc").await;
                    }
                    accepted.map(|stream| surface::stall::Bounded::new(stream, options.send_timeout))
                },
            ),
            closing.clone().cancelled_owned(),
        );
    let http = surface::stall::HttpListener { listener: http, limit: options.send_timeout };
    let http_server = axum::serve(
        http,
        surface::http::router(parts.http.clone()).into_make_service_with_connect_info::<surface::stall::Remote>(),
    )
    .with_graceful_shutdown(closing.clone().cancelled_owned());
    match &parts.topology {
        Topology::Member(node) => {
            eprintln!("jobcenter server listening: http {http_addr} grpc {grpc_addr} instance {}", node.id)
        }
        Topology::Alone => eprintln!("jobcenter server listening: http {http_addr} grpc {grpc_addr}"),
    }
    tracing::info!(%http_addr, %grpc_addr, "listening");
    let mut serve = std::pin::pin!(async { tokio::join!(grpc_server, http_server) });
    tokio::select! {
        (grpc_result, http_result) = &mut serve => {
            grpc_result?;
            http_result?;
        }
        () = shutdown => {
            // Take no more work: the listeners close, and worker streams,
            // which live as long as their workers, end.
            closing.cancel();
            parts.registry.stop_all();
            parts.duties.stop_intake().await;
            tokio::select! {
                (grpc_result, http_result) = &mut serve => {
                    for e in [grpc_result.err().map(Error::from), http_result.err().map(Error::from)].into_iter().flatten() {
                        tracing::warn!(error = %e, "a listener ended with an error while stopping");
                    }
                }
                () = tokio::time::sleep(Duration::from_secs(10)) => {
                    tracing::warn!("connections still open 10 s after the stop signal; stopping anyway");
                }
                fatal = fate.met() => return Err(fatal.into()),
            }
        }
        // Nothing of this instance may go on: no hand-over, no last writes.
        fatal = fate.met() => return Err(fatal.into()),
    }
    stop(&parts).await;
    match fate.fatal() {
        Some(fatal) => Err(fatal.clone().into()),
        None => Ok(()),
    }
}

/// Why the server could not start, or stopped other than when told to.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A condition this instance cannot go on with (`crate::fate`).
    #[error(transparent)]
    Fatal(#[from] crate::fate::Fatal),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Store(#[from] crate::store::Error),
    #[error(transparent)]
    Engine(#[from] crate::engine::Error),
    #[error(transparent)]
    Tls(#[from] crate::tls::Error),
    #[error(transparent)]
    Credentials(#[from] surface::access::credentials::FileError),
    /// The notifications file breaks a rule.
    #[error(transparent)]
    Notify(surface::access::credentials::FileError),
    #[error("the gRPC server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("a start-up step stopped: {0}")]
    Panicked(String),
}

impl Error {
    fn from_join(error: tokio::task::JoinError) -> Error {
        Error::Panicked(crate::fate::panic_text(error))
    }
}

/// The steps of a stop after the intake: hand the jobs over, flush, close.
async fn stop(parts: &Parts) {
    // The engine writes its last steps while this instance still leads.
    parts.engine.close().await;
    parts.duties.stop_all().await;
    let store = parts.engine.store().clone();
    if let Topology::Member(node) = &parts.topology {
        // A clean stop hands the jobs over at once instead of after the lag.
        parts.engine.fate().leaving();
        if let Err(e) = node.leave().await {
            tracing::warn!(instance = %node.id, error = %e, "could not leave the cluster cleanly; the others will notice the silence");
        }
    }
    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || store.flush()).await {
        tracing::warn!(error = %e, "the last flush failed");
    }
}

/// Starts every background duty this server has, in one supervised set.
fn keep_duties(parts: &Parts, loops: Loops) {
    let Loops { recovery, pruner, scheduler, seaweedfs, clock, cluster, foreign_orders, notifier } = loops;
    let duties = &parts.duties;
    let schedules = parts.http.api.schedules.clone();
    duties.keep("schedules", Stage::Intake, move || schedules.clone().runs());
    let n = notifier.clone();
    duties.keep("notifications", Stage::Intake, move || n.clone().delivers());
    duties.keep("notifications file", Stage::Intake, move || notifier.clone().reloads());
    if parts.access.file().is_some() {
        let access = parts.access.clone();
        duties.keep("credentials", Stage::Intake, move || access.clone().reloads());
    }
    duties.keep("file descriptors", Stage::Intake, || surface::descriptors::watch(Duration::from_secs(10)));
    duties.keep("recovery", Stage::Intake, move || recovery.clone().checks());
    duties.keep("retention", Stage::Intake, move || pruner.clone().prunes());
    if seaweedfs.has_masters() {
        seaweedfs::master::keep_duties(duties, &seaweedfs, &parts.engine, &clock, &parts.registry);
    }
    let Some((member, lending)) = cluster else {
        duties.keep("scheduler", Stage::Intake, move || scheduler.clone().detections());
        return;
    };
    let node = member.node.clone();
    duties.keep("scheduler", Stage::Intake, move || scheduler.clone().cluster_detections(node.clone()));
    let m = member.clone();
    duties.keep("permits", Stage::Intake, move || cluster::permits(m.clone()));
    let l = lending.clone();
    duties.keep("borrower", Stage::Intake, move || l.clone().borrower());
    let orders = Arc::new(tokio::sync::Mutex::new(foreign_orders));
    duties.keep("foreign orders", Stage::Intake, move || lending.clone().foreign_orders(orders.clone()));
    let m = member.clone();
    duties.keep("heartbeats", Stage::Membership, move || cluster::heartbeats(m.clone()));
    duties.keep("fence", Stage::Membership, move || cluster::fence(member.clone()));
}

/// Work orders for handlers connected to other instances, with their
/// handler; a duty started again takes the receiver over.
type ForeignReceiver = Arc<tokio::sync::Mutex<ForeignOrders>>;
type ForeignOrders = tokio::sync::mpsc::UnboundedReceiver<(crate::model::HandlerId, crate::dispatch::WorkOrder)>;

/// What the server serves, as `assemble` built and wired it: the engine,
/// the services of its two ports, and what a stop ends (the worker
/// sessions, the duties; in a cluster, the membership). Each service holds
/// the handles it uses and nothing else; only `run`, `stop` and
/// `keep_duties` (and the fuzzing admin) hold this.
struct Parts {
    engine: EngineHandle,
    topology: Topology,
    registry: Registry,
    duties: duties::Duties,
    workers: workers::stream::WorkerStreamService,
    jobs: surface::api::JobServiceImpl,
    peer: cluster::peer::PeerServiceImpl,
    http: surface::http::AppState,
    /// Who may do what: the gRPC port's guard, and the credentials file's reloads.
    access: surface::access::Access,
}

/// The loops `keep_duties` starts, each with the handles it uses.
struct Loops {
    recovery: Arc<duties::recovery::Recovery>,
    pruner: Arc<duties::retention::Pruner>,
    scheduler: Arc<duties::scheduler::Scheduler>,
    seaweedfs: seaweedfs::SeaweedFs,
    /// For the capacity view's changes.
    clock: Arc<dyn Clock>,
    /// In a cluster: this instance as a member (permits, heartbeats, the
    /// fence) and its part in the work across instances.
    cluster: Option<(Arc<cluster::Member>, Arc<cluster::peer::Lending>)>,
    /// The work orders the engine gives for handlers connected to other instances.
    foreign_orders: ForeignOrders,
    /// Webhook deliveries, and the notifications file's reloads.
    notifier: Arc<notify::Notifier>,
}

/// Builds the server over `store`: the engine, the policy book, and each
/// part with the handles it uses, wired to one another; what it serves, and
/// the loops `keep_duties` starts (which it does not start).
async fn assemble(
    store: Arc<dyn Store>,
    options: &ServerOptions,
    clock: Arc<dyn Clock>,
    topology: Topology,
    grpc_port: u16,
) -> Result<(Parts, Loops), Error> {
    let notify = match &options.notify {
        Some(path) => notify::file::read(path).map_err(Error::Notify)?,
        None => notify::file::Config::default(),
    };
    let (engine, policies, fate, foreign_orders) =
        start_engine(store, options, clock.clone(), &topology, notify.routes()).await?;
    let credentials = match &options.credentials {
        Some(path) => Some((path.clone(), surface::access::credentials::read(path)?)),
        None => None,
    };
    let access =
        surface::access::Access::with_slowdown(options.token.clone(), credentials, options.free_credential_failures);
    let handles = Handles::new(engine, policies, clock, topology, fate, access, options);
    handles.notifier.use_config(notify);
    let scheduler = Arc::new(handles.scheduler(options));
    let recovery = Arc::new(handles.recovery(options));
    let pruner = Arc::new(handles.pruner(options));
    let workers = workers::stream::WorkerStreamService::new(Arc::new(handles.worker_sessions(options)));
    let peer = cluster::peer::PeerServiceImpl::new(
        handles.engine.clone(),
        handles.peers.clone(),
        handles.registry.clone(),
        handles.topology.clone(),
        options.orphan_grace,
    );
    let api = surface::api::Api {
        engine: handles.engine.clone(),
        registry: handles.registry.clone(),
        topology: handles.topology.clone(),
        peers: handles.peers.clone(),
        policies: handles.policies.clone(),
        metrics: handles.metrics.clone(),
        scheduler: scheduler.clone(),
        recovery: recovery.clone(),
        pruner: pruner.clone(),
        seaweedfs: handles.seaweedfs.clone(),
        limits: options.limits.clone(),
        grpc_port,
        trail: surface::audit::Trail { engine: handles.engine.clone(), clock: handles.clock.clone() },
        notifier: handles.notifier.clone(),
        schedules: Arc::new(duties::schedules::Schedules::new(
            handles.engine.clone(),
            handles.clock.clone(),
            handles.topology.clone(),
            handles.peers.clone(),
            options.limits.clone(),
            handles.policies.clone(),
        )),
    };
    let http = handles.http(api.clone(), &recovery, &pruner, options, grpc_port);
    let cluster = handles.topology.member().map(|node| handles.cluster(node, &recovery, options, grpc_port));
    handles.engine.on_commit(Arc::new(handles.metrics.commit_observer()));
    handles.metrics.declare_recovery_rules(&[
        "R1",
        "R2",
        "R2-undelivered",
        "R3",
        "R3-pinned",
        "R3-progress",
        "R4",
        "R5",
        "R6",
    ]);
    let jobs = surface::api::JobServiceImpl::new(api);
    let Handles { engine, topology, registry, duties, seaweedfs, clock, access, notifier, .. } = handles;
    let parts = Parts { engine, topology, registry, duties, workers, jobs, peer, http, access };
    let loops = Loops { recovery, pruner, scheduler, seaweedfs, clock, cluster, foreign_orders, notifier };
    Ok((parts, loops))
}

/// Starts the engine over `store` and loads the policy book, each job
/// type's limits pushed to the engine; with them, the server's fate and
/// the work orders the engine gives for handlers of other instances.
async fn start_engine(
    store: Arc<dyn Store>,
    options: &ServerOptions,
    clock: Arc<dyn Clock>,
    topology: &Topology,
    notify: crate::model::notify::Routes,
) -> Result<(EngineHandle, policies::Policies, crate::fate::Fate, ForeignOrders), Error> {
    let (foreign_sender, foreign_orders) = tokio::sync::mpsc::unbounded_channel();
    let fate = crate::fate::Fate::default();
    let member = topology.member();
    let engine_options = Options {
        foreign_orders: member.is_some().then_some(foreign_sender),
        orphans: Orphans::Keep { grace: options.orphan_grace },
        lost_attempt_limit: options.lost_attempt_limit,
        instance: member.map(|n| n.id).unwrap_or_default(),
        rollback_windows: seaweedfs::master::rollback_windows(),
        fate: fate.clone(),
        notify,
        traces: options.traces,
        priority_aging: options.priority_aging,
        database_clock: member.is_some(),
        ..Options::default()
    };
    let engine = Engine::start(store.clone(), clock, engine_options).await?;
    let policies = {
        let engine = engine.clone();
        tokio::task::spawn_blocking(move || policies::Policies::load(store, engine))
            .await
            .map_err(Error::from_join)??
    };
    for job_type in policies.job_types().iter().map(String::as_str).chain(["noop", "shell"]) {
        policies.push_limits(&engine, job_type).await;
    }
    Ok((engine, policies, fate, foreign_orders))
}

/// The handles several parts share while the server is built, each cheap
/// to clone: every part takes the ones it uses, and this goes once they
/// are wired.
struct Handles {
    engine: EngineHandle,
    policies: policies::Policies,
    clock: Arc<dyn Clock>,
    topology: Topology,
    registry: Registry,
    duties: duties::Duties,
    metrics: Arc<surface::metrics::Metrics>,
    stats: Arc<Stats>,
    access: surface::access::Access,
    peers: cluster::peer::Peers,
    seaweedfs: seaweedfs::SeaweedFs,
    board: duties::scheduler::Board,
    reports: cluster::peer::Reports,
    notifier: Arc<notify::Notifier>,
}

impl Handles {
    fn new(
        engine: EngineHandle,
        policies: policies::Policies,
        clock: Arc<dyn Clock>,
        topology: Topology,
        fate: crate::fate::Fate,
        access: surface::access::Access,
        options: &ServerOptions,
    ) -> Handles {
        let duties = duties::Duties::new(fate);
        let token = options.peer_token.as_deref().or(options.token.as_deref());
        let peers = cluster::peer::Peers::new(token, options.peer_tls.clone(), duties.clone());
        let board = duties::scheduler::Board::new(engine.clone(), clock.clone(), duties.clone());
        let reports =
            cluster::peer::Reports { topology: topology.clone(), peers: peers.clone(), engine: engine.clone() };
        let metrics = Arc::new(surface::metrics::Metrics::new());
        let notifier = Arc::new(notify::Notifier::new(
            options.notify.clone(),
            engine.clone(),
            clock.clone(),
            topology.clone(),
            metrics.clone(),
        ));
        Handles {
            engine,
            policies,
            clock,
            topology,
            registry: Registry::default(),
            duties,
            metrics,
            stats: Arc::new(Stats::default()),
            access,
            peers,
            seaweedfs: seaweedfs::SeaweedFs::new(options.masters.clone(), options.cluster_lock_turn),
            board,
            reports,
            notifier,
        }
    }

    fn scheduler(&self, options: &ServerOptions) -> duties::scheduler::Scheduler {
        duties::scheduler::Scheduler {
            board: self.board.clone(),
            registry: self.registry.clone(),
            policies: self.policies.clone(),
            topology: self.topology.clone(),
            peers: self.peers.clone(),
            metrics: self.metrics.clone(),
            seaweedfs: self.seaweedfs.clone(),
            limits: options.limits.clone(),
            notifier: self.notifier.clone(),
        }
    }

    fn recovery(&self, options: &ServerOptions) -> duties::recovery::Recovery {
        duties::recovery::Recovery {
            gate: Arc::default(),
            engine: self.engine.clone(),
            clock: self.clock.clone(),
            registry: self.registry.clone(),
            topology: self.topology.clone(),
            peers: self.peers.clone(),
            metrics: self.metrics.clone(),
            board: self.board.clone(),
            settings: duties::recovery::Settings {
                silence_timeout: options.silence_timeout,
                finalize_grace: options.finalize_grace,
                progress_timeout: options.progress_timeout,
                delivery_grace: options.delivery_grace,
                interval: options.recovery_interval,
                orphan_grace: options.orphan_grace,
                cluster: options.cluster,
                limits: options.limits.clone(),
            },
            notifier: self.notifier.clone(),
        }
    }

    fn pruner(&self, options: &ServerOptions) -> duties::retention::Pruner {
        duties::retention::Pruner {
            gate: Arc::default(),
            engine: self.engine.clone(),
            clock: self.clock.clone(),
            metrics: self.metrics.clone(),
            topology: self.topology.clone(),
            retention: options.retention.clone(),
            interval: options.prune_interval,
        }
    }

    fn worker_sessions(&self, options: &ServerOptions) -> workers::stream::WorkerSessions {
        workers::stream::WorkerSessions {
            engine: self.engine.clone(),
            registry: self.registry.clone(),
            clock: self.clock.clone(),
            topology: self.topology.clone(),
            peers: self.peers.clone(),
            reports: self.reports.clone(),
            board: self.board.clone(),
            policies: self.policies.clone(),
            seaweedfs: self.seaweedfs.clone(),
            stats: self.stats.clone(),
            duties: self.duties.clone(),
            settings: workers::stream::Settings {
                max_workers: options.max_workers,
                heartbeat_interval: options.heartbeat_interval,
                orphan_grace: options.orphan_grace,
                silence_timeout: options.silence_timeout,
            },
            notifier: self.notifier.clone(),
        }
    }

    /// The HTTP port's state: the API, the console's sessions and what a scrape reads.
    fn http(
        &self,
        api: surface::api::Api,
        recovery: &duties::recovery::Recovery,
        pruner: &duties::retention::Pruner,
        options: &ServerOptions,
        grpc_port: u16,
    ) -> surface::http::AppState {
        let scrape = surface::metrics::Scrape {
            metrics: self.metrics.clone(),
            engine: self.engine.clone(),
            registry: self.registry.clone(),
            policies: self.policies.clone(),
            scheduler: self.board.clone(),
            recovery: recovery.gate.clone(),
            prune: pruner.gate.clone(),
            stats: self.stats.clone(),
            topology: self.topology.clone(),
            recovery_interval: options.recovery_interval,
            started_ms: self.clock.now().as_millis(),
        };
        surface::http::AppState {
            api,
            access: self.access.clone(),
            sessions: Arc::new(surface::console::Sessions::new(self.engine.store())),
            scrape: Arc::new(scrape),
            stats: self.stats.clone(),
            topology: self.topology.clone(),
            engine: self.engine.clone(),
            grpc_port,
            max_request_bytes: options.max_request_bytes,
        }
    }

    /// This instance as a member of its cluster, and its part in the work across instances.
    fn cluster(
        &self,
        node: &Arc<cluster::Node>,
        recovery: &Arc<duties::recovery::Recovery>,
        options: &ServerOptions,
        grpc_port: u16,
    ) -> (Arc<cluster::Member>, Arc<cluster::peer::Lending>) {
        let member = cluster::Member {
            node: node.clone(),
            engine: self.engine.clone(),
            registry: self.registry.clone(),
            policies: self.policies.clone(),
            metrics: self.metrics.clone(),
            recovery: recovery.clone(),
            duties: self.duties.clone(),
            delivery_grace: options.delivery_grace,
            notifier: self.notifier.clone(),
        };
        let lending = cluster::peer::Lending {
            node: node.clone(),
            engine: self.engine.clone(),
            peers: self.peers.clone(),
            reports: self.reports.clone(),
            duties: self.duties.clone(),
            grpc_port,
        };
        (Arc::new(member), Arc::new(lending))
    }
}

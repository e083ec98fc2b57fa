//! Webhook notifications (`--notify FILE`): events go into a durable
//! outbox in the store (`model::notify`), and a duty delivers them to the
//! endpoints that want them.
//!
//! A job's end is put in the outbox by the engine, in the step that ends
//! the job (the engine's `Options::notify` says which kinds are wanted);
//! the other kinds are put there through `Notifier::record` where they are
//! seen. The duty (`delivers`) runs one loop per endpoint, so that an
//! endpoint that does not answer delays no other and nothing the engine
//! waits for: each loop POSTs the events meant for its endpoint, oldest
//! first, within bounded timeouts (`post`), and after a failure waits
//! (`Backoff`) before it tries again; an endpoint that answered 2xx is taken
//! off the event, and the event is removed with the last. In a cluster,
//! the live instance with the lowest id delivers for all.
//!
//! - `file.rs`: the file and its rules;
//! - `post.rs`: one delivery, its headers and its signature.

pub(crate) mod file;
pub(crate) mod post;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::backoff::Backoff;
use crate::clock::Clock;
use crate::engine::EngineHandle;
use crate::model::notify::{Event, Kind, Routes, PREFIX};
use crate::proto::api;
use crate::server::cluster::Topology;
use crate::server::file_changes::FileChanges;
use file::Config;

/// How often an endpoint's loop looks at the outbox when nothing woke it.
const POLL: Duration = Duration::from_secs(1);
/// The pauses after a failed delivery to an endpoint: 1 s, doubling to 5 min.
const FIRST_PAUSE: Duration = Duration::from_secs(1);
const MOST_PAUSE: Duration = Duration::from_secs(300);

/// What this instance saw of an endpoint's deliveries since it started.
#[derive(Clone, Debug, Default)]
struct Status {
    last_delivery_ms: Option<i64>,
    last_error: Option<String>,
    deliveries: u64,
    failures: u64,
}

/// The notifications of this server: the endpoints, the outbox, the
/// deliveries. Cheap to share (`Arc`).
pub(crate) struct Notifier {
    /// The file, when one was given.
    path: Option<PathBuf>,
    config: RwLock<Arc<Config>>,
    engine: EngineHandle,
    clock: Arc<dyn Clock>,
    /// In a cluster, the live instance with the lowest id delivers.
    topology: Topology,
    status: Mutex<BTreeMap<String, Status>>,
    metrics: Arc<crate::server::surface::metrics::Metrics>,
    /// One rewrite of an outbox event at a time, so that two endpoints
    /// taken off one event at once both stay off.
    rewrite: tokio::sync::Mutex<()>,
    /// Wakes the endpoints' loops when an event was recorded here.
    wake: tokio::sync::Notify,
    /// Counts the times the file was read again.
    reloaded: tokio::sync::watch::Sender<u64>,
}

impl Notifier {
    /// A notifier of no endpoint until `use_config`.
    pub(crate) fn new(
        path: Option<PathBuf>,
        engine: EngineHandle,
        clock: Arc<dyn Clock>,
        topology: Topology,
        metrics: Arc<crate::server::surface::metrics::Metrics>,
    ) -> Notifier {
        Notifier {
            path,
            config: RwLock::default(),
            engine,
            clock,
            topology,
            status: Mutex::default(),
            metrics,
            rewrite: tokio::sync::Mutex::new(()),
            wake: tokio::sync::Notify::new(),
            reloaded: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Delivers to the endpoints of `config` from now on.
    pub(crate) fn use_config(&self, config: Config) {
        *self.config.write().expect("notify config lock") = Arc::new(config);
    }

    fn config(&self) -> Arc<Config> {
        self.config.read().expect("notify config lock").clone()
    }

    pub(crate) fn routes(&self) -> Routes {
        self.config().routes()
    }

    /// Puts an event of `kind` in the outbox, for the endpoints that want
    /// it (none: nothing is written); durable when this returns. A store
    /// that takes no write is logged.
    pub(crate) async fn record(&self, kind: Kind, payload: serde_json::Value) {
        let at_ms = u64::try_from(self.clock.now().as_millis()).unwrap_or(0);
        let id = uuid::Uuid::now_v7();
        let Some(event) = Event::new(id, kind, at_ms, payload, &self.routes()) else { return };
        match self.engine.put_settings(vec![event.into_setting()]).await {
            Ok(()) => self.wake.notify_waiters(),
            Err(e) => tracing::warn!(error = %e, event.kind = %kind, "a notification could not be put in the outbox"),
        }
    }

    /// Every event in the outbox, oldest first.
    async fn outbox(&self) -> Result<Vec<Event>, crate::store::Error> {
        let store = self.engine.store().clone();
        let stored = tokio::task::spawn_blocking(move || store.settings(PREFIX))
            .await
            .map_err(|e| crate::store::Error::Io(e.to_string()))??;
        Ok(stored.iter().filter_map(|(_, bytes)| Event::decode(bytes)).collect())
    }

    /// Takes `endpoint` off the event `id` (it answered 2xx); the event
    /// goes with its last endpoint.
    async fn delivered(&self, id: uuid::Uuid, endpoint: &str) -> Result<(), crate::engine::Error> {
        let _one_at_a_time = self.rewrite.lock().await;
        let key = format!("{PREFIX}{id}");
        let store = self.engine.store().clone();
        let lookup = key.clone();
        let stored = tokio::task::spawn_blocking(move || store.settings(&lookup))
            .await
            .map_err(|_| crate::engine::Error::Stopped)??;
        let Some(mut event) = stored.iter().find(|(k, _)| *k == key).and_then(|(_, bytes)| Event::decode(bytes)) else {
            return Ok(());
        };
        event.endpoints.retain(|name| name != endpoint);
        self.engine.put_settings(vec![event.into_setting()]).await
    }

    /// Takes the endpoints the file no longer names off every event, so
    /// that nothing waits for an endpoint that is gone.
    async fn forget_unknown(&self) -> Result<(), crate::engine::Error> {
        let config = self.config();
        let _one_at_a_time = self.rewrite.lock().await;
        let events = self.outbox().await?;
        let rewrites: Vec<_> = events
            .into_iter()
            .filter(|event| event.endpoints.iter().any(|name| config.endpoint(name).is_none()))
            .map(|mut event| {
                event.endpoints.retain(|name| config.endpoint(name).is_some());
                event.into_setting()
            })
            .collect();
        if rewrites.is_empty() {
            return Ok(());
        }
        tracing::info!(events = rewrites.len(), "notifications for endpoints no longer configured dropped");
        self.engine.put_settings(rewrites).await
    }

    /// Whether this instance delivers: alone always; in a cluster, the live
    /// instance with the lowest id.
    fn delivers_here(&self) -> bool {
        match &self.topology {
            Topology::Alone => true,
            Topology::Member(node) => node.live().iter().map(|i| i.id).min().is_none_or(|lowest| lowest == node.id),
        }
    }

    fn note(&self, endpoint: &str, result: &Result<(), String>) {
        let mut status = self.status.lock().expect("notify status lock");
        let status = status.entry(endpoint.to_string()).or_default();
        match result {
            Ok(()) => {
                status.deliveries += 1;
                status.last_delivery_ms = Some(self.clock.now().as_millis());
                status.last_error = None;
            }
            Err(why) => {
                status.failures += 1;
                status.last_error = Some(why.clone());
            }
        }
        self.metrics.notification_delivered(endpoint, result.is_ok());
    }

    /// Each endpoint: its URL, the events it wants, how many wait for it,
    /// and what this instance saw of its deliveries. No secret.
    pub(crate) async fn listing(&self) -> Result<Vec<api::NotificationEndpoint>, crate::store::Error> {
        let config = self.config();
        let events = self.outbox().await?;
        let status = self.status.lock().expect("notify status lock").clone();
        Ok(config
            .endpoints
            .iter()
            .map(|endpoint| {
                let seen = status.get(&endpoint.name).cloned().unwrap_or_default();
                let pending = events.iter().filter(|e| e.endpoints.contains(&endpoint.name)).count();
                api::NotificationEndpoint {
                    name: endpoint.name.clone(),
                    url: endpoint.url.clone(),
                    events: endpoint.events.iter().map(|k| k.as_str().to_string()).collect(),
                    pending: pending as u64,
                    last_delivery_ms: seen.last_delivery_ms.unwrap_or(0),
                    last_error: seen.last_error.unwrap_or_default(),
                    deliveries: seen.deliveries,
                    failures: seen.failures,
                    signed: endpoint.secret.is_some(),
                }
            })
            .collect())
    }

    /// The duty: one delivery loop per endpoint, until the server stops;
    /// they start over when the file was read again.
    pub(crate) async fn delivers(self: Arc<Self>) {
        let mut reloaded = self.reloaded.subscribe();
        loop {
            reloaded.mark_unchanged();
            if !self.delivers_here() {
                // Another instance delivers, by its own file.
            } else if let Err(e) = self.forget_unknown().await {
                tracing::warn!(error = %e, "could not read the notification outbox");
            }
            let mut loops = tokio::task::JoinSet::new();
            for endpoint in &self.config().endpoints {
                loops.spawn(self.clone().deliver_to(endpoint.name.clone()));
            }
            if reloaded.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            // Dropping the set ends the loops of the file before.
            drop(loops);
        }
    }

    /// Delivers, oldest first, the events meant for one endpoint.
    async fn deliver_to(self: Arc<Self>, name: String) {
        let mut pauses = Backoff::doubling(FIRST_PAUSE, MOST_PAUSE);
        loop {
            tokio::select! {
                () = tokio::time::sleep(POLL) => {}
                () = self.wake.notified() => {}
            }
            let Some(endpoint) = self.config().endpoint(&name).cloned() else { return };
            if !self.delivers_here() {
                continue;
            }
            let events = match self.outbox().await {
                Ok(events) => events,
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the notification outbox");
                    continue;
                }
            };
            for event in events.iter().filter(|e| e.endpoints.contains(&name)) {
                let result = post::deliver(&endpoint, event).await;
                self.note(&name, &result);
                if let Err(why) = result {
                    let pause = pauses.next_pause();
                    tracing::warn!(
                        endpoint = %name, event.id = %event.id, event.kind = %event.kind, error = %why,
                        retry_in_ms = pause.as_millis() as u64, "a notification was not delivered"
                    );
                    tokio::time::sleep(pause).await;
                    break;
                }
                pauses.reset();
                if let Err(e) = self.delivered(event.id, &name).await {
                    tracing::warn!(error = %e, event.id = %event.id, "a delivered notification could not be taken off the outbox");
                    break;
                }
            }
        }
    }

    /// Reads the file again, on SIGHUP and when it changes, as the
    /// credentials file is; a broken file keeps the endpoints before it
    /// (and is logged). The engine is told the kinds now wanted, and the
    /// delivery loops start over for the endpoints now named.
    pub(crate) async fn reloads(self: Arc<Self>) {
        let Some(path) = self.path.clone() else { return std::future::pending().await };
        let mut changes = FileChanges::new(path.clone(), "the notifications file");
        loop {
            changes.next().await;
            let file = path.clone();
            match tokio::task::spawn_blocking(move || file::read(&file)).await {
                Ok(Ok(config)) => {
                    tracing::info!(file = %path.display(), endpoints = config.endpoints.len(), "notifications file read again");
                    let routes = config.routes();
                    self.use_config(config);
                    if let Err(e) = self.engine.set_notify(routes).await {
                        tracing::warn!(error = %e, "the engine was not told the notifications now wanted");
                    }
                    self.reloaded.send_modify(|generation| *generation += 1);
                }
                Ok(Err(e)) => tracing::warn!("{e}; the notification endpoints read before stay"),
                Err(e) => tracing::warn!(error = %e, "reading the notifications file stopped"),
            }
        }
    }
}

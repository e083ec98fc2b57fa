//! When a session may renew a worker's lease: only while every attempt the
//! worker runs is covered, so that no instance takes an attempt back while
//! another renews the lease it runs under.
//!
//! An attempt is covered when this instance holds it for the worker, when
//! the instance leading its job lent it here, or when that leader vouched
//! for it (`PeerService/Vouch`): a worker that moved here from another
//! instance runs attempts that instance still counts down, and the vouch
//! stops the count for as long as this session renews. A job that nobody
//! leads (its leader died, no other has adopted it yet) covers its attempts
//! for a bounded time too: the instance that adopts it waits the orphan
//! grace before it takes them back. An attempt nobody vouches for is
//! canceled on the worker, so that the lease can be renewed for the rest;
//! when its leader cannot be reached (it may have just died, its job not
//! yet adopted), it is asked again while the lease the worker says it has
//! left allows, and canceled only then.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::stream::WorkerSessions;
use crate::model::{AttemptId, HandlerId};
use crate::proto::plugin::{admin_to_worker_message, AdminToWorkerMessage, CancelRequest, WorkKind};
use crate::server::cluster::peer;
use crate::wire;

type Attempt = AttemptId;
type Outbound = tokio::sync::mpsc::Sender<Result<AdminToWorkerMessage, tonic::Status>>;

/// How long a round waits before it asks a leader that could not be
/// reached again.
const UNREACHED_PAUSE: Duration = Duration::from_millis(500);

/// One leased worker's session: what covers the attempts its worker runs.
#[derive(Clone)]
pub(super) struct Cover {
    inner: Arc<Mutex<State>>,
    sessions: Arc<WorkerSessions>,
    handler: HandlerId,
    lease: Duration,
    outbound: Outbound,
}

#[derive(Default)]
struct State {
    /// Attempts this instance holds for the worker, as last asked.
    own: foldhash::HashSet<Attempt>,
    /// Attempts of jobs led elsewhere: until when each is covered.
    vouched: HashMap<Attempt, Instant>,
    /// The latest heartbeat: its number, and what it lists (lent ones left out).
    latest: Option<(u64, HashSet<Attempt>)>,
    /// A round of asking is under way.
    asking: bool,
    /// How many listed attempts are not held here, as last told the engine.
    elsewhere: u32,
    /// When the worker's lease ends, as its latest heartbeat said.
    lease_ends: Option<Instant>,
}

impl State {
    fn covers(&self, running: &HashSet<Attempt>, now: Instant) -> bool {
        running.iter().all(|a| self.own.contains(a) || self.vouched.get(a).is_some_and(|until| *until > now))
    }

    /// How many of the latest heartbeat's attempts are not held here, if
    /// that changed since it was last told.
    fn elsewhere_changed(&mut self) -> Option<u32> {
        let running = self.latest.as_ref().map(|(_, running)| running)?;
        let n = running.iter().filter(|a| !self.own.contains(a)).count() as u32;
        (n != self.elsewhere).then(|| {
            self.elsewhere = n;
            n
        })
    }
}

impl Cover {
    pub(super) fn new(sessions: Arc<WorkerSessions>, handler: HandlerId, lease: Duration, outbound: Outbound) -> Cover {
        Cover { inner: Arc::default(), sessions, handler, lease, outbound }
    }

    /// This session sent the worker an attempt held here.
    pub(super) fn sent(&self, attempt: Attempt) {
        self.inner.lock().expect("cover lock").own.insert(attempt);
    }

    /// Heartbeat `number` lists `running` (attempts lent here left out)
    /// and says how long the worker's lease has left: renews the lease as
    /// of it if every one is covered, and asks about the others (or about a
    /// vouch running out) meanwhile.
    pub(super) fn heartbeat(&self, number: u64, running: HashSet<Attempt>, lease_left: Option<Duration>) {
        let now = Instant::now();
        let (covered, ask, elsewhere) = {
            let mut state = self.inner.lock().expect("cover lock");
            state.lease_ends = lease_left.map(|left| now + left);
            state.vouched.retain(|attempt, _| running.contains(attempt));
            let covered = state.covers(&running, now);
            // A vouch is asked again once half of it is spent.
            let soon = now + peer::vouch_validity(self.sessions.settings.orphan_grace, self.lease) / 2;
            let expiring = state.vouched.values().any(|until| *until < soon);
            state.latest = Some((number, running));
            let ask = !state.asking && (!covered || expiring);
            state.asking |= ask;
            (covered, ask, state.elsewhere_changed())
        };
        if covered {
            self.renew(number);
        }
        self.tell_elsewhere(elsewhere);
        if ask {
            self.sessions.duties.spawn(self.clone().ask());
        }
    }

    /// Tells the engine how many slots the worker's attempts held
    /// elsewhere take, when that changed.
    fn tell_elsewhere(&self, running: Option<u32>) {
        if let Some(running) = running {
            let (engine, handler) = (self.sessions.engine.clone(), self.handler);
            self.sessions.duties.spawn(async move {
                let _ = engine.handler_elsewhere(handler, running).await;
            });
        }
    }

    /// For attempts of jobs led elsewhere: their leaders' vouches, or that
    /// nobody leads their job (a vouch bounded by the orphan grace), or why
    /// each is canceled. Returns the attempts whose leader could not be
    /// reached.
    async fn ask_leaders(
        &self,
        node: HandlerId,
        attempts: &[Attempt],
        vouched: &mut Vec<(Attempt, Instant)>,
        cancel: &mut Vec<(Attempt, &'static str)>,
    ) -> Vec<Attempt> {
        let mut by_leader: BTreeMap<String, Vec<Attempt>> = BTreeMap::new();
        for &attempt in attempts {
            let asked_at = Instant::now();
            match peer::whereabouts(&self.sessions.engine, attempt.task.job).await {
                // The database cannot tell now: asked again next time.
                None => {}
                Some(None) => cancel.push((attempt, "its job does not exist")),
                Some(Some(w)) if w.state.is_terminal() => cancel.push((attempt, "its job has ended")),
                Some(Some(w)) => match w.owner {
                    // Led here, and its job not loaded yet (adopted a
                    // moment ago): asked again next time.
                    Some(owner) if owner.id == node => {}
                    Some(owner) => by_leader.entry(owner.grpc_address).or_default().push(attempt),
                    None => {
                        let valid = peer::vouch_validity(self.sessions.settings.orphan_grace, self.lease);
                        vouched.push((attempt, asked_at + valid));
                    }
                },
            }
        }
        let mut unreached = Vec::new();
        for (address, attempts) in by_leader {
            let asked_at = Instant::now();
            match self.sessions.peers.vouch_at(&address, self.handler, &attempts, self.lease).await {
                Ok((held_there, valid)) => {
                    for attempt in attempts {
                        if held_there.contains(&attempt) {
                            vouched.push((attempt, asked_at + valid));
                        } else {
                            cancel.push((attempt, "its job's leader no longer holds it for this worker"));
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(leader = %address, handler = %self.handler, error = %e, "the leader of attempts a worker runs here did not vouch for them");
                    unreached.extend(attempts);
                }
            }
        }
        unreached
    }

    /// How long the worker's lease has left, as its latest heartbeat said.
    fn lease_left(&self) -> Option<Duration> {
        let state = self.inner.lock().expect("cover lock");
        state.lease_ends.map(|ends| ends.saturating_duration_since(Instant::now()))
    }

    /// What a cancel needs before the lease ends: to reach the worker, the
    /// execution to stop, the heartbeat without it, and its renewal.
    fn cancel_margin(&self) -> Duration {
        (self.lease / 4).max(Duration::from_secs(1))
    }

    /// The attempts the latest heartbeat lists.
    fn still_running(&self) -> HashSet<Attempt> {
        let state = self.inner.lock().expect("cover lock");
        state.latest.as_ref().map(|(_, running)| running.clone()).unwrap_or_default()
    }

    fn renew(&self, number: u64) {
        let renewal = AdminToWorkerMessage { request_id: wire::lease_renewal(number), sent_at: None, body: None };
        // A full queue loses this renewal; the next heartbeat brings another.
        let _ = self.outbound.try_send(Ok(renewal));
    }

    /// One round: which of the latest heartbeat's attempts are held here;
    /// for those of jobs led elsewhere, their leaders' vouches (or that
    /// nobody leads their job); what nobody covers is canceled. Then the
    /// latest heartbeat is renewed if it is covered now.
    async fn ask(self) {
        let running: Vec<Attempt> = {
            let state = self.inner.lock().expect("cover lock");
            state.latest.as_ref().map(|(_, running)| running.iter().copied().collect()).unwrap_or_default()
        };
        let Ok(holdings) = self.sessions.engine.holds(self.handler, running.clone()).await else {
            // The engine stopped: the session ends with it.
            self.inner.lock().expect("cover lock").asking = false;
            return;
        };
        let held: HashSet<Attempt> = holdings.held.iter().copied().collect();
        let foreign: HashSet<Attempt> = holdings.not_led_here.iter().copied().collect();
        let mut vouched = Vec::new();
        let mut cancel: Vec<(Attempt, &str)> = running
            .iter()
            .filter(|a| !held.contains(a) && !foreign.contains(a))
            .map(|a| (*a, "it was taken back while the worker was away"))
            .collect();
        if let Some(node) = self.sessions.topology.member() {
            let mut asking: Vec<Attempt> = foreign.into_iter().collect();
            loop {
                let unreached = self.ask_leaders(node.id, &asking, &mut vouched, &mut cancel).await;
                if unreached.is_empty() {
                    break;
                }
                // A leader that cannot be reached may be dead, its job about
                // to be adopted: asked again while the worker's lease leaves
                // room for one more try and for the cancel after it.
                let left = self.lease_left();
                if left.is_none_or(|left| left < self.cancel_margin() + peer::CALL_TIMEOUT + UNREACHED_PAUSE) {
                    cancel.extend(unreached.into_iter().map(|a| (a, "its job's leader could not be reached")));
                    break;
                }
                tokio::time::sleep(UNREACHED_PAUSE).await;
                let still = self.still_running();
                asking = unreached.into_iter().filter(|a| still.contains(a)).collect();
            }
        } else {
            cancel.extend(foreign.into_iter().map(|a| (a, "it was taken back while the worker was away")));
        }
        for (attempt, why) in cancel {
            tracing::warn!(handler = %self.handler, %attempt, why, "the worker runs an attempt that nothing here covers: canceling it");
            let target_id = attempt.to_string();
            let cancel = CancelRequest {
                target_id: target_id.clone(),
                target_kind: WorkKind::Execution as i32,
                reason: wire::UNCOVERED.into(),
                force: true,
            };
            let message = AdminToWorkerMessage {
                request_id: format!("cancel-{target_id}"),
                sent_at: None,
                body: Some(admin_to_worker_message::Body::CancelRequest(cancel)),
            };
            let _ = self.outbound.send(Ok(message)).await;
        }
        let renew = {
            let mut state = self.inner.lock().expect("cover lock");
            state.asking = false;
            state.own.retain(|a| !running.contains(a) || held.contains(a));
            state.own.extend(held.iter().copied());
            for (attempt, until) in vouched {
                let entry = state.vouched.entry(attempt).or_insert(until);
                *entry = (*entry).max(until);
            }
            let now = Instant::now();
            let renew =
                state.latest.as_ref().filter(|(_, running)| state.covers(running, now)).map(|(number, _)| *number);
            (renew, state.elsewhere_changed())
        };
        let (renew, elsewhere) = renew;
        if let Some(number) = renew {
            self.renew(number);
        }
        self.tell_elsewhere(elsewhere);
    }
}

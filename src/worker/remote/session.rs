//! A session after the admin's hello: the loop that serves one stream (the
//! admin's messages, heartbeats, ended executions, the lease and the admin's
//! silence), and what it sends: heartbeats, outcomes, and the executions
//! given back when the worker stops.

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tonic::Streaming;

use super::connection::SessionEnd;
use super::messages::{envelope, heartbeat_message};
use super::work::{given_up, Work};
use super::{sleep_until, stopped, Worker};
use crate::proto::plugin::worker_to_admin_message::Body;
use crate::proto::plugin::{AdminToWorkerMessage, JobCompleted, WorkerAcknowledge, WorkerToAdminMessage};
use crate::wire;

/// A send that waits this long for room in the queue ends the session.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// Heartbeat intervals are at least this long, whatever the options or the admin say.
const MIN_HEARTBEAT: Duration = Duration::from_millis(100);

/// A session's state after the hello: its stream, and the work it serves.
pub(super) struct Session<'a> {
    pub(super) worker: &'a Worker,
    pub(super) outbound: mpsc::Sender<WorkerToAdminMessage>,
    pub(super) work: &'a mut Work,
    /// Set by `AdminShutdown`: execution requests are refused from then on.
    pub(super) draining: bool,
    /// When the last heartbeat went out, and whether a change waits for the next one.
    pub(super) last_heartbeat: Instant,
    pub(super) heartbeat_pending: bool,
    /// Whether this admin renews the lease: unknown until its first renewal
    /// (sent right after its hello), or until half a lease passes without one.
    pub(super) admin_renews: Option<bool>,
    pub(super) connected_at: Instant,
    /// The interval the admin asked for.
    pub(super) heartbeat: Duration,
    /// Executions accepted whose start is not reported yet (by job id).
    pub(super) unannounced: Vec<String>,
    /// The hello (0) and the latest heartbeats, by number, with when each
    /// left: a renewal names one, and the lease runs from its departure.
    pub(super) sent_beats: std::collections::VecDeque<(u64, Instant)>,
    pub(super) next_beat: u64,
}

/// Heartbeats remembered for their renewals: a renewal of an older one
/// renews nothing that a newer one did not.
const BEATS_KEPT: usize = 64;

/// Heartbeats that report a start or an end go out at most this often, so
/// that many short executions do not each send the whole running list twice.
pub(super) const HEARTBEAT_COALESCE: Duration = Duration::from_millis(200);

pub(super) type Step = Result<(), SessionEnd>;

impl Session<'_> {
    /// The heartbeat interval: the admin's, or a quarter of the lease if
    /// that is shorter, so that a renewing admin's answer comes well within it.
    fn heartbeat_interval(&self) -> Duration {
        self.heartbeat.min(self.work.lease / 4).max(MIN_HEARTBEAT)
    }

    pub(super) async fn serve(
        &mut self,
        mut inbound: Streaming<AdminToWorkerMessage>,
        pending: Option<AdminToWorkerMessage>,
        mut stop: watch::Receiver<bool>,
    ) -> SessionEnd {
        if let Some(message) = pending {
            if let Err(end) = self.handle(message).await {
                return end;
            }
        }
        // What ended while the worker was away goes first, then what still
        // runs: the admin applies the one before it compares the other.
        if let Err(end) = self.report_unacknowledged(true).await {
            return end;
        }
        if let Err(end) = self.send_heartbeat().await {
            return end;
        }
        let mut ticker =
            tokio::time::interval_at(Instant::now() + self.heartbeat_interval(), self.heartbeat_interval());
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let lease = self.work.lease_deadline();
            // A renewing admin that falls silent for half a lease is given up
            // for another connection (another admin, if there are several).
            // A new session gets its half lease too, from its start.
            let silent_at = (self.admin_renews == Some(true))
                .then(|| self.work.renewed_as_of.max(self.connected_at) + self.work.lease / 2);
            // An admin that has not renewed within half a lease never will.
            let undecided_at = (self.admin_renews.is_none()).then(|| self.connected_at + self.work.lease / 2);
            let step = tokio::select! {
                message = inbound.next() => match message {
                    Some(Ok(message)) => self.handle(message).await,
                    Some(Err(status)) => Err(SessionEnd::Broken(format!("the stream failed: {status}"))),
                    None => Err(SessionEnd::Broken("the admin closed the stream".into())),
                },
                _ = ticker.tick() => {
                    match self.send_heartbeat().await {
                        Ok(()) => self.report_unacknowledged(false).await,
                        Err(end) => Err(end),
                    }
                }
                () = tokio::time::sleep_until(self.last_heartbeat + HEARTBEAT_COALESCE), if self.heartbeat_pending => {
                    self.send_heartbeat().await
                }
                // Ready once the executions just accepted have had a turn
                // and nothing else is waiting.
                () = tokio::task::yield_now(), if !self.unannounced.is_empty() => self.announce_starts().await,
                Some(joined) = self.work.tasks.join_next_with_id(), if !self.work.tasks.is_empty() => {
                    match self.work.finished(self.worker, joined) {
                        Some(completed) => self.report(completed).await,
                        None => Ok(()),
                    }
                }
                () = sleep_until(lease), if lease.is_some() => {
                    self.work.give_up_all(self.worker);
                    Err(SessionEnd::Broken("no word from the admin within the lease".into()))
                }
                () = sleep_until(silent_at), if silent_at.is_some() => {
                    Err(SessionEnd::Broken("no word from the admin for half the lease".into()))
                }
                () = sleep_until(undecided_at), if undecided_at.is_some() => {
                    self.admin_renews = Some(false);
                    self.work.keeps_work = false;
                    // Such an admin acknowledges nothing: what was reported is done with.
                    self.work.unacknowledged.clear();
                    Ok(())
                }
                _ = stopped(&mut stop) => {
                    self.give_back_all().await;
                    Err(SessionEnd::Stopped)
                }
            };
            if self.work.changed {
                self.work.changed = false;
                if let Err(end) = self.heartbeat_soon().await {
                    return end;
                }
            }
            if let Err(end) = step {
                return end;
            }
        }
    }

    pub(super) async fn send(&self, body: Body) -> Step {
        let message = envelope(&self.worker.options.worker_id, self.worker.clock.now(), body);
        match tokio::time::timeout(SEND_TIMEOUT, self.outbound.send(message)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(SessionEnd::Broken("the stream to the admin is closed".into())),
            Err(_) => Err(SessionEnd::Broken(format!("the admin took no message for {SEND_TIMEOUT:?}"))),
        }
    }

    pub(super) async fn acknowledge(&self, request_id: String, accepted: bool, message: &str) -> Step {
        self.send(Body::Acknowledge(WorkerAcknowledge { request_id, accepted, message: message.to_string() })).await
    }

    async fn send_heartbeat(&mut self) -> Step {
        self.last_heartbeat = Instant::now();
        self.heartbeat_pending = false;
        let number = self.next_beat;
        self.next_beat += 1;
        let mut heartbeat =
            heartbeat_message(&self.worker.options.worker_id, &self.work.executions, self.worker.options.max_detect);
        heartbeat.metadata.insert(wire::HEARTBEAT_METADATA.into(), number.to_string());
        if let Some(ends) = self.work.lease_deadline() {
            let left = ends.saturating_duration_since(Instant::now()).as_millis();
            heartbeat.metadata.insert(wire::LEASE_LEFT_METADATA.into(), left.to_string());
        }
        if self.sent_beats.len() >= BEATS_KEPT {
            self.sent_beats.pop_front();
        }
        self.sent_beats.push_back((number, Instant::now()));
        self.send(Body::Heartbeat(heartbeat)).await
    }

    /// A heartbeat after a change: now if none went out lately, else soon.
    pub(super) async fn heartbeat_soon(&mut self) -> Step {
        if self.last_heartbeat.elapsed() >= HEARTBEAT_COALESCE {
            self.send_heartbeat().await
        } else {
            self.heartbeat_pending = true;
            Ok(())
        }
    }

    /// Keeps an outcome until the admin acknowledges it, and reports it now
    /// (kept first: a stream that breaks while it is sent loses nothing).
    pub(super) async fn report(&mut self, completed: JobCompleted) -> Step {
        self.work.keep(completed.clone(), Some(Instant::now()));
        self.send(Body::JobCompleted(completed)).await
    }

    /// Sends the outcomes no admin has acknowledged: all of them (`all`, at
    /// the start of a session), or those whose acknowledgement is overdue.
    async fn report_unacknowledged(&mut self, all: bool) -> Step {
        let overdue = self.heartbeat_interval() * 2;
        let due: Vec<JobCompleted> = self
            .work
            .unacknowledged
            .values_mut()
            .filter(|ended| all || ended.sent.is_none_or(|at| at.elapsed() >= overdue))
            .map(|ended| {
                ended.sent = Some(Instant::now());
                ended.completed.clone()
            })
            .collect();
        if !due.is_empty() {
            tracing::info!(n_outcomes = due.len(), "reporting outcomes the admin has not acknowledged");
        }
        for completed in due {
            self.send(Body::JobCompleted(completed)).await?;
        }
        Ok(())
    }

    /// The worker is stopping: every execution stops, and its attempt goes
    /// back to the admin at once, uncounted.
    async fn give_back_all(&mut self) {
        for execution in self.work.executions.take_all() {
            execution.abort.abort();
            let completed = given_up(self.worker, execution, wire::STOPPING, "given-back");
            let _ = self.send(Body::JobCompleted(completed)).await;
        }
    }
}

//! Reports on attempts of jobs led elsewhere, on their way to each leader:
//! one call carries every report that came while the call before it was
//! under way, so that a leader whose lent tasks end by the thousand a
//! second answers a few calls, not a call a task. A report waits for no
//! timer: one to a leader with no call under way leaves at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prost::Message;
use tokio::sync::oneshot;
use tonic::{Code, Status};

use super::peer::Peers;
use crate::proto::peer::{PeerReport, PeerReportResponse, PeerReports};

type Answer = oneshot::Sender<Result<PeerReportResponse, Status>>;

/// The most reports one call carries, and the most bytes (the leader takes
/// messages of up to 4 MiB); one report alone goes whatever its size.
pub(super) const MOST_REPORTS: usize = 1_000;
const MOST_BYTES: usize = 1024 * 1024;

/// The reports waiting for each leader (by gRPC address), and whether a
/// call to it is under way.
#[derive(Default)]
pub(super) struct Outbox {
    leaders: Mutex<HashMap<Arc<str>, Waiting>>,
}

#[derive(Default)]
struct Waiting {
    reports: Vec<(PeerReport, Answer)>,
    sending: bool,
}

impl Peers {
    /// Sends a report to the leader at `target`, with the others waiting
    /// for it; its answer, or why the call failed.
    pub(super) async fn report(&self, target: &Arc<str>, report: PeerReport) -> Result<PeerReportResponse, Status> {
        let (answer, answered) = oneshot::channel();
        let start = {
            let mut leaders = self.outbox().leaders.lock().expect("outbox lock");
            let waiting = leaders.entry(target.clone()).or_default();
            waiting.reports.push((report, answer));
            !std::mem::replace(&mut waiting.sending, true)
        };
        if start {
            // A duty of its own: the calls go on whether or not this
            // report's sender still waits for its answer, and end with the
            // server's other duties.
            let (peers, target) = (self.clone(), target.clone());
            self.duties().spawn(async move { peers.send_waiting(target).await });
        }
        answered.await.unwrap_or_else(|_| Err(Status::unavailable("peer: the call carrying the report stopped")))
    }

    /// Calls the leader at `target` with what waits for it, until nothing does.
    async fn send_waiting(&self, target: Arc<str>) {
        // Should this task end otherwise than by running out of reports,
        // those waiting are answered, and the next report starts another.
        let mut sending = Sending { peers: self, target: &target, done: false };
        loop {
            let batch = {
                let mut leaders = self.outbox().leaders.lock().expect("outbox lock");
                let Some(waiting) = leaders.get_mut(&target) else { return };
                if waiting.reports.is_empty() {
                    waiting.sending = false;
                    sending.done = true;
                    return;
                }
                let mut bytes = 0;
                let fits = waiting.reports.iter().take_while(|(report, _)| {
                    bytes += report.encoded_len();
                    bytes <= MOST_BYTES
                });
                let n = fits.count().clamp(1, MOST_REPORTS);
                waiting.reports.drain(..n.min(waiting.reports.len())).collect::<Vec<_>>()
            };
            let (reports, answers): (Vec<PeerReport>, Vec<Answer>) = batch.into_iter().unzip();
            let sent = reports.len();
            let result = match self.client(&target) {
                Some(mut client) => client.reports(self.request(PeerReports { reports: reports.clone() })).await,
                None => Err(Status::invalid_argument("peer: bad address")),
            };
            match result.map(|r| r.into_inner().responses) {
                Ok(responses) if responses.len() == sent => {
                    for (answer, response) in answers.into_iter().zip(responses) {
                        let _ = answer.send(Ok(response));
                    }
                }
                Ok(responses) => {
                    let status = Status::internal(format!("peer: {} answers to {sent} reports", responses.len()));
                    answers.into_iter().for_each(|a| drop(a.send(Err(status.clone()))));
                }
                // An instance of a version without `Reports` takes them one by one.
                Err(status) if status.code() == Code::Unimplemented => {
                    for (report, answer) in reports.into_iter().zip(answers) {
                        let answered = match self.client(&target) {
                            Some(mut client) => {
                                client.report(self.request(report)).await.map(tonic::Response::into_inner)
                            }
                            None => Err(Status::invalid_argument("peer: bad address")),
                        };
                        let _ = answer.send(answered);
                    }
                }
                Err(status) => answers.into_iter().for_each(|a| drop(a.send(Err(status.clone())))),
            }
        }
    }
}

/// Marks the leader as having no call under way when the sending task ends
/// before it ran out of reports (it panicked, or the server is stopping),
/// says so, and answers the reports still waiting.
struct Sending<'a> {
    peers: &'a Peers,
    target: &'a Arc<str>,
    done: bool,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut leaders = self.peers.outbox().leaders.lock().expect("outbox lock");
        if let Some(waiting) = leaders.get_mut(self.target) {
            tracing::warn!(
                leader = %self.target, waiting = waiting.reports.len(),
                "the calls carrying reports to a job's leader ended early; their senders try again"
            );
            waiting.sending = false;
            // Their callers learn it and try again.
            for (_, answer) in waiting.reports.drain(..) {
                let _ = answer.send(Err(Status::unavailable("peer: the call carrying the report stopped")));
            }
        }
    }
}

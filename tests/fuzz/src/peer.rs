//! The peer target: the messages of `proto/peer.proto` decoded from bytes
//! and handled by the peer service of an in-process admin (alone, over the
//! memory store, built once per process) as another instance would call
//! it. An input is up to 16 calls, each a byte choosing the call (its value
//! modulo 5: lend, report, cancel, knows, dedupe keys) and the request,
//! length-delimited. For each run the target submits a job (`JOB`) whose
//! three tasks wait in the queue; attempt ids may name it by the
//! placeholder id.
//!
//! Checked: every request and answer encodes back to itself; a lend gives
//! only queued tasks of the types offered, no more than offered, each as
//! its spec says, and holds each for the handler it was lent to; a report
//! on an outcome or a giving up is applied exactly when its sender holds
//! the attempt, and then leaves the task as the report says; a report not
//! applied changes nothing; no call on a worker not connected here is
//! delivered; the dedupe keys are those of the job's tasks not ended; and
//! every refusal is a status naming the rule.

use std::cell::OnceCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use jobcenter::jobfile::{self, Format, Limits};
use jobcenter::model::{AttemptId, HandlerId, JobId, JobOrigin, JobSpec, TaskIdx, TaskRecord, TaskRef, TaskState};
use jobcenter::proto::peer::{
    peer_report, peer_service_server::PeerService, DedupeKeysRequest, DedupeKeysResponse, KnowsRequest, KnowsResponse,
    LendRequest, LendResponse, PeerCancel, PeerCancelResponse, PeerGiveUp, PeerReport, PeerReportResponse, PeerReports,
};
use jobcenter::server::fuzzing::Admin;
use jobcenter::server::ServerOptions;
use jobcenter::store::fuzzing::encode;
use jobcenter::store::MemoryStore;
use jobcenter::wire;
use prost::Message;
use tonic::{Request, Status};

use crate::frame;

/// The job submitted for each run.
pub const JOB: &str = r#"{"name":"peer-fuzz","tasks":[
  {"id":"p0","job_type":"peer","labels":{"dedupe_key":"k0"}},
  {"id":"p1","job_type":"peer","depends_on":["p0"],"retry_limit":1,"labels":{"dedupe_key":"k1","node":"n1"}},
  {"id":"q0","job_type":"other","parameters":{"x":[1,2],"s":"t"},"priority":"high","execution_timeout_seconds":30,"labels":{"dedupe_key":"k2"}}
]}"#;
const MOST_CALLS: usize = 16;
const LIMIT: Duration = Duration::from_secs(10);
/// The lost-attempt limit of the admin's default options.
const LOST_LIMIT: u32 = 3;

/// A peer call, as an input carries it.
#[derive(Clone, Debug)]
pub enum Call {
    Lend(LendRequest),
    Report(PeerReport),
    Cancel(PeerCancel),
    Knows(KnowsRequest),
    DedupeKeys(DedupeKeysRequest),
}

impl Call {
    /// The call as an input carries it: its choice byte, then the request length-delimited.
    pub fn encode(&self) -> Vec<u8> {
        let (choice, mut bytes) = match self {
            Call::Lend(m) => (0u8, m.encode_length_delimited_to_vec()),
            Call::Report(m) => (1, m.encode_length_delimited_to_vec()),
            Call::Cancel(m) => (2, m.encode_length_delimited_to_vec()),
            Call::Knows(m) => (3, m.encode_length_delimited_to_vec()),
            Call::DedupeKeys(m) => (4, m.encode_length_delimited_to_vec()),
        };
        bytes.insert(0, choice);
        bytes
    }
}

/// The calls at the start of `data`, each request checked to encode back to itself.
pub fn calls(mut data: &[u8]) -> Vec<Call> {
    let mut calls = Vec::new();
    while calls.len() < MOST_CALLS {
        let Some((&choice, rest)) = data.split_first() else { break };
        let mut body = rest;
        let Ok(length) = prost::encoding::decode_varint(&mut body) else { break };
        let Some(bytes) = usize::try_from(length).ok().and_then(|n| body.get(..n)) else { break };
        data = &body[bytes.len()..];
        let call = match choice % 5 {
            0 => frame::round_trip(bytes).map(Call::Lend),
            1 => frame::round_trip(bytes).map(Call::Report),
            2 => frame::round_trip(bytes).map(Call::Cancel),
            3 => frame::round_trip(bytes).map(Call::Knows),
            _ => frame::round_trip(bytes).map(Call::DedupeKeys),
        };
        match call {
            Some(call) => calls.push(call),
            None => break,
        }
    }
    calls
}

struct Harness {
    admin: Admin,
    spec: JobSpec,
}

thread_local! {
    static HARNESS: OnceCell<Rc<Harness>> = const { OnceCell::new() };
}

fn harness() -> Rc<Harness> {
    HARNESS.with(|cell| {
        cell.get_or_init(|| {
            Rc::new(crate::block_on(async {
                let admin = Admin::start(Arc::new(MemoryStore::new()), ServerOptions::default())
                    .await
                    .expect("an admin over the memory store");
                let spec =
                    jobfile::parse(JOB.as_bytes(), Format::Json, "peer.json", &Limits::default()).expect("the job");
                Harness { admin, spec }
            }))
        })
        .clone()
    })
}

pub fn run(data: &[u8]) {
    let calls = calls(data);
    if calls.is_empty() {
        return;
    }
    let harness = harness();
    crate::block_on(harness.run(calls));
}

/// An answer encodes back to itself too.
fn answer_round_trips<M: Message + Default + PartialEq + std::fmt::Debug>(answer: &M) {
    frame::round_trip::<M>(&answer.encode_to_vec()).expect("an answer decodes");
}

fn refusal_is_typed(status: &Status) {
    assert!(
        matches!(status.code(), tonic::Code::InvalidArgument | tonic::Code::Unavailable),
        "a refusal with an unexpected code: {status:?}"
    );
    assert!(status.message().starts_with("peer: "), "a refusal that does not name its rule: {status:?}");
}

impl Harness {
    async fn tasks(&self, job: JobId) -> Vec<TaskRecord> {
        let call = self.admin.engine().job(job);
        let stored = tokio::time::timeout(LIMIT, call).await.expect("the engine answers").expect("the engine runs");
        stored.expect("the job is known").tasks
    }

    async fn run(&self, calls: Vec<Call>) {
        let engine = self.admin.engine();
        let service = self.admin.peer_service();
        let job = engine.submit(self.spec.clone(), JobOrigin::User).await.expect("the job is submitted");
        let job_text = job.to_string();
        // Who holds which attempt, as the lends said.
        let mut holders: HashMap<u32, (HandlerId, u32)> = HashMap::new();

        for call in calls {
            let before = self.tasks(job).await;
            match call {
                Call::Lend(request) => {
                    let offered = request.clone();
                    match service.lend(Request::new(request)).await {
                        Err(status) => {
                            refusal_is_typed(&status);
                            let after = self.tasks(job).await;
                            assert_eq!(encode(&after), encode(&before), "a refused lend changed the job");
                        }
                        Ok(answer) => {
                            let answer = answer.into_inner();
                            answer_round_trips::<LendResponse>(&answer);
                            self.check_lend(job, &offered, &answer, &before, &mut holders).await;
                        }
                    }
                }
                Call::Report(mut report) => {
                    frame::with_job(&mut report.attempt_id, &job_text);
                    let sent = report.clone();
                    // Every other report goes alone in a `Reports` call, which
                    // must answer it as `Report` does.
                    let result = match sent.attempt_id.len() % 2 {
                        0 => service.report(Request::new(report)).await,
                        _ => service.reports(Request::new(PeerReports { reports: vec![report] })).await.and_then(|r| {
                            let mut responses = r.into_inner().responses;
                            assert_eq!(responses.len(), 1, "one answer to one report");
                            Ok(tonic::Response::new(responses.remove(0)))
                        }),
                    };
                    let after = self.tasks(job).await;
                    self.check_report(job, &sent, result, &before, &after, &mut holders);
                }
                Call::Cancel(mut cancel) => {
                    frame::with_job(&mut cancel.attempt_id, &job_text);
                    match service.cancel(Request::new(cancel)).await {
                        Err(status) => refusal_is_typed(&status),
                        Ok(answer) => {
                            let answer = answer.into_inner();
                            answer_round_trips::<PeerCancelResponse>(&answer);
                            assert!(!answer.delivered, "a cancel was delivered to a worker not connected here");
                        }
                    }
                    assert_eq!(encode(&self.tasks(job).await), encode(&before), "a peer's cancel changed the job");
                }
                Call::Knows(mut knows) => {
                    for id in &mut knows.attempt_ids {
                        frame::with_job(id, &job_text);
                    }
                    match service.knows(Request::new(knows)).await {
                        Err(status) => refusal_is_typed(&status),
                        Ok(answer) => {
                            let answer = answer.into_inner();
                            answer_round_trips::<KnowsResponse>(&answer);
                            assert!(
                                !answer.heard && answer.known.is_empty(),
                                "knows of a worker not connected here: {answer:?}"
                            );
                        }
                    }
                }
                Call::DedupeKeys(request) => match service.dedupe_keys(Request::new(request)).await {
                    Err(status) => refusal_is_typed(&status),
                    Ok(answer) => {
                        let answer = answer.into_inner();
                        answer_round_trips::<DedupeKeysResponse>(&answer);
                        let keys: HashSet<String> = answer.keys.into_iter().collect();
                        let expected: HashSet<String> = self
                            .spec
                            .tasks
                            .iter()
                            .zip(&before)
                            .filter(|(_, record)| !record.state().is_terminal())
                            .filter_map(|(spec, _)| spec.labels.get("dedupe_key").cloned())
                            .collect();
                        assert_eq!(keys, expected, "the dedupe keys are not those of the tasks not ended");
                    }
                },
            }
        }

        // Leave nothing behind: cancel, give every held attempt up as its
        // holder, and remove the job once it ended.
        // The calls may have ended the job already.
        let _ = engine.cancel(job).await;
        for (idx, record) in self.tasks(job).await.iter().enumerate() {
            if let Some(handler) = record.holder() {
                let give_up = PeerReport {
                    handler: handler.to_string(),
                    attempt_id: AttemptId::new(TaskRef { job, idx: TaskIdx(idx as u32) }, record.attempt).to_string(),
                    kind: Some(peer_report::Kind::GiveUp(PeerGiveUp {
                        counted: false,
                        reason: "the run ended".into(),
                    })),
                };
                let answer = service.report(Request::new(give_up)).await.expect("a holder's report is taken");
                assert!(answer.into_inner().applied, "a holder's giving up was not applied");
            }
        }
        crate::remove_once_ended(engine, job, LIMIT).await;
    }

    async fn check_lend(
        &self,
        job: JobId,
        offered: &LendRequest,
        answer: &LendResponse,
        before: &[TaskRecord],
        holders: &mut HashMap<u32, (HandlerId, u32)>,
    ) {
        // What each handler was offered for, over all its offers.
        let mut totals: HashMap<HandlerId, u64> = HashMap::new();
        let mut by_type: HashMap<(HandlerId, String), u64> = HashMap::new();
        for slots in &offered.slots {
            let handler: HandlerId = slots.handler.parse().expect("a lend with a bad handler is refused");
            *totals.entry(handler).or_default() += u64::from(slots.total);
            for (job_type, n) in &slots.job_types {
                *by_type.entry((handler, job_type.clone())).or_default() += u64::from(*n);
            }
        }
        let after = self.tasks(job).await;
        let mut lent_to: HashMap<HandlerId, u64> = HashMap::new();
        let mut lent_by_type: HashMap<(HandlerId, String), u64> = HashMap::new();
        let mut lent_tasks = HashSet::new();
        for lent in &answer.tasks {
            let handler: HandlerId = lent.handler.parse().expect("a lent task names its handler");
            let AttemptId { task, number: attempt } = lent.attempt_id.parse().expect("a lent task has an attempt id");
            assert_eq!(task.job, job, "a task of another job was lent");
            let idx = task.idx.0;
            let spec = &self.spec.tasks[idx as usize];
            assert!(lent_tasks.insert(idx), "task {idx} was lent twice in one answer");
            assert_eq!(before[idx as usize].state(), TaskState::Ready, "a task that was not ready was lent");
            *lent_to.entry(handler).or_default() += 1;
            *lent_by_type.entry((handler, lent.job_type.clone())).or_default() += 1;
            assert_eq!(
                (&*lent.job_name, &*lent.task_id, &*lent.job_type, &*lent.parameters),
                (&*self.spec.name, &*spec.id, &*spec.job_type, &*spec.parameters),
                "a lent task is not as its spec says"
            );
            let labels: BTreeMap<String, String> = lent.labels.clone().into_iter().collect();
            assert_eq!(labels, spec.labels, "a lent task's labels");
            assert_eq!(lent.priority, wire::priority_to_wire(spec.priority) as i32, "a lent task's priority");
            assert_eq!(lent.execution_timeout_seconds, spec.execution_timeout_seconds, "a lent task's timeout");
            let record = &after[idx as usize];
            assert!(
                record.state() == TaskState::Assigned && record.handler() == Some(handler) && record.attempt == attempt,
                "a lent task is not held by the handler it was lent to: {record:?}"
            );
            holders.insert(idx, (handler, attempt));
        }
        for (handler, n) in &lent_to {
            assert!(*n <= totals.get(handler).copied().unwrap_or(0), "more tasks lent to {handler} than offered");
        }
        for (key, n) in &lent_by_type {
            assert!(*n <= by_type.get(key).copied().unwrap_or(0), "more tasks of {key:?} lent than offered");
        }
        for (idx, (record, old)) in after.iter().zip(before).enumerate() {
            if !lent_tasks.contains(&(idx as u32)) {
                assert_eq!(encode(record), encode(old), "a lend changed task {idx}, which it did not lend");
            }
        }
    }

    fn check_report(
        &self,
        job: JobId,
        sent: &PeerReport,
        result: Result<tonic::Response<PeerReportResponse>, Status>,
        before: &[TaskRecord],
        after: &[TaskRecord],
        holders: &mut HashMap<u32, (HandlerId, u32)>,
    ) {
        let named = sent.attempt_id.parse::<AttemptId>().ok().filter(|a| a.task.job == job).map(|a| (a.task, a.number));
        let sender: Option<HandlerId> = sent.handler.parse().ok();
        let answer = match result {
            Err(status) => {
                refusal_is_typed(&status);
                assert_eq!(encode(after), encode(before), "a refused report changed the job");
                return;
            }
            Ok(answer) => answer.into_inner(),
        };
        answer_round_trips::<PeerReportResponse>(&answer);
        let holds = named.and_then(|(task, attempt)| {
            let idx = task.idx.0;
            let holder = holders.get(&idx).copied()?;
            (Some(holder) == sender.map(|s| (s, attempt)) && before.get(idx as usize)?.state().is_held()).then_some(idx)
        });
        let settles = matches!(sent.kind, Some(peer_report::Kind::Outcome(_) | peer_report::Kind::GiveUp(_)));
        if settles {
            assert_eq!(
                answer.applied,
                holds.is_some(),
                "a report was {} though its sender {} the attempt: {sent:?} {answer:?}",
                if answer.applied { "applied" } else { "refused" },
                if holds.is_some() { "holds" } else { "does not hold" }
            );
        }
        let Some(idx) = holds else {
            assert_eq!(encode(after), encode(before), "a report from a handler that holds nothing changed the job");
            return;
        };
        let (spec, old, new) = (&self.spec.tasks[idx as usize], &before[idx as usize], &after[idx as usize]);
        for (other, (a, b)) in after.iter().zip(before).enumerate() {
            if other != idx as usize && !spec_depends(&self.spec, other as u32, idx) {
                assert_eq!(encode(a), encode(b), "a report on task {idx} changed task {other}");
            }
        }
        match &sent.kind {
            Some(peer_report::Kind::Outcome(outcome)) => {
                holders.remove(&idx);
                let output: Vec<&str> = new.output.iter().map(|l| &**l).collect();
                if outcome.success {
                    assert_eq!(new.state(), TaskState::Succeeded, "a success left {new:?}");
                    assert_eq!(output, outcome.output, "a success's output");
                    assert!(new.error.is_none());
                } else if outcome.canceled {
                    assert_eq!(new.state(), TaskState::Canceled, "a cancel left {new:?}");
                    assert_eq!(new.error.as_deref(), Some(&*outcome.error), "a cancel's reason");
                } else {
                    let retried = old.failures < spec.retry_limit;
                    let state = if retried { TaskState::Ready } else { TaskState::Failed };
                    assert_eq!(new.state(), state, "a failure left {new:?}");
                    assert_eq!(new.failures, old.failures + 1);
                    assert_eq!(new.error.as_deref(), Some(&*outcome.error), "a failure's error");
                    assert_eq!(output, outcome.output, "a failure's output");
                }
            }
            Some(peer_report::Kind::GiveUp(give_up)) => {
                holders.remove(&idx);
                let lost = old.lost + u32::from(give_up.counted);
                assert_eq!(new.lost, lost, "a giving up counted wrong: {new:?}");
                let state = if lost > LOST_LIMIT { TaskState::Failed } else { TaskState::Ready };
                assert_eq!(new.state(), state, "a giving up left {new:?}");
                assert!(new.error.as_deref().is_some_and(|e| e.starts_with(&*give_up.reason)), "{new:?}");
            }
            Some(peer_report::Kind::Progress(progress)) => {
                assert!(new.state() == TaskState::Running && new.handler() == old.handler(), "a progress left {new:?}");
                assert_eq!(new.progress_percent.to_bits(), progress.percent.to_bits(), "a progress's percent");
                let line = jobcenter::engine::Progress {
                    percent: progress.percent,
                    stage: progress.stage.clone(),
                    message: progress.message.clone(),
                }
                .stage_line();
                assert_eq!(&*new.stage, line, "a progress's stage");
            }
            None => assert_eq!(encode(after), encode(before), "a report of nothing changed the job"),
        }
    }
}

/// Whether task `child` depends, directly or not, on task `parent`.
fn spec_depends(spec: &JobSpec, child: u32, parent: u32) -> bool {
    spec.dag.descendants(parent).contains(&child)
}

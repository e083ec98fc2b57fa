//! Test support: a fake admin (the worker stream's server side, driven by
//! the test), a worker run against it, and the helpers the tests share.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use super::*;
use crate::proto::plugin::admin_to_worker_message::Body as AdminBody;
use crate::proto::plugin::plugin_control_service_server::{PluginControlService, PluginControlServiceServer};
use crate::proto::plugin::worker_to_admin_message::Body;
use crate::proto::plugin::{
    config_value, AdminHello, AdminRuntimeConfig, AdminToWorkerMessage, ExecuteJobRequest, JobCompleted,
    JobProgressUpdate, JobSpec, JobState, WorkerAcknowledge, WorkerHeartbeat, WorkerHello, WorkerToAdminMessage,
};
use crate::worker::builtin_handlers;

pub(super) fn spec(job_id: &str, job_type: &str, parameters: serde_json::Value) -> JobSpec {
    JobSpec {
        job_id: job_id.to_string(),
        job_type: job_type.to_string(),
        parameters: wire::json_to_values(parameters.as_object().expect("an object")),
        ..JobSpec::default()
    }
}

pub(super) fn output_lines(completed: &JobCompleted) -> Vec<String> {
    let result = completed.result.as_ref().expect("a result");
    match &result.output_values.get("output").and_then(|v| v.kind.clone()) {
        Some(config_value::Kind::StringList(list)) => list.values.clone(),
        other => panic!("output is {other:?}"),
    }
}

pub(super) struct FakeSession {
    pub(super) authorization: Option<String>,
    /// What the worker sends, read off its stream as it comes.
    from_worker: mpsc::UnboundedReceiver<Result<WorkerToAdminMessage, Status>>,
    pub(super) to_worker: mpsc::Sender<Result<AdminToWorkerMessage, Status>>,
    /// Messages read while looking for a heartbeat, in order.
    queued: std::collections::VecDeque<Body>,
    /// While set, every heartbeat (and the hello) is answered with a
    /// renewal naming it, as a jobcenter admin answers them.
    renewing: Arc<std::sync::atomic::AtomicBool>,
}

impl FakeSession {
    fn new(
        authorization: Option<String>,
        mut stream: Streaming<WorkerToAdminMessage>,
        to_worker: mpsc::Sender<Result<AdminToWorkerMessage, Status>>,
    ) -> FakeSession {
        let renewing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (tx, from_worker) = mpsc::unbounded_channel();
        let (renews, renewals) = (renewing.clone(), to_worker.clone());
        tokio::spawn(async move {
            while let Some(message) = stream.next().await {
                if let Ok(WorkerToAdminMessage { body: Some(Body::Heartbeat(heartbeat)), .. }) = &message {
                    let number = heartbeat.metadata.get(wire::HEARTBEAT_METADATA).and_then(|n| n.parse().ok());
                    if let (Some(number), true) = (number, renews.load(std::sync::atomic::Ordering::SeqCst)) {
                        let renewal =
                            AdminToWorkerMessage { request_id: wire::lease_renewal(number), sent_at: None, body: None };
                        let _ = renewals.send(Ok(renewal)).await;
                    }
                }
                if tx.send(message).is_err() {
                    return;
                }
            }
        });
        FakeSession { authorization, from_worker, to_worker, queued: Default::default(), renewing }
    }

    async fn next_raw(&mut self) -> Body {
        let message = tokio::time::timeout(Duration::from_secs(10), self.from_worker.recv())
            .await
            .expect("a message within 10 s")
            .expect("the stream is open")
            .expect("a message");
        assert_eq!(message.worker_id, "w-test");
        assert!(message.sent_at.is_some());
        message.body.expect("a body")
    }

    /// The next message that is not a heartbeat: heartbeats (coalesced by
    /// the worker) come whenever they come, and are read on their own.
    pub(super) async fn recv(&mut self) -> Body {
        if let Some(body) = self.queued.pop_front() {
            return body;
        }
        loop {
            match self.next_raw().await {
                Body::Heartbeat(_) => continue,
                body => return body,
            }
        }
    }

    /// Waits for a heartbeat that satisfies `check`, keeping other messages for `recv`.
    pub(super) async fn heartbeat_where(&mut self, check: impl Fn(&WorkerHeartbeat) -> bool) -> WorkerHeartbeat {
        loop {
            match self.next_raw().await {
                Body::Heartbeat(heartbeat) if check(&heartbeat) => return heartbeat,
                Body::Heartbeat(_) => continue,
                body => self.queued.push_back(body),
            }
        }
    }

    /// Renews the worker's lease as a jobcenter admin does: as of its
    /// hello now, then as of each heartbeat, until the renewal is ended.
    pub(super) async fn renew(&self) -> Renewing {
        self.renewing.store(true, std::sync::atomic::Ordering::SeqCst);
        self.send(&wire::lease_renewal(0), None).await;
        Renewing(self.renewing.clone())
    }

    pub(super) async fn send(&self, request_id: &str, body: Option<AdminBody>) {
        let message = AdminToWorkerMessage { request_id: request_id.into(), sent_at: None, body };
        self.to_worker.send(Ok(message)).await.expect("the worker listens");
    }

    pub(super) async fn hello(&mut self) -> WorkerHello {
        match self.recv().await {
            Body::Hello(hello) => hello,
            other => panic!("expected a hello, got {other:?}"),
        }
    }

    pub(super) async fn heartbeat(&mut self) -> WorkerHeartbeat {
        self.heartbeat_where(|_| true).await
    }

    pub(super) async fn ack(&mut self) -> WorkerAcknowledge {
        match self.recv().await {
            Body::Acknowledge(ack) => ack,
            other => panic!("expected an acknowledgement, got {other:?}"),
        }
    }

    pub(super) async fn completed(&mut self) -> JobCompleted {
        match self.recv().await {
            Body::JobCompleted(completed) => completed,
            other => panic!("expected a completion, got {other:?}"),
        }
    }

    pub(super) async fn execute(&self, request_id: &str, job: JobSpec, timeout_seconds: i32) {
        let admin_runtime = AdminRuntimeConfig { execution_timeout_seconds: timeout_seconds, ..Default::default() };
        let request = ExecuteJobRequest {
            request_id: request_id.into(),
            job: Some(job),
            admin_runtime: Some(admin_runtime),
            attempt: 1,
            ..Default::default()
        };
        self.send(request_id, Some(AdminBody::ExecuteJobRequest(request))).await;
    }

    /// Expects an accepted execution: acknowledgement and "started".
    pub(super) async fn started(&mut self, request_id: &str, job_id: &str) {
        let ack = self.ack().await;
        assert_eq!((ack.request_id.as_str(), ack.accepted), (request_id, true));
        let Body::JobProgressUpdate(progress) = self.recv().await else { panic!("expected progress") };
        assert_started(&progress, request_id, job_id);
    }

    /// Expects an accepted execution that may end before its start is
    /// reported: acknowledgement, "started" if it was still running, and
    /// its outcome.
    pub(super) async fn ran(&mut self, request_id: &str, job_id: &str) -> JobCompleted {
        let ack = self.ack().await;
        assert_eq!((ack.request_id.as_str(), ack.accepted), (request_id, true));
        match self.recv().await {
            Body::JobProgressUpdate(progress) => {
                assert_started(&progress, request_id, job_id);
                self.completed().await
            }
            Body::JobCompleted(completed) => completed,
            other => panic!("expected a start or an outcome, got {other:?}"),
        }
    }
}

struct FakeAdmin {
    sessions: mpsc::UnboundedSender<FakeSession>,
}

/// A fake admin's renewing of a lease, ended by `abort`.
pub(super) struct Renewing(Arc<std::sync::atomic::AtomicBool>);

impl Renewing {
    pub(super) fn abort(&self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

#[tonic::async_trait]
impl PluginControlService for FakeAdmin {
    type WorkerStreamStream = ReceiverStream<Result<AdminToWorkerMessage, Status>>;

    async fn worker_stream(
        &self,
        request: Request<Streaming<WorkerToAdminMessage>>,
    ) -> Result<Response<Self::WorkerStreamStream>, Status> {
        let authorization = request.metadata().get("authorization").and_then(|v| v.to_str().ok()).map(String::from);
        let (to_worker, outbound) = mpsc::channel(64);
        let session = FakeSession::new(authorization, request.into_inner(), to_worker);
        self.sessions.send(session).map_err(|_| Status::unavailable("test over"))?;
        Ok(Response::new(ReceiverStream::new(outbound)))
    }
}

/// Answers `GET /api/plugin/status` with the stream's port, as the admin does.
async fn serve_plugin_status(listener: tokio::net::TcpListener, grpc_port: u16) {
    while let Ok((mut socket, _)) = listener.accept().await {
        tokio::spawn(async move {
            let mut request = Vec::new();
            let mut buffer = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
                match socket.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buffer[..n]),
                }
            }
            let body = format!("{{\"worker_grpc_port\": {grpc_port}}}");
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
        });
    }
}

/// Starts a fake admin and returns its HTTP address and its sessions.
pub(super) async fn start_fake_admin() -> (String, mpsc::UnboundedReceiver<FakeSession>) {
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_port = grpc.local_addr().unwrap().port();
    let (sessions, accepted) = mpsc::unbounded_channel();
    let service = PluginControlServiceServer::new(FakeAdmin { sessions });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(grpc)),
    );
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http_address = http.local_addr().unwrap().to_string();
    tokio::spawn(serve_plugin_status(http, grpc_port));
    (http_address, accepted)
}

pub(super) async fn next_session(sessions: &mut mpsc::UnboundedReceiver<FakeSession>) -> FakeSession {
    tokio::time::timeout(Duration::from_secs(10), sessions.recv())
        .await
        .expect("a connection within 10 s")
        .expect("the fake admin runs")
}

fn assert_started(progress: &JobProgressUpdate, request_id: &str, job_id: &str) {
    assert_eq!((progress.request_id.as_str(), progress.job_id.as_str()), (request_id, job_id));
    assert_eq!((progress.state, progress.stage.as_str()), (JobState::Running as i32, "started"));
}

/// A worker's options for the fake admin at `admin`, an hour between heartbeats.
pub(super) fn options_for(admin: String, max_execute: u32) -> RemoteWorkerOptions {
    RemoteWorkerOptions {
        admins: vec![admin],
        worker_id: "w-test".into(),
        max_execute,
        max_detect: 1,
        heartbeat: Duration::from_secs(3600),
        lease: DEFAULT_LEASE,
        token: None,
        exec_log: None,
        tls: Default::default(),
    }
}

/// Runs a worker with the built-in handlers until the sender is used or dropped.
pub(super) fn start_worker(
    options: RemoteWorkerOptions,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<Result<(), InvalidOptions>>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let worker = tokio::spawn(run(options, Registry::new(builtin_handlers()), async move {
        let _ = stopped.await;
    }));
    (stop, worker)
}

pub(super) fn accepted_hello() -> Option<AdminBody> {
    Some(AdminBody::Hello(AdminHello {
        accepted: true,
        message: String::new(),
        heartbeat_interval_seconds: 3600,
        reconnect_delay_seconds: 0,
    }))
}

pub(super) async fn wait_for_file(path: &Path) -> String {
    for _ in 0..500 {
        if let Ok(text) = std::fs::read_to_string(path) {
            if text.ends_with('\n') {
                return text;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} never appeared", path.display());
}

pub(super) async fn process_ends(pid: &str) -> bool {
    for _ in 0..250 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Gone, or a zombie waiting for its parent to reap it.
        if stat.is_empty() || stat.split(' ').nth(2) == Some("Z") {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// A worker of `max_execute` slots serving a fake admin, its hello
/// accepted and its first heartbeat taken.
pub(super) async fn serving(
    max_execute: u32,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<Result<(), InvalidOptions>>, FakeSession) {
    let (admin, mut sessions) = start_fake_admin().await;
    let (stop, worker) = start_worker(options_for(admin, max_execute));
    let mut session = next_session(&mut sessions).await;
    session.hello().await;
    session.send("", accepted_hello()).await;
    session.heartbeat().await;
    (stop, worker, session)
}

/// Stops a worker `start_worker` started, and waits for it.
pub(super) async fn stop_worker(
    stop: oneshot::Sender<()>,
    worker: tokio::task::JoinHandle<Result<(), InvalidOptions>>,
) {
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), worker).await.expect("the worker stops").unwrap().unwrap();
}

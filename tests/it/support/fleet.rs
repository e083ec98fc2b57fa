//! Many workers from the test process: raw worker streams, each a hello
//! with one job type and then nothing, held open until the fleet is dropped.
//! For what needs more workers than processes are worth starting.

use std::collections::BTreeMap;
use std::time::Duration;

use jobcenter::proto::plugin::plugin_control_service_client::PluginControlServiceClient;
use jobcenter::proto::plugin::{
    admin_to_worker_message, worker_to_admin_message::Body, JobTypeCapability, WorkerHello, WorkerToAdminMessage,
};
use tokio_stream::wrappers::ReceiverStream;

/// The workers `fleet-0` … `fleet-(n-1)`, connected until dropped.
pub struct Fleet {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Fleet {
    /// Connects `n` workers to the admin at `grpc` and returns once every hello is accepted.
    pub fn connect(grpc: &str, n: usize) -> Fleet {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready, connected) = std::sync::mpsc::channel();
        let url = format!("http://{grpc}");
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let mut held = Vec::new();
                for i in 0..n {
                    held.push(open(&url, &format!("fleet-{i}")).await);
                }
                let _ = ready.send(());
                let _ = stopped.await;
                drop(held);
            });
        });
        connected.recv_timeout(Duration::from_secs(120)).expect("every worker of the fleet connects");
        Fleet { stop: Some(stop), thread: Some(thread) }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = self.stop.take().map(|stop| stop.send(()));
        let _ = self.thread.take().map(std::thread::JoinHandle::join);
    }
}

/// One worker's stream, once its hello is accepted.
async fn open(url: &str, worker_id: &str) -> impl Sized {
    let mut client = PluginControlServiceClient::connect(url.to_string()).await.expect("the admin's gRPC port");
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let capabilities = vec![JobTypeCapability {
        job_type: "idle".into(),
        can_execute: true,
        max_execution_concurrency: 1,
        ..JobTypeCapability::default()
    }];
    let hello = WorkerHello {
        worker_id: worker_id.into(),
        worker_instance_id: uuid::Uuid::new_v4().to_string(),
        protocol_version: "1".into(),
        capabilities,
        metadata: BTreeMap::new(),
        ..WorkerHello::default()
    };
    tx.send(WorkerToAdminMessage { worker_id: worker_id.into(), sent_at: None, body: Some(Body::Hello(hello)) })
        .await
        .expect("the stream is open");
    let mut inbound = client.worker_stream(ReceiverStream::new(rx)).await.expect("the stream is taken").into_inner();
    match inbound.message().await.expect("the admin answers").and_then(|m| m.body) {
        Some(admin_to_worker_message::Body::Hello(h)) if h.accepted => {}
        other => panic!("{worker_id}: the hello was not accepted: {other:?}"),
    }
    (tx, inbound)
}

//! Bad input over the wire gets a clear error and changes nothing: a
//! message before hello, an invalid job type, a completion for a task the
//! sender does not hold, a 100 MiB message, an invalid job submitted.

use crate::support;

use std::time::Duration;

use jobcenter::proto::api::{self, job_service_client::JobServiceClient};
use jobcenter::proto::plugin::{
    plugin_control_service_client::PluginControlServiceClient, worker_to_admin_message::Body, JobCompleted,
    JobTypeCapability, WorkerHeartbeat, WorkerHello, WorkerToAdminMessage,
};
use support::{nine_tasks, Server};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

fn hello(job_type: &str) -> WorkerToAdminMessage {
    WorkerToAdminMessage {
        worker_id: "raw".into(),
        sent_at: None,
        body: Some(Body::Hello(WorkerHello {
            worker_id: "raw".into(),
            worker_instance_id: uuid::Uuid::new_v4().to_string(),
            capabilities: vec![JobTypeCapability {
                job_type: job_type.into(),
                can_execute: true,
                max_execution_concurrency: 1,
                ..JobTypeCapability::default()
            }],
            ..WorkerHello::default()
        })),
    }
}

async fn worker_client(server: &Server) -> PluginControlServiceClient<tonic::transport::Channel> {
    PluginControlServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap()
        .max_encoding_message_size(256 * 1024 * 1024)
}

async fn job_client(server: &Server) -> JobServiceClient<tonic::transport::Channel> {
    JobServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap()
        .max_encoding_message_size(256 * 1024 * 1024)
}

/// Opens a worker stream, sends `messages`, and returns the first error status the admin answers with.
async fn stream_error(server: &Server, messages: Vec<WorkerToAdminMessage>) -> tonic::Status {
    let mut client = worker_client(server).await;
    let (tx, rx) = mpsc::channel(16);
    for message in messages {
        tx.send(message).await.unwrap();
    }
    let outcome = tokio::time::timeout(Duration::from_secs(20), async {
        match client.worker_stream(ReceiverStream::new(rx)).await {
            Err(status) => status,
            Ok(response) => {
                let mut inbound = response.into_inner();
                loop {
                    match inbound.message().await {
                        Ok(Some(_)) => continue,
                        Ok(None) => break tonic::Status::ok("the stream ended without an error"),
                        Err(status) => break status,
                    }
                }
            }
        }
    })
    .await;
    drop(tx);
    outcome.expect("the admin answered within 20 s")
}

fn heartbeat() -> WorkerToAdminMessage {
    WorkerToAdminMessage { body: Some(Body::Heartbeat(WorkerHeartbeat::default())), ..WorkerToAdminMessage::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let mut jobs = job_client(&server).await;

    // A message before hello.
    let status = stream_error(&server, vec![heartbeat()]).await;
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("first message must be hello"), "{}", status.message());

    // An invalid job type in hello.
    let status = stream_error(&server, vec![hello("../etc")]).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("job type"), "{}", status.message());

    // An invalid job submitted: refused with the rule and the tasks, nothing stored.
    let cycle = r#"{"name":"loop","tasks":[{"id":"a","job_type":"noop","depends_on":["b"]},{"id":"b","job_type":"noop","depends_on":["a"]}]}"#;
    let request = api::SubmitJobRequest {
        content: cycle.as_bytes().to_vec(),
        format: "json".into(),
        source_name: "loop.json".into(),
    };
    let status = jobs.submit_job(request).await.expect_err("a cycle is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("cycle") && status.message().contains("\"a\""), "{}", status.message());
    let listed = jobs.list_jobs(api::ListJobsRequest::default()).await.unwrap().into_inner().jobs;
    assert!(listed.is_empty(), "nothing is stored for a rejected job: {listed:?}");

    // A completion for a task the sender does not hold: refused, nothing changes.
    let job_id = jobs
        .submit_job(api::SubmitJobRequest {
            content: nine_tasks(None, 0).into_bytes(),
            format: "json".into(),
            source_name: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .job_id;
    let before = jobs.get_job(api::JobRef { job_id: job_id.clone() }).await.unwrap().into_inner();
    let forged = WorkerToAdminMessage {
        body: Some(Body::JobCompleted(JobCompleted {
            job_id: format!("{job_id}.0.1"),
            success: true,
            ..JobCompleted::default()
        })),
        ..WorkerToAdminMessage::default()
    };
    let garbage = WorkerToAdminMessage {
        body: Some(Body::JobCompleted(JobCompleted {
            job_id: "not-an-attempt".into(),
            success: true,
            ..JobCompleted::default()
        })),
        ..WorkerToAdminMessage::default()
    };
    {
        let mut client = worker_client(&server).await;
        let (tx, rx) = mpsc::channel(16);
        tx.send(hello("not-served-anywhere")).await.unwrap();
        tx.send(forged).await.unwrap();
        tx.send(garbage).await.unwrap();
        let mut inbound = client.worker_stream(ReceiverStream::new(rx)).await.unwrap().into_inner();
        let first = inbound.message().await.unwrap().expect("admin hello");
        assert!(first.body.is_some());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let after = jobs.get_job(api::JobRef { job_id: job_id.clone() }).await.unwrap().into_inner();
    let summary =
        |job: &api::Job| job.tasks.iter().map(|t| (t.id.clone(), t.state.clone(), t.attempt)).collect::<Vec<_>>();
    assert_eq!(summary(&before), summary(&after), "a completion from a non-holder changes nothing");
    assert_eq!(after.tasks[0].state, "ready");

    // A 100 MiB message on the worker stream: an error, not an out-of-memory; the admin goes on.
    let mut huge = WorkerHeartbeat::default();
    huge.metadata.insert("padding".into(), "x".repeat(100 * 1024 * 1024));
    let status = stream_error(
        &server,
        vec![
            hello("noop"),
            WorkerToAdminMessage { body: Some(Body::Heartbeat(huge)), ..WorkerToAdminMessage::default() },
        ],
    )
    .await;
    assert!(
        matches!(status.code(), tonic::Code::OutOfRange | tonic::Code::ResourceExhausted | tonic::Code::Internal),
        "{status:?}"
    );
    assert!(status.message().to_lowercase().contains("too large") || status.message().contains("length"), "{status:?}");

    // A 100 MiB job file submitted.
    let request = api::SubmitJobRequest {
        content: vec![b' '; 100 * 1024 * 1024],
        format: "json".into(),
        source_name: String::new(),
    };
    let status = jobs.submit_job(request).await.expect_err("a 100 MiB submit is refused");
    assert!(matches!(status.code(), tonic::Code::OutOfRange | tonic::Code::ResourceExhausted), "{status:?}");

    // Still serving, with exactly the one valid job.
    let listed = jobs.list_jobs(api::ListJobsRequest::default()).await.unwrap().into_inner().jobs;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, job_id);
}

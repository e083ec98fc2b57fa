//! The `recovery_check` job type: a worker runs the admin's periodic
//! recovery check as a cluster task by asking the admin to run it now (the
//! first of its admins that answers: any instance of a cluster runs the
//! check over the whole cluster).

use std::sync::Arc;

use super::{BoxFuture, Handler, TaskContext};
use crate::follower::Outcome;
use crate::proto::api::{self, job_service_client::JobServiceClient};
use crate::tls::ClientTls;
use crate::wire;

pub struct RecoveryCheckHandler {
    admins: Vec<String>,
    token: Option<String>,
    tls: ClientTls,
}

impl RecoveryCheckHandler {
    /// The handler, ready for a worker's registry.
    pub fn shared(admins: Vec<String>, token: Option<String>, tls: ClientTls) -> Arc<dyn Handler> {
        Arc::new(RecoveryCheckHandler { admins, token, tls })
    }
}

/// Connects to the first of `admins` that answers.
/// Connects to the first of `admins` that answers, or says why none did.
async fn connect(admins: &[String], tls: &ClientTls) -> Result<tonic::transport::Channel, String> {
    let mut failures = Vec::new();
    for admin in admins {
        let attempt = async {
            let address = wire::resolve_grpc_address(admin).await.map_err(|e| e.to_string())?;
            let endpoint = tls.endpoint(&address).map_err(|e| e.to_string())?;
            let endpoint = endpoint.connect_timeout(std::time::Duration::from_secs(5));
            endpoint.connect().await.map_err(|e| e.to_string())
        };
        match attempt.await {
            Ok(channel) => return Ok(channel),
            Err(e) => failures.push(format!("{admin}: {e}")),
        }
    }
    Err(format!("no admin answered: {}", failures.join("; ")))
}

/// The check's findings, a line each, or why it did not run.
async fn run_check(admins: &[String], token: Option<&str>, tls: &ClientTls) -> Result<Vec<String>, String> {
    let channel = connect(admins, tls).await?;
    let mut client = JobServiceClient::new(channel);
    let mut request = tonic::Request::new(api::RecoverRequest { dry_run: false, here_only: false });
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", super::remote::bearer(token).map_err(|e| e.to_string())?);
    }
    let response = client.recover(request).await.map_err(|s| s.message().to_string())?.into_inner();
    let mut lines: Vec<String> = response
        .findings
        .iter()
        .map(|f| {
            format!(
                "{} {} job {} task {}: {} (applied: {})",
                f.rule, f.rule_name, f.job_id, f.task_id, f.action, f.applied
            )
        })
        .collect();
    lines.push(format!("{} findings", response.findings.len()));
    Ok(lines)
}

impl Handler for RecoveryCheckHandler {
    fn job_type(&self) -> &'static str {
        wire::RECOVERY_CHECK_JOB_TYPE
    }

    fn execute(&self, _ctx: TaskContext) -> BoxFuture {
        let (admins, token, tls) = (self.admins.clone(), self.token.clone(), self.tls.clone());
        Box::pin(async move {
            match run_check(&admins, token.as_deref(), &tls).await {
                Ok(output) => Outcome::Succeeded { output },
                Err(e) => Outcome::Failed { error: format!("recovery check: {e}"), output: Vec::new() },
            }
        })
    }
}

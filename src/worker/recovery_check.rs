//! The `recovery_check` job type: a worker runs the admin's periodic
//! recovery check as a cluster task by asking the admin to run it now.

use std::sync::Arc;

use super::{BoxFuture, Handler, TaskContext};
use crate::follower::Outcome;
use crate::proto::api::{self, job_service_client::JobServiceClient};
use crate::tls::ClientTls;
use crate::wire;

pub struct RecoveryCheckHandler {
    admin: String,
    token: Option<String>,
    tls: ClientTls,
}

impl RecoveryCheckHandler {
    /// The handler, ready for a worker's registry.
    pub fn shared(admin: String, token: Option<String>, tls: ClientTls) -> Arc<dyn Handler> {
        Arc::new(RecoveryCheckHandler { admin, token, tls })
    }
}

async fn run_check(admin: &str, token: Option<&str>, tls: &ClientTls) -> anyhow::Result<Vec<String>> {
    let address = wire::resolve_grpc_address(admin).await?;
    let channel = tls.endpoint(&address)?.connect().await?;
    let mut client = JobServiceClient::new(channel);
    let mut request = tonic::Request::new(api::RecoverRequest { dry_run: false, here_only: false });
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse()?);
    }
    let response = client.recover(request).await.map_err(|s| anyhow::anyhow!("{}", s.message()))?.into_inner();
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
        let (admin, token, tls) = (self.admin.clone(), self.token.clone(), self.tls.clone());
        Box::pin(async move {
            match run_check(&admin, token.as_deref(), &tls).await {
                Ok(output) => Outcome::Succeeded { output },
                Err(e) => Outcome::Failed { error: format!("recovery check: {e:#}"), output: Vec::new() },
            }
        })
    }
}

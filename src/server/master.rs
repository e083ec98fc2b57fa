//! What jobcenter does towards the SeaweedFS masters it is given: it holds
//! the `admin-server` presence lock while it runs, switches the master's own
//! periodic vacuum off while a vacuum-capable worker is connected (and back
//! on when none is), and takes the cluster's `shell` admin lock around each
//! detection, so that an operator's `weed shell` and jobcenter never act on
//! the cluster at once.

use std::sync::Arc;
use std::time::Duration;

use tonic::transport::Channel;

use super::Shared;
use crate::proto::master::{
    seaweed_client::SeaweedClient, DisableVacuumRequest, EnableVacuumRequest, LeaseAdminTokenRequest,
    ReleaseAdminTokenRequest,
};
use crate::wire;

/// The lock an admin holds to say it is there (the master then leaves a
/// plugin's vacuum switch alone).
pub const PRESENCE_LOCK: &str = "admin-server";
/// The cluster's admin lock, the one `weed shell` takes.
pub const SHELL_LOCK: &str = "shell";
pub const CLIENT_NAME: &str = "jobcenter";
/// A lease lasts 10 s on the master; renew well within it.
const RENEW_EVERY: Duration = Duration::from_secs(4);
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// A held lease on a master lock.
#[derive(Clone, Debug)]
pub struct Lease {
    pub name: String,
    token: i64,
    lock_ts_ns: i64,
}

/// The gRPC address of a master given as `host:port` (gRPC on port + 10000)
/// or `host:port.grpcport`.
pub fn grpc_address(master: &str) -> anyhow::Result<String> {
    if let Some((http, grpc)) = master.rsplit_once('.') {
        if let (Ok((host, _)), Ok(port)) = (wire::split_host_port(http), grpc.parse::<u16>()) {
            return Ok(format!("{host}:{port}"));
        }
    }
    let (host, port) = wire::split_host_port(master)?;
    let port = port.checked_add(wire::GRPC_PORT_OFFSET).ok_or_else(|| anyhow::anyhow!("{master}: port too high"))?;
    Ok(format!("{host}:{port}"))
}

async fn client(masters: &[String]) -> anyhow::Result<SeaweedClient<Channel>> {
    let mut last = anyhow::anyhow!("no master address given");
    for master in masters {
        let address = grpc_address(master)?;
        match tokio::time::timeout(CALL_TIMEOUT, Channel::from_shared(format!("http://{address}"))?.connect()).await {
            Ok(Ok(channel)) => return Ok(SeaweedClient::new(channel)),
            Ok(Err(e)) => last = anyhow::anyhow!("master {master} ({address}): {e}"),
            Err(_) => last = anyhow::anyhow!("master {master} ({address}): no answer within {CALL_TIMEOUT:?}"),
        }
    }
    Err(last)
}

/// Takes a lock, trying every second until `patience` runs out.
pub async fn acquire(masters: &[String], name: &str, message: &str, patience: Duration) -> anyhow::Result<Lease> {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let attempt = async {
            let mut master = client(masters).await?;
            let request = LeaseAdminTokenRequest {
                previous_token: 0,
                previous_lock_time: 0,
                lock_name: name.into(),
                client_name: CLIENT_NAME.into(),
                message: message.into(),
            };
            let response = tokio::time::timeout(CALL_TIMEOUT, master.lease_admin_token(request)).await??.into_inner();
            anyhow::Ok(Lease { name: name.into(), token: response.token, lock_ts_ns: response.lock_ts_ns })
        };
        match attempt.await {
            Ok(lease) => return Ok(lease),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                anyhow::bail!("the master's {name:?} lock was not free within {patience:?}: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// Renews a held lease (the master hands out a new token each time).
pub async fn renew(masters: &[String], lease: &mut Lease, message: &str) -> anyhow::Result<()> {
    let mut master = client(masters).await?;
    let request = LeaseAdminTokenRequest {
        previous_token: lease.token,
        previous_lock_time: lease.lock_ts_ns,
        lock_name: lease.name.clone(),
        client_name: CLIENT_NAME.into(),
        message: message.into(),
    };
    let response = tokio::time::timeout(CALL_TIMEOUT, master.lease_admin_token(request)).await??.into_inner();
    lease.token = response.token;
    lease.lock_ts_ns = response.lock_ts_ns;
    Ok(())
}

pub async fn release(masters: &[String], lease: &Lease) -> anyhow::Result<()> {
    let mut master = client(masters).await?;
    let request = ReleaseAdminTokenRequest {
        previous_token: lease.token,
        previous_lock_time: lease.lock_ts_ns,
        lock_name: lease.name.clone(),
    };
    tokio::time::timeout(CALL_TIMEOUT, master.release_admin_token(request)).await??;
    Ok(())
}

/// Holds a lock while `work` runs, renewing it; releases it after.
pub async fn with_lock<T>(
    masters: &[String],
    name: &str,
    message: &str,
    patience: Duration,
    work: impl std::future::Future<Output = T>,
) -> anyhow::Result<T> {
    let mut lease = acquire(masters, name, message, patience).await?;
    let mut work = std::pin::pin!(work);
    let mut ticker = tokio::time::interval(RENEW_EVERY);
    ticker.tick().await;
    let out = loop {
        tokio::select! {
            out = &mut work => break out,
            _ = ticker.tick() => {
                if let Err(e) = renew(masters, &mut lease, message).await {
                    tracing::warn!(lock = name, error = %e, "cannot renew the master lock");
                }
            }
        }
    };
    if let Err(e) = release(masters, &lease).await {
        tracing::warn!(lock = name, error = %e, "cannot release the master lock");
    }
    Ok(out)
}

async fn set_vacuum(masters: &[String], enabled: bool) -> anyhow::Result<()> {
    let mut master = client(masters).await?;
    if enabled {
        tokio::time::timeout(CALL_TIMEOUT, master.enable_vacuum(EnableVacuumRequest { by_plugin: true })).await??;
    } else {
        tokio::time::timeout(CALL_TIMEOUT, master.disable_vacuum(DisableVacuumRequest { by_plugin: true })).await??;
    }
    Ok(())
}

/// Holds the presence lock, and keeps the master's vacuum off while a
/// vacuum-capable worker is connected.
pub fn spawn_duties(shared: Arc<Shared>) {
    if shared.options.masters.is_empty() {
        return;
    }
    let presence = shared.clone();
    tokio::spawn(async move {
        let masters = presence.options.masters.clone();
        loop {
            match acquire(&masters, PRESENCE_LOCK, "jobcenter admin connected", Duration::from_secs(5)).await {
                Ok(mut lease) => loop {
                    tokio::time::sleep(RENEW_EVERY).await;
                    if let Err(e) = renew(&masters, &mut lease, "jobcenter admin connected").await {
                        tracing::warn!(error = %e, "lost the master presence lock; taking it again");
                        break;
                    }
                },
                Err(e) => {
                    tracing::debug!(error = %e, "master presence lock not taken yet");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            }
        }
    });
    tokio::spawn(async move {
        let masters = shared.options.masters.clone();
        let mut disabled: Option<bool> = None;
        loop {
            let capable = shared
                .registry
                .workers()
                .iter()
                .any(|w| w.capabilities.iter().any(|c| c.job_type == "vacuum" && c.can_execute));
            if disabled != Some(capable) {
                match set_vacuum(&masters, !capable).await {
                    Ok(()) => {
                        let state = if capable { "off: a vacuum worker is connected" } else { "on" };
                        tracing::info!(state, "master periodic vacuum");
                        disabled = Some(capable);
                    }
                    Err(e) => tracing::debug!(error = %e, "cannot switch the master's vacuum yet"),
                }
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn master_grpc_addresses() {
        assert_eq!(grpc_address("127.0.0.1:9333").unwrap(), "127.0.0.1:19333");
        assert_eq!(grpc_address("127.0.0.1:9333.19444").unwrap(), "127.0.0.1:19444");
        assert!(grpc_address("nowhere").is_err());
    }
}

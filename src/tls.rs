//! TLS for the gRPC port: a server certificate, and optionally a client CA
//! that makes it mutual; clients trust a CA and may present their own
//! certificate. Built on tonic's rustls.

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

use crate::wire;

/// TLS settings that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the {what} {}: {source}", path.display())]
    Read { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("invalid address {address}: {reason}")]
    Address { address: String, reason: String },
    #[error("TLS settings: {0}")]
    Settings(tonic::transport::Error),
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::Read { what, path: path.to_path_buf(), source })
}

/// The server side: its certificate and key, and the CA its clients' certificates must chain to.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ServerTls {
    /// PEM certificate of the gRPC port; with --tls-key it serves TLS.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA: every client (worker or CLI) must present a certificate it signed (mutual TLS).
    #[arg(long, requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
}

impl ServerTls {
    pub fn config(&self) -> Result<Option<ServerTlsConfig>, Error> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else { return Ok(None) };
        let identity = Identity::from_pem(read(cert, "certificate")?, read(key, "key")?);
        let mut config = ServerTlsConfig::new().identity(identity);
        if let Some(ca) = &self.tls_client_ca {
            config = config.client_ca_root(Certificate::from_pem(read(ca, "client CA")?));
        }
        Ok(Some(config))
    }
}

/// The client side: the CA to trust and, for mutual TLS, our own certificate.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ClientTls {
    /// PEM CA that signed the admin's certificate; connects with TLS.
    #[arg(long, global = true)]
    pub tls_ca: Option<PathBuf>,
    /// PEM certificate to present to the admin (mutual TLS).
    #[arg(long, global = true, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, global = true, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl ClientTls {
    pub fn enabled(&self) -> bool {
        self.tls_ca.is_some() || self.tls_cert.is_some()
    }

    /// An endpoint for a gRPC `host:port`, with TLS when configured.
    pub fn endpoint(&self, address: &str) -> Result<Endpoint, Error> {
        let invalid = |reason: String| Error::Address { address: address.to_string(), reason };
        let (host, port) = wire::split_host_port(address).map_err(|e| invalid(e.to_string()))?;
        let authority = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
        let scheme = if self.enabled() { "https" } else { "http" };
        let mut endpoint =
            Endpoint::from_shared(format!("{scheme}://{authority}")).map_err(|e| invalid(e.to_string()))?;
        if self.enabled() {
            let mut config = ClientTlsConfig::new().domain_name(host);
            if let Some(ca) = &self.tls_ca {
                config = config.ca_certificate(Certificate::from_pem(read(ca, "CA")?));
            }
            if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
                config = config.identity(Identity::from_pem(read(cert, "certificate")?, read(key, "key")?));
            }
            endpoint = endpoint.tls_config(config).map_err(Error::Settings)?;
        }
        Ok(endpoint)
    }
}

//! How jobcenter reaches its database: the URL (its password from the URL,
//! a password file, `PGPASSWORD`, or a `PGPASSFILE`/`~/.pgpass` entry, and
//! never shown), the TLS modes of libpq (`sslmode` `disable`, `prefer`,
//! `require`, `verify-ca`, `verify-full`, with `sslrootcert`), and what each
//! connection is set up with.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres_rustls::MakeRustlsConnect;

/// What every connection runs first: nothing is acknowledged before its
/// commit is durable, and no session may sit idle inside a transaction. The
/// server also watches the connection (keepalives, and a bound on data it
/// sent that is not acknowledged): a session whose instance was cut off by
/// the network ends within about `DEAD_PEER` seconds, and the locks its
/// transaction held (the fence's share lock on the instance's row among
/// them) with it, instead of when the network comes back.
pub(super) const SESSION_SETUP: &str = "SET synchronous_commit = on; SET idle_in_transaction_session_timeout = '60s'; \
     SET tcp_keepalives_idle = 3; SET tcp_keepalives_interval = 1; SET tcp_keepalives_count = 3; \
     SET tcp_user_timeout = 6000";

/// How long a connection may be silent at the TCP level, either way, before
/// its end gives it up: keepalives after 3 s of quiet, every 1 s, 3 unanswered;
/// data unacknowledged for 6 s. The same on the server's side (`SESSION_SETUP`).
const DEAD_PEER: std::time::Duration = std::time::Duration::from_secs(6);

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// A database to connect to: the driver's configuration, the TLS connector,
/// and a description of it that carries no password.
#[derive(Clone)]
pub(crate) struct Target {
    pub config: tokio_postgres::Config,
    pub tls: MakeRustlsConnect,
    pub mode: TlsMode,
    /// `postgres://USER@HOST:PORT/DATABASE`, for messages and logs.
    pub display: String,
    pub user: String,
    pub database: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display)
    }
}

/// Where a password may come from besides the URL.
#[derive(Clone, Debug, Default)]
pub struct PasswordSources {
    /// A file holding the password (its first line).
    pub file: Option<PathBuf>,
}

impl Target {
    /// Reads a `postgres://` URL. Errors name the rule broken, never the password.
    pub(crate) fn parse(url: &str, sources: &PasswordSources) -> Result<Target, String> {
        let url = url.trim();
        let rest = url.strip_prefix("postgres://").or_else(|| url.strip_prefix("postgresql://")).ok_or_else(|| {
            "the database URL must start with postgres:// (postgres://USER@HOST:PORT/DATABASE)".to_string()
        })?;
        let (base, query) = match rest.split_once('?') {
            Some((base, query)) => (base, query),
            None => (rest, ""),
        };
        let mut mode = TlsMode::Prefer;
        let mut root_cert: Option<PathBuf> = None;
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "sslmode" => {
                    mode = match value {
                        "disable" => TlsMode::Disable,
                        "allow" | "prefer" => TlsMode::Prefer,
                        "require" => TlsMode::Require,
                        "verify-ca" => TlsMode::VerifyCa,
                        "verify-full" => TlsMode::VerifyFull,
                        other => {
                            return Err(format!(
                                "sslmode={other} is not one of disable, prefer, require, verify-ca, verify-full"
                            ))
                        }
                    }
                }
                "sslrootcert" => root_cert = Some(PathBuf::from(percent_decode(value))),
                _ => kept.push(pair),
            }
        }
        let driver_url = if kept.is_empty() {
            format!("postgres://{base}")
        } else {
            format!("postgres://{base}?{}", kept.join("&"))
        };
        let mut config = tokio_postgres::Config::from_str(&driver_url)
            .map_err(|e| format!("the database URL is not valid: {}", strip_password(&e.to_string())))?;
        let user = config.get_user().map(String::from).unwrap_or_else(|| std::env::var("USER").unwrap_or_default());
        if user.is_empty() {
            return Err("the database URL names no user (postgres://USER@HOST/DATABASE)".into());
        }
        config.user(&user);
        let database = config.get_dbname().map(String::from).unwrap_or_else(|| user.clone());
        config.dbname(&database);
        let host = match config.get_hosts().first() {
            Some(Host::Tcp(host)) => host.clone(),
            Some(Host::Unix(path)) => path.display().to_string(),
            None => {
                config.host("localhost");
                "localhost".into()
            }
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        if config.get_password().is_none() {
            if let Some(password) = password_from(sources, &host, port, &database, &user)? {
                config.password(password);
            }
        }
        if config.get_application_name().is_none() {
            config.application_name("jobcenter");
        }
        config.connect_timeout(std::time::Duration::from_secs(10));
        // A connection whose other end went quiet (a network partition, a
        // host gone) fails within DEAD_PEER rather than after the system's
        // retransmission limit of many minutes, so that the store reports
        // itself away and the instance fences itself in time; what the URL
        // sets itself is kept.
        if !kept.iter().any(|pair| pair.starts_with("keepalives")) {
            config.keepalives(true);
            config.keepalives_idle(std::time::Duration::from_secs(3));
            config.keepalives_interval(std::time::Duration::from_secs(1));
            config.keepalives_retries(3);
        }
        if !kept.iter().any(|pair| pair.starts_with("tcp_user_timeout")) {
            config.tcp_user_timeout(DEAD_PEER);
        }
        config.ssl_mode(match mode {
            TlsMode::Disable => SslMode::Disable,
            TlsMode::Prefer => SslMode::Prefer,
            _ => SslMode::Require,
        });
        if mode == TlsMode::Require && root_cert.is_some() {
            // As in libpq: with a root certificate, `require` verifies the chain.
            mode = TlsMode::VerifyCa;
        }
        let tls = tls_connector(mode, root_cert.as_deref())?;
        let display = format!("postgres://{user}@{host}:{port}/{database}");
        Ok(Target { config, tls, mode, display, user, database })
    }

    /// Opens one connection and sets it up; the connection's task runs on the current runtime.
    pub(crate) async fn connect(&self) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        let (client, connection) = self.config.connect(self.tls.clone()).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "database connection ended");
            }
        });
        client.batch_execute(SESSION_SETUP).await?;
        Ok(client)
    }
}

/// The password for USER at HOST:PORT/DATABASE when the URL gives none: a
/// password file, `PGPASSWORD`, then `PGPASSFILE` (or `~/.pgpass`).
fn password_from(
    sources: &PasswordSources,
    host: &str,
    port: u16,
    database: &str,
    user: &str,
) -> Result<Option<String>, String> {
    if let Some(file) = &sources.file {
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("cannot read the database password file {}: {e}", file.display()))?;
        let password = text.lines().next().unwrap_or("").trim_end_matches('\r').to_string();
        if password.is_empty() {
            return Err(format!("the database password file {} is empty", file.display()));
        }
        return Ok(Some(password));
    }
    if let Ok(password) = std::env::var("PGPASSWORD") {
        if !password.is_empty() {
            return Ok(Some(password));
        }
    }
    let passfile = match std::env::var_os("PGPASSFILE") {
        Some(path) => PathBuf::from(path),
        None => match std::env::var_os("HOME") {
            Some(home) => Path::new(&home).join(".pgpass"),
            None => return Ok(None),
        },
    };
    match std::fs::read_to_string(&passfile) {
        Ok(text) => Ok(pgpass_lookup(&text, host, port, database, user)),
        Err(_) => Ok(None),
    }
}

/// The first `HOST:PORT:DATABASE:USER:PASSWORD` line that matches (`*`
/// matches anything; `\:` and `\\` are a literal colon and backslash).
pub(super) fn pgpass_lookup(text: &str, host: &str, port: u16, database: &str, user: &str) -> Option<String> {
    let port = port.to_string();
    for line in text.lines() {
        if line.trim_start().starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let mut fields = Vec::new();
        let mut field = String::new();
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => field.extend(chars.next()),
                ':' if fields.len() < 4 => fields.push(std::mem::take(&mut field)),
                c => field.push(c),
            }
        }
        fields.push(field);
        if fields.len() != 5 {
            continue;
        }
        let matches = |pattern: &str, value: &str| pattern == "*" || pattern == value;
        let host_matches = matches(&fields[0], host) || (fields[0] == "localhost" && host.starts_with('/'));
        if host_matches && matches(&fields[1], &port) && matches(&fields[2], database) && matches(&fields[3], user) {
            return Some(fields[4].clone());
        }
    }
    None
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(high), Some(low)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((high * 16 + low) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A message with anything that looks like a URL password removed.
pub(super) fn strip_password(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for word in text.split_inclusive(char::is_whitespace) {
        match word.find("://").and_then(|scheme| word[scheme + 3..].find('@').map(|at| (scheme + 3, scheme + 3 + at))) {
            Some((start, at)) if word[start..at].contains(':') => {
                let colon = start + word[start..at].find(':').unwrap_or(0);
                out.push_str(&word[..colon]);
                out.push_str(&word[at..]);
            }
            _ => out.push_str(word),
        }
    }
    out
}

fn tls_connector(mode: TlsMode, root_cert: Option<&Path>) -> Result<MakeRustlsConnect, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS set-up failed: {e}"))?;
    let config = match mode {
        TlsMode::Disable | TlsMode::Prefer | TlsMode::Require => {
            builder.dangerous().with_custom_certificate_verifier(Arc::new(AcceptAny(provider))).with_no_client_auth()
        }
        TlsMode::VerifyCa | TlsMode::VerifyFull => {
            let path = match root_cert {
                Some(path) => path.to_path_buf(),
                None => {
                    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
                    home.join(".postgresql/root.crt")
                }
            };
            let pem = std::fs::read(&path).map_err(|e| {
                format!("sslmode needs a root certificate: cannot read {} ({e}); give sslrootcert=FILE", path.display())
            })?;
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(&pem) {
                let cert: CertificateDer<'static> =
                    cert.map_err(|e| format!("{} holds no readable certificate: {e}", path.display()))?;
                roots.add(cert).map_err(|e| format!("{}: {e}", path.display()))?;
            }
            if roots.is_empty() {
                return Err(format!("{} holds no certificate", path.display()));
            }
            let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("TLS set-up failed: {e}"))?;
            if mode == TlsMode::VerifyFull {
                builder.with_webpki_verifier(webpki).with_no_client_auth()
            } else {
                builder.dangerous().with_custom_certificate_verifier(Arc::new(ChainOnly(webpki))).with_no_client_auth()
            }
        }
    };
    Ok(MakeRustlsConnect::new(config))
}

/// `sslmode=require` (and `prefer`): encrypted, the server not verified, as in libpq.
#[derive(Debug)]
struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `sslmode=verify-ca`: the chain must lead to the root certificate; the host name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext { .. })) => {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_urls_without_showing_passwords() {
        let target =
            Target::parse("postgres://app:s3cret@db.example:6432/jobs?sslmode=require", &Default::default()).unwrap();
        assert_eq!(target.display, "postgres://app@db.example:6432/jobs");
        assert_eq!(target.mode, TlsMode::Require);
        assert_eq!(target.config.get_password(), Some(&b"s3cret"[..]));
        assert_eq!(format!("{target:?}"), "postgres://app@db.example:6432/jobs");
        let error = Target::parse("postgres://app:s3cret@db/x?sslmode=maybe", &Default::default()).err().unwrap();
        assert!(error.contains("sslmode=maybe") && !error.contains("s3cret"), "{error}");
        assert!(Target::parse("mysql://app@db/x", &Default::default()).is_err());
        let missing =
            Target::parse("postgres://app@db/x?sslmode=verify-full&sslrootcert=/nonexistent", &Default::default());
        assert!(missing.err().unwrap().contains("/nonexistent"));
    }

    #[test]
    fn finds_passwords_in_a_password_file_and_a_pgpass() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("password");
        std::fs::write(&file, "from-file\n").unwrap();
        let sources = PasswordSources { file: Some(file) };
        let target = Target::parse("postgres://app@db:5432/jobs", &sources).unwrap();
        assert_eq!(target.config.get_password(), Some(&b"from-file"[..]));
        let pgpass = "# comment\nother:5432:*:app:no\ndb:5432:jobs:app:pa\\:ss\n*:*:*:*:fallback\n";
        assert_eq!(pgpass_lookup(pgpass, "db", 5432, "jobs", "app"), Some("pa:ss".into()));
        assert_eq!(pgpass_lookup(pgpass, "elsewhere", 1, "x", "y"), Some("fallback".into()));
        assert_eq!(pgpass_lookup("db:5432:jobs:app:x\n", "db", 5433, "jobs", "app"), None);
    }

    #[test]
    fn strips_passwords_from_messages() {
        assert_eq!(
            strip_password("cannot parse postgres://app:s3cret@db/x here"),
            "cannot parse postgres://app@db/x here"
        );
        assert_eq!(strip_password("no url"), "no url");
    }
}

//! Who may do what: the five roles, the credentials a caller presents (the
//! `--token-file` token, an admin's, and the named tokens of a credentials
//! file, kept as hashes), the judgement of a request against the role its
//! route needs (`table`), and the typed refusals. Both ports pass here:
//! the HTTP guard and the gRPC layer (`grpc`).

pub(crate) mod credentials;
pub(crate) mod grpc;
pub mod table;
mod throttle;

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use sha2::{Digest, Sha256};

use crate::server::file_changes::FileChanges;
use tonic::Status;

pub(crate) use credentials::Credentials;
pub(crate) use table::Need;

/// What a credential may do. `admin` may do everything; `operator` what
/// `viewer` may and the changes; `worker` and `instance` only their stream
/// and the peer service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Reads: jobs, workers, policies, activities, metrics.
    Viewer,
    /// A viewer's reads, and submit, cancel, retry, detect, recover, prune,
    /// pause and resume, and policy changes.
    Operator,
    /// The worker stream only.
    Worker,
    /// The peer service only: another instance of the cluster.
    Instance,
    /// Everything, backups included.
    Admin,
}

impl Role {
    pub const ALL: [Role; 5] = [Role::Viewer, Role::Operator, Role::Worker, Role::Instance, Role::Admin];

    pub fn name(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Worker => "worker",
            Role::Instance => "instance",
            Role::Admin => "admin",
        }
    }

    /// Whether this role may do what `needed` may.
    pub fn covers(self, needed: Role) -> bool {
        match (self, needed) {
            (Role::Admin, _) | (Role::Operator, Role::Viewer) => true,
            (role, needed) => role == needed,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(text: &str) -> Result<Role, String> {
        Role::ALL
            .into_iter()
            .find(|r| r.name() == text)
            .ok_or_else(|| format!("unknown role {text:?}: a role is viewer, operator, worker, instance or admin"))
    }
}

/// Who made a request: the credential's name and role, and what a
/// console session revalidates it by.
#[derive(Clone, Debug)]
pub(crate) struct Caller {
    pub(crate) name: Arc<str>,
    pub(crate) role: Role,
    source: Source,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Source {
    /// No credential is configured: every caller may do everything.
    Anyone,
    /// The `--token-file` token.
    TokenFile,
    /// A credentials file's entry, by the SHA-256 of its stored hash (a
    /// changed or removed entry no longer stands for its sessions).
    Credential(Arc<str>),
    /// A client certificate of a mutual TLS connection (never a session's).
    Certificate,
}

impl Caller {
    fn anyone() -> Caller {
        Caller { name: "anyone".into(), role: Role::Admin, source: Source::Anyone }
    }

    /// The caller as a session shared through the store keeps it: its
    /// name, role and what it was verified by (never a token, nor a hash).
    pub(crate) fn stored(&self) -> String {
        let source = match &self.source {
            Source::Anyone => "anyone".to_string(),
            Source::TokenFile => "token-file".to_string(),
            Source::Credential(fingerprint) => format!("credential:{fingerprint}"),
            Source::Certificate => "certificate".to_string(),
        };
        serde_json::json!({ "name": &*self.name, "role": self.role.name(), "source": source }).to_string()
    }

    /// A caller read back from `stored`.
    pub(crate) fn from_stored(text: &str) -> Option<Caller> {
        let value: serde_json::Value = serde_json::from_str(text).ok()?;
        let role = value["role"].as_str()?.parse().ok()?;
        let source = match value["source"].as_str()? {
            "anyone" => Source::Anyone,
            "token-file" => Source::TokenFile,
            "certificate" => Source::Certificate,
            other => Source::Credential(other.strip_prefix("credential:")?.into()),
        };
        Some(Caller { name: value["name"].as_str()?.into(), role, source })
    }

    /// A caller of a name, for the tests of what carries one.
    #[cfg(test)]
    pub(crate) fn named(name: &str) -> Caller {
        Caller { name: name.into(), role: Role::Viewer, source: Source::Credential("hash".into()) }
    }
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No credential, or one that is not known.
    Unauthenticated,
    /// A credential whose role may not do this.
    Forbidden { name: Arc<str>, role: Role, needed: &'static [Role] },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Unauthenticated => {
                f.write_str("a valid credential is required: send `authorization: Bearer TOKEN`")
            }
            Refusal::Forbidden { role, needed, .. } => {
                write!(f, "the role {role} may not do this: it needs the role {}", table::either(needed))
            }
        }
    }
}

impl Refusal {
    pub(crate) fn http_status(&self) -> u16 {
        match self {
            Refusal::Unauthenticated => 401,
            Refusal::Forbidden { .. } => 403,
        }
    }

    pub(crate) fn status(&self) -> Status {
        match self {
            Refusal::Unauthenticated => Status::unauthenticated(self.to_string()),
            Refusal::Forbidden { .. } => Status::permission_denied(self.to_string()),
        }
    }
}

/// The most verified tokens remembered (a token verified once is not
/// hashed again until the credentials change).
const MAX_VERIFIED: usize = 4096;

/// The credentials this server takes, and the judgement of each request.
/// Cheap to clone.
#[derive(Clone, Default)]
pub(crate) struct Access {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The `--token-file` token: an admin's.
    token: Option<Vec<u8>>,
    /// The credentials file, when one is given, and what it last held.
    file: Option<PathBuf>,
    credentials: RwLock<Arc<Credentials>>,
    /// Tokens verified against the current credentials, by their digest.
    verified: Mutex<HashMap<[u8; 32], Caller>>,
    throttle: throttle::Throttle,
}

impl Access {
    /// The token file's token, and the credentials file read as it is now.
    #[cfg(test)]
    pub(crate) fn new(token: Option<String>, file: Option<(PathBuf, Credentials)>) -> Access {
        Access::with_slowdown(token, file, throttle::FREE)
    }

    /// The same, with the unknown credentials an address may present in a
    /// minute before its answers slow down.
    pub(crate) fn with_slowdown(
        token: Option<String>,
        file: Option<(PathBuf, Credentials)>,
        free_failures: u32,
    ) -> Access {
        let token = token.map(|t| t.trim().as_bytes().to_vec()).filter(|t| !t.is_empty());
        let (file, credentials) = match file {
            Some((path, credentials)) => (Some(path), credentials),
            None => (None, Credentials::default()),
        };
        Access {
            inner: Arc::new(Inner {
                token,
                file,
                credentials: RwLock::new(Arc::new(credentials)),
                verified: Mutex::default(),
                throttle: throttle::Throttle::new(free_failures),
            }),
        }
    }

    /// Whether a request must present a credential (a token file or a
    /// credentials file is given).
    pub(crate) fn required(&self) -> bool {
        self.inner.token.is_some() || self.inner.file.is_some()
    }

    pub(crate) fn file(&self) -> Option<&PathBuf> {
        self.inner.file.as_ref()
    }

    fn credentials(&self) -> Arc<Credentials> {
        self.inner.credentials.read().expect("credentials lock").clone()
    }

    /// Takes `credentials` in place of the current ones: every token is
    /// verified again, and a session whose credential changed or went ends.
    pub(crate) fn replace(&self, credentials: Credentials) {
        *self.inner.credentials.write().expect("credentials lock") = Arc::new(credentials);
        self.inner.verified.lock().expect("verified lock").clear();
    }

    /// Who presents `token`, when that is known without hashing it: the
    /// token file's, or one verified before.
    fn known(&self, token: &str) -> Option<Caller> {
        if let Some(expected) = &self.inner.token {
            if constant_time_eq(token.as_bytes(), expected) {
                return Some(Caller { name: "token-file".into(), role: Role::Admin, source: Source::TokenFile });
            }
        }
        self.inner.verified.lock().expect("verified lock").get(&digest(token)).cloned()
    }

    /// Who presents `token`, verified against its entry (slow by design).
    async fn verify(&self, token: &str) -> Option<Caller> {
        let credentials = self.credentials();
        let entry = credentials.named(credentials::name_of(token)?)?.clone();
        let presented = token.to_string();
        let hash = entry.hash.clone();
        let matches = tokio::task::spawn_blocking(move || credentials::verify(&presented, &hash)).await.ok()?;
        if !matches {
            return None;
        }
        let caller =
            Caller { name: entry.name.clone(), role: entry.role, source: Source::Credential(fingerprint(&entry.hash)) };
        // Remembered only while the credentials it was verified against stand.
        if Arc::ptr_eq(&credentials, &self.credentials()) {
            let mut verified = self.inner.verified.lock().expect("verified lock");
            if verified.len() >= MAX_VERIFIED {
                verified.clear();
            }
            verified.insert(digest(token), caller.clone());
        }
        Some(caller)
    }

    /// Who presents `token`, from `from`: a token not verified before
    /// waits first when its address failed repeatedly, and a failure counts
    /// against its address.
    pub(crate) async fn sign_in(&self, token: &str, from: Option<IpAddr>) -> Result<Caller, Refusal> {
        if !self.required() {
            return Ok(Caller::anyone());
        }
        let token = token.trim();
        if let Some(caller) = self.known(token) {
            return Ok(caller);
        }
        self.inner.throttle.wait(from).await;
        match self.verify(token).await {
            Some(caller) => Ok(caller),
            None => {
                self.inner.throttle.failed(from);
                tracing::info!(from = ?from, "a credential that is not known was refused");
                Err(Refusal::Unauthenticated)
            }
        }
    }

    /// Judges a request that needs `needed` and presents `authorization`
    /// (the header's value, `Bearer TOKEN`), from `from`.
    pub(crate) async fn judge(
        &self,
        needed: &'static [Role],
        authorization: Option<&str>,
        from: Option<IpAddr>,
    ) -> Result<Caller, Refusal> {
        if !self.required() {
            return Ok(Caller::anyone());
        }
        let Some(header) = authorization else { return Err(Refusal::Unauthenticated) };
        let token = header.strip_prefix("Bearer ").unwrap_or("");
        let caller = self.sign_in(token, from).await?;
        permit(caller, needed)
    }

    /// Judges a gRPC call: by its `authorization` header, or without one by
    /// the client certificate of its mutual TLS connection (DER), whose
    /// subject or alternative name the credentials file gives a role.
    pub(crate) async fn judge_call(
        &self,
        needed: &'static [Role],
        authorization: Option<&str>,
        certificate: Option<&[u8]>,
        from: Option<IpAddr>,
    ) -> Result<Caller, Refusal> {
        if let (None, Some(der), true) = (authorization, certificate, self.required()) {
            let credentials = self.credentials();
            if credentials.has_certificates() {
                let shown = credentials::Presented::of(der).and_then(|p| credentials.certificate(&p));
                if let Some((shows, role)) = shown {
                    let caller =
                        Caller { name: format!("certificate {shows}").into(), role, source: Source::Certificate };
                    return permit(caller, needed);
                }
            }
        }
        self.judge(needed, authorization, from).await
    }

    /// A console session's caller as the credentials stand now: `None`
    /// once its credential changed or went.
    pub(crate) fn current(&self, caller: &Caller) -> Option<Caller> {
        match &caller.source {
            Source::Anyone => (!self.required()).then(Caller::anyone),
            Source::TokenFile => self.inner.token.is_some().then(|| caller.clone()),
            Source::Certificate => None,
            Source::Credential(hash) => {
                let credentials = self.credentials();
                let entry = credentials.named(&caller.name)?;
                (fingerprint(&entry.hash) == *hash).then(|| Caller {
                    name: entry.name.clone(),
                    role: entry.role,
                    source: caller.source.clone(),
                })
            }
        }
    }

    /// Reads the credentials file again when it changes (its time, size or
    /// inode) and at each SIGHUP. A file that breaks a rule is reported,
    /// once a change, and the credentials before it stay.
    pub(crate) async fn reloads(self) {
        let Some(path) = self.inner.file.clone() else { return };
        let mut changes = FileChanges::new(path.clone(), "the credentials file");
        loop {
            changes.next().await;
            let file = path.clone();
            match tokio::task::spawn_blocking(move || credentials::read(&file)).await {
                Ok(Ok(credentials)) => {
                    tracing::info!(file = %path.display(), credentials = credentials.len(), "credentials read again");
                    self.replace(credentials);
                }
                Ok(Err(e)) => tracing::warn!("{e}; the credentials read before stay"),
                Err(e) => tracing::warn!(error = %e, "reading the credentials file stopped"),
            }
        }
    }

    /// What a caller who needs no credential is.
    pub(crate) fn anyone(&self) -> Option<Caller> {
        (!self.required()).then(Caller::anyone)
    }
}

/// A credential's stored hash as a session remembers it: its SHA-256 in hex.
fn fingerprint(hash: &str) -> Arc<str> {
    Sha256::digest(hash.as_bytes()).iter().map(|b| format!("{b:02x}")).collect::<String>().into()
}

/// A token's SHA-256, what a verified token is remembered by.
fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// The caller, if its role covers one of `needed`.
pub(crate) fn permit(caller: Caller, needed: &'static [Role]) -> Result<Caller, Refusal> {
    if needed.iter().any(|n| caller.role.covers(*n)) {
        Ok(caller)
    } else {
        Err(Refusal::Forbidden { name: caller.name, role: caller.role, needed })
    }
}

/// Compares without stopping at the first difference, so timing says nothing
/// about how much of a guess was right.
pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut difference = (a.len() ^ b.len()) as u8;
    for i in 0..a.len().max(b.len()) {
        difference |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    difference == 0
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn with_credentials(entries: &[(&str, Role)]) -> (Access, Vec<String>) {
        let mut text = String::new();
        let mut tokens = Vec::new();
        for (name, role) in entries {
            let (token, entry) = credentials::make(name, *role);
            text.push_str(&entry);
            tokens.push(token);
        }
        let credentials = credentials::parse(std::path::Path::new("c.toml"), &text).unwrap();
        (Access::new(Some("s3cret".into()), Some(("c.toml".into(), credentials))), tokens)
    }

    #[test]
    fn each_role_covers_itself_and_an_admin_covers_all() {
        for role in Role::ALL {
            assert!(role.covers(role));
            assert!(Role::Admin.covers(role));
            assert_eq!(role.name().parse::<Role>(), Ok(role));
        }
        assert!(Role::Operator.covers(Role::Viewer));
        assert!(!Role::Viewer.covers(Role::Operator));
        for other in [Role::Viewer, Role::Operator, Role::Instance, Role::Admin] {
            assert!(!Role::Worker.covers(other), "{other}");
        }
        for other in [Role::Viewer, Role::Operator, Role::Worker, Role::Admin] {
            assert!(!Role::Instance.covers(other), "{other}");
        }
        assert!("root".parse::<Role>().unwrap_err().contains("viewer, operator, worker, instance or admin"));
    }

    #[tokio::test]
    async fn a_request_is_judged_by_its_credential_and_the_role_it_needs() {
        let (access, tokens) = with_credentials(&[("ann", Role::Viewer), ("bo", Role::Operator)]);
        let bearer = |t: &str| format!("Bearer {t}");
        let ann = access.judge(&[Role::Viewer], Some(&bearer(&tokens[0])), None).await.unwrap();
        assert_eq!((&*ann.name, ann.role), ("ann", Role::Viewer));
        assert_eq!(
            access.judge(&[Role::Operator], Some(&bearer(&tokens[0])), None).await.unwrap_err(),
            Refusal::Forbidden { name: "ann".into(), role: Role::Viewer, needed: &[Role::Operator] }
        );
        assert!(access.judge(&[Role::Operator], Some(&bearer(&tokens[1])), None).await.is_ok());
        assert_eq!(access.judge(&[Role::Viewer], None, None).await.unwrap_err(), Refusal::Unauthenticated);
        // Another credential's name with this one's secret is no credential.
        let swapped = format!("bo.{}", tokens[0].rsplit_once('.').unwrap().1);
        assert_eq!(
            access.judge(&[Role::Viewer], Some(&bearer(&swapped)), None).await.unwrap_err(),
            Refusal::Unauthenticated
        );
        let admin = access.judge(&[Role::Admin], Some("Bearer s3cret"), None).await.unwrap();
        assert_eq!(admin.role, Role::Admin);
        assert_eq!(
            access.judge(&[Role::Admin], Some("Bearer s3cre"), None).await.unwrap_err(),
            Refusal::Unauthenticated
        );
        assert_eq!(access.judge(&[Role::Admin], Some("s3cret"), None).await.unwrap_err(), Refusal::Unauthenticated);
    }

    #[tokio::test]
    async fn a_changed_or_removed_credential_no_longer_stands_for_its_sessions() {
        let (access, tokens) = with_credentials(&[("ann", Role::Viewer), ("bo", Role::Operator)]);
        let ann = access.judge(&[Role::Viewer], Some(&format!("Bearer {}", tokens[0])), None).await.unwrap();
        let bo = access.judge(&[Role::Viewer], Some(&format!("Bearer {}", tokens[1])), None).await.unwrap();
        assert!(access.current(&ann).is_some());
        // ann's entry is made again (a new token), bo's is kept.
        let (_, renewed) = credentials::make("ann", Role::Viewer);
        let kept = credentials::parse(std::path::Path::new("c.toml"), &renewed).unwrap();
        access.replace(kept);
        assert!(access.current(&ann).is_none());
        assert!(access.current(&bo).is_none(), "bo is no longer in the file");
        assert_eq!(
            access.judge(&[Role::Viewer], Some(&format!("Bearer {}", tokens[0])), None).await.unwrap_err(),
            Refusal::Unauthenticated,
            "a token verified before is verified again"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn after_repeated_failures_only_tokens_not_verified_before_wait() {
        let (access, tokens) = with_credentials(&[("ann", Role::Viewer), ("bo", Role::Viewer)]);
        let from = Some("10.0.0.9".parse().unwrap());
        let ann = access.sign_in(&tokens[0], from).await.unwrap();
        for _ in 0..8 {
            access.sign_in("ann.guess", from).await.unwrap_err();
        }
        let before = tokio::time::Instant::now();
        assert_eq!(access.sign_in(&tokens[0], from).await.unwrap().name, ann.name);
        assert_eq!(access.sign_in("s3cret", from).await.unwrap().role, Role::Admin);
        assert_eq!(before.elapsed(), Duration::ZERO, "verified before: no wait");
        access.sign_in(&tokens[1], from).await.unwrap();
        assert!(before.elapsed() >= Duration::from_secs(1), "bo's token was not verified before");
        let elsewhere = tokio::time::Instant::now();
        access.sign_in("ann.guess", Some("10.0.0.10".parse().unwrap())).await.unwrap_err();
        assert_eq!(elsewhere.elapsed(), Duration::ZERO, "another address does not wait");
    }

    #[tokio::test]
    async fn without_any_credential_configured_everyone_may_do_everything() {
        let access = Access::new(None, None);
        assert!(!access.required());
        assert_eq!(access.judge(&[Role::Admin], None, None).await.unwrap().role, Role::Admin);
        assert!(Access::new(Some("  ".into()), None).anyone().is_some());
    }
}

//! The web console: its pages, built into the binary; the sessions of the
//! browsers that signed in with a credential, each its caller's; and the
//! first rules every request to the API passes (a bearer token or a session
//! cookie, and never a write from another site).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

use sha2::{Digest, Sha256};

use super::access::Caller;
use crate::store::cluster::{Cluster, SharedSession};
use crate::store::Store;

/// The session cookie's name.
pub(crate) const COOKIE: &str = "jobcenter_session";
/// The header that carries a session's anti-forgery token on writes.
pub(crate) const CSRF_HEADER: &str = "x-csrf-token";
/// How long a session lasts after it was opened.
const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// The most sessions kept; the oldest goes when another opens.
const MAX_SESSIONS: usize = 10_000;

/// The console's files: (path, content type, embedded content).
const ASSETS: &[(&str, &str, &str)] = &[
    ("index.html", "text/html; charset=utf-8", include_str!("../../../console/index.html")),
    ("app.js", "text/javascript; charset=utf-8", include_str!("../../../console/app.js")),
    ("graph.js", "text/javascript; charset=utf-8", include_str!("../../../console/graph.js")),
    ("app.css", "text/css; charset=utf-8", include_str!("../../../console/app.css")),
];

/// One of the console's files, by name; read from `JOBCENTER_CONSOLE_DIR`
/// when that is set (to work on the pages without rebuilding).
pub(crate) fn asset(name: &str) -> Response {
    let Some((name, content_type, embedded)) = ASSETS.iter().find(|(n, _, _)| *n == name) else {
        return (StatusCode::NOT_FOUND, "no such file\n").into_response();
    };
    let from_disk = std::env::var_os("JOBCENTER_CONSOLE_DIR")
        .and_then(|dir| std::fs::read_to_string(std::path::Path::new(&dir).join(name)).ok());
    let body = match from_disk {
        Some(text) => Body::from(text),
        None => Body::from(*embedded),
    };
    let headers = [
        (header::CONTENT_TYPE, *content_type),
        (header::CACHE_CONTROL, "no-cache"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
        ),
    ];
    (headers, body).into_response()
}

struct Session {
    csrf: String,
    opened: Instant,
    caller: Caller,
}

/// The browsers signed in, by the SHA-256 of their cookie: in this process,
/// or, on a store several instances share, in the store, so that every
/// instance serves a browser signed in at another and a sign-out at one
/// ends the session at all.
#[derive(Default)]
pub(crate) struct Sessions {
    local: Mutex<HashMap<[u8; 32], Session>>,
    shared: Option<Arc<dyn Store>>,
}

fn random_hex() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

fn digest(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    /// Sessions kept in `store` when several instances share it, here otherwise.
    pub(crate) fn new(store: &Arc<dyn Store>) -> Sessions {
        Sessions { local: Mutex::default(), shared: store.cluster().is_some().then(|| store.clone()) }
    }

    /// Runs `ask` on the shared store's cluster side, off the runtime.
    async fn ask<T: Send + 'static>(
        &self,
        ask: impl FnOnce(&dyn Cluster) -> Result<T, crate::store::Error> + Send + 'static,
    ) -> Option<Result<T, crate::store::Error>> {
        let store = self.shared.clone()?;
        let answer = tokio::task::spawn_blocking(move || ask(store.cluster().expect("a shared store")))
            .await
            .unwrap_or_else(|e| Err(crate::store::Error::Io(e.to_string())));
        Some(answer)
    }

    /// Opens a session for `caller`: its id (for the cookie) and its anti-forgery token.
    pub(crate) async fn open(&self, caller: Caller) -> Result<(String, String), crate::store::Error> {
        let (id, csrf) = (random_hex(), random_hex());
        let shared = SharedSession { csrf: csrf.clone(), caller: caller.stored() };
        let key = digest(&id);
        if let Some(stored) = self.ask(move |c| c.open_session(&key, &shared, SESSION_LIFETIME)).await {
            return stored.map(|()| (id, csrf));
        }
        let mut open = self.local.lock().expect("sessions lock");
        open.retain(|_, s| s.opened.elapsed() < SESSION_LIFETIME);
        if open.len() >= MAX_SESSIONS {
            if let Some(oldest) = open.iter().min_by_key(|(_, s)| s.opened).map(|(k, _)| *k) {
                open.remove(&oldest);
            }
        }
        open.insert(key, Session { csrf: csrf.clone(), opened: Instant::now(), caller });
        Ok((id, csrf))
    }

    /// The caller and anti-forgery token of the browser's session, if it has
    /// one open; a store that cannot be asked counts as none (and is logged).
    pub(crate) async fn get(&self, headers: &HeaderMap) -> Option<(Caller, String)> {
        let key = digest(&session_id(headers)?);
        if let Some(found) = self.ask(move |c| c.session(&key, SESSION_LIFETIME)).await {
            return shared_session(found);
        }
        let open = self.local.lock().expect("sessions lock");
        open.get(&key).filter(|s| s.opened.elapsed() < SESSION_LIFETIME).map(|s| (s.caller.clone(), s.csrf.clone()))
    }

    /// Ends the browser's session; answers whose it was.
    pub(crate) async fn close(&self, headers: &HeaderMap) -> Option<Caller> {
        let key = digest(&session_id(headers)?);
        if let Some(closed) = self.ask(move |c| c.close_session(&key)).await {
            return shared_session(closed).map(|(caller, _)| caller);
        }
        self.local.lock().expect("sessions lock").remove(&key).map(|s| s.caller)
    }
}

/// A session the store answered with.
fn shared_session(found: Result<Option<SharedSession>, crate::store::Error>) -> Option<(Caller, String)> {
    match found {
        Ok(session) => session.and_then(|s| Some((Caller::from_stored(&s.caller)?, s.csrf))),
        Err(e) => {
            tracing::warn!(error = %e, "the console sessions cannot be read from the store; the request has none");
            None
        }
    }
}

fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_string())
}

/// The `Set-Cookie` value that opens (or, with `None`, ends) a session.
pub(crate) fn cookie(id: Option<&str>) -> HeaderValue {
    let text = match id {
        Some(id) => format!("{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}", SESSION_LIFETIME.as_secs()),
        None => format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    };
    HeaderValue::from_str(&text).expect("a cookie of hex digits is a valid header")
}

/// What a request to the API presents, once the rules of the browser are passed.
#[derive(Debug)]
pub(crate) enum Verdict<'a> {
    /// An `authorization` header, to be judged.
    Bearer(&'a str),
    /// A session's caller (its write carried the session's anti-forgery token).
    Session(Caller),
    /// No credential at all.
    Nothing,
    /// A write that came from another site, or a session's write without its
    /// anti-forgery token.
    Forbidden(&'static str),
}

/// Whether a method changes state.
fn is_write(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// A browser says where a request comes from: writes are taken only from
/// the console's own origin (or from clients that are not browsers).
fn cross_site(headers: &HeaderMap) -> bool {
    let fetch_site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
    if matches!(fetch_site, Some(site) if site != "same-origin" && site != "none") {
        return true;
    }
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else { return false };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    let authority = origin.split_once("://").map_or(origin, |(_, rest)| rest);
    authority != host
}

/// The rules of the browser every request to the API passes: no write from
/// another site, and a session's write only with its anti-forgery token.
/// A bearer header goes before a session.
/// `session` is the browser's, as `Sessions::get` found it.
pub(crate) fn judge<'a>(method: &Method, headers: &'a HeaderMap, session: Option<(Caller, String)>) -> Verdict<'a> {
    let write = is_write(method);
    if write && cross_site(headers) {
        return Verdict::Forbidden("a write from another site is refused");
    }
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        return Verdict::Bearer(value.to_str().unwrap_or(""));
    }
    let Some((caller, csrf)) = session else { return Verdict::Nothing };
    if !write {
        return Verdict::Session(caller);
    }
    let presented = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("");
    if super::access::constant_time_eq(presented.as_bytes(), csrf.as_bytes()) {
        Verdict::Session(caller)
    } else {
        Verdict::Forbidden("a write in a console session needs its X-CSRF-Token header")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[tokio::test]
    async fn a_session_reads_freely_and_writes_only_with_its_csrf_token() {
        let sessions = Sessions::default();
        let (id, csrf) = sessions.open(Caller::named("ann")).await.unwrap();
        let cookie = format!("other=1; {COOKIE}={id}");
        let judged = |method: Method, headers: HeaderMap| {
            let sessions = &sessions;
            async move {
                let session = sessions.get(&headers).await;
                let verdict = judge(&method, &headers, session);
                let ann = matches!(&verdict, Verdict::Session(caller) if &*caller.name == "ann");
                (ann, matches!(verdict, Verdict::Forbidden(_)), matches!(verdict, Verdict::Nothing))
            }
        };
        let read = headers(&[("cookie", &cookie)]);
        assert_eq!(judged(Method::GET, read.clone()).await, (true, false, false));
        assert_eq!(judged(Method::POST, read.clone()).await, (false, true, false));
        let wrong = headers(&[("cookie", &cookie), ("x-csrf-token", "0000")]);
        assert_eq!(judged(Method::POST, wrong).await, (false, true, false));
        let right = headers(&[("cookie", &cookie), ("x-csrf-token", &csrf)]);
        assert_eq!(judged(Method::POST, right).await, (true, false, false));
        assert_eq!(sessions.close(&read).await.map(|c| c.name), Some("ann".into()));
        assert_eq!(judged(Method::GET, read).await, (false, false, true));
    }

    #[test]
    fn writes_from_another_site_are_refused_whatever_they_present() {
        let other_port =
            headers(&[("host", "127.0.0.1:23646"), ("origin", "http://127.0.0.1:9000"), ("authorization", "Bearer t")]);
        assert!(matches!(judge(&Method::POST, &other_port, None), Verdict::Forbidden(_)));
        let fetch_site = headers(&[("sec-fetch-site", "same-site")]);
        assert!(matches!(judge(&Method::PUT, &fetch_site, None), Verdict::Forbidden(_)));
        let same = headers(&[("host", "127.0.0.1:23646"), ("origin", "http://127.0.0.1:23646")]);
        assert!(matches!(judge(&Method::POST, &same, None), Verdict::Nothing));
        // A cross-site read is the browser's business (it cannot read the answer).
        assert!(matches!(judge(&Method::GET, &other_port, None), Verdict::Bearer("Bearer t")));
    }

    #[tokio::test]
    async fn a_bearer_header_goes_before_a_session() {
        let sessions = Sessions::default();
        let (id, _) = sessions.open(Caller::named("ann")).await.unwrap();
        let both = headers(&[("cookie", &format!("{COOKIE}={id}")), ("authorization", "Bearer nope")]);
        let session = sessions.get(&both).await;
        assert!(session.is_some());
        assert!(matches!(judge(&Method::GET, &both, session), Verdict::Bearer("Bearer nope")));
    }

    #[test]
    fn a_caller_reads_back_as_it_was_stored() {
        let ann = Caller::named("ann");
        let back = Caller::from_stored(&ann.stored()).unwrap();
        assert_eq!((back.name, back.role), (ann.name, ann.role));
        assert!(Caller::from_stored("{}").is_none());
    }
}

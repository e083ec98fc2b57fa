//! The web console: its pages, built into the binary; the sessions of the
//! browsers that signed in with a credential, each its caller's; and the
//! first rules every request to the API passes (a bearer token or a session
//! cookie, and never a write from another site).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

use super::access::Caller;

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

/// The browsers signed in, by session id.
#[derive(Default)]
pub(crate) struct Sessions {
    open: Mutex<HashMap<String, Session>>,
}

fn random_hex() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

impl Sessions {
    /// Opens a session for `caller`: its id (for the cookie) and its anti-forgery token.
    pub(crate) fn open(&self, caller: Caller) -> (String, String) {
        let (id, csrf) = (random_hex(), random_hex());
        let mut open = self.open.lock().expect("sessions lock");
        open.retain(|_, s| s.opened.elapsed() < SESSION_LIFETIME);
        if open.len() >= MAX_SESSIONS {
            if let Some(oldest) = open.iter().min_by_key(|(_, s)| s.opened).map(|(k, _)| k.clone()) {
                open.remove(&oldest);
            }
        }
        open.insert(id.clone(), Session { csrf: csrf.clone(), opened: Instant::now(), caller });
        (id, csrf)
    }

    /// The caller and anti-forgery token of the request's session, if it has a live one.
    pub(crate) fn get(&self, headers: &HeaderMap) -> Option<(Caller, String)> {
        let id = session_id(headers)?;
        let open = self.open.lock().expect("sessions lock");
        open.get(&id).filter(|s| s.opened.elapsed() < SESSION_LIFETIME).map(|s| (s.caller.clone(), s.csrf.clone()))
    }

    /// Ends the browser's session; answers whose it was.
    pub(crate) fn close(&self, headers: &HeaderMap) -> Option<Caller> {
        let id = session_id(headers)?;
        self.open.lock().expect("sessions lock").remove(&id).map(|s| s.caller)
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
pub(crate) fn judge<'a>(method: &Method, headers: &'a HeaderMap, sessions: &Sessions) -> Verdict<'a> {
    let write = is_write(method);
    if write && cross_site(headers) {
        return Verdict::Forbidden("a write from another site is refused");
    }
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        return Verdict::Bearer(value.to_str().unwrap_or(""));
    }
    let Some((caller, csrf)) = sessions.get(headers) else { return Verdict::Nothing };
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

    fn is_session(verdict: Verdict<'_>) -> bool {
        matches!(verdict, Verdict::Session(caller) if &*caller.name == "ann")
    }

    #[test]
    fn a_session_reads_freely_and_writes_only_with_its_csrf_token() {
        let sessions = Sessions::default();
        let (id, csrf) = sessions.open(Caller::named("ann"));
        let cookie = format!("other=1; {COOKIE}={id}");
        let read = headers(&[("cookie", &cookie)]);
        assert!(is_session(judge(&Method::GET, &read, &sessions)));
        assert!(matches!(judge(&Method::POST, &read, &sessions), Verdict::Forbidden(_)));
        let wrong = headers(&[("cookie", &cookie), ("x-csrf-token", "0000")]);
        assert!(matches!(judge(&Method::POST, &wrong, &sessions), Verdict::Forbidden(_)));
        let right = headers(&[("cookie", &cookie), ("x-csrf-token", &csrf)]);
        assert!(is_session(judge(&Method::POST, &right, &sessions)));
        sessions.close(&read);
        assert!(matches!(judge(&Method::GET, &read, &sessions), Verdict::Nothing));
    }

    #[test]
    fn writes_from_another_site_are_refused_whatever_they_present() {
        let sessions = Sessions::default();
        let other_port =
            headers(&[("host", "127.0.0.1:23646"), ("origin", "http://127.0.0.1:9000"), ("authorization", "Bearer t")]);
        assert!(matches!(judge(&Method::POST, &other_port, &sessions), Verdict::Forbidden(_)));
        let fetch_site = headers(&[("sec-fetch-site", "same-site")]);
        assert!(matches!(judge(&Method::PUT, &fetch_site, &sessions), Verdict::Forbidden(_)));
        let same = headers(&[("host", "127.0.0.1:23646"), ("origin", "http://127.0.0.1:23646")]);
        assert!(matches!(judge(&Method::POST, &same, &sessions), Verdict::Nothing));
        // A cross-site read is the browser's business (it cannot read the answer).
        assert!(matches!(judge(&Method::GET, &other_port, &sessions), Verdict::Bearer("Bearer t")));
    }

    #[test]
    fn a_bearer_header_goes_before_a_session() {
        let sessions = Sessions::default();
        let (id, _) = sessions.open(Caller::named("ann"));
        let both = headers(&[("cookie", &format!("{COOKIE}={id}")), ("authorization", "Bearer nope")]);
        assert!(matches!(judge(&Method::GET, &both, &sessions), Verdict::Bearer("Bearer nope")));
    }
}

//! JSON over HTTP: what the worker asks first (`/api/plugin/status`), health
//! and readiness, and the client API under `/api/`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{
    ConnectInfo, DefaultBodyLimit, FromRequest, FromRequestParts, MatchedPath, Path, Query, Request, State,
};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio_stream::StreamExt;

use super::access::{self, Access, Need, Refusal};
use super::api::{Api, Error};
use super::audit::Who;
use super::metrics::Scrape;
use super::stall::Remote;
use super::{console, views};
use crate::engine::EngineHandle;
use crate::server::cluster::Topology;
use crate::server::Stats;
use crate::wire::PLUGIN_STATUS_PATH;

/// What the routes use: the API, who may do what and the console's
/// sessions (the guard), the metrics to render, the dispatch figures, what readiness
/// reads, and the settings they answer with. Cheap to clone (each request
/// clones it).
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) api: Api,
    pub(crate) access: Access,
    pub(crate) sessions: Arc<console::Sessions>,
    pub(crate) scrape: Arc<Scrape>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) topology: Topology,
    pub(crate) engine: EngineHandle,
    /// The worker's first question: where the worker stream is.
    pub(crate) grpc_port: u16,
    /// The largest request body taken.
    pub(crate) max_request_bytes: usize,
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut body = json!({ "error": self.to_string() });
        if let Error::Rejected(rejected) = &self {
            let problems: Vec<Value> =
                rejected.problems.iter().map(|p| json!({ "task": p.task(), "message": p.to_string() })).collect();
            body["problems"] = Value::Array(problems);
        }
        (status, Json(body)).into_response()
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.http_status()).unwrap_or(StatusCode::FORBIDDEN);
        (status, Json(json!({ "error": self.to_string() }))).into_response()
    }
}

/// The address a request comes from.
fn remote(request: &Request) -> Option<std::net::IpAddr> {
    remote_of(request.extensions())
}

fn remote_of(extensions: &axum::http::Extensions) -> Option<std::net::IpAddr> {
    extensions.get::<ConnectInfo<Remote>>().map(|ConnectInfo(Remote(address))| address.ip())
}

/// The address a request comes from, for a route (none when the server was
/// not served with it).
struct From(Option<std::net::IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for From {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<From, std::convert::Infallible> {
        Ok(From(remote_of(&parts.extensions)))
    }
}

/// Who a request comes from, as the guard judged it.
struct By(Who);

impl<S: Send + Sync> FromRequestParts<S> for By {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<By, std::convert::Infallible> {
        let who = parts.extensions.get::<Who>().cloned();
        Ok(By(who.unwrap_or_else(|| Who::unknown(remote_of(&parts.extensions)))))
    }
}

/// Every request passes here first: no write is taken from another site,
/// nor a console session's write without its anti-forgery token; then it is
/// judged by its route's row in the table (`access::table`): the console's
/// pages, the health checks and the sign-in are open; the rest need a
/// credential whose role covers the row's (a bearer header, or a console
/// session's caller as its credential stands now).
async fn guard(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let path = request.extensions().get::<MatchedPath>().map_or("", MatchedPath::as_str);
    let need = access::table::http(request.method(), path);
    let from = remote(&request);
    let path = path.to_string();
    // The session is looked up only for a request without a bearer header (which goes first).
    let session = match request.headers().contains_key(axum::http::header::AUTHORIZATION) {
        true => None,
        false => state.sessions.get(request.headers()).await,
    };
    let judged = match (console::judge(request.method(), request.headers(), session), need) {
        (console::Verdict::Forbidden(why), _) => {
            return (StatusCode::FORBIDDEN, Json(json!({ "error": why }))).into_response();
        }
        (_, Need::Open) => return next.run(request).await,
        (console::Verdict::Bearer(header), Need::Any(needed)) => {
            let header = header.to_string();
            (true, state.access.judge(needed, Some(&header), from).await)
        }
        (console::Verdict::Session(caller), Need::Any(needed)) => match state.access.current(&caller) {
            Some(caller) => (true, access::permit(caller, needed)),
            None => (true, Err(Refusal::Unauthenticated)),
        },
        (console::Verdict::Nothing, Need::Any(needed)) => (false, state.access.judge(needed, None, from).await),
    };
    match judged {
        (_, Ok(caller)) => {
            let who = Who::of(&caller, from);
            let write = !matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS);
            let what = format!("{} {path}", request.method());
            request.extensions_mut().insert(who.clone());
            let response = next.run(request).await;
            // A write refused before it reached the API (a query or body
            // it could not read) is recorded here; the API records the rest.
            if write && !who.is_recorded() && response.status().is_client_error() {
                let trail = &state.api.trail;
                trail.write(trail.begin(&who, "request.refused", &what).ended(response.status().to_string())).await;
            }
            response
        }
        (presented, Err(refusal)) => {
            // A credential refused is recorded; a request that presents none is not.
            if presented {
                let trail = &state.api.trail;
                let what = format!("{} {path}", request.method());
                trail
                    .write(
                        trail.begin(&Who::refused(&refusal, from), "access.refused", &what).ended(refusal.to_string()),
                    )
                    .await;
            }
            refusal.into_response()
        }
    }
}

/// Ready while the store takes writes and connections are accepted: a
/// server whose database is away acknowledges nothing, and one out of file
/// descriptors takes no new connection, and each says so here; one whose
/// descriptors near the limit is ready and says that too.
async fn readyz(State(state): State<AppState>) -> (axum::http::StatusCode, String) {
    let unavailable = axum::http::StatusCode::SERVICE_UNAVAILABLE;
    if state.topology.is_fenced() {
        return (unavailable, "not ready: this instance cannot reach its database\n".into());
    }
    if !state.engine.is_ready() {
        return (unavailable, "not ready: the store is unavailable\n".into());
    }
    match tokio::task::spawn_blocking(super::descriptors::readiness).await {
        Ok(Err(out)) => (unavailable, format!("not ready: {out}\n")),
        Ok(Ok(Some(near))) => (axum::http::StatusCode::OK, format!("ready; {near}\n")),
        _ => (axum::http::StatusCode::OK, "ready\n".into()),
    }
}

pub(crate) fn router(state: AppState) -> Router {
    let body_limit = state.max_request_bytes;
    // The guard runs once a route and its method are matched: an unknown
    // path is 404 and a method the route does not serve is 405 for every
    // caller, as the OpenAPI document says; everything served is judged.
    let guarded = |methods: MethodRouter<AppState>| {
        methods.route_layer(axum::middleware::from_fn_with_state(state.clone(), guard))
    };
    Router::new()
        .route("/", guarded(get(|| async { console::asset("index.html") })))
        .route("/console/{file}", guarded(get(console_asset)))
        .route("/api/session", guarded(get(session).post(sign_in).delete(sign_out)))
        .route("/api/overview", guarded(get(overview)))
        .route("/api/jobs/{id}/graph", guarded(get(graph)))
        .route("/api/jobs/{id}/tasks/{task}", guarded(get(task)))
        .route("/api/jobs/{id}/events", guarded(get(events)))
        .route("/api/job-types", guarded(get(job_types)))
        .route("/api/job-types/{job_type}", guarded(get(job_type)))
        .route(PLUGIN_STATUS_PATH, guarded(get(plugin_status)))
        .route("/healthz", guarded(get(|| async { "ok\n" })))
        .route("/readyz", guarded(get(readyz)))
        .route("/api/jobs", guarded(get(list_jobs).post(submit_job)))
        .route("/api/jobs/{id}", guarded(get(get_job)))
        .route("/api/jobs/{id}/cancel", guarded(post(cancel_job)))
        .route("/api/jobs/{id}/priority", guarded(post(set_job_priority)))
        .route("/api/jobs/{id}/retry", guarded(post(retry_job)))
        .route("/api/workers", guarded(get(workers)))
        .route("/api/instances", guarded(get(instances)))
        .route("/api/capacity", guarded(get(capacity)))
        .route("/api/scheduler/pause", guarded(post(pause_scheduler)))
        .route("/api/scheduler/resume", guarded(post(resume_scheduler)))
        .route("/api/stats", guarded(get(stats)))
        .route("/api/recover", guarded(post(recover)))
        .route("/api/prune", guarded(post(prune)))
        .route("/api/detect/{job_type}", guarded(post(detect)))
        .route("/api/activities", guarded(get(activities)))
        .route("/api/audit", guarded(get(audit)))
        .route("/api/notifications", guarded(get(notifications)))
        .route("/api/runs/{job_type}", guarded(get(runs)))
        .route("/api/policies/{job_type}", guarded(get(get_policy).put(set_policy)))
        .route("/api/openapi.json", guarded(get(openapi)))
        .route("/metrics", guarded(get(metrics)))
        .route("/api/windows", guarded(get(windows)))
        .route("/api/budget", guarded(get(get_budget).put(set_budget)))
        .route("/api/schedules", guarded(get(list_schedules).post(add_schedule)))
        .route("/api/schedules/{name}", guarded(axum::routing::delete(remove_schedule)))
        .route("/api/schedules/{name}/pause", guarded(post(pause_schedule)))
        .route("/api/schedules/{name}/resume", guarded(post(resume_schedule)))
        .route("/api/schedules/{name}/run-now", guarded(post(run_schedule_now)))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// A console file; a name that cannot be read is no file's.
async fn console_asset(file: Result<Path<String>, PathRejection>) -> Response {
    console::asset(file.as_ref().map_or("", |Path(file)| file.as_str()))
}

async fn plugin_status(State(state): State<AppState>) -> Json<Value> {
    Json(json!({ "enabled": true, "worker_grpc_port": state.grpc_port }))
}

type Reply = Result<Response, Error>;

/// A request's query parameters, read by the rules of the OpenAPI document:
/// a value that breaks its parameter's rule is refused (400, naming the
/// parameter), never read as the default.
struct Params(HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Params, Error> {
        let Query(params) = Query::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(|e| Error::Invalid(format!("the query string: {}", lowercase_first(&e.body_text()))))?;
        Ok(Params(params))
    }
}

impl Params {
    /// The parameters of a route that takes `names` and no other: one it
    /// does not take is refused, so that a misspelt `dry_run` never runs
    /// the real thing.
    fn taking(self, names: &[&str]) -> Result<Params, Error> {
        let mut unknown: Vec<&String> = self.0.keys().filter(|k| !names.contains(&k.as_str())).collect();
        unknown.sort();
        let Some(first) = unknown.first() else { return Ok(self) };
        let takes = match names {
            [] => "no query parameter".to_string(),
            [one] => one.to_string(),
            [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
        };
        Err(Error::Invalid(format!("unknown query parameter {first:?}: this route takes {takes}")))
    }

    /// A text parameter; empty when it is absent (an empty value is the same as none).
    fn text(&self, name: &str) -> &str {
        self.0.get(name).map_or("", String::as_str)
    }

    /// A boolean: `true` or `1`, `false` or `0`; false when absent.
    fn flag(&self, name: &str) -> Result<bool, Error> {
        match self.0.get(name).map(String::as_str) {
            None | Some("false" | "0") => Ok(false),
            Some("true" | "1") => Ok(true),
            Some(other) => Err(Error::Invalid(format!(
                "query parameter {name}: {other:?} is not a boolean: use true or false (or 1 or 0)"
            ))),
        }
    }

    /// A whole number from 0 to 4294967295; 0 when absent.
    fn count(&self, name: &str) -> Result<u32, Error> {
        match self.0.get(name) {
            None => Ok(0),
            Some(text) => text.parse().map_err(|_| {
                Error::Invalid(format!("query parameter {name}: {text:?} is not a whole number from 0 to {}", u32::MAX))
            }),
        }
    }
}

/// A route's path parameters; one that cannot be read is refused as JSON (400).
struct PathParams<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> FromRequestParts<S> for PathParams<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<PathParams<T>, Error> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(PathParams(value)),
            Err(PathRejection::FailedToDeserializePathParams(e)) => match e.into_kind() {
                axum::extract::path::ErrorKind::InvalidUtf8InPathParam { key } => {
                    Err(Error::Invalid(format!("path parameter {key}: not UTF-8 once percent-decoded")))
                }
                kind => Err(Error::Invalid(format!("the path: {}", lowercase_first(&kind.to_string())))),
            },
            Err(e) => Err(Error::Invalid(format!("the path: {}", lowercase_first(&e.body_text())))),
        }
    }
}

/// A JSON request body. One not declared JSON (`content-type:
/// application/json`) is refused with 415; one that is not JSON, or not of
/// the shape the route takes, with 400 naming what and where.
struct JsonBody<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<JsonBody<T>, Response> {
        let rejection = match Json::<T>::from_request(request, state).await {
            Ok(Json(value)) => return Ok(JsonBody(value)),
            Err(rejection) => rejection,
        };
        // The cause (serde's message, with its field, line and column) comes after axum's prefix.
        let cause = |e: &dyn std::error::Error| e.source().map(|s| s.to_string()).unwrap_or_default();
        let (status, message) = match &rejection {
            JsonRejection::MissingJsonContentType(_) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "the body must be JSON: send `content-type: application/json`".to_string(),
            ),
            JsonRejection::JsonSyntaxError(e) => {
                (StatusCode::BAD_REQUEST, format!("the body is not JSON: {}", cause(e)))
            }
            JsonRejection::JsonDataError(e) => {
                (StatusCode::BAD_REQUEST, format!("the body does not fit this route: {}", cause(e)))
            }
            other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                (StatusCode::PAYLOAD_TOO_LARGE, "the body is larger than the server's --max-request-bytes".to_string())
            }
            other => (
                StatusCode::BAD_REQUEST,
                format!("the body could not be read: {}", lowercase_first(&other.body_text())),
            ),
        };
        Err((status, Json(json!({ "error": message }))).into_response())
    }
}

/// axum's rejection texts start with a capital; the API's errors do not.
fn lowercase_first(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map(|c| c.to_lowercase().chain(chars).collect()).unwrap_or_default()
}

async fn list_jobs(State(s): State<AppState>, q: Params) -> Reply {
    let q = q.taking(&["state", "limit", "name", "origin", "before"])?;
    let request = crate::proto::api::ListJobsRequest {
        state: q.text("state").into(),
        limit: q.count("limit")?,
        name: q.text("name").into(),
        origin: q.text("origin").into(),
        before: q.text("before").into(),
    };
    let page = s.api.list(&request).await?;
    let next = Some(page.next).filter(|n| !n.is_empty());
    Ok(Json(json!({ "jobs": page.jobs, "next": next })).into_response())
}

async fn submit_job(
    State(s): State<AppState>,
    By(who): By,
    q: Params,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Reply {
    let q = q.taking(&["format", "name"])?;
    let body = body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => Error::TooLarge(format!(
            "the job file is larger than {} bytes, the most one request takes (the server's --max-request-bytes \
             raises it; `jobcenter submit` sends a file of any size in chunks)",
            s.max_request_bytes
        )),
        _ => Error::Invalid(format!("the job file could not be read: {e}")),
    })?;
    let job_id = s.api.submit(&who, body.to_vec(), q.text("format"), q.text("name")).await?;
    Ok((StatusCode::CREATED, Json(json!({ "job_id": job_id }))).into_response())
}

/// A job of any size: its JSON is written part by part as the reader takes it.
async fn get_job(State(s): State<AppState>, PathParams(id): PathParams<String>) -> Reply {
    let parts = s.api.read(&id).await?;
    let mut writer = crate::wire::JobJson::new(false);
    let chunks = parts
        .map(move |part| Bytes::from(writer.part(part)))
        .chain(tokio_stream::once(Bytes::from_static(b"]}")))
        .map(Ok::<_, std::convert::Infallible>);
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], axum::body::Body::from_stream(chunks))
        .into_response())
}

async fn cancel_job(State(s): State<AppState>, By(who): By, PathParams(id): PathParams<String>, q: Params) -> Reply {
    q.taking(&[])?;
    s.api.cancel(&who, &id).await?;
    Ok(Json(json!({ "job_id": id, "canceled": true })).into_response())
}

async fn set_job_priority(
    State(s): State<AppState>,
    By(who): By,
    PathParams(id): PathParams<String>,
    q: Params,
    JsonBody(body): JsonBody<PriorityBody>,
) -> Reply {
    q.taking(&[])?;
    s.api.set_job_priority(&who, &id, &body.priority).await?;
    Ok(Json(json!({ "job_id": id, "priority": body.priority })).into_response())
}

/// The body of `POST /api/jobs/{id}/priority`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PriorityBody {
    priority: String,
}

async fn retry_job(State(s): State<AppState>, By(who): By, PathParams(id): PathParams<String>, q: Params) -> Reply {
    q.taking(&[])?;
    s.api.retry(&who, &id).await?;
    Ok(Json(json!({ "job_id": id, "retried": true })).into_response())
}

async fn detect(State(s): State<AppState>, By(who): By, PathParams(job_type): PathParams<String>, q: Params) -> Reply {
    let run = q.taking(&["run"])?.flag("run")?;
    Ok(Json(s.api.detect(&who, &job_type, run).await?).into_response())
}

async fn activities(State(s): State<AppState>, q: Params) -> Reply {
    let q = q.taking(&["job_type", "limit"])?;
    let limit = q.count("limit")?;
    Ok(Json(json!({ "activities": s.api.activities(q.text("job_type"), limit) })).into_response())
}

async fn runs(State(s): State<AppState>, PathParams(job_type): PathParams<String>) -> Reply {
    Ok(Json(s.api.runs(&job_type)).into_response())
}

async fn recover(State(s): State<AppState>, By(who): By, q: Params) -> Reply {
    let q = q.taking(&["dry_run", "here_only"])?;
    let (dry_run, here_only) = (q.flag("dry_run")?, q.flag("here_only")?);
    Ok(Json(s.api.recover(&who, dry_run, here_only).await?).into_response())
}

async fn prune(State(s): State<AppState>, By(who): By, q: Params) -> Reply {
    let dry_run = q.taking(&["dry_run"])?.flag("dry_run")?;
    Ok(Json(s.api.prune(&who, dry_run).await?).into_response())
}

/// Each webhook endpoint: its URL, events, pending count, last delivery and last error.
async fn notifications(State(s): State<AppState>, q: Params) -> Reply {
    q.taking(&[])?;
    Ok(Json(json!({ "endpoints": s.api.notifications().await? })).into_response())
}

/// Each job type's maintenance windows: open now, next opens and closes.
async fn windows(State(s): State<AppState>, q: Params) -> Reply {
    q.taking(&[])?;
    Ok(Json(s.api.windows()).into_response())
}

/// The audit trail, oldest first: `since` (ms since the epoch), `who`, `limit` (the newest).
async fn audit(State(s): State<AppState>, q: Params) -> Reply {
    let q = q.taking(&["since", "who", "limit"])?;
    let since = match q.text("since") {
        "" => None,
        text => Some(text.parse::<u64>().map_err(|_| {
            Error::Invalid(format!("query parameter since: {text:?} is not a time in ms since the epoch"))
        })?),
    };
    let limit = q.count("limit")?;
    let filter = crate::model::audit::Filter {
        since_ms: since,
        who: Some(q.text("who").to_string()).filter(|w| !w.is_empty()),
        limit: (limit > 0).then_some(limit as usize),
    };
    Ok(Json(json!({ "records": s.api.audit(filter).await? })).into_response())
}

async fn stats(State(s): State<AppState>) -> Reply {
    let (count, p50, p99) = s.stats.dispatch();
    Ok(Json(json!({ "dispatch": { "count": count, "p50_us": p50, "p99_us": p99 } })).into_response())
}

/// The OpenAPI description of every route, written by hand next to this file.
const OPENAPI: &str = include_str!("openapi.json");

async fn openapi() -> Response {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

async fn metrics(State(s): State<AppState>) -> Reply {
    let text = s.scrape.render().await;
    Ok(([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response())
}

async fn capacity(State(s): State<AppState>) -> Reply {
    Ok(Json(s.api.capacity().await?).into_response())
}

async fn instances(State(s): State<AppState>) -> Reply {
    let instances: Vec<Value> = s.api.instances().await?.iter().map(instance_json).collect();
    Ok(Json(json!({ "instances": instances })).into_response())
}

fn instance_json(i: &crate::proto::api::Instance) -> Value {
    json!({
        "id": i.id, "role": i.role, "grpc_address": i.grpc_address, "http_address": i.http_address,
        "status": i.status, "started_at_ms": i.started_at_ms, "heartbeat_ms": i.heartbeat_ms,
        "heartbeat_age_ms": i.heartbeat_age_ms, "paused": i.paused, "jobs_led": i.jobs_led,
        "detections": i.detections, "workers": i.workers, "answering": i.answering,
    })
}

async fn pause_scheduler(state: State<AppState>, by: By, query: Params) -> Reply {
    set_scheduler_paused(state, by, query, true).await
}

async fn resume_scheduler(state: State<AppState>, by: By, query: Params) -> Reply {
    set_scheduler_paused(state, by, query, false).await
}

async fn set_scheduler_paused(State(s): State<AppState>, By(who): By, q: Params, paused: bool) -> Reply {
    let q = q.taking(&["instance"])?;
    let changed = s.api.set_scheduler_paused(&who, paused, q.text("instance")).await?;
    Ok(Json(json!({ "paused": paused, "changed": changed })).into_response())
}

async fn workers(State(s): State<AppState>, q: Params) -> Reply {
    let q = q.taking(&["offset", "limit"])?;
    Ok(Json(views::workers(&s.api, q.count("offset")?, q.count("limit")?).await?).into_response())
}

/// Whether this browser is signed in: its session's anti-forgery token,
/// and who it is (the name and role of its credential as it stands now).
async fn session(State(s): State<AppState>, headers: HeaderMap) -> Json<Value> {
    let session = s.sessions.get(&headers).await.and_then(|(caller, csrf)| Some((s.access.current(&caller)?, csrf)));
    let (caller, csrf) = match session {
        Some((caller, csrf)) => (Some(caller), csrf),
        None => (s.access.anyone(), String::new()),
    };
    Json(json!({
        "token_required": s.access.required(),
        "authenticated": caller.is_some(),
        "csrf": csrf,
        "name": caller.as_ref().map_or("", |c| &*c.name),
        "role": caller.as_ref().map_or("", |c| c.role.name()),
    }))
}

#[derive(serde::Deserialize)]
struct SignIn {
    token: String,
}

/// Opens a console session for a known credential, of any role; an address
/// that failed repeatedly waits first (`access::throttle`).
async fn sign_in(State(s): State<AppState>, From(from): From, q: Params, JsonBody(body): JsonBody<SignIn>) -> Reply {
    q.taking(&[])?;
    let trail = &s.api.trail;
    let caller = match s.access.sign_in(&body.token, from).await {
        Ok(caller) => caller,
        Err(refusal) => {
            let refused = "that is not a known credential";
            trail.write(trail.begin(&Who::refused(&refusal, from), "session.sign_in", "").ended(refused)).await;
            return Ok((StatusCode::UNAUTHORIZED, Json(json!({ "error": refused }))).into_response());
        }
    };
    trail.write(trail.begin(&Who::of(&caller, from), "session.sign_in", "")).await;
    let (name, role) = (caller.name.to_string(), caller.role.name());
    let (id, csrf) = s.sessions.open(caller).await.map_err(|e| Error::Unavailable(e.to_string()))?;
    let mut response = Json(json!({ "csrf": csrf, "name": name, "role": role })).into_response();
    response.headers_mut().insert(axum::http::header::SET_COOKIE, console::cookie(Some(&id)));
    Ok(response)
}

async fn sign_out(State(s): State<AppState>, From(from): From, q: Params, headers: HeaderMap) -> Reply {
    q.taking(&[])?;
    if let Some(caller) = s.sessions.close(&headers).await {
        s.api.trail.write(s.api.trail.begin(&Who::of(&caller, from), "session.sign_out", "")).await;
    }
    let mut response = Json(json!({ "signed_out": true })).into_response();
    response.headers_mut().insert(axum::http::header::SET_COOKIE, console::cookie(None));
    Ok(response)
}

async fn overview(State(s): State<AppState>) -> Reply {
    Ok(Json(views::overview(&s.api).await?).into_response())
}

async fn graph(State(s): State<AppState>, PathParams(id): PathParams<String>) -> Reply {
    Ok(Json(views::graph(&s.api, &id).await?).into_response())
}

async fn task(State(s): State<AppState>, PathParams((id, task)): PathParams<(String, String)>) -> Reply {
    Ok(Json(views::task(&s.api, &id, &task).await?).into_response())
}

async fn events(State(s): State<AppState>, PathParams(id): PathParams<String>) -> Reply {
    let stream = views::events(&s.api, &id).await?;
    let stream = stream
        .map(|(name, data)| Ok::<_, std::convert::Infallible>(SseEvent::default().event(name).data(data.to_string())));
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}

async fn job_types(State(s): State<AppState>) -> Json<Value> {
    Json(views::job_types(&s.api))
}

async fn job_type(State(s): State<AppState>, PathParams(job_type): PathParams<String>) -> Reply {
    Ok(Json(views::job_type(&s.api, &job_type)?).into_response())
}

async fn get_policy(State(s): State<AppState>, PathParams(job_type): PathParams<String>) -> Reply {
    Ok(Json(s.api.policy(&job_type)?).into_response())
}

async fn set_policy(
    State(s): State<AppState>,
    By(who): By,
    PathParams(job_type): PathParams<String>,
    q: Params,
    JsonBody(changes): JsonBody<BTreeMap<String, Value>>,
) -> Reply {
    q.taking(&[])?;
    let changes: BTreeMap<String, String> =
        changes.into_iter().map(|(k, v)| (k, v.as_str().map(String::from).unwrap_or_else(|| v.to_string()))).collect();
    let policy = s.api.set_policy(&who, &job_type, &changes).await?;
    Ok(Json(policy).into_response())
}

async fn get_budget(State(s): State<AppState>, q: Params) -> Reply {
    q.taking(&[])?;
    Ok(Json(s.api.budget().await?).into_response())
}

/// Sets, changes or clears the bandwidth budget: `cluster`, `per_server`
/// and `minimum` (rates as text, or bytes per second as numbers), or `clear`.
async fn set_budget(
    State(s): State<AppState>,
    By(who): By,
    q: Params,
    JsonBody(fields): JsonBody<BTreeMap<String, Value>>,
) -> Reply {
    q.taking(&[])?;
    let mut request = crate::proto::api::SetBudgetRequest::default();
    for (name, value) in fields {
        let text = || value.as_str().map(String::from).unwrap_or_else(|| value.to_string());
        match name.as_str() {
            "cluster" => request.cluster = text(),
            "per_server" => request.per_server = text(),
            "minimum" => request.minimum = text(),
            "clear" => {
                request.clear = value
                    .as_bool()
                    .ok_or_else(|| Error::Invalid(format!("budget clear: must be true or false, not {value}")))?
            }
            _ => {
                return Err(Error::Invalid(format!(
                    "budget: unknown field {name:?}; fields are cluster, per_server, minimum, clear"
                )))
            }
        }
    }
    Ok(Json(s.api.set_budget(&who, &request).await?).into_response())
}

/// A schedule to add: its terms, and its job file as text (in `format`) or
/// as a JSON object.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSchedule {
    name: String,
    calendar: String,
    #[serde(default)]
    time_zone: String,
    #[serde(default)]
    overlap: String,
    #[serde(default)]
    catch_up: String,
    #[serde(default)]
    catch_up_window: String,
    #[serde(default)]
    jitter: String,
    #[serde(default)]
    paused: bool,
    job_file: Value,
    #[serde(default)]
    format: String,
}

async fn list_schedules(State(s): State<AppState>, q: Params) -> Reply {
    q.taking(&[])?;
    Ok(Json(json!({ "schedules": s.api.schedules().await? })).into_response())
}

async fn add_schedule(
    State(s): State<AppState>,
    By(who): By,
    q: Params,
    JsonBody(body): JsonBody<NewSchedule>,
) -> Reply {
    q.taking(&[])?;
    let (job_file, format) = match body.job_file {
        Value::String(text) => (text.into_bytes(), body.format),
        object @ Value::Object(_) => (object.to_string().into_bytes(), "json".to_string()),
        _ => return Err(Error::Invalid("schedule job_file: a job file's text, or a job as a JSON object".into())),
    };
    let request = crate::proto::api::AddScheduleRequest {
        name: body.name,
        calendar: body.calendar,
        time_zone: body.time_zone,
        overlap: body.overlap,
        catch_up: body.catch_up,
        catch_up_window: body.catch_up_window,
        jitter: body.jitter,
        paused: body.paused,
        job_file,
        format,
    };
    let schedule = s.api.add_schedule(&who, request).await?;
    Ok((StatusCode::CREATED, Json(schedule)).into_response())
}

async fn remove_schedule(
    State(s): State<AppState>,
    By(who): By,
    PathParams(name): PathParams<String>,
    q: Params,
) -> Reply {
    q.taking(&[])?;
    s.api.remove_schedule(&who, &name).await?;
    Ok(Json(json!({ "name": name, "removed": true })).into_response())
}

async fn pause_schedule(
    State(s): State<AppState>,
    By(who): By,
    PathParams(name): PathParams<String>,
    q: Params,
) -> Reply {
    q.taking(&[])?;
    Ok(Json(s.api.set_schedule_paused(&who, &name, true).await?).into_response())
}

async fn resume_schedule(
    State(s): State<AppState>,
    By(who): By,
    PathParams(name): PathParams<String>,
    q: Params,
) -> Reply {
    q.taking(&[])?;
    Ok(Json(s.api.set_schedule_paused(&who, &name, false).await?).into_response())
}

async fn run_schedule_now(
    State(s): State<AppState>,
    By(who): By,
    PathParams(name): PathParams<String>,
    q: Params,
) -> Reply {
    q.taking(&[])?;
    let job_id = s.api.run_schedule_now(&who, &name).await?;
    Ok((StatusCode::CREATED, Json(json!({ "name": name, "job_id": job_id }))).into_response())
}

//! JSON over HTTP: what the worker asks first (`/api/plugin/status`), health
//! and readiness, and the client API under `/api/`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio_stream::StreamExt;

use super::api::{Api, Error};
use super::{console, views, Shared};
use crate::wire::PLUGIN_STATUS_PATH;

#[derive(Clone)]
struct AppState {
    shared: Arc<Shared>,
    api: Api,
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

/// Every request passes here first: the console's pages and the health
/// checks are open; the API needs the token (a bearer header or a console
/// session) when one is set, and never takes a write from another site.
async fn guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let open =
        !(path.starts_with("/api/") || path == "/metrics") || path == PLUGIN_STATUS_PATH || path == "/api/openapi.json";
    if open {
        return next.run(request).await;
    }
    let headers = request.headers();
    let auth = &state.shared.auth;
    let bearer = headers.get("authorization").and_then(|v| v.to_str().ok());
    let verdict = console::judge(
        request.method(),
        headers,
        auth.enabled() && path != "/api/session",
        auth.check_header(bearer),
        &state.shared.sessions,
    );
    match verdict {
        console::Verdict::Allowed => next.run(request).await,
        console::Verdict::Unauthenticated => Error::Unauthenticated.into_response(),
        console::Verdict::Forbidden(why) => (StatusCode::FORBIDDEN, Json(json!({ "error": why }))).into_response(),
    }
}

/// Ready while the store takes writes: a server whose database is away
/// acknowledges nothing and says so here.
async fn readyz(State(state): State<AppState>) -> (axum::http::StatusCode, &'static str) {
    if state.shared.cluster.as_ref().is_some_and(|node| node.is_fenced()) {
        (axum::http::StatusCode::SERVICE_UNAVAILABLE, "not ready: this instance cannot reach its database\n")
    } else if state.shared.engine.is_ready() {
        (axum::http::StatusCode::OK, "ready\n")
    } else {
        (axum::http::StatusCode::SERVICE_UNAVAILABLE, "not ready: the store is unavailable\n")
    }
}

pub fn router(shared: Arc<Shared>, api: Api) -> Router {
    let body_limit = shared.options.max_request_bytes;
    let state = AppState { shared, api };
    Router::new()
        .route("/", get(|| async { console::asset("index.html") }))
        .route("/console/{file}", get(|Path(file): Path<String>| async move { console::asset(&file) }))
        .route("/api/session", get(session).post(sign_in).delete(sign_out))
        .route("/api/overview", get(overview))
        .route("/api/jobs/{id}/graph", get(graph))
        .route("/api/jobs/{id}/tasks/{task}", get(task))
        .route("/api/jobs/{id}/events", get(events))
        .route("/api/job-types", get(job_types))
        .route("/api/job-types/{job_type}", get(job_type))
        .route(PLUGIN_STATUS_PATH, get(plugin_status))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/api/jobs", get(list_jobs).post(submit_job))
        .route("/api/jobs/{id}", get(get_job))
        .route("/api/jobs/{id}/cancel", post(cancel_job))
        .route("/api/jobs/{id}/retry", post(retry_job))
        .route("/api/workers", get(workers))
        .route("/api/instances", get(instances))
        .route("/api/capacity", get(capacity))
        .route("/api/scheduler/pause", post(pause_scheduler))
        .route("/api/scheduler/resume", post(resume_scheduler))
        .route("/api/stats", get(stats))
        .route("/api/recover", post(recover))
        .route("/api/prune", post(prune))
        .route("/api/detect/{job_type}", post(detect))
        .route("/api/activities", get(activities))
        .route("/api/runs/{job_type}", get(runs))
        .route("/api/policies/{job_type}", get(get_policy).put(set_policy))
        .route("/api/openapi.json", get(openapi))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

async fn plugin_status(State(state): State<AppState>) -> Json<Value> {
    Json(json!({ "enabled": true, "worker_grpc_port": state.shared.grpc_port }))
}

type Reply = Result<Response, Error>;

async fn list_jobs(State(s): State<AppState>, Query(q): Query<HashMap<String, String>>) -> Reply {
    let text = |key: &str| q.get(key).cloned().unwrap_or_default();
    let request = crate::proto::api::ListJobsRequest {
        state: text("state"),
        limit: q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0),
        name: text("name"),
        origin: text("origin"),
        before: text("before"),
    };
    let page = s.api.list(&request).await?;
    let next = Some(page.next).filter(|n| !n.is_empty());
    Ok(Json(json!({ "jobs": page.jobs, "next": next })).into_response())
}

async fn submit_job(
    State(s): State<AppState>,
    Query(q): Query<HashMap<String, String>>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Reply {
    let body = body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => Error::TooLarge(format!(
            "the job file is larger than {} bytes, the most one request takes (the server's --max-request-bytes \
             raises it; `jobcenter submit` sends a file of any size in chunks)",
            s.shared.options.max_request_bytes
        )),
        _ => Error::Invalid(format!("the job file could not be read: {e}")),
    })?;
    let format = q.get("format").map(String::as_str).unwrap_or("json");
    let name = q.get("name").map(String::as_str).unwrap_or("");
    let job_id = s.api.submit(body.to_vec(), format, name).await?;
    Ok((StatusCode::CREATED, Json(json!({ "job_id": job_id }))).into_response())
}

/// A job of any size: its JSON is written part by part as the reader takes it.
async fn get_job(State(s): State<AppState>, Path(id): Path<String>) -> Reply {
    let parts = s.api.read(&id).await?;
    let mut writer = crate::wire::JobJson::new(false);
    let chunks = parts
        .map(move |part| Bytes::from(writer.part(part)))
        .chain(tokio_stream::once(Bytes::from_static(b"]}")))
        .map(Ok::<_, std::convert::Infallible>);
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], axum::body::Body::from_stream(chunks))
        .into_response())
}

async fn cancel_job(State(s): State<AppState>, Path(id): Path<String>) -> Reply {
    s.api.cancel(&id).await?;
    Ok(Json(json!({ "job_id": id, "canceled": true })).into_response())
}

async fn retry_job(State(s): State<AppState>, Path(id): Path<String>) -> Reply {
    s.api.retry(&id).await?;
    Ok(Json(json!({ "job_id": id, "retried": true })).into_response())
}

async fn detect(
    State(s): State<AppState>,
    Path(job_type): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Reply {
    let run = q.get("run").is_some_and(|v| v == "true" || v == "1");
    Ok(Json(s.api.detect(&job_type, run).await?).into_response())
}

async fn activities(State(s): State<AppState>, Query(q): Query<HashMap<String, String>>) -> Reply {
    let job_type = q.get("job_type").map(String::as_str).unwrap_or("");
    let limit = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
    Ok(Json(json!({ "activities": s.api.activities(job_type, limit) })).into_response())
}

async fn runs(State(s): State<AppState>, Path(job_type): Path<String>) -> Reply {
    Ok(Json(s.api.runs(&job_type)).into_response())
}

async fn recover(State(s): State<AppState>, Query(q): Query<HashMap<String, String>>) -> Reply {
    let flag = |name: &str| q.get(name).is_some_and(|v| v == "true" || v == "1");
    Ok(Json(s.api.recover(flag("dry_run"), flag("here_only")).await?).into_response())
}

async fn prune(State(s): State<AppState>, Query(q): Query<HashMap<String, String>>) -> Reply {
    let dry_run = q.get("dry_run").is_some_and(|v| v == "true" || v == "1");
    Ok(Json(s.api.prune(dry_run).await?).into_response())
}

async fn stats(State(s): State<AppState>) -> Reply {
    let (count, p50, p99) = s.shared.stats.dispatch();
    Ok(Json(json!({ "dispatch": { "count": count, "p50_us": p50, "p99_us": p99 } })).into_response())
}

/// The OpenAPI description of every route, written by hand next to this file.
const OPENAPI: &str = include_str!("openapi.json");

async fn openapi() -> Response {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

async fn metrics(State(s): State<AppState>) -> Reply {
    let text = s.shared.metrics.render(&s.shared).await;
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

async fn pause_scheduler(state: State<AppState>, query: Query<HashMap<String, String>>) -> Reply {
    set_scheduler_paused(state, query, true).await
}

async fn resume_scheduler(state: State<AppState>, query: Query<HashMap<String, String>>) -> Reply {
    set_scheduler_paused(state, query, false).await
}

async fn set_scheduler_paused(
    State(s): State<AppState>,
    Query(q): Query<HashMap<String, String>>,
    paused: bool,
) -> Reply {
    let instance = q.get("instance").map(String::as_str).unwrap_or("");
    let changed = s.api.set_scheduler_paused(paused, instance).await?;
    Ok(Json(json!({ "paused": paused, "changed": changed })).into_response())
}

async fn workers(State(s): State<AppState>) -> Reply {
    Ok(Json(views::workers(&s.shared, &s.api).await?).into_response())
}

/// Whether this browser is signed in, and its session's anti-forgery token.
async fn session(State(s): State<AppState>, headers: HeaderMap) -> Json<Value> {
    let csrf = s.shared.sessions.csrf(&headers);
    let required = s.shared.auth.enabled();
    Json(
        json!({ "token_required": required, "authenticated": !required || csrf.is_some(), "csrf": csrf.unwrap_or_default() }),
    )
}

#[derive(serde::Deserialize)]
struct SignIn {
    token: String,
}

/// Opens a console session for the right token; a wrong one waits a little
/// before it is refused, to slow down guessing.
async fn sign_in(State(s): State<AppState>, Json(body): Json<SignIn>) -> Reply {
    let presented = format!("Bearer {}", body.token.trim());
    if !s.shared.auth.check_header(Some(&presented)) {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        return Ok(
            (StatusCode::UNAUTHORIZED, Json(json!({ "error": "that is not the admin's token" }))).into_response()
        );
    }
    let (id, csrf) = s.shared.sessions.open();
    let mut response = Json(json!({ "csrf": csrf })).into_response();
    response.headers_mut().insert(axum::http::header::SET_COOKIE, console::cookie(Some(&id)));
    Ok(response)
}

async fn sign_out(State(s): State<AppState>, headers: HeaderMap) -> Response {
    s.shared.sessions.close(&headers);
    let mut response = Json(json!({ "signed_out": true })).into_response();
    response.headers_mut().insert(axum::http::header::SET_COOKIE, console::cookie(None));
    response
}

async fn overview(State(s): State<AppState>) -> Reply {
    Ok(Json(views::overview(&s.shared, &s.api).await?).into_response())
}

async fn graph(State(s): State<AppState>, Path(id): Path<String>) -> Reply {
    Ok(Json(views::graph(&s.shared, &id).await?).into_response())
}

async fn task(State(s): State<AppState>, Path((id, task)): Path<(String, String)>) -> Reply {
    Ok(Json(views::task(&s.shared, &id, &task).await?).into_response())
}

async fn events(State(s): State<AppState>, Path(id): Path<String>) -> Reply {
    let stream = views::events(&s.api, &id).await?;
    let stream = stream
        .map(|(name, data)| Ok::<_, std::convert::Infallible>(SseEvent::default().event(name).data(data.to_string())));
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}

async fn job_types(State(s): State<AppState>) -> Json<Value> {
    Json(views::job_types(&s.shared))
}

async fn job_type(State(s): State<AppState>, Path(job_type): Path<String>) -> Reply {
    Ok(Json(views::job_type(&s.shared, &s.api, &job_type)?).into_response())
}

async fn get_policy(State(s): State<AppState>, Path(job_type): Path<String>) -> Reply {
    Ok(Json(s.api.policy(&job_type)?).into_response())
}

async fn set_policy(
    State(s): State<AppState>,
    Path(job_type): Path<String>,
    Json(changes): Json<BTreeMap<String, Value>>,
) -> Reply {
    let changes: BTreeMap<String, String> =
        changes.into_iter().map(|(k, v)| (k, v.as_str().map(String::from).unwrap_or_else(|| v.to_string()))).collect();
    let policy = s.api.set_policy(&job_type, &changes).await?;
    Ok(Json(policy).into_response())
}

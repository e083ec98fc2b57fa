//! JSON over HTTP: what the worker asks first (`/api/plugin/status`), health
//! and readiness, and the client API under `/api/`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use super::api::{Api, Error};
use super::Shared;
use crate::wire::PLUGIN_STATUS_PATH;

#[derive(Clone)]
struct AppState {
    shared: Arc<Shared>,
    api: Api,
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(json!({ "error": self.to_string() }))).into_response()
    }
}

fn authorized(state: &AppState, headers: &HeaderMap) -> Result<(), Error> {
    let header = headers.get("authorization").and_then(|v| v.to_str().ok());
    if state.shared.auth.check_header(header) {
        Ok(())
    } else {
        Err(Error::Unauthenticated)
    }
}

/// Ready while the store takes writes: a server whose database is away
/// acknowledges nothing and says so here.
async fn readyz(State(state): State<AppState>) -> (axum::http::StatusCode, &'static str) {
    if state.shared.engine.is_ready() {
        (axum::http::StatusCode::OK, "ready\n")
    } else {
        (axum::http::StatusCode::SERVICE_UNAVAILABLE, "not ready: the store is unavailable\n")
    }
}

pub fn router(shared: Arc<Shared>, api: Api) -> Router {
    let body_limit = shared.options.max_request_bytes;
    let state = AppState { shared, api };
    Router::new()
        .route(PLUGIN_STATUS_PATH, get(plugin_status))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/api/jobs", get(list_jobs).post(submit_job))
        .route("/api/jobs/{id}", get(get_job))
        .route("/api/jobs/{id}/cancel", post(cancel_job))
        .route("/api/jobs/{id}/retry", post(retry_job))
        .route("/api/workers", get(workers))
        .route("/api/instances", get(instances))
        .route("/api/scheduler/pause", post(pause_scheduler))
        .route("/api/scheduler/resume", post(resume_scheduler))
        .route("/api/stats", get(stats))
        .route("/api/recover", post(recover))
        .route("/api/detect/{job_type}", post(detect))
        .route("/api/activities", get(activities))
        .route("/api/runs/{job_type}", get(runs))
        .route("/api/policies/{job_type}", get(get_policy).put(set_policy))
        .route("/api/openapi.json", get(openapi))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

async fn plugin_status(State(state): State<AppState>) -> Json<Value> {
    Json(json!({ "enabled": true, "worker_grpc_port": state.shared.grpc_port }))
}

type Reply = Result<Response, Error>;

async fn list_jobs(State(s): State<AppState>, headers: HeaderMap, Query(q): Query<HashMap<String, String>>) -> Reply {
    authorized(&s, &headers)?;
    let state = q.get("state").map(String::as_str).unwrap_or("");
    let limit = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
    let jobs = s.api.list(state, limit).await?;
    Ok(Json(json!({ "jobs": jobs })).into_response())
}

async fn submit_job(
    State(s): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Reply {
    authorized(&s, &headers)?;
    let format = q.get("format").map(String::as_str).unwrap_or("json");
    let name = q.get("name").map(String::as_str).unwrap_or("");
    let job_id = s.api.submit(body.to_vec(), format, name).await?;
    Ok((StatusCode::CREATED, Json(json!({ "job_id": job_id }))).into_response())
}

async fn get_job(State(s): State<AppState>, headers: HeaderMap, Path(id): Path<String>) -> Reply {
    authorized(&s, &headers)?;
    Ok(Json(s.api.job(&id).await?).into_response())
}

async fn cancel_job(State(s): State<AppState>, headers: HeaderMap, Path(id): Path<String>) -> Reply {
    authorized(&s, &headers)?;
    s.api.cancel(&id).await?;
    Ok(Json(json!({ "job_id": id, "canceled": true })).into_response())
}

async fn retry_job(State(s): State<AppState>, headers: HeaderMap, Path(id): Path<String>) -> Reply {
    authorized(&s, &headers)?;
    s.api.retry(&id).await?;
    Ok(Json(json!({ "job_id": id, "retried": true })).into_response())
}

async fn detect(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(job_type): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Reply {
    authorized(&s, &headers)?;
    let run = q.get("run").is_some_and(|v| v == "true" || v == "1");
    Ok(Json(s.api.detect(&job_type, run).await?).into_response())
}

async fn activities(State(s): State<AppState>, headers: HeaderMap, Query(q): Query<HashMap<String, String>>) -> Reply {
    authorized(&s, &headers)?;
    let job_type = q.get("job_type").map(String::as_str).unwrap_or("");
    let limit = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
    Ok(Json(json!({ "activities": s.api.activities(job_type, limit) })).into_response())
}

async fn runs(State(s): State<AppState>, headers: HeaderMap, Path(job_type): Path<String>) -> Reply {
    authorized(&s, &headers)?;
    Ok(Json(s.api.runs(&job_type)).into_response())
}

async fn recover(State(s): State<AppState>, headers: HeaderMap, Query(q): Query<HashMap<String, String>>) -> Reply {
    authorized(&s, &headers)?;
    let flag = |name: &str| q.get(name).is_some_and(|v| v == "true" || v == "1");
    Ok(Json(s.api.recover(flag("dry_run"), flag("here_only")).await?).into_response())
}

async fn stats(State(s): State<AppState>, headers: HeaderMap) -> Reply {
    authorized(&s, &headers)?;
    let (count, p50, p99) = s.shared.stats.dispatch();
    Ok(Json(json!({ "dispatch": { "count": count, "p50_us": p50, "p99_us": p99 } })).into_response())
}

/// The OpenAPI description of every route, written by hand next to this file.
const OPENAPI: &str = include_str!("openapi.json");

async fn openapi() -> Response {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

async fn metrics(State(s): State<AppState>, headers: HeaderMap) -> Reply {
    authorized(&s, &headers)?;
    let text = s.shared.metrics.render(&s.shared).await;
    Ok(([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response())
}

async fn instances(State(s): State<AppState>, headers: HeaderMap) -> Reply {
    authorized(&s, &headers)?;
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

async fn pause_scheduler(state: State<AppState>, headers: HeaderMap, query: Query<HashMap<String, String>>) -> Reply {
    set_scheduler_paused(state, headers, query, true).await
}

async fn resume_scheduler(state: State<AppState>, headers: HeaderMap, query: Query<HashMap<String, String>>) -> Reply {
    set_scheduler_paused(state, headers, query, false).await
}

async fn set_scheduler_paused(
    State(s): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
    paused: bool,
) -> Reply {
    authorized(&s, &headers)?;
    let instance = q.get("instance").map(String::as_str).unwrap_or("");
    let changed = s.api.set_scheduler_paused(paused, instance).await?;
    Ok(Json(json!({ "paused": paused, "changed": changed })).into_response())
}

async fn workers(State(s): State<AppState>, headers: HeaderMap) -> Reply {
    authorized(&s, &headers)?;
    Ok(Json(json!({ "workers": s.api.workers() })).into_response())
}

async fn get_policy(State(s): State<AppState>, headers: HeaderMap, Path(job_type): Path<String>) -> Reply {
    authorized(&s, &headers)?;
    Ok(Json(s.api.policy(&job_type)?).into_response())
}

async fn set_policy(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(job_type): Path<String>,
    Json(changes): Json<BTreeMap<String, Value>>,
) -> Reply {
    authorized(&s, &headers)?;
    let changes: BTreeMap<String, String> =
        changes.into_iter().map(|(k, v)| (k, v.as_str().map(String::from).unwrap_or_else(|| v.to_string()))).collect();
    let policy = s.api.set_policy(&job_type, &changes).await?;
    Ok(Json(policy).into_response())
}

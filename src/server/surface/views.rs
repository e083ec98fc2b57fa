//! What the console reads besides the plain API: a job's graph in compact
//! arrays, one task, the overview, the job types with their descriptors, and
//! a job's transitions as server-sent events.

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Map, Value};
use tokio_stream::{Stream, StreamExt};

use super::api::{Api, Error};
use super::convert;
use crate::model::JobId;
use crate::proto::api::job_event;
use crate::proto::plugin::{config_value::Kind, ConfigField, ConfigForm, ConfigValue, JobTypeDescriptor};
use crate::store::JobFilter;

fn job_id(text: &str) -> Result<JobId, Error> {
    text.parse().map_err(|_| Error::Invalid(format!("{text:?} is not a job id (a UUID)")))
}

async fn stored(api: &Api, id: &str) -> Result<crate::store::StoredJob, Error> {
    api.stored(job_id(id)?).await
}

/// A job drawn as a graph: every task's id, job type, state, level (the
/// longest path from a root) and parents, as arrays by task index.
pub(super) async fn graph(api: &Api, id: &str) -> Result<Value, Error> {
    let job = stored(api, id).await?;
    let dag = &job.spec.dag;
    let order = dag.check_acyclic().map_err(|_| Error::Internal(format!("job {id} holds a cycle")))?;
    let levels = dag.levels(&order);
    let mut types: Vec<&str> = Vec::new();
    let mut type_index: HashMap<&str, usize> = HashMap::new();
    let mut kinds = Vec::with_capacity(job.spec.len());
    for task in &job.spec.tasks {
        let next = types.len();
        let index = *type_index.entry(&task.job_type).or_insert(next);
        if index == next {
            types.push(&task.job_type);
        }
        kinds.push(index);
    }
    let ids: Vec<&str> = job.spec.tasks.iter().map(|t| &*t.id).collect();
    let states: Vec<&str> = job.tasks.iter().map(|t| t.state().as_str()).collect();
    let deps: Vec<&[u32]> = (0..job.spec.len() as u32).map(|i| dag.parents(i)).collect();
    let record = &job.record;
    Ok(json!({
        "id": record.id.to_string(),
        "name": record.name,
        "state": record.state.as_str(),
        "origin": convert::origin(&record.origin),
        "created_at_ms": record.created_at.as_millis(),
        "finished_at_ms": record.finished_at.map_or(0, |t| t.as_millis()),
        "cancel_requested": record.cancel_requested,
        "priority": convert::shared_priority(&job.spec).map(|p| p.as_str()),
        "types": types,
        "tasks": { "id": ids, "type": kinds, "state": states, "level": levels, "deps": deps },
        "levels": levels.iter().max().map_or(0, |l| l + 1),
    }))
}

/// One task of a job, by its id.
pub(super) async fn task(api: &Api, id: &str, task_id: &str) -> Result<crate::proto::api::Task, Error> {
    let job = job_id(id)?;
    let (spec, idx, record) = api
        .engine
        .task(job, task_id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("no task {task_id:?} in a job {id}")))?;
    let mut task = convert::task_of(&spec, idx, &record);
    if !task.handler.is_empty() {
        task.worker_id = api.registry.worker_id(&task.handler).unwrap_or_default();
    }
    Ok(task)
}

/// The attempts each connected worker runs now, by handler.
pub(super) async fn running(api: &Api) -> Result<HashMap<String, Vec<Value>>, Error> {
    let mut by_handler: HashMap<String, Vec<Value>> = HashMap::new();
    for held in api.engine.attempts().await? {
        by_handler.entry(held.handler.to_string()).or_default().push(json!({
            "job_id": held.job.to_string(), "task_id": held.task_id, "attempt": held.attempt,
            "state": if held.started_at.is_some() { "running" } else { "assigned" },
            "started_at_ms": held.started_at.map(|t| t.as_millis()).unwrap_or(0),
        }));
    }
    Ok(by_handler)
}

/// A page of the workers, each with what it runs now.
pub(super) async fn workers(api: &Api, offset: u32, limit: u32) -> Result<Value, Error> {
    let (page, total) = api.workers(offset, limit)?;
    let mut running = match page.is_empty() {
        true => HashMap::new(),
        false => running(api).await?,
    };
    let workers: Vec<Value> = page
        .into_iter()
        .map(|w| {
            let now = running.remove(&w.handler).unwrap_or_default();
            let mut value = serde_json::to_value(&w).unwrap_or(Value::Null);
            value["running"] = Value::Array(now);
            value
        })
        .collect();
    Ok(json!({ "workers": workers, "total": total, "offset": offset }))
}

/// What the console's first page shows.
pub(super) async fn overview(api: &Api) -> Result<Value, Error> {
    let mut by_state: BTreeMap<&str, u64> =
        ["pending", "running", "succeeded", "failed", "canceled"].into_iter().map(|s| (s, 0)).collect();
    for job in api.engine.list(JobFilter::default()).await? {
        *by_state.entry(job.state.as_str()).or_default() += 1;
    }
    let totals = api.registry.totals();
    let (total, used, running) = (totals.execution_slots_total, totals.execution_slots_used, totals.running);
    let recovery = api.recovery.last().map(|(at_ms, findings)| json!({ "at_ms": at_ms, "findings": findings }));
    Ok(json!({
        "jobs_by_state": by_state,
        "tasks_running": running,
        "workers": totals.workers,
        "execution_slots_total": total,
        "execution_slots_free": (total - used).max(0),
        "instances": api.instances().await?,
        "activities": api.activities("", 20),
        "recovery": recovery,
    }))
}

/// Every job type a worker declared or an operator set a policy for.
pub(super) fn job_types(api: &Api) -> Value {
    let mut counts: BTreeMap<String, (u32, u32)> = api.policies.job_types().into_iter().map(|t| (t, (0, 0))).collect();
    for worker in api.registry.workers() {
        for capability in worker.to_api().capabilities {
            let entry = counts.entry(capability.job_type).or_default();
            entry.0 += u32::from(capability.can_detect);
            entry.1 += u32::from(capability.can_execute);
        }
    }
    let types: Vec<Value> = counts
        .into_iter()
        .map(|(job_type, (detectors, executors))| {
            let descriptor = api.policies.descriptor(&job_type);
            let text = |f: fn(&JobTypeDescriptor) -> &str| descriptor.as_ref().map_or("", f).to_string();
            json!({
                "job_type": job_type,
                "display_name": text(|d| &d.display_name),
                "description": text(|d| &d.description),
                "detectors": detectors,
                "executors": executors,
                "has_descriptor": descriptor.is_some(),
            })
        })
        .collect();
    json!({ "job_types": types })
}

/// A job type's policy and the descriptor its worker sent.
pub(super) fn job_type(api: &Api, job_type: &str) -> Result<Value, Error> {
    let policy = api.policy(job_type)?;
    let descriptor = api.policies.descriptor(job_type).map(|d| descriptor_json(&d));
    Ok(json!({ "job_type": job_type, "policy": policy, "descriptor": descriptor }))
}

fn descriptor_json(d: &JobTypeDescriptor) -> Value {
    let runtime = d.admin_runtime_defaults.as_ref().map(|r| {
        json!({
            "enabled": r.enabled,
            "detection_interval_minutes": r.detection_interval_minutes,
            "detection_timeout_seconds": r.detection_timeout_seconds,
            "max_jobs_per_detection": r.max_jobs_per_detection,
            "global_execution_concurrency": r.global_execution_concurrency,
            "per_worker_execution_concurrency": r.per_worker_execution_concurrency,
            "retry_limit": r.retry_limit,
            "retry_backoff_seconds": r.retry_backoff_seconds,
            "job_type_max_runtime_seconds": r.job_type_max_runtime_seconds,
            "execution_timeout_seconds": r.execution_timeout_seconds,
        })
    });
    json!({
        "job_type": d.job_type,
        "display_name": d.display_name,
        "description": d.description,
        "icon": d.icon,
        "descriptor_version": d.descriptor_version,
        "admin_config_form": d.admin_config_form.as_ref().map(form_json),
        "worker_config_form": d.worker_config_form.as_ref().map(form_json),
        "admin_runtime_defaults": runtime,
        "worker_default_values": values_json(&d.worker_default_values),
    })
}

fn values_json(values: &BTreeMap<String, ConfigValue>) -> Value {
    Value::Object(values.iter().map(|(k, v)| (k.clone(), value_json(v))).collect::<Map<_, _>>())
}

fn form_json(form: &ConfigForm) -> Value {
    let sections: Vec<Value> = form
        .sections
        .iter()
        .map(|s| {
            let fields: Vec<Value> = s.fields.iter().map(field_json).collect();
            json!({ "section_id": s.section_id, "title": s.title, "description": s.description, "fields": fields })
        })
        .collect();
    json!({
        "form_id": form.form_id,
        "title": form.title,
        "description": form.description,
        "sections": sections,
        "default_values": values_json(&form.default_values),
    })
}

fn field_json(f: &ConfigField) -> Value {
    let options: Vec<Value> = f
        .options
        .iter()
        .map(|o| json!({ "value": o.value, "label": o.label, "description": o.description, "disabled": o.disabled }))
        .collect();
    let rules: Vec<Value> = f
        .validation_rules
        .iter()
        .map(|r| {
            json!({ "type": r.r#type().as_str_name(), "expression": r.expression, "error_message": r.error_message })
        })
        .collect();
    json!({
        "name": f.name,
        "label": f.label,
        "description": f.description,
        "help_text": f.help_text,
        "placeholder": f.placeholder,
        "field_type": f.field_type().as_str_name(),
        "widget": f.widget().as_str_name(),
        "required": f.required,
        "read_only": f.read_only,
        "sensitive": f.sensitive,
        "min_value": f.min_value.as_ref().map(value_json),
        "max_value": f.max_value.as_ref().map(value_json),
        "options": options,
        "validation_rules": rules,
        "visible_when_field": f.visible_when_field,
        "visible_when_equals": f.visible_when_equals.as_ref().map(value_json),
    })
}

/// A typed value as `{"<kind>": value}`, the kinds named as in plugin.proto.
fn value_json(v: &ConfigValue) -> Value {
    let plain = crate::wire::value_to_json(v);
    let name = match &v.kind {
        None => return Value::Null,
        Some(Kind::BoolValue(_)) => "bool_value",
        Some(Kind::Int64Value(_)) => "int64_value",
        Some(Kind::DoubleValue(_)) => "double_value",
        Some(Kind::StringValue(_)) => "string_value",
        Some(Kind::BytesValue(_)) => "bytes_value",
        Some(Kind::DurationValue(d)) => {
            return json!({ "duration_value": format!("{}s", d.seconds as f64 + f64::from(d.nanos) / 1e9) })
        }
        Some(Kind::StringList(_)) => "string_list",
        Some(Kind::Int64List(_)) => "int64_list",
        Some(Kind::DoubleList(_)) => "double_list",
        Some(Kind::BoolList(_)) => "bool_list",
        Some(Kind::ListValue(_)) => "list_value",
        Some(Kind::MapValue(_)) => "map_value",
    };
    json!({ name: plain })
}

/// One server-sent event: its name and JSON data.
pub(super) type SseItem = (&'static str, Value);

/// A job's live events for the console: `states` (every task's state, by
/// index) first and whenever only a fresh snapshot is known, then `task`
/// and `job` transitions; it ends after the job's final state.
pub(super) async fn events(api: &Api, id: &str) -> Result<impl Stream<Item = SseItem> + Send, Error> {
    let watch = api.watch(id).await?;
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut assembly = crate::wire::JobAssembly::default();
    Ok(watch.map_while(Result::ok).filter_map(move |event| match event.event? {
        job_event::Event::Snapshot(part) => {
            let job = assembly.push(part).ok()??;
            index = job.tasks.iter().enumerate().map(|(i, t)| (t.id.clone(), i)).collect();
            let states: Vec<&str> = job.tasks.iter().map(|t| t.state.as_str()).collect();
            Some(("states", json!({ "state": job.state, "states": states })))
        }
        job_event::Event::Task(t) => Some((
            "task",
            json!({
                "idx": index.get(&t.task_id), "task_id": t.task_id, "state": t.state, "attempt": t.attempt,
                "error": t.error, "handler": t.handler, "at_ms": t.at_ms,
                "progress_percent": t.progress_percent, "stage": t.stage,
            }),
        )),
        job_event::Event::Job(j) => Some(("job", json!({ "state": j.state, "at_ms": j.at_ms }))),
    }))
}

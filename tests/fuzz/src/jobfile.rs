//! The job file target: `jobfile::parse` over JSON, TOML and YAML with the
//! validation that follows. The first byte of an input picks the format
//! (its low 7 bits modulo 3) and the limits (its high bit: tight ones, so that
//! every limit is reached by small inputs); the rest is the document.
//!
//! A rejected file must give a typed error: at least one problem and at
//! most 20, the source named, each problem a lowercase line saying the rule,
//! and a syntax error naming the line. An accepted file must be a valid
//! job within the limits, and written back out as a JSON and as a YAML job
//! file it must read back to the same job.

use std::collections::BTreeMap;

use jobcenter::jobfile::{self, Error, Format, Limits, Problem};
use jobcenter::model::JobSpec;
use serde_json::{json, Map, Value};

const SOURCE: &str = "fuzz.job";

/// Limits every part of which a small input can pass.
fn tight() -> Limits {
    Limits {
        max_file_bytes: 2048,
        max_tasks: 6,
        max_edges: 8,
        max_id_bytes: 12,
        max_parameter_bytes: 96,
        max_parameter_depth: 3,
    }
}

pub fn run(data: &[u8]) {
    let Some((&selector, document)) = data.split_first() else { return };
    let format = [Format::Json, Format::Toml, Format::Yaml][usize::from((selector & 0x7f) % 3)];
    let limits = if selector & 0x80 != 0 { tight() } else { Limits::default() };
    match jobfile::parse(document, format, SOURCE, &limits) {
        Ok(spec) => {
            check_valid(&spec, &limits);
            check_reads_back(&spec, &limits);
        }
        Err(error) => check_rejection(&error, format),
    }
}

fn check_rejection(error: &Error, format: Format) {
    assert_eq!(error.source_name, SOURCE);
    assert!(!error.problems.is_empty(), "a rejection with no problem");
    assert!(error.problems.len() <= 20, "{} problems, more than the 20 one error lists", error.problems.len());
    let text = error.to_string();
    assert!(text.starts_with(&format!("invalid job {SOURCE}: ")), "{text}");
    for problem in &error.problems {
        let line = problem.to_string();
        assert!(
            line.chars().next().is_some_and(|c| c.is_ascii_lowercase()),
            "a problem that does not open with its rule in lowercase: {line:?}"
        );
        if let Problem::Syntax { rule: "syntax", message } = problem {
            // Whatever the format, a syntax error says where it is, unless
            // it is about the whole file: it ends too soon (JSON), or holds
            // more than one document (YAML; the reader names no place).
            let whole = (format == Format::Json && message.contains("EOF"))
                || (format == Format::Yaml && message.contains("more than one document"));
            assert!(
                message.contains("line ") || whole,
                "a syntax error in a {format:?} file that names no line: {message:?}"
            );
        }
    }
}

fn check_valid(spec: &JobSpec, limits: &Limits) {
    assert!(!spec.name.trim().is_empty() && spec.name.len() <= 256, "name {:?}", spec.name);
    assert!(!spec.name.chars().any(char::is_control), "name {:?}", spec.name);
    assert!(!spec.tasks.is_empty() && spec.tasks.len() <= limits.max_tasks);
    assert_eq!(spec.dag.len(), spec.tasks.len());
    assert!(spec.dag.n_edges() <= limits.max_edges);
    spec.dag.check_acyclic().expect("an accepted job has no cycle");
    let mut ids = std::collections::HashSet::new();
    for (idx, task) in spec.tasks.iter().enumerate() {
        assert!(ids.insert(&task.id), "duplicate id {:?}", task.id);
        assert!(!task.id.is_empty() && task.id.len() <= limits.max_id_bytes, "id {:?}", task.id);
        assert!(task.id.chars().all(jobfile::is_id_char), "id {:?}", task.id);
        assert!(jobfile::is_job_type(&task.job_type), "job type {:?}", task.job_type);
        assert!(task.parameters.len() <= limits.max_parameter_bytes.max(2));
        let parameters: Map<String, Value> =
            serde_json::from_str(&task.parameters).expect("accepted parameters are a JSON object");
        assert!(depth(&Value::Object(parameters)) <= limits.max_parameter_depth, "{}", task.parameters);
        for (key, value) in &task.labels {
            assert!(!key.is_empty() && value.len() <= 4096);
        }
        let parents = spec.dag.parents(idx as u32);
        assert!(parents.iter().all(|&p| (p as usize) < spec.tasks.len() && p as usize != idx));
        let mut sorted = parents.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), parents.len(), "task {:?} lists a parent twice", task.id);
    }
}

fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// The job as a job file's JSON value: what a user would write for it.
fn as_file(spec: &JobSpec) -> Value {
    let tasks: Vec<Value> = spec
        .tasks
        .iter()
        .enumerate()
        .map(|(idx, task)| {
            let parameters: Value = serde_json::from_str(&task.parameters).expect("parameters are JSON");
            let depends_on: Vec<&str> =
                spec.dag.parents(idx as u32).iter().map(|&p| &*spec.tasks[p as usize].id).collect();
            let mut file = json!({
                "id": &*task.id,
                "job_type": &*task.job_type,
                "parameters": parameters,
                "depends_on": depends_on,
                "priority": task.priority.as_str(),
                "labels": task.labels,
                "retry_limit": task.retry_limit,
                "retry_backoff_seconds": task.retry_backoff_seconds,
            });
            if let Some(seconds) = task.execution_timeout_seconds {
                file["execution_timeout_seconds"] = json!(seconds);
            }
            file
        })
        .collect();
    json!({ "name": spec.name, "tasks": tasks })
}

/// What two readings of one job must agree on: everything but where it
/// was read from, with each task's parameters as a JSON value (a format
/// other than JSON writes them back in its own way).
#[derive(Debug, PartialEq)]
struct Reading {
    name: String,
    tasks: Vec<TaskReading>,
}

#[derive(Debug, PartialEq)]
struct TaskReading {
    id: String,
    job_type: String,
    parameters: Value,
    priority: String,
    labels: BTreeMap<String, String>,
    retries: (u32, u64, Option<u64>),
    parents: Vec<u32>,
}

fn essence(spec: &JobSpec) -> Reading {
    let tasks = spec
        .tasks
        .iter()
        .enumerate()
        .map(|(idx, t)| TaskReading {
            id: t.id.to_string(),
            job_type: t.job_type.to_string(),
            parameters: serde_json::from_str(&t.parameters).expect("parameters are JSON"),
            priority: t.priority.to_string(),
            labels: t.labels.clone(),
            retries: (t.retry_limit, t.retry_backoff_seconds, t.execution_timeout_seconds),
            parents: spec.dag.parents(idx as u32).to_vec(),
        })
        .collect();
    Reading { name: spec.name.clone(), tasks }
}

fn check_reads_back(spec: &JobSpec, limits: &Limits) {
    let file = as_file(spec);
    // Written back, the file may be longer than the input was.
    let limits = Limits { max_file_bytes: u64::MAX, max_parameter_bytes: usize::MAX, ..limits.clone() };
    let json = serde_json::to_vec(&file).expect("a JSON value writes");
    let again = jobfile::parse(&json, Format::Json, SOURCE, &limits).unwrap_or_else(|e| {
        panic!("an accepted job written back as JSON is refused: {e}\n{}", String::from_utf8_lossy(&json))
    });
    assert_eq!(essence(&again), essence(spec), "written back as JSON, the job reads back otherwise");
    assert_eq!(again.dag, spec.dag);
    let yaml = serde_yaml_ng::to_string(&file).expect("a JSON value writes as YAML");
    let again = jobfile::parse(yaml.as_bytes(), Format::Yaml, SOURCE, &limits)
        .unwrap_or_else(|e| panic!("an accepted job written back as YAML is refused: {e}\n{yaml}"));
    assert_eq!(essence(&again), essence(spec), "written back as YAML, the job reads back otherwise:\n{yaml}");
}

//! The job file format (JSON, TOML or YAML) and its validation into a `JobSpec`.
//!
//! Validation collects every problem it can name (up to a bound) so that a
//! user fixes a file in one pass; nothing is stored for a rejected job.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::dag::{Cycle, Dag};
use crate::model::{JobSpec, Placement, Priority, TaskSpec};

/// Bounds on what a job may hold.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_file_bytes: u64,
    pub max_tasks: usize,
    pub max_edges: usize,
    pub max_id_bytes: usize,
    pub max_parameter_bytes: usize,
    pub max_parameter_depth: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_file_bytes: 512 * 1024 * 1024,
            max_tasks: 1_000_000,
            max_edges: 10_000_000,
            max_id_bytes: 256,
            max_parameter_bytes: 64 * 1024,
            max_parameter_depth: 32,
        }
    }
}

/// The most problems one error lists before it stops looking.
const MAX_PROBLEMS: usize = 20;
/// The deepest nesting a whole document may have; deeper input is refused
/// before it is parsed, whatever part of the file it is in.
const MAX_DOCUMENT_DEPTH: usize = 100;
const MAX_NAME_BYTES: usize = 256;
const MAX_JOB_TYPE_BYTES: usize = 128;
const MAX_LABEL_VALUE_BYTES: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Toml,
    Yaml,
}

impl Format {
    /// The format a file's extension names; JSON when it names none of them.
    pub fn from_path(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase()).as_deref() {
            Some("toml") => Format::Toml,
            Some("yaml" | "yml") => Format::Yaml,
            _ => Format::Json,
        }
    }

    /// Its name as the submit API takes it (`json`, `toml`, `yaml`).
    pub fn name(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Toml => "toml",
            Format::Yaml => "yaml",
        }
    }
}

/// One broken rule, with the place it is broken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    FileTooLarge { bytes: u64, limit: u64 },
    Unreadable { message: String },
    Syntax { rule: &'static str, message: String },
    TooDeep { line: usize, column: usize },
    EmptyJob,
    BadName { reason: String },
    TooManyTasks { count: usize, limit: usize },
    TooManyEdges { count: usize, limit: usize },
    EmptyId { index: usize },
    IdTooLong { index: usize, bytes: usize, limit: usize },
    IdCharacter { id: String, character: char },
    DuplicateId { id: String, first: usize, second: usize },
    BadJobType { task: String, reason: String },
    SelfDependency { task: String },
    UnknownDependency { task: String, dependency: String },
    DuplicateDependency { task: String, dependency: String },
    ParametersNotObject { task: String },
    ParametersTooLarge { task: String, bytes: usize, limit: usize },
    ParametersTooDeep { task: String, depth: usize, limit: usize },
    ParametersUnreadable { task: String, reason: String },
    BadLabel { task: String, key: String, reason: String },
    Cycle { path: Vec<String> },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::FileTooLarge { bytes, limit } => {
                write!(f, "file too large: {bytes} bytes, the limit is {limit}")
            }
            Problem::Unreadable { message } => write!(f, "unreadable: {message}"),
            Problem::Syntax { rule, message } => write!(f, "{rule}: {message}"),
            Problem::TooDeep { line, column } => {
                write!(f, "nesting too deep: more than {MAX_DOCUMENT_DEPTH} levels")?;
                // Line 0: the depth was found after conversion from YAML, where no position is known.
                if *line > 0 {
                    write!(f, " at line {line}, column {column}")?;
                }
                write!(f, " (parameters may nest at most 32 levels)")
            }
            Problem::EmptyJob => write!(f, "empty job: a job needs at least one task"),
            Problem::BadName { reason } => write!(f, "job name: {reason}"),
            Problem::TooManyTasks { count, limit } => {
                write!(f, "too many tasks: {count}, the limit is {limit}")
            }
            Problem::TooManyEdges { count, limit } => {
                write!(f, "too many dependencies: {count} edges, the limit is {limit}")
            }
            Problem::EmptyId { index } => write!(f, "empty id: task #{index} has an empty id"),
            Problem::IdTooLong { index, bytes, limit } => {
                write!(f, "id too long: task #{index} has an id of {bytes} bytes, the limit is {limit}")
            }
            Problem::IdCharacter { id, character } => write!(
                f,
                "id character: task {id:?} uses {character:?}; ids may use ASCII letters, digits and . _ - : / @"
            ),
            Problem::DuplicateId { id, first, second } => {
                write!(f, "duplicate id: {id:?} is declared by task #{first} and task #{second}")
            }
            Problem::BadJobType { task, reason } => write!(f, "job type: task {task:?} {reason}"),
            Problem::SelfDependency { task } => {
                write!(f, "self-dependency: task {task:?} depends on itself")
            }
            Problem::UnknownDependency { task, dependency } => {
                write!(f, "unknown dependency: task {task:?} depends on {dependency:?}, which is not in the job")
            }
            Problem::DuplicateDependency { task, dependency } => {
                write!(f, "duplicate dependency: task {task:?} lists {dependency:?} more than once")
            }
            Problem::ParametersNotObject { task } => {
                write!(f, "parameters: task {task:?} has parameters that are not an object")
            }
            Problem::ParametersTooLarge { task, bytes, limit } => {
                write!(f, "parameters too large: task {task:?} has {bytes} bytes of parameters, the limit is {limit}")
            }
            Problem::ParametersTooDeep { task, depth, limit } => write!(
                f,
                "parameters too deep: task {task:?} nests its parameters {depth} levels, the limit is {limit}"
            ),
            Problem::ParametersUnreadable { task, reason } => {
                write!(f, "parameters: task {task:?} has parameters that a worker could not read back: {reason}")
            }
            Problem::BadLabel { task, key, reason } => {
                write!(f, "label: task {task:?} label {key:?} {reason}")
            }
            Problem::Cycle { path } => {
                write!(f, "cycle: ")?;
                write_cycle(f, path)
            }
        }
    }
}

impl Problem {
    /// The id of the task the problem is about, when it is about one.
    pub fn task(&self) -> Option<&str> {
        match self {
            Problem::IdCharacter { id: task, .. }
            | Problem::DuplicateId { id: task, .. }
            | Problem::BadJobType { task, .. }
            | Problem::SelfDependency { task }
            | Problem::UnknownDependency { task, .. }
            | Problem::DuplicateDependency { task, .. }
            | Problem::ParametersNotObject { task }
            | Problem::ParametersTooLarge { task, .. }
            | Problem::ParametersTooDeep { task, .. }
            | Problem::ParametersUnreadable { task, .. }
            | Problem::BadLabel { task, .. } => Some(task),
            Problem::Cycle { path } => path.first().map(String::as_str),
            _ => None,
        }
    }
}

fn write_cycle(f: &mut fmt::Formatter<'_>, path: &[String]) -> fmt::Result {
    const SHOWN: usize = 5;
    let quoted = |s: &String| format!("{s:?}");
    let body: Vec<String> = if path.len() > 2 * SHOWN + 1 {
        let mut v: Vec<String> = path[..SHOWN].iter().map(quoted).collect();
        v.push(format!("... ({} more)", path.len() - 2 * SHOWN));
        v.extend(path[path.len() - SHOWN..].iter().map(quoted));
        v
    } else {
        path.iter().map(quoted).collect()
    };
    write!(f, "{}", body.join(" depends on "))?;
    if let Some(first) = path.first() {
        write!(f, " depends on {first:?} ({} tasks)", path.len())?;
    }
    Ok(())
}

/// A rejected job file: where it came from and every problem found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct Error {
    pub source_name: String,
    pub problems: Vec<Problem>,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let [only] = self.problems.as_slice() {
            return write!(f, "invalid job {}: {only}", self.source_name);
        }
        write!(f, "invalid job {}: {} problems", self.source_name, self.problems.len())?;
        for problem in &self.problems {
            write!(f, "\n  - {problem}")?;
        }
        if self.problems.len() >= MAX_PROBLEMS {
            write!(f, "\n  (stopped after {MAX_PROBLEMS} problems)")?;
        }
        Ok(())
    }
}

impl Error {
    fn one(source_name: &str, problem: Problem) -> Error {
        Error { source_name: source_name.to_string(), problems: vec![problem] }
    }
}

/// A job file as read: the names in it are borrowed from the text where
/// they need no unescaping.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JobFile<'a> {
    name: String,
    #[serde(borrow)]
    tasks: Vec<TaskFile<'a>>,
    /// The priority of each task that names none.
    #[serde(default, deserialize_with = "some_priority_by_name")]
    priority: Option<Priority>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskFile<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(borrow)]
    job_type: Cow<'a, str>,
    #[serde(default, borrow)]
    parameters: Option<&'a RawValue>,
    #[serde(default, borrow)]
    depends_on: Vec<Name<'a>>,
    #[serde(default, deserialize_with = "some_priority_by_name")]
    priority: Option<Priority>,
    #[serde(default)]
    labels: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    retry_limit: u32,
    #[serde(default = "default_backoff")]
    retry_backoff_seconds: u64,
    #[serde(default)]
    execution_timeout_seconds: Option<u64>,
}

/// A task's id where the file names one, borrowed from the text if it can be.
#[derive(Deserialize)]
struct Name<'a>(#[serde(borrow)] Cow<'a, str>);

fn default_backoff() -> u64 {
    5
}

/// A priority is one of its names; anything else (a number, a list) is the
/// wrong type, said as such, rather than the reader's bare "expected value".
fn priority_by_name<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Priority, D::Error> {
    const NAMES: &[&str] = &["low", "normal", "high", "critical"];
    struct Named;
    impl serde::de::Visitor<'_> for Named {
        type Value = Priority;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("one of `low`, `normal`, `high`, `critical`")
        }

        fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Priority, E> {
            match name {
                "low" => Ok(Priority::Low),
                "normal" => Ok(Priority::Normal),
                "high" => Ok(Priority::High),
                "critical" => Ok(Priority::Critical),
                _ => Err(E::unknown_variant(name, NAMES)),
            }
        }
    }
    deserializer.deserialize_str(Named)
}

fn some_priority_by_name<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Priority>, D::Error> {
    priority_by_name(deserializer).map(Some)
}

/// The priority of a task that names none, in a job that names none: its
/// job type's (from the type's policy).
pub type TypePriority<'a> = &'a (dyn Fn(&str) -> Priority + Sync);

/// What identifies a job file's bytes (`JobSpec::fingerprint`): their BLAKE3.
pub fn fingerprint(bytes: &[u8]) -> [u8; 32] {
    blake3::hash(bytes).into()
}

/// The fingerprint of a job stored before fingerprints were BLAKE3: the
/// bytes' SHA-256, which `jobcenter run` looks for when it finds no job by
/// `fingerprint`, so that it resumes a job an older release started.
pub fn fingerprint_before_blake3(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Reads and validates a job file; the format follows the extension.
pub fn read_file(path: &Path, limits: &Limits) -> Result<JobSpec, Error> {
    let source_name = path.display().to_string();
    let file = std::fs::File::open(path)
        .map_err(|e| Error::one(&source_name, Problem::Unreadable { message: e.to_string() }))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    if size > limits.max_file_bytes {
        return Err(Error::one(&source_name, Problem::FileTooLarge { bytes: size, limit: limits.max_file_bytes }));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(limits.max_file_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::one(&source_name, Problem::Unreadable { message: e.to_string() }))?;
    parse(&bytes, Format::from_path(path), &source_name, limits)
}

/// Parses and validates a job from its bytes; a task without a priority
/// of its own or of its job's is `normal`.
pub fn parse(bytes: &[u8], format: Format, source_name: &str, limits: &Limits) -> Result<JobSpec, Error> {
    parse_with(bytes, format, source_name, limits, &|_| Priority::Normal)
}

/// `parse`, with the priority of each job type for the tasks that name none.
pub fn parse_with(
    bytes: &[u8],
    format: Format,
    source_name: &str,
    limits: &Limits,
    type_priority: TypePriority<'_>,
) -> Result<JobSpec, Error> {
    if bytes.len() as u64 > limits.max_file_bytes {
        return Err(Error::one(
            source_name,
            Problem::FileTooLarge { bytes: bytes.len() as u64, limit: limits.max_file_bytes },
        ));
    }
    let fingerprint = fingerprint(bytes);
    // The JSON a TOML or YAML file reads as, which the file read borrows from.
    let json: Vec<u8>;
    let file = match format {
        Format::Json => {
            let read =
                utf8(bytes).and_then(|text| serde_json::from_str::<JobFile>(text).map_err(|e| syntax(&e.to_string())));
            unless_too_deep(read, bytes, |line, column| Problem::TooDeep { line, column })
                .map_err(|p| Error::one(source_name, p))?
        }
        Format::Toml | Format::Yaml => {
            let value = parse_other(bytes, format).map_err(|p| Error::one(source_name, p))?;
            json = serde_json::to_vec(&value).map_err(|e| Error::one(source_name, syntax(&e.to_string())))?;
            let read = serde_json::from_slice::<JobFile>(&json).map_err(|e| syntax(&strip_position(&e)));
            unless_too_deep(read, &json, |_, _| Problem::TooDeep { line: 0, column: 0 })
                .map_err(|p| Error::one(source_name, p))?
        }
    };
    validate(file, fingerprint, limits, type_priority)
        .map_err(|problems| Error { source_name: source_name.to_string(), problems })
}

/// A file read as a job, unless it nests deeper than `MAX_DOCUMENT_DEPTH`
/// (`too_deep` of the place where it first does): that problem comes first.
/// The text is scanned for it only when depth can be why the read failed
/// (the reader itself stops at 128 levels), or when a task's parameters or
/// labels could take it that deep: nothing else in a job file nests.
fn unless_too_deep<'a>(
    read: Result<JobFile<'a>, Problem>,
    json: &[u8],
    too_deep: impl FnOnce(usize, usize) -> Problem,
) -> Result<JobFile<'a>, Problem> {
    // A task's parameters open 4 levels deep, and a value d levels deep is
    // 2d bytes at least.
    let may_nest = |task: &TaskFile<'_>| {
        task.parameters.is_some_and(|raw| raw.get().len() > 2 * (MAX_DOCUMENT_DEPTH - 4))
            || task.labels.values().any(|v| v.is_array() || v.is_object())
    };
    match read {
        Ok(file) if !file.tasks.iter().any(may_nest) => Ok(file),
        read => match too_deep_at(json) {
            Some((line, column)) => Err(too_deep(line, column)),
            None => read,
        },
    }
}

/// The file's text, or where its first byte that is not UTF-8 lies.
fn utf8(bytes: &[u8]) -> Result<&str, Problem> {
    std::str::from_utf8(bytes).map_err(|e| {
        // Up to the invalid byte, the text is valid.
        let valid = std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default();
        let (line, column) = place(valid, valid.len());
        Problem::Syntax {
            rule: "syntax",
            message: format!("not UTF-8: an invalid byte at line {line} column {column}"),
        }
    })
}

fn parse_other(bytes: &[u8], format: Format) -> Result<serde_json::Value, Problem> {
    let text = utf8(bytes)?;
    match format {
        Format::Toml => toml::from_str::<serde_json::Value>(text).map_err(|e| toml_syntax(text, &e)),
        _ => serde_yaml_ng::from_str::<serde_json::Value>(text).map_err(|e| {
            // The YAML reader stops at 128 levels, beyond the document limit: report it as that limit.
            let message = e.to_string();
            match e.location() {
                Some(at) if message.starts_with("recursion limit exceeded") => {
                    Problem::TooDeep { line: at.line(), column: at.column() }
                }
                at => syntax(&yaml_placed(text, message, at)),
            }
        }),
    }
}

/// A YAML reader's message with the place it is about as a line and a
/// column. The reader leaves the place out when it is the document's first
/// character, and names a character it cannot read by its byte offset.
fn yaml_placed(text: &str, message: String, at: Option<serde_yaml_ng::Location>) -> String {
    if message.contains(" at line ") {
        return message;
    }
    if let Some((head, rest)) = message.split_once(" at position ") {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if let Ok(offset) = rest[..digits].parse::<usize>() {
            let (line, column) = place(text, offset);
            return format!("{head} at line {line} column {column}{}", &rest[digits..]);
        }
    }
    match at {
        Some(at) => format!("{message} at line {} column {}", at.line(), at.column()),
        None => message,
    }
}

/// The 1-based line and column (in characters) of byte `offset` of `text`.
fn place(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    (before.matches('\n').count() + 1, before.rsplit('\n').next().unwrap_or("").chars().count() + 1)
}

/// A TOML reader's error on one line, with the place it names (1-based
/// line and column, in characters), as the JSON and YAML readers give theirs.
fn toml_syntax(text: &str, e: &toml::de::Error) -> Problem {
    let message = e.message().lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(": ");
    match e.span() {
        Some(span) => {
            let (line, column) = place(text, span.start);
            syntax(&format!("{message} at line {line} column {column}"))
        }
        None => syntax(&message),
    }
}

fn strip_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

fn syntax(message: &str) -> Problem {
    let rule = if message.starts_with("unknown field") {
        "unknown field"
    } else if message.starts_with("missing field") {
        "missing field"
    } else if message.starts_with("unknown variant") {
        "unknown value"
    } else if message.starts_with("invalid type") {
        "wrong type"
    } else if message.starts_with("invalid value") {
        "invalid value"
    } else if message.starts_with("invalid length") {
        // A list where an object is wanted (the reader takes one in a
        // field's order), with too few items.
        "wrong length"
    } else {
        "syntax"
    };
    Problem::Syntax { rule, message: message.trim().to_string() }
}

/// Position (1-based line and column) where a JSON document first nests
/// deeper than `MAX_DOCUMENT_DEPTH`, scanning without parsing.
fn too_deep_at(bytes: &[u8]) -> Option<(usize, usize)> {
    nesting_depth(bytes, MAX_DOCUMENT_DEPTH).err()
}

/// Maximum nesting depth of JSON text, or the position where it exceeds `limit`.
fn nesting_depth(bytes: &[u8], limit: usize) -> Result<usize, (usize, usize)> {
    let (mut depth, mut max_depth) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    let (mut line, mut line_start) = (1usize, 0usize);
    for (i, &b) in bytes.iter().enumerate() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                max_depth = max_depth.max(depth);
                if depth > limit {
                    return Err((line, i - line_start + 1));
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'\n' => {
                line += 1;
                line_start = i + 1;
            }
            _ => {}
        }
    }
    Ok(max_depth)
}

fn check_id(id: &str, index: usize, limits: &Limits, problems: &mut Vec<Problem>) {
    if id.is_empty() {
        problems.push(Problem::EmptyId { index });
    } else if id.len() > limits.max_id_bytes {
        problems.push(Problem::IdTooLong { index, bytes: id.len(), limit: limits.max_id_bytes });
    } else if let Some(character) = id.chars().find(|c| !is_id_char(*c)) {
        problems.push(Problem::IdCharacter { id: id.to_string(), character });
    }
}

/// Job types are 1 to 128 ASCII letters, digits, `_`, `-` or `.`.
pub fn is_job_type(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= MAX_JOB_TYPE_BYTES
        && text.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// Task ids use ASCII letters, digits and `. _ - : / @`.
pub fn is_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '/' | '@')
}

fn label_value(value: &serde_json::Value) -> Result<String, String> {
    match value {
        serde_json::Value::String(s) => Ok(s.clone()),
        serde_json::Value::Number(n) => Ok(n.to_string()),
        serde_json::Value::Bool(b) => Ok(b.to_string()),
        _ => Err("must be a string, number or boolean".to_string()),
    }
}

/// Once `MAX_PROBLEMS` problems are found, validation stops looking: the
/// problems are taken out of `problems`, to be returned at once.
fn enough(problems: &mut Vec<Problem>) -> Result<(), Vec<Problem>> {
    if problems.len() >= MAX_PROBLEMS {
        return Err(std::mem::take(problems));
    }
    Ok(())
}

/// The job's checks, in the order its problems are listed. A step that
/// returns an error has taken every problem found so far: looking further
/// is pointless (a limit is passed, or there are enough problems).
fn validate(
    file: JobFile,
    fingerprint: [u8; 32],
    limits: &Limits,
    type_priority: TypePriority<'_>,
) -> Result<JobSpec, Vec<Problem>> {
    let mut problems = Vec::new();
    check_name(&file.name, &mut problems);
    check_size(&file.tasks, limits, &mut problems)?;
    let index_of = index_ids(&file.tasks, limits, &mut problems)?;
    let parent_lists = parent_lists(&file.tasks, &index_of, &mut problems)?;
    drop(index_of);
    let tasks = task_specs(file.tasks, file.priority, limits, type_priority, &mut problems)?;
    // The graph is looked at only once nothing else is wrong.
    if !problems.is_empty() {
        return Err(problems);
    }
    let dag = acyclic_dag(parent_lists, &tasks)?;
    Ok(JobSpec { name: file.name, tasks, dag, fingerprint })
}

/// The job's name: not empty, not too long, no control characters.
fn check_name(name: &str, problems: &mut Vec<Problem>) {
    if name.trim().is_empty() {
        problems.push(Problem::BadName { reason: "must not be empty".into() });
    } else if name.len() > MAX_NAME_BYTES {
        problems.push(Problem::BadName { reason: format!("longer than {MAX_NAME_BYTES} bytes") });
    } else if name.chars().any(char::is_control) {
        problems.push(Problem::BadName { reason: "must not contain control characters".into() });
    }
}

/// The job's size: at least one task, and no more tasks and dependencies
/// than the limits; past them nothing else is looked at.
fn check_size(tasks: &[TaskFile], limits: &Limits, problems: &mut Vec<Problem>) -> Result<(), Vec<Problem>> {
    if tasks.is_empty() {
        problems.push(Problem::EmptyJob);
        return Err(std::mem::take(problems));
    }
    if tasks.len() > limits.max_tasks {
        problems.push(Problem::TooManyTasks { count: tasks.len(), limit: limits.max_tasks });
        return Err(std::mem::take(problems));
    }
    let n_edges: usize = tasks.iter().map(|t| t.depends_on.len()).sum();
    if n_edges > limits.max_edges {
        problems.push(Problem::TooManyEdges { count: n_edges, limit: limits.max_edges });
        return Err(std::mem::take(problems));
    }
    Ok(())
}

/// Each task's id, and the index of the tasks by id (the first of a
/// duplicated id keeps it).
fn index_ids<'a>(
    tasks: &'a [TaskFile],
    limits: &Limits,
    problems: &mut Vec<Problem>,
) -> Result<HashMap<&'a str, u32>, Vec<Problem>> {
    let mut index_of: HashMap<&str, u32> = HashMap::with_capacity(tasks.len());
    for (index, task) in tasks.iter().enumerate() {
        check_id(&task.id, index, limits, problems);
        if let Some(first) = index_of.insert(&task.id, index as u32) {
            problems.push(Problem::DuplicateId { id: task.id.to_string(), first: first as usize, second: index });
            index_of.insert(&task.id, first);
        }
        enough(problems)?;
    }
    Ok(index_of)
}

/// Each task's parents, by index: sorted, each once.
fn parent_lists(
    tasks: &[TaskFile],
    index_of: &HashMap<&str, u32>,
    problems: &mut Vec<Problem>,
) -> Result<Vec<Vec<u32>>, Vec<Problem>> {
    let mut parent_lists: Vec<Vec<u32>> = Vec::with_capacity(tasks.len());
    for task in tasks {
        parent_lists.push(task_parents(task, tasks, index_of, problems)?);
    }
    Ok(parent_lists)
}

/// One task's parents: not itself, known, each named once.
fn task_parents(
    task: &TaskFile,
    tasks: &[TaskFile],
    index_of: &HashMap<&str, u32>,
    problems: &mut Vec<Problem>,
) -> Result<Vec<u32>, Vec<Problem>> {
    let mut parents = Vec::with_capacity(task.depends_on.len());
    for Name(dependency) in &task.depends_on {
        if *dependency == task.id {
            problems.push(Problem::SelfDependency { task: task.id.to_string() });
        } else {
            match index_of.get(&**dependency) {
                Some(&p) => parents.push(p),
                None => problems
                    .push(Problem::UnknownDependency { task: task.id.to_string(), dependency: dependency.to_string() }),
            }
        }
        enough(problems)?;
    }
    // Sorting finds repeats in O(n log n); a task may depend on a million others.
    parents.sort_unstable();
    let mut repeated = parents.windows(2).filter(|w| w[0] == w[1]).map(|w| w[0]).collect::<Vec<u32>>();
    repeated.dedup();
    for p in repeated {
        problems.push(Problem::DuplicateDependency {
            task: task.id.to_string(),
            dependency: tasks[p as usize].id.to_string(),
        });
        enough(problems)?;
    }
    parents.dedup();
    Ok(parents)
}

/// Each task's job type, parameters and labels, and the `TaskSpec` of each
/// task without a problem; the tasks share one copy of each job type, and
/// a job type's priority is asked for once.
fn task_specs(
    tasks: Vec<TaskFile>,
    job_priority: Option<Priority>,
    limits: &Limits,
    type_priority: TypePriority<'_>,
    problems: &mut Vec<Problem>,
) -> Result<Vec<TaskSpec>, Vec<Problem>> {
    let mut job_types: HashMap<String, (Arc<str>, Priority)> = HashMap::new();
    // Tasks of one type tend to come together: the last one is looked at first.
    let mut last: Option<(Arc<str>, Priority)> = None;
    let mut specs = Vec::with_capacity(tasks.len());
    for task in tasks {
        let task_problems_before = problems.len();
        check_job_type(&task.id, &task.job_type, problems);
        let parameters = task_parameters(task.parameters, &task.id, limits, problems);
        let labels = task_labels(task.labels, &task.id, problems)?;
        enough(problems)?;
        if problems.len() > task_problems_before {
            continue;
        }
        let (job_type, of_type) = match &last {
            Some(known) if *known.0 == *task.job_type => known.clone(),
            _ => match job_types.get(&*task.job_type) {
                Some(known) => known.clone(),
                None => {
                    let known = (Arc::from(&*task.job_type), type_priority(&task.job_type));
                    job_types.insert(task.job_type.to_string(), known.clone());
                    known
                }
            },
        };
        last = Some((job_type.clone(), of_type));
        specs.push(TaskSpec {
            placement: Placement::of(&labels, &parameters),
            id: task.id.into(),
            job_type,
            parameters,
            priority: task.priority.or(job_priority).unwrap_or(of_type),
            labels,
            retry_limit: task.retry_limit,
            retry_backoff_seconds: task.retry_backoff_seconds,
            execution_timeout_seconds: task.execution_timeout_seconds,
        });
    }
    Ok(specs)
}

/// A task's job type: 1 to `MAX_JOB_TYPE_BYTES` ASCII letters, digits, `_`, `-` or `.`.
fn check_job_type(task: &str, job_type: &str, problems: &mut Vec<Problem>) {
    if job_type.is_empty() {
        problems.push(Problem::BadJobType { task: task.to_string(), reason: "is empty".into() });
    } else if job_type.len() > MAX_JOB_TYPE_BYTES {
        problems.push(Problem::BadJobType {
            task: task.to_string(),
            reason: format!("is longer than {MAX_JOB_TYPE_BYTES} bytes"),
        });
    } else if !job_type.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) {
        problems.push(Problem::BadJobType {
            task: task.to_string(),
            reason: format!("{job_type:?} may use ASCII letters, digits and _ - . only"),
        });
    }
}

/// A task's parameters as written (`{}` when it has none): an object, within
/// the limits of size and depth, that a reader takes.
fn task_parameters(
    parameters: Option<&RawValue>,
    task: &str,
    limits: &Limits,
    problems: &mut Vec<Problem>,
) -> Box<str> {
    match parameters {
        None => "{}".into(),
        Some(raw) => {
            let text = raw.get();
            if !text.starts_with('{') {
                problems.push(Problem::ParametersNotObject { task: task.to_string() });
            } else if text.len() > limits.max_parameter_bytes {
                problems.push(Problem::ParametersTooLarge {
                    task: task.to_string(),
                    bytes: text.len(),
                    limit: limits.max_parameter_bytes,
                });
            } else {
                let depth = nesting_depth(text.as_bytes(), usize::MAX).unwrap_or(usize::MAX);
                if depth > limits.max_parameter_depth {
                    problems.push(Problem::ParametersTooDeep {
                        task: task.to_string(),
                        depth,
                        limit: limits.max_parameter_depth,
                    });
                } else if let Err(e) = serde_json::from_str::<Readable>(text) {
                    // Kept as written, yet a reader must take them: a
                    // number beyond a double's range is refused here.
                    problems.push(Problem::ParametersUnreadable { task: task.to_string(), reason: strip_position(&e) });
                }
            }
            Box::<str>::from(raw.get())
        }
    }
}

/// JSON a reader takes, read through and kept nowhere: numbers are read as
/// a reader reads them (one beyond a double's range is refused), and
/// nothing is allocated for what is read.
struct Readable;

impl<'de> serde::Deserialize<'de> for Readable {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Readable, D::Error> {
        deserializer.deserialize_any(Readable)
    }
}

impl<'de> serde::de::Visitor<'de> for Readable {
    type Value = Readable;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Readable, E> {
        Ok(Readable)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Readable, E> {
        Ok(Readable)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Readable, E> {
        Ok(Readable)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Readable, E> {
        Ok(Readable)
    }

    fn visit_str<E>(self, _: &str) -> Result<Readable, E> {
        Ok(Readable)
    }

    fn visit_unit<E>(self) -> Result<Readable, E> {
        Ok(Readable)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Readable, A::Error> {
        while seq.next_element::<Readable>()?.is_some() {}
        Ok(Readable)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Readable, A::Error> {
        while map.next_entry::<Readable, Readable>()?.is_some() {}
        Ok(Readable)
    }
}

/// A task's labels as text: each with a key, and a value that is a string,
/// a number or a boolean of at most `MAX_LABEL_VALUE_BYTES`.
fn task_labels(
    labels: BTreeMap<String, serde_json::Value>,
    task: &str,
    problems: &mut Vec<Problem>,
) -> Result<BTreeMap<String, String>, Vec<Problem>> {
    let mut texts = BTreeMap::new();
    for (key, value) in labels {
        enough(problems)?;
        match label_value(&value) {
            Ok(v) if v.len() <= MAX_LABEL_VALUE_BYTES && !key.is_empty() => {
                texts.insert(key, v);
            }
            Ok(_) if key.is_empty() => {
                problems.push(Problem::BadLabel { task: task.to_string(), key, reason: "has an empty key".into() })
            }
            Ok(_) => problems.push(Problem::BadLabel {
                task: task.to_string(),
                key,
                reason: format!("is longer than {MAX_LABEL_VALUE_BYTES} bytes"),
            }),
            Err(reason) => problems.push(Problem::BadLabel { task: task.to_string(), key, reason }),
        }
    }
    Ok(texts)
}

/// The job's graph, from its parent lists (dropped once it is built), if it
/// has no cycle; a cycle found is then the one problem.
fn acyclic_dag(parent_lists: Vec<Vec<u32>>, tasks: &[TaskSpec]) -> Result<Dag, Vec<Problem>> {
    let dag = Dag::from_parents(&parent_lists);
    drop(parent_lists);
    if let Err(Cycle(path)) = dag.check_acyclic() {
        let path = path.iter().map(|&t| tasks[t as usize].id.to_string()).collect();
        return Err(vec![Problem::Cycle { path }]);
    }
    Ok(dag)
}

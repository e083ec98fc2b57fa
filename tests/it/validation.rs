//! Job file validation, rule by rule (and the CLI ending quietly when its
//! output pipe closes early): each test feeds `jobfile::parse` or
//! `jobfile::read_file` a file that breaks one rule (or keeps to it at the
//! boundary) and checks the exact `Problem` and the message a user reads.

use std::collections::BTreeSet;
use std::fmt::Write;

use jobcenter::jobfile::{self, Error, Format, Limits, Problem};
use jobcenter::model::{JobSpec, Priority};
use serde_json::{json, Value};

/// The source name every in-memory job is parsed under; error messages name it.
const SOURCE: &str = "job.json";

fn parse_with(text: &str, limits: &Limits) -> Result<JobSpec, Error> {
    jobfile::parse(text.as_bytes(), Format::Json, SOURCE, limits)
}

fn accepted(text: &str) -> JobSpec {
    match parse_with(text, &Limits::default()) {
        Ok(spec) => spec,
        Err(e) => panic!("the job should be valid, got: {e}"),
    }
}

fn rejected_with(text: &str, limits: &Limits) -> Error {
    match parse_with(text, limits) {
        Ok(spec) => panic!("the job should be rejected, got {} tasks", spec.len()),
        Err(e) => e,
    }
}

fn rejected(text: &str) -> Error {
    rejected_with(text, &Limits::default())
}

/// The one problem a rejected job has, and the full message.
fn only_problem(text: &str) -> (Problem, String) {
    let error = rejected(text);
    assert_eq!(error.source_name, SOURCE);
    assert_eq!(error.problems.len(), 1, "expected one problem, got: {error}");
    (error.problems[0].clone(), error.to_string())
}

/// Checks a rejection against one problem and its message, written without the
/// `invalid job job.json: ` lead.
fn check_rejected(text: &str, expected_problem: Problem, expected_message: &str) {
    let (problem, message) = only_problem(text);
    assert_eq!(problem, expected_problem);
    assert_eq!(message, format!("invalid job {SOURCE}: {expected_message}"));
}

fn task(id: &str, depends_on: &[&str]) -> Value {
    json!({"id": id, "job_type": "noop", "depends_on": depends_on})
}

fn job(tasks: Vec<Value>) -> String {
    json!({"name": "test-job", "tasks": tasks}).to_string()
}

/// A job with one task whose extra fields are `fields`.
fn one_task_with(fields: Value) -> String {
    let mut task = json!({"id": "a", "job_type": "noop"});
    for (key, value) in fields.as_object().expect("fields object") {
        task[key] = value.clone();
    }
    job(vec![task])
}

/// Every dependency as (task id, dependency id).
fn edges(spec: &JobSpec) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (task_idx, task) in spec.tasks.iter().enumerate() {
        for &parent in spec.dag.parents(task_idx as u32) {
            out.insert((task.id.to_string(), spec.tasks[parent as usize].id.to_string()));
        }
    }
    out
}

/// The message a cycle gets: each task quoted, joined by "depends on", back
/// to the first, then the count.
fn cycle_message(path: &[String]) -> String {
    let quoted: Vec<String> = path.iter().map(|id| format!("{id:?}")).collect();
    format!("cycle: {} depends on {:?} ({} tasks)", quoted.join(" depends on "), path[0], path.len())
}

/// Asserts `path` is a cycle of the job: each task depends on the next, the last on the first.
fn assert_is_cycle(spec_text: &str, path: &[String]) {
    let file: Value = serde_json::from_str(spec_text).unwrap();
    let depends_on = |id: &str| -> Vec<String> {
        let task = file["tasks"].as_array().unwrap().iter().find(|t| t["id"] == id).unwrap();
        task["depends_on"].as_array().unwrap().iter().map(|d| d.as_str().unwrap().to_string()).collect()
    };
    let unique: BTreeSet<&String> = path.iter().collect();
    assert_eq!(unique.len(), path.len(), "a task repeats in {path:?}");
    for (position, id) in path.iter().enumerate() {
        let next = &path[(position + 1) % path.len()];
        assert!(depends_on(id).contains(next), "{id} does not depend on {next}");
    }
}

// ---- cycles and dependencies ----

#[test]
fn cycle_of_three_names_its_path() {
    // "root" and "tail" are outside the cycle and must not be named.
    let text = job(vec![
        task("root", &[]),
        task("a", &["c", "root"]),
        task("b", &["a"]),
        task("c", &["b"]),
        task("tail", &["c"]),
    ]);
    let (problem, message) = only_problem(&text);
    let Problem::Cycle { path } = problem else { panic!("expected a cycle, got {problem:?}") };
    assert_eq!(path.len(), 3);
    assert_eq!(path.iter().map(String::as_str).collect::<BTreeSet<_>>(), BTreeSet::from(["a", "b", "c"]));
    assert_is_cycle(&text, &path);
    assert_eq!(message, format!("invalid job {SOURCE}: {}", cycle_message(&path)));
    assert!(message.ends_with("(3 tasks)"), "{message}");
}

#[test]
fn cycle_of_two_names_both_tasks() {
    let text = job(vec![task("x", &["y"]), task("y", &["x"])]);
    let (problem, message) = only_problem(&text);
    let Problem::Cycle { path } = problem else { panic!("expected a cycle, got {problem:?}") };
    assert_is_cycle(&text, &path);
    assert_eq!(path.len(), 2);
    assert_eq!(message, format!("invalid job {SOURCE}: {}", cycle_message(&path)));
}

#[test]
fn long_cycle_is_shortened_in_the_message() {
    let n = 50;
    let tasks = (0..n).map(|i| task(&format!("t{i}"), &[&format!("t{}", (i + 1) % n)])).collect();
    let text = job(tasks);
    let (problem, message) = only_problem(&text);
    let Problem::Cycle { path } = problem else { panic!("expected a cycle, got {problem:?}") };
    assert_eq!(path.len(), n);
    assert_is_cycle(&text, &path);
    // Five tasks, the count of those left out, five tasks, then back to the first.
    let quoted: Vec<String> = path.iter().map(|id| format!("{id:?}")).collect();
    let expected = format!(
        "invalid job {SOURCE}: cycle: {} depends on ... (40 more) depends on {} depends on {:?} (50 tasks)",
        quoted[..5].join(" depends on "),
        quoted[45..].join(" depends on "),
        path[0]
    );
    assert_eq!(message, expected);
    assert_eq!(message.matches("depends on").count(), 11);
}

#[test]
fn self_dependency() {
    let text = job(vec![task("a", &[]), task("b", &["a", "b"])]);
    check_rejected(
        &text,
        Problem::SelfDependency { task: "b".into() },
        r#"self-dependency: task "b" depends on itself"#,
    );
}

#[test]
fn unknown_dependency() {
    let text = job(vec![task("a", &[]), task("b", &["a", "vacuum-9"])]);
    check_rejected(
        &text,
        Problem::UnknownDependency { task: "b".into(), dependency: "vacuum-9".into() },
        r#"unknown dependency: task "b" depends on "vacuum-9", which is not in the job"#,
    );
}

#[test]
fn duplicate_id_names_both_positions() {
    let text = job(vec![task("a", &[]), task("b", &[]), task("a", &[])]);
    check_rejected(
        &text,
        Problem::DuplicateId { id: "a".into(), first: 0, second: 2 },
        r#"duplicate id: "a" is declared by task #0 and task #2"#,
    );
}

#[test]
fn third_copy_of_an_id_points_back_to_the_first() {
    let text = job(vec![task("a", &[]), task("a", &[]), task("a", &[])]);
    let error = rejected(&text);
    assert_eq!(
        error.problems,
        vec![
            Problem::DuplicateId { id: "a".into(), first: 0, second: 1 },
            Problem::DuplicateId { id: "a".into(), first: 0, second: 2 },
        ]
    );
}

#[test]
fn duplicate_dependency() {
    let text = job(vec![task("a", &[]), task("b", &["a", "a"])]);
    check_rejected(
        &text,
        Problem::DuplicateDependency { task: "b".into(), dependency: "a".into() },
        r#"duplicate dependency: task "b" lists "a" more than once"#,
    );
}

#[test]
fn dependency_listed_three_times_is_reported_once() {
    let text = job(vec![task("a", &[]), task("b", &[]), task("c", &["a", "b", "a", "b", "a"])]);
    let error = rejected(&text);
    assert_eq!(
        error.problems,
        vec![
            Problem::DuplicateDependency { task: "c".into(), dependency: "a".into() },
            Problem::DuplicateDependency { task: "c".into(), dependency: "b".into() },
        ]
    );
}

#[test]
fn empty_job() {
    check_rejected(
        r#"{"name": "nothing", "tasks": []}"#,
        Problem::EmptyJob,
        "empty job: a job needs at least one task",
    );
}

// ---- ids ----

#[test]
fn empty_id() {
    let text = job(vec![task("a", &[]), task("", &[])]);
    check_rejected(&text, Problem::EmptyId { index: 1 }, "empty id: task #1 has an empty id");
}

#[test]
fn id_of_256_bytes_is_accepted_and_257_is_not() {
    let longest = "i".repeat(256);
    assert_eq!(&*accepted(&job(vec![task(&longest, &[])])).tasks[0].id, longest.as_str());
    let too_long = "i".repeat(257);
    check_rejected(
        &job(vec![task("a", &[]), task(&too_long, &[])]),
        Problem::IdTooLong { index: 1, bytes: 257, limit: 256 },
        "id too long: task #1 has an id of 257 bytes, the limit is 256",
    );
}

#[test]
fn id_may_use_letters_digits_and_the_listed_punctuation() {
    let id = "Volume_7.ec-shard:3/node@rack-1";
    let spec = accepted(&job(vec![task(id, &[])]));
    assert_eq!(&*spec.tasks[0].id, id);
    for c in ('\0'..='\u{7f}').chain(['é', 'ß', '→']) {
        let allowed = c.is_ascii_alphanumeric() || ".-_:/@".contains(c);
        assert_eq!(jobfile::is_id_char(c), allowed, "{c:?}");
    }
}

#[test]
fn id_with_a_character_outside_the_set() {
    for (id, character) in [("a b", ' '), ("vol#7", '#'), ("café", 'é'), ("a*", '*'), ("tab\there", '\t')] {
        let (problem, message) = only_problem(&job(vec![task(id, &[])]));
        assert_eq!(problem, Problem::IdCharacter { id: id.into(), character });
        assert_eq!(
            message,
            format!(
                "invalid job {SOURCE}: id character: task {id:?} uses {character:?}; \
                 ids may use ASCII letters, digits and . _ - : / @"
            )
        );
    }
}

// ---- fields, types and values ----

/// A serde-level rejection: one `Problem::Syntax` with this rule, whose message starts so.
fn check_syntax(text: &str, expected_rule: &str, message_start: &str) -> String {
    let (problem, message) = only_problem(text);
    let Problem::Syntax { rule, message: detail } = problem else {
        panic!("expected a syntax problem, got {problem:?}")
    };
    assert_eq!(rule, expected_rule, "{message}");
    assert!(detail.starts_with(message_start), "{detail:?} should start with {message_start:?}");
    assert!(message.starts_with(&format!("invalid job {SOURCE}: {expected_rule}: {message_start}")), "{message}");
    message
}

#[test]
fn unknown_field_at_job_level() {
    let message = check_syntax(
        r#"{"name": "x", "owner": "storage", "tasks": [{"id": "a", "job_type": "noop"}]}"#,
        "unknown field",
        "unknown field `owner`, expected one of `name`, `tasks`, `priority`",
    );
    assert!(message.contains("at line 1 column"), "{message}");
}

#[test]
fn unknown_field_at_task_level() {
    let message = check_syntax(
        &one_task_with(json!({"retries": 3})),
        "unknown field",
        "unknown field `retries`, expected one of `id`, `job_type`, `parameters`, `depends_on`, `priority`, \
         `labels`, `retry_limit`, `retry_backoff_seconds`, `execution_timeout_seconds`",
    );
    assert!(message.contains("at line 1 column"), "{message}");
}

#[test]
fn missing_fields() {
    check_syntax(r#"{"tasks": [{"id": "a", "job_type": "noop"}]}"#, "missing field", "missing field `name`");
    check_syntax(r#"{"name": "x"}"#, "missing field", "missing field `tasks`");
    check_syntax(r#"{"name": "x", "tasks": [{"job_type": "noop"}]}"#, "missing field", "missing field `id`");
    check_syntax(r#"{"name": "x", "tasks": [{"id": "a"}]}"#, "missing field", "missing field `job_type`");
}

#[test]
fn wrong_types() {
    check_syntax(
        &one_task_with(json!({"retry_limit": "2"})),
        "wrong type",
        r#"invalid type: string "2", expected u32"#,
    );
    check_syntax(
        &one_task_with(json!({"depends_on": "a"})),
        "wrong type",
        r#"invalid type: string "a", expected a sequence"#,
    );
    check_syntax(
        &one_task_with(json!({"execution_timeout_seconds": 1.5})),
        "wrong type",
        "invalid type: floating point",
    );
    check_syntax(&one_task_with(json!({"labels": ["a"]})), "wrong type", "invalid type: sequence, expected a map");
    check_syntax(r#"{"name": 7, "tasks": []}"#, "wrong type", "invalid type: integer `7`, expected a string");
    check_syntax(r#"{"name": "x", "tasks": {}}"#, "wrong type", "invalid type: map, expected a sequence");
    check_syntax("7", "wrong type", "invalid type: integer `7`, expected struct JobFile");
}

#[test]
fn out_of_range_number_is_an_invalid_value() {
    check_syntax(
        &one_task_with(json!({"retry_limit": -1})),
        "invalid value",
        "invalid value: integer `-1`, expected u32",
    );
    check_syntax(
        &one_task_with(json!({"retry_limit": 4_294_967_296u64})),
        "invalid value",
        "invalid value: integer `4294967296`, expected u32",
    );
}

#[test]
fn malformed_json_is_a_syntax_error() {
    check_syntax(r#"{"name": "x", "tasks": ["#, "syntax", "EOF while parsing a list");
    check_syntax(r#"{"name": "x", "tasks": [],}"#, "syntax", "trailing comma");
}

#[test]
fn unknown_priority_value() {
    let message = check_syntax(
        &one_task_with(json!({"priority": "urgent"})),
        "unknown value",
        "unknown variant `urgent`, expected one of `low`, `normal`, `high`, `critical`",
    );
    assert!(message.starts_with("invalid job job.json: unknown value: "), "{message}");
}

#[test]
fn every_priority_value_parses() {
    for (text, priority) in [
        ("low", Priority::Low),
        ("normal", Priority::Normal),
        ("high", Priority::High),
        ("critical", Priority::Critical),
    ] {
        let spec = accepted(&one_task_with(json!({"priority": text})));
        assert_eq!(spec.tasks[0].priority, priority);
    }
}

#[test]
fn defaults_of_a_task() {
    let spec = accepted(r#"{"name": "defaults", "tasks": [{"id": "a", "job_type": "noop"}]}"#);
    assert_eq!(spec.name, "defaults");
    let task = &spec.tasks[0];
    assert_eq!(&*task.parameters, "{}");
    assert!(spec.dag.parents(0).is_empty());
    assert_eq!(task.priority, Priority::Normal);
    assert!(task.labels.is_empty());
    assert_eq!(task.retry_limit, 0);
    assert_eq!(task.retry_backoff_seconds, 5);
    assert_eq!(task.execution_timeout_seconds, None);
}

#[test]
fn every_task_field_is_read() {
    let spec = accepted(
        r#"{"name": "nightly-maintenance",
            "tasks": [
              {"id": "vacuum-7", "job_type": "vacuum", "parameters": {"volume_id": 7}, "depends_on": []},
              {"id": "ec-7", "job_type": "erasure_coding", "parameters": {"volume_id": 7}, "depends_on": ["vacuum-7"],
               "priority": "high", "labels": {"volume_id": "7"}, "retry_limit": 2, "retry_backoff_seconds": 9,
               "execution_timeout_seconds": 600}
            ]}"#,
    );
    let task = &spec.tasks[1];
    assert_eq!(&*task.id, "ec-7");
    assert_eq!(&*task.job_type, "erasure_coding");
    assert_eq!(serde_json::from_str::<Value>(&task.parameters).unwrap(), json!({"volume_id": 7}));
    assert_eq!(task.priority, Priority::High);
    assert_eq!(task.labels.get("volume_id").map(String::as_str), Some("7"));
    assert_eq!(task.retry_limit, 2);
    assert_eq!(task.retry_backoff_seconds, 9);
    assert_eq!(task.execution_timeout_seconds, Some(600));
    assert_eq!(spec.dag.parents(1), &[0]);
    assert_eq!(spec.job_types().iter().map(|t| t.to_string()).collect::<Vec<_>>(), ["erasure_coding", "vacuum"]);
}

// ---- parameters ----

#[test]
fn parameters_that_are_not_an_object() {
    for parameters in [json!([1, 2]), json!("volume 7"), json!(7), json!(true)] {
        check_rejected(
            &one_task_with(json!({"parameters": parameters})),
            Problem::ParametersNotObject { task: "a".into() },
            r#"parameters: task "a" has parameters that are not an object"#,
        );
    }
}

#[test]
fn null_parameters_mean_no_parameters() {
    let spec = accepted(&one_task_with(json!({"parameters": null})));
    assert_eq!(&*spec.tasks[0].parameters, "{}");
}

/// Parameters `{"p":"xx..."}` of exactly `bytes` bytes.
fn parameters_of_bytes(bytes: usize) -> String {
    let text = format!(r#"{{"p":"{}"}}"#, "x".repeat(bytes - 8));
    assert_eq!(text.len(), bytes);
    format!(r#"{{"name": "x", "tasks": [{{"id": "a", "job_type": "noop", "parameters": {text}}}]}}"#)
}

#[test]
fn parameters_of_64_kib_are_accepted_and_one_byte_more_is_not() {
    let spec = accepted(&parameters_of_bytes(64 * 1024));
    assert_eq!(spec.tasks[0].parameters.len(), 65_536);
    check_rejected(
        &parameters_of_bytes(64 * 1024 + 1),
        Problem::ParametersTooLarge { task: "a".into(), bytes: 65_537, limit: 65_536 },
        r#"parameters too large: task "a" has 65537 bytes of parameters, the limit is 65536"#,
    );
}

/// A parameters object nested `depth` levels: objects, then arrays inside.
fn nested_parameters(depth: usize) -> String {
    let objects = depth / 2;
    let arrays = depth - objects;
    let mut text = String::new();
    for _ in 0..objects {
        text.push_str(r#"{"level":"#);
    }
    text.push_str(&"[".repeat(arrays));
    text.push_str(&"]".repeat(arrays));
    text.push_str(&"}".repeat(objects));
    format!(r#"{{"name": "x", "tasks": [{{"id": "a", "job_type": "noop", "parameters": {text}}}]}}"#)
}

#[test]
fn parameters_nested_32_levels_are_accepted_and_33_are_not() {
    accepted(&nested_parameters(32));
    check_rejected(
        &nested_parameters(33),
        Problem::ParametersTooDeep { task: "a".into(), depth: 33, limit: 32 },
        r#"parameters too deep: task "a" nests its parameters 33 levels, the limit is 32"#,
    );
}

#[test]
fn brackets_inside_strings_do_not_count_as_nesting() {
    let text = one_task_with(json!({"parameters": {"pattern": "[[[[{{{{".repeat(50), "quote": "\\\"[{"}}));
    let spec = accepted(&text);
    assert_eq!(serde_json::from_str::<Value>(&spec.tasks[0].parameters).unwrap()["quote"], "\\\"[{");
}

// ---- document depth ----

/// A job whose deepest point is `depth` levels down, with the deepest `[` on line 5.
fn document_of_depth(depth: usize) -> String {
    // The job object, the task list, the task and the parameters make four levels.
    let arrays = depth - 4;
    format!(
        "{{\n \"name\": \"x\",\n \"tasks\": [\n  {{\"id\": \"a\", \"job_type\": \"noop\", \"parameters\": {{\"p\":\n{}{}}}}}]}}",
        "[".repeat(arrays),
        "]".repeat(arrays)
    )
}

#[test]
fn document_nested_100_levels_reaches_the_parameter_check() {
    check_rejected(
        &document_of_depth(100),
        Problem::ParametersTooDeep { task: "a".into(), depth: 97, limit: 32 },
        r#"parameters too deep: task "a" nests its parameters 97 levels, the limit is 32"#,
    );
}

#[test]
fn document_nested_101_levels_is_too_deep() {
    // The 101st opening bracket is the 97th `[` on line 5.
    check_rejected(
        &document_of_depth(101),
        Problem::TooDeep { line: 5, column: 97 },
        "nesting too deep: more than 100 levels at line 5, column 97 (parameters may nest at most 32 levels)",
    );
}

#[test]
fn document_nested_a_million_levels_is_too_deep_without_recursing() {
    let depth = 1_000_000;
    let text = format!(r#"{{"name": "x", "tasks": {}{}}}"#, "[".repeat(depth), "]".repeat(depth));
    let (problem, _) = only_problem(&text);
    assert_eq!(problem, Problem::TooDeep { line: 1, column: 23 + 100 });
    let unclosed = "[".repeat(depth);
    let (problem, _) = only_problem(&unclosed);
    assert_eq!(problem, Problem::TooDeep { line: 1, column: 101 });
}

#[test]
fn labels_nested_past_the_document_limit_are_too_deep() {
    // The job, the task list, the task and its labels make four levels.
    let labels_of = |arrays: usize| {
        format!(
            r#"{{"name": "x", "tasks": [{{"id": "a", "job_type": "noop", "labels": {{"k": {}{}}}}}]}}"#,
            "[".repeat(arrays),
            "]".repeat(arrays)
        )
    };
    let text = labels_of(97);
    let (problem, _) = only_problem(&text);
    let first_past = text.match_indices(['{', '[']).nth(100).map(|(at, _)| at + 1).unwrap();
    assert_eq!(problem, Problem::TooDeep { line: 1, column: first_past });
    // One level less is read, and the label refused for what it is.
    let (problem, _) = only_problem(&labels_of(96));
    assert!(matches!(problem, Problem::BadLabel { .. }), "{problem:?}");
}

#[test]
fn a_json_file_that_is_not_utf8_is_refused_naming_the_place() {
    let error = jobfile::parse(b"{\"name\": \"x\",\n \"tasks\": [\"\xff\"]}", Format::Json, "job", &Limits::default())
        .unwrap_err();
    assert_eq!(
        error.problems,
        vec![Problem::Syntax { rule: "syntax", message: "not UTF-8: an invalid byte at line 2 column 13".into() }]
    );
}

/// A YAML job whose parameters hold `arrays` nested arrays, on line 5.
fn yaml_of_arrays(arrays: usize) -> String {
    format!(
        "name: x\ntasks:\n  - id: a\n    job_type: noop\n    parameters: {{p: {}{}}}\n",
        "[".repeat(arrays),
        "]".repeat(arrays)
    )
}

#[test]
fn yaml_nested_too_deep_is_too_deep() {
    let parse = |text: &str| jobfile::parse(text.as_bytes(), Format::Yaml, "deep.yaml", &Limits::default());
    // Four levels above the arrays: 96 arrays make 100 levels, 97 make 101.
    assert_eq!(
        parse(&yaml_of_arrays(96)).unwrap_err().problems,
        vec![Problem::ParametersTooDeep { task: "a".into(), depth: 97, limit: 32 }]
    );
    // Found after conversion to JSON, where the YAML position is gone.
    let error = parse(&yaml_of_arrays(97)).unwrap_err();
    assert_eq!(error.problems, vec![Problem::TooDeep { line: 0, column: 0 }]);
    assert_eq!(
        error.to_string(),
        "invalid job deep.yaml: nesting too deep: more than 100 levels (parameters may nest at most 32 levels)"
    );
    // Found by the YAML reader itself, which stops at 128 levels and knows where.
    for arrays in [125, 200, 5_000] {
        let error = parse(&yaml_of_arrays(arrays)).unwrap_err();
        assert!(matches!(error.problems[..], [Problem::TooDeep { line: 5, .. }]), "{arrays}: {error}");
        let message = error.to_string();
        assert!(message.starts_with("invalid job deep.yaml: nesting too deep: more than 100 levels at line 5, column "));
        assert!(!message.contains("recursion"), "{message}");
    }
}

#[test]
fn toml_nested_too_deep_is_refused_by_the_toml_reader() {
    let toml_of_arrays = |arrays: usize| {
        format!(
            "name = \"x\"\n[[tasks]]\nid = \"a\"\njob_type = \"noop\"\nparameters = {{ p = {}{} }}\n",
            "[".repeat(arrays),
            "]".repeat(arrays)
        )
    };
    let parse = |text: &str| jobfile::parse(text.as_bytes(), Format::Toml, "deep.toml", &Limits::default());
    assert_eq!(
        parse(&toml_of_arrays(78)).unwrap_err().problems,
        vec![Problem::ParametersTooDeep { task: "a".into(), depth: 79, limit: 32 }]
    );
    // The TOML reader refuses inline values nested 80 levels, before the document check can.
    for arrays in [80, 101, 100_000] {
        let error = parse(&toml_of_arrays(arrays)).unwrap_err();
        let [Problem::Syntax { rule: "syntax", message }] = &error.problems[..] else {
            panic!("{arrays}: expected one syntax problem, got: {error}")
        };
        assert!(message.starts_with("recursion limit exceeded at line 5 column "), "{arrays}: {message}");
    }
}

#[test]
fn a_toml_or_yaml_file_that_is_not_utf8_is_refused_naming_the_place() {
    for format in [Format::Toml, Format::Yaml] {
        let error = jobfile::parse(b"name = \"x\"\n[[t\xe9\xff", format, "job", &Limits::default()).unwrap_err();
        assert_eq!(
            error.problems,
            vec![Problem::Syntax { rule: "syntax", message: "not UTF-8: an invalid byte at line 2 column 4".into() }],
            "{format:?}"
        );
    }
}

#[test]
fn a_yaml_syntax_error_names_its_line_and_column() {
    // The reader names a character it cannot read by its byte offset, and
    // a place at the document's first character not at all.
    for (text, message) in [
        (&b"name: x\ntasks: [\x00]\n"[..], "control characters are not allowed at line 2 column 9"),
        (b"name: \xc3\xa9\ntasks: [\x01]", "control characters are not allowed at line 2 column 9"),
        (b"\x00", "control characters are not allowed at line 1 column 1"),
        (b":", "did not find expected key, while parsing a block mapping at line 1 column 1"),
        (
            b"name: [x\n",
            "did not find expected ',' or ']' at line 2 column 1, while parsing a flow sequence at line 1 column 7",
        ),
    ] {
        let error = jobfile::parse(text, Format::Yaml, "job.yaml", &Limits::default()).unwrap_err();
        assert_eq!(error.problems, vec![Problem::Syntax { rule: "syntax", message: message.into() }]);
    }
}

#[test]
fn a_list_too_short_for_a_job_is_a_wrong_length_not_a_syntax_error() {
    let error = jobfile::parse(b"[\"x\"]", Format::Json, "job.json", &Limits::default()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid job job.json: wrong length: invalid length 1, expected struct JobFile with 3 elements at line 1 column 5"
    );
    let error = jobfile::parse(b"- x\n", Format::Yaml, "job.yaml", &Limits::default()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid job job.yaml: wrong length: invalid length 1, expected struct JobFile with 3 elements"
    );
}

#[test]
fn a_priority_that_is_not_a_name_is_a_wrong_type_in_every_format() {
    let expected = "wrong type: invalid type: integer `2`, expected one of `low`, `normal`, `high`, `critical`";
    let json = r#"{"name":"j","tasks":[{"id":"a","job_type":"noop","priority":2}]}"#;
    let toml = "name = \"j\"\n[[tasks]]\nid = \"a\"\njob_type = \"noop\"\npriority = 2\n";
    let yaml = "name: j\ntasks:\n  - id: a\n    job_type: noop\n    priority: 2\n";
    for (text, format, name, place) in [
        (json, Format::Json, "job.json", " at line 1 column 61"),
        (toml, Format::Toml, "job.toml", ""),
        (yaml, Format::Yaml, "job.yaml", ""),
    ] {
        let error = jobfile::parse(text.as_bytes(), format, name, &Limits::default()).unwrap_err();
        assert_eq!(error.to_string(), format!("invalid job {name}: {expected}{place}"));
    }
    let named = r#"{"name":"j","tasks":[{"id":"a","job_type":"noop","priority":"high"}]}"#;
    let spec = jobfile::parse(named.as_bytes(), Format::Json, "job.json", &Limits::default()).unwrap();
    assert_eq!(spec.tasks[0].priority.as_str(), "high");
}

#[test]
fn a_number_in_parameters_reads_back_as_written_whatever_its_digits() {
    let literal =
        "505555555555555555555555555555555555555555555555555555555555555555555555555555555555555555555555555551";
    let exact: f64 = literal.parse().unwrap();
    let yaml = format!("name: j\ntasks:\n  - id: a\n    job_type: noop\n    parameters: {{x: {literal}}}\n");
    let json = format!(r#"{{"name":"j","tasks":[{{"id":"a","job_type":"noop","parameters":{{"x":{literal}}}}}]}}"#);
    for (text, format) in [(yaml, Format::Yaml), (json, Format::Json)] {
        let spec = jobfile::parse(text.as_bytes(), format, "job", &Limits::default()).unwrap();
        let parameters: serde_json::Value = serde_json::from_str(&spec.tasks[0].parameters).unwrap();
        assert_eq!(parameters["x"].as_f64(), Some(exact), "{format:?}: {}", spec.tasks[0].parameters);
        // Written again and read back, it is the same number.
        let again: serde_json::Value = serde_json::from_str(&parameters.to_string()).unwrap();
        assert_eq!(again["x"].as_f64(), Some(exact), "{format:?}: written back as {parameters}");
    }
}

#[test]
fn parameters_with_a_number_beyond_a_double_are_refused() {
    let json = r#"{"name":"x","tasks":[{"id":"a","job_type":"noop","parameters":{"p":9999629999E96966}}]}"#;
    let error = jobfile::parse(json.as_bytes(), Format::Json, "job.json", &Limits::default()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid job job.json: parameters: task \"a\" has parameters that a worker could not read back: number out of range"
    );
}

#[test]
fn parameters_are_read_through_at_every_depth_as_a_worker_reads_them() {
    let job = |parameters: &str| {
        format!(r#"{{"name":"x","tasks":[{{"id":"a","job_type":"noop","parameters":{parameters}}}]}}"#)
    };
    let readable = r#"{"a":[1e308,-1.7e308,18446744073709551616,-9223372036854775809,"\u00e9",null,true,{"b":[[]]}]}"#;
    assert_eq!(&*accepted(&job(readable)).tasks[0].parameters, readable);
    for unreadable in [r#"{"a":[1,{"b":-1e400}]}"#, r#"{"a":{"b":{"c":[2E999]}}}"#] {
        let (problem, _) = only_problem(&job(unreadable));
        assert!(matches!(problem, Problem::ParametersUnreadable { .. }), "{unreadable}: {problem:?}");
    }
}

#[test]
fn a_toml_syntax_error_names_its_line_and_column() {
    let parse = |text: &str| jobfile::parse(text.as_bytes(), Format::Toml, "job.toml", &Limits::default());
    // The reader's message is one line, and the column counts characters.
    let error = parse("name = \"x\"\n[[tasks]\nid = 1\n").unwrap_err();
    assert_eq!(
        error.problems,
        vec![Problem::Syntax {
            rule: "syntax",
            message: "invalid table header: expected `.`, `]]` at line 2 column 8".into()
        }]
    );
    let error = parse("name = \"é\" x\n").unwrap_err();
    assert_eq!(error.to_string(), "invalid job job.toml: syntax: expected newline, `#` at line 1 column 12");
}

// ---- limits on size ----

#[test]
fn more_tasks_than_the_limit() {
    let limits = Limits { max_tasks: 3, ..Limits::default() };
    let three = job(vec![task("a", &[]), task("b", &[]), task("c", &[])]);
    assert_eq!(parse_with(&three, &limits).unwrap().len(), 3);
    let four = job(vec![task("a", &[]), task("b", &[]), task("c", &[]), task("d", &[])]);
    let error = rejected_with(&four, &limits);
    assert_eq!(error.problems, vec![Problem::TooManyTasks { count: 4, limit: 3 }]);
    assert_eq!(error.to_string(), "invalid job job.json: too many tasks: 4, the limit is 3");
}

#[test]
fn more_edges_than_the_limit() {
    let limits = Limits { max_edges: 2, ..Limits::default() };
    let two = job(vec![task("a", &[]), task("b", &["a"]), task("c", &["b"])]);
    assert_eq!(parse_with(&two, &limits).unwrap().dag.n_edges(), 2);
    let three = job(vec![task("a", &[]), task("b", &["a"]), task("c", &["a", "b"])]);
    let error = rejected_with(&three, &limits);
    assert_eq!(error.problems, vec![Problem::TooManyEdges { count: 3, limit: 2 }]);
    assert_eq!(error.to_string(), "invalid job job.json: too many dependencies: 3 edges, the limit is 2");
}

#[test]
fn input_larger_than_the_file_limit() {
    let text = job(vec![task("a", &[])]);
    let exact = Limits { max_file_bytes: text.len() as u64, ..Limits::default() };
    assert_eq!(parse_with(&text, &exact).unwrap().len(), 1);
    let limits = Limits { max_file_bytes: text.len() as u64 - 1, ..Limits::default() };
    let error = rejected_with(&text, &limits);
    assert_eq!(error.problems, vec![Problem::FileTooLarge { bytes: text.len() as u64, limit: limits.max_file_bytes }]);
    assert_eq!(
        error.to_string(),
        format!("invalid job job.json: file too large: {} bytes, the limit is {}", text.len(), text.len() - 1)
    );
}

#[test]
fn file_larger_than_the_file_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.json");
    let text = job(vec![task("a", &[]), task("b", &["a"])]);
    std::fs::write(&path, &text).unwrap();
    let exact = Limits { max_file_bytes: text.len() as u64, ..Limits::default() };
    assert_eq!(jobfile::read_file(&path, &exact).unwrap().len(), 2);
    let limits = Limits { max_file_bytes: 10, ..Limits::default() };
    let error = jobfile::read_file(&path, &limits).unwrap_err();
    assert_eq!(error.source_name, path.display().to_string());
    assert_eq!(error.problems, vec![Problem::FileTooLarge { bytes: text.len() as u64, limit: 10 }]);
    assert_eq!(
        error.to_string(),
        format!("invalid job {}: file too large: {} bytes, the limit is 10", path.display(), text.len())
    );
}

#[test]
fn missing_file_is_unreadable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.json");
    let error = jobfile::read_file(&path, &Limits::default()).unwrap_err();
    assert!(matches!(&error.problems[..], [Problem::Unreadable { .. }]), "{error}");
    assert!(error.to_string().starts_with(&format!("invalid job {}: unreadable: ", path.display())), "{error}");
}

// ---- job name, job type, labels ----

#[test]
fn bad_job_names() {
    let long = "n".repeat(257);
    for (name, reason) in [
        ("", "must not be empty"),
        ("   ", "must not be empty"),
        ("nightly\u{7}", "must not contain control characters"),
        ("two\nlines", "must not contain control characters"),
        ("tab\there", "must not contain control characters"),
        (long.as_str(), "longer than 256 bytes"),
    ] {
        let text = json!({"name": name, "tasks": [{"id": "a", "job_type": "noop"}]}).to_string();
        check_rejected(&text, Problem::BadName { reason: reason.into() }, &format!("job name: {reason}"));
    }
    let text = json!({"name": "n".repeat(256), "tasks": [{"id": "a", "job_type": "noop"}]}).to_string();
    assert_eq!(accepted(&text).name.len(), 256);
    let text = json!({"name": "Nightly maintenance, rack 7 (ünïcode)", "tasks": [{"id": "a", "job_type": "noop"}]});
    assert_eq!(accepted(&text.to_string()).name, "Nightly maintenance, rack 7 (ünïcode)");
}

#[test]
fn bad_job_types() {
    for (job_type, reason) in [
        (String::new(), "is empty".to_string()),
        ("no op".into(), r#""no op" may use ASCII letters, digits and _ - . only"#.into()),
        ("ec/7".into(), r#""ec/7" may use ASCII letters, digits and _ - . only"#.into()),
        ("t".repeat(129), "is longer than 128 bytes".into()),
    ] {
        check_rejected(
            &json!({"name": "x", "tasks": [{"id": "a", "job_type": job_type}]}).to_string(),
            Problem::BadJobType { task: "a".into(), reason: reason.clone() },
            &format!(r#"job type: task "a" {reason}"#),
        );
    }
    let longest = "t".repeat(128);
    for job_type in ["erasure_coding", "Vacuum-2.v1", longest.as_str()] {
        let spec = accepted(&json!({"name": "x", "tasks": [{"id": "a", "job_type": job_type}]}).to_string());
        assert_eq!(&*spec.tasks[0].job_type, job_type);
    }
}

#[test]
fn bad_labels() {
    let not_scalar = "must be a string, number or boolean";
    for (labels, key, reason) in [
        (json!({"owner": {"team": "storage"}}), "owner", not_scalar.to_string()),
        (json!({"racks": [1, 2]}), "racks", not_scalar.to_string()),
        (json!({"owner": null}), "owner", not_scalar.to_string()),
        (json!({"": "x"}), "", "has an empty key".to_string()),
        (json!({"note": "n".repeat(4097)}), "note", "is longer than 4096 bytes".to_string()),
    ] {
        check_rejected(
            &one_task_with(json!({"labels": labels})),
            Problem::BadLabel { task: "a".into(), key: key.into(), reason: reason.clone() },
            &format!(r#"label: task "a" label {key:?} {reason}"#),
        );
    }
}

#[test]
fn labels_are_stored_as_strings() {
    let spec = accepted(&one_task_with(
        json!({"labels": {"team": "storage", "volume_id": 7, "ratio": 0.5, "hot": true, "note": "n".repeat(4096)}}),
    ));
    let labels = &spec.tasks[0].labels;
    assert_eq!(labels["team"], "storage");
    assert_eq!(labels["volume_id"], "7");
    assert_eq!(labels["ratio"], "0.5");
    assert_eq!(labels["hot"], "true");
    assert_eq!(labels["note"].len(), 4096);
}

// ---- several problems ----

#[test]
fn several_problems_are_reported_together() {
    let text = json!({"name": "", "tasks": [
        {"id": "ok", "job_type": "noop"},
        {"id": "a b", "job_type": "noop", "depends_on": ["ok", "missing", "ok"]},
        {"id": "ok", "job_type": "no op", "labels": {"x": []}},
    ]})
    .to_string();
    let error = rejected(&text);
    assert_eq!(
        error.problems,
        vec![
            Problem::BadName { reason: "must not be empty".into() },
            Problem::IdCharacter { id: "a b".into(), character: ' ' },
            Problem::DuplicateId { id: "ok".into(), first: 0, second: 2 },
            Problem::UnknownDependency { task: "a b".into(), dependency: "missing".into() },
            Problem::DuplicateDependency { task: "a b".into(), dependency: "ok".into() },
            Problem::BadJobType {
                task: "ok".into(),
                reason: r#""no op" may use ASCII letters, digits and _ - . only"#.into()
            },
            Problem::BadLabel {
                task: "ok".into(),
                key: "x".into(),
                reason: "must be a string, number or boolean".into()
            },
        ]
    );
    let expected = [
        "invalid job job.json: 7 problems",
        "  - job name: must not be empty",
        r#"  - id character: task "a b" uses ' '; ids may use ASCII letters, digits and . _ - : / @"#,
        r#"  - duplicate id: "ok" is declared by task #0 and task #2"#,
        r#"  - unknown dependency: task "a b" depends on "missing", which is not in the job"#,
        r#"  - duplicate dependency: task "a b" lists "ok" more than once"#,
        r#"  - job type: task "ok" "no op" may use ASCII letters, digits and _ - . only"#,
        r#"  - label: task "ok" label "x" must be a string, number or boolean"#,
    ]
    .join("\n");
    assert_eq!(error.to_string(), expected);
}

#[test]
fn empty_job_with_a_bad_name_reports_both() {
    let error = rejected(r#"{"name": " ", "tasks": []}"#);
    assert_eq!(error.problems, vec![Problem::BadName { reason: "must not be empty".into() }, Problem::EmptyJob]);
    assert_eq!(
        error.to_string(),
        "invalid job job.json: 2 problems\n  - job name: must not be empty\n  - empty job: a job needs at least one task"
    );
}

#[test]
fn problems_stop_at_twenty_across_tasks() {
    let tasks = (0..30).map(|i| task(&format!("bad id {i}"), &[])).collect();
    let error = rejected(&job(tasks));
    assert_eq!(error.problems.len(), 20);
    assert_eq!(error.problems[19], Problem::IdCharacter { id: "bad id 19".into(), character: ' ' });
    let message = error.to_string();
    assert!(message.starts_with("invalid job job.json: 20 problems\n  - id character: task \"bad id 0\""));
    assert!(message.ends_with("\n  (stopped after 20 problems)"), "{message}");
}

#[test]
fn problems_stop_at_twenty_inside_one_task() {
    let missing: Vec<String> = (0..1000).map(|i| format!("missing-{i}")).collect();
    let missing: Vec<&str> = missing.iter().map(String::as_str).collect();
    let error = rejected(&job(vec![task("a", &missing)]));
    assert_eq!(error.problems.len(), 20);
    assert_eq!(error.problems[0], Problem::UnknownDependency { task: "a".into(), dependency: "missing-0".into() });
    assert!(error.to_string().ends_with("\n  (stopped after 20 problems)"));

    let labels: serde_json::Map<String, Value> = (0..100).map(|i| (format!("l{i}"), json!([i]))).collect();
    let error = rejected(&one_task_with(json!({"labels": labels})));
    assert_eq!(error.problems.len(), 20);
    assert!(error.problems.iter().all(|p| matches!(p, Problem::BadLabel { task, .. } if task == "a")));
}

// ---- TOML and YAML ----

const EXAMPLE_JSON: &str = r#"{"name": "nightly-maintenance",
 "tasks": [
   {"id": "vacuum-7", "job_type": "vacuum", "parameters": {"volume_id": 7}, "depends_on": []},
   {"id": "ec-7", "job_type": "erasure_coding", "parameters": {"volume_id": 7, "codec": {"data": 10, "parity": 4}},
    "depends_on": ["vacuum-7"], "priority": "high", "labels": {"volume_id": "7", "hot": true},
    "retry_limit": 2, "retry_backoff_seconds": 5, "execution_timeout_seconds": 600}
 ]}"#;

const EXAMPLE_TOML: &str = r#"
name = "nightly-maintenance"

[[tasks]]
id = "vacuum-7"
job_type = "vacuum"
parameters = { volume_id = 7 }
depends_on = []

[[tasks]]
id = "ec-7"
job_type = "erasure_coding"
depends_on = ["vacuum-7"]
priority = "high"
labels = { volume_id = "7", hot = true }
retry_limit = 2
retry_backoff_seconds = 5
execution_timeout_seconds = 600

[tasks.parameters]
volume_id = 7
codec = { data = 10, parity = 4 }
"#;

const EXAMPLE_YAML: &str = r#"
name: nightly-maintenance
tasks:
  - id: vacuum-7
    job_type: vacuum
    parameters: {volume_id: 7}
    depends_on: []
  - id: ec-7
    job_type: erasure_coding
    parameters:
      volume_id: 7
      codec: {data: 10, parity: 4}
    depends_on: [vacuum-7]
    priority: high
    labels: {volume_id: "7", hot: true}
    retry_limit: 2
    retry_backoff_seconds: 5
    execution_timeout_seconds: 600
"#;

/// The spec with its fingerprint cleared and its parameters in one canonical
/// JSON form. A JSON file's parameters are kept as written (spacing and key
/// order included); TOML and YAML parameters are re-encoded, so only their
/// content can be compared.
fn normalized(mut spec: JobSpec) -> JobSpec {
    spec.fingerprint = [0; 32];
    for task in &mut spec.tasks {
        let value: Value = serde_json::from_str(&task.parameters).unwrap();
        task.parameters = value.to_string().into_boxed_str();
    }
    spec
}

#[test]
fn toml_and_yaml_parse_to_the_same_spec_as_json() {
    let limits = Limits::default();
    let from_json = jobfile::parse(EXAMPLE_JSON.as_bytes(), Format::Json, "job.json", &limits).unwrap();
    let from_toml = jobfile::parse(EXAMPLE_TOML.as_bytes(), Format::Toml, "job.toml", &limits).unwrap();
    let from_yaml = jobfile::parse(EXAMPLE_YAML.as_bytes(), Format::Yaml, "job.yaml", &limits).unwrap();
    assert_ne!(from_json.fingerprint, from_toml.fingerprint);
    assert_ne!(from_json.fingerprint, from_yaml.fingerprint);
    assert_eq!(from_json.tasks[1].labels["hot"], "true");
    let from_json = normalized(from_json);
    assert_eq!(from_json, normalized(from_toml));
    assert_eq!(from_json, normalized(from_yaml));
}

#[test]
fn read_file_picks_the_format_from_the_extension() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits::default();
    let mut specs = Vec::new();
    for (name, text) in [
        ("job.json", EXAMPLE_JSON),
        ("job.toml", EXAMPLE_TOML),
        ("job.TOML", EXAMPLE_TOML),
        ("job.yaml", EXAMPLE_YAML),
        ("job.yml", EXAMPLE_YAML),
        ("job.txt", EXAMPLE_JSON),
        ("job", EXAMPLE_JSON),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let spec = jobfile::read_file(&path, &limits).unwrap_or_else(|e| panic!("{name}: {e}"));
        specs.push(normalized(spec));
    }
    assert!(specs.iter().all(|spec| *spec == specs[0]));

    // TOML under a name that says JSON is read as JSON, and fails as JSON.
    let path = dir.path().join("toml-in-disguise.json");
    std::fs::write(&path, EXAMPLE_TOML).unwrap();
    let error = jobfile::read_file(&path, &limits).unwrap_err();
    assert!(matches!(error.problems[..], [Problem::Syntax { rule: "syntax", .. }]), "{error}");
}

#[test]
fn format_from_path() {
    use std::path::Path;
    for (path, format) in [
        ("a.json", Format::Json),
        ("a.toml", Format::Toml),
        ("dir.d/a.Toml", Format::Toml),
        ("a.yaml", Format::Yaml),
        ("a.YML", Format::Yaml),
        ("a.json5", Format::Json),
        ("a", Format::Json),
    ] {
        assert_eq!(Format::from_path(Path::new(path)), format, "{path}");
    }
}

#[test]
fn unknown_field_in_toml_is_reported() {
    let text = "name = \"t\"\n\n[[tasks]]\nid = \"a\"\njob_type = \"noop\"\nretries = 3\n";
    let error = jobfile::parse(text.as_bytes(), Format::Toml, "job.toml", &Limits::default()).unwrap_err();
    let [Problem::Syntax { rule: "unknown field", message }] = &error.problems[..] else {
        panic!("expected one unknown field, got: {error}")
    };
    assert!(message.starts_with("unknown field `retries`, expected one of `id`"), "{message}");
    // The position would be in the JSON the TOML was turned into, so it is left out.
    assert!(!message.contains(" at line "), "{message}");

    let text = "name = \"t\"\nowner = \"me\"\n\n[[tasks]]\nid = \"a\"\njob_type = \"noop\"\n";
    let error = jobfile::parse(text.as_bytes(), Format::Toml, "job.toml", &Limits::default()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid job job.toml: unknown field: unknown field `owner`, expected one of `name`, `tasks`, `priority`"
    );
}

#[test]
fn unknown_field_in_yaml_is_reported() {
    let text = "name: t\ntasks:\n  - id: a\n    job_type: noop\n    owner: me\n";
    let error = jobfile::parse(text.as_bytes(), Format::Yaml, "job.yaml", &Limits::default()).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("invalid job job.yaml: unknown field: unknown field `owner`, expected one of `id`"),
        "{error}"
    );
}

#[test]
fn validation_rules_apply_to_toml_too() {
    let text = "name = \"t\"\n[[tasks]]\nid = \"a\"\njob_type = \"noop\"\ndepends_on = [\"a\"]\n";
    let error = jobfile::parse(text.as_bytes(), Format::Toml, "job.toml", &Limits::default()).unwrap_err();
    assert_eq!(error.problems, vec![Problem::SelfDependency { task: "a".into() }]);
    assert_eq!(error.to_string(), r#"invalid job job.toml: self-dependency: task "a" depends on itself"#);
}

#[test]
fn malformed_toml_and_yaml_are_syntax_errors() {
    let error = jobfile::parse(b"name = \"t\"\n[[tasks]\n", Format::Toml, "bad.toml", &Limits::default()).unwrap_err();
    assert!(matches!(error.problems[..], [Problem::Syntax { rule: "syntax", .. }]), "{error}");
    let error = jobfile::parse(b"name: [unclosed\n", Format::Yaml, "bad.yaml", &Limits::default()).unwrap_err();
    assert!(matches!(error.problems[..], [Problem::Syntax { rule: "syntax", .. }]), "{error}");
    let error = jobfile::parse(b"name = \"\xff\"", Format::Toml, "bad.toml", &Limits::default()).unwrap_err();
    assert!(error.to_string().starts_with("invalid job bad.toml: syntax: not UTF-8: "), "{error}");
}

// ---- order ----

#[test]
fn task_order_and_dependency_order_do_not_matter() {
    let forward = job(vec![
        task("a", &[]),
        task("b", &["a"]),
        task("c", &["a", "b"]),
        task("d", &["b", "c", "a"]),
        task("e", &[]),
    ]);
    let backward = job(vec![
        task("e", &[]),
        task("d", &["a", "c", "b"]),
        task("c", &["b", "a"]),
        task("b", &["a"]),
        task("a", &[]),
    ]);
    let forward = accepted(&forward);
    let backward = accepted(&backward);
    let expected: BTreeSet<(String, String)> = [("b", "a"), ("c", "a"), ("c", "b"), ("d", "a"), ("d", "b"), ("d", "c")]
        .into_iter()
        .map(|(task, parent)| (task.to_string(), parent.to_string()))
        .collect();
    assert_eq!(edges(&forward), expected);
    assert_eq!(edges(&backward), expected);
    let roots = |spec: &JobSpec| -> BTreeSet<String> {
        spec.dag.roots().map(|t| spec.tasks[t as usize].id.to_string()).collect()
    };
    assert_eq!(roots(&forward), BTreeSet::from(["a".to_string(), "e".to_string()]));
    assert_eq!(roots(&backward), roots(&forward));
}

// ---- large jobs ----

/// A chain `t0 <- t1 <- ... <- t{n-1}`; with `closed`, `t0` also depends on the last task.
fn chain(n: usize, closed: bool) -> String {
    let mut text = String::with_capacity(n * 64);
    text.push_str(r#"{"name":"chain","tasks":["#);
    for i in 0..n {
        if i > 0 {
            text.push(',');
        }
        let dependency = match i {
            0 if closed => format!(r#""t{}""#, n - 1),
            0 => String::new(),
            _ => format!(r#""t{}""#, i - 1),
        };
        write!(text, r#"{{"id":"t{i}","job_type":"noop","depends_on":[{dependency}]}}"#).unwrap();
    }
    text.push_str("]}");
    text
}

#[test]
fn million_task_chain_validates() {
    // The test thread's small default stack is the point: nothing may recurse per task.
    // About 13 s in a debug build, so the full million stays.
    let n = 1_000_000;
    let spec = accepted(&chain(n, false));
    assert_eq!(spec.len(), n);
    assert_eq!(spec.dag.n_edges(), n - 1);
    assert_eq!(spec.dag.roots().collect::<Vec<_>>(), vec![0]);
    assert_eq!(spec.dag.parents(n as u32 - 1), &[n as u32 - 2]);
}

/// `n` independent tasks and a task "report" that depends on all of them
/// (in reverse order), and on `extra` as well.
fn fan_in(n: usize, extra: &[&str]) -> String {
    let mut text = String::from(r#"{"name":"fan-in","tasks":["#);
    for i in 0..n {
        write!(text, r#"{{"id":"t{i}","job_type":"noop"}},"#).unwrap();
    }
    text.push_str(r#"{"id":"report","job_type":"noop","depends_on":["#);
    let mut dependencies: Vec<String> = (0..n).rev().map(|i| format!(r#""t{i}""#)).collect();
    dependencies.extend(extra.iter().map(|id| format!("{id:?}")));
    text.push_str(&dependencies.join(","));
    text.push_str("]}]}");
    text
}

#[test]
fn task_depending_on_a_hundred_thousand_others_validates() {
    // Repeated dependencies are found by sorting, not by a scan per dependency.
    let n = 100_000;
    let spec = accepted(&fan_in(n, &[]));
    assert_eq!(spec.dag.n_edges(), n);
    assert_eq!(spec.dag.parents(n as u32).len(), n);
    assert_eq!(spec.dag.roots().count(), n);

    let error = rejected(&fan_in(n, &["t7"]));
    assert_eq!(error.problems, vec![Problem::DuplicateDependency { task: "report".into(), dependency: "t7".into() }]);
}

#[test]
fn hundred_thousand_task_cycle_is_reported() {
    let n = 100_000;
    let error = rejected(&chain(n, true));
    let [Problem::Cycle { path }] = &error.problems[..] else { panic!("expected one cycle, got: {error}") };
    assert_eq!(path.len(), n);
    // Each task depends on the next in the path: t{i} on t{i-1}, t0 on t{n-1}.
    let number = |id: &String| id[1..].parse::<usize>().unwrap();
    for (position, id) in path.iter().enumerate() {
        let next = &path[(position + 1) % n];
        assert_eq!(number(next), (number(id) + n - 1) % n, "{id} then {next}");
    }
    let message = error.to_string();
    assert!(message.starts_with("invalid job job.json: cycle: "), "{}", &message[..200]);
    assert!(message.contains(" depends on ... (99990 more) depends on "), "{message}");
    assert!(message.ends_with(&format!(" depends on {:?} (100000 tasks)", path[0])), "{message}");
}

#[test]
fn output_into_a_pipe_closed_early_ends_quietly() {
    // `jobcenter validate FILE | head -0`: the reader is gone before the first line.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_jobcenter"))
        .args(["validate", concat!(env!("CARGO_MANIFEST_DIR"), "/examples/nine-tasks.json")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(output.status.code(), Some(141), "ends as a shell expects of a closed pipe: {stderr}");
}

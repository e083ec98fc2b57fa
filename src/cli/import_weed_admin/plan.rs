//! What each job type's settings in a `weed admin -dataDir` become as
//! jobcenter policy settings: pure, no I/O. Every value weed admin stores for
//! a job type gives one [`Line`]: the policy setting it sets, or why it is not
//! mapped.
//!
//! | weed admin (`plugin/job_types/TYPE/config.pb`) | jobcenter policy setting |
//! |---|---|
//! | `admin_runtime.enabled` | `detection_enabled` (1 or 0) |
//! | `admin_runtime.detection_interval_minutes` | `detection_interval_seconds` (× 60) |
//! | `admin_runtime.detection_timeout_seconds` | `detection_timeout_seconds` |
//! | `admin_runtime.max_jobs_per_detection` | `max_jobs_per_detection` |
//! | `admin_runtime.global_execution_concurrency` | `global_execution_concurrency` (at most 128, as weed admin runs it) |
//! | `admin_runtime.per_worker_execution_concurrency` | `per_worker_execution_concurrency` |
//! | `admin_runtime.retry_limit` | `retry_limit` |
//! | `admin_runtime.retry_backoff_seconds` | `retry_backoff_seconds` |
//! | `admin_runtime.job_type_max_runtime_seconds` | `job_type_max_runtime_seconds` |
//! | `admin_runtime.execution_timeout_seconds` | `execution_timeout_seconds` (at least 90, as weed admin runs it) |
//! | `admin_config_values.NAME` | `admin.NAME` |
//! | `worker_config_values.NAME` | `worker.NAME` |
//!
//! A runtime value of 0 or less (but `retry_limit`) leaves weed admin to
//! the worker's descriptor; jobcenter takes the same from the worker, so it
//! is not set. A configuration value is set only when `policy set` reads
//! its text back as the same value (a number, true/false or text); lists,
//! maps, bytes and durations are not mapped.

use std::collections::BTreeMap;
use std::fmt;

use crate::policy::{self, Overrides};
use crate::proto::plugin::config_value::Kind;
use crate::proto::plugin::{AdminRuntimeConfig, ConfigValue, PersistedJobTypeConfig};

/// The job types the workers of SeaweedFS 4.48 serve (`weed worker -jobType=all`).
pub(super) const KNOWN_JOB_TYPES: [&str; 7] =
    ["admin_script", "ec_balance", "erasure_coding", "iceberg_maintenance", "s3_lifecycle", "vacuum", "volume_balance"];

/// The most executions of one job type weed admin runs at once.
const WEED_MAX_CONCURRENCY: u32 = 128;
/// weed admin gives an execution at least this long.
const WEED_MIN_EXECUTION_TIMEOUT: u32 = 90;

const LEFT_TO_THE_WORKER: &str =
    "0 or less leaves it to the worker's descriptor, which jobcenter also takes from the worker";

/// What the data directory holds under `plugin/job_types/`, one entry each.
#[derive(Debug)]
pub(super) enum Entry {
    /// A job type's directory.
    JobType(Box<JobTypeFiles>),
    /// Anything else (a file where weed admin keeps directories).
    Stray(String),
}

/// A job type's directory.
#[derive(Debug)]
pub(super) struct JobTypeFiles {
    pub job_type: String,
    /// `config.pb`, decoded; `None` when there is none.
    pub config: Option<PersistedJobTypeConfig>,
    /// Names of the entries beside it that weed admin does not write.
    pub unknown_files: Vec<String>,
}

/// One value found, and what becomes of it.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Line {
    pub job_type: String,
    /// The weed admin setting and its value, as shown.
    pub weed: String,
    pub outcome: Outcome,
}

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Outcome {
    Set {
        /// The name `policy set` takes.
        setting: String,
        /// The text `policy set` takes.
        text: String,
        /// Why the value differs from weed admin's, when it does.
        note: Option<&'static str>,
    },
    NotMapped(String),
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.job_type, self.weed)?;
        match &self.outcome {
            Outcome::Set { setting, text, note } => {
                // Text shows quoted; numbers and true/false as they are.
                let shown = if crate::server::policies::parse_value(text).is_string() {
                    format!("{text:?}")
                } else {
                    text.clone()
                };
                write!(f, " -> {setting} = {shown}")?;
                if let Some(note) = note {
                    write!(f, " ({note})")?;
                }
                Ok(())
            }
            Outcome::NotMapped(why) => write!(f, ": not mapped: {why}"),
        }
    }
}

/// The lines of one entry, in a stable order.
pub(super) fn plan(entry: &Entry) -> Vec<Line> {
    match entry {
        Entry::Stray(name) => {
            let why = "a file where weed admin keeps one directory per job type".to_string();
            vec![Line {
                job_type: name.clone(),
                weed: format!("plugin/job_types/{name}"),
                outcome: Outcome::NotMapped(why),
            }]
        }
        Entry::JobType(files) => plan_job_type(files),
    }
}

fn plan_job_type(files: &JobTypeFiles) -> Vec<Line> {
    let job_type = files.job_type.as_str();
    let line = |weed: String, outcome: Outcome| Line { job_type: job_type.to_string(), weed, outcome };
    if !KNOWN_JOB_TYPES.contains(&job_type) {
        let why = "not a job type of SeaweedFS 4.48's workers; set its policy with `jobcenter policy set`";
        return vec![line(format!("plugin/job_types/{job_type}"), Outcome::NotMapped(why.into()))];
    }
    let mut lines: Vec<Line> = files
        .unknown_files
        .iter()
        .map(|name| line(format!("file {name}"), Outcome::NotMapped("not a file weed admin writes".into())))
        .collect();
    let Some(config) = &files.config else {
        let why = "weed admin ran the job type on its worker's defaults, which jobcenter also takes from the worker";
        lines.push(line("no config.pb".into(), Outcome::NotMapped(why.into())));
        return lines;
    };
    match &config.admin_runtime {
        Some(runtime) => lines.extend(runtime_lines(runtime).into_iter().map(|(weed, o)| line(weed, o))),
        None => {
            let why =
                "weed admin ran the job type on its worker's defaults, which jobcenter also takes from the worker";
            lines.push(line("no admin_runtime".into(), Outcome::NotMapped(why.into())));
        }
    }
    for (group, prefix, values) in [
        ("admin_config_values", "admin.", &config.admin_config_values),
        ("worker_config_values", "worker.", &config.worker_config_values),
    ] {
        lines.extend(value_lines(group, prefix, values).into_iter().map(|(weed, o)| line(weed, o)));
    }
    lines
}

/// How a runtime value becomes a policy value.
#[derive(Clone, Copy)]
enum Rule {
    /// Positive values as they are.
    Positive,
    /// Positive minutes, as seconds.
    Minutes,
    /// 0 and more as they are; below 0, 0.
    Retries,
    /// Positive values, capped.
    AtMost(u32, &'static str),
    /// Positive values, raised to a floor.
    AtLeast(u32, &'static str),
}

struct Field {
    weed: &'static str,
    setting: &'static str,
    read: fn(&AdminRuntimeConfig) -> i32,
    rule: Rule,
}

const FIELDS: [Field; 9] = [
    Field {
        weed: "detection_interval_minutes",
        setting: "detection_interval_seconds",
        read: |r| r.detection_interval_minutes,
        rule: Rule::Minutes,
    },
    Field {
        weed: "detection_timeout_seconds",
        setting: "detection_timeout_seconds",
        read: |r| r.detection_timeout_seconds,
        rule: Rule::Positive,
    },
    Field {
        weed: "max_jobs_per_detection",
        setting: "max_jobs_per_detection",
        read: |r| r.max_jobs_per_detection,
        rule: Rule::Positive,
    },
    Field {
        weed: "global_execution_concurrency",
        setting: "global_execution_concurrency",
        read: |r| r.global_execution_concurrency,
        rule: Rule::AtMost(WEED_MAX_CONCURRENCY, "weed admin runs at most 128 at once"),
    },
    Field {
        weed: "per_worker_execution_concurrency",
        setting: "per_worker_execution_concurrency",
        read: |r| r.per_worker_execution_concurrency,
        rule: Rule::Positive,
    },
    Field { weed: "retry_limit", setting: "retry_limit", read: |r| r.retry_limit, rule: Rule::Retries },
    Field {
        weed: "retry_backoff_seconds",
        setting: "retry_backoff_seconds",
        read: |r| r.retry_backoff_seconds,
        rule: Rule::Positive,
    },
    Field {
        weed: "job_type_max_runtime_seconds",
        setting: "job_type_max_runtime_seconds",
        read: |r| r.job_type_max_runtime_seconds,
        rule: Rule::Positive,
    },
    Field {
        weed: "execution_timeout_seconds",
        setting: "execution_timeout_seconds",
        read: |r| r.execution_timeout_seconds,
        rule: Rule::AtLeast(WEED_MIN_EXECUTION_TIMEOUT, "weed admin gives an execution at least 90 s"),
    },
];

/// The policy value of a runtime value, with a note when it differs from
/// what is stored; `Err` says why it is not mapped.
fn runtime_value(rule: Rule, value: i32) -> Result<(u32, Option<&'static str>), &'static str> {
    let positive = u32::try_from(value).ok().filter(|v| *v > 0);
    match rule {
        Rule::Retries => Ok(match positive {
            Some(v) => (v, None),
            None if value == 0 => (0, None),
            None => (0, Some("weed admin runs a limit below 0 as no retries")),
        }),
        Rule::Positive => positive.map(|v| (v, None)).ok_or(LEFT_TO_THE_WORKER),
        Rule::Minutes => positive.map(|v| (v.saturating_mul(60), None)).ok_or(LEFT_TO_THE_WORKER),
        Rule::AtMost(max, note) => {
            positive.map(|v| if v > max { (max, Some(note)) } else { (v, None) }).ok_or(LEFT_TO_THE_WORKER)
        }
        Rule::AtLeast(min, note) => {
            positive.map(|v| if v < min { (min, Some(note)) } else { (v, None) }).ok_or(LEFT_TO_THE_WORKER)
        }
    }
}

fn runtime_lines(runtime: &AdminRuntimeConfig) -> Vec<(String, Outcome)> {
    let enabled = Outcome::Set {
        setting: "detection_enabled".into(),
        text: if runtime.enabled { "1" } else { "0" }.into(),
        note: None,
    };
    let mut lines = vec![(format!("admin_runtime.enabled = {}", runtime.enabled), enabled)];
    for field in &FIELDS {
        let value = (field.read)(runtime);
        let outcome = match runtime_value(field.rule, value) {
            Ok((mapped, note)) => Outcome::Set { setting: field.setting.into(), text: mapped.to_string(), note },
            Err(why) => Outcome::NotMapped(why.into()),
        };
        lines.push((format!("admin_runtime.{} = {value}", field.weed), outcome));
    }
    lines
}

fn value_lines(group: &str, prefix: &str, values: &BTreeMap<String, ConfigValue>) -> Vec<(String, Outcome)> {
    values
        .iter()
        .map(|(name, value)| {
            let weed = format!("{group}.{name} = {}", describe(value));
            let outcome = match setting_text(value) {
                Ok(text) => Outcome::Set { setting: format!("{prefix}{name}"), text, note: None },
                Err(why) => Outcome::NotMapped(why),
            };
            (weed, outcome)
        })
        .collect()
}

/// A configuration value as shown in a line.
fn describe(value: &ConfigValue) -> String {
    let count = |n: usize, what: &str| format!("a list of {n} {what}");
    match &value.kind {
        None => "no value".into(),
        Some(Kind::BoolValue(b)) => b.to_string(),
        Some(Kind::Int64Value(i)) => i.to_string(),
        Some(Kind::DoubleValue(d)) => format!("{d:?}"),
        Some(Kind::StringValue(s)) => format!("{s:?}"),
        Some(Kind::BytesValue(b)) => format!("{} bytes", b.len()),
        Some(Kind::DurationValue(d)) => format!("a duration of {} s", d.seconds),
        Some(Kind::StringList(l)) => count(l.values.len(), "texts"),
        Some(Kind::Int64List(l)) => count(l.values.len(), "whole numbers"),
        Some(Kind::DoubleList(l)) => count(l.values.len(), "numbers"),
        Some(Kind::BoolList(l)) => count(l.values.len(), "true/false values"),
        Some(Kind::ListValue(l)) => count(l.values.len(), "values"),
        Some(Kind::MapValue(m)) => format!("a map of {} values", m.fields.len()),
    }
}

/// The text `policy set` reads back as exactly this value, or why there is none.
fn setting_text(value: &ConfigValue) -> Result<String, String> {
    let text = match &value.kind {
        None => return Err("it holds no value".into()),
        Some(Kind::BoolValue(b)) => b.to_string(),
        Some(Kind::Int64Value(i)) => i.to_string(),
        Some(Kind::DoubleValue(d)) if d.is_finite() => format!("{d:?}"),
        Some(Kind::DoubleValue(_)) => return Err("not a finite number".into()),
        Some(Kind::StringValue(s)) if s == "default" => {
            return Err("`policy set` takes the text \"default\" as: remove what was set".into())
        }
        Some(Kind::StringValue(s)) => s.clone(),
        Some(_) => return Err("`policy set` takes a number, true/false or text".into()),
    };
    let read_back = crate::wire::json_to_value(&crate::server::policies::parse_value(&text));
    if read_back.as_ref() != Some(value) {
        return Err(format!("`policy set` would read the text {text:?} as a number or true/false"));
    }
    Ok(text)
}

/// The changes to set, by job type (`policy set` names and texts).
pub(super) fn changes(lines: &[Line]) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for line in lines {
        if let Outcome::Set { setting, text, .. } = &line.outcome {
            out.entry(line.job_type.clone()).or_default().insert(setting.clone(), text.clone());
        }
    }
    out
}

/// Checks every job type's policy settings as the admin will, so that a plan
/// the admin would refuse is refused before anything is set.
pub(super) fn check(changes: &BTreeMap<String, BTreeMap<String, String>>) -> Result<(), String> {
    for (job_type, values) in changes {
        let settings: BTreeMap<String, String> =
            values.iter().filter(|(name, _)| !name.contains('.')).map(|(n, v)| (n.clone(), v.clone())).collect();
        policy::apply_changes(&Overrides::new(), &settings).map_err(|e| format!("{job_type}: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    use crate::proto::plugin::StringList;

    fn value(kind: Kind) -> ConfigValue {
        ConfigValue { kind: Some(kind) }
    }

    fn check_plan(entry: Entry, expect: Expect) {
        let lines: Vec<String> = plan(&entry).iter().map(Line::to_string).collect();
        expect.assert_eq(&lines.join("\n"));
    }

    fn job_type(job_type: &str, config: Option<PersistedJobTypeConfig>) -> Entry {
        Entry::JobType(Box::new(JobTypeFiles { job_type: job_type.into(), config, unknown_files: Vec::new() }))
    }

    #[test]
    fn runtime_values_become_policy_settings() {
        let runtime = AdminRuntimeConfig {
            enabled: true,
            detection_interval_minutes: 23,
            detection_timeout_seconds: 0,
            max_jobs_per_detection: 7,
            global_execution_concurrency: 200,
            per_worker_execution_concurrency: 2,
            retry_limit: -1,
            retry_backoff_seconds: 15,
            job_type_max_runtime_seconds: 1234,
            execution_timeout_seconds: 45,
        };
        let config = PersistedJobTypeConfig { admin_runtime: Some(runtime), ..Default::default() };
        check_plan(
            job_type("vacuum", Some(config)),
            expect![[r#"
                vacuum: admin_runtime.enabled = true -> detection_enabled = 1
                vacuum: admin_runtime.detection_interval_minutes = 23 -> detection_interval_seconds = 1380
                vacuum: admin_runtime.detection_timeout_seconds = 0: not mapped: 0 or less leaves it to the worker's descriptor, which jobcenter also takes from the worker
                vacuum: admin_runtime.max_jobs_per_detection = 7 -> max_jobs_per_detection = 7
                vacuum: admin_runtime.global_execution_concurrency = 200 -> global_execution_concurrency = 128 (weed admin runs at most 128 at once)
                vacuum: admin_runtime.per_worker_execution_concurrency = 2 -> per_worker_execution_concurrency = 2
                vacuum: admin_runtime.retry_limit = -1 -> retry_limit = 0 (weed admin runs a limit below 0 as no retries)
                vacuum: admin_runtime.retry_backoff_seconds = 15 -> retry_backoff_seconds = 15
                vacuum: admin_runtime.job_type_max_runtime_seconds = 1234 -> job_type_max_runtime_seconds = 1234
                vacuum: admin_runtime.execution_timeout_seconds = 45 -> execution_timeout_seconds = 90 (weed admin gives an execution at least 90 s)"#]],
        );
    }

    #[test]
    fn a_disabled_job_type_is_not_detected_and_zero_retries_are_kept() {
        let runtime = AdminRuntimeConfig { enabled: false, retry_limit: 0, ..Default::default() };
        let config = PersistedJobTypeConfig { admin_runtime: Some(runtime), ..Default::default() };
        let lines = plan(&job_type("erasure_coding", Some(config)));
        let set: BTreeMap<String, String> = changes(&lines).remove("erasure_coding").unwrap_or_default();
        assert_eq!(set, BTreeMap::from([("detection_enabled".into(), "0".into()), ("retry_limit".into(), "0".into())]));
    }

    #[test]
    fn configuration_values_are_set_when_they_read_back_the_same() {
        let admin = BTreeMap::from([
            ("collection_filter".to_string(), value(Kind::StringValue("ec_only".into()))),
            ("script".to_string(), value(Kind::StringValue("volume.list\nvolume.fix.replication -apply".into()))),
            ("empty".to_string(), value(Kind::StringValue(String::new()))),
            ("looks_like_a_number".to_string(), value(Kind::StringValue("30".into()))),
            ("reset_word".to_string(), value(Kind::StringValue("default".into()))),
        ]);
        let worker = BTreeMap::from([
            ("fullness_ratio".to_string(), value(Kind::DoubleValue(0.77))),
            ("whole_ratio".to_string(), value(Kind::DoubleValue(1.0))),
            ("min_size_mb".to_string(), value(Kind::Int64Value(31))),
            ("flag".to_string(), value(Kind::BoolValue(false))),
            ("not_a_number".to_string(), value(Kind::DoubleValue(f64::NAN))),
            ("tags".to_string(), value(Kind::StringList(StringList { values: vec!["ssd".into(), "fast".into()] }))),
            ("nothing".to_string(), ConfigValue { kind: None }),
        ]);
        let config =
            PersistedJobTypeConfig { admin_config_values: admin, worker_config_values: worker, ..Default::default() };
        check_plan(
            job_type("erasure_coding", Some(config)),
            expect![[r#"
                erasure_coding: no admin_runtime: not mapped: weed admin ran the job type on its worker's defaults, which jobcenter also takes from the worker
                erasure_coding: admin_config_values.collection_filter = "ec_only" -> admin.collection_filter = "ec_only"
                erasure_coding: admin_config_values.empty = "" -> admin.empty = ""
                erasure_coding: admin_config_values.looks_like_a_number = "30": not mapped: `policy set` would read the text "30" as a number or true/false
                erasure_coding: admin_config_values.reset_word = "default": not mapped: `policy set` takes the text "default" as: remove what was set
                erasure_coding: admin_config_values.script = "volume.list\nvolume.fix.replication -apply" -> admin.script = "volume.list\nvolume.fix.replication -apply"
                erasure_coding: worker_config_values.flag = false -> worker.flag = false
                erasure_coding: worker_config_values.fullness_ratio = 0.77 -> worker.fullness_ratio = 0.77
                erasure_coding: worker_config_values.min_size_mb = 31 -> worker.min_size_mb = 31
                erasure_coding: worker_config_values.not_a_number = NaN: not mapped: not a finite number
                erasure_coding: worker_config_values.nothing = no value: not mapped: it holds no value
                erasure_coding: worker_config_values.tags = a list of 2 texts: not mapped: `policy set` takes a number, true/false or text
                erasure_coding: worker_config_values.whole_ratio = 1.0 -> worker.whole_ratio = 1.0"#]],
        );
    }

    #[test]
    fn unknown_job_types_and_files_are_not_mapped() {
        check_plan(
            job_type("lance_compact", Some(PersistedJobTypeConfig::default())),
            expect![[
                r#"lance_compact: plugin/job_types/lance_compact: not mapped: not a job type of SeaweedFS 4.48's workers; set its policy with `jobcenter policy set`"#
            ]],
        );
        check_plan(
            Entry::Stray("notes.txt".into()),
            expect![[
                r#"notes.txt: plugin/job_types/notes.txt: not mapped: a file where weed admin keeps one directory per job type"#
            ]],
        );
        let files = JobTypeFiles { job_type: "vacuum".into(), config: None, unknown_files: vec!["extra.bin".into()] };
        check_plan(
            Entry::JobType(Box::new(files)),
            expect![[r#"
                vacuum: file extra.bin: not mapped: not a file weed admin writes
                vacuum: no config.pb: not mapped: weed admin ran the job type on its worker's defaults, which jobcenter also takes from the worker"#]],
        );
    }

    #[test]
    fn every_planned_setting_is_one_the_admin_takes() {
        let runtime = AdminRuntimeConfig {
            enabled: true,
            detection_interval_minutes: i32::MAX,
            detection_timeout_seconds: 1,
            max_jobs_per_detection: 1,
            global_execution_concurrency: 1,
            per_worker_execution_concurrency: 1,
            retry_limit: i32::MIN,
            retry_backoff_seconds: 1,
            job_type_max_runtime_seconds: i32::MAX,
            execution_timeout_seconds: i32::MAX,
        };
        let config = PersistedJobTypeConfig { admin_runtime: Some(runtime), ..Default::default() };
        let planned = changes(&plan(&job_type("vacuum", Some(config))));
        assert_eq!(planned["vacuum"].len(), 10);
        assert_eq!(check(&planned), Ok(()));
        let refused =
            BTreeMap::from([("vacuum".to_string(), BTreeMap::from([("max_jobs_per_detection".into(), "0".into())]))]);
        assert!(check(&refused).unwrap_err().starts_with("vacuum: "));
    }
}

//! Per-job-type policy: dispatch limits, retries and timeouts. Each value
//! comes from, in order of precedence, what an operator set, the job type's
//! descriptor (sent by its worker), or the defaults.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::dispatch::TypeLimits;
use crate::model::Priority;
use crate::proto::plugin::{AdminRuntimeConfig, AdminRuntimeDefaults};
use crate::windows::{self, OnClose};

/// The settings of one job type.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Policy {
    pub global_execution_concurrency: u32,
    pub per_worker_execution_concurrency: u32,
    pub retry_limit: u32,
    pub retry_backoff_seconds: u32,
    /// 0: no limit.
    pub execution_timeout_seconds: u32,
    pub job_type_max_runtime_seconds: u32,
    /// How often the scheduler asks a detector what needs doing.
    pub detection_interval_seconds: u32,
    pub detection_timeout_seconds: u32,
    pub max_jobs_per_detection: u32,
    /// 0 turns detection off for the job type.
    pub detection_enabled: u32,
    /// The priority of its tasks when neither the task nor its job names one.
    pub priority: Priority,
    /// Tasks started per minute, over every worker; 0: no limit.
    pub rate_per_minute: u32,
    /// Tasks that may start at once after a quiet spell, within the rate.
    pub rate_burst: u32,
    /// When it may run: weekly ranges (`windows::parse_windows`), or `always`.
    pub windows: String,
    /// When it may not, whatever the windows say (`windows::parse_blackouts`), or `none`.
    pub blackouts: String,
    /// What runs when a window closes: drained (within the grace), or canceled.
    pub on_window_close: OnClose,
    /// How long a drain waits before it cancels; 0: without bound.
    pub window_grace_seconds: u32,
    /// 1: its tasks share the bandwidth budget (by default those of
    /// `budget::DEFAULT_TYPES`); 0: they do not.
    pub uses_bandwidth_budget: u32,
}

/// The detection interval of a job type whose descriptor names none.
pub(crate) fn default_detection_interval(job_type: &str) -> u32 {
    match job_type {
        "vacuum" => 2 * 3600,
        "volume_balance" => 30 * 60,
        "erasure_coding" => 5 * 60,
        _ => 3600,
    }
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            detection_interval_seconds: 3600,
            detection_timeout_seconds: 45,
            max_jobs_per_detection: 1000,
            detection_enabled: 1,
            global_execution_concurrency: 1,
            per_worker_execution_concurrency: 1,
            retry_limit: 0,
            retry_backoff_seconds: 5,
            execution_timeout_seconds: 0,
            job_type_max_runtime_seconds: 1800,
            priority: Priority::Normal,
            rate_per_minute: 0,
            rate_burst: 1,
            windows: windows::ALWAYS.to_string(),
            blackouts: windows::NONE.to_string(),
            on_window_close: OnClose::Drain,
            window_grace_seconds: 1800,
            uses_bandwidth_budget: 0,
        }
    }
}

/// Names of the settings, as `jobcenter policy set` takes them.
pub(crate) const SETTINGS: [&str; 14] = [
    "detection_interval_seconds",
    "detection_timeout_seconds",
    "max_jobs_per_detection",
    "detection_enabled",
    "global_execution_concurrency",
    "per_worker_execution_concurrency",
    "retry_limit",
    "retry_backoff_seconds",
    "execution_timeout_seconds",
    "job_type_max_runtime_seconds",
    "rate_per_minute",
    "rate_burst",
    "window_grace_seconds",
    "uses_bandwidth_budget",
];

/// Names of the settings that take words rather than a number, each read
/// by its own rule (`Policy::set_text`).
pub(crate) const TEXT_SETTINGS: [&str; 4] = ["priority", "windows", "blackouts", "on_window_close"];

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Error {
    #[error("unknown policy setting {name:?}; settings are {}, {}, and worker.NAME for a worker configuration value", SETTINGS.join(", "), TEXT_SETTINGS.join(", "))]
    UnknownSetting { name: String },
    /// A setting that takes words, given words its rule refuses.
    #[error("policy setting {name}: {rule}")]
    Refused { name: String, rule: String },
    #[error("policy setting {name} must be a whole number, not {value:?}")]
    NotANumber { name: String, value: String },
    #[error("policy setting {name} must be at least 1")]
    Zero { name: String },
}

/// A value an operator set: a number, or the words of a setting in
/// `TEXT_SETTINGS`. Stored as JSON, a number or a string.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum Value {
    Number(u32),
    Text(String),
}

impl From<u32> for Value {
    fn from(number: u32) -> Value {
        Value::Number(number)
    }
}

/// Values an operator set, by setting name.
pub(crate) type Overrides = BTreeMap<String, Value>;

/// Where a value of an effective policy came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    Default,
    Descriptor,
    Set,
}

impl Source {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Source::Default => "default",
            Source::Descriptor => "descriptor",
            Source::Set => "set",
        }
    }
}

impl Policy {
    fn slot(&mut self, name: &str) -> Option<&mut u32> {
        Some(match name {
            "global_execution_concurrency" => &mut self.global_execution_concurrency,
            "per_worker_execution_concurrency" => &mut self.per_worker_execution_concurrency,
            "retry_limit" => &mut self.retry_limit,
            "retry_backoff_seconds" => &mut self.retry_backoff_seconds,
            "execution_timeout_seconds" => &mut self.execution_timeout_seconds,
            "job_type_max_runtime_seconds" => &mut self.job_type_max_runtime_seconds,
            "detection_interval_seconds" => &mut self.detection_interval_seconds,
            "detection_timeout_seconds" => &mut self.detection_timeout_seconds,
            "max_jobs_per_detection" => &mut self.max_jobs_per_detection,
            "detection_enabled" => &mut self.detection_enabled,
            "rate_per_minute" => &mut self.rate_per_minute,
            "rate_burst" => &mut self.rate_burst,
            "window_grace_seconds" => &mut self.window_grace_seconds,
            "uses_bandwidth_budget" => &mut self.uses_bandwidth_budget,
            _ => return None,
        })
    }

    /// Sets a setting that takes words, by its rule; `Err` names what the rule wants.
    fn set_text(&mut self, name: &str, text: &str) -> Result<(), String> {
        match name {
            "priority" => {
                self.priority = Priority::from_name(text)
                    .ok_or_else(|| format!("{text:?} is not a priority; priorities are low, normal, high, critical"))?;
                Ok(())
            }
            "windows" => {
                windows::parse_windows(text)?;
                self.windows = text.to_string();
                Ok(())
            }
            "blackouts" => {
                windows::parse_blackouts(text)?;
                self.blackouts = text.to_string();
                Ok(())
            }
            "on_window_close" => {
                self.on_window_close = text.parse()?;
                Ok(())
            }
            _ => Err("not a setting that takes words".into()),
        }
    }

    /// The settings that take words, as an operator would type them.
    pub(crate) fn texts(&self) -> Vec<(&'static str, String)> {
        vec![
            ("priority", self.priority.as_str().to_string()),
            ("windows", self.windows.clone()),
            ("blackouts", self.blackouts.clone()),
            ("on_window_close", self.on_window_close.as_str().to_string()),
        ]
    }

    /// The effective policy of a job type and where each value came from.
    pub(crate) fn resolve(
        job_type: &str,
        builtin: Option<Policy>,
        descriptor: Option<&AdminRuntimeDefaults>,
        overrides: &Overrides,
    ) -> (Policy, BTreeMap<String, Source>) {
        let mut policy = builtin.unwrap_or_default();
        policy.detection_interval_seconds = default_detection_interval(job_type);
        policy.uses_bandwidth_budget = u32::from(crate::budget::DEFAULT_TYPES.contains(&job_type));
        let mut sources: BTreeMap<String, Source> =
            SETTINGS.iter().chain(&TEXT_SETTINGS).map(|s| (s.to_string(), Source::Default)).collect();
        if let Some(d) = descriptor {
            let from_descriptor = [
                ("global_execution_concurrency", d.global_execution_concurrency),
                ("per_worker_execution_concurrency", d.per_worker_execution_concurrency),
                ("retry_limit", d.retry_limit),
                ("retry_backoff_seconds", d.retry_backoff_seconds),
                ("execution_timeout_seconds", d.execution_timeout_seconds),
                ("job_type_max_runtime_seconds", d.job_type_max_runtime_seconds),
                ("detection_interval_seconds", d.detection_interval_minutes.saturating_mul(60)),
                ("detection_timeout_seconds", d.detection_timeout_seconds),
                ("max_jobs_per_detection", d.max_jobs_per_detection),
            ];
            for (name, value) in from_descriptor {
                // A descriptor leaves a value it does not set at 0; retries may really be 0.
                if value > 0 || (name == "retry_limit" && value == 0 && d.enabled) {
                    if let (Some(slot), Ok(value)) = (policy.slot(name), u32::try_from(value)) {
                        *slot = value;
                        sources.insert(name.to_string(), Source::Descriptor);
                    }
                }
            }
        }
        for (name, value) in overrides {
            let set = match value {
                Value::Number(number) => policy.slot(name).map(|slot| *slot = *number).is_some(),
                // Checked when set; a value stored by a later version that
                // this one cannot read leaves the default.
                Value::Text(text) => policy.set_text(name, text).is_ok(),
            };
            if set {
                sources.insert(name.clone(), Source::Set);
            }
        }
        (policy, sources)
    }

    /// Its windows as the engine applies them; `None` when it is always open.
    pub(crate) fn window(&self) -> Option<windows::Window> {
        // Both were read by their rule when set.
        let calendar = windows::Calendar::with_blackouts(
            windows::parse_windows(&self.windows).unwrap_or_default(),
            windows::parse_blackouts(&self.blackouts).unwrap_or_default(),
        );
        (!calendar.is_always()).then_some(windows::Window {
            calendar,
            on_close: self.on_window_close,
            grace_seconds: self.window_grace_seconds,
        })
    }

    pub(crate) fn limits(&self) -> TypeLimits {
        TypeLimits {
            global: self.global_execution_concurrency.max(1),
            per_worker: self.per_worker_execution_concurrency.max(1),
            execution_timeout_seconds: (self.execution_timeout_seconds > 0)
                .then_some(u64::from(self.execution_timeout_seconds)),
            rate: (self.rate_per_minute > 0)
                .then(|| crate::rate::Rate { per_minute: self.rate_per_minute, burst: self.rate_burst.max(1) }),
        }
    }

    /// The policy as the worker stream carries it.
    pub(crate) fn to_runtime(&self) -> AdminRuntimeConfig {
        let int = |v: u32| i32::try_from(v).unwrap_or(i32::MAX);
        AdminRuntimeConfig {
            enabled: true,
            detection_interval_minutes: 0,
            detection_timeout_seconds: 45,
            max_jobs_per_detection: 1000,
            global_execution_concurrency: int(self.global_execution_concurrency),
            per_worker_execution_concurrency: int(self.per_worker_execution_concurrency),
            retry_limit: int(self.retry_limit),
            retry_backoff_seconds: int(self.retry_backoff_seconds),
            job_type_max_runtime_seconds: int(self.job_type_max_runtime_seconds),
            execution_timeout_seconds: int(self.execution_timeout_seconds),
        }
    }
}

/// Applies `name=value` changes to an operator's overrides; nothing changes on error.
pub(crate) fn apply_changes(overrides: &Overrides, changes: &BTreeMap<String, String>) -> Result<Overrides, Error> {
    let mut out = overrides.clone();
    for (name, value) in changes {
        let text = TEXT_SETTINGS.contains(&name.as_str());
        if !text && !SETTINGS.contains(&name.as_str()) {
            return Err(Error::UnknownSetting { name: name.clone() });
        }
        if value == "default" {
            out.remove(name);
            continue;
        }
        if text {
            let value = value.trim();
            Policy::default().set_text(name, value).map_err(|rule| Error::Refused { name: name.clone(), rule })?;
            out.insert(name.clone(), Value::Text(value.to_string()));
            continue;
        }
        let number: u32 =
            value.trim().parse().map_err(|_| Error::NotANumber { name: name.clone(), value: value.clone() })?;
        let must_be_positive = matches!(
            name.as_str(),
            "global_execution_concurrency"
                | "per_worker_execution_concurrency"
                | "detection_interval_seconds"
                | "detection_timeout_seconds"
                | "max_jobs_per_detection"
                | "rate_burst"
        );
        if must_be_positive && number == 0 {
            return Err(Error::Zero { name: name.clone() });
        }
        if name == "uses_bandwidth_budget" && number > 1 {
            return Err(Error::Refused { name: name.clone(), rule: format!("must be 0 or 1, not {number}") });
        }
        out.insert(name.clone(), Value::Number(number));
    }
    Ok(out)
}

/// Refuses overrides whose windows and blackouts leave no open time within
/// `windows::HORIZON_DAYS` of `now`, naming the setting among `changes`
/// that made it so.
pub(crate) fn check_opens(
    job_type: &str,
    overrides: &Overrides,
    changes: &BTreeMap<String, String>,
    now: crate::clock::Timestamp,
) -> Result<(), Error> {
    let (policy, _) = Policy::resolve(job_type, builtin(job_type), None, overrides);
    let Some(window) = policy.window() else { return Ok(()) };
    if window.calendar.next_open(now).is_some() {
        return Ok(());
    }
    let name =
        if changes.contains_key("windows") || !changes.contains_key("blackouts") { "windows" } else { "blackouts" };
    Err(Error::Refused {
        name: name.to_string(),
        rule: format!(
            "with windows {:?} and blackouts {:?} the job type never opens in the next {} days",
            policy.windows,
            policy.blackouts,
            windows::HORIZON_DAYS
        ),
    })
}

/// Defaults of the built-in job types, which are light enough to run many at once.
pub(crate) fn builtin(job_type: &str) -> Option<Policy> {
    matches!(job_type, "noop" | "shell").then(|| Policy {
        global_execution_concurrency: 1024,
        per_worker_execution_concurrency: 1024,
        ..Policy::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_beats_descriptor_beats_default() {
        let descriptor = AdminRuntimeDefaults {
            enabled: true,
            global_execution_concurrency: 4,
            retry_limit: 2,
            retry_backoff_seconds: 0,
            ..AdminRuntimeDefaults::default()
        };
        let overrides = Overrides::from([("retry_limit".to_string(), 5.into())]);
        let (policy, sources) = Policy::resolve("vacuum", None, Some(&descriptor), &overrides);
        assert_eq!(policy.global_execution_concurrency, 4);
        assert_eq!(sources["global_execution_concurrency"], Source::Descriptor);
        assert_eq!(policy.retry_limit, 5);
        assert_eq!(sources["retry_limit"], Source::Set);
        assert_eq!(policy.retry_backoff_seconds, 5, "a 0 in a descriptor means unset");
        assert_eq!(sources["retry_backoff_seconds"], Source::Default);
        assert_eq!(policy.job_type_max_runtime_seconds, 1800);
        let marked = Overrides::from([("uses_bandwidth_budget".to_string(), 1.into())]);
        let budgeted = |job_type, overrides| Policy::resolve(job_type, None, None, overrides).0.uses_bandwidth_budget;
        assert_eq!(
            [
                budgeted("volume_balance", &Overrides::new()),
                budgeted("vacuum", &Overrides::new()),
                budgeted("rsync", &marked)
            ],
            [1, 0, 1],
            "the types that move data share the budget by default; a policy marks others"
        );
    }

    #[test]
    fn changes_are_checked_before_anything_changes() {
        let base = Overrides::from([("retry_limit".to_string(), 1.into())]);
        let ok = BTreeMap::from([("global_execution_concurrency".to_string(), "8".to_string())]);
        assert_eq!(apply_changes(&base, &ok).unwrap()["global_execution_concurrency"], 8.into());
        let reset = BTreeMap::from([("retry_limit".to_string(), "default".to_string())]);
        assert!(apply_changes(&base, &reset).unwrap().is_empty());
        let unknown = BTreeMap::from([("retries".to_string(), "1".to_string())]);
        assert!(matches!(apply_changes(&base, &unknown), Err(Error::UnknownSetting { .. })));
        let bad = BTreeMap::from([("retry_limit".to_string(), "many".to_string())]);
        assert!(matches!(apply_changes(&base, &bad), Err(Error::NotANumber { .. })));
        let zero = BTreeMap::from([("per_worker_execution_concurrency".to_string(), "0".to_string())]);
        assert!(matches!(apply_changes(&base, &zero), Err(Error::Zero { .. })));
        let words = BTreeMap::from([("priority".to_string(), " high ".to_string())]);
        assert_eq!(apply_changes(&base, &words).unwrap()["priority"], Value::Text("high".into()));
        let marked = BTreeMap::from([("uses_bandwidth_budget".to_string(), "2".to_string())]);
        assert_eq!(
            apply_changes(&base, &marked).unwrap_err().to_string(),
            "policy setting uses_bandwidth_budget: must be 0 or 1, not 2"
        );
        let wrong = BTreeMap::from([("priority".to_string(), "urgent".to_string())]);
        assert_eq!(
            apply_changes(&base, &wrong).unwrap_err().to_string(),
            "policy setting priority: \"urgent\" is not a priority; priorities are low, normal, high, critical"
        );
    }

    #[test]
    fn windows_are_read_by_their_rule_and_a_set_that_never_opens_is_refused() {
        let set = |name: &str, value: &str| {
            let changes = BTreeMap::from([(name.to_string(), value.to_string())]);
            apply_changes(&Overrides::new(), &changes).map(|o| (o, changes))
        };
        assert_eq!(
            set("windows", "Mon-Fry 22:00-06:00 UTC").unwrap_err().to_string(),
            r#"policy setting windows: "Mon-Fry 22:00-06:00 UTC": "Mon-Fry" is not a day; days are Mon..Sun"#
        );
        assert_eq!(
            set("on_window_close", "later").unwrap_err().to_string(),
            r#"policy setting on_window_close: "later" is not what to do when a window closes; it is drain or cancel"#
        );
        assert!(matches!(set("window_grace_seconds", "soon"), Err(Error::NotANumber { .. })));
        let now = crate::clock::Timestamp(1_795_694_400_000);
        let (overrides, changes) = set("windows", "Mon-Fri 22:00-06:00 Europe/Berlin").unwrap();
        assert_eq!(check_opens("vacuum", &overrides, &changes, now), Ok(()));
        let (policy, sources) = Policy::resolve("vacuum", None, None, &overrides);
        assert_eq!(sources["windows"], Source::Set);
        let window = policy.window().expect("windows set");
        assert_eq!((window.on_close, window.grace_seconds), (OnClose::Drain, 1800));

        let mut closed = overrides.clone();
        closed.insert("blackouts".into(), Value::Text("daily 00:00-24:00 UTC".into()));
        let changes = BTreeMap::from([("blackouts".to_string(), "daily 00:00-24:00 UTC".to_string())]);
        assert_eq!(
            check_opens("vacuum", &closed, &changes, now).unwrap_err().to_string(),
            r#"policy setting blackouts: with windows "Mon-Fri 22:00-06:00 Europe/Berlin" and blackouts "daily 00:00-24:00 UTC" the job type never opens in the next 400 days"#
        );
        // None set: always open, and nothing for the engine to apply.
        assert_eq!(Policy::default().window(), None);
    }

    #[test]
    fn overrides_stored_as_numbers_read_back_and_words_take_their_place() {
        let stored: Overrides = serde_json::from_str(r#"{"retry_limit":3,"priority":"low"}"#).unwrap();
        let (policy, sources) = Policy::resolve("vacuum", None, None, &stored);
        assert_eq!((policy.retry_limit, policy.priority), (3, Priority::Low));
        assert_eq!(sources["priority"], Source::Set);
        assert_eq!(serde_json::to_string(&stored).unwrap(), r#"{"priority":"low","retry_limit":3}"#);
        let unreadable: Overrides = serde_json::from_str(r#"{"priority":"someday"}"#).unwrap();
        let (policy, sources) = Policy::resolve("vacuum", None, None, &unreadable);
        assert_eq!((policy.priority, sources["priority"]), (Priority::Normal, Source::Default));
    }
}

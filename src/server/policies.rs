//! The policy book: each job type's descriptor (as its worker sent it) and
//! operator overrides, persisted as settings (written through the engine, with
//! its other steps), and the effective policy the dispatcher applies.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use prost::Message;

use crate::dispatch::TypeLimits;
use crate::engine::{self, EngineHandle};
use crate::policy::{self, Overrides, Policy, Source};
use crate::proto::plugin::{AdminRuntimeConfig, ConfigValue, JobTypeDescriptor};
use crate::windows::Window;

/// A value as typed on the command line: a number, `true`/`false`, or text.
pub(crate) fn parse_value(text: &str) -> serde_json::Value {
    if let Ok(i) = text.parse::<i64>() {
        return serde_json::Value::from(i);
    }
    if let Ok(f) = text.parse::<f64>() {
        return serde_json::Value::from(f);
    }
    match text {
        "true" => serde_json::Value::Bool(true),
        "false" => serde_json::Value::Bool(false),
        _ => serde_json::Value::String(text.to_string()),
    }
}
use crate::store::{self, Store};

const DESCRIPTOR_PREFIX: &str = "descriptor/";
const POLICY_PREFIX: &str = "policy/";
const WORKER_CONFIG_PREFIX: &str = "worker-config/";
const ADMIN_CONFIG_PREFIX: &str = "admin-config/";
/// The bandwidth budget (`budget::Budget` as JSON), when one is set.
const BUDGET_SETTING: &str = "budget/bandwidth";
/// `policy set TYPE worker.NAME=VALUE` sets a worker configuration value.
pub(super) const WORKER_KEY_PREFIX: &str = "worker.";
/// `policy set TYPE admin.NAME=VALUE` sets an admin configuration value.
pub(super) const ADMIN_KEY_PREFIX: &str = "admin.";

type Values = BTreeMap<String, serde_json::Map<String, serde_json::Value>>;

#[derive(Default, PartialEq)]
struct Book {
    descriptors: BTreeMap<String, JobTypeDescriptor>,
    overrides: BTreeMap<String, Overrides>,
    /// Worker configuration values an operator set, by job type.
    worker_values: Values,
    /// Admin configuration values an operator set, by job type.
    admin_values: Values,
    /// The bandwidth budget of the tasks that move data.
    budget: Option<crate::budget::Budget>,
}

/// Applies `prefix.NAME=VALUE` changes (`default` removes one) to what is set.
fn change_values(
    set: Option<&serde_json::Map<String, serde_json::Value>>,
    prefix: &str,
    changes: BTreeMap<String, String>,
) -> serde_json::Map<String, serde_json::Value> {
    let mut values = set.cloned().unwrap_or_default();
    for (key, text) in changes {
        let name = key[prefix.len()..].to_string();
        if text == "default" {
            values.remove(&name);
        } else {
            values.insert(name, parse_value(&text));
        }
    }
    values
}

/// Form defaults with the values an operator set on top.
fn with_set(
    mut values: std::collections::BTreeMap<String, ConfigValue>,
    set: Option<&serde_json::Map<String, serde_json::Value>>,
) -> std::collections::BTreeMap<String, ConfigValue> {
    for (k, v) in set.into_iter().flatten() {
        if let Some(value) = crate::wire::json_to_value(v) {
            values.insert(k.clone(), value);
        }
    }
    values
}

/// What every work order of a job type carries from the book: resolved
/// once per job type and kept until the book changes.
#[derive(Debug, PartialEq)]
pub(crate) struct ForDispatch {
    pub runtime: AdminRuntimeConfig,
    pub admin_values: std::collections::BTreeMap<String, ConfigValue>,
    pub worker_values: std::collections::BTreeMap<String, ConfigValue>,
}

impl ForDispatch {
    /// The admin's runtime settings for one work order: a task's own
    /// execution timeout stands in for its job type's, as it does for the
    /// admin's own deadline, so that a worker stops the execution itself
    /// when no admin is there to.
    pub(crate) fn runtime_for(&self, own_timeout_seconds: Option<u64>) -> AdminRuntimeConfig {
        let mut runtime = self.runtime;
        if let Some(seconds) = own_timeout_seconds {
            runtime.execution_timeout_seconds = i32::try_from(seconds).unwrap_or(i32::MAX);
        }
        runtime
    }
}

/// The book and what was resolved from it, under one lock: a change to the
/// book drops what was resolved in the same critical section, so nothing
/// resolved from the book before it is kept after it.
#[derive(Default)]
struct Locked {
    book: Book,
    for_dispatch: BTreeMap<String, Arc<ForDispatch>>,
    /// Each job type's windows, as read from the book.
    windows: BTreeMap<String, Option<Arc<Window>>>,
    /// Changes made to the book so far: a refresh that read the store
    /// before a change here does not put the book from before it back.
    changes: u64,
    /// What the engine was last told: each job type's limits and windows,
    /// and the budget with the types that share it. Telling it the same
    /// again is skipped (every worker's hello asks for its types).
    told: BTreeMap<String, (TypeLimits, Option<Arc<Window>>)>,
    told_budget: Option<Told>,
}

/// The budget and its marks, as the engine was last told them.
type Told = (Option<crate::budget::Budget>, std::collections::HashMap<Arc<str>, bool>);

impl Locked {
    /// Whether the engine was last told these limits and windows of the
    /// type; if not, they are noted as told.
    fn tell(&mut self, job_type: &str, limits: TypeLimits, window: &Option<Arc<Window>>) -> bool {
        let same = self.told.get(job_type).is_some_and(|(l, w)| {
            *l == limits
                && match (w, window) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    (a, b) => a.is_none() && b.is_none(),
                }
        });
        if !same {
            self.told.insert(job_type.to_string(), (limits, window.clone()));
        }
        !same
    }
}

impl Locked {
    fn for_dispatch(&mut self, job_type: &str) -> Arc<ForDispatch> {
        if let Some(parts) = self.for_dispatch.get(job_type) {
            return parts.clone();
        }
        let parts = Arc::new(ForDispatch {
            runtime: effective(&self.book, job_type).0.to_runtime(),
            admin_values: admin_values(&self.book, job_type),
            worker_values: worker_values(&self.book, job_type),
        });
        self.for_dispatch.insert(job_type.to_string(), parts.clone());
        parts
    }

    fn window(&mut self, job_type: &str) -> Option<Arc<Window>> {
        if let Some(window) = self.windows.get(job_type) {
            return window.clone();
        }
        let window = effective(&self.book, job_type).0.window().map(Arc::new);
        self.windows.insert(job_type.to_string(), window.clone());
        window
    }
}

impl Locked {
    /// Takes a book read from the store when the book here had seen
    /// `before` changes; returns the job types whose descriptor, policy or
    /// values changed. Changed here since, it is not taken: what was read
    /// may be from before that change, and the next refresh reads it again.
    fn take_fresh(&mut self, fresh: Book, before: u64) -> Vec<String> {
        if self.book == fresh || self.changes != before {
            return Vec::new();
        }
        let mut changed: Vec<String> = Vec::new();
        let types: std::collections::BTreeSet<&String> = self
            .descriptors
            .keys()
            .chain(self.overrides.keys())
            .chain(self.worker_values.keys())
            .chain(self.admin_values.keys())
            .chain(fresh.descriptors.keys())
            .chain(fresh.overrides.keys())
            .chain(fresh.worker_values.keys())
            .chain(fresh.admin_values.keys())
            .collect();
        for job_type in types {
            if self.descriptors.get(job_type) != fresh.descriptors.get(job_type)
                || self.overrides.get(job_type) != fresh.overrides.get(job_type)
                || self.worker_values.get(job_type) != fresh.worker_values.get(job_type)
                || self.admin_values.get(job_type) != fresh.admin_values.get(job_type)
            {
                changed.push(job_type.clone());
            }
        }
        **self = fresh;
        changed
    }
}

impl std::ops::Deref for Locked {
    type Target = Book;
    fn deref(&self) -> &Book {
        &self.book
    }
}

impl std::ops::DerefMut for Locked {
    /// Every way to change the book goes through here.
    fn deref_mut(&mut self) -> &mut Book {
        self.for_dispatch.clear();
        self.windows.clear();
        self.changes += 1;
        &mut self.book
    }
}

#[derive(Clone)]
pub(crate) struct Policies {
    engine: EngineHandle,
    book: Arc<Mutex<Locked>>,
}

impl Policies {
    /// Loads what the store holds (blocking: call it off the runtime).
    pub(crate) fn load(store: Arc<dyn Store>, engine: EngineHandle) -> Result<Policies, store::Error> {
        let book = read_book(&*store)?;
        let locked = Locked { book, ..Locked::default() };
        Ok(Policies { engine, book: Arc::new(Mutex::new(locked)) })
    }

    /// Reads the policy book again (blocking: call it off the runtime), as
    /// another admin instance sharing the store may have changed it; returns
    /// the job types whose descriptor, policy or worker values changed.
    pub(crate) fn refresh(&self, store: &dyn Store) -> Result<Vec<String>, store::Error> {
        let before = self.book.lock().expect("policy lock").changes;
        let fresh = read_book(store)?;
        Ok(self.book.lock().expect("policy lock").take_fresh(fresh, before))
    }

    /// Job types with a descriptor or a policy set.
    pub(crate) fn job_types(&self) -> Vec<String> {
        let book = self.book.lock().expect("policy lock");
        let mut types: Vec<String> = book.descriptors.keys().chain(book.overrides.keys()).cloned().collect();
        types.sort();
        types.dedup();
        types
    }

    /// The descriptor a worker sent for the job type, if one did.
    pub(crate) fn descriptor(&self, job_type: &str) -> Option<JobTypeDescriptor> {
        self.book.lock().expect("policy lock").descriptors.get(job_type).cloned()
    }

    pub(crate) fn has_descriptor(&self, job_type: &str) -> bool {
        self.book.lock().expect("policy lock").descriptors.contains_key(job_type)
    }

    pub(crate) fn effective(&self, job_type: &str) -> (Policy, BTreeMap<String, Source>) {
        effective(&self.book.lock().expect("policy lock"), job_type)
    }

    /// What a work order of the job type carries: the effective policy as
    /// the admin's runtime settings, and the admin and worker values.
    pub(crate) fn for_dispatch(&self, job_type: &str) -> Arc<ForDispatch> {
        self.book.lock().expect("policy lock").for_dispatch(job_type)
    }

    pub(crate) async fn save_descriptor(&self, descriptor: JobTypeDescriptor) -> Result<(), engine::Error> {
        let key = format!("{DESCRIPTOR_PREFIX}{}", descriptor.job_type);
        self.engine.put_settings(vec![(key, Some(descriptor.encode_to_vec()))]).await?;
        self.book.lock().expect("policy lock").descriptors.insert(descriptor.job_type.clone(), descriptor);
        Ok(())
    }

    /// Applies `name=value` changes; nothing changes when one is invalid, or
    /// when the windows they leave would not open after `now`.
    pub(crate) async fn set(
        &self,
        job_type: &str,
        changes: &BTreeMap<String, String>,
        audit: Option<crate::model::audit::Entry>,
        now: crate::clock::Timestamp,
    ) -> Result<Result<(), policy::Error>, engine::Error> {
        let (worker_changes, changes): (BTreeMap<String, String>, BTreeMap<String, String>) =
            changes.clone().into_iter().partition(|(k, _)| k.starts_with(WORKER_KEY_PREFIX));
        let (admin_changes, changes): (BTreeMap<String, String>, BTreeMap<String, String>) =
            changes.into_iter().partition(|(k, _)| k.starts_with(ADMIN_KEY_PREFIX));
        let current = self.book.lock().expect("policy lock").overrides.get(job_type).cloned().unwrap_or_default();
        let updated = match policy::apply_changes(&current, &changes) {
            Ok(updated) => updated,
            Err(e) => return Ok(Err(e)),
        };
        if let Err(e) = policy::check_opens(job_type, &updated, &changes, now) {
            return Ok(Err(e));
        }
        let mut settings = Vec::new();
        let [worker_values, admin_values] = {
            let book = self.book.lock().expect("policy lock");
            [
                (&book.worker_values, WORKER_KEY_PREFIX, WORKER_CONFIG_PREFIX, worker_changes),
                (&book.admin_values, ADMIN_KEY_PREFIX, ADMIN_CONFIG_PREFIX, admin_changes),
            ]
            .map(|(set, prefix, setting, changes)| {
                (!changes.is_empty()).then(|| {
                    let values = change_values(set.get(job_type), prefix, changes);
                    let bytes = serde_json::to_vec(&values).expect("values serialize");
                    settings.push((format!("{setting}{job_type}"), Some(bytes)));
                    values
                })
            })
        };
        let bytes = serde_json::to_vec(&updated).expect("overrides serialize");
        settings.push((format!("{POLICY_PREFIX}{job_type}"), Some(bytes)));
        // The change's audit record, in the same step.
        settings.extend(audit.map(crate::model::audit::Entry::into_setting));
        self.engine.put_settings(settings).await?;
        let mut guard = self.book.lock().expect("policy lock");
        let book = &mut **guard;
        for (values, set) in [(worker_values, &mut book.worker_values), (admin_values, &mut book.admin_values)] {
            if let Some(values) = values {
                set.insert(job_type.to_string(), values);
            }
        }
        book.overrides.insert(job_type.to_string(), updated);
        Ok(Ok(()))
    }

    /// The admin configuration values of a job type: its descriptor's
    /// defaults, with what an operator set on top.
    pub(crate) fn admin_values(&self, job_type: &str) -> std::collections::BTreeMap<String, ConfigValue> {
        admin_values(&self.book.lock().expect("policy lock"), job_type)
    }

    /// The worker configuration values of a job type: the descriptor's
    /// defaults, with what an operator set on top.
    pub(crate) fn worker_values(&self, job_type: &str) -> std::collections::BTreeMap<String, ConfigValue> {
        worker_values(&self.book.lock().expect("policy lock"), job_type)
    }

    /// Tells the engine the dispatch limits of a job type, and its windows.
    pub(crate) async fn push_limits(&self, engine: &EngineHandle, job_type: &str) {
        let (limits, window, tell) = {
            let mut locked = self.book.lock().expect("policy lock");
            let limits = effective(&locked, job_type).0.limits();
            let window = locked.window(job_type);
            let tell = locked.tell(job_type, limits, &window);
            (limits, window, tell)
        };
        if tell {
            if engine.set_limits(Arc::from(job_type), limits).await.is_err() {
                tracing::debug!(job_type, "engine stopped before the limits were set");
            }
            if engine.set_window(Arc::from(job_type), window).await.is_err() {
                tracing::debug!(job_type, "engine stopped before the windows were set");
            }
        }
        self.push_budget(engine).await;
    }

    /// A job type's windows, as its policy says (`None`: always open);
    /// read once and kept until the book changes.
    pub(crate) fn window(&self, job_type: &str) -> Option<Arc<Window>> {
        self.book.lock().expect("policy lock").window(job_type)
    }

    /// The bandwidth budget, when one is set.
    pub(crate) fn budget(&self) -> Option<crate::budget::Budget> {
        self.book.lock().expect("policy lock").budget
    }

    /// The job types with a policy or a descriptor whose tasks share the
    /// budget; those with neither share it by `budget::DEFAULT_TYPES`.
    pub(crate) fn budgeted_types(&self) -> Vec<String> {
        let book = self.book.lock().expect("policy lock");
        let mut types: Vec<String> = book
            .descriptors
            .keys()
            .chain(book.overrides.keys())
            .map(String::as_str)
            .chain(crate::budget::DEFAULT_TYPES)
            .filter(|job_type| effective(&book, job_type).0.uses_bandwidth_budget == 1)
            .map(str::to_string)
            .collect();
        types.sort();
        types.dedup();
        types
    }

    /// Tells the engine the bandwidth budget and which job types share it.
    pub(crate) async fn push_budget(&self, engine: &EngineHandle) {
        let (budget, marks) = {
            let mut locked = self.book.lock().expect("policy lock");
            let marks: std::collections::HashMap<Arc<str>, bool> = locked
                .descriptors
                .keys()
                .chain(locked.overrides.keys())
                .map(|job_type| {
                    (Arc::from(job_type.as_str()), effective(&locked, job_type).0.uses_bandwidth_budget == 1)
                })
                .collect();
            let told = (locked.budget, marks);
            if locked.told_budget.as_ref() == Some(&told) {
                return;
            }
            locked.told_budget = Some(told.clone());
            told
        };
        if engine.set_budget(budget, marks).await.is_err() {
            tracing::debug!("engine stopped before the budget was set");
        }
    }

    /// Sets the bandwidth budget (`None` removes it), with its audit record
    /// in the same step, and tells the engine.
    pub(crate) async fn set_budget(
        &self,
        budget: Option<crate::budget::Budget>,
        audit: Option<crate::model::audit::Entry>,
    ) -> Result<(), engine::Error> {
        let bytes = budget.map(|b| serde_json::to_vec(&b).expect("a budget serializes"));
        let mut settings = vec![(BUDGET_SETTING.to_string(), bytes)];
        settings.extend(audit.map(crate::model::audit::Entry::into_setting));
        self.engine.put_settings(settings).await?;
        self.book.lock().expect("policy lock").budget = budget;
        self.push_budget(&self.engine).await;
        Ok(())
    }
}

fn effective(book: &Book, job_type: &str) -> (Policy, BTreeMap<String, Source>) {
    let descriptor = book.descriptors.get(job_type).and_then(|d| d.admin_runtime_defaults.as_ref());
    let overrides = book.overrides.get(job_type).cloned().unwrap_or_default();
    Policy::resolve(job_type, policy::builtin(job_type), descriptor, &overrides)
}

fn admin_values(book: &Book, job_type: &str) -> std::collections::BTreeMap<String, ConfigValue> {
    let form = book.descriptors.get(job_type).and_then(|d| d.admin_config_form.as_ref());
    with_set(form.map(|f| f.default_values.clone()).unwrap_or_default(), book.admin_values.get(job_type))
}

fn worker_values(book: &Book, job_type: &str) -> std::collections::BTreeMap<String, ConfigValue> {
    let mut values = std::collections::BTreeMap::new();
    if let Some(d) = book.descriptors.get(job_type) {
        values = d.worker_default_values.clone();
        if let Some(form) = &d.worker_config_form {
            for (k, v) in &form.default_values {
                values.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    with_set(values, book.worker_values.get(job_type))
}

fn read_book(store: &dyn Store) -> Result<Book, store::Error> {
    let mut book = Book::default();
    let all = store.settings_any(&[
        DESCRIPTOR_PREFIX,
        POLICY_PREFIX,
        WORKER_CONFIG_PREFIX,
        ADMIN_CONFIG_PREFIX,
        BUDGET_SETTING,
    ])?;
    let under = |prefix: &'static str| all.iter().filter(move |(key, _)| key.starts_with(prefix));
    for (key, bytes) in under(DESCRIPTOR_PREFIX) {
        match JobTypeDescriptor::decode(bytes.as_slice()) {
            Ok(descriptor) => {
                book.descriptors.insert(key[DESCRIPTOR_PREFIX.len()..].to_string(), descriptor);
            }
            Err(e) => tracing::warn!(key, error = %e, "skipping an undecodable descriptor"),
        }
    }
    for (key, bytes) in under(POLICY_PREFIX) {
        match serde_json::from_slice::<Overrides>(bytes) {
            Ok(overrides) => {
                book.overrides.insert(key[POLICY_PREFIX.len()..].to_string(), overrides);
            }
            Err(e) => tracing::warn!(key, error = %e, "skipping an unreadable policy"),
        }
    }
    for (key, bytes) in under(WORKER_CONFIG_PREFIX) {
        if let Ok(values) = serde_json::from_slice(bytes) {
            book.worker_values.insert(key[WORKER_CONFIG_PREFIX.len()..].to_string(), values);
        }
    }
    for (key, bytes) in under(ADMIN_CONFIG_PREFIX) {
        if let Ok(values) = serde_json::from_slice(bytes) {
            book.admin_values.insert(key[ADMIN_CONFIG_PREFIX.len()..].to_string(), values);
        }
    }
    for (key, bytes) in under(BUDGET_SETTING) {
        match serde_json::from_slice(bytes) {
            Ok(budget) if key == BUDGET_SETTING => book.budget = Some(budget),
            Ok(_) => {}
            Err(e) => tracing::warn!(key, error = %e, "skipping an unreadable bandwidth budget"),
        }
    }
    Ok(book)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_work_order_carries_follows_every_change_to_the_book() {
        let mut locked = Locked::default();
        let first = locked.for_dispatch("vacuum");
        assert!(Arc::ptr_eq(&first, &locked.for_dispatch("vacuum")), "resolved once, then kept");
        let builtin = first.runtime.retry_limit;

        locked
            .overrides
            .insert("vacuum".into(), Overrides::from([("retry_limit".into(), (builtin as u32 + 4).into())]));
        assert_eq!(locked.for_dispatch("vacuum").runtime.retry_limit, builtin + 4);

        let values = serde_json::Map::from_iter([("threshold".to_string(), serde_json::json!(0.5))]);
        locked.worker_values.insert("vacuum".into(), values.clone());
        locked.admin_values.insert("vacuum".into(), values);
        let now = locked.for_dispatch("vacuum");
        assert!(now.worker_values.contains_key("threshold") && now.admin_values.contains_key("threshold"));

        *locked = Book::default();
        assert_eq!(*locked.for_dispatch("vacuum"), *first, "a book read again replaces what was resolved");
    }

    #[test]
    fn a_book_read_before_a_change_here_does_not_put_the_old_book_back() {
        let mut locked = Locked::default();
        let windows = Overrides::from([("windows".into(), policy::Value::Text("daily 01:00-02:00 UTC".into()))]);
        let read_before = Book::default();
        let before = locked.changes;
        locked.overrides.insert("vacuum".into(), windows.clone());
        assert_eq!(locked.take_fresh(read_before, before), Vec::<String>::new());
        assert!(locked.window("vacuum").is_some(), "the change made here stays");
        // Read after it, another instance's change is taken.
        let mut theirs = Book::default();
        theirs.overrides.insert("balance".into(), windows);
        let before = locked.changes;
        assert_eq!(locked.take_fresh(theirs, before), vec!["balance".to_string(), "vacuum".to_string()]);
        assert!(locked.window("balance").is_some() && locked.window("vacuum").is_none());
    }

    #[test]
    fn a_task_s_own_execution_timeout_stands_in_for_its_job_type_s() {
        let mut locked = Locked::default();
        locked.overrides.insert("vacuum".into(), Overrides::from([("execution_timeout_seconds".into(), 600.into())]));
        let carried = locked.for_dispatch("vacuum");
        assert_eq!(carried.runtime_for(None).execution_timeout_seconds, 600);
        let own = carried.runtime_for(Some(5));
        assert_eq!(own.execution_timeout_seconds, 5);
        assert_eq!(own.retry_limit, carried.runtime.retry_limit, "nothing else changes");
        assert_eq!(carried.runtime_for(Some(u64::MAX)).execution_timeout_seconds, i32::MAX);
    }
}

//! Bandwidth budgets for maintenance traffic: how many bytes per second the
//! tasks that move data may move together, over the cluster and through
//! each volume server, and each running task's share of it. Pure: the engine
//! asks `Shares` what a task may start with and tells it what started and
//! ended; rates are read and shown here too.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::AttemptId;

/// The job types that share the budget unless their policy says otherwise:
/// those of SeaweedFS that copy volumes or shards between servers.
pub(crate) const DEFAULT_TYPES: [&str; 3] = ["volume_balance", "erasure_coding", "ec_balance"];

/// The parameter that carries a task's share, in bytes per second: the
/// name SeaweedFS's workers read.
pub(crate) const PARAMETER: &str = "io_byte_per_second";

/// The least a task starts with when the operator names no minimum: 1 MiB/s.
pub(crate) const DEFAULT_MINIMUM: u64 = 1 << 20;

/// What an operator set: bytes per second over the cluster, optionally
/// through each volume server, and the least share a task starts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Budget {
    pub(crate) cluster: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) per_server: Option<u64>,
    pub(crate) minimum: u64,
}

/// A budget refused, naming the field and the rule.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Error {
    #[error("budget {field}: {text:?} is not a rate: give bytes per second as a number and a unit, such as 200MB/s or 20MiB/s (units B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)")]
    NotARate { field: &'static str, text: String },
    #[error("budget {field}: must be more than 0 B/s (`jobcenter budget clear` removes the budget)")]
    Zero { field: &'static str },
    #[error("budget {field}: {rate} is below the minimum share of one task, {minimum}: no task could start (lower the minimum or raise the budget)")]
    BelowMinimum { field: &'static str, rate: Rate, minimum: Rate },
    #[error("budget cluster: required when no budget is set: the bytes per second every budgeted task shares, such as 200MB/s")]
    NoCluster,
}

/// Bytes per second, shown in the largest unit that divides it (else in
/// MB/s with two decimals).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Rate(pub(crate) u64);

const UNITS: [(&str, u64); 9] = [
    ("TiB", 1 << 40),
    ("TB", 1_000_000_000_000),
    ("GiB", 1 << 30),
    ("GB", 1_000_000_000),
    ("MiB", 1 << 20),
    ("MB", 1_000_000),
    ("KiB", 1 << 10),
    ("kB", 1_000),
    ("B", 1),
];

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.0;
        if bytes >= 1_000_000 && !bytes.is_multiple_of(1_000) && !bytes.is_multiple_of(1 << 10) {
            return write!(f, "{:.2}MB/s", bytes as f64 / 1e6);
        }
        let (unit, size) =
            UNITS.iter().find(|(_, size)| bytes >= *size && bytes.is_multiple_of(*size)).unwrap_or(&("B", 1));
        write!(f, "{}{unit}/s", bytes / size)
    }
}

/// Reads a rate: a number (decimals allowed) and a unit of bytes, with or
/// without `/s`: `200MB/s`, `20MiB/s`, `1.5GB`, `5000000`.
pub(crate) fn parse_rate(field: &'static str, text: &str) -> Result<u64, Error> {
    let not_a_rate = || Error::NotARate { field, text: text.to_string() };
    let trimmed = text.trim();
    let without_per_second = trimmed.strip_suffix("/s").unwrap_or(trimmed).trim_end();
    let split =
        without_per_second.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(without_per_second.len());
    let (number, unit) = without_per_second.split_at(split);
    let unit = unit.trim();
    let size = if unit.is_empty() {
        1
    } else {
        UNITS.iter().find(|(name, _)| name.eq_ignore_ascii_case(unit)).ok_or_else(not_a_rate)?.1
    };
    if number.is_empty() || number.starts_with('.') || number.ends_with('.') {
        return Err(not_a_rate());
    }
    let bytes = match number.parse::<u64>() {
        Ok(whole) => whole.checked_mul(size).ok_or_else(not_a_rate)?,
        Err(_) => {
            let value: f64 = number.parse().map_err(|_| not_a_rate())?;
            let bytes = (value * size as f64).round();
            if !bytes.is_finite() || bytes >= u64::MAX as f64 {
                return Err(not_a_rate());
            }
            bytes as u64
        }
    };
    if bytes == 0 {
        return Err(Error::Zero { field });
    }
    Ok(bytes)
}

/// A change to the budget, as the API takes it: each field a rate as typed,
/// empty to keep what is set; `per_server` `none` removes the per-server part.
#[derive(Clone, Debug, Default)]
pub(crate) struct Change<'a> {
    pub(crate) cluster: &'a str,
    pub(crate) per_server: &'a str,
    pub(crate) minimum: &'a str,
}

impl Budget {
    /// The budget `change` makes of `current`, checked whole: nothing of a
    /// refused change is taken.
    pub(crate) fn changed(current: Option<Budget>, change: &Change<'_>) -> Result<Budget, Error> {
        let rate = |field: &'static str, text: &str| -> Result<Option<u64>, Error> {
            if text.trim().is_empty() {
                Ok(None)
            } else {
                parse_rate(field, text).map(Some)
            }
        };
        let cluster = match (rate("cluster", change.cluster)?, current) {
            (Some(cluster), _) => cluster,
            (None, Some(current)) => current.cluster,
            (None, None) => return Err(Error::NoCluster),
        };
        let per_server = match change.per_server.trim() {
            "none" | "off" => None,
            text => rate("per_server", text)?.or(current.and_then(|c| c.per_server)),
        };
        let minimum = rate("minimum", change.minimum)?.or(current.map(|c| c.minimum)).unwrap_or(DEFAULT_MINIMUM);
        let budget = Budget { cluster, per_server, minimum };
        budget.check()?;
        Ok(budget)
    }

    /// A budget under its own minimum share lets no task start: refused.
    pub(crate) fn check(&self) -> Result<(), Error> {
        let below = |field, rate: u64| Error::BelowMinimum { field, rate: Rate(rate), minimum: Rate(self.minimum) };
        if self.cluster < self.minimum {
            return Err(below("cluster", self.cluster));
        }
        match self.per_server {
            Some(per_server) if per_server < self.minimum => Err(below("per_server", per_server)),
            _ => Ok(()),
        }
    }

    /// How many tasks at the minimum share `rate` holds, at most
    /// `MAX_UNITS`: the slots of its permit in a cluster, each worth
    /// `rate / units`, so never less than the minimum.
    pub(crate) fn units(&self, rate: u64) -> u32 {
        u32::try_from(rate / self.minimum.max(1)).unwrap_or(u32::MAX).clamp(1, MAX_UNITS)
    }
}

/// What a running task holds: its share, and the volume servers it moves
/// data through. Kept in the store while it runs (the engine's `SHARE`
/// settings, as JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Share {
    pub(crate) bytes_per_second: u64,
    pub(crate) job_type: Arc<str>,
    pub(crate) servers: Box<[Arc<str>]>,
}

/// In a cluster, the slots of the budget's permits this instance holds:
/// of the cluster's key, and of each volume server's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) cluster: u32,
    pub(crate) servers: BTreeMap<Arc<str>, u32>,
}

/// The most slots a budget's permit has (each a row of the permits table).
const MAX_UNITS: u32 = 256;

/// The permit key of the cluster's budget, and the prefix of a volume server's.
pub(crate) const CLUSTER_KEY: &str = "budget:cluster";
pub(crate) const SERVER_KEY: &str = "budget:server:";

/// What this instance asks of the budget's permits: per key, the slots in
/// all, whether it has budgeted work, and the slots its running tasks fill.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ask {
    pub(crate) key: String,
    pub(crate) capacity: u32,
    pub(crate) wants: bool,
    pub(crate) running: u32,
}

/// The budget and every running budgeted task's share: what the engine
/// asks before a budgeted task starts.
#[derive(Debug, Default)]
pub(crate) struct Shares {
    budget: Option<Budget>,
    /// Job types marked by their policy; a type not here shares the budget
    /// when it is one of `DEFAULT_TYPES`.
    /// A B-tree: a few job types, looked up for every task dispatched.
    marks: std::collections::BTreeMap<Arc<str>, bool>,
    running: foldhash::HashMap<AttemptId, Share>,
    used: u64,
    used_by_server: HashMap<Arc<str>, u64>,
    /// In a cluster, the part of the budget held here; `None` alone.
    held: Option<Held>,
}

impl Shares {
    pub(crate) fn budget(&self) -> Option<Budget> {
        self.budget
    }

    /// A new budget (or none) and the policies' marks. Running tasks keep
    /// their shares: a worker reads its rate once, when its task starts.
    pub(crate) fn set(&mut self, budget: Option<Budget>, marks: HashMap<Arc<str>, bool>) {
        self.budget = budget;
        self.marks = marks.into_iter().collect();
    }

    /// In a cluster, the slots of the budget's permits held here.
    pub(crate) fn set_held(&mut self, held: Held) {
        self.held = Some(held);
    }

    /// Whether tasks of the type share the budget now.
    pub(crate) fn applies_to(&self, job_type: &str) -> bool {
        self.budget.is_some() && self.marks.get(job_type).copied().unwrap_or_else(|| DEFAULT_TYPES.contains(&job_type))
    }

    /// What this instance may hand out over the cluster.
    fn cluster_limit(&self, budget: &Budget) -> u64 {
        match &self.held {
            None => budget.cluster,
            Some(held) => part(budget.cluster, budget.units(budget.cluster), held.cluster),
        }
    }

    /// What this instance may hand out through one volume server.
    fn server_limit(&self, budget: &Budget, server: &str) -> Option<u64> {
        let per_server = budget.per_server?;
        Some(match &self.held {
            None => per_server,
            Some(held) => part(per_server, budget.units(per_server), held.servers.get(server).copied().unwrap_or(0)),
        })
    }

    /// Whether no budgeted task can start now, whatever servers it touches.
    pub(crate) fn exhausted(&self) -> bool {
        self.budget.is_some_and(|b| self.cluster_limit(&b).saturating_sub(self.used) < b.minimum)
    }

    /// The share a task moving data through `servers` starts with now, or
    /// `None` while it must wait: the budget split evenly over the `wanting`
    /// budgeted tasks (running or able to start, this one included), never
    /// less than the minimum, within what is free over the cluster and
    /// through each of its servers; it waits when that is below the minimum.
    pub(crate) fn offer(&self, servers: &[Arc<str>], wanting: u32) -> Option<u64> {
        let budget = self.budget?;
        let limit = self.cluster_limit(&budget);
        let even = limit / u64::from(wanting.max(1));
        let mut share = even.max(budget.minimum).min(limit.saturating_sub(self.used));
        for server in servers {
            if let Some(limit) = self.server_limit(&budget, server) {
                let used = self.used_by_server.get(server).copied().unwrap_or(0);
                share = share.min(limit.saturating_sub(used));
            }
        }
        (share >= budget.minimum && share > 0).then_some(share)
    }

    /// A budgeted task started with its share.
    pub(crate) fn start(&mut self, attempt: AttemptId, share: Share) {
        self.end(attempt);
        self.used = self.used.saturating_add(share.bytes_per_second);
        for server in share.servers.iter() {
            *self.used_by_server.entry(server.clone()).or_default() += share.bytes_per_second;
        }
        self.running.insert(attempt, share);
    }

    /// A budgeted task ended: its share is free again.
    pub(crate) fn end(&mut self, attempt: AttemptId) -> Option<Share> {
        if self.running.is_empty() {
            return None;
        }
        let share = self.running.remove(&attempt)?;
        self.used = self.used.saturating_sub(share.bytes_per_second);
        for server in share.servers.iter() {
            if let Some(used) = self.used_by_server.get_mut(server) {
                *used = used.saturating_sub(share.bytes_per_second);
                if *used == 0 {
                    self.used_by_server.remove(server);
                }
            }
        }
        Some(share)
    }

    pub(crate) fn running(&self) -> usize {
        self.running.len()
    }

    /// What this instance asks of the budget's permits: the cluster's key
    /// while it has budgeted work or runs some, and the key of each volume
    /// server its work moves data through (`servers`) or its running tasks do.
    pub(crate) fn asks(&self, wants_work: bool, servers: &[Arc<str>]) -> Vec<Ask> {
        let Some(budget) = self.budget else { return Vec::new() };
        let filled = |used: u64, rate: u64| {
            let units = budget.units(rate);
            let unit = rate / u64::from(units);
            u32::try_from(used.div_ceil(unit.max(1))).unwrap_or(u32::MAX).min(units)
        };
        let mut asks = vec![Ask {
            key: CLUSTER_KEY.to_string(),
            capacity: budget.units(budget.cluster),
            wants: wants_work,
            running: filled(self.used, budget.cluster),
        }];
        if let Some(per_server) = budget.per_server {
            let mut keyed: BTreeMap<&str, (bool, u64)> = BTreeMap::new();
            for server in servers {
                keyed.entry(server).or_default().0 = true;
            }
            for (server, used) in &self.used_by_server {
                keyed.entry(server).or_default().1 = *used;
            }
            asks.extend(keyed.into_iter().map(|(server, (wants, used))| Ask {
                key: format!("{SERVER_KEY}{server}"),
                capacity: budget.units(per_server),
                wants,
                running: filled(used, per_server),
            }));
        }
        asks
    }
}

/// The budget as it stands, from the shares of every running budgeted
/// task (in a cluster, every instance's): what `jobcenter budget` shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct View {
    pub(crate) budget: Budget,
    pub(crate) used: u64,
    /// Each share, by attempt, in attempt order.
    pub(crate) shares: Vec<(String, Share)>,
    /// Per volume server a running task moves data through: what its tasks use.
    pub(crate) servers: Vec<(Arc<str>, u64)>,
}

impl View {
    pub(crate) fn of(budget: Budget, mut shares: Vec<(String, Share)>) -> View {
        shares.sort_by(|a, b| a.0.cmp(&b.0));
        let mut servers: BTreeMap<Arc<str>, u64> = BTreeMap::new();
        for (_, share) in &shares {
            for server in share.servers.iter() {
                *servers.entry(server.clone()).or_default() += share.bytes_per_second;
            }
        }
        let used = shares.iter().map(|(_, share)| share.bytes_per_second).sum();
        View { budget, used, shares, servers: servers.into_iter().collect() }
    }

    pub(crate) fn free(&self) -> u64 {
        self.budget.cluster.saturating_sub(self.used)
    }
}

/// `held` of `units` slots of `rate`, in bytes per second.
fn part(rate: u64, units: u32, held: u32) -> u64 {
    let held = held.min(units);
    if held == units {
        return rate;
    }
    (u128::from(rate) * u128::from(held) / u128::from(units.max(1))) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{JobId, TaskIdx, TaskRef};

    const MB: u64 = 1_000_000;

    fn attempt(i: u32) -> AttemptId {
        AttemptId::new(TaskRef { job: JobId::from_bytes([7; 16]), idx: TaskIdx(i) }, 1)
    }

    fn share(bytes_per_second: u64, servers: &[&str]) -> Share {
        Share {
            bytes_per_second,
            job_type: Arc::from("volume_balance"),
            servers: servers.iter().map(|s| Arc::from(*s)).collect(),
        }
    }

    fn servers(names: &[&str]) -> Vec<Arc<str>> {
        names.iter().map(|s| Arc::from(*s)).collect()
    }

    fn shares(cluster: u64, per_server: Option<u64>, minimum: u64) -> Shares {
        let mut shares = Shares::default();
        shares.set(Some(Budget { cluster, per_server, minimum }), HashMap::new());
        shares
    }

    #[test]
    fn rates_are_read_in_decimal_and_binary_units_and_shown_back() {
        assert_eq!(parse_rate("cluster", "200MB/s"), Ok(200 * MB));
        assert_eq!(parse_rate("cluster", "20MiB/s"), Ok(20 << 20));
        assert_eq!(parse_rate("cluster", " 1.5 GB "), Ok(1_500 * MB));
        assert_eq!(parse_rate("cluster", "64kb/s"), Ok(64_000));
        assert_eq!(parse_rate("cluster", "5000000"), Ok(5 * MB));
        for bad in ["fast", "", "MB/s", "20 MBps", "1.2.3MB", ".5MB", "-5MB", "99999999999TB"] {
            assert_eq!(
                parse_rate("cluster", bad),
                Err(Error::NotARate { field: "cluster", text: bad.to_string() }),
                "{bad:?}"
            );
        }
        assert_eq!(parse_rate("minimum", "0MB/s"), Err(Error::Zero { field: "minimum" }));
        let shown: Vec<String> = [200 * MB, 20 << 20, 1, 1536, 20 * MB / 3, 0].map(|b| Rate(b).to_string()).to_vec();
        assert_eq!(shown, ["200MB/s", "20MiB/s", "1B/s", "1536B/s", "6.67MB/s", "0B/s"]);
        assert_eq!(Rate(2048).to_string(), "2KiB/s");
    }

    #[test]
    fn a_change_is_checked_whole_and_keeps_what_it_does_not_name() {
        let change = |cluster, per_server, minimum| Change { cluster, per_server, minimum };
        let budget = Budget::changed(None, &change("200MB/s", "", "")).unwrap();
        assert_eq!(budget, Budget { cluster: 200 * MB, per_server: None, minimum: DEFAULT_MINIMUM });
        let budget = Budget::changed(Some(budget), &change("", "50MB/s", "5MB/s")).unwrap();
        assert_eq!(budget, Budget { cluster: 200 * MB, per_server: Some(50 * MB), minimum: 5 * MB });
        assert_eq!(
            Budget::changed(Some(budget), &change("", "none", "")).unwrap().per_server,
            None,
            "none removes the per-server part"
        );
        assert_eq!(Budget::changed(None, &change("", "50MB/s", "")), Err(Error::NoCluster));
        let refused = Budget::changed(Some(budget), &change("4MB/s", "", "")).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "budget cluster: 4MB/s is below the minimum share of one task, 5MB/s: no task could start (lower the minimum or raise the budget)"
        );
        let refused = Budget::changed(Some(budget), &change("", "", "60MB/s")).unwrap_err();
        assert!(matches!(refused, Error::BelowMinimum { field: "per_server", .. }), "{refused}");
        let refused = Budget::changed(Some(budget), &change("", "lots", "")).unwrap_err();
        assert!(refused.to_string().starts_with("budget per_server: \"lots\" is not a rate"), "{refused}");
    }

    #[test]
    fn tasks_wanting_the_budget_split_it_evenly_and_the_sum_never_exceeds_it() {
        let mut shares = shares(20 * MB, None, MB);
        assert_eq!(shares.offer(&[], 2), Some(10 * MB), "two tasks wanting: half each");
        shares.start(attempt(1), share(10 * MB, &[]));
        assert_eq!(shares.offer(&[], 2), Some(10 * MB));
        shares.start(attempt(2), share(10 * MB, &[]));
        assert_eq!(shares.offer(&[], 3), None, "nothing free: the third waits");
        assert!(shares.exhausted());
        assert_eq!(shares.end(attempt(1)).map(|s| s.bytes_per_second), Some(10 * MB));
        assert_eq!(shares.offer(&[], 2), Some(10 * MB), "shares are recomputed as tasks end");
        assert_eq!(shares.offer(&[], 1), Some(10 * MB), "never more than is free");
        shares.end(attempt(2));
        assert_eq!(shares.offer(&[], 1), Some(20 * MB), "alone, the whole budget");
        // Many wanting: each gets the minimum while it lasts, never less.
        let mut many = self::shares(20 * MB, None, 3 * MB);
        let mut started = 0;
        while let Some(given) = many.offer(&[], 100) {
            assert_eq!(given, 3 * MB);
            many.start(attempt(started), share(given, &[]));
            started += 1;
        }
        assert_eq!((started, many.used), (6, 18 * MB), "six at the minimum; 2 MB/s left is below it");
    }

    #[test]
    fn a_volume_server_budget_bounds_the_tasks_through_that_server() {
        let mut shares = shares(100 * MB, Some(30 * MB), 5 * MB);
        let ab = servers(&["a:8080", "b:8080"]);
        assert_eq!(shares.offer(&ab, 1), Some(30 * MB), "the server's budget is the tighter");
        shares.start(attempt(1), share(20 * MB, &["a:8080", "b:8080"]));
        assert_eq!(shares.offer(&servers(&["a:8080", "c:8080"]), 2), Some(10 * MB), "what a has left");
        assert_eq!(shares.offer(&servers(&["c:8080", "d:8080"]), 2), Some(30 * MB), "half of what is free, within c's");
        shares.start(attempt(2), share(8 * MB, &["b:8080"]));
        assert_eq!(shares.offer(&servers(&["b:8080"]), 3), None, "2 MB/s left on b, under the minimum");
        assert_eq!(shares.used, 28 * MB);
        let running: Vec<(String, Share)> = shares.running.iter().map(|(a, s)| (a.to_string(), s.clone())).collect();
        let view = View::of(shares.budget.unwrap(), running);
        assert_eq!((view.used, view.free()), (28 * MB, 72 * MB));
        assert_eq!(view.servers, vec![(Arc::from("a:8080"), 20 * MB), (Arc::from("b:8080"), 28 * MB)]);
        assert_eq!(view.shares[0].0, attempt(1).to_string(), "in attempt order");
        shares.end(attempt(1));
        assert_eq!(shares.offer(&servers(&["b:8080"]), 1), Some(22 * MB));
    }

    #[test]
    fn the_default_types_share_the_budget_unless_a_policy_says_otherwise() {
        let mut shares = Shares::default();
        assert!(!shares.applies_to("volume_balance"), "no budget, nothing shares it");
        shares.set(
            Some(Budget { cluster: MB, per_server: None, minimum: MB }),
            HashMap::from([(Arc::from("ec_balance"), false), (Arc::from("rsync"), true)]),
        );
        let applies: Vec<bool> = ["volume_balance", "erasure_coding", "ec_balance", "rsync", "vacuum"]
            .map(|t| shares.applies_to(t))
            .to_vec();
        assert_eq!(applies, [true, true, false, true, false]);
    }

    #[test]
    fn in_a_cluster_an_instance_hands_out_only_the_part_it_holds() {
        let mut shares = shares(20 * MB, Some(10 * MB), 2 * MB);
        shares.set_held(Held { cluster: 5, servers: BTreeMap::from([(Arc::from("a:8080"), 2)]) });
        assert_eq!(shares.offer(&[], 1), Some(10 * MB), "5 of 10 slots of 2 MB/s");
        assert_eq!(shares.offer(&servers(&["a:8080"]), 1), Some(4 * MB), "2 of 5 slots of a");
        assert_eq!(shares.offer(&servers(&["b:8080"]), 1), None, "no slot of b held");
        shares.start(attempt(1), share(3 * MB, &["a:8080"]));
        let asks = shares.asks(true, &servers(&["c:8080"]));
        assert_eq!(
            asks,
            vec![
                Ask { key: CLUSTER_KEY.into(), capacity: 10, wants: true, running: 2 },
                Ask { key: format!("{SERVER_KEY}a:8080"), capacity: 5, wants: false, running: 2 },
                Ask { key: format!("{SERVER_KEY}c:8080"), capacity: 5, wants: true, running: 0 },
            ]
        );
        shares.set_held(Held { cluster: 10, servers: BTreeMap::new() });
        assert_eq!(shares.offer(&[], 1), Some(17 * MB), "every slot held: the whole budget");
        // A tiny minimum makes no more slots than the permits table should hold.
        let fine = Budget { cluster: 20 * MB, per_server: None, minimum: 1 };
        assert_eq!(fine.units(fine.cluster), MAX_UNITS);
        assert!(
            fine.cluster / u64::from(fine.units(fine.cluster)) >= fine.minimum,
            "a slot is worth the minimum at least"
        );
    }
}

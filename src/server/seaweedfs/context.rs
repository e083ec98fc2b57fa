//! What a worker is told about the cluster with each detection and
//! execution request: the masters, the filers and S3 servers the masters
//! list (asked again every [`REFRESH`]), and for an `s3_lifecycle`
//! execution its share of the cluster's delete budget.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::proto::plugin::{config_value, ClusterContext, ConfigValue};

use super::master::Masters;
use crate::server::policies::Policies;
use crate::server::workers::registry::Registry;

/// How often the filers and S3 servers are asked of the masters.
pub(crate) const REFRESH: Duration = Duration::from_secs(10);
/// The job type whose executions carry a share of the delete budget.
pub(crate) const S3_LIFECYCLE: &str = "s3_lifecycle";
/// The admin configuration values that set the cluster's delete budget.
pub(crate) const DELETES_PER_SECOND: &str = "cluster_deletes_per_second";
pub(crate) const DELETES_BURST: &str = "cluster_deletes_burst";
/// The metadata keys that carry one executor's share of it.
pub(crate) const SHARE_PER_SECOND: &str = "s3_lifecycle.deletes_per_second";
pub(crate) const SHARE_BURST: &str = "s3_lifecycle.deletes_burst";

/// The filers and S3 servers the masters listed last.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Nodes {
    pub filers: Vec<String>,
    pub s3: Vec<String>,
}

#[derive(Default)]
pub(crate) struct Known(Mutex<Nodes>);

impl Known {
    pub(crate) fn get(&self) -> Nodes {
        self.0.lock().expect("nodes lock").clone()
    }

    fn set(&self, nodes: Nodes) {
        *self.0.lock().expect("nodes lock") = nodes;
    }
}

/// The cluster context of a detection or an execution of `job_type`.
pub(crate) fn cluster_context(
    masters: &Masters,
    known: &Known,
    policies: &Policies,
    registry: &Registry,
    job_type: &str,
    execution: bool,
) -> ClusterContext {
    let nodes = known.get();
    let mut context = ClusterContext {
        master_grpc_addresses: masters.addresses.clone(),
        filer_addresses: nodes.filers,
        s3_grpc_addresses: nodes.s3,
        metadata: std::collections::BTreeMap::from([("source".to_string(), "jobcenter".to_string())]),
        ..ClusterContext::default()
    };
    if execution && job_type == S3_LIFECYCLE {
        let admin = policies.admin_values(job_type);
        let (policy, _) = policies.effective(job_type);
        let executors = registry
            .workers()
            .iter()
            .filter(|w| w.capabilities.iter().any(|c| c.job_type == job_type && c.can_execute))
            .count();
        let budget = Budget {
            per_second: admin.get(DELETES_PER_SECOND).map_or(0.0, number),
            burst: admin.get(DELETES_BURST).map_or(0.0, number),
        };
        context.metadata.extend(budget.share(executors, policy.max_jobs_per_detection));
    }
    context
}

/// A config value as a whole number: an integer, a double (truncated), or
/// text that reads as one; anything else is 0.
fn number(value: &ConfigValue) -> f64 {
    let n = match &value.kind {
        Some(config_value::Kind::Int64Value(i)) => *i as f64,
        Some(config_value::Kind::DoubleValue(d)) => *d,
        Some(config_value::Kind::StringValue(s)) => s.trim().parse().unwrap_or(0.0),
        _ => 0.0,
    };
    if n.is_finite() {
        n.trunc()
    } else {
        0.0
    }
}

/// The cluster's delete budget for `s3_lifecycle`, from its admin configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Budget {
    pub per_second: f64,
    pub burst: f64,
}

impl Budget {
    /// One executor's share, as metadata: the rate divided among the
    /// executors that may run at once (the capable workers, at most the
    /// jobs of one detection), the burst likewise in whole deletes and at
    /// least 1. No rate (0 or less) means no limit: nothing is added.
    pub(crate) fn share(self, executors: usize, max_jobs_per_detection: u32) -> Vec<(String, String)> {
        if self.per_second.is_nan() || self.per_second <= 0.0 {
            return Vec::new();
        }
        let mut active = executors.max(1) as u64;
        if max_jobs_per_detection > 0 {
            active = active.min(u64::from(max_jobs_per_detection));
        }
        let mut out = vec![(SHARE_PER_SECOND.to_string(), format!("{}", self.per_second / active as f64))];
        let burst = if self.burst.is_finite() && self.burst > 0.0 { self.burst.trunc() as u64 } else { 0 };
        if burst > 0 {
            out.push((SHARE_BURST.to_string(), (burst / active).max(1).to_string()));
        }
        out
    }
}

/// Asks the masters for their filers and S3 servers every [`REFRESH`].
pub(crate) async fn refresh(masters: Arc<Masters>, known: Arc<Known>) {
    loop {
        match super::master::cluster_nodes(&masters).await {
            Ok(nodes) => known.set(nodes),
            Err(e) => tracing::debug!(error = %e, "cannot list the cluster's filers and S3 servers"),
        }
        tokio::time::sleep(REFRESH).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(per_second: f64, burst: f64, executors: usize, max_jobs: u32) -> Vec<(String, String)> {
        Budget { per_second, burst }.share(executors, max_jobs)
    }

    fn pair(key: &str, value: &str) -> (String, String) {
        (key.to_string(), value.to_string())
    }

    #[test]
    fn the_budget_is_divided_among_the_executors_that_may_run_at_once() {
        // Two capable workers, two jobs a detection: half each.
        assert_eq!(share(100.0, 10.0, 2, 2), vec![pair(SHARE_PER_SECOND, "50"), pair(SHARE_BURST, "5")]);
        // One job a detection: the whole budget, whatever the workers.
        assert_eq!(share(100.0, 0.0, 3, 1), vec![pair(SHARE_PER_SECOND, "100")]);
        // No cap on jobs: every capable worker.
        assert_eq!(share(25.0, 0.0, 2, 0), vec![pair(SHARE_PER_SECOND, "12.5")]);
        // A burst smaller than the executors is at least 1 each.
        assert_eq!(share(9.0, 2.0, 4, 0), vec![pair(SHARE_PER_SECOND, "2.25"), pair(SHARE_BURST, "1")]);
        // No worker counted yet: one share.
        assert_eq!(share(40.0, 7.9, 0, 0), vec![pair(SHARE_PER_SECOND, "40"), pair(SHARE_BURST, "7")]);
    }

    #[test]
    fn no_rate_means_no_limit() {
        assert!(share(0.0, 10.0, 2, 2).is_empty());
        assert!(share(-5.0, 10.0, 2, 2).is_empty());
        assert!(share(f64::NAN, 10.0, 2, 2).is_empty());
        // A negative burst counts as none.
        assert_eq!(share(10.0, -3.0, 1, 1), vec![pair(SHARE_PER_SECOND, "10")]);
    }

    #[test]
    fn numbers_come_from_integers_doubles_and_text() {
        let value = |kind| ConfigValue { kind: Some(kind) };
        assert_eq!(number(&value(config_value::Kind::Int64Value(100))), 100.0);
        assert_eq!(number(&value(config_value::Kind::DoubleValue(12.7))), 12.0);
        assert_eq!(number(&value(config_value::Kind::DoubleValue(f64::INFINITY))), 0.0);
        assert_eq!(number(&value(config_value::Kind::StringValue(" 30 ".into()))), 30.0);
        assert_eq!(number(&value(config_value::Kind::StringValue("many".into()))), 0.0);
        assert_eq!(number(&ConfigValue { kind: None }), 0.0);
    }
}

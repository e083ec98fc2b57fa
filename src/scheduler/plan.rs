//! From the proposals of one detection run to one DAG job: drop what is
//! already being done (by dedupe key), expired or not yet due; chain the
//! proposals that touch the same volume, highest priority first; honour
//! dependencies a proposal names (label `depends_on`).

use std::collections::{BTreeMap, HashSet};

use serde_json::{json, Map, Value};

use crate::clock::Timestamp;
use crate::jobfile::{self, is_id_char, Format, Limits};
use crate::model::{JobSpec, Priority};

/// One proposal of a detection run, parameters as JSON.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Proposal {
    pub proposal_id: String,
    pub dedupe_key: String,
    pub job_type: String,
    pub priority: Priority,
    pub summary: String,
    pub parameters: Map<String, Value>,
    pub labels: BTreeMap<String, String>,
    pub not_before: Option<Timestamp>,
    pub expires_at: Option<Timestamp>,
}

/// A proposal left out, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Dropped {
    pub proposal_id: String,
    pub reason: String,
}

/// The volume a proposal touches: label `volume_id`, else parameter `volume_id`.
pub(crate) fn volume_of(proposal: &Proposal) -> Option<String> {
    if let Some(v) = proposal.labels.get("volume_id").filter(|v| !v.is_empty()) {
        return Some(v.clone());
    }
    match proposal.parameters.get("volume_id")? {
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

/// Keeps the proposals to run; `active_keys` are the dedupe keys of tasks
/// that have not ended, in any job.
pub(crate) fn filter(
    proposals: Vec<Proposal>,
    active_keys: &HashSet<String>,
    now: Timestamp,
) -> (Vec<Proposal>, Vec<Dropped>) {
    let mut kept = Vec::new();
    let mut dropped = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    for proposal in proposals {
        let drop = |reason: String| Dropped { proposal_id: proposal.proposal_id.clone(), reason };
        if !proposal.dedupe_key.is_empty() && active_keys.contains(&proposal.dedupe_key) {
            dropped.push(drop(format!("{} is already being done", proposal.dedupe_key)));
        } else if !proposal.dedupe_key.is_empty() && !seen.insert(proposal.dedupe_key.clone()) {
            dropped.push(drop(format!("{} was proposed twice in this run", proposal.dedupe_key)));
        } else if proposal.expires_at.is_some_and(|at| at <= now) {
            dropped.push(drop("expired".into()));
        } else if proposal.not_before.is_some_and(|at| at > now) {
            dropped.push(drop("not due yet; a later detection proposes it again".into()));
        } else {
            kept.push(proposal);
        }
    }
    (kept, dropped)
}

/// A task id made of a proposal id: characters outside the id set become `_`.
fn task_id(proposal: &Proposal, n: usize, used: &mut HashSet<String>) -> String {
    let mut id: String = proposal.proposal_id.chars().map(|c| if is_id_char(c) { c } else { '_' }).take(200).collect();
    if id.is_empty() {
        id = format!("proposal-{n}");
    }
    let mut unique = id.clone();
    let mut k = 1;
    while !used.insert(unique.clone()) {
        k += 1;
        unique = format!("{id}-{k}");
    }
    unique
}

/// The job of one detection run: one task per proposal, parameters and labels
/// carried through unchanged (plus `dedupe_key` and `proposal_id` labels),
/// retries from the job type's policy.
pub(crate) fn build_job(
    name: &str,
    proposals: &[Proposal],
    retry_limit: u32,
    retry_backoff_seconds: u32,
    execution_timeout_seconds: u32,
    limits: &Limits,
) -> Result<JobSpec, jobfile::Error> {
    let mut used = HashSet::new();
    let ids: Vec<String> = proposals.iter().enumerate().map(|(n, p)| task_id(p, n, &mut used)).collect();
    let by_proposal: BTreeMap<&str, &str> =
        proposals.iter().zip(&ids).map(|(p, id)| (p.proposal_id.as_str(), id.as_str())).collect();
    let mut depends: Vec<Vec<String>> = vec![Vec::new(); proposals.len()];
    // Proposals on the same volume run one after another, highest priority first.
    let mut by_volume: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (n, proposal) in proposals.iter().enumerate() {
        if let Some(volume) = volume_of(proposal) {
            by_volume.entry(volume).or_default().push(n);
        }
    }
    for chain in by_volume.values_mut() {
        chain.sort_by(|a, b| proposals[*b].priority.cmp(&proposals[*a].priority).then(a.cmp(b)));
        for pair in chain.windows(2) {
            depends[pair[1]].push(ids[pair[0]].clone());
        }
    }
    for (n, proposal) in proposals.iter().enumerate() {
        if let Some(named) = proposal.labels.get("depends_on") {
            for other in named.split(',').map(str::trim).filter(|o| !o.is_empty()) {
                if let Some(id) = by_proposal.get(other) {
                    if !depends[n].iter().any(|d| d == id) {
                        depends[n].push(id.to_string());
                    }
                }
            }
        }
    }
    let tasks: Vec<Value> = proposals
        .iter()
        .zip(&ids)
        .zip(&depends)
        .map(|((proposal, id), deps)| {
            let mut labels = proposal.labels.clone();
            labels.remove("depends_on");
            if !proposal.dedupe_key.is_empty() {
                labels.insert("dedupe_key".into(), proposal.dedupe_key.clone());
            }
            labels.insert("proposal_id".into(), proposal.proposal_id.clone());
            let mut task = json!({
                "id": id,
                "job_type": proposal.job_type,
                "parameters": Value::Object(proposal.parameters.clone()),
                "depends_on": deps,
                "priority": proposal.priority.as_str(),
                "labels": labels,
                "retry_limit": retry_limit,
                "retry_backoff_seconds": retry_backoff_seconds,
            });
            if execution_timeout_seconds > 0 {
                task["execution_timeout_seconds"] = json!(execution_timeout_seconds);
            }
            task
        })
        .collect();
    let text = serde_json::to_vec(&json!({ "name": name, "tasks": tasks })).expect("a job serializes");
    jobfile::parse(&text, Format::Json, name, limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proposal(id: &str, volume: Option<u32>, priority: Priority, key: &str) -> Proposal {
        let mut parameters = Map::new();
        if let Some(v) = volume {
            parameters.insert("volume_id".into(), json!(v));
        }
        Proposal {
            proposal_id: id.into(),
            dedupe_key: key.into(),
            job_type: "vacuum".into(),
            priority,
            summary: String::new(),
            parameters,
            labels: BTreeMap::new(),
            not_before: None,
            expires_at: None,
        }
    }

    #[test]
    fn drops_what_is_being_done_duplicates_expired_and_early_proposals() {
        let now = Timestamp(1_000);
        let mut expired = proposal("c", Some(3), Priority::Normal, "k3");
        expired.expires_at = Some(Timestamp(999));
        let mut early = proposal("d", Some(4), Priority::Normal, "k4");
        early.not_before = Some(Timestamp(2_000));
        let proposals = vec![
            proposal("a", Some(1), Priority::Normal, "k1"),
            proposal("b", Some(2), Priority::Normal, "busy"),
            proposal("a2", Some(1), Priority::Normal, "k1"),
            expired,
            early,
        ];
        let (kept, dropped) = filter(proposals, &HashSet::from(["busy".to_string()]), now);
        assert_eq!(kept.iter().map(|p| p.proposal_id.as_str()).collect::<Vec<_>>(), ["a"]);
        let reasons: Vec<&str> = dropped.iter().map(|d| d.reason.as_str()).collect();
        assert!(reasons[0].contains("already being done"), "{reasons:?}");
        assert!(reasons[1].contains("twice"), "{reasons:?}");
        assert_eq!(reasons[2], "expired");
        assert!(reasons[3].contains("not due yet"), "{reasons:?}");
    }

    #[test]
    fn proposals_on_one_volume_run_in_priority_order() {
        let proposals = vec![
            proposal("vacuum_vol_7", Some(7), Priority::Normal, "vacuum:7"),
            proposal("ec_vol_7", Some(7), Priority::Critical, "ec:7"),
            proposal("vacuum_vol_8", Some(8), Priority::High, "vacuum:8"),
            proposal("balance:7", Some(7), Priority::Low, "balance:7"),
        ];
        let spec = build_job("vacuum-1", &proposals, 1, 10, 0, &Limits::default()).unwrap();
        let id = |n: usize| spec.tasks[n].id.to_string();
        let parents = |n: u32| spec.dag.parents(n).iter().map(|&p| id(p as usize)).collect::<Vec<_>>();
        assert_eq!(parents(1), Vec::<String>::new(), "the critical one on volume 7 goes first");
        assert_eq!(parents(0), ["ec_vol_7"]);
        assert_eq!(parents(3), ["vacuum_vol_7"], "then low after normal");
        assert_eq!(id(3), "balance:7", "':' is a valid id character");
        assert!(parents(2).is_empty(), "another volume is independent");
        assert_eq!(spec.tasks[0].labels["dedupe_key"], "vacuum:7");
        assert_eq!(spec.tasks[0].retry_limit, 1);
        assert_eq!(spec.tasks[0].parameters.as_ref(), r#"{"volume_id":7}"#);
    }

    #[test]
    fn a_proposal_may_name_what_it_depends_on() {
        let mut second = proposal("move 2", None, Priority::Normal, "m2");
        second.labels.insert("depends_on".into(), "move 1, unknown".into());
        let proposals = vec![proposal("move 1", None, Priority::Normal, "m1"), second];
        let spec = build_job("balance-1", &proposals, 0, 5, 0, &Limits::default()).unwrap();
        assert_eq!(&*spec.tasks[0].id, "move_1", "invalid characters become _");
        assert_eq!(spec.dag.parents(1), &[0]);
        assert!(!spec.tasks[1].labels.contains_key("depends_on"));
    }

    #[test]
    fn reads_the_volume_from_labels_or_parameters() {
        let mut p = proposal("x", Some(9), Priority::Normal, "");
        assert_eq!(volume_of(&p).as_deref(), Some("9"));
        p.labels.insert("volume_id".into(), "12".into());
        assert_eq!(volume_of(&p).as_deref(), Some("12"));
        assert_eq!(volume_of(&proposal("y", None, Priority::Normal, "")), None);
    }
}

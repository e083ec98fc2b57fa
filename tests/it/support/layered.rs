//! A layered job with failing and flaky tasks, its reference model, and the
//! checks that kill tests make on how it ended: final states as the model
//! says, and executions only as many as each task's own outcomes ask for.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

/// A small seeded generator (xorshift), so that a failing run can be replayed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A layered job: each task after the first layer depends on 3 tasks of the
/// layer before; a few tasks in the last 4 layers always fail, about 1 in 100
/// fails once and is retried.
pub struct Layered {
    pub text: String,
    pub parents: Vec<Vec<usize>>,
    pub fails: Vec<bool>,
    pub flaky: Vec<bool>,
}

/// How each task spends its time: an in-process sleep in `[from, from + spread)`
/// ms, or a shell command of that many ms.
pub enum Work {
    Sleep { from: u64, spread: u64 },
    Shell { ms: u64 },
}

pub fn layered_job(rng: &mut Rng, name: &str, n: usize, width: usize, work: &Work) -> Layered {
    let mut job = Layered { text: String::new(), parents: Vec::new(), fails: Vec::new(), flaky: Vec::new() };
    let mut tasks = Vec::new();
    for i in 0..n {
        let layer = i / width;
        let mut deps: Vec<usize> = Vec::new();
        if layer > 0 {
            while deps.len() < 3 {
                let d = (layer - 1) * width + rng.below(width as u64) as usize;
                if !deps.contains(&d) {
                    deps.push(d);
                }
            }
        }
        let fail = layer >= n / width - 4 && rng.below(200) == 0;
        let flaky = !fail && rng.below(100) == 0;
        let (job_type, params) = match work {
            Work::Sleep { from, spread } => {
                let sleep = from + rng.below(*spread);
                let params = if fail {
                    format!(r#"{{"fail":true,"sleep_ms":{sleep}}}"#)
                } else if flaky {
                    format!(r#"{{"fail_attempts":1,"sleep_ms":{sleep}}}"#)
                } else {
                    format!(r#"{{"sleep_ms":{sleep}}}"#)
                };
                ("noop", params)
            }
            Work::Shell { ms } => {
                // Drawn as the sleep would be, so that one seed makes one job.
                rng.below(60);
                let seconds = *ms as f64 / 1000.0;
                let command = if fail {
                    format!("sleep {seconds}; exit 1")
                } else if flaky {
                    format!("sleep {seconds}; [ \"$JOBCENTER_ATTEMPT\" -gt 1 ]")
                } else {
                    format!("sleep {seconds}")
                };
                ("shell", serde_json::json!({ "command": command }).to_string())
            }
        };
        let deps_json: Vec<String> = deps.iter().map(|d| format!("\"t{d}\"")).collect();
        let retry = if flaky { r#","retry_limit":1,"retry_backoff_seconds":0"# } else { "" };
        tasks.push(format!(
            r#"{{"id":"t{i}","job_type":"{job_type}","parameters":{params},"depends_on":[{}]{retry}}}"#,
            deps_json.join(",")
        ));
        job.parents.push(deps);
        job.fails.push(fail);
        job.flaky.push(flaky);
    }
    job.text = format!(r#"{{"name":"{name}","tasks":[{}]}}"#, tasks.join(","));
    job
}

impl Layered {
    /// The reference model: the final state of every task.
    pub fn model(&self) -> Vec<&'static str> {
        let mut states: Vec<&'static str> = Vec::with_capacity(self.parents.len());
        for (i, deps) in self.parents.iter().enumerate() {
            let state = if deps.iter().any(|&p| states[p] != "succeeded") {
                "upstream_failed"
            } else if self.fails[i] {
                "failed"
            } else {
                "succeeded"
            };
            states.push(state);
        }
        states
    }

    /// Panics unless the ended job (its `job --json`) is in the model's states.
    pub fn assert_as_modelled(&self, done: &serde_json::Value) {
        let expected = self.model();
        let tasks = done["tasks"].as_array().expect("tasks");
        assert_eq!(tasks.len(), expected.len());
        let mut mismatches = Vec::new();
        for task in tasks {
            let id = task["id"].as_str().unwrap();
            let idx: usize = id[1..].parse().unwrap();
            if task["state"] != expected[idx] {
                mismatches.push(format!("{id}: {} (expected {})", task["state"], expected[idx]));
            }
        }
        assert!(
            mismatches.is_empty(),
            "{} tasks differ from the model: {:?}",
            mismatches.len(),
            &mismatches[..mismatches.len().min(10)]
        );
        let expected_job = if expected.iter().all(|s| *s == "succeeded") { "succeeded" } else { "failed" };
        assert_eq!(done["state"], expected_job);
    }

    /// The tasks that succeeded on more than one execution.
    pub fn succeeded_more_than_once(&self, events: &[(String, u32, String)]) -> Vec<String> {
        let mut succeeded: BTreeMap<&str, usize> = BTreeMap::new();
        for (task, _, event) in events {
            if event == "succeeded" {
                *succeeded.entry(task.as_str()).or_default() += 1;
            }
        }
        succeeded.into_iter().filter(|(_, n)| *n > 1).map(|(task, _)| task.to_string()).collect()
    }

    /// Panics if a task succeeded on more than one execution.
    pub fn assert_each_succeeded_once(&self, events: &[(String, u32, String)]) {
        let twice = self.succeeded_more_than_once(events);
        let their_events: Vec<_> = events.iter().filter(|(t, _, _)| twice.contains(t)).collect();
        assert!(twice.is_empty(), "tasks that succeeded more than once: {twice:?}; their executions: {their_events:?}");
    }

    /// Panics if an attempt started twice or past the task's final attempt, a
    /// parent started again after its child had started, or an
    /// upstream_failed task ran.
    pub fn assert_orderly_executions(&self, done: &serde_json::Value, events: &[(String, u32, String)]) {
        let tasks = done["tasks"].as_array().expect("tasks");
        let final_attempt: BTreeMap<&str, u64> =
            tasks.iter().map(|t| (t["id"].as_str().unwrap(), t["attempt"].as_u64().unwrap())).collect();
        let mut started: BTreeSet<(String, u32)> = BTreeSet::new();
        let mut first_start: BTreeMap<String, usize> = BTreeMap::new();
        let mut last_start: BTreeMap<String, usize> = BTreeMap::new();
        for (line, (task, attempt, event)) in events.iter().enumerate() {
            if event != "start" {
                continue;
            }
            assert!(started.insert((task.clone(), *attempt)), "{task} attempt {attempt} started twice");
            assert!(
                u64::from(*attempt) <= final_attempt[task.as_str()],
                "{task} started attempt {attempt} past its final one"
            );
            first_start.entry(task.clone()).or_insert(line);
            last_start.insert(task.clone(), line);
        }
        for (i, deps) in self.parents.iter().enumerate() {
            let Some(&child_first) = first_start.get(&format!("t{i}")) else { continue };
            for &p in deps {
                let parent = format!("t{p}");
                assert!(last_start[&parent] < child_first, "{parent} started again after its child t{i} had started");
            }
        }
        for task in tasks.iter().filter(|t| t["state"] == "upstream_failed") {
            let id = task["id"].as_str().unwrap();
            assert!(!first_start.contains_key(id), "{id} ended upstream_failed but ran");
        }
    }

    /// The tasks that ran more often than their own outcomes ask for (once,
    /// twice for a flaky task whose first attempt ran, never for
    /// upstream_failed), and the total number of executions.
    pub fn reruns(&self, events: &[(String, u32, String)]) -> (Vec<String>, usize) {
        let mut executions: BTreeMap<&str, usize> = BTreeMap::new();
        for (task, _, event) in events {
            if event == "start" {
                *executions.entry(task.as_str()).or_default() += 1;
            }
        }
        let first_attempt_ran: BTreeSet<&str> =
            events.iter().filter(|(_, attempt, e)| *attempt == 1 && e == "start").map(|(t, _, _)| t.as_str()).collect();
        let mut reruns = Vec::new();
        for (i, state) in self.model().iter().enumerate() {
            let id = format!("t{i}");
            // A flaky task fails its first attempt only. An attempt 1 that was
            // assigned but never reached its worker before a kill (taken back
            // uncounted) leaves attempt 2 to succeed at its first execution.
            let asked = match *state {
                "upstream_failed" => 0,
                _ if self.flaky[i] && first_attempt_ran.contains(id.as_str()) => 2,
                _ => 1,
            };
            let ran = executions.get(id.as_str()).copied().unwrap_or(0);
            if ran != asked {
                let mine: Vec<_> = events.iter().filter(|e| e.0 == id).collect();
                reruns.push(format!("{id}: ran {ran} times, its outcomes ask for {asked}: {mine:?}"));
            }
        }
        (reruns, executions.values().sum())
    }

    /// How many tasks the model runs (all but the upstream_failed ones).
    pub fn tasks_that_run(&self) -> usize {
        self.model().iter().filter(|s| **s != "upstream_failed").count()
    }
}

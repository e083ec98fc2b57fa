//! Durability as the kernel sees it: `jobcenter run` on the embedded store,
//! traced with `strace`, must sync the store's journal, or sled's log file
//! at a checkpoint (`fdatasync`), between a task's success and the start of
//! the task that depends on it. sled 0.34's own flush waits with
//! `sync_file_range`, which keeps neither a grown file's size nor the
//! disk's write cache through a power loss, so it never counts. And the
//! data directory it creates must have its name synced (`fsync` of the
//! directory that holds it) before any task runs.
#![cfg(target_os = "linux")]

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// A chain of `n` tasks, each depending on the one before.
fn chain(n: usize) -> String {
    let tasks: Vec<String> = (0..n)
        .map(|i| {
            let deps = if i == 0 { String::new() } else { format!("\"t{}\"", i - 1) };
            format!(r#"{{"id":"t{i}","job_type":"noop","parameters":{{}},"depends_on":[{deps}]}}"#)
        })
        .collect();
    format!(r#"{{"name":"chain","tasks":[{}]}}"#, tasks.join(","))
}

/// What the trace shows, in the order the calls ended.
#[derive(Debug, PartialEq)]
enum Seen {
    /// A line written to the execution log (`TASK EVENT`).
    Exec(String),
    /// `fdatasync` of the store's journal or of sled's log file returned 0.
    StoreSynced,
    /// `fsync` of the directory that holds the data directory returned 0.
    ParentSynced,
}

/// Reads the calls of interest from an `strace -f -y` output. A call another
/// thread interrupted ends on its `resumed` line, which carries the result.
fn read_trace(trace: &str, exec_log: &Path, data_dir: &Path) -> Vec<Seen> {
    let exec_log = exec_log.display().to_string();
    let parent = data_dir.parent().expect("the data directory has a parent").display().to_string();
    let data_dir = data_dir.display().to_string();
    let mut started: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    let mut seen = Vec::new();
    for line in trace.lines() {
        let Some((pid, call)) = line.split_once(' ') else { continue };
        let call = call.trim_start();
        let whole = if let Some(head) = call.strip_suffix("<unfinished ...>") {
            started.insert(pid.to_string(), head.to_string());
            continue;
        } else if let Some(rest) = call.strip_prefix("<... ") {
            let Some(head) = started.remove(pid) else { continue };
            let rest = rest.split_once(" resumed>").map_or("", |(_, r)| r);
            format!("{head}{rest}")
        } else {
            call.to_string()
        };
        let store_file = whole.contains("/journal>)") || whole.contains("/db>)");
        if whole.starts_with("fdatasync(") && whole.contains(&format!("{data_dir}/")) && store_file {
            if whole.trim_end().ends_with("= 0") {
                seen.push(Seen::StoreSynced);
            }
        } else if whole.starts_with("fsync(") && whole.contains(&format!("<{parent}>)")) {
            if whole.trim_end().ends_with("= 0") {
                seen.push(Seen::ParentSynced);
            }
        } else if whole.starts_with("write(") && whole.contains(&format!("<{exec_log}>")) {
            // write(5</path/exec.log>, "JOB t1 1 start\n", 40) = 40
            let text = whole.split('"').nth(1).unwrap_or("");
            let parts: Vec<&str> = text.trim_end_matches("\\n").split(' ').collect();
            if let [_, task, _, event] = parts[..] {
                seen.push(Seen::Exec(format!("{task} {event}")));
            }
        }
    }
    seen
}

#[test]
fn a_dependent_task_starts_only_after_the_store_is_synced_and_the_new_directory_has_its_name() {
    let strace = Command::new("strace").arg("-V").output();
    assert!(
        strace.is_ok_and(|o| o.status.success()),
        "this test needs strace (Debian's `strace`, installed by .ci/setup)"
    );
    let dir = tempfile::tempdir().unwrap();
    // strace names files by their resolved paths.
    let root = dir.path().canonicalize().unwrap();
    let (job, data_dir, exec_log, trace) =
        (root.join("chain.json"), root.join("data"), root.join("exec.log"), root.join("trace"));
    let n = 8;
    std::fs::write(&job, chain(n)).unwrap();
    let mut command = Command::new("strace");
    command
        .args(["-f", "-y", "-s", "128", "-e", "trace=fdatasync,fsync,write", "-o"])
        .arg(&trace)
        .arg(support::binary())
        .arg("run")
        .arg(&job)
        .arg("--data-dir")
        .arg(&data_dir)
        .arg("--exec-log")
        .arg(&exec_log)
        .arg("--concurrency")
        .arg("1");
    let output = support::run_with_timeout(command, Duration::from_secs(120));
    assert!(output.status.success(), "run failed: {}", String::from_utf8_lossy(&output.stderr));

    let seen = read_trace(&std::fs::read_to_string(&trace).unwrap(), &exec_log, &data_dir);
    let position = |what: &str| {
        seen.iter()
            .position(|s| *s == Seen::Exec(what.to_string()))
            .unwrap_or_else(|| panic!("no {what:?} in the traced execution log: {seen:?}"))
    };
    let named = seen.iter().position(|s| *s == Seen::ParentSynced);
    assert!(
        named.is_some_and(|at| at < position("t0 start")),
        "the first task started before the directory holding the new data directory was synced: {seen:?}"
    );
    for i in 1..n {
        let (succeeded, next) = (position(&format!("t{} succeeded", i - 1)), position(&format!("t{i} start")));
        assert!(succeeded < next, "t{i} started before t{} succeeded: {seen:?}", i - 1);
        let synced = seen[succeeded..next].iter().filter(|s| **s == Seen::StoreSynced).count();
        assert!(synced >= 1, "t{i} started with no sync of the store since t{} succeeded: {seen:?}", i - 1);
    }
}

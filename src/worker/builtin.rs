//! The built-in job types: `noop` (sleeps, fails on demand) and `shell`
//! (runs a command; its exit code decides).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::{BoxFuture, Handler, TaskContext};
use crate::follower::Outcome;

/// Output lines kept per attempt, and the longest line kept.
const MAX_OUTPUT_LINES: usize = 200;
const MAX_LINE_BYTES: usize = 1000;

pub fn builtin_handlers() -> Vec<Arc<dyn Handler>> {
    vec![Arc::new(NoopHandler), Arc::new(ShellHandler)]
}

fn invalid(error: impl std::fmt::Display) -> Outcome {
    Outcome::Failed { error: format!("invalid parameters: {error}"), output: Vec::new() }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoopParameters {
    #[serde(default)]
    sleep_ms: u64,
    #[serde(default)]
    fail: bool,
    #[serde(default)]
    fail_attempts: u32,
    /// A share of the bandwidth budget (a policy can make noop share it): taken, unused.
    #[serde(default, rename = "io_byte_per_second")]
    _io_byte_per_second: Option<u64>,
}

/// Does nothing (after `sleep_ms`); fails every attempt with `fail`, or the
/// first `fail_attempts` attempts.
pub struct NoopHandler;

impl Handler for NoopHandler {
    fn job_type(&self) -> &'static str {
        "noop"
    }

    fn execute(&self, ctx: TaskContext) -> BoxFuture {
        Box::pin(async move {
            let params: NoopParameters = match serde_json::from_value(ctx.parameters) {
                Ok(p) => p,
                Err(e) => return invalid(e),
            };
            if params.sleep_ms > 0 {
                tokio::time::sleep(Duration::from_millis(params.sleep_ms)).await;
            }
            if params.fail {
                Outcome::Failed { error: "noop told to fail".into(), output: Vec::new() }
            } else if ctx.attempt <= params.fail_attempts {
                Outcome::Failed {
                    error: format!("noop told to fail attempt {} of the first {}", ctx.attempt, params.fail_attempts),
                    output: Vec::new(),
                }
            } else {
                Outcome::Succeeded { output: Vec::new() }
            }
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ShellParameters {
    command: Option<String>,
    argv: Option<Vec<String>>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    timeout_seconds: Option<u64>,
    /// Its share of the bandwidth budget, when its policy makes shell share
    /// it: the command finds it in `JOBCENTER_IO_BYTE_PER_SECOND`.
    io_byte_per_second: Option<u64>,
}

/// Runs `command` with `sh -c`, or `argv` directly; exit code 0 succeeds.
/// Keeps the last lines of stdout and stderr on the task.
pub struct ShellHandler;

impl Handler for ShellHandler {
    fn job_type(&self) -> &'static str {
        "shell"
    }

    fn execute(&self, ctx: TaskContext) -> BoxFuture {
        Box::pin(async move {
            let params: ShellParameters = match serde_json::from_value(ctx.parameters) {
                Ok(p) => p,
                Err(e) => return invalid(e),
            };
            let mut command = match (&params.command, &params.argv) {
                (Some(line), None) => {
                    let mut c = tokio::process::Command::new("sh");
                    c.arg("-c").arg(line);
                    c
                }
                (None, Some(argv)) if !argv.is_empty() => {
                    let mut c = tokio::process::Command::new(&argv[0]);
                    c.args(&argv[1..]);
                    c
                }
                _ => return invalid("give exactly one of `command` (a string) or `argv` (a non-empty list)"),
            };
            command
                .envs(&params.env)
                .env("JOBCENTER_JOB_ID", ctx.job.to_string())
                .env("JOBCENTER_TASK_ID", &*ctx.task_id)
                .env("JOBCENTER_ATTEMPT", ctx.attempt.to_string())
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .process_group(0)
                .kill_on_drop(true);
            if let Some(cwd) = &params.cwd {
                command.current_dir(cwd);
            }
            if let Some(rate) = params.io_byte_per_second {
                command.env("JOBCENTER_IO_BYTE_PER_SECOND", rate.to_string());
            }
            let mut child = match command.spawn() {
                Ok(child) => child,
                Err(e) => {
                    return Outcome::Failed { error: format!("cannot start the command: {e}"), output: Vec::new() }
                }
            };
            // A timeout or a cancel (dropping this future) ends every process the command started.
            let mut group = child.id().map(|pid| ProcessGroup { pid, armed: true });
            let output = Arc::new(std::sync::Mutex::new(VecDeque::new()));
            let readers = [
                child.stdout.take().map(|s| tokio::spawn(collect_lines(s, "", output.clone()))),
                child.stderr.take().map(|s| tokio::spawn(collect_lines(s, "stderr: ", output.clone()))),
            ];
            let status = match params.timeout_seconds {
                Some(seconds) => match tokio::time::timeout(Duration::from_secs(seconds), child.wait()).await {
                    Ok(status) => status,
                    Err(_) => {
                        drop(group);
                        let _ = child.kill().await;
                        for reader in readers.into_iter().flatten() {
                            let _ = reader.await;
                        }
                        return Outcome::Failed {
                            error: format!("timed out after {seconds} s"),
                            output: take_lines(&output),
                        };
                    }
                },
                None => child.wait().await,
            };
            if let Some(group) = group.as_mut() {
                group.armed = false;
            }
            for reader in readers.into_iter().flatten() {
                let _ = reader.await;
            }
            let output = take_lines(&output);
            match status {
                Ok(status) if status.success() => Outcome::Succeeded { output },
                Ok(status) => Outcome::Failed { error: format!("command exited with {status}"), output },
                Err(e) => Outcome::Failed { error: format!("waiting for the command failed: {e}"), output },
            }
        })
    }
}

/// Kills a command's whole process group when dropped while armed.
struct ProcessGroup {
    pid: u32,
    armed: bool,
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(pid) = i32::try_from(self.pid) {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

type Lines = Arc<std::sync::Mutex<VecDeque<String>>>;

/// `text` cut to at most `limit` bytes, at a character boundary, and marked
/// ` [...]` where it was cut: how every output line and error a task keeps
/// is bounded, whoever ran it.
pub fn cut(mut text: String, limit: usize) -> String {
    if text.len() > limit {
        let mut end = limit;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str(" [...]");
    }
    text
}

async fn collect_lines(stream: impl tokio::io::AsyncRead + Unpin, prefix: &'static str, output: Lines) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let line = cut(line, MAX_LINE_BYTES);
        let mut kept = output.lock().expect("output lock");
        if kept.len() == MAX_OUTPUT_LINES {
            kept.pop_front();
        }
        kept.push_back(format!("{prefix}{line}"));
    }
}

fn take_lines(output: &Lines) -> Vec<String> {
    output.lock().expect("output lock").drain(..).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{JobId, TaskIdx, TaskRef};

    fn ctx(job_type: &str, attempt: u32, parameters: serde_json::Value) -> TaskContext {
        let job = JobId::new();
        TaskContext {
            task: TaskRef { job, idx: TaskIdx(0) },
            job,
            job_name: "test".into(),
            task_id: "t1".into(),
            job_type: Arc::from(job_type),
            attempt,
            parameters,
            labels: BTreeMap::new(),
        }
    }

    async fn shell(parameters: serde_json::Value) -> Outcome {
        ShellHandler.execute(ctx("shell", 2, parameters)).await
    }

    #[tokio::test]
    async fn shell_keeps_output_and_sets_the_task_environment() {
        let outcome = shell(serde_json::json!({
            "command": "echo out; echo err >&2; echo $JOBCENTER_TASK_ID $JOBCENTER_ATTEMPT $GREETING",
            "env": {"GREETING": "hello"}
        }))
        .await;
        let Outcome::Succeeded { mut output } = outcome else { panic!("{outcome:?}") };
        output.sort();
        assert_eq!(output, ["out", "stderr: err", "t1 2 hello"]);
    }

    #[tokio::test]
    async fn shell_exit_code_decides() {
        let outcome = shell(serde_json::json!({"argv": ["sh", "-c", "exit 3"]})).await;
        let Outcome::Failed { error, .. } = outcome else { panic!("{outcome:?}") };
        assert!(error.contains("exit status: 3"), "{error}");
        let outcome = shell(serde_json::json!({"argv": ["true"], "cwd": "/"})).await;
        assert!(matches!(outcome, Outcome::Succeeded { .. }), "{outcome:?}");
    }

    #[tokio::test]
    async fn shell_timeout_kills_everything_the_command_started() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let command = format!("sleep 30 & echo $! > {}; sleep 30", pid_file.display());
        let started = tokio::time::Instant::now();
        let outcome = shell(serde_json::json!({"command": command, "timeout_seconds": 1})).await;
        assert!(started.elapsed() < Duration::from_secs(10), "the attempt ended at its timeout");
        let Outcome::Failed { error, .. } = outcome else { panic!("{outcome:?}") };
        assert_eq!(error, "timed out after 1 s");
        let pid = std::fs::read_to_string(&pid_file).unwrap().trim().to_string();
        let mut gone = false;
        for _ in 0..50 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // Gone, or a zombie waiting for its parent (init) to reap it.
            if stat.is_empty() || stat.split(' ').nth(2) == Some("Z") {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(gone, "the background sleep {pid} outlived the timeout");
    }

    #[tokio::test]
    async fn shell_refuses_bad_parameters() {
        for parameters in [
            serde_json::json!({}),
            serde_json::json!({"command": "true", "argv": ["true"]}),
            serde_json::json!({"argv": []}),
            serde_json::json!({"command": "true", "shell": "bash"}),
        ] {
            let outcome = shell(parameters.clone()).await;
            let Outcome::Failed { error, .. } = outcome else { panic!("{parameters} was accepted") };
            assert!(error.starts_with("invalid parameters"), "{parameters}: {error}");
        }
    }

    #[tokio::test]
    async fn noop_fails_as_told() {
        let run = |attempt, parameters| NoopHandler.execute(ctx("noop", attempt, parameters));
        assert!(matches!(run(1, serde_json::json!({})).await, Outcome::Succeeded { .. }));
        assert!(matches!(run(5, serde_json::json!({"fail": true})).await, Outcome::Failed { .. }));
        assert!(matches!(run(2, serde_json::json!({"fail_attempts": 2})).await, Outcome::Failed { .. }));
        assert!(matches!(run(3, serde_json::json!({"fail_attempts": 2})).await, Outcome::Succeeded { .. }));
        let Outcome::Failed { error, .. } = run(1, serde_json::json!({"sleep": 5})).await else { panic!() };
        assert!(error.contains("unknown field `sleep`"), "{error}");
    }
}

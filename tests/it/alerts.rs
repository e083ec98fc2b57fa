//! The alert rules of `docs/alerts.yml`: valid for `promtool check rules`,
//! each raised and left quiet as `docs/alerts_test.yml` says (`promtool test
//! rules`), and reading only metrics a real server exports, which
//! `promtool check metrics` takes.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use crate::support::{self, raw_http, run_with_timeout, start_worker, wait_until, Server};

const DOCS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs");

fn promtool(args: &[&str]) -> std::process::Output {
    let mut command = Command::new("promtool");
    command.args(args).current_dir(DOCS);
    run_with_timeout(command, Duration::from_secs(60))
}

/// The `jobcenter_` metrics an expression names.
fn named(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (start, _) in text.match_indices("jobcenter_") {
        let name: String = text[start..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        names.insert(name);
    }
    names
}

#[test]
fn the_alert_rules_pass_promtool_and_read_what_the_server_exports() {
    let checked = promtool(&["check", "rules", "alerts.yml"]);
    assert!(
        checked.status.success(),
        "{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    let tested = promtool(&["test", "rules", "alerts_test.yml"]);
    assert!(
        tested.status.success(),
        "{}{}",
        String::from_utf8_lossy(&tested.stdout),
        String::from_utf8_lossy(&tested.stderr)
    );

    let rules = std::fs::read_to_string(format!("{DOCS}/alerts.yml")).unwrap();
    let read: BTreeSet<String> = rules
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.contains("summary:") && !l.contains("description:"))
        .flat_map(named)
        .collect();
    assert!(read.len() >= 7, "the rules read jobcenter's metrics: {read:?}");

    // A real server, a worker and a job that ends.
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &["--recovery-interval", "1s"]);
    let _worker = start_worker(&server, "w1", &[], None);
    server.wait_for_workers(1);
    let job = server.submit_file(dir.path(), "nine", &support::nine_tasks(Some(4), 0));
    let scrape = || raw_http::request(&server.http, "GET", "/metrics", &[], None).body;
    let value = |text: &str, series: &str| -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
    };
    let text = wait_until(Duration::from_secs(30), || {
        let text = scrape();
        let ended = value(&text, "jobcenter_jobs_ended_total{state=\"failed\"}")?;
        let checked = value(&text, "jobcenter_recovery_last_check_timestamp_seconds")?;
        (ended >= 1.0 && checked > 0.0).then_some(text)
    })
    .unwrap_or_else(|| panic!("job {job} ended and a recovery check ran: {}", scrape()));
    let exported: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(String::from)
        .collect();
    let missing: Vec<&String> = read.iter().filter(|name| !exported.contains(*name)).collect();
    assert!(missing.is_empty(), "the rules read metrics the server does not export: {missing:?}");
    assert_eq!(value(&text, "jobcenter_ready"), Some(1.0));
    assert_eq!(value(&text, "jobcenter_recovery_interval_seconds"), Some(1.0));
    assert!(value(&text, "jobcenter_worker_sessions_total") >= Some(1.0), "{text}");

    // The exposition itself passes promtool's lint.
    let file = dir.path().join("metrics.txt");
    std::fs::write(&file, &text).unwrap();
    let mut lint = Command::new("sh");
    lint.arg("-c").arg(format!("promtool check metrics < {}", file.display()));
    let linted = run_with_timeout(lint, Duration::from_secs(60));
    assert!(
        linted.status.success(),
        "{}{}",
        String::from_utf8_lossy(&linted.stdout),
        String::from_utf8_lossy(&linted.stderr)
    );
}

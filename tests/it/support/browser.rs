//! A headless Chromium driven through `chromedriver` (WebDriver) for the
//! console tests: a fresh browser profile per `Browser`, bounded waits that
//! poll the page and fail naming what they waited for, and screenshots under
//! `target/console-screenshots/`.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, Locator};
use serde_json::{json, Value};

/// How long a wait polls the page before it fails, unless `set_wait_limit` says otherwise.
pub const WAIT_LIMIT: Duration = Duration::from_secs(20);

const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// How long chromedriver may take to answer, and the browser to start.
const START_LIMIT: Duration = Duration::from_secs(30);

/// Where the screenshots go.
pub fn screenshot_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target").join("console-screenshots")
}

/// Where the chromedriver logs go.
pub fn log_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target").join("console-logs")
}

/// Removes the screenshots an earlier run of `test` left, so that those in
/// the directory are all of the last run.
fn remove_screenshots_of(test: &str) {
    let Ok(entries) = std::fs::read_dir(screenshot_dir()) else { return };
    let prefix = format!("{test}-");
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with(&prefix) && name.ends_with(".png") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// A program on PATH, or a failure that says how to install it.
fn required_program(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|candidate| candidate.is_file()).unwrap_or_else(|| {
        panic!(
            "`{name}` is not on PATH: the console tests drive Debian's chromium through chromium-driver; \
             `.ci/setup` installs both (apt-get install chromium chromium-driver)"
        )
    })
}

/// `chromedriver` in a process group of its own, with the browsers it starts;
/// the whole group is killed when dropped.
struct Driver {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Driver {
    fn start(test: &str) -> Driver {
        let chromedriver = required_program("chromedriver");
        let dir = log_dir();
        std::fs::create_dir_all(&dir).expect("create target/console-logs");
        let log = dir.join(format!("{test}.chromedriver.log"));
        let mut failures = Vec::new();
        // A port found free may be taken before chromedriver binds it: try a few.
        for _ in 0..3 {
            let port = super::free_port();
            let log_file = std::fs::File::create(&log).expect("create the chromedriver log");
            let child = {
                use std::os::unix::process::CommandExt;
                Command::new(&chromedriver)
                    .arg(format!("--port={port}"))
                    .arg("--log-level=INFO")
                    .stdin(Stdio::null())
                    .stdout(log_file.try_clone().unwrap())
                    .stderr(log_file)
                    .process_group(0)
                    .spawn()
                    .unwrap_or_else(|e| panic!("start {}: {e}", chromedriver.display()))
            };
            let mut driver = Driver { child, port, log: log.clone() };
            match driver.wait_until_ready() {
                Ok(()) => return driver,
                Err(failure) => failures.push(failure),
            }
        }
        panic!(
            "chromedriver did not answer on loopback: {failures:?}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    /// Polls `GET /status` until chromedriver says it is ready.
    fn wait_until_ready(&mut self) -> Result<(), String> {
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("chromedriver on port {} exited: {status}", self.port));
            }
            if let Ok((200, body)) = http_get(self.port, "/status") {
                if serde_json::from_str::<Value>(&body).is_ok_and(|s| s["value"]["ready"] == true) {
                    return Ok(());
                }
            }
            if started.elapsed() > START_LIMIT {
                return Err(format!("chromedriver on port {} not ready within {START_LIMIT:?}", self.port));
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        use nix::sys::signal::{killpg, Signal};
        use nix::unistd::Pid;
        let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One plain HTTP/1.1 GET on loopback: (status, body).
fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    http_request(port, "GET", path, "")
}

/// One plain HTTP/1.1 request to chromedriver on loopback, with a JSON body:
/// (status, body), the body read to its Content-Length (chromedriver keeps
/// the connection open).
fn http_request(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let n = stream.read(&mut buffer)?;
        received.extend_from_slice(&buffer[..n]);
        let text = String::from_utf8_lossy(&received);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|line| line.split_once(':').filter(|(name, _)| name.eq_ignore_ascii_case("content-length")))
                .and_then(|(_, value)| value.trim().parse::<usize>().ok());
            if n == 0 || length.is_some_and(|length| body.len() >= length) {
                let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
                return Ok((status, body.to_string()));
            }
        }
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed before a whole response"));
        }
    }
}

/// A cookie as the browser holds it (WebDriver sees HttpOnly cookies too).
#[derive(Debug, Clone)]
pub struct BrowserCookie {
    pub name: String,
    pub value: String,
    pub http_only: bool,
    pub same_site: Option<String>,
    pub path: Option<String>,
}

/// A headless Chromium session on a fresh profile. Every call blocks; every
/// wait is bounded and fails naming what it waited for, after saving a
/// screenshot of the page as it was.
pub struct Browser {
    client: Option<Client>,
    runtime: tokio::runtime::Runtime,
    driver: Driver,
    profile: tempfile::TempDir,
    test: String,
    wait_limit: Duration,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium for the test `test` (the
    /// name its screenshots and logs carry).
    pub fn start(test: &str) -> Browser {
        let chromium = required_program("chromium");
        remove_screenshots_of(test);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let driver = Driver::start(test);
        let profile = tempfile::Builder::new().prefix("console-browser-").tempdir().unwrap();
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--window-size=1280,800",
                    "--no-first-run",
                    "--no-default-browser-check",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            },
            "goog:loggingPrefs": { "browser": "ALL" },
        });
        let Value::Object(capabilities) = capabilities else { unreachable!() };
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let driver_url = driver.url();
        let client = runtime
            .block_on(async {
                let session = Client::with_capabilities_and_connector(&driver_url, &capabilities, connector);
                tokio::time::timeout(START_LIMIT, session).await
            })
            .unwrap_or_else(|_| panic!("no browser session within {START_LIMIT:?}; log: {}", driver.log.display()))
            .unwrap_or_else(|e| {
                panic!(
                    "chromedriver opened no Chromium session: {e}\n{}",
                    std::fs::read_to_string(&driver.log).unwrap_or_default()
                )
            });
        Browser { client: Some(client), runtime, driver, profile, test: test.to_string(), wait_limit: WAIT_LIMIT }
    }

    fn client(&self) -> &Client {
        self.client.as_ref().expect("the session is open")
    }

    /// How long the following waits poll before they fail.
    pub fn set_wait_limit(&mut self, limit: Duration) {
        self.wait_limit = limit;
    }

    /// Opens `url` and waits for the document to load.
    pub fn goto(&self, url: &str) {
        self.runtime.block_on(self.client().goto(url)).unwrap_or_else(|e| panic!("open {url}: {e}"));
    }

    pub fn current_url(&self) -> String {
        self.runtime.block_on(self.client().current_url()).map(|u| u.to_string()).unwrap_or_default()
    }

    /// Runs `script` in the page (its `arguments` are `args`) and returns what it returns.
    pub fn execute(&self, script: &str, args: Vec<Value>) -> Value {
        self.runtime.block_on(self.client().execute(script, args)).unwrap_or_else(|e| panic!("run {script:?}: {e}"))
    }

    /// Runs `script` in the page; it ends by calling `arguments[arguments.length - 1](value)`.
    pub fn execute_async(&self, script: &str, args: Vec<Value>) -> Value {
        self.runtime
            .block_on(self.client().execute_async(script, args))
            .unwrap_or_else(|e| panic!("run {script:?}: {e}"))
    }

    /// The number of elements matching `css` now.
    pub fn count(&self, css: &str) -> usize {
        self.runtime.block_on(self.client().find_all(Locator::Css(css))).map(|all| all.len()).unwrap_or(0)
    }

    /// The rendered text of the first element matching `css`, if there is one now.
    pub fn text_now(&self, css: &str) -> Option<String> {
        self.runtime.block_on(async {
            let element = self.client().find(Locator::Css(css)).await.ok()?;
            element.text().await.ok()
        })
    }

    /// The attribute `name` of the first element matching `css`, if both are there now.
    pub fn attr_now(&self, css: &str, name: &str) -> Option<String> {
        self.runtime.block_on(async {
            let element = self.client().find(Locator::Css(css)).await.ok()?;
            element.attr(name).await.ok()?
        })
    }

    /// The DOM property `name` (such as `value` or `checked`) of the first element matching `css`.
    pub fn prop_now(&self, css: &str, name: &str) -> Option<String> {
        self.runtime.block_on(async {
            let element = self.client().find(Locator::Css(css)).await.ok()?;
            element.prop(name).await.ok()?
        })
    }

    pub fn is_displayed_now(&self, css: &str) -> bool {
        self.runtime.block_on(async {
            match self.client().find(Locator::Css(css)).await {
                Ok(element) => element.is_displayed().await.unwrap_or(false),
                Err(_) => false,
            }
        })
    }

    /// Polls `check` until it gives a value; past the wait limit, saves a
    /// screenshot and fails naming `what` and what `check` saw last.
    pub fn wait<T>(&self, what: &str, mut check: impl FnMut(&Browser) -> Result<T, String>) -> T {
        let started = Instant::now();
        loop {
            let seen = match check(self) {
                Ok(value) => return value,
                Err(seen) => seen,
            };
            if started.elapsed() > self.wait_limit {
                let shot = self.try_screenshot("timeout");
                let log = self.console_log();
                panic!(
                    "{}: waited {:?} for {what}{}; the page is at {}; screenshot: {}; the page's console:\n{}",
                    self.test,
                    self.wait_limit,
                    if seen.is_empty() { String::new() } else { format!(" (last seen: {seen})") },
                    self.current_url(),
                    shot.map(|p| p.display().to_string()).unwrap_or_else(|e| format!("none ({e})")),
                    if log.is_empty() { "(nothing)".to_string() } else { log.join("\n") }
                );
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// Waits until an element matches `css`.
    pub fn wait_for(&self, css: &str) {
        self.wait(&format!("an element `{css}`"), |b| if b.count(css) > 0 { Ok(()) } else { Err(String::new()) });
    }

    /// Waits until the first element matching `css` is displayed.
    pub fn wait_for_visible(&self, css: &str) {
        self.wait(&format!("`{css}` to be visible"), |b| {
            if b.is_displayed_now(css) {
                Ok(())
            } else {
                Err(format!("{} element(s), the first not displayed", b.count(css)))
            }
        });
    }

    /// Waits until no element matches `css`.
    pub fn wait_for_none(&self, css: &str) {
        self.wait(&format!("no element `{css}`"), |b| match b.count(css) {
            0 => Ok(()),
            n => Err(format!("{n} element(s)")),
        });
    }

    /// Waits until the first element matching `css` has attribute `name` equal to `value`.
    pub fn wait_for_attr(&self, css: &str, name: &str, value: &str) {
        self.wait(&format!("`{css}` to have {name}={value:?}"), |b| match b.attr_now(css, name) {
            Some(now) if now == value => Ok(()),
            other => Err(format!("{other:?}")),
        });
    }

    /// Waits until the first element matching `css` reads `expected` (trimmed).
    pub fn wait_for_text(&self, css: &str, expected: &str) {
        self.wait(&format!("`{css}` to read {expected:?}"), |b| match b.text_now(css) {
            Some(text) if text.trim() == expected => Ok(()),
            other => Err(format!("{other:?}")),
        });
    }

    /// Waits until the first element matching `css` has text containing `needle`; returns the text.
    pub fn wait_for_text_containing(&self, css: &str, needle: &str) -> String {
        self.wait(&format!("`{css}` to contain {needle:?}"), |b| match b.text_now(css) {
            Some(text) if text.contains(needle) => Ok(text),
            other => Err(format!("{other:?}")),
        })
    }

    /// Waits until the first element matching `css` has some text; returns it.
    pub fn wait_for_some_text(&self, css: &str) -> String {
        self.wait(&format!("text in `{css}`"), |b| match b.text_now(css) {
            Some(text) if !text.trim().is_empty() => Ok(text),
            other => Err(format!("{other:?}")),
        })
    }

    /// Waits for an element matching `css` and clicks it (as a pointer would,
    /// at its centre), trying again while it is not yet clickable.
    pub fn click(&self, css: &str) {
        self.wait(&format!("`{css}` to take a click"), |b| {
            b.runtime
                .block_on(async {
                    let element = b.client().find(Locator::Css(css)).await?;
                    element.click().await
                })
                .map_err(|e| e.to_string())
        });
    }

    /// Waits for an element matching `css` and types `text` into it, as keystrokes.
    pub fn type_into(&self, css: &str, text: &str) {
        self.wait_for(css);
        self.runtime
            .block_on(async {
                let element = self.client().find(Locator::Css(css)).await?;
                element.send_keys(text).await
            })
            .unwrap_or_else(|e| panic!("type into `{css}`: {e}"));
    }

    /// Waits for an element matching `css` and empties it (an input or textarea).
    pub fn clear(&self, css: &str) {
        self.wait_for(css);
        self.runtime
            .block_on(async {
                let element = self.client().find(Locator::Css(css)).await?;
                element.clear().await
            })
            .unwrap_or_else(|e| panic!("clear `{css}`: {e}"));
    }

    /// Waits for an element matching `css` and returns its rendered text.
    pub fn text(&self, css: &str) -> String {
        self.wait(&format!("an element `{css}` with its text"), |b| b.text_now(css).ok_or_else(String::new))
    }

    /// The page's cookies, HttpOnly ones included.
    pub fn cookies(&self) -> Vec<BrowserCookie> {
        let cookies =
            self.runtime.block_on(self.client().get_all_cookies()).unwrap_or_else(|e| panic!("read cookies: {e}"));
        cookies
            .iter()
            .map(|c| BrowserCookie {
                name: c.name().to_string(),
                value: c.value().to_string(),
                http_only: c.http_only().unwrap_or(false),
                same_site: c.same_site().map(|s| s.to_string()),
                path: c.path().map(str::to_string),
            })
            .collect()
    }

    /// What the page wrote to its console (and its uncaught errors) since
    /// the last call, one `LEVEL message` line each.
    pub fn console_log(&self) -> Vec<String> {
        let Ok(Some(session)) = self.runtime.block_on(self.client().session_id()) else { return Vec::new() };
        let path = format!("/session/{session}/se/log");
        let Ok((200, body)) = http_request(self.driver.port, "POST", &path, r#"{"type":"browser"}"#) else {
            return Vec::new();
        };
        let entries: Value = serde_json::from_str(&body).unwrap_or_default();
        entries["value"]
            .as_array()
            .map(|all| {
                all.iter()
                    .map(|e| format!("{} {}", e["level"].as_str().unwrap_or("?"), e["message"].as_str().unwrap_or("")))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Fails if the page threw an error that nothing caught since the last
    /// look at its console.
    pub fn assert_no_uncaught_errors(&self) {
        let uncaught: Vec<String> = self.console_log().into_iter().filter(|line| line.contains("Uncaught")).collect();
        assert!(uncaught.is_empty(), "{}: the page threw: {uncaught:#?}", self.test);
    }

    /// Saves a screenshot of the window to `target/console-screenshots/<test>-<label>.png`.
    pub fn screenshot(&self, label: &str) -> PathBuf {
        self.try_screenshot(label).unwrap_or_else(|e| panic!("screenshot {label}: {e}"))
    }

    fn try_screenshot(&self, label: &str) -> Result<PathBuf, String> {
        let png = self.runtime.block_on(self.client().screenshot()).map_err(|e| e.to_string())?;
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let path = dir.join(format!("{}-{label}.png", self.test));
        std::fs::write(&path, png).map_err(|e| e.to_string())?;
        Ok(path)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ends the session (chromedriver stops its Chromium); the driver's
        // process group is killed after, whatever happened here.
        if let Some(client) = self.client.take() {
            let _ =
                self.runtime.block_on(async { tokio::time::timeout(Duration::from_secs(10), client.close()).await });
        }
    }
}

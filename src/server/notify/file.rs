//! The notifications file (`--notify FILE`, TOML, or YAML by its
//! `.yaml`/`.yml` name): webhook endpoints, each with its name, its URL,
//! the events it wants and, optionally, the file of the key its deliveries
//! are signed with. A file that breaks a rule is refused whole, with one
//! line naming the file, the line and the rule, as the credentials file is
//! (`surface::access::credentials`, whose readers this uses).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::model::notify::{Kind, Routes};
use crate::server::surface::access::credentials::{is_yaml, line_at, toml_error, yaml_error, yaml_line, FileError};

/// The key deliveries are signed with; never shown.
#[derive(Clone)]
pub(crate) struct Secret(Arc<[u8]>);

impl Secret {
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Where an endpoint is: http or https, a host, a port and a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) https: bool,
    pub(crate) host: String,
    pub(crate) port: u16,
    /// The path and query, `/` at least.
    pub(crate) path: String,
}

impl Target {
    /// The `Host` header's value.
    pub(crate) fn authority(&self) -> String {
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        match (self.https, self.port) {
            (false, 80) | (true, 443) => host,
            _ => format!("{host}:{}", self.port),
        }
    }
}

/// One webhook endpoint.
#[derive(Clone, Debug)]
pub(crate) struct Endpoint {
    pub(crate) name: String,
    /// The URL as written.
    pub(crate) url: String,
    pub(crate) target: Target,
    pub(crate) events: Vec<Kind>,
    pub(crate) secret: Option<Secret>,
}

/// A notifications file as read.
#[derive(Clone, Debug, Default)]
pub(crate) struct Config {
    pub(crate) endpoints: Vec<Endpoint>,
}

impl Config {
    /// Which endpoints want each kind of event.
    pub(crate) fn routes(&self) -> Routes {
        Routes::new(self.endpoints.iter().map(|e| (e.name.as_str(), e.events.as_slice())))
    }

    pub(crate) fn endpoint(&self, name: &str) -> Option<&Endpoint> {
        self.endpoints.iter().find(|e| e.name == name)
    }
}

/// An endpoint as written, before its rules are checked.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Written {
    name: String,
    url: String,
    events: Vec<String>,
    #[serde(default)]
    secret_file: Option<PathBuf>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlFile {
    #[serde(default)]
    endpoint: Vec<toml::Spanned<Written>>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlFile {
    #[serde(default)]
    endpoint: Vec<Written>,
}

/// Reads and checks the file at `path`.
pub(crate) fn read(path: &Path) -> Result<Config, FileError> {
    let text = std::fs::read_to_string(path).map_err(|e| FileError {
        path: path.to_path_buf(),
        line: None,
        rule: format!("cannot be read: {e}"),
    })?;
    parse(path, &text)
}

/// The endpoints of a file's text, each with its line.
fn entries(path: &Path, text: &str) -> Result<Vec<(Written, Option<usize>)>, FileError> {
    if !is_yaml(path) {
        let file: TomlFile = toml::from_str(text).map_err(|e| toml_error(path, text, &e))?;
        return Ok(file
            .endpoint
            .into_iter()
            .map(|s| {
                let line = Some(line_at(text, s.span().start));
                (s.into_inner(), line)
            })
            .collect());
    }
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let file: YamlFile = serde_yaml_ng::from_str(text).map_err(|e| yaml_error(path, &e))?;
    let mut from = 0;
    Ok(file
        .endpoint
        .into_iter()
        .map(|w| {
            let line = yaml_line(text, &mut from, "name", &w.name);
            (w, line)
        })
        .collect())
}

/// An endpoint's URL: http or https, with a host.
fn target(url: &str) -> Result<Target, String> {
    let bad = |why: &str| format!("the url {url:?} {why}");
    let uri: http::Uri = url.parse().map_err(|e| bad(&format!("is not a URL ({e})")))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err(bad("must start with http:// or https://")),
    };
    let authority = uri.authority().ok_or_else(|| bad("has no host"))?;
    if authority.as_str().contains('@') {
        return Err(bad("must not carry a user or password (use secret_file)"));
    }
    let host = authority.host().trim_start_matches('[').trim_end_matches(']').to_string();
    if host.is_empty() {
        return Err(bad("has no host"));
    }
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    let path = uri.path_and_query().map(|p| p.as_str().to_string()).filter(|p| !p.is_empty());
    Ok(Target { https, host, port, path: path.unwrap_or_else(|| "/".into()) })
}

/// The rule an endpoint's name follows.
fn check_name(name: &str) -> Result<(), String> {
    let fits =
        !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if fits {
        Ok(())
    } else {
        Err(format!("the name {name:?} must be 1 to 64 letters, digits, '-' or '_'"))
    }
}

/// The key in `path` (relative to the notifications file's directory),
/// without the line end around it.
fn secret(file: &Path, path: &Path) -> Result<Secret, String> {
    let path = if path.is_relative() { file.parent().unwrap_or(Path::new(".")).join(path) } else { path.to_path_buf() };
    let bytes = std::fs::read(&path).map_err(|e| format!("the secret_file {} cannot be read: {e}", path.display()))?;
    let trimmed = bytes.trim_ascii();
    if trimmed.is_empty() {
        return Err(format!("the secret_file {} is empty", path.display()));
    }
    Ok(Secret(trimmed.into()))
}

/// Checks a file's text: every endpoint's name, URL, events and secret, and names given once.
pub(crate) fn parse(path: &Path, text: &str) -> Result<Config, FileError> {
    let error = |line: Option<usize>, rule: String| FileError { path: path.to_path_buf(), line, rule };
    let mut endpoints: Vec<(Endpoint, Option<usize>)> = Vec::new();
    for (written, line) in entries(path, text)? {
        check_name(&written.name).map_err(|rule| error(line, rule))?;
        let name = written.name;
        if let Some((_, first)) = endpoints.iter().find(|(e, _)| e.name == name) {
            let at = first.map(|l| format!(" (first at line {l})")).unwrap_or_default();
            return Err(error(line, format!("the name {name} is given twice{at}")));
        }
        let target = target(&written.url).map_err(|rule| error(line, format!("endpoint {name}: {rule}")))?;
        let mut events = Vec::new();
        for event in &written.events {
            let kind: Kind = event.parse().map_err(|rule| error(line, format!("endpoint {name}: {rule}")))?;
            if !events.contains(&kind) {
                events.push(kind);
            }
        }
        if events.is_empty() {
            return Err(error(line, format!("endpoint {name}: events names no event")));
        }
        let secret = match &written.secret_file {
            Some(file) => Some(secret(path, file).map_err(|rule| error(line, format!("endpoint {name}: {rule}")))?),
            None => None,
        };
        endpoints.push((Endpoint { name, url: written.url, target, events, secret }, line));
    }
    Ok(Config { endpoints: endpoints.into_iter().map(|(e, _)| e).collect() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(path: &str, text: &str) -> String {
        parse(Path::new(path), text).unwrap_err().to_string()
    }

    #[test]
    fn a_file_gives_each_endpoint_its_target_events_and_secret() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ops.key"), "s3cret\n").unwrap();
        let path = dir.path().join("notify.toml");
        let text = "[[endpoint]]\nname = \"ops\"\nurl = \"https://hooks.example/in?x=1\"\n\
                    events = [\"job.failed\", \"worker.lost\"]\nsecret_file = \"ops.key\"\n\n\
                    [[endpoint]]\nname = \"all\"\nurl = \"http://[::1]:8080\"\nevents = [\"job.succeeded\", \"job.failed\"]\n";
        let config = parse(&path, text).unwrap();
        let ops = config.endpoint("ops").unwrap();
        assert_eq!(ops.target, Target { https: true, host: "hooks.example".into(), port: 443, path: "/in?x=1".into() });
        assert_eq!(ops.target.authority(), "hooks.example");
        assert_eq!(ops.secret.as_ref().unwrap().bytes(), b"s3cret");
        assert!(!format!("{ops:?}").contains("s3cret"), "a secret is never shown");
        let all = config.endpoint("all").unwrap();
        assert_eq!(
            (all.target.port, all.target.path.as_str(), all.target.authority()),
            (8080, "/", "[::1]:8080".into())
        );
        assert_eq!(config.routes().endpoints(Kind::JobFailed), ["ops", "all"]);
        assert_eq!(config.routes().endpoints(Kind::JobSucceeded), ["all"]);
        let yaml = "endpoint:\n  - name: ops\n    url: http://127.0.0.1:9/\n    events: [detection.failed]\n";
        assert_eq!(parse(Path::new("n.yaml"), yaml).unwrap().endpoints[0].events, [Kind::DetectionFailed]);
    }

    #[test]
    fn each_rule_is_named_with_its_file_and_line() {
        let one = |extra: &str| {
            format!("# hooks\n[[endpoint]]\nname = \"ops\"\nurl = \"http://h/\"\nevents = [\"job.failed\"]\n{extra}")
        };
        assert_eq!(
            refused("n.toml", &one("token = \"x\"\n")),
            "n.toml:6: unknown field `token`, expected one of `name`, `url`, `events`, `secret_file`"
        );
        assert_eq!(
            refused("n.toml", "[[endpoint]]\nurl = \"http://h/\"\nevents = [\"job.failed\"]\n"),
            "n.toml:1: missing field `name`"
        );
        assert_eq!(
            refused("n.toml", &format!("{}\n{}", one(""), one(""))),
            "n.toml:8: the name ops is given twice (first at line 2)"
        );
        let bad_url = "[[endpoint]]\nname = \"ops\"\nurl = \"ftp://h/\"\nevents = [\"job.failed\"]\n";
        assert_eq!(
            refused("n.toml", bad_url),
            "n.toml:1: endpoint ops: the url \"ftp://h/\" must start with http:// or https://"
        );
        let bad_event = "\n[[endpoint]]\nname = \"ops\"\nurl = \"http://h/\"\nevents = [\"job.exploded\"]\n";
        assert!(refused("n.toml", bad_event).starts_with("n.toml:2: endpoint ops: unknown event \"job.exploded\""));
        let no_key = one("secret_file = \"/nonexistent/ops.key\"\n");
        assert!(refused("n.toml", &no_key)
            .starts_with("n.toml:2: endpoint ops: the secret_file /nonexistent/ops.key cannot be read"));
        let yaml = "endpoint:\n  - name: ops\n    url: http://h/\n    events: [job.failed]\n  - name: ops\n    url: http://h/\n    events: [job.failed]\n";
        assert_eq!(refused("n.yml", yaml), "n.yml:5: the name ops is given twice (first at line 2)");
        assert!(refused("n.yaml", "endpoint:\n  - name: [\n").starts_with("n.yaml:"));
    }
}

//! The credentials file (`--credentials FILE`, TOML, or YAML by its
//! `.yaml`/`.yml` name): named tokens, each with its role, kept as argon2
//! hashes, and the roles of client certificates (mutual TLS) by their
//! subject or one of their alternative names. A file that breaks a rule is
//! refused whole, with one line naming the file, the line and the rule; a
//! token is `NAME.SECRET`, so that it is verified against its own entry
//! only.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;

use super::Role;

/// One named token.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub(crate) name: Arc<str>,
    pub(crate) role: Role,
    /// The token's argon2 hash, in its PHC form.
    pub(crate) hash: Arc<str>,
}

/// What a client certificate must show to get a role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Shows {
    /// Its subject, compared without the spaces around `,` and `=`.
    Subject(String),
    /// One of its subject alternative names: a DNS name, an IP address, a
    /// URI or an email address.
    Name(String),
}

/// A credentials file as read.
#[derive(Clone, Debug, Default)]
pub(crate) struct Credentials {
    by_name: HashMap<Arc<str>, Entry>,
    /// Client certificates' roles, in the file's order: the first that
    /// matches gives its role.
    certificates: Vec<(Shows, Role)>,
}

/// Who a client certificate says it is.
#[derive(Debug, Default)]
pub(crate) struct Presented {
    subject: String,
    names: Vec<String>,
}

impl Presented {
    /// The subject and alternative names of a DER certificate.
    pub(crate) fn of(der: &[u8]) -> Option<Presented> {
        use x509_parser::extensions::GeneralName;
        let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = normal_subject(&certificate.subject().to_string());
        let mut names = Vec::new();
        if let Ok(Some(alternative)) = certificate.subject_alternative_name() {
            for name in &alternative.value.general_names {
                match name {
                    GeneralName::DNSName(n) | GeneralName::URI(n) | GeneralName::RFC822Name(n) => {
                        names.push(n.to_string())
                    }
                    GeneralName::IPAddress(bytes) => {
                        let address = match bytes.len() {
                            4 => <[u8; 4]>::try_from(*bytes).ok().map(|b| std::net::IpAddr::from(b).to_string()),
                            16 => <[u8; 16]>::try_from(*bytes).ok().map(|b| std::net::IpAddr::from(b).to_string()),
                            _ => None,
                        };
                        names.extend(address);
                    }
                    _ => {}
                }
            }
        }
        Some(Presented { subject, names })
    }
}

/// A subject without the spaces around its `,` and `=`.
fn normal_subject(subject: &str) -> String {
    subject
        .split(',')
        .map(|part| part.split('=').map(str::trim).collect::<Vec<_>>().join("="))
        .collect::<Vec<_>>()
        .join(",")
}

impl Credentials {
    pub(crate) fn named(&self, name: &str) -> Option<&Entry> {
        self.by_name.get(name)
    }

    /// The role a client certificate gets, and what it showed for it.
    pub(crate) fn certificate(&self, presented: &Presented) -> Option<(String, Role)> {
        self.certificates.iter().find_map(|(shows, role)| match shows {
            Shows::Subject(subject) if *subject == presented.subject => Some((subject.clone(), *role)),
            Shows::Name(name) if presented.names.contains(name) => Some((name.clone(), *role)),
            _ => None,
        })
    }

    pub(crate) fn has_certificates(&self) -> bool {
        !self.certificates.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.by_name.len()
    }
}

/// A credentials file that cannot be used: where, and the rule it breaks.
#[derive(Debug, thiserror::Error)]
#[error("{}{}: {rule}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct FileError {
    pub path: PathBuf,
    pub line: Option<usize>,
    pub rule: String,
}

/// The entry as written, before its rules are checked.
#[derive(serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct Written {
    name: String,
    role: String,
    hash: String,
}

/// A client certificate's rule as written: its subject or one of its names.
#[derive(serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct WrittenCertificate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    san: Option<String>,
    role: String,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlFile {
    #[serde(default)]
    credential: Vec<toml::Spanned<Written>>,
    #[serde(default)]
    certificate: Vec<toml::Spanned<WrittenCertificate>>,
}

#[derive(serde::Deserialize, serde::Serialize, Default)]
#[serde(deny_unknown_fields)]
struct YamlFile {
    #[serde(default)]
    credential: Vec<Written>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    certificate: Vec<WrittenCertificate>,
}

/// A file's entries, each with its line.
#[derive(Default)]
struct Entries {
    credentials: Vec<(Written, Option<usize>)>,
    certificates: Vec<(WrittenCertificate, Option<usize>)>,
}

pub(crate) fn is_yaml(path: &Path) -> bool {
    matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
}

/// The 1-based line of a byte offset.
pub(crate) fn line_at(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())].iter().filter(|b| **b == b'\n').count() + 1
}

/// Reads and checks the file at `path`.
pub(crate) fn read(path: &Path) -> Result<Credentials, FileError> {
    let text = std::fs::read_to_string(path).map_err(|e| FileError {
        path: path.to_path_buf(),
        line: None,
        rule: format!("cannot be read: {e}"),
    })?;
    parse(path, &text)
}

/// The line at or after `from` whose key `key` holds `value` (YAML keeps
/// no positions), and the line after it.
pub(crate) fn yaml_line(text: &str, from: &mut usize, key: &str, value: &str) -> Option<usize> {
    let (index, _) = text.lines().enumerate().skip(*from).find(|(_, line)| {
        let line = line.trim_start().trim_start_matches("- ").trim_start();
        line.strip_prefix(key)
            .and_then(|rest| rest.strip_prefix(':'))
            .is_some_and(|v| v.trim().trim_matches(['"', '\'']) == value)
    })?;
    *from = index + 1;
    Some(index + 1)
}

/// A TOML file that does not parse: the line and the parser's words.
pub(crate) fn toml_error(path: &Path, text: &str, e: &toml::de::Error) -> FileError {
    let line = e.span().map(|s| line_at(text, s.start));
    FileError { path: path.to_path_buf(), line, rule: e.message().trim_end().to_string() }
}

/// A YAML file that does not parse: the line and the parser's words, less
/// their own "at line L column C".
pub(crate) fn yaml_error(path: &Path, e: &serde_yaml_ng::Error) -> FileError {
    let line = e.location().map(|l| l.line());
    let message = e.to_string();
    let rule = message.split(" at line ").next().unwrap_or(&message).to_string();
    FileError { path: path.to_path_buf(), line, rule }
}

/// The entries of a file's text, each with its line.
fn entries(path: &Path, text: &str) -> Result<Entries, FileError> {
    if !is_yaml(path) {
        let file: TomlFile = toml::from_str(text).map_err(|e| toml_error(path, text, &e))?;
        let with_line = |span: std::ops::Range<usize>| Some(line_at(text, span.start));
        return Ok(Entries {
            credentials: file
                .credential
                .into_iter()
                .map(|s| (with_line(s.span()), s.into_inner()))
                .map(|(l, w)| (w, l))
                .collect(),
            certificates: file
                .certificate
                .into_iter()
                .map(|s| (with_line(s.span()), s.into_inner()))
                .map(|(l, w)| (w, l))
                .collect(),
        });
    }
    if text.trim().is_empty() {
        return Ok(Entries::default());
    }
    let file: YamlFile = serde_yaml_ng::from_str(text).map_err(|e| yaml_error(path, &e))?;
    let mut from = 0;
    let credentials = file
        .credential
        .into_iter()
        .map(|w| {
            let line = yaml_line(text, &mut from, "name", &w.name);
            (w, line)
        })
        .collect();
    let mut from = 0;
    let certificates = file
        .certificate
        .into_iter()
        .map(|w| {
            let (key, value) = match (&w.subject, &w.san) {
                (Some(subject), _) => ("subject", subject.clone()),
                (None, Some(san)) => ("san", san.clone()),
                (None, None) => ("role", w.role.clone()),
            };
            let line = yaml_line(text, &mut from, key, &value);
            (w, line)
        })
        .collect();
    Ok(Entries { credentials, certificates })
}

/// The rule a credential's name follows.
fn check_name(name: &str) -> Result<(), String> {
    let fits =
        !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if fits {
        Ok(())
    } else {
        Err(format!("the name {name:?} must be 1 to 64 letters, digits, '-' or '_'"))
    }
}

/// Checks a file's text: every entry's name, role and hash, and names given once.
pub(crate) fn parse(path: &Path, text: &str) -> Result<Credentials, FileError> {
    let error = |line: Option<usize>, rule: String| FileError { path: path.to_path_buf(), line, rule };
    let entries = entries(path, text)?;
    let mut by_name: HashMap<Arc<str>, (Entry, Option<usize>)> = HashMap::new();
    for (written, line) in entries.credentials {
        check_name(&written.name).map_err(|rule| error(line, rule))?;
        let role: Role =
            written.role.parse().map_err(|rule| error(line, format!("credential {}: {rule}", written.name)))?;
        let hash = PasswordHash::new(&written.hash).ok().filter(|h| h.algorithm.as_str().starts_with("argon2"));
        if hash.is_none() {
            return Err(error(
                line,
                format!(
                    "credential {}: the hash is not an argon2 hash (a token's hash is made by `jobcenter credentials add`)",
                    written.name
                ),
            ));
        }
        let name: Arc<str> = written.name.as_str().into();
        if let Some((_, first)) = by_name.get(&name) {
            let at = first.map(|l| format!(" (first at line {l})")).unwrap_or_default();
            return Err(error(line, format!("the name {} is given twice{at}", written.name)));
        }
        let entry = Entry { name: name.clone(), role, hash: written.hash.as_str().into() };
        by_name.insert(name, (entry, line));
    }
    let mut certificates = Vec::new();
    for (written, line) in entries.certificates {
        let shows = match (written.subject, written.san) {
            (Some(subject), None) if !subject.trim().is_empty() => Shows::Subject(normal_subject(&subject)),
            (None, Some(san)) if !san.trim().is_empty() => Shows::Name(san.trim().to_string()),
            _ => return Err(error(line, "a certificate's rule gives either its subject or its san, not both".into())),
        };
        let role: Role = written.role.parse().map_err(|rule| error(line, format!("certificate: {rule}")))?;
        certificates.push((shows, role));
    }
    Ok(Credentials { by_name: by_name.into_iter().map(|(name, (entry, _))| (name, entry)).collect(), certificates })
}

/// The name a token says it is for: what comes before its last `.`.
pub(crate) fn name_of(token: &str) -> Option<&str> {
    token.rsplit_once('.').map(|(name, _)| name).filter(|name| check_name(name).is_ok())
}

/// Whether `token` is the one `hash` was made of (slow by design).
pub(crate) fn verify(token: &str, hash: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|hash| Argon2::default().verify_password(token.as_bytes(), &hash).is_ok())
}

fn hash(token: &str) -> String {
    let salt = SaltString::encode_b64(uuid::Uuid::new_v4().as_bytes()).expect("16 bytes make a salt");
    Argon2::default().hash_password(token.as_bytes(), &salt).expect("argon2's default parameters hash").to_string()
}

/// A new token for `name`, and its entry as TOML.
pub(crate) fn make(name: &str, role: Role) -> (String, String) {
    let secret = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    let token = format!("{name}.{secret}");
    let hash = hash(&token);
    let entry = format!("\n[[credential]]\nname = \"{name}\"\nrole = \"{role}\"\nhash = \"{hash}\"\n");
    (token, entry)
}

/// What `jobcenter credentials add` does: a new token for `name` with
/// `role`, its hash added to the file at `path` (made when it is not
/// there, readable by its owner only); the token is returned, to be shown
/// once. A YAML file is written again whole (its comments are not kept); a
/// TOML file gets the entry at its end.
pub(crate) fn add(path: &Path, name: &str, role: Role) -> Result<String, FileError> {
    let error = |rule: String| FileError { path: path.to_path_buf(), line: None, rule };
    check_name(name).map_err(error)?;
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(error(format!("cannot be read: {e}"))),
    };
    let existing = parse(path, &text)?;
    if existing.named(name).is_some() {
        return Err(error(format!("a credential named {name} is there already: remove its entry first")));
    }
    let (token, entry) = make(name, role);
    let new_text = if is_yaml(path) {
        let mut file: YamlFile = if text.trim().is_empty() {
            YamlFile::default()
        } else {
            serde_yaml_ng::from_str(&text).unwrap_or_default()
        };
        let hash = entry.lines().find_map(|l| l.strip_prefix("hash = \"")).unwrap_or("").trim_end_matches('"');
        file.credential.push(Written { name: name.to_string(), role: role.to_string(), hash: hash.to_string() });
        serde_yaml_ng::to_string(&file).map_err(|e| error(e.to_string()))?
    } else {
        format!("{text}{entry}")
    };
    parse(path, &new_text)?;
    write_private(path, &new_text).map_err(|e| error(format!("cannot be written: {e}")))?;
    Ok(token)
}

/// Writes `text` to `path` in one step (a file beside it, renamed over it),
/// readable and writable by its owner only.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let beside = path.with_extension("new");
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&beside)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&beside, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(path: &str, text: &str) -> String {
        parse(Path::new(path), text).unwrap_err().to_string()
    }

    #[test]
    fn a_made_token_verifies_against_its_own_hash_only() {
        let (token, entry) = make("ann", Role::Operator);
        let credentials = parse(Path::new("c.toml"), &entry).unwrap();
        let ann = credentials.named("ann").unwrap();
        assert_eq!(ann.role, Role::Operator);
        assert_eq!(name_of(&token), Some("ann"));
        assert!(verify(&token, &ann.hash));
        assert!(!verify(&format!("{token}0"), &ann.hash));
        assert!(!verify(&token, "not a hash"));
        assert!(!entry.contains(token.rsplit_once('.').unwrap().1), "the file keeps no secret");
    }

    #[test]
    fn each_rule_is_named_with_its_file_and_line() {
        let (_, good) = make("ann", Role::Viewer);
        let hash = good.lines().find_map(|l| l.strip_prefix("hash = ")).unwrap();
        let twice = format!("{good}{good}");
        assert_eq!(refused("c.toml", &twice), "c.toml:7: the name ann is given twice (first at line 2)");
        let bad_role = format!("[[credential]]\nname = \"bo\"\nrole = \"root\"\nhash = {hash}\n");
        assert_eq!(
            refused("c.toml", &bad_role),
            "c.toml:1: credential bo: unknown role \"root\": a role is viewer, operator, worker, instance or admin"
        );
        let plain = "# ours\n[[credential]]\nname = \"bo\"\nrole = \"viewer\"\nhash = \"hunter2\"\n";
        assert!(refused("c.toml", plain).starts_with("c.toml:2: credential bo: the hash is not an argon2 hash"));
        let bad_name = format!("[[credential]]\nname = \"b o\"\nrole = \"viewer\"\nhash = {hash}\n");
        assert!(refused("c.toml", &bad_name).starts_with("c.toml:1: the name \"b o\" must be"));
        let unknown = "[[credential]]\nname = \"bo\"\nrole = \"viewer\"\nhash = \"x\"\ntoken = \"x\"\n";
        assert_eq!(
            refused("c.toml", unknown),
            "c.toml:5: unknown field `token`, expected one of `name`, `role`, `hash`"
        );
        assert!(refused("c.toml", "[[credential]\n").starts_with("c.toml:1: "));
    }

    #[test]
    fn a_yaml_file_follows_the_same_rules() {
        let (token, entry) = make("ann", Role::Worker);
        let hash = entry.lines().find_map(|l| l.strip_prefix("hash = ")).unwrap();
        let yaml = format!("credential:\n  - name: ann\n    role: worker\n    hash: {hash}\n");
        let credentials = parse(Path::new("c.yaml"), &yaml).unwrap();
        assert!(verify(&token, &credentials.named("ann").unwrap().hash));
        let twice = format!("{yaml}  - name: ann\n    role: viewer\n    hash: {hash}\n");
        assert_eq!(refused("c.yml", &twice), "c.yml:5: the name ann is given twice (first at line 2)");
        assert!(refused("c.yaml", "credential:\n  - name: [\n").starts_with("c.yaml:"));
    }

    #[test]
    fn added_credentials_keep_the_file_valid_and_refuse_a_name_twice() {
        let dir = tempfile::tempdir().unwrap();
        for file in ["c.toml", "c.yaml"] {
            let path = dir.path().join(file);
            let ann = add(&path, "ann", Role::Viewer).unwrap();
            let bo = add(&path, "bo", Role::Admin).unwrap();
            let credentials = read(&path).unwrap();
            assert_eq!(credentials.len(), 2);
            assert!(verify(&ann, &credentials.named("ann").unwrap().hash));
            assert!(verify(&bo, &credentials.named("bo").unwrap().hash));
            assert!(add(&path, "ann", Role::Viewer).unwrap_err().rule.contains("is there already"));
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
    }

    #[test]
    fn a_certificate_gets_the_role_of_its_subject_or_one_of_its_names() {
        let key = rcgen::KeyPair::generate().unwrap();
        let names = vec!["worker-a.example".to_string(), "10.0.0.7".to_string()];
        let mut params = rcgen::CertificateParams::new(names).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, "worker-a");
        params.distinguished_name.push(rcgen::DnType::OrganizationName, "ops");
        let der = params.self_signed(&key).unwrap().der().to_vec();
        let presented = Presented::of(&der).unwrap();
        let role = |rules: &str| parse(Path::new("c.toml"), rules).unwrap().certificate(&presented);
        assert_eq!(
            role("[[certificate]]\nsan = \"worker-a.example\"\nrole = \"worker\"\n"),
            Some(("worker-a.example".to_string(), Role::Worker))
        );
        assert_eq!(role("[[certificate]]\nsan = \"10.0.0.7\"\nrole = \"viewer\"\n").map(|r| r.1), Some(Role::Viewer));
        assert_eq!(
            role("[[certificate]]\nsubject = \"CN = worker-a, O = ops\"\nrole = \"instance\"\n"),
            Some(("CN=worker-a,O=ops".to_string(), Role::Instance)),
            "{presented:?}"
        );
        assert_eq!(role("[[certificate]]\nsubject = \"CN=worker-b\"\nrole = \"admin\"\n"), None);
        assert_eq!(role("[[certificate]]\nsan = \"worker-b.example\"\nrole = \"admin\"\n"), None);
        let first = "[[certificate]]\nsan = \"worker-a.example\"\nrole = \"viewer\"\n\n[[certificate]]\nsubject = \"CN=worker-a,O=ops\"\nrole = \"admin\"\n";
        assert_eq!(role(first).map(|r| r.1), Some(Role::Viewer), "the first rule that matches");
        let yaml = "certificate:\n  - san: worker-a.example\n    role: worker\n";
        let credentials = parse(Path::new("c.yaml"), yaml).unwrap();
        assert_eq!(credentials.certificate(&presented).map(|r| r.1), Some(Role::Worker));
        assert_eq!(
            refused("c.toml", "[[credential]]\nname=\"a\"\nrole=\"viewer\"\nhash=\"x\"\n"),
            "c.toml:1: credential a: the hash is not an argon2 hash (a token's hash is made by `jobcenter credentials add`)"
        );
        assert_eq!(
            refused("c.toml", "# ours\n[[certificate]]\nsubject = \"CN=a\"\nsan = \"a\"\nrole = \"viewer\"\n"),
            "c.toml:2: a certificate's rule gives either its subject or its san, not both"
        );
        assert_eq!(
            refused("c.yaml", "certificate:\n  - san: a\n    role: root\n"),
            "c.yaml:2: certificate: unknown role \"root\": a role is viewer, operator, worker, instance or admin"
        );
    }
}

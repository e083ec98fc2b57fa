//! Repository hygiene that review would otherwise repeat: every Rust file
//! opens with a `//!` line saying what it is for, and the integration tests
//! stay one binary.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target" || n.to_string_lossy().starts_with('.')) {
                continue;
            }
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_rust_file_opens_with_a_module_doc() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "tests", "benches", "recovery"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 10, "found only {} files", files.len());
    let missing: Vec<String> = files
        .iter()
        .filter(|f| !std::fs::read_to_string(f).unwrap_or_default().starts_with("//!"))
        .map(|f| f.strip_prefix(root).unwrap_or(f).display().to_string())
        .collect();
    assert!(missing.is_empty(), "files without a leading //! line: {missing:?}");
}

/// Files under `src/` that mention `needle` outside comments.
fn src_files_naming(needle: &str) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files
        .iter()
        .filter(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .any(|line| line.contains(needle) && !line.contains(&format!("self::{needle}")))
        })
        .map(|f| f.strip_prefix(root).unwrap_or(f).display().to_string())
        .collect()
}

#[test]
fn each_storage_engine_is_named_in_its_own_module_only() {
    assert_eq!(src_files_naming("sled::"), ["src/store/sled.rs"], "sled is named outside src/store/sled.rs");
    let database: Vec<String> = ["tokio_postgres", "deadpool_postgres", "refinery"]
        .iter()
        .flat_map(|needle| src_files_naming(needle))
        .filter(|f| !f.starts_with("src/store/postgres/"))
        .collect();
    assert!(database.is_empty(), "the database driver is named outside src/store/postgres/: {database:?}");
}

#[test]
fn dependencies_point_inward() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (dir, forbidden) in [("src/worker", "crate::server"), ("src/model", "crate::engine"), ("src/model", "tokio")] {
        let mut files = Vec::new();
        rust_files(&root.join(dir), &mut files);
        let offending: Vec<String> = files
            .iter()
            .filter(|f| std::fs::read_to_string(f).unwrap_or_default().contains(forbidden))
            .map(|f| f.strip_prefix(root).unwrap_or(f).display().to_string())
            .collect();
        assert!(offending.is_empty(), "{dir} must not use {forbidden}: {offending:?}");
    }
}

#[test]
fn only_main_ends_or_replaces_the_process() {
    assert_eq!(
        src_files_naming("process::exit"),
        ["src/main.rs"],
        "library code must not exit: return a crate::fate::Fatal"
    );
    assert_eq!(src_files_naming(".exec()"), ["src/main.rs"], "only main starts the process over");
    // The crash points of the kill tests stand for a power cut, on request only.
    assert_eq!(src_files_naming("process::abort"), ["src/crash.rs"], "library code must not abort");
}

#[test]
fn the_integration_tests_are_one_binary() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Nothing directly under tests/ that cargo would build as a test of its
    // own: no `tests/NAME.rs`, no `tests/NAME/main.rs` but tests/it's.
    let mut stray: Vec<String> = std::fs::read_dir(root.join("tests"))
        .expect("read tests/")
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            path.extension().is_some_and(|e| e == "rs")
                || (path.join("main.rs").is_file() && path.file_name().is_some_and(|n| n != "it"))
        })
        .map(|path| path.strip_prefix(root).unwrap_or(&path).display().to_string())
        .collect();
    stray.sort();
    assert!(
        stray.is_empty(),
        "tests are modules of tests/it (tests/it/NAME.rs, `mod NAME;` in its main.rs): {stray:?}"
    );

    // Cargo.toml names that binary as its only test target.
    let manifest: toml::Table = std::fs::read_to_string(root.join("Cargo.toml")).unwrap().parse().unwrap();
    let targets: Vec<(&str, &str)> = manifest
        .get("test")
        .and_then(|t| t.as_array())
        .into_iter()
        .flatten()
        .map(|t| (t["name"].as_str().unwrap_or_default(), t["path"].as_str().unwrap_or_default()))
        .collect();
    assert_eq!(targets, [("it", "tests/it/main.rs")], "Cargo.toml's [[test]] targets");
    assert_eq!(manifest["package"].get("autotests").and_then(|a| a.as_bool()), Some(false), "autotests = false");

    // Each file of tests/it is a module of the binary: one left out would
    // never be built nor run.
    let main = std::fs::read_to_string(root.join("tests/it/main.rs")).unwrap();
    let mut unreached: Vec<String> = std::fs::read_dir(root.join("tests/it"))
        .expect("read tests/it/")
        .flatten()
        .filter_map(|entry| {
            let path = entry.path();
            let module = match path.extension() {
                Some(e) if e == "rs" => path.file_stem()?.to_str()?.to_string(),
                None if path.join("mod.rs").is_file() => path.file_name()?.to_str()?.to_string(),
                _ => return None,
            };
            (module != "main" && !main.lines().any(|line| line == format!("mod {module};"))).then_some(module)
        })
        .collect();
    unreached.sort();
    assert!(unreached.is_empty(), "modules of tests/it that tests/it/main.rs does not declare: {unreached:?}");
}

#[test]
fn every_retry_pace_is_one_backoff() {
    // A pause doubled by hand is a second retry policy: use crate::backoff::Backoff.
    let mut by_hand = src_files_naming("* 2).min(");
    by_hand.extend(src_files_naming("saturating_mul(2).min("));
    assert!(by_hand.is_empty(), "pauses doubled by hand: {by_hand:?}");
    assert_eq!(src_files_naming("backon::"), ["src/backoff.rs"], "the backoff crate is named outside src/backoff.rs");
}

#[test]
fn anyhow_is_used_only_by_the_command_line() {
    // Past the CLI an error is a type that says what went wrong, so that a
    // caller can tell a busy duty from a missing store (see docs/ARCHITECTURE.md).
    let outside: Vec<String> = src_files_naming("anyhow").into_iter().filter(|f| !f.starts_with("src/cli/")).collect();
    assert!(outside.is_empty(), "anyhow used outside src/cli/: {outside:?}");
}

#[test]
fn no_match_arm_is_longer_than_40_lines() {
    // A long arm is a step of its own: give it a name and a function.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let mut long = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        for (at, line) in lines.iter().enumerate() {
            let body = line.trim_start();
            if !line.ends_with("=> {") || body.starts_with("//") {
                continue;
            }
            let indent = &line[..line.len() - body.len()];
            let (close, close_comma) = (format!("{indent}}}"), format!("{indent}}},"));
            let end = lines[at + 1..].iter().position(|l| *l == close || *l == close_comma).map_or(0, |n| n + 1);
            if end + 1 > 40 {
                long.push(format!(
                    "{}:{} ({} lines)",
                    file.strip_prefix(root).unwrap_or(file).display(),
                    at + 1,
                    end + 1
                ));
            }
        }
    }
    assert!(long.is_empty(), "match arms over 40 lines: {long:?}");
}

#[test]
fn the_engine_reads_no_label_by_name() {
    // SeaweedFS's label names are read once, into a task's Placement (src/model/spec.rs).
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src/engine"), &mut files);
    rust_files(&root.join("src/dispatch"), &mut files);
    files.extend(["src/leader.rs", "src/follower.rs", "src/active.rs"].map(|f| root.join(f)));
    assert!(files.iter().all(|f| f.exists()), "{files:?}");
    let reading: Vec<String> = files
        .iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            text.contains("labels.get(") || text.contains("labels[") || text.contains("serde_json::from_str")
        })
        .map(|f| f.strip_prefix(root).unwrap_or(f).display().to_string())
        .collect();
    assert!(reading.is_empty(), "the engine reads labels or parameters: {reading:?}");
}

#[test]
fn the_state_machine_does_no_io() {
    // The engine's core and the pure steps it calls take `now` and do no
    // I/O: they await nothing, read no clock, spawn nothing, open nothing.
    // Only the engine's loop (src/engine/run_loop.rs) feeds them.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src/engine/core", "src/scheduler"] {
        rust_files(&root.join(dir), &mut files);
    }
    let pure = [
        "engine/core.rs",
        "engine/attempts.rs",
        "follower.rs",
        "leader.rs",
        "active.rs",
        "dispatch/mod.rs",
        "dispatch/open.rs",
        "retention.rs",
    ];
    files.extend(pure.iter().chain(&["policy.rs", "dag.rs", "windows.rs"]).map(|f| root.join("src").join(f)));
    let io = [
        "async fn",
        ".await",
        "tokio::time",
        "tokio::spawn",
        "tokio::fs",
        "tokio::net",
        "std::fs",
        "std::net",
        "std::thread",
        "std::process",
        "Instant::now",
        "SystemTime",
        "Clock",
    ];
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        // Their unit tests may use a clock.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for needle in io.iter().filter(|needle| code.contains(**needle)) {
            found.push(format!("{} uses {needle}", file.strip_prefix(root).unwrap_or(file).display()));
        }
    }
    assert!(files.len() > 12, "found only {} files", files.len());
    assert!(found.is_empty(), "the state machine does I/O: {found:?}");
}

#[test]
fn the_store_test_suite_is_not_in_the_shipped_library() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let store = std::fs::read_to_string(root.join("src/store/mod.rs")).expect("src/store/mod.rs");
    let lines: Vec<&str> = store.lines().map(str::trim).collect();
    for module in ["pub mod conformance;", "pub mod stored_v1;"] {
        let at = lines.iter().position(|l| *l == module).unwrap_or_else(|| panic!("src/store/mod.rs: no `{module}`"));
        assert_eq!(
            lines[at.saturating_sub(1)],
            "#[cfg(any(test, feature = \"testsuite\"))]",
            "src/store/mod.rs: `{module}` must be built for the tests only"
        );
    }
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let default = manifest.lines().find(|l| l.starts_with("default = ")).expect("Cargo.toml: no default features");
    assert!(!default.contains("testsuite"), "Cargo.toml: the shipped build must not turn on testsuite: {default}");
}

/// A port a test picks for a process to bind later comes from
/// `support::free_port`, not from the kernel's ephemeral ports, which any
/// connection may take before the process binds it.
#[test]
fn a_port_picked_for_a_process_comes_from_the_tests_own_range() {
    let mut files = Vec::new();
    rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it"), &mut files);
    let picked = ["bind(\"127.0.0.1:0\")", ".local_addr().unwrap().port()"].concat();
    let picked = picked.replacen(")", ").unwrap()", 1);
    let offenders: Vec<String> = files
        .iter()
        .filter(|path| std::fs::read_to_string(path).unwrap_or_default().contains(&picked))
        .map(|path| path.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "ports picked from the ephemeral range (use support::free_port): {offenders:?}");
}

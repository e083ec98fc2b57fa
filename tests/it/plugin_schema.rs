//! The worker stream's schema against the one SeaweedFS ships: the
//! `plugin.proto` file descriptor embedded in the installed `weed` (4.48) is
//! extracted from the binary and compared, message by message and field by
//! field, with `proto/plugin.proto` compiled by protox; and messages built
//! from the binary's schema, every field set, go through our generated stream
//! types and must come out whole. `proto/worker.proto`, the part of
//! SeaweedFS's task parameters jobcenter reads and writes, is checked field
//! by field against the `worker.proto` the binary embeds the same way.
//!
//! Go's protobuf runtime keeps each `.proto` file's serialized
//! `FileDescriptorProto` in the binary's data, starting with its name field
//! (`0x0a`, a length, `plugin.proto`). Protobuf has no terminator, so the
//! extraction walks the top-level fields from there and stops at the first one
//! that cannot belong to a `FileDescriptorProto`.

use crate::support::seaweedfs;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use jobcenter::proto::plugin;
use prost::bytes::Bytes;
use prost::Message;
use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor, ReflectMessage, Value,
};
use prost_types::{
    DescriptorProto, EnumDescriptorProto, FieldDescriptorProto, FileDescriptorProto, FileDescriptorSet,
    MethodDescriptorProto, ServiceDescriptorProto,
};

/// The SeaweedFS release whose schema ours must equal.
const WEED_VERSION: &str = "4.48";
/// The schema file, by the name Go registers it under, and its package.
const SCHEMA_FILE: &str = "plugin.proto";
const SCHEMA_PACKAGE: &str = "plugin";

// ---------------------------------------------------------------------------
// The schema inside the binary

/// The installed `weed`, its version, and the schema it embeds.
struct Weed {
    path: PathBuf,
    version: String,
    file: FileDescriptorProto,
}

fn weed_schema() -> &'static Weed {
    static WEED: OnceLock<Weed> = OnceLock::new();
    WEED.get_or_init(|| {
        let path = seaweedfs::weed().to_path_buf();
        let version = weed_version(&path);
        assert_eq!(
            version,
            WEED_VERSION,
            "{} is SeaweedFS {version}, the schema is checked against {WEED_VERSION}: run `bash .ci/setup`",
            path.display()
        );
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let file = embedded_descriptor(&data, SCHEMA_FILE, SCHEMA_PACKAGE)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Weed { path, version, file }
    })
}

/// The release number `weed version` prints (`version 8000GB 4.48 pypi linux amd64`).
fn weed_version(weed: &Path) -> String {
    let output = Command::new(weed)
        .arg("version")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} version: {e}: run `bash .ci/setup`", weed.display()));
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().find(|line| line.starts_with("version ")).unwrap_or_else(|| {
        panic!("`{} version` printed no version line: {text:?}", weed.display());
    });
    let release = line.split_whitespace().skip(1).find(|word| {
        let mut parts = word.split('.');
        let numeric = |part: Option<&str>| part.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        numeric(parts.next()) && numeric(parts.next())
    });
    release.unwrap_or_else(|| panic!("no release number in {line:?}")).to_string()
}

/// The serialized `FileDescriptorProto` named `name` (or `DIR/name`) of
/// package `package` somewhere in `data`.
fn embedded_descriptor(data: &[u8], name: &str, package: &str) -> Result<FileDescriptorProto, String> {
    let needle = name.as_bytes();
    let mut found: Vec<FileDescriptorProto> = Vec::new();
    let mut other_packages = BTreeSet::new();
    let mut from = 0;
    while let Some(offset) = find(&data[from..], needle) {
        let name_end = from + offset + needle.len();
        from += offset + 1;
        // The name field: tag 0x0a, a one-byte length, then a path ending in the name.
        let earliest = name_end.saturating_sub(127).max(2);
        for name_start in (earliest..=name_end - needle.len()).rev() {
            let path = &data[name_start..name_end];
            let whole_name = path.len() == needle.len() || path[path.len() - needle.len() - 1] == b'/';
            if !whole_name || data[name_start - 1] as usize != path.len() || data[name_start - 2] != 0x0a {
                continue;
            }
            if !path.iter().all(u8::is_ascii_graphic) {
                continue;
            }
            let Some(file) = decode_file_descriptor(&data[name_start - 2..]) else { continue };
            if file.package() == package {
                if !found.contains(&file) {
                    found.push(file);
                }
            } else {
                other_packages.insert(format!("{} (package {})", file.name(), file.package()));
            }
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(format!("no embedded file descriptor {name} of package {package} (found: {other_packages:?})")),
        n => Err(format!("{n} different embedded file descriptors {name} of package {package}")),
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    let first = needle[0];
    let mut at = 0;
    while at + needle.len() <= haystack.len() {
        let offset = haystack[at..haystack.len() - needle.len() + 1].iter().position(|&b| b == first)?;
        at += offset;
        if &haystack[at..at + needle.len()] == needle {
            return Some(at);
        }
        at += 1;
    }
    None
}

/// Decodes the `FileDescriptorProto` at the start of `bytes`: the longest run
/// of top-level fields that a `FileDescriptorProto` can hold and that decodes.
fn decode_file_descriptor(bytes: &[u8]) -> Option<FileDescriptorProto> {
    let ends = file_descriptor_field_ends(bytes);
    ends.iter().rev().find_map(|&end| FileDescriptorProto::decode(&bytes[..end]).ok())
}

/// Where each top-level field of a `FileDescriptorProto` that starts `bytes`
/// ends, up to the first field that cannot be one of its fields: an unknown
/// number, a wrong wire type, a second value of a singular field, a number
/// lower than the one before (every serializer writes them in order, Go's
/// and protoc's alike), or a length past the end.
fn file_descriptor_field_ends(bytes: &[u8]) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut position = 0;
    let mut last_number = 0;
    while let Some((key, after_key)) = read_varint(bytes, position) {
        let (number, wire_type) = (key >> 3, key & 7);
        let singular = match (number, wire_type) {
            // name, package, options, source_code_info, syntax; edition
            (1 | 2 | 8 | 9 | 12, 2) | (14, 0) => true,
            // dependency, message_type, enum_type, service, extension, option_dependency
            (3..=7 | 15, 2) => false,
            // public_dependency, weak_dependency (plain or packed)
            (10 | 11, 0 | 2) => false,
            _ => break,
        };
        let first_is_name = !ends.is_empty() || number == 1;
        if !first_is_name || number < last_number || (singular && number == last_number) {
            break;
        }
        let end = match wire_type {
            0 => match read_varint(bytes, after_key) {
                Some((_, end)) => end,
                None => break,
            },
            _ => match read_varint(bytes, after_key) {
                Some((length, start)) if (length as usize) <= bytes.len() - start => start + length as usize,
                _ => break,
            },
        };
        ends.push(end);
        last_number = number;
        position = end;
    }
    ends
}

fn read_varint(bytes: &[u8], mut position: usize) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(position)?;
        position += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some((value, position));
        }
    }
    None
}

// ---------------------------------------------------------------------------
// Our schema

fn our_descriptor_set() -> FileDescriptorSet {
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
    protox::compile([SCHEMA_FILE], [proto]).unwrap_or_else(|e| panic!("proto/{SCHEMA_FILE} does not compile: {e}"))
}

fn our_file(set: &FileDescriptorSet) -> &FileDescriptorProto {
    set.file.iter().find(|f| f.name() == SCHEMA_FILE).expect("our schema file in its descriptor set")
}

// ---------------------------------------------------------------------------
// Comparison

/// Every difference between two schema files, each with its path, reading
/// `weed X vs ours Y`; empty when they declare the same messages (nested and
/// map entries included), fields, oneofs, enums and services.
fn schema_differences(weed: &FileDescriptorProto, ours: &FileDescriptorProto) -> Vec<String> {
    let mut out = Vec::new();
    let file = weed.name();
    compare_value(&mut out, file, "package", weed.package(), ours.package());
    compare_value(&mut out, file, "syntax", weed.syntax(), ours.syntax());
    let dependencies = |f: &FileDescriptorProto| f.dependency.iter().map(|d| (d.clone(), ())).collect();
    compare_keyed(&mut out, file, "import", dependencies(weed), dependencies(ours), |_, _, _, _| {});

    let prefix = weed.package();
    let (mut weed_messages, mut weed_enums) = (BTreeMap::new(), BTreeMap::new());
    let (mut our_messages, mut our_enums) = (BTreeMap::new(), BTreeMap::new());
    flatten(prefix, &weed.message_type, &weed.enum_type, &mut weed_messages, &mut weed_enums);
    flatten(ours.package(), &ours.message_type, &ours.enum_type, &mut our_messages, &mut our_enums);
    compare_keyed(&mut out, prefix, "message", weed_messages, our_messages, compare_message);
    compare_keyed(&mut out, prefix, "enum", weed_enums, our_enums, compare_enum);

    fn services(f: &FileDescriptorProto) -> BTreeMap<String, &ServiceDescriptorProto> {
        f.service.iter().map(|s| (format!("{}.{}", f.package(), s.name()), s)).collect()
    }
    compare_keyed(&mut out, prefix, "service", services(weed), services(ours), compare_service);
    out
}

/// Every message and enum of a file by full name, nested ones included.
fn flatten<'a>(
    scope: &str,
    messages: &'a [DescriptorProto],
    enums: &'a [EnumDescriptorProto],
    message_out: &mut BTreeMap<String, &'a DescriptorProto>,
    enum_out: &mut BTreeMap<String, &'a EnumDescriptorProto>,
) {
    for message in messages {
        let name = format!("{scope}.{}", message.name());
        flatten(&name, &message.nested_type, &message.enum_type, message_out, enum_out);
        message_out.insert(name, message);
    }
    for enumeration in enums {
        enum_out.insert(format!("{scope}.{}", enumeration.name()), enumeration);
    }
}

fn compare_value<T: PartialEq + std::fmt::Debug>(out: &mut Vec<String>, path: &str, what: &str, weed: T, ours: T) {
    if weed != ours {
        out.push(format!("{path}: {what} weed {weed:?} vs ours {ours:?}"));
    }
}

/// Reports what only one side has, and compares what both have with `both`.
fn compare_keyed<T>(
    out: &mut Vec<String>,
    path: &str,
    what: &str,
    weed: BTreeMap<String, T>,
    mut ours: BTreeMap<String, T>,
    both: impl Fn(&mut Vec<String>, &str, T, T),
) {
    for (key, weed_item) in weed {
        match ours.remove(&key) {
            Some(our_item) => both(out, &format!("{path}.{what} {key}"), weed_item, our_item),
            None => out.push(format!("{path}.{what} {key}: missing from ours")),
        }
    }
    for key in ours.into_keys() {
        out.push(format!("{path}.{what} {key}: only in ours"));
    }
}

fn compare_message(out: &mut Vec<String>, path: &str, weed: &DescriptorProto, ours: &DescriptorProto) {
    let map_entry = |m: &DescriptorProto| m.options.as_ref().is_some_and(|o| o.map_entry());
    compare_value(out, path, "map entry", map_entry(weed), map_entry(ours));
    let oneofs = |m: &DescriptorProto| m.oneof_decl.iter().map(|o| o.name().to_string()).collect::<Vec<_>>();
    compare_value(out, path, "oneofs", oneofs(weed), oneofs(ours));
    fn fields(m: &DescriptorProto) -> BTreeMap<String, FieldShape<'_>> {
        m.field.iter().map(|f| (f.name().to_string(), FieldShape::of(f, m))).collect()
    }
    compare_keyed(out, path, "field", fields(weed), fields(ours), |out, path, weed, ours| {
        compare_value(out, path, "number", weed.number, ours.number);
        compare_value(out, path, "type", weed.kind, ours.kind);
        compare_value(out, path, "type name", weed.type_name, ours.type_name);
        compare_value(out, path, "label", weed.label, ours.label);
        compare_value(out, path, "oneof", weed.oneof, ours.oneof);
        compare_value(out, path, "proto3 optional", weed.proto3_optional, ours.proto3_optional);
    });
}

/// What a field is on the wire and in generated code.
struct FieldShape<'a> {
    number: i32,
    kind: &'static str,
    type_name: &'a str,
    label: &'static str,
    oneof: Option<&'a str>,
    proto3_optional: bool,
}

impl<'a> FieldShape<'a> {
    fn of(field: &'a FieldDescriptorProto, message: &'a DescriptorProto) -> Self {
        FieldShape {
            number: field.number(),
            kind: field.r#type().as_str_name(),
            type_name: field.type_name(),
            label: field.label().as_str_name(),
            oneof: field.oneof_index.and_then(|i| message.oneof_decl.get(i as usize)).map(|o| o.name()),
            proto3_optional: field.proto3_optional(),
        }
    }
}

fn compare_enum(out: &mut Vec<String>, path: &str, weed: &EnumDescriptorProto, ours: &EnumDescriptorProto) {
    let values = |e: &EnumDescriptorProto| e.value.iter().map(|v| (v.name().to_string(), v.number())).collect();
    compare_keyed(out, path, "value", values(weed), values(ours), |out, path, weed, ours| {
        compare_value(out, path, "number", weed, ours);
    });
}

fn compare_service(out: &mut Vec<String>, path: &str, weed: &ServiceDescriptorProto, ours: &ServiceDescriptorProto) {
    fn methods(s: &ServiceDescriptorProto) -> BTreeMap<String, &MethodDescriptorProto> {
        s.method.iter().map(|m| (m.name().to_string(), m)).collect()
    }
    compare_keyed(out, path, "method", methods(weed), methods(ours), |out, path, weed, ours| {
        compare_value(out, path, "input", weed.input_type(), ours.input_type());
        compare_value(out, path, "output", weed.output_type(), ours.output_type());
        compare_value(out, path, "client streaming", weed.client_streaming(), ours.client_streaming());
        compare_value(out, path, "server streaming", weed.server_streaming(), ours.server_streaming());
    });
}

#[test]
fn our_plugin_schema_is_the_one_weed_embeds() {
    let weed = weed_schema();
    let set = our_descriptor_set();
    let ours = our_file(&set);
    let differences = schema_differences(&weed.file, ours);
    eprintln!(
        "compared proto/{SCHEMA_FILE} with the {} embedded in {} (SeaweedFS {}): {} messages, {} enums, {} services, {} differences",
        weed.file.name(),
        weed.path.display(),
        weed.version,
        weed.file.message_type.len(),
        weed.file.enum_type.len(),
        weed.file.service.len(),
        differences.len()
    );
    for difference in &differences {
        eprintln!("  {difference}");
    }
    // What the extraction found is the worker stream's schema, not a fragment of it.
    let stream = weed.file.service.iter().find(|s| s.name() == "PluginControlService").expect("the stream service");
    assert_eq!(stream.method.iter().map(|m| m.name()).collect::<Vec<_>>(), ["WorkerStream"]);
    assert!(weed.file.message_type.iter().any(|m| m.name() == "WorkerToAdminMessage"));
    assert!(
        differences.is_empty(),
        "proto/{SCHEMA_FILE} differs from the schema of weed {} in {} places:\n{}",
        weed.version,
        differences.len(),
        differences.join("\n")
    );

    // Beyond what the walk names (declaration order, JSON names, options):
    // the whole descriptor, less our source positions, is the binary's.
    let mut compiled = ours.clone();
    compiled.source_code_info = None;
    if compiled != weed.file {
        let (weed_dump, our_dump) = (format!("{:#?}", weed.file), format!("{compiled:#?}"));
        panic!(
            "proto/{SCHEMA_FILE} compiles to another descriptor than weed {}'s:\n{}",
            weed.version,
            first_difference(&weed_dump, &our_dump)
        );
    }
}

/// The first line where two dumps part, with the lines before it.
fn first_difference(weed: &str, ours: &str) -> String {
    let (weed, ours): (Vec<&str>, Vec<&str>) = (weed.lines().collect(), ours.lines().collect());
    let at = weed.iter().zip(&ours).take_while(|(a, b)| a == b).count();
    let context = weed[at.saturating_sub(12)..at].join("\n");
    let line = |lines: &[&str]| lines.get(at).map_or("(end)".to_string(), |l| l.trim().to_string());
    format!("{context}\nweed: {}\nours: {}", line(&weed), line(&ours))
}

/// The comparison itself: each kind of change to a copy of the binary's
/// schema is reported, with its path, and nothing else is.
#[test]
fn the_comparison_reports_each_change_with_its_path() {
    let weed = &weed_schema().file;
    assert!(schema_differences(weed, weed).is_empty());

    let mut changed = weed.clone();
    let message = |file: &FileDescriptorProto, name: &str| -> usize {
        file.message_type.iter().position(|m| m.name() == name).unwrap_or_else(|| panic!("no message {name}"))
    };
    let job_spec = message(&changed, "JobSpec");
    let field = changed.message_type[job_spec].field.iter_mut().find(|f| f.name() == "dedupe_key").expect("field");
    field.number = Some(field.number() + 100);
    let hello = message(&changed, "WorkerHello");
    let removed = changed.message_type[hello].field.remove(0);
    let work_kind = changed.enum_type.iter_mut().find(|e| e.name() == "WorkKind").expect("enum WorkKind");
    let mut extra = work_kind.value[0].clone();
    extra.name = Some("WORK_KIND_EXTRA".into());
    extra.number = Some(99);
    work_kind.value.push(extra);
    changed.service[0].method[0].client_streaming = Some(false);

    let expected = [
        "plugin.enum plugin.WorkKind.value WORK_KIND_EXTRA: only in ours".to_string(),
        format!(
            "plugin.message plugin.JobSpec.field dedupe_key: number weed {} vs ours {}",
            field_number(weed, "JobSpec", "dedupe_key"),
            field_number(weed, "JobSpec", "dedupe_key") + 100
        ),
        format!("plugin.message plugin.WorkerHello.field {}: missing from ours", removed.name()),
        format!(
            "plugin.service plugin.PluginControlService.method {}: client streaming weed true vs ours false",
            weed.service[0].method[0].name()
        ),
    ];
    let mut found = schema_differences(weed, &changed);
    found.sort();
    let mut expected = expected.to_vec();
    expected.sort();
    assert_eq!(found, expected);
}

fn field_number(file: &FileDescriptorProto, message: &str, field: &str) -> i32 {
    let message = file.message_type.iter().find(|m| m.name() == message).expect("message");
    message.field.iter().find(|f| f.name() == field).expect("field").number()
}

// ---------------------------------------------------------------------------
// Messages a real worker sends

/// How deep messages nest in a generated instance: deep enough for every
/// message of the schema to appear with its fields set.
const MAX_DEPTH: usize = 10;

/// The binary's schema, with the well-known types it imports.
fn weed_pool() -> DescriptorPool {
    let weed = &weed_schema().file;
    let mut files: Vec<FileDescriptorProto> =
        our_descriptor_set().file.into_iter().filter(|f| weed.dependency.iter().any(|d| d == f.name())).collect();
    files.push(weed.clone());
    DescriptorPool::from_file_descriptor_set(FileDescriptorSet { file: files })
        .unwrap_or_else(|e| panic!("the schema of weed does not load: {e}"))
}

/// A message of `descriptor` with every field set to a value that is not
/// its default. A oneof gets its member number `outer` (at the top) or
/// `inner` (below), modulo its size; repeated fields get two scalars or one
/// message, maps one entry. The full names of the fields set go to `covered`.
fn populate(
    descriptor: &MessageDescriptor,
    outer: usize,
    inner: usize,
    depth: usize,
    covered: &mut BTreeSet<String>,
) -> DynamicMessage {
    let mut message = DynamicMessage::new(descriptor.clone());
    let choice = if depth == 0 { outer } else { inner };
    for field in descriptor.fields() {
        if let Some(oneof) = field.containing_oneof().filter(|o| !o.is_synthetic()) {
            let members: Vec<u32> = oneof.fields().map(|f| f.number()).collect();
            if members[choice % members.len()] != field.number() {
                continue;
            }
        }
        let value = if field.is_map() {
            let Kind::Message(entry) = field.kind() else { unreachable!("a map field is a message field") };
            let (key_field, value_field) = (entry.map_entry_key_field(), entry.map_entry_value_field());
            let Some(value) = field_value(&value_field, outer, inner, depth, covered) else { continue };
            let key = map_key(value_of(&key_field.kind(), &key_field, inner));
            covered.insert(key_field.full_name().to_string());
            covered.insert(value_field.full_name().to_string());
            Value::Map(HashMap::from([(key, value)]))
        } else if field.is_list() {
            let Some(first) = field_value(&field, outer, inner, depth, covered) else { continue };
            match field.kind() {
                Kind::Message(_) => Value::List(vec![first]),
                kind => Value::List(vec![first, value_of(&kind, &field, inner + 1)]),
            }
        } else {
            let Some(value) = field_value(&field, outer, inner, depth, covered) else { continue };
            value
        };
        covered.insert(field.full_name().to_string());
        message.set_field(&field, value);
    }
    message
}

/// One value for `field`; none for a message field below [`MAX_DEPTH`].
fn field_value(
    field: &FieldDescriptor,
    outer: usize,
    inner: usize,
    depth: usize,
    covered: &mut BTreeSet<String>,
) -> Option<Value> {
    match field.kind() {
        Kind::Message(_) if depth >= MAX_DEPTH => None,
        Kind::Message(nested) => Some(Value::Message(populate(&nested, outer, inner, depth + 1, covered))),
        kind => Some(value_of(&kind, field, inner)),
    }
}

/// A scalar or enum value that is not the default, from the field's number
/// and `seed`: negative signed numbers, unsigned ones past 31 bits.
fn value_of(kind: &Kind, field: &FieldDescriptor, seed: usize) -> Value {
    let n = i64::from(field.number()) + seed as i64 + 1;
    match kind {
        Kind::Double => Value::F64(n as f64 + 0.25),
        Kind::Float => Value::F32(n as f32 + 0.25),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Value::I32(-(n as i32)),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Value::I64(-(n << 33)),
        Kind::Uint32 | Kind::Fixed32 => Value::U32((1 << 31) + n as u32),
        Kind::Uint64 | Kind::Fixed64 => Value::U64((1 << 40) + n as u64),
        Kind::Bool => Value::Bool(true),
        Kind::String => Value::String(format!("{}-{seed}", field.name())),
        Kind::Bytes => Value::Bytes(Bytes::from(vec![0, 0xff, n as u8])),
        Kind::Enum(enumeration) => {
            let values: Vec<i32> = enumeration.values().map(|v| v.number()).filter(|&v| v != 0).collect();
            Value::EnumNumber(if values.is_empty() { 0 } else { values[seed % values.len()] })
        }
        Kind::Message(_) => unreachable!("a message value is built by populate"),
    }
}

fn map_key(value: Value) -> MapKey {
    match value {
        Value::Bool(v) => MapKey::Bool(v),
        Value::I32(v) => MapKey::I32(v),
        Value::I64(v) => MapKey::I64(v),
        Value::U32(v) => MapKey::U32(v),
        Value::U64(v) => MapKey::U64(v),
        Value::String(v) => MapKey::String(v),
        other => unreachable!("{other:?} cannot be a map key"),
    }
}

/// Every field of every message reachable from `root`, by full name.
fn reachable_fields(root: &MessageDescriptor) -> BTreeSet<String> {
    let mut fields = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut stack = vec![root.clone()];
    while let Some(message) = stack.pop() {
        if !seen.insert(message.full_name().to_string()) {
            continue;
        }
        for field in message.fields() {
            fields.insert(field.full_name().to_string());
            if let Kind::Message(nested) = field.kind() {
                stack.push(nested);
            }
        }
    }
    fields
}

/// Where `received` differs from `sent`: fields lost, changed or added.
fn message_differences(path: &str, sent: &DynamicMessage, received: &DynamicMessage, out: &mut Vec<String>) {
    for field in sent.descriptor().fields() {
        let path = format!("{path}.{}", field.name());
        match (sent.has_field(&field), received.has_field(&field)) {
            (true, true) => value_differences(&path, &sent.get_field(&field), &received.get_field(&field), out),
            (true, false) => out.push(format!("{path}: lost")),
            (false, true) => out.push(format!("{path}: appeared")),
            (false, false) => {}
        }
    }
    for unknown in received.unknown_fields() {
        out.push(format!("{path}: unknown field {}", unknown.number()));
    }
}

fn value_differences(path: &str, sent: &Value, received: &Value, out: &mut Vec<String>) {
    match (sent, received) {
        (Value::Message(sent), Value::Message(received)) => message_differences(path, sent, received, out),
        (Value::List(sent), Value::List(received)) if sent.len() == received.len() => {
            for (index, (sent, received)) in sent.iter().zip(received).enumerate() {
                value_differences(&format!("{path}[{index}]"), sent, received, out);
            }
        }
        (Value::Map(sent), Value::Map(received)) if sent.len() == received.len() => {
            for (key, sent) in sent {
                match received.get(key) {
                    Some(received) => value_differences(&format!("{path}[{key:?}]"), sent, received, out),
                    None => out.push(format!("{path}[{key:?}]: lost")),
                }
            }
        }
        (sent, received) if sent == received => {}
        (sent, received) => out.push(format!("{path}: sent {sent:?}, received {received:?}")),
    }
}

/// Decodes with our generated type and encodes again, as the server and the
/// worker runtime do with what they receive and send on.
fn through_our_type<T: Message + Default>(bytes: &[u8]) -> Result<Vec<u8>, prost::DecodeError> {
    Ok(T::decode(bytes)?.encode_to_vec())
}

#[test]
fn every_field_a_weed_worker_can_send_survives_our_stream_types() {
    let pool = weed_pool();
    type Through = fn(&[u8]) -> Result<Vec<u8>, prost::DecodeError>;
    let streams: [(&str, Through); 2] = [
        ("plugin.WorkerToAdminMessage", through_our_type::<plugin::WorkerToAdminMessage>),
        ("plugin.AdminToWorkerMessage", through_our_type::<plugin::AdminToWorkerMessage>),
    ];
    // Enough variants for every member of the largest oneof to be chosen.
    let largest_oneof = pool.all_messages().flat_map(|m| m.oneofs().map(|o| o.fields().len()).collect::<Vec<_>>());
    let variants = largest_oneof.max().unwrap_or(1);

    let mut problems = Vec::new();
    let mut n_messages = 0;
    for (name, through) in streams {
        let descriptor = pool.get_message_by_name(name).unwrap_or_else(|| panic!("weed's schema has no {name}"));
        let mut covered = BTreeSet::new();
        for outer in 0..variants {
            for inner in 0..variants {
                let sent = populate(&descriptor, outer, inner, 0, &mut covered);
                let bytes = sent.encode_to_vec();
                n_messages += 1;
                let label = format!("{name} (variant {outer}.{inner}, {} bytes)", bytes.len());
                let back = match through(&bytes) {
                    Ok(back) => back,
                    Err(e) => {
                        problems.push(format!("{label}: our type cannot decode it: {e}"));
                        continue;
                    }
                };
                let received = DynamicMessage::decode(descriptor.clone(), back.as_slice())
                    .unwrap_or_else(|e| panic!("{label}: what our type encodes is not weed's message: {e}"));
                let mut lost = Vec::new();
                message_differences(name, &sent, &received, &mut lost);
                problems.extend(lost.into_iter().map(|difference| format!("{label}: {difference}")));
            }
        }
        let uncovered: Vec<String> = reachable_fields(&descriptor).difference(&covered).cloned().collect();
        assert!(uncovered.is_empty(), "{name}: the generated messages never set {uncovered:?}");
    }
    eprintln!(
        "{n_messages} messages of weed {}'s schema, every field set, went through our stream types",
        weed_schema().version
    );
    problems.sort();
    problems.dedup();
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}

/// `proto/worker.proto` declares the part of SeaweedFS's `worker_pb` that
/// jobcenter reads and writes (`TaskParams` and the balance parameters a
/// bandwidth budget sets a rate in): each of its messages and fields is one
/// of the `worker.proto` the installed `weed` embeds, with the same number,
/// type and label, oneofs included.
#[test]
fn every_field_of_our_worker_schema_is_the_one_weed_embeds() {
    let weed = weed_schema();
    let data = std::fs::read(&weed.path).unwrap();
    let theirs = embedded_descriptor(&data, "worker.proto", "worker_pb").unwrap_or_else(|e| panic!("{e}"));
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
    let set = protox::compile(["worker.proto"], [proto]).unwrap_or_else(|e| panic!("proto/worker.proto: {e}"));
    let ours = set.file.iter().find(|f| f.name() == "worker.proto").expect("our worker.proto");
    let mut differences = Vec::new();
    let mut fields = 0;
    for message in &ours.message_type {
        let Some(their_message) = theirs.message_type.iter().find(|m| m.name() == message.name()) else {
            differences.push(format!("{}: no such message in weed's worker.proto", message.name()));
            continue;
        };
        let oneof = |m: &DescriptorProto, f: &FieldDescriptorProto| {
            f.oneof_index.map(|i| m.oneof_decl[i as usize].name().to_string())
        };
        for field in &message.field {
            fields += 1;
            let path = format!("{}.{}", message.name(), field.name());
            match their_message.field.iter().find(|f| f.name() == field.name()) {
                None => differences.push(format!("{path}: no such field in weed's")),
                Some(theirs) => {
                    let shape = |m, f: &FieldDescriptorProto| {
                        (f.number(), f.r#type(), f.label(), f.type_name().to_string(), oneof(m, f))
                    };
                    if shape(their_message, theirs) != shape(message, field) {
                        differences.push(format!(
                            "{path}: weed's {:?}, ours {:?}",
                            shape(their_message, theirs),
                            shape(message, field)
                        ));
                    }
                }
            }
        }
    }
    assert!(fields > 30, "our worker.proto was read: {fields} fields");
    assert!(
        differences.is_empty(),
        "proto/worker.proto differs from weed {}'s:\n{}",
        weed.version,
        differences.join("\n")
    );
}

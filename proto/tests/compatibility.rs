//! `txoutbox.v1` only grows: the protocol as built now must keep everything the last
//! release of v1 had (its description is `compatibility/v1-released.txt`), with the same
//! numbers, names, types and cardinalities.
//!
//! The description is one line per element, each naming everything a client's generated
//! code or the wire format depends on (the file of a message, a field's number, name, type,
//! cardinality and oneof; an enum value's number and name; an RPC's types and streaming).
//! So a compatible change only adds lines, and any other change (a field removed,
//! renumbered, renamed, retyped, moved in or out of a oneof; a message moved to another
//! file; an RPC's request type changed) takes a released line away, which this test names.
//!
//! On a release, write the new baseline, so that what was released is what the next
//! changes are checked against:
//!
//! ```sh
//! TXOUTBOX_PROTO_BASELINE=write cargo test -p txoutbox-proto --test compatibility
//! ```

use std::collections::BTreeSet;
use std::path::PathBuf;

use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorSet};

#[test]
fn the_protocol_keeps_everything_v1_released() {
    let current = describe(txoutbox_proto::FILE_DESCRIPTOR_SET);
    let path = baseline_path();
    if std::env::var("TXOUTBOX_PROTO_BASELINE").as_deref() == Ok("write") {
        std::fs::write(&path, render(&current)).unwrap();
        eprintln!("wrote {}", path.display());
        return;
    }
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let released: BTreeSet<String> = text
        .lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect();
    let missing: Vec<&String> = released.difference(&current).collect();
    let added: Vec<&String> = current.difference(&released).collect();
    if !added.is_empty() {
        eprintln!("added since the released v1 (compatible):");
        for line in &added {
            eprintln!("  {line}");
        }
    }
    assert!(
        missing.is_empty(),
        "txoutbox.v1 changed incompatibly: these released elements are gone or changed \
         (add new fields, messages and RPCs instead; see docs/protocol.md):\n  {}\n\
         what the protocol has now that the release did not:\n  {}",
        join(&missing),
        join(&added)
    );
}

/// The checker itself: an added field passes, and each kind of incompatible change takes a
/// released line away.
#[test]
fn the_description_changes_only_by_additions_for_compatible_changes() {
    let set = FileDescriptorSet::decode(txoutbox_proto::FILE_DESCRIPTOR_SET).unwrap();
    let released = describe_set(&set);
    let changed = |change: &dyn Fn(&mut DescriptorProto)| {
        let mut set = set.clone();
        change(message_named(&mut set, "Message"));
        released.is_subset(&describe_set(&set))
    };

    let add_a_field = |message: &mut DescriptorProto| {
        let mut extra = message.field[0].clone();
        extra.name = Some("extra".to_owned());
        extra.number = Some(30);
        message.field.push(extra);
    };
    assert!(changed(&add_a_field), "an added field is compatible");

    let renumber = |m: &mut DescriptorProto| m.field[1].number = Some(99);
    let rename = |m: &mut DescriptorProto| m.field[1].name = Some("renamed".to_owned());
    let retype = |m: &mut DescriptorProto| m.field[1].r#type = Some(Type::Bytes as i32);
    let repeat = |m: &mut DescriptorProto| m.field[1].label = Some(Label::Repeated as i32);
    let remove = |m: &mut DescriptorProto| drop(m.field.remove(1));
    for (what, change) in [
        ("renumbered", &renumber as &dyn Fn(&mut DescriptorProto)),
        ("renamed", &rename),
        ("retyped", &retype),
        ("made repeated", &repeat),
        ("removed", &remove),
    ] {
        assert!(!changed(change), "a field {what} must be caught");
    }
}

/// The message `name` of `txoutbox/v1/message.proto`.
fn message_named<'a>(set: &'a mut FileDescriptorSet, name: &str) -> &'a mut DescriptorProto {
    set.file
        .iter_mut()
        .find(|file| file.name() == "txoutbox/v1/message.proto")
        .and_then(|file| file.message_type.iter_mut().find(|m| m.name() == name))
        .expect("txoutbox.v1.Message")
}

fn baseline_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("compatibility/v1-released.txt")
}

fn join(lines: &[&String]) -> String {
    if lines.is_empty() {
        return "(nothing)".to_owned();
    }
    lines
        .iter()
        .map(|line| line.as_str())
        .collect::<Vec<_>>()
        .join("\n  ")
}

fn render(lines: &BTreeSet<String>) -> String {
    let mut text = String::from(
        "# The txoutbox.v1 protocol as last released, one element per line: what the current\n\
         # protocol must keep (proto/tests/compatibility.rs; rewrite it on a release with\n\
         # TXOUTBOX_PROTO_BASELINE=write cargo test -p txoutbox-proto --test compatibility).\n",
    );
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
    text
}

fn describe(encoded: &[u8]) -> BTreeSet<String> {
    describe_set(&FileDescriptorSet::decode(encoded).expect("the crate's descriptor set"))
}

fn describe_set(set: &FileDescriptorSet) -> BTreeSet<String> {
    let mut lines = BTreeSet::new();
    // The well-known types the files import are Google's to keep.
    for file in set
        .file
        .iter()
        .filter(|f| f.package() == txoutbox_proto::PACKAGE)
    {
        let package = file.package();
        for message in &file.message_type {
            describe_message(&mut lines, file.name(), package, message);
        }
        for enumeration in &file.enum_type {
            describe_enum(&mut lines, file.name(), package, enumeration);
        }
        for service in &file.service {
            let name = format!("{package}.{}", service.name());
            lines.insert(format!("service {name} in {}", file.name()));
            for method in &service.method {
                let stream = |on: bool| if on { "stream " } else { "" };
                lines.insert(format!(
                    "rpc {name}.{}({}{}) returns ({}{})",
                    method.name(),
                    stream(method.client_streaming()),
                    method.input_type().trim_start_matches('.'),
                    stream(method.server_streaming()),
                    method.output_type().trim_start_matches('.'),
                ));
            }
        }
    }
    lines
}

fn describe_message(
    lines: &mut BTreeSet<String>,
    file: &str,
    scope: &str,
    message: &DescriptorProto,
) {
    let name = format!("{scope}.{}", message.name());
    lines.insert(format!("message {name} in {file}"));
    for field in &message.field {
        let kind = match field.r#type() {
            Type::Message | Type::Enum | Type::Group => {
                field.type_name().trim_start_matches('.').to_owned()
            }
            scalar => scalar
                .as_str_name()
                .trim_start_matches("TYPE_")
                .to_lowercase(),
        };
        let cardinality = match (field.label(), field.proto3_optional()) {
            (Label::Repeated, _) => "repeated ",
            (_, true) => "optional ",
            (Label::Required, _) => "required ",
            _ => "",
        };
        // A proto3 `optional` is a oneof of its own, which generated code does not show.
        let oneof = match field.oneof_index {
            Some(index) if !field.proto3_optional() => {
                format!(" in oneof {}", message.oneof_decl[index as usize].name())
            }
            _ => String::new(),
        };
        lines.insert(format!(
            "field {name} = {} {}: {cardinality}{kind}{oneof}",
            field.number(),
            field.name(),
        ));
    }
    for nested in &message.nested_type {
        describe_message(lines, file, &name, nested);
    }
    for enumeration in &message.enum_type {
        describe_enum(lines, file, &name, enumeration);
    }
}

fn describe_enum(
    lines: &mut BTreeSet<String>,
    file: &str,
    scope: &str,
    enumeration: &EnumDescriptorProto,
) {
    let name = format!("{scope}.{}", enumeration.name());
    lines.insert(format!("enum {name} in {file}"));
    for value in &enumeration.value {
        lines.insert(format!(
            "value {name} = {} {}",
            value.number(),
            value.name()
        ));
    }
}

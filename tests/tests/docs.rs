//! README.md and every `docs/*.md` name only what exists: every link leads to a file and
//! every anchor to a heading; every repository path they mention is there; every flag
//! they give `txoutboxd`, `txoutbox` or the packages' `subscribe` commands is one that
//! command's `--help` lists; every configuration key (`server.listen`, `[server.tls]`,
//! `TXOUTBOX_SERVER__LISTEN`, the keys of a TOML example) is one the server's
//! configuration takes. The kind of check `printed_hints` does for the start-up lines.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One Markdown file, cut into what the checks read.
struct Document {
    path: PathBuf,
    /// `(language, content)` of each fenced block.
    blocks: Vec<(String, String)>,
    /// Inline code spans outside the blocks.
    spans: Vec<String>,
    /// Link targets outside the blocks.
    links: Vec<String>,
    /// GitHub's anchors of its headings.
    anchors: Vec<String>,
}

impl Document {
    fn read(path: &Path) -> Self {
        let text = std::fs::read_to_string(path).unwrap();
        let (mut blocks, mut spans, mut links, mut anchors) = (vec![], vec![], vec![], vec![]);
        let mut block: Option<(String, String)> = None;
        for line in text.lines() {
            if let Some(fence) = line.trim_start().strip_prefix("```") {
                match block.take() {
                    Some(done) => blocks.push(done),
                    None => block = Some((fence.trim().to_owned(), String::new())),
                }
                continue;
            }
            if let Some((_, content)) = &mut block {
                content.push_str(line);
                content.push('\n');
                continue;
            }
            if let Some(heading) = line.strip_prefix('#') {
                anchors.push(slug(heading.trim_start_matches('#')));
            }
            // Inline code: the odd pieces between backticks (a double-backtick span holds
            // single ones, as in `` `schema`.`table` ``: its pieces are read alike).
            spans.extend(
                line.split('`')
                    .skip(1)
                    .step_by(2)
                    .filter(|span| !span.is_empty())
                    .map(str::to_owned),
            );
            let mut rest = line;
            while let Some((_, after)) = rest.split_once("](") {
                let Some((target, tail)) = after.split_once(')') else {
                    break;
                };
                links.push(target.to_owned());
                rest = tail;
            }
        }
        assert!(
            block.is_none(),
            "{}: a code block is not closed",
            path.display()
        );
        Self {
            path: path.to_owned(),
            blocks,
            spans,
            links,
            anchors,
        }
    }

    fn name(&self) -> String {
        self.path
            .strip_prefix(repository())
            .unwrap()
            .display()
            .to_string()
    }

    /// Inline spans, then every line of the shell and text blocks: where commands are.
    fn command_texts(&self) -> Vec<String> {
        let mut texts = self.spans.clone();
        for (language, content) in &self.blocks {
            if matches!(language.as_str(), "sh" | "bash" | "shell" | "text" | "") {
                // Without the comments: what they say about a command is prose.
                texts.extend(
                    content
                        .lines()
                        .filter(|line| !line.trim_start().starts_with('#'))
                        .map(|line| line.split(" # ").next().unwrap().to_owned()),
                );
            }
        }
        texts
    }
}

fn documents() -> Vec<Document> {
    let root = repository();
    let mut paths = vec![root.join("README.md")];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("a docs/ directory")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    paths.extend(pages);
    paths.iter().map(|path| Document::read(path)).collect()
}

#[test]
fn links_lead_to_files_and_anchors_to_headings() {
    let documents = documents();
    let anchors: HashMap<PathBuf, &Vec<String>> = documents
        .iter()
        .map(|d| (d.path.canonicalize().unwrap(), &d.anchors))
        .collect();
    let mut broken = Vec::new();
    for document in &documents {
        for link in &document.links {
            if link.starts_with("http://") || link.starts_with("https://") {
                continue;
            }
            let (file, anchor) = link.split_once('#').unwrap_or((link, ""));
            let target = if file.is_empty() {
                document.path.clone()
            } else {
                document.path.parent().unwrap().join(file)
            };
            let Ok(target) = target.canonicalize() else {
                broken.push(format!("{}: {link}: no such file", document.name()));
                continue;
            };
            if anchor.is_empty() {
                continue;
            }
            match anchors.get(&target) {
                Some(headings) if headings.iter().any(|h| h == anchor) => {}
                Some(_) => broken.push(format!("{}: {link}: no such heading", document.name())),
                // An anchor into a file this test does not read (client/README.md...).
                None => {
                    let text = std::fs::read_to_string(&target).unwrap_or_default();
                    let found = text
                        .lines()
                        .filter_map(|l| l.strip_prefix('#'))
                        .any(|h| slug(h.trim_start_matches('#')) == anchor);
                    if !found {
                        broken.push(format!("{}: {link}: no such heading", document.name()));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_repository_path_named_exists() {
    let root = repository();
    let tops: BTreeSet<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name != "target" && name != ".git")
        .collect();
    let mut missing = Vec::new();
    for document in documents() {
        let words: Vec<String> = document
            .command_texts()
            .iter()
            .flat_map(|text| {
                text.split_whitespace()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect();
        for word in words {
            let word = word
                .trim_matches(|c: char| "\"'(),;:.".contains(c))
                .split(['#', '='])
                .next()
                .unwrap()
                .to_owned();
            let Some(first) = word.split('/').next() else {
                continue;
            };
            if !word.contains('/') || !tops.contains(first) {
                continue;
            }
            if !glob_exists(&root, &word) {
                missing.push(format!("{}: {word}", document.name()));
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "paths that do not exist:\n{}",
        missing.join("\n")
    );
}

/// Whether `pattern` (a path relative to `root`, with `*` and `<placeholder>` segments or
/// parts of segments) names something that exists.
fn glob_exists(root: &Path, pattern: &str) -> bool {
    let mut candidates = vec![root.to_path_buf()];
    for segment in pattern.split('/').filter(|s| !s.is_empty()) {
        let wildcard = wildcard(segment);
        let mut next = Vec::new();
        for dir in candidates {
            if !wildcard.contains('*') {
                let path = dir.join(segment);
                if path.exists() {
                    next.push(path);
                }
                continue;
            }
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if matches_wildcard(&wildcard, &entry.file_name().to_string_lossy()) {
                    next.push(entry.path());
                }
            }
        }
        candidates = next;
    }
    !candidates.is_empty()
}

/// `segment` with each `<placeholder>` as `*`.
fn wildcard(segment: &str) -> String {
    let mut out = String::new();
    let mut rest = segment;
    while let Some((before, after)) = rest.split_once('<') {
        out.push_str(before);
        out.push('*');
        rest = after.split_once('>').map_or("", |(_, tail)| tail);
    }
    out.push_str(rest);
    out
}

fn matches_wildcard(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || !name[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// A command the documents give flags to, and how to ask it for them.
struct Program {
    /// Words that start the command (a path ending in one counts too).
    names: &'static [&'static str],
    /// The command whose `--help` lists its flags, and its subcommands'.
    help: PathBuf,
    /// Subcommands, each with the flags its `--help` lists.
    subcommands: HashMap<String, BTreeSet<String>>,
    /// The flags of the command itself.
    flags: BTreeSet<String>,
}

impl Program {
    fn new(names: &'static [&'static str], help: PathBuf) -> Self {
        let text = help_text(&help, &[]);
        let mut subcommands = HashMap::new();
        for name in subcommand_names(&text) {
            let sub = help_text(&help, &[&name]);
            let mut flags = flags_in(&sub);
            // Nested subcommands (`dead list`): their flags count for the parent.
            for nested in subcommand_names(&sub) {
                flags.extend(flags_in(&help_text(&help, &[&name, &nested])));
            }
            subcommands.insert(name, flags);
        }
        Self {
            names,
            help,
            subcommands,
            flags: flags_in(&text),
        }
    }

    /// The flags of `args` (the words after the command) it does not know.
    fn unknown_flags(&self, args: &[&str]) -> Vec<String> {
        let subcommand = args
            .iter()
            .find(|word| self.subcommands.contains_key(**word));
        let mut known = self.flags.clone();
        match subcommand {
            Some(name) => known.extend(self.subcommands[*name].iter().cloned()),
            None => known.extend(self.subcommands.values().flatten().cloned()),
        }
        args.iter()
            .filter(|word| word.starts_with("--") && word.len() > 2)
            .flat_map(|word| word.split('/'))
            .map(|flag| flag.split(['=', '[', ']', ',']).next().unwrap().to_owned())
            .filter(|flag| flag.starts_with("--") && !known.contains(flag))
            .collect()
    }
}

fn help_text(program: &Path, subcommands: &[&str]) -> String {
    let output = Command::new(program)
        .args(subcommands)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    assert!(
        output.status.success(),
        "{} {subcommands:?} --help: {output:?}",
        program.display()
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The names under `Commands:` in a clap help text.
fn subcommand_names(help: &str) -> Vec<String> {
    let Some((_, after)) = help.split_once("Commands:\n") else {
        return Vec::new();
    };
    after
        .lines()
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// The flags a help text defines: those of its option lines (`  -c, --config <CONFIG>`),
/// not the ones its examples and prose mention.
fn flags_in(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter(|line| line.trim_start().starts_with('-'))
        .flat_map(|line| line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')))
        .filter(|word| word.starts_with("--") && word.len() > 2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_flag_given_to_a_command_is_one_it_takes() {
    let server = txoutbox_tests::server::binary();
    let programs = [
        Program::new(&["txoutboxd"], server.clone()),
        Program::new(&["txoutbox"], server.with_file_name("txoutbox")),
        // The Python package's command, as the wrapper runs it (scripts/test made its venv).
        Program::new(
            &["client/python/subscribe", "txoutbox-subscribe"],
            repository().join("client/python/subscribe"),
        ),
    ];
    let mut wrong = Vec::new();
    for document in documents() {
        for text in document.command_texts() {
            let words: Vec<&str> = text.split_whitespace().collect();
            for (at, word) in words.iter().enumerate() {
                let word = word.trim_start_matches(['(', '`']);
                let Some(program) = programs.iter().find(|p| {
                    p.names
                        .iter()
                        .any(|name| word == *name || word.ends_with(&format!("/{name}")))
                }) else {
                    continue;
                };
                // `cargo run ... --bin txoutboxd -- ARGS`: the arguments follow `--`.
                let mut start = at + 1;
                if at > 0 && words[at - 1] == "--bin" {
                    match words[at..].iter().position(|w| *w == "--") {
                        Some(dashes) => start = at + dashes + 1,
                        None => continue,
                    }
                }
                let args: Vec<&str> = words[start.min(words.len())..]
                    .iter()
                    .take_while(|w| !["|", "&&", ";", ">", "#", "2>&1"].contains(w))
                    .copied()
                    .collect();
                for flag in program.unknown_flags(&args) {
                    wrong.push(format!(
                        "{}: `{flag}` is no flag of {} (in: {text})",
                        document.name(),
                        program.help.display()
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "unknown flags:\n{}", wrong.join("\n"));
}

#[test]
fn every_configuration_key_named_is_one_the_server_takes() {
    let mut unknown = Vec::new();
    for document in documents() {
        let mut keys: Vec<Vec<String>> = Vec::new();
        for span in &document.spans {
            keys.extend(keys_in_span(span));
        }
        for (language, content) in &document.blocks {
            if language == "toml" {
                keys.extend(keys_in_toml(content));
            }
            for word in content.split(|c: char| c.is_whitespace() || c == '"' || c == '\'') {
                keys.extend(key_of_variable(word));
            }
        }
        for key in keys {
            for expanded in expand_braces(&key) {
                if !key_exists(&expanded) {
                    unknown.push(format!("{}: {}", document.name(), expanded.join(".")));
                }
            }
        }
    }
    unknown.sort();
    unknown.dedup();
    assert!(
        unknown.is_empty(),
        "configuration keys txoutboxd does not take:\n{}",
        unknown.join("\n")
    );
}

const SECTIONS: [&str; 4] = ["server", "databases", "outboxes", "telemetry"];

/// The keys an inline span names: `server.listen`, `server.allow_insecure = true`,
/// `[server.tls]`, `outboxes.NAME.backoff.{base,factor}`, `TXOUTBOX_SERVER__LISTEN=...`.
fn keys_in_span(span: &str) -> Vec<Vec<String>> {
    let mut keys: Vec<Vec<String>> = key_of_variable(span).into_iter().collect();
    let candidate = span
        .trim_start_matches('[')
        .split([' ', ']', '='])
        .next()
        .unwrap_or("");
    let segments: Vec<String> = candidate.split('.').map(str::to_owned).collect();
    if segments.len() > 1 && SECTIONS.contains(&segments[0].as_str()) {
        keys.push(segments);
    }
    keys
}

/// `TXOUTBOX_A__B__C` (with or without `=value`) as the key `a.b.c`.
fn key_of_variable(word: &str) -> Option<Vec<String>> {
    let name = word.split('=').next()?.strip_prefix("TXOUTBOX_")?;
    if !name.contains("__") || name.contains('*') {
        return None;
    }
    let segments: Vec<String> = name.split("__").map(str::to_lowercase).collect();
    SECTIONS.contains(&segments[0].as_str()).then_some(segments)
}

/// The keys of a TOML example: each `key = value` under its `[table]`.
fn keys_in_toml(content: &str) -> Vec<Vec<String>> {
    let mut table: Vec<String> = Vec::new();
    let mut keys = Vec::new();
    for line in content.lines().map(str::trim) {
        if let Some(header) = line.strip_prefix('[') {
            let header = header.split(']').next().unwrap();
            table = header
                .split('.')
                .map(|s| s.trim_matches('"').to_owned())
                .collect();
            keys.push(table.clone());
        } else if let Some((key, _)) = line.split_once('=') {
            let key = key.trim();
            if !key.is_empty() && !key.starts_with('#') && !key.contains(' ') {
                let mut path = table.clone();
                path.push(key.trim_matches('"').to_owned());
                keys.push(path);
            }
        }
    }
    keys
}

/// `a.{b,c}.d` as `a.b.d` and `a.c.d`.
fn expand_braces(key: &[String]) -> Vec<Vec<String>> {
    let mut all = vec![Vec::new()];
    for segment in key {
        let choices: Vec<String> = match segment.strip_prefix('{').and_then(|s| s.strip_suffix('}'))
        {
            Some(inner) => inner.split(',').map(|s| s.trim().to_owned()).collect(),
            None => vec![segment.clone()],
        };
        all = all
            .into_iter()
            .flat_map(|prefix: Vec<String>| {
                choices.iter().map(move |choice| {
                    let mut path = prefix.clone();
                    path.push(choice.clone());
                    path
                })
            })
            .collect();
    }
    all
}

/// Whether the server's configuration takes `key`: a TOML document setting only it (to a
/// string, right type or not) is refused for something else than an unknown field. Names
/// in a key (`NAME`, `OUTBOX`, a database or outbox of an example) are any name; a `*`
/// last segment stands for every key of its table.
fn key_exists(key: &[String]) -> bool {
    let mut key: Vec<String> = key.to_vec();
    if key.last().is_some_and(|last| last == "*") {
        key.pop();
    }
    // The segments where configuration takes a name of the user's.
    let named_at: &[usize] = match key[0].as_str() {
        "databases" | "outboxes" => &[1],
        "server" if key.get(1).map(String::as_str) == Some("auth") => &[3],
        _ => &[],
    };
    for &at in named_at {
        if let Some(segment) = key.get_mut(at) {
            *segment = "docs".to_owned();
        }
    }
    let (leaf, tables) = key.split_last().unwrap();
    let toml = if tables.is_empty() {
        format!("{leaf} = \"x\"\n")
    } else {
        format!("[{}]\n{leaf} = \"x\"\n", tables.join("."))
    };
    match txoutbox_server::Config::from_toml(&toml) {
        Ok(_) => true,
        Err(error) => !error.to_string().contains("unknown field"),
    }
}

/// GitHub's anchor for a heading: lowercase, punctuation dropped, spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The checks themselves, on made-up text: each kind of mistake is caught.
#[test]
fn the_checks_catch_what_they_are_for() {
    assert!(key_exists(&["server".into(), "listen".into()]));
    assert!(key_exists(&[
        "outboxes".into(),
        "NAME".into(),
        "backoff".into(),
        "base".into()
    ]));
    assert!(key_exists(&[
        "server".into(),
        "auth".into(),
        "identities".into(),
        "orders-relay".into(),
        "token_env".into()
    ]));
    assert!(!key_exists(&["server".into(), "listen_address".into()]));
    assert!(!key_exists(&[
        "outboxes".into(),
        "orders".into(),
        "retries".into()
    ]));
    assert_eq!(
        keys_in_span("TXOUTBOX_DATABASES__MAIN__URL=postgres://x"),
        [vec!["databases".to_owned(), "main".into(), "url".into()]]
    );
    assert_eq!(
        expand_braces(&["a".into(), "{b,c}".into()]),
        [
            vec!["a".to_owned(), "b".into()],
            vec!["a".into(), "c".into()]
        ]
    );
    let root = repository();
    assert!(glob_exists(&root, "tests/tests/broker_*.rs"));
    assert!(glob_exists(&root, "server/src/storage/<backend>/claim.rs"));
    assert!(!glob_exists(&root, "server/src/config.rs"));
    let txoutbox = Program::new(
        &["txoutbox"],
        txoutbox_tests::server::binary().with_file_name("txoutbox"),
    );
    assert!(txoutbox
        .unknown_flags(&["--outbox", "orders", "tail", "--count", "1"])
        .is_empty());
    assert_eq!(
        txoutbox.unknown_flags(&["tail", "--kafka/--nats", "--no-such-flag"]),
        ["--kafka", "--nats", "--no-such-flag"],
        "flags of another subcommand, or of none"
    );
}

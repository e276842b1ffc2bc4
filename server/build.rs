//! Bakes the version and the git commit into `--version`: sets `TXOUTBOX_VERSION`, for
//! example `0.1.0 (9aae6b9e3a 2026-12-02)`.
//!
//! The commit comes from the first of these that answers:
//! 0. The environment variable `TXOUTBOX_COMMIT`, for a build without the repository's
//!    `.git` (the container image's build context leaves it out; its Dockerfile passes the
//!    commit as a build argument). A full hexadecimal hash is shortened as git would; any
//!    other text (`9aae6b9e3a 2026-12-02`) is shown as given.
//! 1. `.cargo_vcs_info.json`, which `cargo package` writes into a crate tarball. It comes
//!    first because a tarball has no `.git` of its own: git asked inside an unpacked (or
//!    vendored) tarball would answer for whatever repository happens to enclose it.
//! 2. `git log -1` in the crate's directory.
//! 3. Otherwise `commit unknown`: no git, no repository, or a repository without commits.
//!
//! The script reruns when this worktree's HEAD moves, and as rarely as that allows, since a
//! rerun rebuilds the crate and everything above it: it watches `HEAD` (a checkout, or a
//! commit on a detached HEAD) and the current branch's own ref file, which git rewrites
//! only when the branch moves. Not HEAD's reflog, which `git stash` and `git reset` append
//! to without moving anything, and not the refs that every worktree of the repository
//! shares, so another worktree's commit does not rebuild this one. Only when the branch has
//! no file of its own (its ref is packed; the next commit writes one) does it watch the
//! reflog and `packed-refs` instead. A dirty tree is not marked: that would need a rerun
//! on every edit.
//!
//! `client/build.rs` is a symlink to this file: each crate must build alone from its
//! tarball, and one file keeps the two `--version`s the same. It runs standalone too
//! (`tests/tests/version.rs` compiles it with rustc to try the fallbacks).

use std::path::Path;
use std::process::Command;

const UNKNOWN: &str = "commit unknown";

/// Hex digits of the commit shown, as `git log --abbrev` counts them.
const ABBREV: usize = 10;

/// Names the commit when the build cannot ask git (see the module's header).
const COMMIT_VARIABLE: &str = "TXOUTBOX_COMMIT";

fn main() {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR is set by cargo");
    let dir = Path::new(&dir);
    let version = std::env::var("CARGO_PKG_VERSION").expect("CARGO_PKG_VERSION is set by cargo");
    println!("cargo:rerun-if-env-changed={COMMIT_VARIABLE}");
    let commit = from_environment()
        .or_else(|| from_cargo_vcs_info(dir))
        .or_else(|| from_git(dir))
        .unwrap_or_else(|| UNKNOWN.to_owned());
    println!("cargo:rustc-env=TXOUTBOX_VERSION={version} ({commit})");
    println!("cargo:rerun-if-changed=build.rs");
}

/// `TXOUTBOX_COMMIT`, trimmed, when set and not empty.
fn from_environment() -> Option<String> {
    let value = std::env::var(COMMIT_VARIABLE).ok()?;
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    let full_hash = value.len() > ABBREV && value.bytes().all(|b| b.is_ascii_hexdigit());
    Some(if full_hash { &value[..ABBREV] } else { value }.to_owned())
}

/// The commit `cargo package` recorded: `{"git": {"sha1": "<hex>", "dirty": true}, ...}`.
/// A flat search keeps the build script free of dependencies.
fn from_cargo_vcs_info(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(".cargo_vcs_info.json")).ok()?;
    let sha1 = text.split_once("\"sha1\"")?.1.split('"').nth(1)?;
    if sha1.len() < ABBREV || !sha1.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let dirty = text.contains("\"dirty\": true") || text.contains("\"dirty\":true");
    Some(format!(
        "{}{}",
        &sha1[..ABBREV],
        if dirty { " with local changes" } else { "" }
    ))
}

/// `<abbreviated hash> <commit date>` of HEAD, and the files that change when HEAD moves.
fn from_git(dir: &Path) -> Option<String> {
    let abbrev = format!("--abbrev={ABBREV}");
    let commit = git(
        dir,
        &[
            "log",
            "-1",
            &abbrev,
            "--no-show-signature",
            "--format=%h %cs",
        ],
    )?;
    // Relative paths are relative to `dir`. Only existing files: cargo reruns a script on
    // every build while a path it watches is missing.
    let git_file = |name: &str| {
        git(dir, &["rev-parse", "--git-path", name])
            .map(|path| dir.join(path))
            .filter(|path| path.is_file())
    };
    let mut watched: Vec<_> = git_file("HEAD").into_iter().collect();
    // None when HEAD is detached: then HEAD itself holds the commit.
    if let Some(branch) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        match git_file(&branch) {
            Some(ref_file) => watched.push(ref_file),
            None => watched.extend(
                ["logs/HEAD", "packed-refs"]
                    .into_iter()
                    .filter_map(git_file),
            ),
        }
    }
    for path in watched {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    Some(commit)
}

/// What `git -C dir ARGS` printed, trimmed; `None` if git is missing, fails or says nothing.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (output.status.success() && !text.is_empty()).then(|| text.to_owned())
}

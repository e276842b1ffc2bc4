//! `txoutboxd --version` and `txoutbox --version` name the version and the git commit they
//! were built from; the build script that finds the commit (`server/build.rs`, which
//! `client/build.rs` links to) falls back sensibly without git, without a repository, and
//! in a crate tarball.

use std::path::{Path, PathBuf};
use std::process::Command;

const VERSION: &str = env!("CARGO_PKG_VERSION");

#[test]
fn both_binaries_print_the_version_and_the_commit() {
    // The binaries were built from this checkout (the build script reruns when HEAD
    // moves), so they name its HEAD; without git they say they cannot.
    let commit = head_commit(&repository()).unwrap_or_else(|| "commit unknown".to_owned());
    let server = txoutbox_tests::server::binary();
    let cli = server.with_file_name("txoutbox");
    for (binary, name) in [(server, "txoutboxd"), (cli, "txoutbox")] {
        let output = Command::new(&binary).arg("--version").output().unwrap();
        assert!(output.status.success(), "{output:?}");
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            format!("{name} {VERSION} ({commit})\n")
        );
    }
}

#[test]
fn the_build_script_names_the_commit_or_says_it_cannot() {
    let script = BuildScript::compile();
    let sources = repository().join("server");

    // In the repository: HEAD's commit, and HEAD watched for the next commit.
    let output = script.run(&sources, &[]);
    let expected = head_commit(&repository()).expect("the tests run in a git checkout");
    assert!(
        output.contains(&format!("TXOUTBOX_VERSION=1.2.3 ({expected})\n")),
        "{output}"
    );
    assert!(
        output
            .lines()
            .any(|line| line.starts_with("cargo:rerun-if-changed=") && line.ends_with("HEAD")),
        "{output}"
    );

    // No git on the PATH.
    let no_git = tempfile::tempdir().unwrap();
    let output = script.run(&sources, &[("PATH", no_git.path())]);
    assert!(
        output.contains("TXOUTBOX_VERSION=1.2.3 (commit unknown)\n"),
        "{output}"
    );

    // Git, but no repository: GIT_CEILING_DIRECTORIES keeps git from looking above the
    // directory, whatever encloses the temporary directory.
    let outside = tempfile::tempdir().unwrap();
    let above = outside.path().parent().unwrap();
    let output = script.run(outside.path(), &[("GIT_CEILING_DIRECTORIES", above)]);
    assert!(
        output.contains("TXOUTBOX_VERSION=1.2.3 (commit unknown)\n"),
        "{output}"
    );
    assert_eq!(
        output.matches("rerun-if-changed").count(),
        1,
        "only build.rs is watched: {output}"
    );

    // Named by the builder (the container image's build argument), ahead of everything
    // else: a full hash shortened as git shortens it, other text as given.
    let variable = |value: &str| [("TXOUTBOX_COMMIT", Path::new(value).to_owned())];
    let full = "89abcdef0123456789abcdef0123456789abcdef";
    let output = script.run_with(&sources, &variable(full));
    assert!(
        output.contains("TXOUTBOX_VERSION=1.2.3 (89abcdef01)\n"),
        "{output}"
    );
    assert!(
        output.contains("cargo:rerun-if-env-changed=TXOUTBOX_COMMIT\n"),
        "{output}"
    );
    let output = script.run_with(outside.path(), &variable("9aae6b9e3a 2026-12-02"));
    assert!(
        output.contains("TXOUTBOX_VERSION=1.2.3 (9aae6b9e3a 2026-12-02)\n"),
        "{output}"
    );
    let output = script.run_with(&sources, &variable(" "));
    assert!(
        output.contains(&format!("TXOUTBOX_VERSION=1.2.3 ({expected})\n")),
        "an empty variable falls back to git: {output}"
    );

    // A crate tarball: the commit `cargo package` recorded, even when unpacked inside
    // another repository (vendored), whose commit git would give.
    let enclosing = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let status = Command::new("git")
            .arg("-C")
            .arg(enclosing.path())
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .output()
            .unwrap();
        assert!(status.status.success(), "{status:?}");
    };
    git(&["init", "-q"]);
    git(&["commit", "-q", "--allow-empty", "-m", "vendored"]);
    let tarball = enclosing.path().join("txoutbox-server-1.2.3");
    std::fs::create_dir(&tarball).unwrap();
    let vcs_info = |dirty: &str| {
        format!(
            "{{\n  \"git\": {{\n    \"sha1\": \"0123456789abcdef0123456789abcdef01234567\"{dirty}\n  }},\n  \"path_in_vcs\": \"server\"\n}}"
        )
    };
    let info = tarball.join(".cargo_vcs_info.json");
    std::fs::write(&info, vcs_info("")).unwrap();
    let output = script.run(&tarball, &[]);
    assert!(
        output.contains("TXOUTBOX_VERSION=1.2.3 (0123456789)\n"),
        "{output}"
    );
    std::fs::write(&info, vcs_info(",\n    \"dirty\": true")).unwrap();
    let output = script.run(&tarball, &[]);
    assert!(
        output.contains("TXOUTBOX_VERSION=1.2.3 (0123456789 with local changes)\n"),
        "{output}"
    );
}

/// `server/build.rs` compiled on its own, to run as cargo would, in any directory.
struct BuildScript {
    _dir: tempfile::TempDir,
    binary: PathBuf,
}

impl BuildScript {
    fn compile() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let binary = dir.path().join("build-script");
        let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
        let output = Command::new(rustc)
            .args(["--edition", "2021", "-o"])
            .arg(&binary)
            .arg(repository().join("server/build.rs"))
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", text(&output.stderr));
        Self { _dir: dir, binary }
    }

    /// What the script prints for a crate in `manifest_dir`, with `env` set.
    fn run(&self, manifest_dir: &Path, env: &[(&str, &Path)]) -> String {
        let env: Vec<(&str, PathBuf)> = env.iter().map(|(k, v)| (*k, v.to_path_buf())).collect();
        self.run_with(manifest_dir, &env)
    }

    /// [`Self::run`] with owned values. `TXOUTBOX_COMMIT` is unset unless given, so the
    /// environment the tests run in does not decide.
    fn run_with(&self, manifest_dir: &Path, env: &[(&str, PathBuf)]) -> String {
        let output = Command::new(&self.binary)
            .current_dir(manifest_dir)
            .env("CARGO_MANIFEST_DIR", manifest_dir)
            .env("CARGO_PKG_VERSION", "1.2.3")
            .env_remove("TXOUTBOX_COMMIT")
            .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", text(&output.stderr));
        text(&output.stdout)
    }
}

/// `<hash> <date>` of HEAD as the build script shows it; `None` without git.
fn head_commit(repository: &Path) -> Option<String> {
    let output = Command::new("git")
        .arg("-C")
        .arg(repository)
        .args([
            "log",
            "-1",
            "--abbrev=10",
            "--no-show-signature",
            "--format=%h %cs",
        ])
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| text(&output.stdout).trim().to_owned())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

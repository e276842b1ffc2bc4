//! `scripts/test`, which sets a bare Debian up for the suite: on this machine, which has
//! it all, it changes nothing; where something is missing it installs, starts or
//! configures exactly that; without root or apt it stops with a hint that works.
//!
//! Everything that would change the machine is simulated: the commands that install,
//! start or configure are replaced (first on the PATH) by stubs that record their
//! arguments, and a check that must fail is a stub that fails until the action that
//! fixes it ran. Files the script edits are under `TXOUTBOX_SETUP_ROOT`, a directory of
//! the test's. What cannot be simulated here (a real `apt-get install` of PostgreSQL on a
//! bare Debian, the first start of its cluster) is what these stubs stand for.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

/// Commands the script changes the machine with: in every test each one fails, saying
/// what it was asked, unless the test gives it another body.
const CHANGERS: [&str; 12] = [
    "apt-get",
    "sudo",
    "cargo",
    "pg_ctlcluster",
    "pg_createcluster",
    "start-stop-daemon",
    "install",
    "redis-server",
    "rabbitmq-server",
    "mosquitto",
    "createdb",
    "runuser",
];

/// A directory of stubs, first on the PATH of the script, and a root for the files it
/// edits.
struct Machine {
    dir: tempfile::TempDir,
    path: String,
}

impl Machine {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("bin")).unwrap();
        std::fs::create_dir(dir.path().join("root")).unwrap();
        let path = format!(
            "{}:{}",
            dir.path().join("bin").display(),
            std::env::var("PATH").unwrap()
        );
        let machine = Self { dir, path };
        for name in CHANGERS {
            machine.stub(name, &format!("echo \"would run: {name} $*\" >&2\nexit 97"));
        }
        machine
    }

    /// An executable `bin/name` running `body` in sh (replacing one made before).
    fn stub(&self, name: &str, body: &str) {
        let path = self.dir.path().join("bin").join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// A stub that appends `name ARGS` to the log of calls, then runs `then`.
    fn records(&self, name: &str, then: &str) {
        let log = self.file("calls");
        self.stub(
            name,
            &format!("echo \"{name} $*\" >> {}\n{then}", log.display()),
        );
    }

    /// A path in the test's directory (flags the stubs set, the log of calls).
    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A file under the setup root, created with `text`.
    fn etc_file(&self, relative: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join("root/etc").join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `dpkg-query` that reports `package` removed with its configuration left behind
    /// (which `dpkg -s` would call present), and asks the real one about the others.
    fn dpkg_lacks(&self, package: &str) {
        let real = std::env::var("PATH").unwrap();
        self.stub(
            "dpkg-query",
            &format!(
                "for arg; do package=$arg; done\n\
                 if [ \"$package\" = {package} ]; then printf config-files; exit 0; fi\n\
                 PATH='{real}' exec dpkg-query \"$@\""
            ),
        );
    }

    /// `scripts/test ARGS` on this machine: the stubs first on the PATH.
    fn run(&self, args: &[&str]) -> Output {
        self.run_with_path(args, &self.path)
    }

    fn run_with_path(&self, args: &[&str], path: &str) -> Output {
        std::process::Command::new(repository().join("scripts/test"))
            .args(args)
            .env("PATH", path)
            .env("TXOUTBOX_SETUP_ROOT", self.dir.path().join("root"))
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// The recorded calls, one per line, split into words.
    fn calls(&self) -> Vec<Vec<String>> {
        std::fs::read_to_string(self.file("calls"))
            .unwrap_or_default()
            .lines()
            .map(|line| line.split_whitespace().map(str::to_owned).collect())
            .collect()
    }
}

fn stderr_lines(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Whether `call` holds every one of `words`.
fn names(call: &[String], words: &[&str]) -> bool {
    words.iter().all(|word| call.iter().any(|w| w == word))
}

/// On a machine that has everything, the set-up only checks: no command that changes the
/// machine runs, nothing is said, and `--check` says everything is in place. A check that
/// never passes (a misspelt package, a service probed on the wrong port) fails it.
#[test]
fn on_a_ready_machine_it_only_checks() {
    let machine = Machine::new();
    let started = Instant::now();
    let output = machine.run(&["--setup-only"]);
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stderr.is_empty(),
        "scripts/test wanted to change this machine ({}):\n{stderr}",
        output.status
    );
    // "Seconds of overhead": about one on an idle machine.
    eprintln!("scripts/test --setup-only took {took:?}");
    assert!(took < Duration::from_secs(30), "took {took:?}");

    let output = machine.run(&["--check"]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "scripts/test: everything the tests use is in place\n"
    );
}

/// A package missing, PostgreSQL and Redis down: `--check` lists them and changes
/// nothing; the set-up installs that one package, starts the two (PostgreSQL and Redis
/// answer only once their start command ran) and says each thing it does.
#[test]
fn it_installs_and_starts_only_what_is_missing_and_check_says_so_first() {
    let machine = Machine::new();
    machine.dpkg_lacks("cmake");
    machine.records("apt-get", "");
    let up = |name: &str| machine.file(&format!("{name}-up")).display().to_string();
    machine.stub("pg_isready", &format!("[ -e {} ]", up("postgres")));
    // Once started, the cluster lets the tests in (its configuration is done).
    let real_path = std::env::var("PATH").unwrap();
    machine.stub(
        "psql",
        &format!(
            "[ -e {} ] || exit 2\nPATH='{real_path}' exec psql \"$@\"",
            up("postgres")
        ),
    );
    machine.records("pg_ctlcluster", &format!("touch {}", up("postgres")));
    machine.etc_file("postgresql/15/main/pg_hba.conf", "local all all trust\n");
    machine.stub("redis-cli", &format!("[ -e {} ] && echo PONG", up("redis")));
    machine.records("redis-server", &format!("touch {}", up("redis")));

    let check = machine.run(&["--check"]);
    let stdout = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(1), "{stdout}");
    for needle in [
        "missing: Debian packages to install: cmake",
        "missing: PostgreSQL on 127.0.0.1:5432 does not let postgres and root",
        "missing: no Redis on 127.0.0.1:6379",
    ] {
        assert!(stdout.contains(needle), "{needle:?} not in:\n{stdout}");
    }
    assert!(machine.calls().is_empty(), "{:?}", machine.calls());

    let output = machine.run(&["--setup-only"]);
    assert!(output.status.success(), "{:?}", stderr_lines(&output));
    let calls = machine.calls();
    assert_eq!(calls.len(), 4, "{calls:?}");
    assert!(names(&calls[0], &["apt-get", "update"]), "{calls:?}");
    assert!(
        names(&calls[1], &["apt-get", "install", "cmake"])
            && calls[1].last().map(String::as_str) == Some("cmake"),
        "only cmake is installed: {calls:?}"
    );
    assert!(
        names(&calls[2], &["pg_ctlcluster", "15", "main", "start"]),
        "{calls:?}"
    );
    assert!(
        names(&calls[3], &["redis-server", "--port", "6379"]),
        "{calls:?}"
    );
    assert_eq!(
        stderr_lines(&output),
        [
            "scripts/test: installing cmake",
            "scripts/test: starting PostgreSQL 15",
            "scripts/test: starting Redis"
        ]
    );
}

/// PostgreSQL runs but refuses the tests (Debian's default authentication, no role root):
/// the set-up puts the trust lines at the top of the cluster's pg_hba.conf once, reloads
/// the cluster, and creates the role; the database exists already.
#[test]
fn it_configures_a_postgresql_that_refuses_the_tests() {
    let machine = Machine::new();
    let hba = machine.etc_file(
        "postgresql/15/main/pg_hba.conf",
        "local all postgres peer\nhost all all 127.0.0.1/32 scram-sha-256\n",
    );
    let reloaded = machine.file("reloaded");
    let role = machine.file("role-root");
    machine.stub("pg_isready", "exit 0");
    machine.records("pg_ctlcluster", &format!("touch {}", reloaded.display()));
    // A psql that refuses until reloaded with the trust lines, then knows the database
    // `test` and, once created, the role root.
    machine.stub(
        "psql",
        &format!(
            "log={calls}\n\
             if ! {{ [ -e {reloaded} ] && grep -q '^host all all 127.0.0.1/32 trust' {hba}; }}; then exit 2; fi\n\
             case \"$*\" in\n\
               *'-U root'*) [ -e {role} ] || exit 2 ;;\n\
               *'CREATE ROLE root'*) echo \"psql $*\" >> $log; touch {role} ;;\n\
               *pg_roles*) [ -e {role} ] && echo 1 ;;\n\
               *pg_database*) echo 1 ;;\n\
             esac\n\
             exit 0",
            calls = machine.file("calls").display(),
            reloaded = reloaded.display(),
            hba = hba.display(),
            role = role.display(),
        ),
    );

    let output = machine.run(&["--setup-only"]);
    assert!(output.status.success(), "{:?}", stderr_lines(&output));
    let text = std::fs::read_to_string(&hba).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[1..],
        [
            "local all all trust",
            "host all all 127.0.0.1/32 trust",
            "local all postgres peer",
            "host all all 127.0.0.1/32 scram-sha-256"
        ],
        "the trust lines first, the cluster's own after them:\n{text}"
    );
    assert!(lines[0].starts_with("# scripts/test (txoutbox)"), "{text}");
    let calls = machine.calls();
    assert!(
        names(&calls[0], &["pg_ctlcluster", "15", "main", "reload"]),
        "{calls:?}"
    );
    assert!(names(&calls[1], &["CREATE", "ROLE", "root"]), "{calls:?}");
    assert_eq!(calls.len(), 2, "the database test exists: {calls:?}");
    let said = stderr_lines(&output);
    assert!(
        said[0].starts_with("scripts/test: configuring PostgreSQL 15: trust on 127.0.0.1"),
        "{said:?}"
    );
    assert_eq!(said[1], "scripts/test: creating the PostgreSQL role root");

    // Done once: a second pass that finds the marker adds nothing.
    std::fs::remove_file(&role).unwrap();
    let output = machine.run(&["--setup-only"]);
    assert!(output.status.success(), "{:?}", stderr_lines(&output));
    assert_eq!(std::fs::read_to_string(&hba).unwrap(), text);
}

/// MariaDB runs but refuses root from 127.0.0.1 without a password (Debian's default):
/// the set-up lets root in and creates the database, over the socket.
#[test]
fn it_configures_a_mariadb_that_refuses_the_tests() {
    let machine = Machine::new();
    let configured = machine.file("mariadb-configured");
    machine.stub("mariadb-admin", "exit 0");
    machine.stub(
        "mariadb",
        &format!(
            "case \"$*\" in\n\
               *'-h 127.0.0.1'*) [ -e {configured} ] ;;\n\
               *) echo \"mariadb $*\" >> {calls}; touch {configured} ;;\n\
             esac",
            configured = configured.display(),
            calls = machine.file("calls").display(),
        ),
    );

    let output = machine.run(&["--setup-only"]);
    assert!(output.status.success(), "{:?}", stderr_lines(&output));
    let calls = std::fs::read_to_string(machine.file("calls")).unwrap();
    for statement in [
        "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY ''",
        "GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1'",
        "CREATE DATABASE IF NOT EXISTS test",
    ] {
        assert!(calls.contains(statement), "{statement:?} not in {calls}");
    }
    assert_eq!(
        stderr_lines(&output),
        ["scripts/test: configuring MariaDB: root without a password from 127.0.0.1, database test"]
    );
}

/// Not root, no sudo: the set-up stops before changing anything, naming the command it
/// needed root for and how to go on.
#[test]
fn without_root_or_sudo_it_stops_with_a_hint() {
    let machine = Machine::new();
    machine.dpkg_lacks("cmake");
    machine.stub("id", "echo 1000");
    // No sudo on the PATH (this machine has none; the stub of the others is removed).
    std::fs::remove_file(machine.dir.path().join("bin/sudo")).unwrap();
    if std::process::Command::new("sh")
        .args(["-c", "command -v sudo"])
        .output()
        .unwrap()
        .status
        .success()
    {
        eprintln!("this machine has sudo: the script would use it; nothing to show here");
        return;
    }
    let output = machine.run(&["--setup-only"]);
    assert_eq!(output.status.code(), Some(1));
    let said = stderr_lines(&output);
    assert_eq!(
        said.last().unwrap(),
        "scripts/test: needs root to run `apt-get -q -o DPkg::Lock::Timeout=600 update`: \
         run scripts/test as root (or install sudo), or run that yourself, then scripts/test again",
        "{said:?}"
    );
}

/// No apt-get: the set-up says which Debian packages to install another way.
#[test]
fn without_apt_it_stops_with_the_packages_to_install() {
    let machine = Machine::new();
    machine.dpkg_lacks("cmake");
    std::fs::remove_file(machine.dir.path().join("bin/apt-get")).unwrap();
    // This PATH: the stubs, then every other command of the machine but apt-get.
    let others = machine.dir.path().join("others");
    std::fs::create_dir(&others).unwrap();
    for dir in std::env::var("PATH").unwrap().split(':') {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let link = others.join(entry.file_name());
            if entry.file_name() != "apt-get" && link.symlink_metadata().is_err() {
                std::os::unix::fs::symlink(entry.path(), link).unwrap();
            }
        }
    }
    let path = format!(
        "{}:{}",
        machine.dir.path().join("bin").display(),
        others.display()
    );
    let output = machine.run_with_path(&["--setup-only"], &path);
    assert_eq!(output.status.code(), Some(1), "{:?}", stderr_lines(&output));
    assert_eq!(
        stderr_lines(&output).last().unwrap(),
        "scripts/test: no apt-get on this machine: install cmake (Debian's names) yourself, \
         then run scripts/test again"
    );
}

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

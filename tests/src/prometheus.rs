//! A real Prometheus server (Debian's `prometheus` package, installed by `scripts/test`)
//! scraping the given targets every second with the given rule files, its HTTP API on a
//! port of its own; and `promtool`, the checks Prometheus itself ships.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::process::{Child, Command};

use crate::{eventually, DEADLINE};

/// The repository's `deploy/prometheus` directory.
pub fn rules_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus")
}

/// The repository's `deploy/grafana` directory.
pub fn dashboards_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana")
}

/// Runs `promtool ARGS...` with `stdin`, returning (success, stdout + stderr).
pub fn promtool(args: &[&str], stdin: &str, dir: &Path) -> (bool, String) {
    let mut child = std::process::Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; scripts/test installs it)");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// GETs `url` and returns its body, failing the test on any error.
pub async fn get(url: &str) -> String {
    let response = reqwest::get(url)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert!(
        response.status().is_success(),
        "GET {url}: {}",
        response.status()
    );
    response.text().await.unwrap()
}

pub struct Prometheus {
    child: Child,
    pub url: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` (host:port, job `txoutbox`) every second,
    /// evaluating `rule_files` every second, and waits until it is ready.
    pub async fn start(targets: &[String], rule_files: &[PathBuf]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let rules: Vec<String> = rule_files
            .iter()
            .map(|f| format!("'{}'", f.canonicalize().unwrap().display()))
            .collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files: [{}]\n\
             scrape_configs:\n  - job_name: txoutbox\n    static_configs:\n      - targets: [{}]\n",
            rules.join(", "),
            targets.join(", ")
        );
        let config_file = dir.path().join("prometheus.yml");
        std::fs::write(&config_file, config).unwrap();
        // A port the kernel picked and released: Prometheus does not report the port of
        // a `:0` listener.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("prometheus (Debian package prometheus; scripts/test installs it)");
        let prometheus = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        let ready = format!("{}/-/ready", prometheus.url);
        eventually("Prometheus to be ready", DEADLINE, || async {
            let response = reqwest::get(&ready).await.ok()?;
            response.status().is_success().then_some(())
        })
        .await;
        prometheus
    }

    /// The result vector of an instant query, failing the test when Prometheus refuses
    /// the expression.
    pub async fn query(&self, expr: &str) -> Vec<Value> {
        let response = reqwest::Client::new()
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", expr)])
            .send()
            .await
            .unwrap();
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["status"], "success", "query {expr}: {body}");
        body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Waits until `expr` returns at least one series.
    pub async fn wait_for_data(&self, expr: &str, deadline: Duration) -> Vec<Value> {
        eventually(&format!("data for {expr}"), deadline, || async {
            let result = self.query(expr).await;
            (!result.is_empty()).then_some(result)
        })
        .await
    }

    /// The rule groups Prometheus loaded (`/api/v1/rules`), with each rule's health.
    pub async fn rule_groups(&self) -> Vec<Value> {
        let body: Value =
            serde_json::from_str(&get(&format!("{}/api/v1/rules", self.url)).await).unwrap();
        body["data"]["groups"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

//! The Python original, `txoutbox` 0.2.2 from PyPI with its asyncpg adapter, in a venv
//! the benchmark makes (once; reused while its requirements are unchanged), driven by
//! `tests/bench/python_relay.py` (embedded in this binary and written into the venv).

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use super::workload::{BenchSchema, Workload, TABLE};
use super::Plan;

/// What the venv holds: the original, exactly the version the project grew out of.
const REQUIREMENTS: &str = "txoutbox==0.2.2\nasyncpg\n";
const SCRIPT: &str = include_str!("../../bench/python_relay.py");

/// The venv's interpreter and the driver script.
#[derive(Debug, Clone)]
pub struct Python {
    pub interpreter: PathBuf,
    pub script: PathBuf,
}

/// Makes (or reuses) the venv; an error says why the original cannot be measured.
pub async fn prepare(plan: &Plan) -> anyhow::Result<Python> {
    let plan = plan.clone();
    tokio::task::spawn_blocking(move || prepare_venv(&plan.python, &plan.venv)).await?
}

fn prepare_venv(python: &str, venv: &Path) -> anyhow::Result<Python> {
    let parent = venv.parent().context("venv path has no parent")?;
    fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let lock_path = parent.join("bench-python-venv.lock");
    let mut lock = fd_lock::RwLock::new(
        File::create(&lock_path).with_context(|| format!("creating {}", lock_path.display()))?,
    );
    let _guard = lock.write().context("locking the venv")?;

    let interpreter = venv.join("bin").join("python");
    let marker = venv.join("bench-requirements.txt");
    let up_to_date = fs::read_to_string(&marker).is_ok_and(|m| m == REQUIREMENTS)
        && quiet(
            std::process::Command::new(&interpreter)
                .args(["-c", "import txoutbox.adapters.postgres, asyncpg"]),
        )
        .is_ok();
    if !up_to_date {
        eprintln!(
            "[bench] making the Python venv {} (txoutbox==0.2.2, asyncpg)",
            venv.display()
        );
        let _ = fs::remove_dir_all(venv);
        quiet(
            std::process::Command::new(python)
                .args(["-m", "venv"])
                .arg(venv),
        )
        .with_context(|| format!("`{python} -m venv` failed (is python3-venv installed?)"))?;
        let requirements = venv.join("requirements.txt");
        fs::write(&requirements, REQUIREMENTS)?;
        quiet(
            std::process::Command::new(&interpreter)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "-r",
                ])
                .arg(&requirements),
        )
        .context("pip could not install txoutbox==0.2.2 and asyncpg (is PyPI reachable?)")?;
        fs::write(&marker, REQUIREMENTS)?;
    }
    let script = venv.join("python_relay.py");
    fs::write(&script, SCRIPT)?;
    Ok(Python {
        interpreter,
        script,
    })
}

/// Runs a command to completion; its output only shows when it fails.
fn quiet(command: &mut std::process::Command) -> anyhow::Result<()> {
    let output = command.stdin(Stdio::null()).output()?;
    if !output.status.success() {
        bail!(
            "{} exited with {}: {}",
            command.get_program().to_string_lossy(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// Drains the backlog with `relays` Python relay processes; returns msg/s, measured
/// from the first relay's start to the last one's end (their own clocks).
pub async fn drain(
    plan: &Plan,
    python: &Python,
    workload: Workload,
    relays: usize,
) -> anyhow::Result<f64> {
    let schema = BenchSchema::create(&plan.database_url, "python").await?;
    let result = drain_in(plan, python, &schema, workload, relays).await;
    schema.drop().await;
    result
}

async fn drain_in(
    plan: &Plan,
    python: &Python,
    schema: &BenchSchema,
    workload: Workload,
    relays: usize,
) -> anyhow::Result<f64> {
    let mut args = vec![
        "--dsn".to_owned(),
        plan.python_url.clone(),
        "--schema".to_owned(),
        schema.name.clone(),
        "--table".to_owned(),
        TABLE.to_owned(),
    ];
    if !workload.strict_ordering() {
        args.push("--no-strict".to_owned());
    }
    let status = Command::new(&python.interpreter)
        .arg(&python.script)
        .arg("prepare")
        .args(&args)
        .stdin(Stdio::null())
        .status()
        .await?;
    anyhow::ensure!(status.success(), "python_relay.py prepare failed: {status}");
    schema
        .load(&schema.table(), workload, plan.keys, workload.rows(plan))
        .await?;

    let mut children = Vec::new();
    for i in 0..relays {
        let mut child = Command::new(&python.interpreter)
            .arg(&python.script)
            .arg("drain")
            .args(&args)
            .args(["--batch-size", &plan.batch_size.to_string()])
            .args(["--worker-id", &format!("python-bench-{i}")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting python_relay.py")?;
        let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let ready = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
        anyhow::ensure!(
            matches!(ready, Ok(Ok(Some(ref line))) if line == "ready"),
            "python relay {i} did not get ready: {ready:?}"
        );
        children.push((child, lines));
    }
    for (child, _) in &mut children {
        let stdin = child.stdin.as_mut().context("stdin")?;
        stdin.write_all(b"go\n").await?;
        stdin.flush().await?;
    }
    let rows = workload.rows(plan);
    let (mut first_start, mut last_end, mut published) = (f64::MAX, f64::MIN, 0u64);
    let deadline = Duration::from_secs(120) + Duration::from_millis(rows * 20);
    for (child, lines) in &mut children {
        let line = tokio::time::timeout(deadline, lines.next_line())
            .await
            .context("the Python relay did not finish in time")??
            .context("the Python relay exited without a result")?;
        let result: serde_json::Value = serde_json::from_str(&line)
            .with_context(|| format!("unexpected output of python_relay.py: {line}"))?;
        first_start = first_start.min(result["start"].as_f64().unwrap_or(f64::MAX));
        last_end = last_end.max(result["end"].as_f64().unwrap_or(f64::MIN));
        published += result["published"].as_u64().unwrap_or(0);
        wait(child).await;
    }
    anyhow::ensure!(
        published >= rows,
        "the Python relays published {published} of {rows} rows"
    );
    Ok(rows as f64 / (last_end - first_start))
}

async fn wait(child: &mut Child) {
    if tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

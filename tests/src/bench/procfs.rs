//! What `/proc` says about the processes of a measurement: peak and current memory of
//! `txoutboxd`, and CPU time of the server, of PostgreSQL and of the benchmark itself
//! (the client side), to tell where a drain spends its time.

use std::fs;
use std::sync::OnceLock;

/// A `kB` field of `/proc/PID/status` (`VmHWM`, `VmRSS`), in KiB.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

/// User plus system CPU time of a process so far, in seconds (children not included).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(ticks_of_stat(&stat)? as f64 / clock_ticks())
}

/// CPU seconds of every `postgres` process on the machine (the postmaster, its
/// background workers and every backend, including other clients': run the benchmark
/// on an otherwise idle machine).
pub fn postgres_cpu_seconds() -> f64 {
    let Ok(entries) = fs::read_dir("/proc") else {
        return 0.0;
    };
    let ticks: u64 = entries
        .filter_map(Result::ok)
        .filter(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|entry| fs::read_to_string(entry.path().join("stat")).ok())
        .filter(|stat| stat.contains("(postgres)"))
        .filter_map(|stat| ticks_of_stat(&stat))
        .sum();
    ticks as f64 / clock_ticks()
}

/// `utime + stime` (fields 14 and 15) of a `/proc/PID/stat` line. The command name in
/// parentheses may hold spaces, so fields are counted after its closing parenthesis.
fn ticks_of_stat(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// `getconf CLK_TCK`, 100 on every Linux this runs on.
fn clock_ticks() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// CPU use over an interval, in cores (1.0 = one core busy all the time).
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuShare {
    pub servers: f64,
    pub postgres: f64,
    /// The benchmark process: the subscribers (client runtime) or the in-process workers.
    pub bench: f64,
}

/// CPU counters at one moment, to subtract from a later one.
#[derive(Debug, Clone)]
pub struct CpuSnapshot {
    servers: Vec<(u32, f64)>,
    postgres: f64,
    bench: f64,
    at: std::time::Instant,
}

impl CpuSnapshot {
    pub fn take(server_pids: &[u32]) -> Self {
        Self {
            servers: server_pids
                .iter()
                .map(|pid| (*pid, cpu_seconds(*pid).unwrap_or(0.0)))
                .collect(),
            postgres: postgres_cpu_seconds(),
            bench: cpu_seconds(std::process::id()).unwrap_or(0.0),
            at: std::time::Instant::now(),
        }
    }

    /// Cores used since `self`.
    pub fn share_until(&self, later: &CpuSnapshot) -> CpuShare {
        let wall = later.at.duration_since(self.at).as_secs_f64().max(1e-9);
        let servers: f64 = later
            .servers
            .iter()
            .map(|(pid, now)| {
                let before = self
                    .servers
                    .iter()
                    .find(|(p, _)| p == pid)
                    .map_or(0.0, |s| s.1);
                now - before
            })
            .sum();
        CpuShare {
            servers: servers / wall,
            postgres: (later.postgres - self.postgres) / wall,
            bench: (later.bench - self.bench) / wall,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_entries() {
        let pid = std::process::id();
        assert!(status_kib(pid, "VmRSS").unwrap() > 0);
        assert!(status_kib(pid, "VmHWM").unwrap() > 0);
        assert!(cpu_seconds(pid).is_some());
        let stat = "42 (post gres) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0";
        assert_eq!(ticks_of_stat(stat), Some(300));
    }
}

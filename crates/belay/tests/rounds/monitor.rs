//! The monitor with its inputs forced: an agent that fails authentication,
//! a real disk filled up (a small tmpfs), a round left hung by a killed
//! belay. Each detector fires once per episode; the auto-stop ones stop serve.

use super::*;

fn monitor_lines(p: &Proj, c: &Path, ticks: &str) -> Vec<Value> {
    let o = p.run(
        c,
        &[
            "monitor",
            "--mode",
            "events",
            "--ticks",
            ticks,
            "--interval",
            "0.05",
        ],
    );
    ok(&o);
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .collect()
}

fn alerts(lines: &[Value], detector: &str) -> usize {
    lines
        .iter()
        .filter(|l| l["event"] == "monitor_alert_emitted" && l["detector"] == detector)
        .count()
}

#[test]
fn an_auth_failure_stops_serve_before_it_burns_more_rounds() {
    let p = proj();
    let c = p.config(
        "auth",
        "auth",
        "host",
        "round_budget_s = 60",
        "[monitor]\ninterval_s = 0.2\nauth_fail_hint = \"log in again\"",
    );
    let t0 = Instant::now();
    let o = p.run(&c, &["serve"]);
    assert_eq!(code(&o), 0, "{}", show(&o));
    assert!(t0.elapsed() < Duration::from_secs(30));
    let rounds = p.kinds("auth", "round_end").len();
    assert!((1..=2).contains(&rounds), "{rounds} rounds ran");
    assert!(!p.kinds("auth", "agent_auth_error_detected").is_empty());
    let fired: Vec<Value> = p
        .kinds("auth", "monitor_alert_emitted")
        .into_iter()
        .filter(|e| e["data"]["detector"] == "oauth_fail")
        .collect();
    assert_eq!(fired.len(), 1, "one episode, one alert");
    assert!(fired[0]["data"]["message"]
        .as_str()
        .unwrap()
        .contains("log in again"));
    assert_eq!(p.kinds("auth", "monitor_auto_stop_triggered").len(), 1);
    let stopped = p.kinds("auth", "serve_stopped");
    assert!(
        stopped[0]["data"]["reason"]
            .as_str()
            .unwrap()
            .contains("oauth_fail"),
        "{stopped:?}"
    );
}

fn is_root() -> bool {
    rustix::process::getuid().is_root()
}

/// A tmpfs of `mib` MiB at `dir`, unmounted when dropped.
pub(crate) struct Tmpfs(PathBuf);

impl Tmpfs {
    pub(crate) fn mount(dir: &Path, mib: u32) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount a tmpfs at {}", dir.display());
        Tmpfs(dir.to_path_buf())
    }

    /// Fill the filesystem until `pct` % of it is used.
    fn fill_to(&self, pct: f64) {
        let s = rustix::fs::statvfs(&self.0).unwrap();
        let total = s.f_blocks as f64 * s.f_frsize as f64;
        let used = (s.f_blocks - s.f_bfree) as f64 * s.f_frsize as f64;
        let want = (total * pct / 100.0 - used).max(0.0) as usize;
        let f = self.0.join(format!("fill-{pct}"));
        std::fs::write(f, vec![0u8; want]).unwrap();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_filling_disk_warns_once_then_is_critical_once_and_stops_serve() {
    if !is_root() {
        eprintln!("skipped: mounting the test filesystem needs root (CI runs as root)");
        return;
    }
    let p = proj();
    let fs = Tmpfs::mount(&p.logs("disk"), 16);
    let c = p.config(
        "disk",
        "commit",
        "host",
        "round_budget_s = 60",
        &format!(
            "[monitor]\ninterval_s = 0.1\n[monitor.host_health.disk]\npaths = [\"{}\"]",
            p.logs("disk").display()
        ),
    );
    fs.fill_to(92.0);
    let lines = monitor_lines(&p, &c, "3");
    assert_eq!(alerts(&lines, "disk_warning"), 1, "{lines:?}");
    assert_eq!(alerts(&lines, "disk_critical"), 0);
    fs.fill_to(97.0);
    let lines = monitor_lines(&p, &c, "3");
    assert_eq!(alerts(&lines, "disk_critical"), 1, "{lines:?}");
    assert!(
        lines
            .iter()
            .any(|l| l["event"] == "monitor_auto_stop_failed"),
        "no serve to stop: said so"
    );
    // With serve running, the same disk stops it (after its round).
    let o = p.run(&c, &["serve"]);
    assert_eq!(code(&o), 0, "{}", show(&o));
    let stopped = p.kinds("disk", "serve_stopped");
    assert!(
        stopped[0]["data"]["reason"]
            .as_str()
            .unwrap()
            .contains("disk_critical"),
        "{stopped:?}"
    );
    assert!(p.kinds("disk", "round_end").len() <= 2);
}

#[test]
fn a_round_left_hung_is_reported_once_and_a_deliberate_stop_is_not_stale() {
    let p = proj();
    let c = p.config("hung", "hang", "host", "round_budget_s = 1", "");
    let mut child = start_hanging_round(&p, &c, p.mark);
    child.kill().unwrap();
    child.wait().unwrap();
    let started = Instant::now();
    std::thread::sleep(Duration::from_millis(1700).saturating_sub(started.elapsed()));
    let lines = monitor_lines(&p, &c, "4");
    assert_eq!(alerts(&lines, "hung"), 1, "{lines:?}");
    assert_eq!(alerts(&lines, "supervisor_stale"), 1, "{lines:?}");
    // A serve that stopped on purpose is quiet, not stale.
    let q = p.config("quiet", "commit", "host", "round_budget_s = 1", "");
    ok(&p.run(&q, &["serve", "--max-rounds", "1"]));
    std::thread::sleep(Duration::from_millis(1700));
    let lines = monitor_lines(&p, &q, "2");
    assert_eq!(alerts(&lines, "supervisor_stale"), 0, "{lines:?}");
    assert_eq!(alerts(&lines, "hung"), 0, "{lines:?}");
}

#[test]
fn the_http_mode_serves_a_status_page_on_loopback() {
    let p = proj();
    let c = p.config("http", "commit", "host", "round_budget_s = 60", "");
    ok(&p.run(&c, &["round"]));
    let mut m = p
        .cmd(&c)
        .args([
            "monitor",
            "--mode",
            "http",
            "--port",
            "0",
            "--interval",
            "0.1",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(m.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("http://127.0.0.1:"))
        .unwrap()
        .to_string();
    std::thread::sleep(Duration::from_millis(300));
    let addr = url.trim_start_matches("http://").trim_end_matches('/');
    let get_as = |path: &str, host: &str| -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        use std::io::{Read, Write};
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let get = |path: &str| get_as(path, addr);
    // A DNS-rebinding page names its own site: refused, nothing of the status.
    let rebound = get_as("/status.json", "rebind.example");
    assert!(
        rebound.starts_with("HTTP/1.1 421") && !rebound.contains("round_num"),
        "{rebound}"
    );
    let page = get("/");
    assert!(
        page.contains("200 OK") && page.contains("belay rounds: repo"),
        "{page}"
    );
    let json = get("/status.json");
    let body = json.split("\r\n\r\n").nth(1).unwrap();
    let v: Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["status"]["status"]["round_num"], 1);
    m.kill().unwrap();
    m.wait().unwrap();
}

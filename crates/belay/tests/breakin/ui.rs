//! Break-in attempts against `belay ui` (finding 6: the log endpoint served
//! any file of a run): the real `belay ui` serving a run directory planted
//! the way a sandbox and belay leave one (its state, lock, git config copy,
//! artifacts), plus links to a host canary and a FIFO. No engine and no
//! browser: the attacker is an HTTP client holding the token.
//!
//! What a user would notice if an attack worked: a response with the run's
//! state, lock, git config copy or an artifact, or with the host canary's
//! text.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use belay_record::{Mode, OpenRun, Redactor, Registry, RunHandle};

const TOKEN: &str = "breakin-ui-token-5c0ffee";

/// `belay ui` on a free port for the registry in `home`, killed when
/// dropped.
struct Ui {
    child: Child,
    base: String,
}

impl Ui {
    fn start(home: &Path) -> Ui {
        Ui::start_with(home, &[])
    }

    /// `belay ui` with `envs` added to its environment.
    fn start_with(home: &Path, envs: &[(&str, &str)]) -> Ui {
        let mut child = Command::new(env!("CARGO_BIN_EXE_belay"))
            .args(["ui", "--port", "0"])
            .env("BELAY_STATE_HOME", home)
            .env("BELAY_UI_TOKEN", TOKEN)
            .env("NO_COLOR", "1")
            .env_remove("OPENAI_API_KEY")
            .env_remove("RUST_LOG")
            .envs(envs.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line.trim().to_string();
        assert!(
            url.starts_with("http://127.0.0.1:"),
            "belay ui printed {url:?}"
        );
        let base = url.split("/?").next().unwrap().to_string();
        Ui { child, base }
    }

    fn port(&self) -> &str {
        self.base.rsplit(':').next().unwrap()
    }

    /// A request with curl (the path as given): the body and the status.
    /// `auth`: send the token as a bearer header.
    fn req(&self, method: &str, path: &str, auth: bool, headers: &[&str]) -> (String, String) {
        let mut c = Command::new("curl");
        c.args([
            "-s",
            "--path-as-is",
            "-w",
            "\n%{http_code}",
            "--max-time",
            "10",
        ])
        .args(["-X", method]);
        if auth {
            let bearer = format!("Authorization: Bearer {TOKEN}");
            c.args(["-H", bearer.as_str()]);
        }
        for h in headers {
            c.args(["-H", *h]);
        }
        let o = c.arg(format!("{}{path}", self.base)).output().unwrap();
        let s = String::from_utf8_lossy(&o.stdout).into_owned();
        let (body, code) = s.rsplit_once('\n').unwrap_or(("", ""));
        (body.to_string(), code.to_string())
    }

    fn get(&self, path: &str) -> (String, String) {
        self.req("GET", path, true, &[])
    }
}

impl Drop for Ui {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A run directory as belay and a sandbox leave one, each file holding a
/// marker of its own; and links and a FIFO planted in it. The run's id and
/// the markers that may never be served.
fn planted_run(tmp: &Path, home: &Path) -> (String, Vec<String>) {
    let id = "ui-breakin-1".to_string();
    let dir = tmp.join("runs").join(&id);
    let run = RunHandle::open(OpenRun {
        dir: dir.clone(),
        id: &id,
        mode: Mode::Agent,
        title: Some("a run with planted files"),
        repo: None,
        redactor: Redactor::default(),
        registry: Registry::at(home),
    })
    .unwrap();
    drop(run);
    let marker = |what: &str| format!("marker-{what}-{}", crate::unique("m"));
    let mut secret = Vec::new();
    let mut plant = |rel: &str, what: &str| {
        let m = marker(what);
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, format!("{m}\n")).unwrap();
        secret.push(m);
    };
    plant("state.json", "state");
    plant("git-config.sandbox", "git-config");
    plant("artifacts/out.txt", "artifact");
    plant("artifacts/out.log", "artifact-log");
    plant("artifacts/logs/deep.log", "artifact-deep");
    // The run's lock holds its writer's pid; it gets a marker too.
    std::fs::write(dir.join(belay_record::LOCK_FILE), "lock-marker\n").unwrap();
    secret.push("lock-marker".to_string());
    // What the page serves.
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    std::fs::write(dir.join("logs/step.log"), "an allowed log line\n").unwrap();
    std::fs::write(dir.join("on-commit.log"), "the hook's log\n").unwrap();
    std::fs::write(dir.join("summary.json"), "{\"ok\":true}\n").unwrap();
    // A host file and a host directory, reached by links from the run.
    let canary = format!("host-canary-ui-{}", crate::unique("c"));
    std::fs::write(tmp.join("canary.txt"), &canary).unwrap();
    std::fs::create_dir_all(tmp.join("hostdir")).unwrap();
    std::fs::write(tmp.join("hostdir/canary.log"), &canary).unwrap();
    let link =
        |target: PathBuf, rel: &str| std::os::unix::fs::symlink(target, dir.join(rel)).unwrap();
    link(tmp.join("canary.txt"), "logs/evil.log");
    link(tmp.join("canary.txt"), "evil.log");
    link(tmp.join("canary.txt"), "report.json");
    link(tmp.join("hostdir"), "logs/host");
    link(tmp.join("hostdir"), "checks");
    secret.push(canary);
    (id, secret)
}

fn refused(code: &str) -> bool {
    code == "400" || code == "404"
}

/// Every file of the run that is no log, every `../` name and every link:
/// refused by the log endpoint (as a piece, a search and a download), no
/// marker and no canary in any answer; the run's logs still served.
#[test]
fn the_log_endpoint_serves_logs_only() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let (id, secret) = planted_run(tmp.path(), &home);
    let ui = Ui::start(&home);
    let never = |what: &str, body: &str| {
        for s in &secret {
            assert!(!body.contains(s.as_str()), "{what} served {s}: {body}");
        }
    };
    let log = |path: &str| format!("/api/runs/{id}/log?path={path}");
    for path in [
        "state.json",
        "run.lock",
        "git-config.sandbox",
        "artifacts/out.txt",
        "artifacts/out.log",
        "artifacts/logs/deep.log",
        "summary.json",
        "../canary.txt",
        "logs/../state.json",
        "logs/../../../canary.txt",
        "./state.json",
        "logs/./step.log",
        "%2Fetc%2Fpasswd",
        "logs/evil.log",
        "evil.log",
        "logs/host/canary.log",
        "checks/canary.log",
        "report.json",
    ] {
        for extra in ["", "&download=1", "&q=marker", "&from=0"] {
            let url = format!("{}{extra}", log(path));
            let (body, code) = ui.get(&url);
            assert!(refused(&code), "{url}: {code} {body}");
            never(&url, &body);
            assert!(!body.contains("root:"), "{url}: {body}");
        }
    }
    // The records have their own route: a named record only, no link.
    for (name, want) in [
        ("run.lock", "400"),
        ("git-config.sandbox", "400"),
        ("..%2Fcanary.txt", "400"),
        ("report.json", "404"),
    ] {
        let (body, code) = ui.get(&format!("/api/runs/{id}/file/{name}"));
        assert_eq!(code, want, "{name}: {body}");
        never(name, &body);
    }
    // A run id that is a path.
    let (body, code) = ui.get("/api/runs/..%2F..%2Fetc/log?path=logs/step.log");
    assert!(refused(&code), "{code} {body}");
    // What is a log is served, and listed; nothing else is listed.
    let (body, code) = ui.get(&log("logs/step.log"));
    assert_eq!(code, "200", "{body}");
    assert!(body.contains("an allowed log line"), "{body}");
    let (body, code) = ui.get(&format!("{}&download=1", log("on-commit.log")));
    assert_eq!(code, "200", "{body}");
    assert!(body.contains("the hook's log"), "{body}");
    let (body, code) = ui.get(&format!("/api/runs/{id}/logs"));
    assert_eq!(code, "200", "{body}");
    assert!(
        body.contains("logs/step.log") && body.contains("on-commit.log"),
        "{body}"
    );
    for no in ["evil.log", "artifacts", "canary", "host"] {
        assert!(!body.contains(no), "the list holds {no}: {body}");
    }
    let (body, code) = ui.get(&format!("/api/runs/{id}/file/summary.json"));
    assert_eq!(code, "200", "{body}");
    // A FIFO planted as a log is refused at once, not waited on (the server
    // still answers afterwards).
    let dir = tmp.path().join("runs").join(&id);
    rustix::fs::mknodat(
        rustix::fs::CWD,
        dir.join("logs/fifo.log"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let t = Instant::now();
    let (body, code) = ui.get(&log("logs/fifo.log"));
    assert!(refused(&code), "{code} {body}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "the FIFO held the request"
    );
    assert_eq!(ui.get(&log("logs/step.log")).1, "200");
}

/// The checks that held before the fix, held still: the token (none, a
/// wrong one, in the query), the `Host` of a DNS rebinding, and the
/// `Origin` and `Sec-Fetch-Site` of a cross-site POST; an action naming a
/// job by a path is refused before anything is read.
#[test]
fn the_dashboards_token_host_and_origin_checks_hold() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let (id, secret) = planted_run(tmp.path(), &home);
    let ui = Ui::start(&home);
    let step = format!("/api/runs/{id}/log?path=logs/step.log");
    for path in ["/", "/api/runs", step.as_str(), "/api/attention"] {
        let (body, code) = ui.req("GET", path, false, &[]);
        assert_eq!(code, "401", "{path} without the token: {body}");
        let (_, code) = ui.req(
            "GET",
            path,
            false,
            &["Authorization: Bearer not-the-token-0000"],
        );
        assert_eq!(code, "401", "{path} with another token");
    }
    let (body, code) = ui.req("GET", &format!("{step}&token={TOKEN}"), false, &[]);
    assert_eq!(code, "200", "{body}");
    let host = format!("Host: evil.example:{}", ui.port());
    let (body, code) = ui.req("GET", &step, true, &[host.as_str()]);
    assert_eq!(code, "421", "a foreign Host: {body}");
    assert!(!body.contains("allowed log line"));
    let act = |id: &str| {
        format!(
            "{{\"target\":\"job\",\"verb\":\"accept\",\"label\":\"x\",\"place\":\"{}\",\"id\":\"{id}\"}}",
            tmp.path().join("queue").display()
        )
    };
    for headers in [
        vec!["Origin: http://evil.example"],
        vec!["Sec-Fetch-Site: cross-site"],
    ] {
        let body = act("j1");
        let mut h = headers.clone();
        h.push("Content-Type: application/json");
        let (text, code) = post(&ui, "/api/act", &body, &h);
        assert_eq!(code, "403", "{headers:?}: {text}");
    }
    // A job named by a path: refused, and nothing made beside the queue.
    let (text, code) = post(
        &ui,
        "/api/act",
        &act("../../x"),
        &["Content-Type: application/json"],
    );
    assert_eq!(code, "400", "{text}");
    assert!(!tmp.path().join("x.lock").exists());
    for s in &secret {
        assert!(!text.contains(s.as_str()));
    }
}

/// What the event stream at `path` sends (with the token) within `secs`: it
/// never ends, curl stops it.
fn sse(ui: &Ui, path: &str, secs: u64) -> String {
    let bearer = format!("Authorization: Bearer {TOKEN}");
    let secs = secs.to_string();
    let o = Command::new("curl")
        .args([
            "-s",
            "-N",
            "--max-time",
            secs.as_str(),
            "-H",
            bearer.as_str(),
        ])
        .arg(format!("{}{path}", ui.base))
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Trust-boundary finding 3, on the dashboard: a run's log, events, state,
/// summary and a commit's patch hold the host proxy's password and the value
/// of a secret-looking host variable, as a sandbox's output could have put
/// them there (the run's own redactor knew neither). `belay ui` runs with
/// both in its environment and redacts what it serves with the host policy:
/// the log (a piece, a download, a search), the event stream, the run and
/// its records show `[REDACTED:…]`, and a search for the password finds
/// nothing. A user would notice the password on the page.
#[test]
fn the_dashboard_serves_no_host_proxy_password_from_a_runs_records() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let pw = format!("bi-proxy-pw-{}", crate::unique("u"));
    let token = format!("bi-api-token-{}", crate::unique("u"));
    let proxy = format!("http://bi-user:{pw}@127.0.0.1:9/");
    let found = format!("BI-FOUND proxy-password {pw}\nBI-FOUND api-token {token}\n");
    let id = "ui-breakin-secrets".to_string();
    let dir = tmp.path().join("runs").join(&id);
    let run = RunHandle::open(OpenRun {
        dir: dir.clone(),
        id: &id,
        mode: Mode::Agent,
        title: Some("a run whose step printed what it found"),
        repo: None,
        redactor: Redactor::default(),
        registry: Registry::at(&home),
    })
    .unwrap();
    run.emit(
        "sandbox",
        Some("step"),
        &serde_json::json!({"kind": "step_output", "data": {"text": found}}),
    )
    .unwrap();
    run.save_state(&serde_json::json!({"last_output": found}))
        .unwrap();
    run.write_json(
        "summary.json",
        &serde_json::json!({"ok": false, "error": found}),
    )
    .unwrap();
    drop(run);
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    std::fs::write(dir.join("logs/step.log"), format!("step started\n{found}")).unwrap();
    let sha = "0123456789abcdef0123456789abcdef01234567";
    std::fs::create_dir_all(dir.join("commits")).unwrap();
    std::fs::write(
        dir.join(format!("commits/{sha}.patch")),
        format!(
            "+++ b/found.txt\n@@ -0,0 +1,2 @@\n+{}",
            found.replace('\n', "\n+")
        ),
    )
    .unwrap();
    // The records hold the values: only the dashboard can redact them.
    for f in [
        "events.jsonl",
        "state.json",
        "summary.json",
        "logs/step.log",
    ] {
        let t = std::fs::read_to_string(dir.join(f)).unwrap();
        assert!(t.contains(&pw) && t.contains(&token), "{f}: {t}");
    }
    let ui = Ui::start_with(
        &home,
        &[
            ("HTTPS_PROXY", proxy.as_str()),
            ("https_proxy", proxy.as_str()),
            ("NO_PROXY", "127.0.0.1,localhost"),
            ("no_proxy", "127.0.0.1,localhost"),
            ("BELAY_BI_API_TOKEN", token.as_str()),
        ],
    );
    let never = |what: &str, body: &str| {
        for secret in [&pw, &token] {
            for n in crate::escaped_forms(secret) {
                assert!(!body.contains(&n), "{what} served {n:?}: {body}");
            }
        }
    };
    let log = format!("/api/runs/{id}/log?path=logs/step.log");
    // What holds the values, each served redacted.
    for path in [
        log.clone(),
        format!("{log}&from=0"),
        format!("{log}&download=1"),
        format!("{log}&q=BI-FOUND"),
        format!("/api/runs/{id}"),
        format!("/api/runs/{id}/file/state.json"),
        format!("/api/runs/{id}/file/summary.json"),
        format!("/api/runs/{id}/commits/{sha}"),
    ] {
        let (body, code) = ui.get(&path);
        assert_eq!(code, "200", "{path}: {body}");
        never(&path, &body);
        assert!(
            body.contains("BI-FOUND") && body.contains("[REDACTED:"),
            "{path} served nothing redacted: {body}"
        );
    }
    // The event stream.
    let events = sse(&ui, &format!("/api/runs/{id}/events"), 3);
    never("the event stream", &events);
    assert!(
        events.contains("BI-FOUND") && events.contains("[REDACTED:"),
        "the event stream sent nothing redacted: {events}"
    );
    // A search for a value finds nothing: lines are matched as redacted.
    for secret in [&pw, &token] {
        let path = format!("{log}&q={secret}");
        let (body, code) = ui.get(&path);
        assert_eq!(code, "200", "{path}: {body}");
        never(&path, &body);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["hits"], serde_json::json!([]), "{path}: {body}");
    }
    // The lists.
    for path in ["/api/runs".to_string(), format!("/api/runs/{id}/logs")] {
        let (body, code) = ui.get(&path);
        assert_eq!(code, "200", "{path}: {body}");
        never(&path, &body);
    }
}

/// A POST with the token and `headers`: the body and the status.
fn post(ui: &Ui, path: &str, body: &str, headers: &[&str]) -> (String, String) {
    let bearer = format!("Authorization: Bearer {TOKEN}");
    let mut c = Command::new("curl");
    c.args([
        "-s",
        "--path-as-is",
        "-w",
        "\n%{http_code}",
        "--max-time",
        "10",
    ])
    .args(["-X", "POST", "-H", bearer.as_str()]);
    for h in headers {
        c.args(["-H", *h]);
    }
    let o = c
        .args(["--data-raw", body])
        .arg(format!("{}{path}", ui.base))
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, code) = s.rsplit_once('\n').unwrap_or(("", ""));
    (body.to_string(), code.to_string())
}

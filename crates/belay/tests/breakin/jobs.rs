//! Break-in attempts against `belay jobs` (finding 5: ids used as paths):
//! the real `belay` binary, real git, a real `belay jobs work` with its HTTP
//! and drop-directory front ends (and chat, when Debian's prosody is
//! installed). The agents run on the host (`placement = "host"`) and no job
//! needs the engine: the attacks are on the queue, not the sandbox.
//!
//! Each attack names a job by a path instead of an id: `/accept ../../x`
//! made `x.lock` outside the queue, `/decline ../../../<repo>/evil` left
//! `evil.lock` in the repository's checkout, and the error reply showed the
//! queue's absolute path. What a user would notice if one worked: a file
//! outside the queue, a lock file in the checkout, a host path in a reply.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::output::{ok, text};

#[path = "../jobs/xmpp.rs"]
#[allow(dead_code)]
mod xmpp;

use xmpp::free_port;

/// The agent: it reads its prompt and answers without a commit block; with
/// `leak FILE`, it answers what it "found" in FILE and asks to commit a
/// change.
const AGENT: &str = r#"#!/bin/sh
cat > /dev/null
case "$1" in
  leak)
    sed 's/^/BI-FOUND /' "$2"
    echo '<h1>found</h1>' > index.html
    printf '===COMMIT-MESSAGE===\nbi: what the agent found\n===END-COMMIT-MESSAGE===\n' ;;
  *) echo nothing to commit ;;
esac
"#;

const TOKEN: &str = "breakin-jobs-token-0123456789abcdef";

/// A queue with one repository (`site`, pushed to a local bare remote) and
/// the config `jobs.toml`.
struct Q {
    tmp: tempfile::TempDir,
    repo: PathBuf,
}

fn queue_ws(extra: &str) -> Q {
    let tmp = tempfile::tempdir().unwrap();
    let (repo, _remote) =
        crate::git_cli::site_with_remote(tmp.path(), &[("index.html", "<h1>hello</h1>\n")]);
    let agent = tmp.path().join("agent.sh");
    crate::common::install_script(&agent, AGENT);
    std::fs::write(
        tmp.path().join("jobs.toml"),
        format!(
            "queue = \"queue\"\nowners = [\"owner@localhost\"]\n[agent]\nspec = \"cmd:{}\"\nplacement = \"host\"\nwall_time_s = 60\n[commit]\nlock_wait_s = 10\n[[repo]]\nname = \"site\"\npath = \"site\"\n{extra}\n",
            agent.display()
        ),
    )
    .unwrap();
    let q = Q { tmp, repo };
    // Any command opens (makes) the queue.
    ok(&q.cmd().arg("list").output().unwrap());
    q
}

impl Q {
    fn path(&self, p: &str) -> PathBuf {
        self.tmp.path().join(p)
    }

    fn queue(&self) -> PathBuf {
        self.path("queue")
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_belay"));
        c.env("BELAY_STATE_HOME", self.path("state"))
            .env("NO_COLOR", "1")
            .env_remove("OPENAI_API_KEY")
            .env_remove("RUST_LOG")
            .arg("jobs")
            .arg("--config")
            .arg(self.path("jobs.toml"))
            .current_dir(self.tmp.path());
        c
    }

    /// `../` as many times as the claims directory is deep, then the
    /// checkout's path and `evil`: from `<queue>/claims`, the checkout's
    /// `evil` (and `evil.lock`).
    fn to_repo(&self) -> String {
        let claims = std::fs::canonicalize(self.queue().join("claims")).unwrap();
        let repo = std::fs::canonicalize(&self.repo).unwrap();
        let up = "../".repeat(claims.components().count() - 1);
        format!(
            "{up}{}/evil",
            repo.to_str().unwrap().trim_start_matches('/')
        )
    }

    /// Host paths no reply may show: the queue, the state dir, the config
    /// (as given and canonical).
    fn host_paths(&self) -> Vec<String> {
        let mut v = Vec::new();
        for p in [self.queue(), self.path("state"), self.path("jobs.toml")] {
            v.push(p.display().to_string());
            if let Ok(c) = std::fs::canonicalize(&p) {
                v.push(c.display().to_string());
            }
        }
        v
    }

    fn assert_no_host_path(&self, what: &str, reply: &str) {
        for p in self.host_paths() {
            assert!(
                !reply.contains(&p),
                "{what} shows the host path {p}: {reply}"
            );
        }
    }

    /// Nothing the attacks named was made: no `x.lock` beside the queue, no
    /// `evil.lock` in the checkout, no `nope/` in the queue, and no lock
    /// file anywhere outside the queue (git's own directories aside).
    fn assert_no_trace(&self) {
        assert!(
            !self.path("x.lock").exists(),
            "x.lock was made outside the queue"
        );
        assert!(!self.path("x").exists());
        assert!(
            !self.repo.join("evil.lock").exists(),
            "evil.lock is in the checkout"
        );
        assert!(!self.repo.join("evil").exists());
        assert!(!self.queue().join("nope").exists());
        let queue = self.queue();
        let state = self.path("state");
        let stray: Vec<PathBuf> = crate::walk(self.tmp.path())
            .into_iter()
            .filter(|p| !p.starts_with(&queue) && !p.starts_with(&state))
            .filter(|p| !p.components().any(|c| c.as_os_str() == ".git"))
            .filter(|p| !p.starts_with(self.path("remote.git")))
            .filter(|p| p.extension().is_some_and(|x| x == "lock"))
            .collect();
        assert!(stray.is_empty(), "lock files outside the queue: {stray:?}");
        // The checkout is as it was.
        assert_eq!(
            crate::git_cli::git(&self.repo, &["status", "--porcelain"]),
            ""
        );
    }

    fn jobs_in(&self, dir: &str) -> Vec<String> {
        crate::job_queue::jobs_in(&self.queue(), dir)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("work.log")).unwrap_or_default()
    }
}

/// One request with curl (the path as given, no `..` squashed): the body
/// and the status code.
fn curl(args: &[&str]) -> (String, String) {
    let o = Command::new("curl")
        .args([
            "-s",
            "--path-as-is",
            "-w",
            "\n%{http_code}",
            "--max-time",
            "10",
        ])
        .args(args)
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, code) = s.rsplit_once('\n').unwrap_or(("", ""));
    (body.to_string(), code.to_string())
}

/// `belay jobs work`, killed when dropped (SIGTERM by [`Work::stop`]).
struct Work(Option<Child>);

impl Work {
    fn start(q: &Q, envs: &[(&str, &str)]) -> Work {
        let log = std::fs::File::create(q.path("work.log")).unwrap();
        let mut c = q.cmd();
        c.env("RUST_LOG", "belay=info,belay_jobs=info")
            .arg("work")
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in envs {
            c.env(k, v);
        }
        Work(Some(c.spawn().unwrap()))
    }

    fn stop(mut self) {
        if let Some(mut c) = self.0.take() {
            rustix::process::kill_process(
                rustix::process::Pid::from_child(&c),
                rustix::process::Signal::TERM,
            )
            .unwrap();
            let t = Instant::now();
            while c.try_wait().unwrap().is_none() {
                if t.elapsed() > Duration::from_secs(30) {
                    let _ = c.kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.wait();
        }
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Wait until the HTTP endpoint answers (`401` without a token).
fn wait_http(q: &Q, base: &str) {
    let t = Instant::now();
    while curl(&[&format!("{base}/jobs")]).1 != "401" {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the endpoint did not come up: {}",
            q.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn http_config(port: u16, trusted: bool) -> String {
    format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\ntoken_env = \"BELAY_BREAKIN_HTTP_TOKEN\"\nname = \"board\"\ntrusted = {trusted}\n"
    )
}

/// The gates of the command line, each given a path instead of an id: no
/// file is made anywhere, exit 2.
fn cli_gates_take_ids_only(q: &Q) {
    let to_repo = q.to_repo();
    for args in [
        vec!["accept", "../../x"],
        vec!["decline", to_repo.as_str()],
        vec!["accept", "../nope/x"],
        vec!["approve", "../../x"],
        vec!["discard", "../../x"],
        vec!["requeue", "../../x"],
        vec!["show", "../../x"],
    ] {
        let o = q.cmd().args(&args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(
            text(&o).contains("is not a valid id"),
            "{args:?}: {}",
            text(&o)
        );
        q.assert_no_trace();
    }
}

/// The gates over HTTP (a trusted token: the gates are open), each given a
/// path instead of an id (`%2F` is decoded into the route's id): `400`, no
/// file made, no host path in any answer.
fn http_gates_take_ids_only(q: &Q, base: &str) {
    let auth = format!("Authorization: Bearer {TOKEN}");
    let enc = |s: &str| s.replace('/', "%2F");
    let to_repo = q.to_repo();
    for (id, verb) in [
        ("../../x", "accept"),
        (to_repo.as_str(), "decline"),
        ("../nope/x", "accept"),
        ("../../x", "approve"),
        ("../../x", "discard"),
    ] {
        let url = format!("{base}/jobs/{}/{verb}", enc(id));
        let (body, code) = curl(&["-X", "POST", "-H", &auth, &url]);
        assert_eq!(code, "400", "{url}: {body}");
        assert!(body.contains("is not a valid id"), "{url}: {body}");
        q.assert_no_host_path(&url, &body);
        q.assert_no_trace();
    }
    let (body, code) = curl(&["-H", &auth, &format!("{base}/jobs/{}", enc("../../x"))]);
    assert_eq!(code, "400", "{body}");
    // An id the queue does not hold: refused, and no lock is left for it.
    let (body, code) = curl(&[
        "-X",
        "POST",
        "-H",
        &auth,
        &format!("{base}/jobs/j-none/accept"),
    ]);
    assert_eq!(code, "422", "{body}");
    q.assert_no_host_path("an unknown id", &body);
    assert!(!q.queue().join("claims/j-none.lock").exists());
    // The queue's listing names no host directory.
    let (body, code) = curl(&["-H", &auth, &format!("{base}/jobs")]);
    assert_eq!(code, "200", "{body}");
    q.assert_no_host_path("GET /jobs", &body);
}

/// Files dropped to make trouble: a job file whose id is a path, names that
/// are no ids, a link to a host canary, a FIFO. Each lands in `failed/` with
/// a reason; the canary is in no file of the queue; a plain request still
/// becomes a job.
fn drop_files_are_taken_as_ids(q: &Q) {
    let drop = q.path("drop");
    let canary = format!("host-canary-drop-{}", crate::unique("c"));
    std::fs::write(q.path("canary.txt"), &canary).unwrap();
    std::fs::write(
        drop.join("req.json"),
        "{\"id\": \"../../x\", \"body\": \"a request whose id is a path\"}",
    )
    .unwrap();
    std::fs::write(drop.join("bad name\n.txt"), "a request with a bad name").unwrap();
    std::fs::write(drop.join("a..b.txt"), "a request named with ..").unwrap();
    std::os::unix::fs::symlink(q.path("canary.txt"), drop.join("link.txt")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        drop.join("fifo.txt"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    std::fs::write(drop.join("ok.txt"), "a fair request").unwrap();
    let t = Instant::now();
    let reasons = |q: &Q| -> Vec<PathBuf> {
        std::fs::read_dir(q.queue().join("failed"))
            .map(|r| r.flatten().map(|e| e.path()).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.extension().is_some_and(|x| x == "reason"))
            .collect()
    };
    loop {
        let left = std::fs::read_dir(&drop).unwrap().count();
        if left == 0 && reasons(q).len() >= 5 && q.jobs_in("pending").len() == 1 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the drop directory was not swept ({left} left, {} reasons, pending {:?}): {}",
            reasons(q).len(),
            q.jobs_in("pending"),
            q.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let reason = |name: &str| {
        std::fs::read_to_string(q.queue().join("failed").join(format!("{name}.reason")))
            .unwrap_or_else(|e| panic!("failed/{name}.reason: {e}"))
    };
    let r = reason("req.json");
    assert!(r.contains("is not a valid id"), "{r}");
    assert!(
        q.queue().join("failed/link.txt").exists(),
        "the link is kept in failed/"
    );
    let r = reason("fifo.txt");
    assert!(r.contains("not a regular file"), "{r}");
    // The two names that are no ids, each taken under a name of belay's.
    let refused: Vec<String> = reasons(q)
        .iter()
        .filter(|p| p.to_string_lossy().ends_with(".refused.reason"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(
        refused.iter().all(|r| r.contains("is not a valid id")),
        "{refused:?}"
    );
    // The plain request is the one job, waiting for the owner.
    let pending = q.jobs_in("pending");
    let job: Value = serde_json::from_str(
        &std::fs::read_to_string(q.queue().join(format!("pending/{}.json", pending[0]))).unwrap(),
    )
    .unwrap();
    assert_eq!(job["body"], "a fair request", "{job}");
    assert_eq!(job["sender"], "drop");
    // The canary reached no file of the queue.
    let found: Vec<PathBuf> = crate::walk(&q.queue())
        .into_iter()
        .filter(|p| {
            std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file())
                && crate::contains_bytes(&std::fs::read(p).unwrap_or_default(), &canary)
        })
        .collect();
    assert!(found.is_empty(), "the canary is in {found:?}");
    q.assert_no_trace();
}

/// A path for an id through the command line, HTTP and the drop directory;
/// the reply never shows a host path. Fails on the code before the fix:
/// `accept ../../x` made `x.lock` beside the queue.
#[test]
fn job_ids_from_the_cli_http_and_drop_dir_are_never_paths() {
    let port = free_port();
    let q = queue_ws(&format!(
        "{}[drop]\ndir = \"drop\"\npoll_ms = 100\n",
        http_config(port, true)
    ));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(q.path("drop"))
        .unwrap();
    std::fs::set_permissions(q.path("drop"), std::fs::Permissions::from_mode(0o700)).unwrap();
    cli_gates_take_ids_only(&q);
    let work = Work::start(&q, &[("BELAY_BREAKIN_HTTP_TOKEN", TOKEN)]);
    let base = format!("http://127.0.0.1:{port}");
    wait_http(&q, &base);
    http_gates_take_ids_only(&q, &base);
    drop_files_are_taken_as_ids(&q);
    work.stop();
    q.assert_no_trace();
}

/// Attacks that held before the fix, held still: an untrusted HTTP token
/// passes no gate, cannot choose the agent, the record's directory or an
/// unconfigured repository, asks as itself whoever it names, and sees only
/// its own jobs; no answer shows a host path (the config's path was in the
/// refusal of an unconfigured repository).
#[test]
fn an_untrusted_http_token_asks_as_itself_and_passes_no_gate() {
    let port = free_port();
    let q = queue_ws(&http_config(port, false));
    // A third party's job, waiting for the owner.
    let o = q
        .cmd()
        .args(["submit", "--sender", "friend@localhost", "please build"])
        .output()
        .unwrap();
    ok(&o);
    let theirs = String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    // A third party cannot choose the agent from the command line either.
    let o = q
        .cmd()
        .args([
            "submit",
            "--sender",
            "friend@localhost",
            "--agent",
            "cmd:/bin/sh",
            "x",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let work = Work::start(&q, &[("BELAY_BREAKIN_HTTP_TOKEN", TOKEN)]);
    let base = format!("http://127.0.0.1:{port}");
    wait_http(&q, &base);
    let auth = format!("Authorization: Bearer {TOKEN}");
    let json = "Content-Type: application/json";
    let (body, code) = curl(&[
        "-X",
        "POST",
        "-H",
        &auth,
        &format!("{base}/jobs/{theirs}/accept"),
    ]);
    assert_eq!(code, "403", "{body}");
    assert_eq!(q.jobs_in("pending"), vec![theirs.clone()]);
    for (req, why) in [
        (r#"{"body":"x","agent":"cmd:/bin/sh"}"#, "choose the agent"),
        (r#"{"body":"x","model":"gpt-5"}"#, "choose the runtime"),
        (
            r#"{"body":"x","on_complete_dir":"/tmp"}"#,
            "where the record goes",
        ),
        (r#"{"body":"x","repos":["/etc"]}"#, "does not list"),
    ] {
        let (body, code) = curl(&["-H", &auth, "-H", json, "-d", req, &format!("{base}/jobs")]);
        assert_eq!(code, "422", "{req}: {body}");
        assert!(body.contains(why), "{req}: {body}");
        q.assert_no_host_path(req, &body);
    }
    let (body, code) = curl(&[
        "-H",
        &auth,
        "-H",
        json,
        "-d",
        r#"{"id":"../../x","body":"x"}"#,
        &format!("{base}/jobs"),
    ]);
    assert_eq!(code, "400", "{body}");
    // It names the owner, and asks as itself all the same.
    let (body, code) = curl(&[
        "-H",
        &auth,
        "-H",
        json,
        "-d",
        r#"{"body":"please","requested_by":"owner@localhost"}"#,
        &format!("{base}/jobs"),
    ]);
    assert_eq!(code, "201", "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["waits_for_approval"], true, "{v}");
    let mine = v["id"].as_str().unwrap().to_string();
    let job: Value = serde_json::from_str(
        &std::fs::read_to_string(q.queue().join(format!("pending/{mine}.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(job["requested_by"], "http:board", "{job}");
    // Its own jobs only, and no host path in the listing.
    let (body, code) = curl(&["-H", &auth, &format!("{base}/jobs")]);
    assert_eq!(code, "200", "{body}");
    assert!(body.contains(&mine) && !body.contains(&theirs), "{body}");
    q.assert_no_host_path("GET /jobs", &body);
    let (body, code) = curl(&["-H", &auth, &format!("{base}/jobs/{theirs}")]);
    assert_eq!(code, "404", "{body}");
    // No token, or another one: nothing.
    assert_eq!(curl(&[&format!("{base}/jobs")]).1, "401");
    let (_, code) = curl(&[
        "-H",
        "Authorization: Bearer not-the-token-0000000000",
        &format!("{base}/jobs/{mine}/accept"),
        "-X",
        "POST",
    ]);
    assert_eq!(code, "401");
    work.stop();
    assert_eq!(q.jobs_in("pending"), {
        let mut v = vec![theirs, mine];
        v.sort();
        v
    });
    q.assert_no_trace();
}

/// The same gates from chat (the owner's own client on a local prosody):
/// each answered "not a valid id", no file made, no host path in the reply.
/// Skipped without prosody.
#[test]
fn chat_gate_ids_are_never_paths() {
    if !Path::new("/usr/bin/prosody").exists() {
        eprintln!("skipped: no prosody (Debian's prosody runs the chat front end's tests)");
        return;
    }
    let tmp_x = tempfile::tempdir().unwrap();
    let server = xmpp::Prosody::start(tmp_x.path(), &["builder", "owner", "friend"]);
    let q = queue_ws(&format!(
        "[xmpp]\njid = \"builder@localhost\"\npassword_env = \"BELAY_TEST_XMPP_PW\"\nserver = \"127.0.0.1:{}\"\ninsecure_plaintext_loopback = true\nallow = [\"friend@localhost\"]\nbatch_window_ms = 500\nchunk_pause_ms = 50\n",
        server.port
    ));
    let work = Work::start(&q, &[("BELAY_TEST_XMPP_PW", xmpp::PASSWORD)]);
    let t = Instant::now();
    while !q.log().contains("online as builder@localhost") {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "belay did not get online: {}",
            q.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let owner = xmpp::Chat::connect("owner", server.port, &q.path("work.log"));
    let to_repo = q.to_repo();
    let attacks = [
        "/accept ../../x".to_string(),
        format!("/decline {to_repo}"),
        "/accept ../nope/x".to_string(),
        "/freigeben ../../x".to_string(),
        "/verwerfen ../../x".to_string(),
    ];
    for (i, a) in attacks.iter().enumerate() {
        owner.send("builder@localhost", a);
        let t = Instant::now();
        while owner.received.lock().unwrap().len() <= i {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "no answer to {a}: {}",
                q.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let reply = owner.received.lock().unwrap()[i].1.clone();
        assert!(reply.contains("is not a valid id"), "{a}: {reply}");
        q.assert_no_host_path(a, &reply);
        q.assert_no_trace();
    }
    // A third party is still refused first, whatever it names.
    let friend = xmpp::Chat::connect("friend", server.port, &q.path("work.log"));
    friend.send("builder@localhost", "/accept ../../x");
    friend.wait_for("Only the owner may use /accept", Duration::from_secs(30));
    work.stop();
    q.assert_no_trace();
}

/// Trust-boundary finding 3, in the job queue: belay runs with the host's
/// proxy (a password in `HTTPS_PROXY`, which nothing uses) and a
/// secret-looking variable in its environment, and the job's agent prints
/// both values (from a host file, as if it had dug them up) in its answer,
/// next to a change it asks to commit. The job is committed; neither value
/// may reach the queue (the run's events, transcript and records, the
/// sender's context, the outbox), the record in its `--on-complete` dir,
/// belay's state home, the history of the checkout or the remote, or the
/// terminal: the record shows `[REDACTED:…]` where a user (or whoever
/// reads the record) would otherwise read the proxy password.
#[test]
fn the_host_proxy_password_stays_out_of_every_job_record() {
    let q = queue_ws("");
    let pw = format!("bi-proxy-pw-{}", crate::unique("j"));
    let token = format!("bi-api-token-{}", crate::unique("j"));
    let proxy = format!("http://bi-user:{pw}@127.0.0.1:9/");
    let env = [
        ("HTTPS_PROXY", proxy.as_str()),
        ("https_proxy", proxy.as_str()),
        ("NO_PROXY", "127.0.0.1,localhost"),
        ("no_proxy", "127.0.0.1,localhost"),
        ("BELAY_BI_API_TOKEN", token.as_str()),
    ];
    // What the agent "finds": a host file outside the queue and the state.
    let found = q.path("found.txt");
    std::fs::write(&found, format!("proxy-password {pw}\napi-token {token}\n")).unwrap();
    let records = q.path("records");
    let submit = q
        .cmd()
        .envs(env)
        .arg("submit")
        .arg("--agent")
        .arg(format!(
            "cmd:{} leak {}",
            q.path("agent.sh").display(),
            found.display()
        ))
        .arg("--on-complete")
        .arg(&records)
        .arg("report what you found on the host")
        .output()
        .unwrap();
    ok(&submit);
    let id = String::from_utf8_lossy(&submit.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let work = q.cmd().envs(env).args(["work", "--once"]).output().unwrap();
    ok(&work);
    let rec: Value = serde_json::from_str(
        &std::fs::read_to_string(records.join(format!("{id}.json")))
            .unwrap_or_else(|e| panic!("the record of {id}: {e}\n{}", text(&work))),
    )
    .unwrap();
    assert_eq!(rec["status"], "committed", "{rec}\n{}", text(&work));
    // The agent ran and answered what it found; the record has it redacted.
    let report = rec["report"].as_str().unwrap_or_default();
    assert!(
        report.contains("BI-FOUND proxy-password") && report.contains("BI-FOUND api-token"),
        "the agent did not print what it found: {rec}"
    );
    assert!(
        report.contains("[REDACTED:"),
        "the job saw no host secret to redact: {rec}"
    );
    let history: String = [q.repo.clone(), q.path("remote.git")]
        .iter()
        .map(|r| crate::git_cli::git(r, &["log", "-p", "--all", "--text"]))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        history.contains("bi: what the agent found"),
        "belay made no commit: {history}"
    );
    let mut dirs = vec![q.queue(), records];
    if q.path("state").exists() {
        dirs.push(q.path("state"));
    }
    for secret in [&pw, &token] {
        for n in crate::escaped_forms(secret) {
            let seen: Vec<PathBuf> = dirs
                .iter()
                .flat_map(|d| crate::replay::files_containing(d, &n))
                .collect();
            assert!(seen.is_empty(), "{n:?} is in {seen:?}");
            assert!(!history.contains(&n), "{n:?} is in git log -p --all");
            for o in [&submit, &work] {
                assert!(!text(o).contains(&n), "{n:?} on the terminal: {}", text(o));
            }
        }
    }
}

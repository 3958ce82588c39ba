//! `belay ui` in a real headless Chromium (chromedriver): a live pipeline
//! run on the replay model, a real env build, a server restart under an open
//! page, an approval clicked on the page, and the server's refusals.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod browser;
#[path = "../shared/git.rs"]
mod git_cli;
#[path = "../shared/pipeline.rs"]
#[allow(dead_code)]
mod pipeline;
#[path = "../shared/replay.rs"]
#[allow(dead_code)]
mod replay;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use belay_record::{Mode, OpenRun, Redactor, Registry, RunHandle};
use browser::{free_port, request, save_png, with_browser, Browser, Proc, Ui};
use serde_json::Value;

const CANARY: &str = "canary-secret-ui-5d1e77b2";

/// The one event of the synthetic runs.
#[derive(serde::Serialize)]
#[serde(tag = "kind", content = "data", rename_all = "snake_case")]
enum Tick {
    Tick {
        n: u32,
    },
    /// The plan loop's trace of an agent call, as it records one.
    AgentTrace {
        action: &'static str,
        checkpoint: &'static str,
        agent: &'static str,
        role: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        prompt: Option<&'static str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        outcome: Option<&'static str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        answer: Option<&'static str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        cost_usd: Option<f64>,
    },
}

/// A run opened the way every engine opens one, in `dir`, in the registry
/// of `home`: its events come from the test.
fn synthetic_run(home: &Path, dir: PathBuf, id: &str, mode: Mode) -> RunHandle {
    RunHandle::open(OpenRun {
        dir,
        id,
        mode,
        title: Some("a synthetic run"),
        repo: None,
        redactor: Redactor::default(),
        registry: Registry::at(home),
    })
    .unwrap()
}

/// Where the docs' screenshots go when `BELAY_UI_SCREENSHOTS` names a
/// directory (`docs/images` when they are renewed).
fn docs_png(name: &str) -> Option<PathBuf> {
    std::env::var_os("BELAY_UI_SCREENSHOTS").map(|d| PathBuf::from(d).join(name))
}

/// Records every badge change of the step graph, as the DOM shows it.
const OBSERVE_BADGES: &str = r#"
window.__badges = {};
const look = () => {
  for (const n of document.querySelectorAll('#graph g.node')) {
    const s = n.dataset.step, b = n.dataset.badge;
    const l = (window.__badges[s] = window.__badges[s] || []);
    if (l[l.length - 1] !== b) l.push(b);
  }
};
new MutationObserver(look).observe(document.getElementById('view'),
  { subtree: true, childList: true, attributes: true, attributeFilter: ['data-badge'] });
look();
return true;
"#;

fn cmd_belay(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_belay"));
    c.env("BELAY_STATE_HOME", home)
        .env("NO_COLOR", "1")
        .env_remove("OPENAI_API_KEY");
    c
}

/// The pipeline demo with a secret given to the test step, and a step that
/// may not see it.
fn secret_pipeline(t: String) -> String {
    t.replace(
        "deps_policy: open",
        "deps_policy: open\nsecrets:\n  api-token: {from: env, key: BELAY_TEST_TOKEN}",
    )
    .replace(
        "  - name: test\n    command: tests/test.sh",
        "  - name: test\n    command: echo \"token=$BELAY_TEST_TOKEN\" && tests/test.sh\n    secrets: [api-token]",
    )
}

struct Pipe {
    _tmp: tempfile::TempDir,
    home: PathBuf,
    repo: PathBuf,
    state: PathBuf,
    _replay: replay::Replay,
}

fn pipe() -> Pipe {
    pipeline::require_engine();
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("ws");
    pipeline::copy_dir(&pipeline::demo().join("repo"), &repo);
    let script = std::fs::read_to_string(pipeline::demo().join("replay.yaml")).unwrap();
    let replay = replay::Replay::start(tmp.path(), &script);
    let p = repo.join("pipeline.yaml");
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace(pipeline::DEMO_URL, &replay.openai_base());
    std::fs::write(&p, secret_pipeline(text)).unwrap();
    git_cli::init_repo(&repo);
    Pipe {
        home: tmp.path().join("home"),
        state: tmp.path().join("state"),
        repo,
        _tmp: tmp,
        _replay: replay,
    }
}

impl Pipe {
    fn start_run(&self, extra: &[&str]) -> Proc {
        let mut c = cmd_belay(&self.home);
        use std::os::unix::process::CommandExt;
        c.process_group(0)
            .arg("run")
            .arg(self.repo.join("pipeline.yaml"))
            .arg("--state-dir")
            .arg(&self.state)
            .args(extra)
            .env("BELAY_TEST_TOKEN", CANARY)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        Proc(c.spawn().unwrap())
    }
}

/// Every response of the server for a run: none may hold the canary.
fn crawl(ui: &Ui, id: &str) -> Vec<(String, String)> {
    let mut got = Vec::new();
    let mut fetch = |p: String| {
        let (code, body) = ui.get(&p);
        assert!(code == 200 || code == 404, "{p}: {code} {body}");
        got.push((p, body));
    };
    for p in [
        "/",
        "/assets/app.js",
        "/assets/app.css",
        "/api/runs",
        "/api/attention",
        "/api/attention?diff=1",
    ] {
        fetch(p.to_string());
    }
    fetch(format!("/api/runs/{id}"));
    fetch(format!("/api/runs/{id}/logs"));
    let detail = ui.json(&format!("/api/runs/{id}"));
    for f in detail["files"].as_array().unwrap() {
        fetch(format!("/api/runs/{id}/file/{}", f.as_str().unwrap()));
    }
    for c in detail["commits"].as_array().unwrap() {
        fetch(format!("/api/runs/{id}/commits/{}", c.as_str().unwrap()));
    }
    let logs = ui.json(&format!("/api/runs/{id}/logs"));
    for l in logs["logs"].as_array().unwrap() {
        let p = l["path"].as_str().unwrap();
        fetch(format!("/api/runs/{id}/log?path={p}&from=0&max=4194304"));
        fetch(format!("/api/runs/{id}/log?path={p}&download=1"));
        fetch(format!("/api/runs/{id}/log?path={p}&q=token"));
    }
    let auth = format!("Bearer {}", ui.token);
    let (_, sse) = request(
        &ui.base,
        "GET",
        &format!("/api/runs/{id}/events"),
        &[("Authorization", &auth)],
        None,
        2,
    );
    got.push(("events".into(), sse));
    got
}

/// A pipeline runs against the replay model while the page is open: each
/// step's badge changes in the DOM in order, the failing gate's retry edge
/// counts 1, its feedback and log are in the step's console, and the commit's
/// diff is on the page. The secret given to a step is in no page and no
/// response.
#[tokio::test(flavor = "multi_thread")]
async fn a_live_pipeline_run_in_the_browser() {
    let p = pipe();
    let ui = Ui::start(&p.home, 0, "tok-live-1", &[]);
    let url = ui.url.clone();
    with_browser("live_pipeline", |b: Browser| async move {
        b.open_list(&url).await;
        let mut run = p.start_run(&[]);
        // The run shows up in the list by itself (the registry is tailed).
        let id = b
            .until(
                "the run in the list",
                60,
                "const r = document.querySelector('#runs tr.run[data-mode=pipeline]'); return r && r.dataset.runId",
            )
            .await;
        let id = id.as_str().unwrap().to_string();
        b.click(&format!("#runs tr.run[data-run-id='{id}'] a")).await;
        b.until("the graph", 20, "return !!document.querySelector('#graph g.node')")
            .await;
        b.js(OBSERVE_BADGES).await;
        b.until(
            "the run's success",
            240,
            "return !!document.querySelector('#graph g.terminal.success.reached')",
        )
        .await;
        let status = run.0.wait().unwrap();
        assert!(status.success(), "the pipeline failed");
        let badges = b.js("return window.__badges").await;
        let seq = |s: &str| -> Vec<String> {
            badges[s]
                .as_array()
                .unwrap_or_else(|| panic!("no badges of {s}: {badges}"))
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .filter(|v| v != "pending")
                .collect()
        };
        assert_eq!(seq("dev"), ["running", "pass", "running", "pass"], "{badges}");
        assert_eq!(seq("test"), ["running", "fail", "running", "pass"], "{badges}");
        assert_eq!(seq("review"), ["running", "pass"], "{badges}");
        assert_eq!(seq("commit"), ["running", "pass"], "{badges}");
        // The retry edge, with its count.
        let edge = b
            .js("const e = document.querySelector('#graph g.edge.retry[data-from=test][data-to=dev]'); return e && [e.dataset.count, e.textContent]")
            .await;
        assert_eq!(edge[0], "1", "{edge}");
        assert!(edge[1].as_str().unwrap().contains("retried ×1"), "{edge}");
        // An edge never taken never reads like one taken.
        let untaken = b
            .js("return [...document.querySelectorAll('#graph g.edge[data-count=\"0\"]')].map(e => e.textContent)")
            .await;
        for t in untaken.as_array().unwrap() {
            let t = t.as_str().unwrap();
            assert!(t.is_empty() || t.contains("not taken"), "an untaken edge reads {t:?}");
        }
        // Every run of a step shows, the failed first attempt too, and no
        // label of a node runs under its verdict pill.
        let dots = b
            .js("return [...document.querySelectorAll('#graph g.node[data-step=test] .run-dot')].map(d => d.dataset.verdict)")
            .await;
        assert_eq!(dots, serde_json::json!(["fail", "pass"]), "the test step's runs");
        let overlaps = b
            .js("const out = []; for (const n of document.querySelectorAll('#graph g.node')) { const p = n.querySelector('rect.pill').getBBox(); for (const t of n.querySelectorAll('text:not(.pill-text)')) { const b = t.getBBox(); if (b.width && b.x < p.x + p.width && b.x + b.width > p.x && b.y < p.y + p.height && b.y + b.height > p.y) out.push(n.dataset.step + ': ' + t.textContent); } } return out")
            .await;
        assert_eq!(overlaps, serde_json::json!([]), "labels under the verdict pill");
        // The time view: a row per step run, in order, each with its time.
        let rows = b
            .js("return [...document.querySelectorAll('#time-view tr.time-row')].map(r => [r.dataset.key, r.dataset.status, r.querySelector('.duration').textContent])")
            .await;
        let keys: Vec<&str> = rows.as_array().unwrap().iter().map(|r| r[0].as_str().unwrap()).collect();
        assert_eq!(keys.len(), 6, "{rows}");
        assert_eq!(keys[1..3], ["test#2", "dev#3"], "{rows}");
        assert!(rows.as_array().unwrap().iter().all(|r| r[2] != "–"), "a step run without its time: {rows}");
        // The failing gate's console: two runs, the feedback, the log.
        b.click("#graph g.node[data-step=test]").await;
        let console = b
            .until(
                "the test step's console",
                10,
                "const c = document.querySelectorAll('#console .step-run'); return c.length === 2 && document.getElementById('console').textContent",
            )
            .await;
        let console = console.as_str().unwrap();
        assert!(console.contains("FAIL: add 2 3 gave -1, expected 5"), "{console}");
        b.until(
            "the failing run's log",
            10,
            "return [...document.querySelectorAll('#console pre.log')].some(p => p.textContent.includes('token=[REDACTED:api-token]'))",
        )
        .await;
        // A search in the failing run's log, typed and clicked on the page.
        b.c.find(fantoccini::Locator::Css(
            "#console .step-run[data-verdict=fail] input.log-search",
        ))
        .await
        .unwrap()
        .send_keys("add 2 3")
        .await
        .unwrap();
        b.click("#console .step-run[data-verdict=fail] .log-search-go").await;
        let hits = b
            .until(
                "the search's hits",
                10,
                "const h = document.querySelectorAll('#console .step-run[data-verdict=fail] .hits .hit'); return h.length && [...h].map(x => x.textContent)",
            )
            .await;
        assert!(hits[0].as_str().unwrap().contains("FAIL: add 2 3 gave -1"), "{hits}");
        // The agents' turns, tokens and cost: per step, and the run's total
        // as the registry has it.
        let agents = b
            .until(
                "the agents",
                10,
                "const a = [...document.querySelectorAll('#agents .agent')]; return a.length === 2 && a.map(x => [x.dataset.step, x.querySelectorAll('.turn').length, x.querySelector('summary').textContent])",
            )
            .await;
        assert_eq!(agents[0][0], "dev", "{agents}");
        assert_eq!(agents[1][0], "review", "{agents}");
        assert!(agents[0][1].as_u64().unwrap() > 2, "{agents}");
        let tokens = ui.json(&format!("/api/runs/{id}"))["tokens"].as_u64().unwrap();
        assert!(tokens > 0);
        b.until(
            "the run's tokens",
            10,
            &format!("return document.getElementById('run-tokens').textContent === '{tokens}'"),
        )
        .await;
        let per_step: u64 = agents
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let t = a[2].as_str().unwrap();
                t.split(" tokens").next().unwrap().rsplit(' ').next().unwrap().parse::<u64>().unwrap()
            })
            .sum();
        assert_eq!(per_step, tokens, "{agents}");
        // The commit's diff.
        let diff = b
            .until(
                "the commit's diff",
                20,
                "const d = document.querySelector('#commits .commit pre.diff'); return d && d.textContent",
            )
            .await;
        let head = git_cli::git(&p.repo, &["rev-parse", "HEAD"]);
        assert!(diff.as_str().unwrap().contains("+  add) echo $(( $2 + $3 ))"), "{diff}");
        assert!(
            b.js(&format!("return !!document.querySelector(\"#commits .commit[data-sha='{head}']\")"))
                .await
                .as_bool()
                .unwrap(),
            "the commit {head} is not on the page"
        );
        // The event list holds every event of the log, once.
        let log = belay_record::events::read_events(&pipeline::latest_run(&p.state).join("events.jsonl")).unwrap();
        b.until(
            "every event",
            10,
            &format!("return document.querySelectorAll('#events tr.event').length === {}", log.len()),
        )
        .await;
        if let Some(png) = docs_png("ui-pipeline.png") {
            b.click("#graph g.node[data-step=test]").await;
            save_png(&b, &png).await;
        }
        // The canary: in no page and no response.
        let html = b.html().await;
        assert!(!html.contains(CANARY), "the page shows the secret");
        for (path, body) in crawl(&ui, &id) {
            assert!(!body.contains(CANARY), "{path} holds the secret");
        }
        b
    })
    .await;
}

/// A command step that prints a line every half second: its log is on the
/// page while the step runs (each line within a second of its write in the
/// container), the step's elapsed time ticks between events, and the time
/// view has the step's row with its duration once it ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_running_steps_log_is_live_on_the_page() {
    pipeline::require_engine();
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let repo = tmp.path().join("ws");
    std::fs::create_dir_all(&repo).unwrap();
    // Each line carries the container's clock (the host's: one kernel).
    std::fs::write(
        repo.join("pipeline.yaml"),
        "name: ticks\nsteps:\n  - name: ticks\n    command: for i in 1 2 3 4 5 6 7 8; do echo \"tick $i at $(date +%s%3N)\"; sleep 0.5; done\n",
    )
    .unwrap();
    git_cli::init_repo(&repo);
    let ui = Ui::start(&home, 0, "tok-live-log", &[]);
    let url = ui.url.clone();
    let state = tmp.path().join("state");
    let mut c = cmd_belay(&home);
    use std::os::unix::process::CommandExt;
    c.process_group(0)
        .arg("run")
        .arg(repo.join("pipeline.yaml"))
        .arg("--state-dir")
        .arg(&state)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut run = Proc(c.spawn().unwrap());
    let got = std::sync::Arc::new(std::sync::Mutex::new(Value::Null));
    let got2 = got.clone();
    with_browser("live_log", |b: Browser| async move {
        b.open_list(&url).await;
        let id = b
            .until(
                "the run in the list",
                60,
                "const r = document.querySelector('#runs tr.run[data-mode=pipeline]'); return r && r.dataset.runId",
            )
            .await;
        b.c.goto(&format!("{url}#/run/{}", id.as_str().unwrap())).await.unwrap();
        // Each tick line as the page first shows it, with the page's clock.
        b.js("window.__ticks = {}; setInterval(() => { for (const p of document.querySelectorAll('#console pre.log')) for (const m of p.textContent.matchAll(/tick (\\d) at (\\d+)/g)) if (!(m[1] in window.__ticks)) window.__ticks[m[1]] = [Number(m[2]), Date.now(), !document.querySelector('#graph g.node[data-step=ticks][data-badge=running]')]; }, 50);").await;
        let e1 = b
            .until("a ticking elapsed time", 60, "const e = document.querySelector('#console .elapsed[data-since]'); return e && e.textContent")
            .await;
        tokio::time::sleep(Duration::from_millis(1600)).await;
        let e2 = b.js("const e = document.querySelector('#console .elapsed[data-since]'); return e && e.textContent").await;
        assert!(e2.is_null() || e1 != e2, "the elapsed time does not tick: {e1} then {e2}");
        b.until("the step's end", 60, "return !!document.querySelector('#graph g.terminal.success.reached')")
            .await;
        let ticks = b.js("return window.__ticks").await;
        let rows = b
            .until("the time view", 10, "const r = [...document.querySelectorAll('#time-view tr.time-row')]; return r.length && r.map(x => [x.dataset.key, x.dataset.status, x.querySelector('.duration').textContent])")
            .await;
        assert_eq!(rows[0][0], "ticks#1", "{rows}");
        assert_eq!(rows[0][1], "pass", "{rows}");
        assert!(rows[0][2].as_str().unwrap().ends_with(" s"), "{rows}");
        *got2.lock().unwrap() = ticks;
        b
    })
    .await;
    let lat = got.lock().unwrap().clone();
    assert!(run.0.wait().unwrap().success());
    let ticks = lat.as_object().unwrap();
    assert!(ticks.len() >= 6, "the page missed lines of the log: {lat}");
    // Seen while the step still ran, not only once it ended.
    let live: Vec<f64> = ticks
        .values()
        .filter(|v| !v[2].as_bool().unwrap())
        .map(|v| v[1].as_f64().unwrap() - v[0].as_f64().unwrap())
        .collect();
    assert!(
        live.len() >= 4,
        "the log was not shown while the step ran: {lat}"
    );
    let mut sorted = live.clone();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "UI-LIVE-LOG write-to-page ms: median {} max {}",
        sorted[sorted.len() / 2],
        sorted[sorted.len() - 1]
    );
    assert!(
        sorted[sorted.len() / 2] <= 1000.0,
        "a line takes more than a second to reach the page: {sorted:?}"
    );
}

/// The modes without a graph (plan, rounds, jobs, agent) have a time view
/// too: a row per step of the run's log, its phases as spans, its duration.
#[tokio::test(flavor = "multi_thread")]
async fn every_other_mode_has_a_time_view() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let modes = [Mode::Plan, Mode::Rounds, Mode::Jobs, Mode::Agent];
    for (i, mode) in modes.iter().enumerate() {
        let id = format!("time-{i}");
        let run = synthetic_run(&home, tmp.path().join("runs").join(&id), &id, *mode);
        for (n, step) in [(0, "c1"), (1, "c1"), (2, "c2"), (3, "c2")] {
            run.emit("engine", Some(step), &Tick::Tick { n }).unwrap();
            std::thread::sleep(Duration::from_millis(120));
        }
        if *mode == Mode::Plan {
            let trace = |action, answer, cost_usd, outcome| Tick::AgentTrace {
                action,
                checkpoint: "c2",
                agent: "codex@m",
                role: "developer",
                prompt: (action == "prompt").then_some("build c2"),
                outcome,
                answer,
                cost_usd,
            };
            run.emit("engine", Some("c2"), &trace("prompt", None, None, None))
                .unwrap();
            run.emit(
                "engine",
                Some("c2"),
                &trace(
                    "finish",
                    Some("first line\nsecond line"),
                    Some(0.25),
                    Some("ok"),
                ),
            )
            .unwrap();
        }
        run.finish(belay_record::RunEnd {
            ok: true,
            duration_s: 0.5,
            tokens: 0,
            cost_usd: 0.0,
            summary: None,
        });
    }
    let ui = Ui::start(&home, 0, "tok-time", &[]);
    let url = ui.url.clone();
    with_browser("time_views", |b: Browser| async move {
        for (i, mode) in modes.iter().enumerate() {
            b.c.goto(&format!("{url}#/run/time-{i}")).await.unwrap();
            let rows = b
                .until(
                    "the time view",
                    20,
                    &format!("return location.hash === '#/run/time-{i}' && [...document.querySelectorAll('#time-view tr.time-row')].map(r => [r.dataset.key, r.querySelectorAll('.span').length, r.querySelector('.duration').textContent])"),
                )
                .await;
            let rows = rows.as_array().unwrap();
            assert_eq!(rows.len(), 2, "{mode:?}: {rows:?}");
            assert_eq!(rows[0][0], "c1");
            assert_eq!(rows[1][0], "c2");
            assert!(rows.iter().all(|r| r[1].as_u64().unwrap() >= 1 && r[2] != "–"), "{rows:?}");
            if *mode == Mode::Plan {
                // The plan loop's agent calls are turns (not "0 turns"), with
                // their cost, and an answer keeps its line breaks.
                let agent = b
                    .until("the plan's agent", 10, "const a = document.querySelector('#agents .agent[data-step=c2]'); return a && [a.querySelector('summary').textContent, a.querySelector('.turn.final .text').innerText]")
                    .await;
                assert!(agent[0].as_str().unwrap().contains("· 2 turns ·"), "{agent}");
                assert!(agent[0].as_str().unwrap().contains("$0.25"), "{agent}");
                assert!(agent[1].as_str().unwrap().contains("first line\nsecond line"), "{agent}");
            }
        }
        b
    })
    .await;
}

/// Ten runs a second finish while the list is open: each shows as finished
/// within a second of its end (the list refreshes under any load), a failed
/// row says why, and the list is searched and paged on the server.
#[tokio::test(flavor = "multi_thread")]
async fn the_list_stays_fresh_under_load_and_is_searched_and_paged() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    for i in 0..150 {
        let id = format!("old-{i:04}");
        let run = synthetic_run(
            &home,
            tmp.path().join("runs").join(&id),
            &id,
            Mode::Pipeline,
        );
        run.finish(belay_record::RunEnd {
            ok: i % 10 != 0,
            duration_s: 1.0,
            summary: (i % 10 == 0).then(|| format!("step test failed: exit 1 in case {i}")),
            ..Default::default()
        });
    }
    let live: Vec<RunHandle> = (0..100)
        .map(|i| {
            let id = format!("fresh-{i:04}");
            synthetic_run(&home, tmp.path().join("runs").join(&id), &id, Mode::Plan)
        })
        .collect();
    let ui = Ui::start(&home, 0, "tok-fresh", &[]);
    let url = ui.url.clone();
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let got2 = got.clone();
    with_browser("fresh_list", |b: Browser| async move {
        b.open_list(&url).await;
        b.until("the page's count", 20, "const p = document.getElementById('page-info'); return p && p.textContent === '1–200 of 250'")
            .await;
        // The page's clock when each fresh run first shows as finished.
        b.js("window.__ok = {}; setInterval(() => { for (const r of document.querySelectorAll('#runs tr.run[data-status=ok]')) { const id = r.dataset.runId; if (id.startsWith('fresh-') && !(id in window.__ok)) window.__ok[id] = Date.now(); } }, 20);")
            .await;
        let mut ended = Vec::new();
        for run in &live {
            run.finish(belay_record::RunEnd { ok: true, duration_s: 0.1, ..Default::default() });
            ended.push((run.id().to_string(), belay_record::unix_millis()));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        b.until("every fresh run finished", 20, "return Object.keys(window.__ok).length === 100").await;
        let seen = b.js("return window.__ok").await;
        let mut lat: Vec<f64> = ended
            .iter()
            .map(|(id, t)| seen[id].as_f64().unwrap() - *t as f64)
            .collect();
        lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
        *got2.lock().unwrap() = lat;
        // A failed row says why.
        let why = b
            .js("const r = document.querySelector(\"#runs tr.run[data-run-id='old-0140'] .why\"); return r && r.textContent")
            .await;
        assert_eq!(why, "step test failed: exit 1 in case 140");
        // Paging: the oldest runs on the second page.
        b.click("#page-older").await;
        b.until("the second page", 10, "const p = document.getElementById('page-info'); return p.textContent === '201–250 of 250' && !!document.querySelector(\"#runs tr.run[data-run-id='old-0000']\")")
            .await;
        // Search, on the server: every word, in ids, titles and outcomes.
        b.c.find(fantoccini::Locator::Css("#filter-q")).await.unwrap().send_keys("exit 1 case").await.unwrap();
        let rows = b
            .until("the search's rows", 10, "const p = document.getElementById('page-info'); return p.textContent.startsWith('1–15 of 15') && [...document.querySelectorAll('#runs tr.run')].map(r => r.dataset.runId)")
            .await;
        assert!(rows.as_array().unwrap().iter().all(|r| r.as_str().unwrap().starts_with("old-")), "{rows}");
        b
    })
    .await;
    let lat = got.lock().unwrap().clone();
    println!(
        "UI-LIST-FRESH 10 runs/s: finished-to-list ms median {} p95 {} max {}",
        lat[lat.len() / 2],
        lat[lat.len() * 95 / 100],
        lat[lat.len() - 1]
    );
    assert!(
        lat[lat.len() - 1] <= 1000.0,
        "a finished run was missing from the list for over a second: {lat:?}"
    );
}

/// A real env build: its block timeline shows every block, each with a
/// duration and its checkpoint tag, and links the written Dockerfile.
#[tokio::test(flavor = "multi_thread")]
async fn an_env_build_timeline_in_the_browser() {
    pipeline::require_engine();
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let repo = tmp.path().join("repo");
    pipeline::copy_dir(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/py-pyproject"),
        &repo,
    );
    let ui = Ui::start(&home, 0, "tok-env-1", &[]);
    let url = format!("{}#/run/ui-env-build", ui.url);
    let state = tmp.path().join("state");
    let mut c = cmd_belay(&home);
    for v in ["OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "BELAY_MODEL"] {
        c.env_remove(v);
    }
    c.args([
        "env",
        "build",
        "--no-cache",
        "--run-id",
        "ui-env-build",
        "--repo",
    ])
    .arg(&repo)
    .arg("--state-dir")
    .arg(&state)
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    let mut child = Proc(c.spawn().unwrap());
    // Open the page once the run is in the registry.
    let t = Instant::now();
    while ui.get("/api/runs/ui-env-build").0 != 200 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the build never started"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    with_browser("env_build", |b: Browser| async move {
        b.c.goto(&url).await.unwrap();
        b.until(
            "the build's end",
            900,
            "return document.querySelector('#run-status .badge') && ['ok','failed'].includes(document.querySelector('#run-status .badge').textContent)",
        )
        .await;
        assert!(child.0.wait().unwrap().success(), "the env build failed");
        let manifest: Value = serde_json::from_str(
            &std::fs::read_to_string(state.join("runs/ui-env-build/manifest.json")).unwrap(),
        )
        .unwrap();
        let planned: Vec<String> = manifest["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["id"].as_str().unwrap().to_string())
            .collect();
        assert!(planned.len() >= 2, "{planned:?}");
        let rows = b
            .until(
                "every block with a duration and a checkpoint",
                20,
                &format!(
                    "const r = [...document.querySelectorAll('#timeline tr.block')]; return r.length === {} && r.every(x => x.dataset.duration && x.dataset.checkpoint) && r.map(x => [x.dataset.block, x.dataset.duration, x.dataset.checkpoint, x.querySelector('td.checkpoint').textContent])",
                    planned.len()
                ),
            )
            .await;
        let rows = rows.as_array().unwrap();
        for (row, id) in rows.iter().zip(&planned) {
            assert_eq!(row[0], id.as_str(), "{rows:?}");
            let d: f64 = row[1].as_str().unwrap().parse().unwrap();
            assert!(d > 0.0, "{row}");
            let cp = manifest["checkpoints"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["block_id"] == id.as_str())
                .unwrap_or_else(|| panic!("no checkpoint of {id} in the manifest"));
            assert_eq!(row[2], cp["image_ref"], "{row}");
            assert!(row[3].as_str().unwrap().contains(cp["image_ref"].as_str().unwrap()));
        }
        let href = b
            .until("the Dockerfile link", 10, "const a = document.getElementById('dockerfile-link'); return a && a.getAttribute('href')")
            .await;
        assert_eq!(href, "/api/runs/ui-env-build/file/Dockerfile?token=tok-env-1");
        if let Some(png) = docs_png("ui-env-build.png") {
            save_png(&b, &png).await;
        }
        b
    })
    .await;
    let (code, dockerfile) = ui.get("/api/runs/ui-env-build/file/Dockerfile");
    assert_eq!(code, 200);
    assert!(dockerfile.contains("FROM "), "{dockerfile}");
}

/// A run another process writes, and a server restarted under the open
/// page: the browser reconnects with Last-Event-ID, and the page shows every
/// event of the log exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_server_loses_and_repeats_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let run = synthetic_run(
        &home,
        tmp.path().join("runs/resume-1"),
        "resume-1",
        Mode::Agent,
    );
    for n in 0..15 {
        run.emit("engine", None, &Tick::Tick { n }).unwrap();
    }
    let port = free_port();
    let ui = Ui::start(&home, port, "tok-restart-1", &[]);
    let url = format!("{}#/run/resume-1", ui.url);
    let list_url = format!("{}#/", ui.url);
    let writer = std::sync::Arc::new(run);
    with_browser("restart", |b: Browser| async move {
        b.c.goto(&url).await.unwrap();
        b.until("15 events", 20, "return document.querySelectorAll('#events tr.event').length === 15")
            .await;
        // Stop the server; the run goes on writing.
        drop(ui);
        for n in 15..30 {
            writer.emit("engine", None, &Tick::Tick { n }).unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        b.until("the page to see the server gone", 10, "return document.getElementById('conn').dataset.state === 'reconnecting'")
            .await;
        let ui = Ui::start(&home, port, "tok-restart-1", &[]);
        for n in 30..40 {
            writer.emit("engine", None, &Tick::Tick { n }).unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        b.until("40 events", 30, "return document.querySelectorAll('#events tr.event').length === 40")
            .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let dom: Vec<u64> = b
            .js("return [...document.querySelectorAll('#events tr.event')].map(r => Number(r.dataset.seq))")
            .await
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let log: Vec<u64> = belay_record::events::read_events(&tmp.path().join("runs/resume-1/events.jsonl"))
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(dom, log, "the page and the event log differ");
        let stats = b.js("return [window.__belay.dupes, window.__belay.gaps || 0]").await;
        assert_eq!(stats, serde_json::json!([0, 0]), "the server sent an event twice or skipped one");
        b.until("the page live again", 20, "return document.getElementById('conn').dataset.state === 'live'")
            .await;
        // The list page follows the server too (it said "live" after the
        // server had died).
        b.c.goto(&list_url).await.unwrap();
        b.until("the list live", 20, "return document.getElementById('conn').dataset.state === 'live'")
            .await;
        drop(ui);
        b.until("the list to see the server gone", 10, "return document.getElementById('conn').dataset.state === 'reconnecting'")
            .await;
        b
    })
    .await;
}

/// A job that waits for the owner's start approval, accepted from the page,
/// is where `belay jobs accept` puts it; one declined from the page is
/// declined as `belay jobs decline` does.
#[tokio::test(flavor = "multi_thread")]
async fn an_approval_clicked_on_the_page() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let site = tmp.path().join("site");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("README.md"), "# site\n").unwrap();
    git_cli::init_repo(&site);
    let queue = tmp.path().join("queue");
    let cfg = tmp.path().join("jobs.toml");
    std::fs::write(
        &cfg,
        format!(
            "queue = \"{}\"\nowners = [\"owner@localhost\"]\n[agent]\nspec = \"cmd:/bin/true\"\nplacement = \"host\"\n[[repo]]\nname = \"site\"\npath = \"{}\"\n",
            queue.display(),
            site.display()
        ),
    )
    .unwrap();
    let submit = |body: &str| -> String {
        let o = cmd_belay(&home)
            .args(["jobs", "--config"])
            .arg(&cfg)
            .args(["submit", "--sender", "friend@localhost", body])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    let yes = submit("please fix the title");
    let no = submit("please delete everything");
    assert!(queue.join("pending").join(format!("{yes}.json")).exists());
    let ui = Ui::start(
        &home,
        0,
        "tok-approve-1",
        &["--jobs-config", cfg.to_str().unwrap()],
    );
    let url = format!("{}#/attention", ui.url);
    let queue2 = queue.clone();
    let (yes2, no2) = (yes.clone(), no.clone());
    with_browser("approval", |b: Browser| async move {
        let (yes, no) = (yes2, no2);
        b.c.goto(&url).await.unwrap();
        b.until(
            "both waiting jobs",
            20,
            &format!("return !!document.querySelector(\".card[data-id='{yes}']\") && !!document.querySelector(\".card[data-id='{no}']\")"),
        )
        .await;
        b.click(&format!(".card[data-id='{yes}'] button[data-verb=accept]")).await;
        b.until("the accept's answer", 20, &format!("return !document.querySelector(\".card[data-id='{yes}']\")"))
            .await;
        assert!(!queue2.join("pending").join(format!("{yes}.json")).exists());
        assert!(queue2.join("inbox").join(format!("{yes}.json")).exists(), "accepted is in the inbox");
        let job: Value = serde_json::from_str(
            &std::fs::read_to_string(queue2.join("inbox").join(format!("{yes}.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(job["belay"]["accepted_by"], "local");
        b.click(&format!(".card[data-id='{no}'] button[data-verb=decline]")).await;
        b.until("the decline's answer", 20, &format!("return !document.querySelector(\".card[data-id='{no}']\")"))
            .await;
        let rec: Value = serde_json::from_str(
            &std::fs::read_to_string(queue2.join("done").join(format!("{no}.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(rec["status"], "declined");
        b
    })
    .await;
    // An action on something that does not wait is refused.
    let auth = format!("Bearer {}", ui.token);
    let body = format!(
        "{{\"target\":\"job\",\"verb\":\"accept\",\"label\":\"x\",\"place\":\"{}\",\"id\":\"{yes}\"}}",
        queue.display()
    );
    let (code, text) = request(
        &ui.base,
        "POST",
        "/api/act",
        &[("Authorization", &auth)],
        Some(&body),
        10,
    );
    assert_eq!(code, 400, "{text}");
}

/// No token: 401, for the page, the API and the stream. A POST from another
/// origin, or a request to another host name (DNS rebinding): refused. A
/// path out of the run: refused. `--viz` on a busy port takes another.
#[tokio::test(flavor = "multi_thread")]
async fn the_server_refuses_what_it_must() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let run = synthetic_run(&home, tmp.path().join("runs/sec-1"), "sec-1", Mode::Agent);
    std::fs::create_dir_all(tmp.path().join("runs/sec-1/logs")).unwrap();
    std::fs::write(tmp.path().join("secret.txt"), "outside").unwrap();
    std::os::unix::fs::symlink(
        tmp.path().join("secret.txt"),
        tmp.path().join("runs/sec-1/logs/link.log"),
    )
    .unwrap();
    drop(run);
    let ui = Ui::start(&home, 0, "tok-sec-1", &[]);
    for p in [
        "/",
        "/assets/app.js",
        "/api/runs",
        "/api/runs/sec-1/events",
        "/api/attention",
        "/?token=wrong",
    ] {
        let (code, _) = request(&ui.base, "GET", p, &[], None, 5);
        assert_eq!(code, 401, "{p} without the token");
    }
    let auth = format!("Bearer {}", ui.token);
    let (code, _) = request(
        &ui.base,
        "GET",
        "/api/runs",
        &[("Authorization", &auth)],
        None,
        5,
    );
    assert_eq!(code, 200);
    // The tokened URL serves the page, its assets named with the token, and
    // sets no cookie (a cookie of 127.0.0.1 would go to every port of it).
    let (code, head, page) = browser::exchange(
        &ui.base,
        "GET",
        &format!("/?token={}", ui.token),
        &[],
        None,
        5,
    );
    assert_eq!(code, 200);
    assert!(
        page.contains(&format!("/assets/app.js?token={}", ui.token)),
        "{page}"
    );
    let head = head.to_ascii_lowercase();
    assert!(!head.contains("set-cookie"), "{head}");
    for h in [
        "content-security-policy",
        "x-content-type-options: nosniff",
        "referrer-policy: no-referrer",
    ] {
        assert!(head.contains(h), "no {h}: {head}");
    }
    let body =
        "{\"target\":\"job\",\"verb\":\"accept\",\"label\":\"x\",\"place\":\"/tmp\",\"id\":\"x\"}";
    let (code, text) = request(
        &ui.base,
        "POST",
        "/api/act",
        &[("Authorization", &auth), ("Origin", "http://evil.example")],
        Some(body),
        5,
    );
    assert_eq!(code, 403, "{text}");
    let (code, _) = request(
        &ui.base,
        "POST",
        "/api/act",
        &[("Authorization", &auth), ("Sec-Fetch-Site", "cross-site")],
        Some(body),
        5,
    );
    assert_eq!(code, 403);
    // A registry record that names a directory which is no run's is not read.
    let mut reg = std::fs::OpenOptions::new()
        .append(true)
        .open(home.join("runs.jsonl"))
        .unwrap();
    std::io::Write::write_all(
        &mut reg,
        b"\n{\"op\":\"start\",\"run_id\":\"root\",\"mode\":\"agent\",\"dir\":\"/\",\"at\":\"2026-12-02T00:00:00.000Z\",\"owner\":null}",
    )
    .unwrap();
    for p in [
        "/api/runs/root/log?path=logs/x.log",
        "/api/runs/root/file/state.json",
        "/api/runs/root",
    ] {
        let (code, text) = request(&ui.base, "GET", p, &[("Authorization", &auth)], None, 5);
        assert_eq!(code, 404, "{p}: {text}");
    }
    let port = ui.base.rsplit(':').next().unwrap();
    let (code, _) = request(
        &ui.base,
        "GET",
        "/api/runs",
        &[
            ("Authorization", &auth),
            ("Host", &format!("evil.example:{port}")),
        ],
        None,
        5,
    );
    assert_eq!(code, 421, "a foreign Host is refused");
    for p in [
        "/api/runs/sec-1/log?path=logs/link.log",
        "/api/runs/sec-1/log?path=logs/../../../secret.txt",
        "/api/runs/sec-1/log?path=/etc/passwd",
    ] {
        let (code, text) = request(&ui.base, "GET", p, &[("Authorization", &auth)], None, 5);
        assert!(code == 404 || code == 400, "{p}: {code}");
        assert!(
            !text.contains("outside") && !text.contains("root:"),
            "{p}: {text}"
        );
    }
    // A non-loopback bind needs the explicit flag.
    let o = cmd_belay(&home)
        .args(["ui", "--bind", "0.0.0.0", "--port", "0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--allow-remote"));

    // `--viz` on a busy port takes a free one, and serves the run.
    let p = pipe();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_port = busy.local_addr().unwrap().port();
    let mut run = p.start_run(&["--viz", "--viz-port", &busy_port.to_string()]);
    let mut err = std::io::BufReader::new(run.0.stderr.take().unwrap());
    let mut line = String::new();
    let t = Instant::now();
    let viz = loop {
        line.clear();
        std::io::BufRead::read_line(&mut err, &mut line).unwrap();
        if let Some(i) = line.find("http://") {
            break line[i..].trim().to_string();
        }
        assert!(t.elapsed() < Duration::from_secs(60), "no live view URL");
    };
    let base = viz.split("/?").next().unwrap().to_string();
    assert!(!base.ends_with(&format!(":{busy_port}")), "{viz}");
    let id = viz.split("#/run/").nth(1).unwrap().to_string();
    let token = viz
        .split("token=")
        .nth(1)
        .unwrap()
        .split('#')
        .next()
        .unwrap();
    let (code, body) = request(
        &base,
        "GET",
        &format!("/api/runs/{id}"),
        &[("Authorization", &format!("Bearer {token}"))],
        None,
        10,
    );
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"mode\":\"pipeline\""), "{body}");
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    assert!(run.0.wait().unwrap().success());
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// The figures of docs/benchmarks.md (`bench/ui/run.sh` runs this against a
/// release binary): an event's append to the DOM, the server's RSS idle and
/// with 1,000 runs, the first load of a 1,000-run list, the assets' size.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark: bench/ui/run.sh"]
async fn bench_figures() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let empty = Ui::start(&home, 0, "tok-bench-0", &[]);
    let _ = empty.get("/api/runs");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_idle = empty.rss();
    drop(empty);
    for i in 0..1000 {
        let id = format!("bench-{i:04}");
        let mode = [Mode::Env, Mode::Pipeline, Mode::Plan, Mode::Jobs][i % 4];
        let run = synthetic_run(&home, tmp.path().join("runs").join(&id), &id, mode);
        run.emit("engine", None, &Tick::Tick { n: 0 }).unwrap();
        run.finish(belay_record::RunEnd {
            ok: i % 7 != 0,
            duration_s: 3.0,
            tokens: 1000,
            cost_usd: 0.01,
            summary: None,
        });
    }
    let live = synthetic_run(
        &home,
        tmp.path().join("runs/bench-live"),
        "bench-live",
        Mode::Agent,
    );
    let ui = Ui::start(&home, 0, "tok-bench-1", &[]);
    let url = ui.url.clone();
    let (first, loads, lat, rss_runs) = {
        let b = Browser::start().await;
        let first = b.open_list(&url).await;
        let mut loads = Vec::new();
        for _ in 0..5 {
            loads.push(b.open_list(&url).await);
        }
        b.until(
            "the whole list",
            30,
            "const p = document.getElementById('page-info'); return p && p.dataset.total === '1001' && document.querySelectorAll('#runs tr.run').length === 200",
        )
        .await;
        b.c.goto(&format!("{url}#/run/bench-live")).await.unwrap();
        b.until(
            "the run",
            20,
            "return document.getElementById('events') !== null",
        )
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut appended = Vec::new();
        for n in 0..100 {
            let t = belay_record::unix_millis();
            let seq = live.emit("engine", None, &Tick::Tick { n }).unwrap();
            appended.push((seq, t));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        b.until(
            "the last event",
            20,
            "return document.querySelectorAll('#events tr.event').length === 100",
        )
        .await;
        let seen = b.js("return window.__belay.seen").await;
        let lat: Vec<f64> = appended
            .iter()
            .map(|(seq, t)| seen[seq.to_string()].as_f64().unwrap() - *t as f64)
            .collect();
        let rss_runs = ui.rss();
        let _ = b.c.close().await;
        (first, loads, lat, rss_runs)
    };
    let mut lat = lat;
    let mut sorted = lat.clone();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let p95 = sorted[sorted.len() * 95 / 100];
    let mut loads = loads;
    let figures = serde_json::json!({
        "event_to_dom_ms_median": median(&mut lat),
        "event_to_dom_ms_p95": p95,
        "rss_idle_empty_mib": rss_idle as f64 / 1048576.0,
        "rss_1000_runs_mib": rss_runs as f64 / 1048576.0,
        "first_load_1000_runs_ms": first,
        "reload_1000_runs_ms_median": median(&mut loads),
        "embedded_assets_bytes": belay_ui::embedded_size(),
    });
    println!("UI-BENCH {figures}");
}

/// The demo: its recorded pipeline run and env build replay into a fresh
/// registry with their recorded timing, show as running while they replay,
/// and end as recorded.
#[tokio::test(flavor = "multi_thread")]
async fn the_demo_replays_its_recordings() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/ui-demo");
    let ui = Ui::start(&home, 0, "tok-demo-1", &[]);
    let mut replay = Command::new("python3")
        .arg(demo.join("replay.py"))
        .arg(&home)
        .arg(demo.join("recorded/pipeline"))
        .arg(demo.join("recorded/env-build"))
        .args(["--speed", "20"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let mut seen_running = false;
    while replay.try_wait().unwrap().is_none() {
        let runs = ui.json("/api/runs");
        seen_running |= runs["runs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["status"] == "running");
        assert!(t.elapsed() < Duration::from_secs(120), "the replay hangs");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen_running, "a replayed run never showed as running");
    for (id, dir) in [
        ("demo-pipeline-calc-fix", "pipeline"),
        ("demo-env-build", "env-build"),
    ] {
        let d = ui.json(&format!("/api/runs/{id}"));
        assert_eq!(d["status"], "ok", "{d}");
        let recorded =
            std::fs::read_to_string(demo.join("recorded").join(dir).join("events.jsonl"))
                .unwrap()
                .lines()
                .count();
        let replayed =
            belay_record::events::read_events(&home.join("runs").join(id).join("events.jsonl"))
                .unwrap()
                .len();
        assert_eq!(replayed, recorded, "{id}");
    }
    // The recorded timing, kept at 20 times the speed: each phase's
    // duration ends inside its block (a phase is never drawn before its
    // block), and the build takes its recorded 41.7 s / 20.
    let evs: Vec<Value> = std::fs::read_to_string(home.join("runs/demo-env-build/events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ms = |e: &Value| {
        e["at"]
            .as_str()
            .unwrap()
            .parse::<jiff::Timestamp>()
            .unwrap()
            .as_millisecond() as f64
    };
    let mut starts = std::collections::HashMap::new();
    let mut phases = 0;
    for e in &evs {
        let step = e["step"].as_str().unwrap_or("").to_string();
        if e["kind"] == "block_started" {
            starts.insert(step.clone(), ms(e));
        }
        if ["command", "validation", "repair"].contains(&e["kind"].as_str().unwrap()) {
            if let (Some(s), Some(d)) = (starts.get(&step), e["data"]["duration_s"].as_f64()) {
                phases += 1;
                assert!(
                    ms(e) - d * 1000.0 >= s - 60.0,
                    "a phase of {step} begins before its block: {e}"
                );
            }
        }
    }
    assert!(phases >= 3, "{phases} phases");
    let span = (ms(evs.last().unwrap()) - ms(&evs[0])) / 1000.0;
    assert!(
        (1.7..=4.5).contains(&span),
        "the replay took {span} s, not 41.7 s / 20"
    );
    let d = ui.json("/api/runs/demo-pipeline-calc-fix");
    assert_eq!(d["commits"].as_array().unwrap().len(), 1, "{d}");
    let d = ui.json("/api/runs/demo-env-build");
    assert!(
        d["files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == "Dockerfile"),
        "{d}"
    );
}

/// The scripted agent of the commit-approval test: it writes the page and
/// gives belay's commit block.
const PAGE_AGENT: &str = "#!/bin/sh\ncat > /dev/null\nprintf '<h1>approved</h1>\\n' > index.html\nprintf '===COMMIT-MESSAGE===\\nfix: the title\\n===END-COMMIT-MESSAGE===\\n'\n";

/// A job whose change waits for the commit approval (`held/`): the page shows
/// every path of it and its patch, links to the job's run, and Approve clicked on the page commits and pushes it,
/// as `belay jobs approve` does.
#[tokio::test(flavor = "multi_thread")]
async fn a_commit_approval_clicked_on_the_page() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let (site, remote) =
        git_cli::site_with_remote(tmp.path(), &[("index.html", "<h1>hello</h1>\n")]);
    let agent = tmp.path().join("agent.sh");
    std::fs::write(&agent, PAGE_AGENT).unwrap();
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let queue = tmp.path().join("queue");
    let cfg = tmp.path().join("jobs.toml");
    std::fs::write(
        &cfg,
        format!(
            "queue = \"{}\"\nowners = [\"owner@localhost\"]\n[agent]\nspec = \"cmd:{}\"\nplacement = \"host\"\nwall_time_s = 60\n[[repo]]\nname = \"site\"\npath = \"{}\"\ncommit_approval = true\n",
            queue.display(),
            agent.display(),
            site.display()
        ),
    )
    .unwrap();
    let jobs = |args: &[&str]| {
        let o = cmd_belay(&home)
            .current_dir(tmp.path())
            .args(["jobs", "--config"])
            .arg(&cfg)
            .args(args)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let id = jobs(&["submit", "fix the title"])
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    jobs(&["work", "--once"]);
    assert!(
        queue.join("held").join(format!("{id}.json")).exists(),
        "the change is not held"
    );
    let pushed = || git_cli::git(&remote, &["log", "--format=%s", "main"]);
    assert_eq!(pushed(), "initial", "held: nothing is pushed yet");
    let ui = Ui::start(
        &home,
        0,
        "tok-held-1",
        &["--jobs-config", cfg.to_str().unwrap()],
    );
    let url = format!("{}#/attention", ui.url);
    let id2 = id.clone();
    with_browser("commit_approval", |b: Browser| async move {
        let id = id2;
        b.c.goto(&url).await.unwrap();
        let card = b
            .until(
                "the held change",
                20,
                &format!("const c = document.querySelector(\".card[data-kind=job_commit][data-id='{id}']\"); return c && c.textContent"),
            )
            .await;
        assert!(card.as_str().unwrap().contains("index.html"), "the held paths are not shown: {card}");
        // The patch itself, before anything is committed, and the card's
        // link to the job's run.
        let diff = b
            .until(
                "the held patch",
                10,
                &format!("const d = document.querySelector(\".card[data-id='{id}'] .held-diff pre.diff\"); return d && [d.querySelector('.del') && d.querySelector('.del').textContent, d.querySelector('.add') && d.querySelector('.add').textContent, document.querySelector(\".card[data-id='{id}'] a\").getAttribute('href')]"),
            )
            .await;
        assert_eq!(
            diff,
            serde_json::json!(["-<h1>hello</h1>", "+<h1>approved</h1>", format!("#/run/{id}")]),
            "the card does not show the held change's patch and its run"
        );
        b.click(&format!(".card[data-id='{id}'] button[data-verb=approve]")).await;
        b.until(
            "the approval's answer",
            60,
            &format!("return !document.querySelector(\".card[data-id='{id}']\")"),
        )
        .await;
        b
    })
    .await;
    assert_eq!(
        pushed().lines().next(),
        Some("fix: the title"),
        "the approved change is not pushed"
    );
    assert!(!queue.join("held").join(format!("{id}.json")).exists());
    let rec: Value = serde_json::from_str(
        &std::fs::read_to_string(queue.join("done").join(format!("{id}.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(rec["status"], "committed", "{rec}");
}

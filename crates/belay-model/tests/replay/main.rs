//! Our model clients against the scripted replay server, over real HTTP:
//! every dialect streamed and not, tool calls, retries (429 with Retry-After,
//! a dropped stream, a stalled stream), content matching, the request log, and
//! usage accounting; Gemini's own paths and shapes; and the real Gemini CLI
//! against it, when installed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use belay_model::replay::{parse_script, read_log, ReplayServer};
use belay_model::{
    Api, ClientConfig, Message, ModelClient, ModelError, PriceTable, Request, Secret, ToolSpec,
    UsageLedger,
};

async fn server(script: &str, dir: &std::path::Path) -> ReplayServer {
    let s = parse_script(script, "test script").unwrap();
    ReplayServer::start(
        s,
        "127.0.0.1:0".parse().unwrap(),
        Some(dir.join("requests.jsonl")),
    )
    .await
    .unwrap()
}

fn client(srv: &ReplayServer, api: Api, stream: bool, dir: &std::path::Path) -> ModelClient {
    let base = match api {
        Api::Anthropic | Api::Gemini => srv.url(),
        Api::Responses | Api::ChatCompletions => srv.openai_base(),
    };
    let mut cfg = ClientConfig::new(api, &base, "test-model");
    cfg.stream = stream;
    cfg.retries = 2;
    cfg.retry_delay = Duration::from_millis(50);
    cfg.idle_timeout = Duration::from_secs(5);
    cfg.key = Some(Secret::new("sk-canary-never-logged-0123456789"));
    let ledger = Arc::new(UsageLedger::new(
        Some(dir.join("llm-usage.json")),
        api,
        "test-model",
        &base,
        &PriceTable::builtin(),
    ));
    ModelClient::new(cfg, ledger).unwrap()
}

fn tool_request() -> Request {
    Request {
        instructions: Some("be brief".into()),
        messages: vec![Message::user("list the files")],
        tools: vec![ToolSpec {
            name: "terminal".into(),
            description: "run".into(),
            parameters: serde_json::json!({"type": "object", "properties": {"command": {"type": "string"}}}),
        }],
        ..Default::default()
    }
}

const TWO_TURNS: &str = r#"
turns:
  - name: call
    reply:
      text: "Let me look."
      tool_calls:
        - {name: terminal, arguments: {command: "ls -la"}}
    usage: {input_tokens: 120, cached_tokens: 20, output_tokens: 30, reasoning_tokens: 5}
  - name: answer
    match: {contains: "README.md"}
    reply: {text: "There is a README.md — ünïcode survives chunking."}
"#;

/// Every dialect, streamed and whole: a tool call, its result sent back (in the
/// dialect's own shape), and the final text; usage lands in the ledger file.
#[tokio::test]
async fn every_dialect_streamed_and_whole() {
    for api in [
        Api::Responses,
        Api::ChatCompletions,
        Api::Anthropic,
        Api::Gemini,
    ] {
        for stream in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let srv = server(TWO_TURNS, dir.path()).await;
            let c = client(&srv, api, stream, dir.path());
            let mut req = tool_request();
            let r1 = c.complete(&req, "test").await.unwrap();
            assert_eq!(r1.text, "Let me look.", "{api} stream={stream}");
            assert_eq!(r1.tool_calls.len(), 1);
            assert_eq!(r1.tool_calls[0].name, "terminal");
            let args: serde_json::Value =
                serde_json::from_str(&r1.tool_calls[0].arguments).unwrap();
            assert_eq!(args["command"], "ls -la");
            assert_eq!(r1.usage.output_tokens, 30, "{api} stream={stream}");
            assert_eq!(r1.usage.cached_tokens, 20, "{api} stream={stream}");
            req.messages.push(Message::Assistant {
                content: r1.text.clone(),
                tool_calls: r1.tool_calls.clone(),
            });
            req.messages.push(Message::Tool {
                call_id: r1.tool_calls[0].id.clone(),
                name: "terminal".into(),
                content: "README.md\nsrc".into(),
            });
            let r2 = c.complete(&req, "test").await.unwrap();
            assert_eq!(
                r2.text, "There is a README.md — ünïcode survives chunking.",
                "{api} stream={stream}"
            );
            assert!(r2.tool_calls.is_empty());

            let log = read_log(&dir.path().join("requests.jsonl")).unwrap();
            assert_eq!(log.len(), 2);
            assert_eq!(log[0].api, Some(api));
            assert_eq!(log[0].stream, stream);
            assert_eq!(log[1].turn_name.as_deref(), Some("answer"));
            // The tool result went back as the dialect's own item.
            let body = log[1].body.to_string();
            let marker = match api {
                Api::Responses => "function_call_output",
                Api::ChatCompletions => "\"role\":\"tool\"",
                Api::Anthropic => "tool_result",
                Api::Gemini => "functionResponse",
            };
            assert!(body.contains(marker), "{api}: {body}");
            let text = std::fs::read_to_string(dir.path().join("requests.jsonl")).unwrap();
            assert!(
                !text.contains("sk-canary"),
                "the key reached the request log"
            );

            let usage: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.path().join("llm-usage.json")).unwrap())
                    .unwrap();
            assert_eq!(usage["requests"], 2);
            assert_eq!(usage["retries"], 0);
            assert!(usage["input_tokens"].as_u64().unwrap() >= 120);
            assert!(!usage.to_string().contains("sk-canary"));
        }
    }
}

/// 429 with Retry-After: the client waits what the server says, then succeeds.
#[tokio::test]
async fn retry_after_429_is_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(
        "turns:\n  - error: {status: 429, retry_after: 0.6, message: slow down}\n  - reply: {text: ok}\n",
        dir.path(),
    )
    .await;
    let c = client(&srv, Api::ChatCompletions, true, dir.path());
    let t0 = Instant::now();
    let r = c.complete(&tool_request(), "test").await.unwrap();
    assert_eq!(r.text, "ok");
    assert!(
        t0.elapsed() >= Duration::from_millis(600),
        "{:?}",
        t0.elapsed()
    );
    let rep = c.ledger().report();
    assert_eq!((rep.requests, rep.retries), (1, 1));
    assert_eq!(srv.requests(), 2);
}

/// A stream cut mid-way, and one that stalls past the idle timeout, are retried.
#[tokio::test]
async fn dropped_and_stalled_streams_are_retried() {
    for api in [
        Api::Responses,
        Api::ChatCompletions,
        Api::Anthropic,
        Api::Gemini,
    ] {
        let dir = tempfile::tempdir().unwrap();
        // Long enough that 2 events are not all of it in any dialect (Gemini's
        // chunks are whole answers but for the text).
        let srv = server(
            "turns:\n  - reply: {text: \"a long answer that is cut off, long enough to take more than three chunks\"}\n    drop_after: 2\n  - reply: {text: \"a long answer\"}\n    stall_after: 1\n    stall_ms: 3000\n  - reply: {text: whole}\n",
            dir.path(),
        )
        .await;
        let mut c = client(&srv, api, true, dir.path());
        let mut cfg = c.config().clone();
        cfg.idle_timeout = Duration::from_millis(500);
        c = ModelClient::new(cfg, c.ledger().clone()).unwrap();
        let r = c.complete(&tool_request(), "test").await.unwrap();
        assert_eq!(r.text, "whole", "{api}");
        assert_eq!(c.ledger().report().retries, 2, "{api}");
    }
}

/// A 4xx other than 429 is not retried; retries stop at the limit with the
/// last error, which names the endpoint and the status.
#[tokio::test]
async fn client_errors_are_not_retried_and_limits_hold() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(
        "turns:\n  - error: {status: 400, message: bad request shape}\n  - error: {status: 503}\n    repeat: true\n",
        dir.path(),
    )
    .await;
    let c = client(&srv, Api::Responses, false, dir.path());
    let e = c.complete(&tool_request(), "test").await.unwrap_err();
    assert!(matches!(e, ModelError::Http { status: 400, .. }), "{e}");
    assert!(
        e.to_string().contains("bad request shape") && e.to_string().contains("/v1/responses"),
        "{e}"
    );
    let e = c.complete(&tool_request(), "test").await.unwrap_err();
    assert!(matches!(e, ModelError::Http { status: 503, .. }), "{e}");
    assert_eq!(srv.requests(), 1 + 3);
    let rep = c.ledger().report();
    assert_eq!(rep.failed_requests, 2);
}

/// Turns are taken in order, but a turn with `match` waits for its content;
/// `repeat` keeps a default answer; an exhausted script answers 400.
#[tokio::test]
async fn matching_in_order_and_by_content() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(
        r#"
turns:
  - name: feedback
    match: {contains: "Previous attempt feedback"}
    reply: {text: fixed}
  - name: first
    reply: {text: first}
  - name: default
    match: {api: anthropic}
    reply: {text: claude default}
    repeat: true
"#,
        dir.path(),
    )
    .await;
    let c = client(&srv, Api::ChatCompletions, true, dir.path());
    let mut req = tool_request();
    assert_eq!(c.complete(&req, "t").await.unwrap().text, "first");
    req.messages
        .push(Message::user("Previous attempt feedback: the test failed"));
    assert_eq!(c.complete(&req, "t").await.unwrap().text, "fixed");
    let e = c.complete(&req, "t").await.unwrap_err();
    assert!(e.to_string().contains("no scripted turn left"), "{e}");
    let a = client(&srv, Api::Anthropic, false, dir.path());
    for _ in 0..3 {
        assert_eq!(a.complete(&req, "t").await.unwrap().text, "claude default");
    }
    assert_eq!(srv.remaining(), 0);
}

/// An overall --llm-timeout bounds a call, retries included.
#[tokio::test]
async fn overall_timeout_bounds_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(
        "turns:\n  - reply: {text: late}\n    delay_ms: 3000\n",
        dir.path(),
    )
    .await;
    let c = client(&srv, Api::Responses, true, dir.path());
    let mut cfg = c.config().clone();
    cfg.timeout = Some(Duration::from_millis(400));
    let c = ModelClient::new(cfg, c.ledger().clone()).unwrap();
    let t0 = Instant::now();
    let e = c.complete(&tool_request(), "t").await.unwrap_err();
    assert!(matches!(e, ModelError::Timeout(_)), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(2));
}

/// Unknown fields and a missing `[DONE]` after a finish reason (as some local
/// servers send) are tolerated: checked against a hand-written server.
#[tokio::test]
async fn local_server_quirks_are_tolerated() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 65536];
        let _ = sock.read(&mut buf).await.unwrap();
        let body = "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"hi \"},\"logprobs\":null,\"finish_reason\":null}],\"system_fingerprint\":\"b1\",\"timings\":{\"a\":1}}\n\n\
                    data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"there\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n";
        let resp = format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
        sock.write_all(resp.as_bytes()).await.unwrap();
    });
    let mut cfg = ClientConfig::new(Api::ChatCompletions, &format!("http://{addr}/v1"), "local");
    cfg.retries = 0;
    let ledger = Arc::new(UsageLedger::new(
        None,
        Api::ChatCompletions,
        "local",
        "x",
        &PriceTable::default(),
    ));
    let c = ModelClient::new(cfg, ledger).unwrap();
    let r = c.complete(&tool_request(), "t").await.unwrap();
    assert_eq!(r.text, "hi there");
    assert_eq!(r.usage.input_tokens, 5);
}

/// The data of each SSE frame, checked the way Google's SDK reads them
/// (`data: ` and one JSON object on one line, then a blank line).
fn sse_chunks(text: &str) -> Vec<serde_json::Value> {
    assert!(text.ends_with("\n\n"), "{text:?}");
    text.split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| {
            let data = f.strip_prefix("data: ").expect("a data line");
            assert!(!data.contains('\n'), "{f:?}");
            serde_json::from_str(data).unwrap()
        })
        .collect()
}

/// Gemini's paths as Google's SDKs call them: SSE with `alt=sse`, one JSON
/// array without it, whole replies, `countTokens` and the model list without
/// a turn; `match` on the model named in the path; errors in Google's shape;
/// every request in the log.
#[tokio::test]
async fn gemini_paths_shapes_and_errors() {
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let srv = server(
        r#"
turns:
  - name: pro
    match: {api: gemini, model: gemini-2.5-pro, contains: "hi there"}
    reply: {text: "from pro"}
    usage: {input_tokens: 7, cached_tokens: 2, output_tokens: 5, reasoning_tokens: 1}
  - name: sse
    reply: {text: "streamed over sse, in more than one chunk"}
  - name: array
    reply:
      text: "reading"
      tool_calls: [{name: read_file, arguments: {path: a.txt}}]
  - name: limited
    error: {status: 429, message: "quota", retry_after: 2}
"#,
        dir.path(),
    )
    .await;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let models = format!("{}/v1beta/models", srv.url());
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "hi there"}]}]});
    let post = |url: String| {
        http.post(url)
            .header("x-goog-api-key", "g-canary-key")
            .json(&body)
            .send()
    };

    // Whole: the turn that matches the model in the path.
    let r = post(format!("{models}/gemini-2.5-pro:generateContent"))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    let cand = &v["candidates"][0];
    assert_eq!(cand["content"]["role"], "model");
    assert_eq!(cand["content"]["parts"], json!([{"text": "from pro"}]));
    assert_eq!(cand["finishReason"], "STOP");
    assert_eq!(
        v["usageMetadata"],
        json!({"promptTokenCount": 7, "cachedContentTokenCount": 2, "candidatesTokenCount": 4,
               "thoughtsTokenCount": 1, "totalTokenCount": 12})
    );
    assert_eq!(v["modelVersion"], "gemini-2.5-pro");

    // Streamed as SSE.
    let r = post(format!(
        "{models}/gemini-2.5-flash:streamGenerateContent?alt=sse"
    ))
    .await
    .unwrap();
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let chunks = sse_chunks(&r.text().await.unwrap());
    assert!(chunks.len() > 1);
    let text: String = chunks
        .iter()
        .map(|c| {
            c["candidates"][0]["content"]["parts"][0]["text"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(text, "streamed over sse, in more than one chunk");
    let last = chunks.last().unwrap();
    assert_eq!(last["candidates"][0]["finishReason"], "STOP");
    assert!(last["usageMetadata"]["totalTokenCount"].as_u64().unwrap() > 0);

    // Streamed without `alt=sse`: one JSON array of the same chunks.
    let r = post(format!("{models}/gemini-2.5-flash:streamGenerateContent"))
        .await
        .unwrap();
    assert_eq!(r.headers()["content-type"], "application/json");
    let arr: Vec<serde_json::Value> = r.json().await.unwrap();
    let call = &arr.last().unwrap()["candidates"][0]["content"]["parts"][0]["functionCall"];
    assert_eq!(call["name"], "read_file");
    assert_eq!(call["args"], json!({"path": "a.txt"}));
    assert_eq!(
        arr[0]["candidates"][0]["content"]["parts"][0]["text"],
        "reading"
    );

    // Token counts and the model list use no turn.
    let r = post(format!("{models}/gemini-2.5-flash:countTokens"))
        .await
        .unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(v["totalTokens"].as_u64().is_some(), "{v}");
    let v: serde_json::Value = http
        .get(&models)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["models"][0]["name"], "models/replay");
    assert!(v["models"][0]["supportedGenerationMethods"]
        .as_array()
        .unwrap()
        .contains(&json!("streamGenerateContent")));
    let v: serde_json::Value = http
        .get(format!("{models}/gemini-2.5-flash"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["name"], "models/gemini-2.5-flash");

    // A scripted error, an exhausted script and an unknown path, in Google's shape.
    let r = post(format!("{models}/gemini-2.5-flash:generateContent"))
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "2");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        v,
        json!({"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}})
    );
    let r = post(format!("{models}/gemini-2.5-flash:generateContent"))
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["status"], "INVALID_ARGUMENT");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no scripted turn left"));
    let r = post(format!("{}/v1beta/files", srv.url())).await.unwrap();
    assert_eq!(r.status(), 404);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["status"], "NOT_FOUND");

    // Every request is on record, without the key.
    let log = read_log(&dir.path().join("requests.jsonl")).unwrap();
    let seen: Vec<_> = log
        .iter()
        .map(|l| {
            (
                l.path.as_str(),
                l.api,
                l.model.as_deref(),
                l.stream,
                l.turn_name.as_deref(),
                l.status,
            )
        })
        .collect();
    let g = Some(Api::Gemini);
    assert_eq!(
        seen,
        vec![
            (
                "/v1beta/models/gemini-2.5-pro:generateContent",
                g,
                Some("gemini-2.5-pro"),
                false,
                Some("pro"),
                200
            ),
            (
                "/v1beta/models/gemini-2.5-flash:streamGenerateContent",
                g,
                Some("gemini-2.5-flash"),
                true,
                Some("sse"),
                200
            ),
            (
                "/v1beta/models/gemini-2.5-flash:streamGenerateContent",
                g,
                Some("gemini-2.5-flash"),
                true,
                Some("array"),
                200
            ),
            (
                "/v1beta/models/gemini-2.5-flash:countTokens",
                None,
                Some("gemini-2.5-flash"),
                false,
                None,
                200
            ),
            ("/v1beta/models", None, None, false, None, 200),
            (
                "/v1beta/models/gemini-2.5-flash",
                None,
                None,
                false,
                None,
                200
            ),
            (
                "/v1beta/models/gemini-2.5-flash:generateContent",
                g,
                Some("gemini-2.5-flash"),
                false,
                Some("limited"),
                429
            ),
            (
                "/v1beta/models/gemini-2.5-flash:generateContent",
                g,
                Some("gemini-2.5-flash"),
                false,
                None,
                400
            ),
            ("/v1beta/files", None, None, false, None, 404),
        ]
    );
    assert!(!std::fs::read_to_string(dir.path().join("requests.jsonl"))
        .unwrap()
        .contains("g-canary-key"));
}

/// The installed Gemini CLI, if any: `BELAY_GEMINI_BIN`, belay's pinned
/// agents, or `gemini` on the PATH; and whether node (which runs it) is there.
fn gemini_cli() -> Result<std::path::PathBuf, String> {
    let on_path = |name: &str| {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .find(|f| f.is_file())
        })
    };
    let named = std::env::var_os("BELAY_GEMINI_BIN").map(std::path::PathBuf::from);
    if let Some(p) = named.as_ref().filter(|p| !p.is_file()) {
        return Err(format!("BELAY_GEMINI_BIN={} is no file", p.display()));
    }
    let bin = named
        .or_else(|| {
            [
                "/opt/belay-agents/node_modules/.bin/gemini",
                "/opt/belay-agents/bin/gemini",
            ]
            .iter()
            .map(std::path::PathBuf::from)
            .find(|p| p.is_file())
        })
        .or_else(|| on_path("gemini"))
        .ok_or("no gemini CLI (set BELAY_GEMINI_BIN, or install @google/gemini-cli in /opt/belay-agents)")?;
    if on_path("node").is_none() {
        return Err(format!(
            "{} needs node, which is not on the PATH",
            bin.display()
        ));
    }
    Ok(bin)
}

/// Run the Gemini CLI with `args` against `base`, in `work`, with a home of
/// its own: its settings pick the API-key auth (0.61 refuses the "gateway"
/// auth a bare `GOOGLE_GEMINI_BASE_URL` selects, in non-interactive mode)
/// and turn off its usage statistics and update checks.
async fn run_gemini(
    bin: &std::path::Path,
    base: &str,
    work: &std::path::Path,
    args: &[&str],
) -> (i32, String, String) {
    let home = work.with_extension("home");
    std::fs::create_dir_all(home.join(".gemini")).unwrap();
    std::fs::write(
        home.join(".gemini/settings.json"),
        r#"{"security": {"auth": {"selectedType": "gemini-api-key"}},
            "privacy": {"usageStatisticsEnabled": false},
            "general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false}}"#,
    )
    .unwrap();
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(args)
        .current_dir(work)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &home)
        .env("TERM", "dumb")
        .env("NO_COLOR", "1")
        .env("GOOGLE_GEMINI_BASE_URL", base)
        .env("GEMINI_API_KEY", "g-canary-key")
        // Headless runs refuse an untrusted folder (exit 55) without this.
        .env("GEMINI_CLI_TRUST_WORKSPACE", "true")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .expect("the gemini CLI did not finish within 180 s")
        .expect("the gemini CLI could not start");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn stream_json(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// What the CLI's `message` events said as the assistant, deltas joined.
fn assistant_text(events: &[serde_json::Value]) -> String {
    events
        .iter()
        .filter(|e| e["type"] == "message" && e["role"] == "assistant")
        .filter_map(|e| e["content"].as_str())
        .collect()
}

/// The real Gemini CLI against the replay server, in-process: `gemini -p
/// "say hi" --output-format stream-json` gets the scripted text back over
/// `:streamGenerateContent?alt=sse`; then a scripted tool call runs in the
/// CLI and its result comes back as a `functionResponse`. Skipped, with the
/// reason, where the CLI is not installed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_gemini_cli_talks_to_replay() {
    let bin = match gemini_cli() {
        Ok(b) => b,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("hello.txt"), "hello\n").unwrap();

    // 1. As belay runs it. Without -m the CLI routes: it first asks a
    // classifier (`:generateContent`, a JSON schema with `complexity_score`)
    // which model to use, and retries with backoff an answer that is not
    // that JSON object, so the script answers it.
    let srv = server(
        r#"
turns:
  - name: route
    match: {api: gemini, contains: complexity_score}
    reply: {json: {complexity_reasoning: "a greeting", complexity_score: 5}}
    repeat: true
  - name: hi
    match: {api: gemini, not_contains: complexity_score}
    reply: {text: "Hi from the belay replay server."}
"#,
        dir.path(),
    )
    .await;
    let t0 = Instant::now();
    let (code, out, err) = run_gemini(
        &bin,
        &srv.url(),
        &work,
        &["-p", "say hi", "--output-format", "stream-json"],
    )
    .await;
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let events = stream_json(&out);
    assert_eq!(
        assistant_text(&events),
        "Hi from the belay replay server.",
        "{out}"
    );
    let result = events.iter().find(|e| e["type"] == "result").expect(&out);
    assert_eq!(result["status"], "success", "{out}");
    let log = read_log(&dir.path().join("requests.jsonl")).unwrap();
    let streamed: Vec<_> = log
        .iter()
        .filter(|l| l.path.ends_with(":streamGenerateContent"))
        .collect();
    assert_eq!(streamed.len(), 1, "{:#?}", log);
    let s = streamed[0];
    assert!(s.path.starts_with("/v1beta/models/"), "{}", s.path);
    assert_eq!((s.api, s.stream, s.status), (Some(Api::Gemini), true, 200));
    assert!(s.body.to_string().contains("say hi"));
    assert!(log
        .iter()
        .all(|l| l.api == Some(Api::Gemini) && l.status == 200));
    assert_eq!(s.turn_name.as_deref(), Some("hi"));
    eprintln!(
        "gemini -p 'say hi': {:.1}s, {} request(s): {:?}",
        t0.elapsed().as_secs_f64(),
        log.len(),
        log.iter()
            .map(|l| (&l.path, l.turn_name.as_deref()))
            .collect::<Vec<_>>()
    );
    drop(srv);

    // 2. A model named with -m, and a tool call the CLI runs.
    std::fs::remove_file(dir.path().join("requests.jsonl")).unwrap();
    let srv = server(
        r#"
turns:
  - name: look
    match: {model: gemini-2.5-flash}
    reply:
      text: "Let me look."
      tool_calls: [{name: list_directory, arguments: {dir_path: "."}}]
  - name: answer
    match: {model: gemini-2.5-flash, contains: "hello.txt"}
    reply: {text: "There is one file, hello.txt."}
"#,
        dir.path(),
    )
    .await;
    let (code, out, err) = run_gemini(
        &bin,
        &srv.url(),
        &work,
        &[
            "-p",
            "list the files",
            "-m",
            "gemini-2.5-flash",
            "--output-format",
            "stream-json",
        ],
    )
    .await;
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let events = stream_json(&out);
    let tool = events.iter().find(|e| e["type"] == "tool_use").expect(&out);
    assert_eq!(tool["tool_name"], "list_directory");
    assert_eq!(tool["parameters"]["dir_path"], ".");
    let done = events
        .iter()
        .find(|e| e["type"] == "tool_result")
        .expect(&out);
    assert_eq!(done["status"], "success", "{out}");
    assert_eq!(
        assistant_text(&events),
        "Let me look.There is one file, hello.txt."
    );
    let log = read_log(&dir.path().join("requests.jsonl")).unwrap();
    let names: Vec<_> = log.iter().map(|l| l.turn_name.as_deref()).collect();
    assert_eq!(names, [Some("look"), Some("answer")], "{log:#?}");
    assert!(log.iter().all(
        |l| l.path == "/v1beta/models/gemini-2.5-flash:streamGenerateContent" && l.status == 200
    ));
    // The result went back as a functionResponse in a user turn.
    let contents = log[1].body["contents"].as_array().unwrap();
    let answer = contents.last().unwrap();
    assert_eq!(answer["role"], "user");
    assert_eq!(
        answer["parts"][0]["functionResponse"]["name"],
        "list_directory"
    );
    assert!(answer["parts"][0]["functionResponse"]["response"]
        .to_string()
        .contains("hello.txt"));
}

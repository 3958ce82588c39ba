//! Our model clients against the scripted replay server, over real HTTP:
//! every dialect streamed and not, tool calls, retries (429 with Retry-After,
//! a dropped stream, a stalled stream), content matching, the request log, and
//! usage accounting.
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
        Api::Anthropic => srv.url(),
        _ => srv.openai_base(),
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
    for api in [Api::Responses, Api::ChatCompletions, Api::Anthropic] {
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
    for api in [Api::Responses, Api::ChatCompletions, Api::Anthropic] {
        let dir = tempfile::tempdir().unwrap();
        let srv = server(
            "turns:\n  - reply: {text: \"a long answer that is cut off\"}\n    drop_after: 2\n  - reply: {text: \"a long answer\"}\n    stall_after: 1\n    stall_ms: 3000\n  - reply: {text: whole}\n",
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

//! belay's added latency per model call, against the replay server: the same
//! request sent by a plain HTTP client (reqwest, what a user would write) and
//! by belay's `ModelClient` (dialect mapping, SSE parsing, retries wrapper,
//! usage ledger with its atomic llm-usage.json write). Medians over N calls.
//!
//!     cargo bench -p belay-model --bench latency
//!
//! Prints one JSON line of figures.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Instant;

use belay_model::replay::{parse_script, ReplayServer};
use belay_model::{
    Api, ClientConfig, Message, ModelClient, PriceTable, Request, ToolSpec, UsageLedger,
};

const N: usize = 300;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn request() -> Request {
    Request {
        instructions: Some("You are a careful engineer.".into()),
        messages: vec![Message::user(
            "Fix the failing test in src/lib.rs. ".repeat(40),
        )],
        tools: vec![ToolSpec {
            name: "terminal".into(),
            description: "run a command".into(),
            parameters: serde_json::json!({"type": "object", "properties": {"command": {"type": "string"}}}),
        }],
        ..Default::default()
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    belay_model::init_tls();
    let script = parse_script(
        "turns:\n  - reply:\n      text: \"I will run the tests first.\"\n      tool_calls: [{name: terminal, arguments: {command: \"cargo test\"}}]\n    repeat: true\n",
        "bench",
    )
    .expect("script");
    let srv = ReplayServer::start(script, "127.0.0.1:0".parse().expect("addr"), None)
        .await
        .expect("server");
    let dir = std::env::temp_dir().join(format!("belay-bench-latency-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let mut out = serde_json::Map::new();
    for api in [Api::Responses, Api::ChatCompletions, Api::Anthropic] {
        for stream in [false, true] {
            let base = if api == Api::Anthropic {
                srv.url()
            } else {
                srv.openai_base()
            };
            let mut cfg = ClientConfig::new(api, &base, "bench-model");
            cfg.stream = stream;
            let ledger = Arc::new(UsageLedger::new(
                Some(dir.join("llm-usage.json")),
                api,
                "bench-model",
                &base,
                &PriceTable::builtin(),
            ));
            let client = ModelClient::new(cfg, ledger).expect("client");
            let req = request();
            // The plain client: the same body, prebuilt; read the whole reply.
            let body = belay_model::dialect::body(api, &req, "bench-model", stream).to_string();
            let url = belay_model::dialect::endpoint(api, &base);
            let plain = reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("reqwest");
            for _ in 0..20 {
                let _ = client.complete(&req, "warmup").await;
                let _ = plain
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await
                    .expect("send")
                    .bytes()
                    .await;
            }
            let (mut raw, mut belay) = (Vec::new(), Vec::new());
            for _ in 0..N {
                let t = Instant::now();
                let r = plain
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await
                    .expect("send");
                let _ = r.bytes().await.expect("body");
                raw.push(t.elapsed().as_secs_f64() * 1000.0);
                let t = Instant::now();
                let r = client.complete(&req, "bench").await.expect("complete");
                assert_eq!(r.tool_calls.len(), 1);
                belay.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            let (r, b) = (median(raw), median(belay));
            let key = format!("{api}{}", if stream { "_stream" } else { "" });
            eprintln!("{key}: plain HTTP {r:.3} ms, belay client {b:.3} ms, added {:.3} ms (median of {N})", b - r);
            out.insert(key, serde_json::json!({"plain_ms": (r * 1000.0).round() / 1000.0, "belay_ms": (b * 1000.0).round() / 1000.0, "added_ms": ((b - r) * 1000.0).round() / 1000.0}));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("{}", serde_json::Value::Object(out));
}

//! Agent stream parsing: throughput (MB/s) of the codex and Claude parsers on a
//! large recorded-shape stream, and the memory the CLI runner holds while a
//! real process streams 100 MB through it.
//!
//!     cargo bench -p belay-agent --bench stream
//!
//! Prints one JSON line of figures.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::time::Instant;

use belay_agent::cli::{self, Launch};
use belay_agent::parse::{ClaudeParser, CodexParser, StreamParser};
use belay_agent::Limits;

const TARGET: usize = 100 * 1024 * 1024;

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// A codex-shaped session: commands with sizeable output, file changes, messages.
fn codex_lines(i: usize) -> String {
    let out = "drwxr-xr-x 2 root root 4096 Nov 29 13:21 src\\n".repeat(40);
    format!(
        "{{\"type\":\"item.started\",\"item\":{{\"id\":\"item_{i}\",\"type\":\"command_execution\",\"command\":\"/bin/bash -lc 'ls -la src'\",\"aggregated_output\":\"\",\"exit_code\":null,\"status\":\"in_progress\"}}}}\n\
         {{\"type\":\"item.completed\",\"item\":{{\"id\":\"item_{i}\",\"type\":\"command_execution\",\"command\":\"/bin/bash -lc 'ls -la src'\",\"aggregated_output\":\"{out}\",\"exit_code\":0,\"status\":\"completed\"}}}}\n\
         {{\"type\":\"item.completed\",\"item\":{{\"id\":\"f_{i}\",\"type\":\"file_change\",\"changes\":[{{\"path\":\"/work/src/mod_{i}.rs\",\"kind\":\"update\"}}],\"status\":\"completed\"}}}}\n\
         {{\"type\":\"item.completed\",\"item\":{{\"id\":\"m_{i}\",\"type\":\"agent_message\",\"text\":\"Updated mod_{i}.rs and checked the listing; next I will run the tests.\"}}}}\n"
    )
}

fn claude_lines(i: usize) -> String {
    let out = "test result: ok. 12 passed; 0 failed\\n".repeat(60);
    format!(
        "{{\"type\":\"assistant\",\"message\":{{\"id\":\"msg_{i}\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5\",\"content\":[{{\"type\":\"tool_use\",\"id\":\"toolu_{i}\",\"name\":\"Bash\",\"input\":{{\"command\":\"cargo test\",\"description\":\"run tests\"}}}}],\"stop_reason\":null,\"usage\":{{\"input_tokens\":1200,\"cache_read_input_tokens\":30000,\"output_tokens\":80}}}},\"session_id\":\"s\"}}\n\
         {{\"type\":\"user\",\"message\":{{\"role\":\"user\",\"content\":[{{\"tool_use_id\":\"toolu_{i}\",\"type\":\"tool_result\",\"content\":\"{out}\",\"is_error\":false}}]}},\"session_id\":\"s\"}}\n"
    )
}

fn build(f: fn(usize) -> String) -> Vec<u8> {
    let mut v = Vec::with_capacity(TARGET + 64 * 1024);
    let mut i = 0;
    while v.len() < TARGET {
        v.extend_from_slice(f(i).as_bytes());
        i += 1;
    }
    v
}

fn throughput(name: &str, bytes: &[u8], mut p: Box<dyn StreamParser>) -> (f64, usize) {
    let mut out = Vec::new();
    let mut events = 0;
    let t0 = Instant::now();
    for line in bytes.split(|&b| b == b'\n') {
        if !line.is_empty() {
            p.line(line, &mut out);
            events += out.len();
            out.clear();
        }
    }
    let s = t0.elapsed().as_secs_f64();
    let mbs = bytes.len() as f64 / (1024.0 * 1024.0) / s;
    eprintln!(
        "{name}: {:.0} MB in {s:.3}s = {mbs:.0} MB/s, {events} events",
        bytes.len() as f64 / 1048576.0
    );
    (mbs, events)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // Memory first, before any large buffer exists in this process: a real
    // child streams a 100 MB codex session through the runner.
    let dir = std::env::temp_dir().join(format!("belay-bench-stream-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_default();
    let file = dir.join("codex-100mb.jsonl");
    {
        let mut f =
            std::io::BufWriter::new(std::fs::File::create(&file).expect("create the stream file"));
        let mut n = 0usize;
        let mut i = 0usize;
        while n < TARGET {
            let l = codex_lines(i);
            n += l.len();
            f.write_all(l.as_bytes()).expect("write");
            i += 1;
        }
        f.write_all(
            b"{\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}\n",
        )
        .expect("write");
    }
    let rss_before = rss_kib();
    let launch = Launch {
        argv: vec!["cat".into(), file.display().to_string()],
        stdin: None,
        env: cli::scrubbed_env(),
        cwd: dir.clone(),
        pid_file: None,
        process: Default::default(),
    };
    let mut parser = CodexParser::default();
    let mut seen = 0u64;
    let t0 = Instant::now();
    let report = cli::run(&launch, &mut parser, &Limits::default(), None, &mut |_| {
        seen += 1
    })
    .await
    .expect("run the stream");
    let run_s = t0.elapsed().as_secs_f64();
    let peak = peak_rss_kib();
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "runner: 100 MB through a real process in {run_s:.2}s ({:.0} MB/s end to end), {seen} events, stop {:?}; RSS before {} MiB, peak {} MiB",
        100.0 / run_s,
        report.stop,
        rss_before / 1024,
        peak / 1024
    );

    let codex = build(codex_lines);
    let (codex_mbs, _) = throughput("codex parser", &codex, Box::new(CodexParser::default()));
    drop(codex);
    let claude = build(claude_lines);
    let (claude_mbs, _) = throughput("claude parser", &claude, Box::new(ClaudeParser::default()));
    println!(
        "{}",
        serde_json::json!({
            "codex_parse_mb_s": codex_mbs.round(),
            "claude_parse_mb_s": claude_mbs.round(),
            "runner_end_to_end_mb_s": (100.0 / run_s).round(),
            "runner_stream_mb": 100,
            "runner_peak_rss_mib": peak / 1024,
            "rss_before_runner_mib": rss_before / 1024,
            "runner_events": seen,
        })
    );
}

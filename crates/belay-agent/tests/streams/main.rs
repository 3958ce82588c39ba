//! The agent CLI stream parsers on recorded streams: real codex and Claude Code
//! output (recorded against `belay model replay`), a gemini stream in its
//! documented format, and malformed and truncated variants of each.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use belay_agent::parse::{ClaudeParser, CodexParser, GeminiParser, PlainParser, StreamParser};
use belay_agent::AgentEvent;
use proptest::prelude::*;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn parse_all(p: &mut dyn StreamParser, bytes: &[u8]) -> Vec<AgentEvent> {
    let mut out = Vec::new();
    for line in bytes.split(|&b| b == b'\n') {
        if !line.is_empty() {
            p.line(line, &mut out);
        }
    }
    p.finish(&mut out, Some(0));
    out
}

fn finals(ev: &[AgentEvent]) -> Vec<(&str, bool)> {
    ev.iter()
        .filter_map(|e| match e {
            AgentEvent::Final { text, is_error, .. } => Some((text.as_str(), *is_error)),
            _ => None,
        })
        .collect()
}

#[test]
fn codex_recorded_stream() {
    let ev = parse_all(&mut CodexParser::default(), &fixture("codex.jsonl"));
    assert!(matches!(&ev[0], AgentEvent::Session { id, .. } if !id.is_empty()));
    let commands: Vec<_> = ev
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Command {
                command,
                exit_code,
                output,
            } => Some((command.clone(), *exit_code, output.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(commands.len(), 1);
    assert!(commands[0].0.contains("codex-ran-this"));
    assert_eq!(commands[0].1, Some(0));
    assert!(commands[0].2.contains("codex-ran-this"));
    assert!(ev.iter().any(|e| matches!(e, AgentEvent::FileChange { path, change } if path.ends_with("hello.txt") && change == "add")));
    // A command and a file change: two actions, each counted once although
    // codex reports both their start and their completion.
    assert_eq!(ev.iter().filter(|e| e.is_action()).count(), 2);
    assert_eq!(finals(&ev), vec![("All done: created hello.txt", false)]);
    let usage = ev.iter().find_map(|e| match e {
        AgentEvent::Usage { usage, .. } => Some(*usage),
        _ => None,
    });
    assert!(usage.unwrap().input_tokens > 0);
}

#[test]
fn claude_recorded_stream() {
    let ev = parse_all(&mut ClaudeParser::default(), &fixture("claude.jsonl"));
    assert!(
        matches!(&ev[0], AgentEvent::Session { model: Some(m), .. } if m == "claude-sonnet-4-5")
    );
    assert!(ev.iter().any(|e| matches!(e, AgentEvent::ToolCall { name, input, .. } if name == "Bash" && input.contains("claude-ran-this"))));
    assert!(ev.iter().any(|e| matches!(e, AgentEvent::ToolResult { output, is_error: false, .. } if output == "claude-ran-this")));
    assert_eq!(
        finals(&ev),
        vec![("Done: made.txt holds the greeting.", false)]
    );
    match ev
        .iter()
        .rev()
        .find(|e| matches!(e, AgentEvent::Final { .. }))
        .unwrap()
    {
        AgentEvent::Final {
            num_turns,
            cost_usd,
            ..
        } => {
            assert_eq!(*num_turns, Some(2));
            assert!(cost_usd.unwrap() > 0.0);
        }
        _ => unreachable!(),
    }
    // The first message's usage appears on two lines (text, then tool_use):
    // counted once.
    let per_turn = ev
        .iter()
        .filter(|e| {
            matches!(
                e,
                AgentEvent::Usage {
                    cumulative: false,
                    ..
                }
            )
        })
        .count();
    assert_eq!(per_turn, 2);
}

#[test]
fn gemini_documented_stream() {
    let ev = parse_all(&mut GeminiParser::default(), &fixture("gemini.jsonl"));
    assert!(matches!(&ev[0], AgentEvent::Session { id, .. } if id == "g-session-1"));
    assert!(ev
        .iter()
        .any(|e| matches!(e, AgentEvent::Message { text } if text == "I will create the file.")));
    assert_eq!(ev.iter().filter(|e| e.is_action()).count(), 2);
    assert!(ev.iter().any(|e| matches!(e, AgentEvent::ToolResult { is_error: true, output, .. } if output.contains("permission denied"))));
    assert!(ev
        .iter()
        .any(|e| matches!(e, AgentEvent::Error { fatal: false, .. })));
    assert_eq!(finals(&ev), vec![("Created hello.txt.", false)]);
}

#[test]
fn gemini_error_result_is_an_error() {
    let s = br#"{"type":"init","session_id":"s","model":"m"}
{"type":"error","severity":"error","message":"quota exhausted"}
{"type":"result","status":"error","error":{"type":"FatalTurnLimitedError","message":"turn limit"},"stats":{"input_tokens":1,"output_tokens":1}}"#;
    let ev = parse_all(&mut GeminiParser::default(), s);
    assert!(ev
        .iter()
        .any(|e| matches!(e, AgentEvent::Error { fatal: true, .. })));
    assert_eq!(finals(&ev).len(), 1);
    assert!(finals(&ev)[0].1);
}

#[test]
fn claude_error_subtypes_are_errors() {
    let s = br#"{"type":"result","subtype":"error_max_turns","is_error":true,"num_turns":3,"session_id":"s","total_cost_usd":0.5}"#;
    let ev = parse_all(&mut ClaudeParser::default(), s);
    assert_eq!(finals(&ev), vec![("", true)]);
}

#[test]
fn codex_turn_failed_and_reconnect_notices() {
    let s = br#"{"type":"thread.started","thread_id":"t"}
{"type":"error","message":"Reconnecting... 1/5"}
{"type":"turn.failed","error":{"message":"stream disconnected before completion"}}"#;
    let ev = parse_all(&mut CodexParser::default(), s);
    assert!(ev.iter().any(|e| matches!(e, AgentEvent::Error { fatal: false, message } if message.contains("Reconnecting"))));
    assert!(ev
        .iter()
        .any(|e| matches!(e, AgentEvent::Error { fatal: true, .. })));
    assert_eq!(
        finals(&ev),
        vec![("stream disconnected before completion", true)]
    );
}

/// Garbage lines, a line cut in the middle, and a stream that stops before its
/// result: errors are events, the good lines still count, no final is invented.
#[test]
fn malformed_and_truncated_streams() {
    for (name, mut parser) in [
        (
            "codex.jsonl",
            Box::new(CodexParser::default()) as Box<dyn StreamParser>,
        ),
        ("claude.jsonl", Box::new(ClaudeParser::default())),
        ("gemini.jsonl", Box::new(GeminiParser::default())),
    ] {
        let whole = fixture(name);
        let lines: Vec<&[u8]> = whole
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        // Drop the final line, cut the one before it in half, add garbage.
        let mut bytes = Vec::new();
        for l in &lines[..lines.len() - 2] {
            bytes.extend_from_slice(l);
            bytes.push(b'\n');
        }
        let cut = lines[lines.len() - 2];
        bytes.extend_from_slice(&cut[..cut.len() / 2]);
        bytes.extend_from_slice(b"\nnot json at all\n{\"type\": 42}\n\xff\xfe\n");
        let ev = parse_all(parser.as_mut(), &bytes);
        let errors = ev.iter().filter(|e| matches!(e, AgentEvent::Error { fatal: false, message } if message.contains("unparseable"))).count();
        assert!(errors >= 3, "{name}: {errors} errors in {ev:?}");
        assert!(
            finals(&ev).is_empty(),
            "{name}: a final result was invented"
        );
        assert!(matches!(ev[0], AgentEvent::Session { .. }), "{name}");
    }
}

#[test]
fn plain_output_is_the_answer() {
    let ev = parse_all(&mut PlainParser::default(), b"line one\nline two\n");
    assert_eq!(finals(&ev), vec![("line one\nline two", false)]);
    let mut p = PlainParser::default();
    let mut out = Vec::new();
    p.line(b"boom", &mut out);
    p.finish(&mut out, Some(3));
    assert_eq!(finals(&out), vec![("boom", true)]);
}

proptest! {
    /// No input line panics any parser.
    #[test]
    fn parsers_never_panic(line in proptest::collection::vec(any::<u8>(), 0..300), json_ish in "\\{\"type\":\"[a-z._]{0,20}\"(,\"[a-z_]{1,10}\":(null|1|\"x\"|\\[\\]|\\{\\}))*\\}") {
        for bytes in [line.as_slice(), json_ish.as_bytes()] {
            let mut out = Vec::new();
            CodexParser::default().line(bytes, &mut out);
            ClaudeParser::default().line(bytes, &mut out);
            GeminiParser::default().line(bytes, &mut out);
            PlainParser::default().line(bytes, &mut out);
        }
    }
}

//! The built-in agent in a real container: its tools edit files there, its
//! mistakes go back to the model as tool errors, and it stops on a loop.
//! Needs dockerd and `belay-base:bookworm`; fails, never skips, without them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use belay_agent::builtin::{BuiltinAgent, BuiltinConfig};
use belay_agent::workspace::ContainerWorkspace;
use belay_agent::{AgentEvent, StopReason};
use belay_model::replay::{parse_script, read_log, ReplayServer};
use belay_model::{Api, ClientConfig, ModelClient, PriceTable, UsageLedger};
use belay_record::Redactor;
use belay_sandbox::{ContainerRuntime, ContainerSpec, DockerRuntime, Network};

const BASE: &str = "belay-base:bookworm";

struct Sandbox {
    rt: Arc<DockerRuntime>,
    id: String,
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &self.id])
            .output();
    }
}

async fn sandbox(name: &str) -> Sandbox {
    let rt = DockerRuntime::connect()
        .await
        .expect("these tests need a running Docker engine (.ci/run starts one)");
    assert!(
        rt.image_exists(BASE).await.unwrap(),
        "these tests need {BASE}: run `belay image bootstrap`"
    );
    let id = rt
        .create(&ContainerSpec {
            image: BASE.into(),
            run_id: format!("agent-test-{name}-{}", std::process::id()),
            kind: "test".into(),
            network: Network::None,
            ..Default::default()
        })
        .await
        .unwrap();
    rt.put_files(
        &id,
        &[(
            "/work/app.py".into(),
            b"def f():\n    x = 1\n    return x\n\ndef g():\n    x = 1\n    return x\n".to_vec(),
            0o644,
        )],
    )
    .await
    .unwrap();
    Sandbox {
        rt: Arc::new(rt),
        id,
    }
}

async fn agent_run(
    sb: &Sandbox,
    script: &str,
    api: Api,
    config: BuiltinConfig,
    dir: &std::path::Path,
) -> (belay_agent::AgentReport, Vec<AgentEvent>, ReplayServer) {
    let srv = ReplayServer::start(
        parse_script(script, "script").unwrap(),
        "127.0.0.1:0".parse().unwrap(),
        Some(dir.join("requests.jsonl")),
    )
    .await
    .unwrap();
    let base = if api == Api::Anthropic {
        srv.url()
    } else {
        srv.openai_base()
    };
    let ledger = Arc::new(UsageLedger::new(
        Some(dir.join("llm-usage.json")),
        api,
        "m",
        &base,
        &PriceTable::builtin(),
    ));
    let client = ModelClient::new(ClientConfig::new(api, &base, "m"), ledger).unwrap();
    let rt: Arc<dyn ContainerRuntime> = sb.rt.clone();
    let ws = ContainerWorkspace::new(
        rt,
        &sb.id,
        "/work",
        dir.join("tool-logs"),
        Redactor::default(),
        vec![],
    );
    let mut agent = BuiltinAgent::new(&client, &ws, config);
    let mut events = Vec::new();
    let report = agent
        .run("Make g return 2.", &mut |e| events.push(e.clone()))
        .await
        .unwrap();
    (report, events, srv)
}

const EDIT_TASK: &str = r#"
turns:
  - reply:
      tool_calls: [{name: list_files, arguments: {}}]
  - reply:
      tool_calls: [{name: read_file, arguments: "{\"path\": \"app.py\""}]
  - reply:
      tool_calls: [{name: read_file, arguments: {path: app.py}}]
  - reply:
      text: "Changing g."
      tool_calls: [{name: edit, arguments: {path: app.py, old: "    x = 1\n    return x", new: "    x = 2\n    return x"}}]
  - match: {contains: "occurs 2 times"}
    reply:
      tool_calls: [{name: edit, arguments: {path: app.py, old: "def g():\n    x = 1", new: "def g():\n    x = 2"}}]
  - reply:
      tool_calls:
        - {name: terminal, arguments: {command: "grep -c 'x = 2' app.py && test ! -e /etc/belay-no-such"}}
        - {name: write_file, arguments: {path: notes/done.txt, content: "g returns 2\n"}}
  - reply:
      tool_calls: [{name: finish, arguments: {summary: "g now returns 2"}}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builtin_agent_edits_files_in_a_container() {
    for api in [Api::Responses, Api::ChatCompletions, Api::Anthropic] {
        let dir = tempfile::tempdir().unwrap();
        let sb = sandbox(&format!("edit-{api}")).await;
        let (r, events, _srv) =
            agent_run(&sb, EDIT_TASK, api, BuiltinConfig::default(), dir.path()).await;
        assert_eq!(r.stop, StopReason::Completed, "{api}: {r:#?}");
        assert_eq!(r.final_text, "g now returns 2");
        let app = String::from_utf8(
            sb.rt
                .read_file(&sb.id, "/work/app.py", 1 << 20)
                .await
                .unwrap()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            app, "def f():\n    x = 1\n    return x\n\ndef g():\n    x = 2\n    return x\n",
            "{api}"
        );
        let done = sb
            .rt
            .read_file(&sb.id, "/work/notes/done.txt", 1024)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(done, b"g returns 2\n");
        assert!(
            r.files_changed.contains(&"app.py".to_string())
                && r.files_changed.contains(&"notes/done.txt".to_string()),
            "{:?}",
            r.files_changed
        );
        // Mistakes go back to the model as tool errors, and it sees them.
        let errors: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                AgentEvent::ToolResult {
                    output,
                    is_error: true,
                    ..
                } => Some(output.as_str()),
                _ => None,
            })
            .collect();
        assert!(
            errors
                .iter()
                .any(|e| e.contains("invalid arguments for `read_file`")),
            "{errors:?}"
        );
        assert!(
            errors.iter().any(|e| e.contains("occurs 2 times")),
            "{errors:?}"
        );
        assert!(events.iter().any(|e| matches!(e, AgentEvent::Command { exit_code: Some(0), output, .. } if output.trim() == "1")));
        let log = read_log(&dir.path().join("requests.jsonl")).unwrap();
        assert_eq!(log.len(), 7);
        assert!(log[4].body.to_string().contains("occurs 2 times"));
        // The listing showed the file.
        assert!(
            log[1].body.to_string().contains("./app.py"),
            "{}",
            log[1].body
        );
        let usage: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("llm-usage.json")).unwrap())
                .unwrap();
        assert_eq!(usage["requests"], 7);
        assert_eq!(r.turns, 8);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builtin_agent_stops_on_a_loop() {
    let dir = tempfile::tempdir().unwrap();
    let sb = sandbox("stuck").await;
    let (r, _, srv) = agent_run(
        &sb,
        "turns:\n  - reply:\n      tool_calls: [{name: terminal, arguments: {command: \"ls /work\"}}]\n    repeat: true\n",
        Api::ChatCompletions,
        BuiltinConfig::default(),
        dir.path(),
    )
    .await;
    assert!(
        matches!(&r.stop, StopReason::Stuck { pattern } if pattern.contains("3 times")),
        "{:?}",
        r.stop
    );
    assert!(
        r.interim && r.final_text.contains("stuck"),
        "{}",
        r.final_text
    );
    assert_eq!(srv.requests(), 3);

    let dir = tempfile::tempdir().unwrap();
    let (r, _, srv) = agent_run(
        &sb,
        "turns:\n  - reply:\n      tool_calls: [{name: read_file, arguments: {path: a}}]\n  - reply:\n      tool_calls: [{name: read_file, arguments: {path: b}}]\n  - reply:\n      tool_calls: [{name: read_file, arguments: {path: a}}]\n  - reply:\n      tool_calls: [{name: read_file, arguments: {path: b}}]\n  - reply:\n      tool_calls: [{name: read_file, arguments: {path: a}}]\n  - reply:\n      tool_calls: [{name: read_file, arguments: {path: b}}]\n  - reply: {text: never reached}\n",
        Api::Responses,
        BuiltinConfig::default(),
        dir.path(),
    )
    .await;
    assert!(
        matches!(&r.stop, StopReason::Stuck { pattern } if pattern.contains("alternating")),
        "{:?}",
        r.stop
    );
    assert_eq!(srv.requests(), 6);

    // Progress (new output each time) is not a loop; the iteration limit ends it.
    let dir = tempfile::tempdir().unwrap();
    let config = BuiltinConfig {
        max_iterations: 4,
        ..BuiltinConfig::default()
    };
    let (r, _, srv) = agent_run(
        &sb,
        "turns:\n  - reply:\n      tool_calls: [{name: terminal, arguments: {command: \"date +%s%N\"}}]\n    repeat: true\n",
        Api::Anthropic,
        config,
        dir.path(),
    )
    .await;
    assert_eq!(r.stop, StopReason::IterationLimit { limit: 4 });
    assert_eq!(srv.requests(), 4);
}

//! The Docker backend against a real engine. Needs dockerd and the base image
//! `belay-base:bookworm` (`belay image bootstrap`); fails, never skips, without them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use belay_record::Redactor;
use belay_sandbox::{
    BuildRequest, ContainerRuntime, ContainerSpec, DockerRuntime, ExecSpec, Network, NoopObserver,
    SandboxError, TarFilter,
};

const BASE: &str = "belay-base:bookworm";

async fn runtime() -> DockerRuntime {
    let rt = DockerRuntime::connect()
        .await
        .expect("these tests need a running Docker engine (.ci/run starts one)");
    assert!(
        rt.image_exists(BASE).await.unwrap(),
        "these tests need {BASE}: run `belay image bootstrap`"
    );
    rt
}

struct Container<'a> {
    rt: &'a DockerRuntime,
    id: String,
}

impl Container<'_> {
    async fn exec(&self, cmd: &str, timeout: Option<Duration>) -> belay_sandbox::ExecOutcome {
        let dir = tempfile::tempdir().unwrap();
        let spec = ExecSpec {
            argv: vec!["bash".into(), "-c".into(), cmd.into()],
            working_dir: None,
            env: vec![("GREETING".into(), "hi".into())],
            timeout,
            log_path: dir.path().join("x.log"),
            log_limit: None,
        };
        self.rt
            .exec(&self.id, &spec, &Redactor::default(), &NoopObserver)
            .await
            .unwrap()
    }
}

async fn start<'a>(rt: &'a DockerRuntime, network: Network, name: &str) -> Container<'a> {
    let id = rt
        .create(&ContainerSpec {
            image: BASE.into(),
            run_id: format!("sandbox-test-{name}-{}", std::process::id()),
            kind: "test".into(),
            network,
            ..Default::default()
        })
        .await
        .unwrap();
    Container { rt, id }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_reports_exit_codes_and_streams_to_the_log() {
    let rt = runtime().await;
    let c = start(&rt, Network::None, "exec").await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("logs/b/block-attempt-1.log");
    let red = Redactor::new([("TOKEN".to_string(), "sekrit-canary-123".to_string())]);
    let spec = ExecSpec {
        argv: vec![
            "bash".into(),
            "-c".into(),
            "echo out $GREETING; echo err >&2; echo sekrit-canary-123; exit 3".into(),
        ],
        working_dir: Some("/tmp".into()),
        env: vec![("GREETING".into(), "hi".into())],
        timeout: Some(Duration::from_secs(30)),
        log_path: log.clone(),
        log_limit: None,
    };
    let out = rt.exec(&c.id, &spec, &red, &NoopObserver).await.unwrap();
    rt.remove(&c.id).await.unwrap();
    assert_eq!(out.exit_code, 3);
    assert!(!out.timed_out);
    assert!(out.stdout_tail.contains("out hi"), "{:?}", out.stdout_tail);
    assert_eq!(out.stderr_tail, "err\n");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("out hi") && text.contains("err"));
    assert!(
        !text.contains("sekrit-canary-123") && text.contains("[REDACTED:TOKEN]"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_the_whole_process_tree() {
    let rt = runtime().await;
    let c = start(&rt, Network::None, "timeout").await;
    let t0 = Instant::now();
    // A background grandchild that would outlive a naive kill of the shell.
    let out = c
        .exec(
            "(sleep 301 &) ; sleep 302 & sleep 303; echo never",
            Some(Duration::from_secs(2)),
        )
        .await;
    let took = t0.elapsed();
    assert!(out.timed_out, "{out:?}");
    assert!(took < Duration::from_secs(15), "timeout took {took:?}");
    assert!(!out.stdout_tail.contains("never"));
    // No sleep of the killed command survives inside the container.
    let ps = c
        .exec("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c 'sleep 30[123]' || true", None)
        .await;
    rt.remove(&c.id).await.unwrap();
    assert_eq!(
        ps.stdout_tail.trim(),
        "0",
        "processes survived the timeout: {}",
        ps.stdout_tail
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_none_has_only_loopback_and_bridge_has_an_interface() {
    let rt = runtime().await;
    for (net, expect_eth) in [(Network::None, false), (Network::Bridge, true)] {
        let c = start(&rt, net, "net").await;
        let out = c.exec("ls /sys/class/net | tr '\\n' ' '", None).await;
        // `localhost` resolves in both: suites bind loopback servers offline.
        let hosts = c
            .exec(
                "grep -E '^127\\.0\\.0\\.1[[:space:]]+localhost' /etc/hosts && getent hosts localhost",
                None,
            )
            .await;
        // IPv6 on the loopback, for a server that binds `::1` or `::`.
        let v6 = c
            .exec("cat /proc/sys/net/ipv6/conf/lo/disable_ipv6", None)
            .await;
        // Without network, `localhost` is 127.0.0.1 and `::1` (a client of
        // a server on `::` looks up IPv6 alone), in glibc's own order (an
        // image whose node is older than 20 sets its own: belay-env); and
        // a sandbox cannot change the names.
        let names = c
            .exec(
                "echo all $(getent ahosts localhost | cut -d' ' -f1 | LC_ALL=C sort -u); getent hosts localhost; getent hosts ip6-localhost; echo x >> /etc/hosts && echo wrote",
                None,
            )
            .await;
        rt.remove(&c.id).await.unwrap();
        if net == Network::None {
            let text = &names.stdout_tail;
            assert!(
                text.starts_with("all 127.0.0.1 ::1\n"),
                "{net:?}: localhost is not both 127.0.0.1 and ::1: {text}"
            );
            assert!(
                text.lines()
                    .any(|l| l.starts_with("::1") && l.contains(" localhost")),
                "{net:?}: localhost is not ::1 as well: {text}"
            );
            assert!(
                text.contains("ip6-localhost"),
                "{net:?}: ip6-localhost does not resolve: {text}"
            );
            assert!(
                !text.contains("wrote"),
                "{net:?}: a sandbox wrote /etc/hosts: {text}"
            );
        }
        if std::path::Path::new("/proc/sys/net/ipv6/conf/lo/disable_ipv6").exists() {
            assert_eq!(v6.stdout_tail.trim(), "0", "{net:?}: ::1 is off: {v6:?}");
        }
        assert!(out.stdout_tail.contains("lo"), "{}", out.stdout_tail);
        assert!(
            hosts.exit_code == 0 && hosts.stdout_tail.starts_with("127.0.0.1"),
            "{net:?}: localhost does not resolve: {hosts:?}"
        );
        assert_eq!(
            out.stdout_tail.contains("eth0"),
            expect_eth,
            "{net:?}: {}",
            out.stdout_tail
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_dir_in_streams_a_tree_with_exclusions_and_symlinks() {
    let rt = runtime().await;
    let c = start(&rt, Network::None, "copy").await;
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(src.path().join("pkg/sub")).unwrap();
    std::fs::write(src.path().join("pkg/sub/data.txt"), "payload").unwrap();
    std::fs::create_dir_all(src.path().join(".belay/runs")).unwrap();
    std::fs::write(src.path().join(".belay/runs/secret.log"), "x").unwrap();
    std::os::unix::fs::symlink("pkg/sub/data.txt", src.path().join("link")).unwrap();
    let big = vec![b'z'; 3 * 1024 * 1024];
    std::fs::write(src.path().join("big.bin"), &big).unwrap();
    let filter = TarFilter {
        exclude: vec![".belay".into()],
        ..Default::default()
    };
    rt.copy_dir_in(&c.id, src.path(), "/workspace/repo", &filter)
        .await
        .unwrap();
    let out = c
        .exec(
            "cd /workspace/repo && cat pkg/sub/data.txt && echo && readlink link && stat -c %s big.bin && test ! -e .belay && echo excluded",
            None,
        )
        .await;
    // Files can be put too, with their mode.
    rt.put_files(
        &c.id,
        &[("/belay/scripts/x.sh".into(), b"echo put-ok".to_vec(), 0o755)],
    )
    .await
    .unwrap();
    let put = c
        .exec(
            "test -x /belay/scripts/x.sh && bash /belay/scripts/x.sh",
            None,
        )
        .await;
    rt.remove(&c.id).await.unwrap();
    assert_eq!(
        out.stdout_tail,
        "payload\npkg/sub/data.txt\n3145728\nexcluded\n"
    );
    assert_eq!(put.stdout_tail.trim(), "put-ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_labels_the_image_and_blanks_owner_labels() {
    let rt = runtime().await;
    let c = start(&rt, Network::None, "commit").await;
    c.exec("echo state > /marker", None).await;
    let tag = format!("belay-sandbox-test:commit-{}", std::process::id());
    let mut labels = BTreeMap::new();
    labels.insert("belay.run".to_string(), "r1".to_string());
    labels.insert("belay.kind".to_string(), "checkpoint".to_string());
    rt.commit(&c.id, &tag, &labels).await.unwrap();
    rt.remove(&c.id).await.unwrap();
    let img = rt.image(&tag).await.unwrap().expect("committed image");
    assert_eq!(img.labels.get("belay").map(String::as_str), Some("true"));
    assert_eq!(img.labels.get("belay.run").map(String::as_str), Some("r1"));
    assert_eq!(
        img.labels.get("belay.owner.pid").map(String::as_str),
        Some(""),
        "{:?}",
        img.labels
    );
    // The committed state is there in a container made from it.
    let c2 = rt
        .create(&ContainerSpec {
            image: tag.clone(),
            run_id: "r1".into(),
            kind: "test".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let c2 = Container { rt: &rt, id: c2 };
    let out = c2.exec("cat /marker", None).await;
    rt.remove(&c2.id).await.unwrap();
    rt.remove_image(&tag).await.unwrap();
    assert_eq!(out.stdout_tail, "state\n");
    assert!(!rt.image_exists(&tag).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builds_a_dockerfile_through_the_api_and_bounds_it() {
    let rt = runtime().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.txt"), "from context").unwrap();
    std::fs::write(
        dir.path().join("Dockerfile"),
        format!("FROM {BASE}\nCOPY hello.txt /hello.txt\nRUN cat /hello.txt\n"),
    )
    .unwrap();
    let tag = format!("belay-sandbox-test:build-{}", std::process::id());
    let req = BuildRequest {
        dockerfile: dir.path().join("Dockerfile"),
        context_dir: dir.path().to_path_buf(),
        tag: tag.clone(),
        labels: BTreeMap::from([("belay".to_string(), "true".to_string())]),
        timeout: Duration::from_secs(120),
        log_path: dir.path().join("build.log"),
        network: Network::None,
    };
    rt.build(&req, &Redactor::default()).await.unwrap();
    assert!(rt.image_exists(&tag).await.unwrap());
    assert!(std::fs::read_to_string(dir.path().join("build.log"))
        .unwrap()
        .contains("from context"));
    rt.remove_image(&tag).await.unwrap();

    // A failing step is a BuildFailed with the daemon's message; a slow one times out.
    std::fs::write(
        dir.path().join("Dockerfile"),
        format!("FROM {BASE}\nRUN exit 7\n"),
    )
    .unwrap();
    let err = rt.build(&req, &Redactor::default()).await.unwrap_err();
    assert!(matches!(err, SandboxError::BuildFailed { .. }), "{err}");
    std::fs::write(
        dir.path().join("Dockerfile"),
        format!("FROM {BASE}\nRUN sleep 60\n"),
    )
    .unwrap();
    let slow = BuildRequest {
        timeout: Duration::from_secs(3),
        ..req.clone()
    };
    let err = rt.build(&slow, &Redactor::default()).await.unwrap_err();
    assert!(matches!(err, SandboxError::BuildTimeout { .. }), "{err}");
    assert!(err.to_string().contains("--docker-build-timeout"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_is_a_clear_error() {
    let rt = runtime().await;
    let err = rt
        .create(&ContainerSpec {
            image: "belay-no-such-image:x".into(),
            run_id: "r".into(),
            kind: "test".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, SandboxError::ImageMissing { .. }), "{err}");
    assert!(err.to_string().contains("belay image bootstrap"));
}

/// After a stop, `remove_own` removes the run's route networks on the real
/// engine (the name filter matches anywhere; only the run's prefix goes).
#[tokio::test]
async fn a_stopped_runs_networks_are_removed_by_name() {
    let rt = runtime().await;
    let run = format!("t{}", std::process::id());
    let mine = format!("belay-{run}-0a0b0c");
    let other = format!("x-belay-{run}-0a0b0c");
    rt.ensure_network(&mine, true).await.unwrap();
    rt.ensure_network(&other, true).await.unwrap();
    assert_eq!(
        rt.networks_named(&format!("belay-{run}-")).await.unwrap(),
        [mine]
    );
    belay_sandbox::reaper::remove_own(&rt, &run).await.unwrap();
    assert!(rt
        .networks_named(&format!("belay-{run}-"))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        rt.networks_named(&other).await.unwrap(),
        std::slice::from_ref(&other)
    );
    rt.remove_network(&other).await.unwrap();
}

/// A container behind a model route reaches the model and nothing else, and
/// everything else is refused at once: a name lookup, a connection out to the
/// internet, a connection to another port of the host. Dropped packets made
/// each wait 20–30 s for a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_route_everything_but_the_model_is_refused_at_once() {
    let rt = runtime().await;
    let model = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = model.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = model.accept().await {
            use tokio::io::AsyncWriteExt;
            let _ = s.write_all(b"model-here\n").await;
        }
    });
    // (Not the run prefix `t<pid>` another test of this binary removes.)
    let net = format!("belay-r{}-route", std::process::id());
    let route =
        belay_sandbox::route::model_route(&rt, &net, &format!("http://127.0.0.1:{port}/v1"))
            .await
            .unwrap();
    let reach = route
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/v1")
        .to_string();
    let (ip, rport) = reach.rsplit_once(':').unwrap();
    let id = rt
        .create(&ContainerSpec {
            image: BASE.into(),
            run_id: format!("sandbox-test-route-{}", std::process::id()),
            kind: "test".into(),
            network: Network::None,
            network_name: Some(route.network.clone()),
            refuse_dns: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let c = Container { rt: &rt, id };
    // Each probe prints its outcome and how long it took, in milliseconds.
    let timed = |name: &str, cmd: &str| {
        format!("s=$(date +%s%N); if {cmd}; then r=open; else r=refused; fi; echo {name}=$r:$(( ($(date +%s%N) - s) / 1000000 ))")
    };
    let other = if rport == "1" { "2" } else { "1" };
    let script = [
        timed(
            "model",
            &format!("head -1 </dev/tcp/{ip}/{rport} | grep -q model-here"),
        ),
        timed("dns", "getent hosts example.com >/dev/null"),
        timed(
            "internet",
            "timeout 20 bash -c 'exec 3<>/dev/tcp/1.1.1.1/80' 2>/dev/null",
        ),
        timed(
            "host_port",
            &format!("timeout 20 bash -c 'exec 3<>/dev/tcp/{ip}/{other}' 2>/dev/null"),
        ),
        timed("localhost", "getent hosts localhost >/dev/null"),
    ]
    .join("; ");
    let out = c.exec(&script, Some(Duration::from_secs(90))).await;
    let text = out.stdout_tail.clone();
    let _ = rt.remove(&c.id).await;
    route.close(&rt).await;
    let _ = rt.remove_network(&net).await;
    let got = |name: &str| -> (String, u64) {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in {text}"));
        let (r, ms) = line.split_once(':').unwrap();
        (r.to_string(), ms.trim().parse().unwrap())
    };
    println!("{text}");
    assert_eq!(got("model").0, "open", "{text}");
    assert_eq!(got("localhost").0, "open", "{text}");
    for probe in ["dns", "internet", "host_port"] {
        let (r, ms) = got(probe);
        assert_eq!(r, "refused", "{probe}: {text}");
        assert!(ms < 1000, "{probe} took {ms} ms to fail: {text}");
    }
}

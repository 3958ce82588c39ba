//! The systemd units: the peer's contract plus hardening, each verified by
//! `systemd-analyze verify`, and `uninstall` removes exactly what `install`
//! wrote.

use super::*;

#[test]
fn the_units_pass_systemd_analyze_verify_and_uninstall_removes_exactly_them() {
    let p = proj();
    let c = p.config("units", "commit", "container", "round_budget_s = 900", "");
    let dir = p.tmp.path().join("units");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("someone-else.service"),
        "[Service]\nExecStart=/bin/true\n",
    )
    .unwrap();
    let o = p.run(
        &c,
        &[
            "install",
            "--monitor",
            "--unit-dir",
            dir.to_str().unwrap(),
            "--json",
        ],
    );
    ok(&o);
    let serve = dir.join("belay-rounds@repo.service");
    let monitor = dir.join("belay-rounds-monitor@repo.service");
    let filters = [
        (
            regex::escape(&p.tmp.path().display().to_string()),
            "[TMP]".to_string(),
        ),
        (
            regex::escape(env!("CARGO_BIN_EXE_belay")),
            "[BELAY]".to_string(),
        ),
    ];
    let filters: Vec<(&str, &str)> = filters
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    insta::with_settings!({filters => filters}, {
        insta::assert_snapshot!("serve_unit", std::fs::read_to_string(&serve).unwrap());
        insta::assert_snapshot!("monitor_unit", std::fs::read_to_string(&monitor).unwrap());
    });
    let text = std::fs::read_to_string(&serve).unwrap();
    for want in [
        "KillSignal=SIGTERM",
        "TimeoutStopSec=970",
        "Restart=on-failure",
        "RestartPreventExitStatus=78 75",
        "StartLimitBurst=5",
        "NoNewPrivileges=yes",
        "MemoryMax=8G",
        "TasksMax=1024",
        "ProtectSystem=strict",
        "ReadWritePaths=",
    ] {
        assert!(text.contains(want), "{want} missing:\n{text}");
    }
    for unit in [&serve, &monitor] {
        let v = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(unit)
            .env("SYSTEMD_LOG_LEVEL", "warning")
            .output()
            .expect("systemd-analyze (Debian's systemd package; .ci/run installs it)");
        let err = String::from_utf8_lossy(&v.stderr);
        let problems: Vec<&str> = err
            .lines()
            .filter(|l| {
                l.contains(&unit.file_name().unwrap().to_string_lossy().to_string())
                    || l.contains("Unknown")
                    || l.contains("Failed")
            })
            .collect();
        assert!(
            v.status.success() && problems.is_empty(),
            "{}: {err}",
            unit.display()
        );
    }
    let o = p.run(&c, &["uninstall", "--json"]);
    ok(&o);
    let mut left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["someone-else.service"]);
    // Nothing more to remove: said so, not silently "done".
    let o = p.run(&c, &["uninstall"]);
    assert_eq!(code(&o), 78);
}

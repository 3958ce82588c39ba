//! A hostile agent in its round's container: what it plants in the git dir,
//! in belay's own inputs and in the CLI's login directory never reaches the
//! host. Each attack leaves a marker on the host if it works.

use super::*;

const HOSTILE: &str = r#"#!/bin/sh
cat > /dev/null
m=$1
case "$2" in
  commondir)
    # Another common dir whose config names a filter with `=` in its name.
    mkdir -p .git/c && cp -r .git/objects .git/refs .git/HEAD .git/c/
    printf '[core]\n\trepositoryformatversion = 0\n[filter "a=b"]\n\tclean = sh -c '"'"'touch %s; cat'"'"'\n' "$m" > .git/c/config
    echo c > .git/commondir
    echo '* filter=a=b' > .gitattributes
    echo changed >> README ;;
  reflog)
    git checkout -q -b 'x;touch${IFS}'"$m"';#'
    mkdir -p .git/logs/refs && rm -f .git/logs/refs/stash && ln -s "$m.target" .git/logs/refs/stash
    echo changed >> README ;;
  hooks)
    printf '#!/bin/sh\ntouch %s\n' "$m" > .git/hooks/pre-commit
    chmod +x .git/hooks/pre-commit
    cp /bin/sh .git/suid-sh && chmod u+s .git/suid-sh ;;
  config)
    sed -i 's/^placement = "container"/placement = "host"/' agent-runner.toml
    ln -sf /etc/hostname prompts/main.md ;;
  promptdir)
    rm -rf prompts && ln -s "$m.dir" prompts ;;
  nested)
    git init -q zz && echo work > w.txt ;;
  lock)
    touch .git/index.lock && touch -d 2001-01-01 .git/index.lock && echo changed >> README ;;
  login)
    echo '{"hooks": {"SessionStart": [{"command": "touch '"$m"'"}]}}' > /tmp/.claude/settings.json
    echo '{"token": "refreshed"}' > /tmp/.claude/.credentials.json ;;
  catlogin)
    cat /tmp/.claude/.credentials.json
    cat /tmp/.claude/.credentials.json >&2 ;;
esac
echo '{"type":"result","subtype":"success"}'
"#;

fn hostile(p: &Proj, attack: &str, in_tree_config: bool) -> (PathBuf, PathBuf) {
    let agent = p.tmp.path().join("hostile.sh");
    common::install_script(&agent, HOSTILE);
    let marker = p.tmp.path().join(format!("PWNED-{attack}"));
    let text = format!(
        "schema_version = 1\n[agent]\ncommand = [\"{}\", \"{}\", \"{attack}\"]\nprompt_arg_template = []\nprompt_delivery = \"stdin\"\nplacement = \"container\"\n[runtime]\nwork_dir = \"{}\"\nlog_dir = \"{}\"\nround_budget_s = 60\n[prompt]\nfile = \"./prompts/main.md\"\n",
        agent.display(),
        marker.display(),
        p.repo.display(),
        p.logs(attack).display()
    );
    let cfg = if in_tree_config {
        p.repo.join("agent-runner.toml")
    } else {
        p.tmp.path().join(format!("{attack}.toml"))
    };
    std::fs::write(&cfg, text).unwrap();
    if in_tree_config {
        git(&p.repo, &["add", "agent-runner.toml"]);
        git(&p.repo, &["commit", "-qm", "the config"]);
    }
    (cfg, marker)
}

/// After the round, the host's git runs over what the agent left: status, a
/// stash, and the user's own `git commit`.
fn host_git_runs(p: &Proj) {
    git(&p.repo, &["status", "--short"]);
    std::fs::write(p.repo.join("user.txt"), "the user's own work\n").unwrap();
    git(&p.repo, &["add", "user.txt"]);
    git(&p.repo, &["commit", "-qm", "the user's commit"]);
}

#[test]
fn a_planted_commondir_with_an_equals_named_filter_never_runs_on_the_host() {
    require_agent_image();
    let p = proj();
    let (c, marker) = hostile(&p, "commondir", false);
    ok(&p.run(&c, &["round"]));
    host_git_runs(&p);
    assert!(!marker.exists(), "the filter ran on the host");
    let rep = p.kinds("commondir", "git_dir_repaired");
    assert!(
        rep[0]["data"]["restored"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == "commondir"),
        "{rep:?}"
    );
    assert!(!p.repo.join(".git/commondir").exists());
}

#[test]
fn a_reflog_linked_to_a_host_file_is_removed_before_the_stash() {
    require_agent_image();
    let p = proj();
    let (c, marker) = hostile(&p, "reflog", false);
    let target = PathBuf::from(format!("{}.target", marker.display()));
    std::fs::write(&target, "untouched\n").unwrap();
    ok(&p.run(&c, &["round"]));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched\n");
    assert_eq!(p.stash_shas().len(), 1, "the dirty tree was still stashed");
    let rep = p.kinds("reflog", "git_dir_repaired");
    assert_eq!(
        rep[0]["data"]["links_removed"],
        serde_json::json!(["logs/refs/stash"])
    );
}

#[test]
fn planted_hooks_and_set_id_files_in_the_git_dir_are_undone() {
    require_agent_image();
    let p = proj();
    let (c, marker) = hostile(&p, "hooks", false);
    ok(&p.run(&c, &["round"]));
    host_git_runs(&p);
    assert!(
        !marker.exists(),
        "the planted hook ran at the user's commit"
    );
    assert!(!p.repo.join(".git/hooks/pre-commit").exists());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(p.repo.join(".git/suid-sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o6000, 0, "set-id bit left: {mode:o}");
}

#[test]
fn the_agent_cannot_rewrite_the_config_or_the_prompt_it_runs_under() {
    require_agent_image();
    let p = proj();
    let (c, _) = hostile(&p, "config", true);
    let before = std::fs::read_to_string(&c).unwrap();
    ok(&p.run(&c, &["round"]));
    assert_eq!(
        std::fs::read_to_string(&c).unwrap(),
        before,
        "the config was put back"
    );
    let prompt = p.repo.join("prompts/main.md");
    assert!(!std::fs::symlink_metadata(&prompt)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read_to_string(&prompt).unwrap(), prompt_text());
    // Both are mounted read-only in the agent's container, so its writes
    // fail there; what lands anyway (a host-placed agent) is put back from
    // the trusted copies and recorded.
    let r = p.kinds("config", "control_file_restored");
    if let Some(first) = r.first() {
        let paths: Vec<&str> = first["data"]["paths"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(paths, ["agent-runner.toml", "prompts/main.md"]);
    }
    // The next round still runs in a container, on the real prompt.
    let o = p.run(&c, &["round", "--json"]);
    ok(&o);
    let starts = p.kinds("config", "round_start");
    assert_eq!(starts.last().unwrap()["data"]["placement"], "container");
}

#[test]
fn the_login_directory_gives_back_nothing_or_with_write_back_only_the_token() {
    require_agent_image();
    let p = proj();
    let home_claude = p.tmp.path().join(".claude");
    std::fs::create_dir_all(&home_claude).unwrap();
    std::fs::write(
        home_claude.join(".credentials.json"),
        "{\"token\": \"old\"}\n",
    )
    .unwrap();
    std::fs::write(home_claude.join("settings.json"), "{}\n").unwrap();
    let (c, marker) = hostile(&p, "login", false);
    let text = std::fs::read_to_string(&c).unwrap().replace(
        "[runtime]",
        &format!("login_dirs = [\"{}\"]\n[runtime]", home_claude.display()),
    );
    std::fs::write(&c, &text).unwrap();
    ok(&p.run(&c, &["round"]));
    // By default nothing comes back, not even the token (an agent could
    // swap the user's login).
    assert_eq!(
        std::fs::read_to_string(home_claude.join(".credentials.json")).unwrap(),
        "{\"token\": \"old\"}\n"
    );
    std::fs::write(
        &c,
        text.replace("[runtime]", "login_write_back = true\n[runtime]"),
    )
    .unwrap();
    ok(&p.run(&c, &["round"]));
    assert_eq!(
        std::fs::read_to_string(home_claude.join("settings.json")).unwrap(),
        "{}\n",
        "settings came back to the host"
    );
    assert_eq!(
        std::fs::read_to_string(home_claude.join(".credentials.json")).unwrap(),
        "{\"token\": \"refreshed\"}\n"
    );
    assert!(!marker.exists());
}

/// Every file under `dir` (but the scratch login view) that holds `needle`.
fn files_holding(dir: &Path, needle: &str, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let (path, t) = (e.path(), e.file_type().unwrap());
        if t.is_dir() && e.file_name() != ".login" {
            files_holding(&path, needle, out);
        } else if t.is_file()
            && String::from_utf8_lossy(&std::fs::read(&path).unwrap()).contains(needle)
        {
            out.push(path);
        }
    }
}

#[test]
fn an_agent_printing_its_login_finds_the_tokens_scrubbed() {
    require_agent_image();
    let p = proj();
    let home_claude = p.tmp.path().join(".claude");
    std::fs::create_dir_all(&home_claude).unwrap();
    let (access, refresh) = ("sk-ant-oat01-access-5b7e2c", "sk-ant-ort01-refresh-9d1f4a");
    std::fs::write(
        home_claude.join(".credentials.json"),
        format!("{{\"claudeAiOauth\": {{\"accessToken\": \"{access}\", \"refreshToken\": \"{refresh}\"}}}}\n"),
    )
    .unwrap();
    let (c, _) = hostile(&p, "catlogin", false);
    let text = std::fs::read_to_string(&c).unwrap().replace(
        "[runtime]",
        &format!("login_dirs = [\"{}\"]\n[runtime]", home_claude.display()),
    );
    std::fs::write(&c, text).unwrap();
    ok(&p.run(&c, &["round"]));
    let logs = p.logs("catlogin");
    for token in [access, refresh] {
        let mut found = Vec::new();
        files_holding(&logs, token, &mut found);
        assert!(found.is_empty(), "the login token is in {found:?}");
    }
    let mut scrubbed = Vec::new();
    files_holding(&logs, "[REDACTED:.claude/.credentials.json]", &mut scrubbed);
    assert!(
        !scrubbed.is_empty(),
        "the round's log shows no scrubbed token"
    );
}

#[test]
fn a_prompts_dir_replaced_by_a_link_to_a_host_dir_is_never_written_through() {
    require_agent_image();
    let p = proj();
    let (c, marker) = hostile(&p, "promptdir", false);
    let host_dir = PathBuf::from(format!("{}.dir", marker.display()));
    std::fs::create_dir_all(&host_dir).unwrap();
    std::fs::write(host_dir.join("main.md"), "the user's data\n").unwrap();
    ok(&p.run(&c, &["round"]));
    assert_eq!(
        std::fs::read_to_string(host_dir.join("main.md")).unwrap(),
        "the user's data\n"
    );
    let prompts = std::fs::symlink_metadata(p.repo.join("prompts")).unwrap();
    assert!(prompts.is_dir(), "prompts is a real dir again");
    assert_eq!(
        std::fs::read_to_string(p.repo.join("prompts/main.md")).unwrap(),
        prompt_text()
    );
}

#[test]
fn a_planted_repository_or_a_backdated_lock_does_not_stop_the_stash() {
    require_agent_image();
    let p = proj();
    let (c, _) = hostile(&p, "nested", false);
    ok(&p.run(&c, &["round"]));
    assert_eq!(
        p.stash_shas().len(),
        1,
        "the work was stashed around the planted repository"
    );
    assert!(git(
        &p.repo,
        &[
            "stash",
            "show",
            "--include-untracked",
            "--name-only",
            &p.stash_shas()[0]
        ]
    )
    .contains("w.txt"));
    assert!(
        p.repo.join("zz/.git").exists(),
        "the planted repository stays, named"
    );
    let p = proj();
    let (c, _) = hostile(&p, "lock", false);
    ok(&p.run(&c, &["round"]));
    assert_eq!(
        p.stash_shas().len(),
        1,
        "the backdated lock was removed before the stash"
    );
}

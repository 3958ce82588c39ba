#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use super::*;
use crate::config::PlacementKind;

struct Tree {
    _tmp: tempfile::TempDir,
    base: PathBuf,
    root: PathBuf,
    config: PathBuf,
    store: PathBuf,
    text: String,
}

impl Tree {
    fn store(&self) -> ControlStore {
        ControlStore::new(&self.store)
    }

    fn open(&self, how: Use) -> Result<Gated, RoundsError> {
        open_in(self.store(), &self.config, how)
    }

    fn logs(&self) -> PathBuf {
        self.base.join("logs")
    }
}

/// A work tree with its config and prompt inside, the log dir and the
/// trusted copies outside.
fn tree() -> Tree {
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(tmp.path()).unwrap();
    let root = base.join("repo");
    std::fs::create_dir_all(root.join("prompts")).unwrap();
    std::fs::write(root.join("prompts/main.md"), "the prompt\n").unwrap();
    let text = format!(
        "schema_version = 1\n[agent]\ncommand = [\"/bin/true\"]\nprompt_arg_template = []\nprompt_delivery = \"stdin\"\nplacement = \"container\"\n[runtime]\nwork_dir = \"{}\"\nlog_dir = \"{}\"\n[prompt]\nfile = \"./prompts/main.md\"\n",
        root.display(),
        base.join("logs").display()
    );
    let config = root.join("agent-runner.toml");
    std::fs::write(&config, &text).unwrap();
    Tree {
        store: base.join("state/trusted"),
        _tmp: tmp,
        base,
        root,
        config,
        text,
    }
}

fn refused(r: Result<Gated, RoundsError>) -> String {
    match r {
        Err(RoundsError::ControlChanged(c)) => {
            assert_eq!(
                RoundsError::ControlChanged(c.clone()).exit_code(),
                crate::exit::CONFIG
            );
            c.to_string()
        }
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("not refused"),
    }
}

#[test]
fn a_link_inside_the_tree_is_never_followed_and_the_users_links_outside_are() {
    let t = tree();
    let canary = t.base.join("host-secret");
    std::fs::write(&canary, "host canary\n").unwrap();
    std::os::unix::fs::symlink(&canary, t.root.join("stop")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", t.root.join("zero")).unwrap();
    std::os::unix::fs::symlink(&t.base, t.root.join("up")).unwrap();
    // The user's own link from outside the tree into it.
    let mine = t.base.join("my-prompt.md");
    std::os::unix::fs::symlink(t.root.join("prompts/main.md"), &mine).unwrap();

    assert_eq!(
        locate(&t.root, &mine).unwrap(),
        Place::Tree("prompts/main.md".into())
    );
    let (_, b) = read_file(&t.root, &mine, 100).unwrap().unwrap();
    assert_eq!(b, b"the prompt\n");
    for name in ["stop", "zero", "up/host-secret"] {
        let p = t.root.join(name);
        assert_eq!(locate(&t.root, &p).unwrap(), Place::Tree(name.into()));
        let e = read_file(&t.root, &p, 100).unwrap_err().to_string();
        assert!(!e.contains("host canary"), "{e}");
    }
    // `..` out of the tree is outside it, and read there as the user's.
    assert_eq!(
        locate(&t.root, &t.root.join("../host-secret")).unwrap(),
        Place::Outside(canary.clone())
    );
    // Too large is refused, a prefix is not.
    assert!(read_file(&t.root, &mine, 4).is_err());
    assert_eq!(read_prefix(&t.root, &mine, 4).unwrap().unwrap().1, b"the ");
}

#[test]
fn a_fifo_is_refused_at_once() {
    let t = tree();
    let fifo = t.root.join("STOP");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        fifo.as_path(),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let t0 = std::time::Instant::now();
    assert!(read_prefix(&t.root, &fifo, 200).is_err());
    assert!(read_prefix(&t.root, Path::new("STOP"), 200).is_err());
    assert!(t0.elapsed() < std::time::Duration::from_secs(2));
}

#[test]
fn a_config_changed_in_the_tree_is_refused_until_the_user_trusts_it() {
    let t = tree();
    let g = t.open(Use::Run).unwrap();
    assert_eq!(g.cfg.agent.placement, PlacementKind::Container);
    // Unchanged: it runs again.
    t.open(Use::Run).unwrap();
    let edited = t
        .text
        .replace("placement = \"container\"", "placement = \"host\"");
    std::fs::write(&t.config, &edited).unwrap();
    let m = refused(t.open(Use::Run));
    assert!(m.contains("agent-runner.toml"), "{m}");
    assert!(m.contains("placement = \\\"host\\\""), "{m}");
    assert!(m.contains("trust"), "{m}");
    // Reading the project goes by the trusted copy, not the edited file.
    let o = t.open(Use::Observe).unwrap();
    assert_eq!(o.cfg.agent.placement, PlacementKind::Container);
    // The user accepts it: it runs, as changed.
    let a = t.open(Use::Accept).unwrap();
    assert!(
        a.notes.iter().any(|n| n.contains("trusted as changed")),
        "{:?}",
        a.notes
    );
    let g = t.open(Use::Run).unwrap();
    assert_eq!(g.cfg.agent.placement, PlacementKind::Host);
}

#[test]
fn after_a_killed_round_the_trusted_copies_are_put_back_before_anything_is_read() {
    let t = tree();
    let g = t.open(Use::Run).unwrap();
    assert!(g.trust.refresh(&g.cfg).unwrap().is_empty());
    // belay is killed mid-round: its guard stays in the log dir, and the
    // agent has edited the config and linked the prompt to a host file.
    std::fs::create_dir_all(t.logs()).unwrap();
    std::fs::write(t.logs().join(crate::round::GUARD_FILE), "{}").unwrap();
    let edited = t
        .text
        .replace("placement = \"container\"", "placement = \"host\"");
    std::fs::write(&t.config, &edited).unwrap();
    std::fs::remove_file(t.root.join("prompts/main.md")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", t.root.join("prompts/main.md")).unwrap();
    let m = refused(t.open(Use::Run));
    assert!(m.contains("put back") || m.contains("back in place"), "{m}");
    assert!(m.contains("prompts/main.md"), "{m}");
    assert_eq!(std::fs::read_to_string(&t.config).unwrap(), t.text);
    let prompt = t.root.join("prompts/main.md");
    assert!(std::fs::symlink_metadata(&prompt).unwrap().is_file());
    assert_eq!(std::fs::read_to_string(&prompt).unwrap(), "the prompt\n");
    // The next start finds the trusted copies in place and goes on.
    let g = t.open(Use::Run).unwrap();
    assert_eq!(g.cfg.agent.placement, PlacementKind::Container);
}

#[test]
fn a_config_swapped_for_a_link_or_a_new_config_in_the_tree_is_refused() {
    let t = tree();
    let g = t.open(Use::Run).unwrap();
    g.trust.refresh(&g.cfg).unwrap();
    let evil = t.root.join("evil.toml");
    std::fs::write(
        &evil,
        t.text
            .replace("placement = \"container\"", "placement = \"host\""),
    )
    .unwrap();
    std::fs::rename(&t.config, t.root.join("moved.toml")).unwrap();
    std::os::unix::fs::symlink("evil.toml", &t.config).unwrap();
    let m = refused(t.open(Use::Run));
    assert!(m.contains("now leads to"), "{m}");
    // A config belay never trusted, in a tree it trusted files in.
    let m = refused(open_in(t.store(), &evil, Use::Run));
    assert!(m.contains("has not trusted this config"), "{m}");
    assert!(pending_in(t.store(), &evil).unwrap().is_some());
    // Put back, the config is trusted again.
    std::fs::remove_file(&t.config).unwrap();
    std::fs::rename(t.root.join("moved.toml"), &t.config).unwrap();
    assert!(pending_in(t.store(), &t.config).unwrap().is_none());
    t.open(Use::Run).unwrap();
}

#[test]
fn a_config_outside_the_tree_is_not_tracked() {
    let t = tree();
    let outside = t.base.join("outside.toml");
    std::fs::write(&outside, &t.text).unwrap();
    let g = open_in(t.store(), &outside, Use::Run).unwrap();
    assert!(g.trust.config_at.is_none());
    std::fs::write(
        &outside,
        t.text
            .replace("placement = \"container\"", "placement = \"host\""),
    )
    .unwrap();
    let g = open_in(t.store(), &outside, Use::Run).unwrap();
    assert_eq!(g.cfg.agent.placement, PlacementKind::Host);
}

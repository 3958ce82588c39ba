//! Where things are in a sandbox's container: one layout for every mode and
//! for the env builder's images, which are every mode's sandbox.

/// The directory the work lives under.
pub const WORKSPACE: &str = "/workspace";
/// The work tree: a mode's worktree is mounted here, and an env build's
/// image holds the project here.
pub const REPO: &str = "/workspace/repo";
/// [`REPO`]'s name in [`WORKSPACE`].
pub const REPO_NAME: &str = "repo";
/// The pipeline's artifacts, mounted outside the worktree.
pub const ARTIFACTS: &str = "/workspace/artifacts";
/// A job's further repositories, each mounted at `MORE/NAME`.
pub const MORE: &str = "/workspace/more";

/// Whether `name` directly under [`WORKSPACE`] is one belay works in or
/// mounts at: an image leaves it free (a link there would carry a mount
/// somewhere else).
pub fn reserved(name: &str) -> bool {
    [REPO, ARTIFACTS, MORE]
        .iter()
        .any(|p| p.strip_prefix(WORKSPACE).and_then(|r| r.strip_prefix('/')) == Some(name))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_mount_points_are_reserved() {
        for n in ["repo", "artifacts", "more"] {
            assert!(super::reserved(n), "{n}");
        }
        assert!(!super::reserved("mqemitter"));
        assert_eq!(
            super::REPO,
            format!("{}/{}", super::WORKSPACE, super::REPO_NAME)
        );
        assert!(!super::reserved(""));
    }
}

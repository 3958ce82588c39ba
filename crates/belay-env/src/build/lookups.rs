//! The lookups repair needs IO for, done before it proposes: the Debian
//! package of a missing shared library, from the mirror's Contents index.

use super::*;
use crate::debian_contents;
use crate::repair::{self, Lookups};

/// `ldd` over the shared objects under the project's virtualenv, its
/// `node_modules` (native addons are `*.node`) and the system's
/// site-packages, printing each library it cannot resolve that is not one
/// of those files itself (a wheel's own libraries, found through its rpath
/// at run time, are not missing).
const LDD_PROBE: &str = r#"find /workspace/repo/.venv /workspace/repo/node_modules /usr/local/lib /usr/lib/python3 -xdev \( -name '*.so' -o -name '*.so.*' -o -name '*.node' \) -type f 2>/dev/null | head -n 5000 | while read -r f; do echo "have ${f##*/}"; ldd "$f" 2>/dev/null | grep 'not found'; done | awk '$1 == "have" { h[$2] = 1; next } { m[$1] = 1 } END { for (k in m) if (!(k in h)) print k " => not found" }' | head -n 200"#;

impl Run<'_> {
    /// The libraries the loader cannot find for the shared objects in the
    /// build container (nothing when there is no container or `ldd` fails).
    async fn unresolved_in_container(&self) -> Vec<String> {
        let Some(cid) = self.pool.id().map(str::to_string) else {
            return Vec::new();
        };
        let exec = ExecSpec {
            argv: vec!["bash".into(), "-c".into(), LDD_PROBE.into()],
            working_dir: Some(REPO_DIR.to_string()),
            env: vec![],
            timeout: Some(Duration::from_secs(60)),
            log_path: self.dir.log_path("lookup", "ldd", 1),
            log_limit: Some(1 << 20),
        };
        match self
            .rt
            .exec(&cid, &exec, &self.redactor, &NoopObserver)
            .await
        {
            Ok(out) => repair::unresolved_sonames(&out.stdout_tail),
            Err(e) => {
                tracing::warn!("ldd in the build container failed: {e}");
                Vec::new()
            }
        }
    }

    /// What `text` needs looked up; a lookup that fails is noted, and the
    /// rule that needed it proposes nothing.
    pub(super) async fn lookups(&self, text: &str) -> Lookups {
        let mut sonames = repair::missing_sonames(text);
        if sonames.is_empty() {
            return Lookups::default();
        }
        // The failure names the first library the loader missed; the
        // container knows the rest.
        for s in self.unresolved_in_container().await {
            if !sonames.contains(&s) {
                sonames.push(s);
            }
        }
        self.packages_for(sonames).await
    }

    /// When no rule matches, a library the loader cannot find may still be
    /// the cause: a package that catches the ImportError (qtpy's "No Qt
    /// bindings could be found" over PyQt5's missing libGL) hides the name.
    /// `ldd` over the container's shared objects finds it: a proposal to
    /// install what ships every library it reports, unless already tried.
    pub(super) async fn hidden_libraries(
        &self,
        text: &str,
        tried: &[String],
    ) -> Option<repair::Proposal> {
        if !repair::may_hide_a_library(text) {
            return None;
        }
        let sonames = self.unresolved_in_container().await;
        if sonames.is_empty() {
            return None;
        }
        self.phase(
            "lookup",
            format!(
                "no rule matches; ldd finds {} unresolved: {}",
                sonames.len(),
                sonames.join(", ")
            ),
        );
        let found = self.packages_for(sonames).await;
        repair::propose_unresolved(&found, tried)
    }

    /// The Debian package of each library, from the mirror's Contents index.
    async fn packages_for(&self, sonames: Vec<String>) -> Lookups {
        let mut out = Lookups::default();
        let notes = self.ctx.runtime_notes.clone().unwrap_or_default();
        let Some(suite) = notes.debian_suite() else {
            self.phase(
                "lookup",
                format!(
                    "{} is missing, but the image ({}) is not a Debian suite belay can look packages up for",
                    sonames.join(", "),
                    notes.os_pretty
                ),
            );
            return out;
        };
        let arch = debian_contents::debian_arch(if notes.arch.is_empty() {
            std::env::consts::ARCH
        } else {
            &notes.arch
        })
        .to_string();
        let Some(mirror) = belay_sandbox::bootstrap::host_mirror(Path::new("/"), &suite) else {
            self.phase(
                "lookup",
                "no Debian mirror in the host's apt sources to fetch the Contents index from",
            );
            return out;
        };
        let cache = preflight_cache_dir(&self.dir.state_dir);
        match debian_contents::load(&cache, &mirror, &suite, &arch).await {
            Ok(idx) => {
                for s in sonames {
                    if let Some(pkg) = idx.package_for(&s) {
                        self.phase(
                            "lookup",
                            format!("{s} is shipped by {pkg} ({suite}/{arch})"),
                        );
                        out.sonames.insert(s, pkg.to_string());
                    } else {
                        self.phase("lookup", format!("no {suite} package ships {s}"));
                    }
                }
            }
            Err(e) => self.phase("lookup", e.to_string()),
        }
        out
    }
}

//! The lookups repair needs IO for, done before it proposes: the Debian
//! package of a missing shared library, from the mirror's Contents index.

use super::*;
use crate::debian_contents;
use crate::repair::{self, Lookups};

impl Run<'_> {
    /// What `text` needs looked up; a lookup that fails is noted, and the
    /// rule that needed it proposes nothing.
    pub(super) async fn lookups(&self, text: &str) -> Lookups {
        let mut out = Lookups::default();
        let sonames = repair::missing_sonames(text);
        if sonames.is_empty() {
            return out;
        }
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

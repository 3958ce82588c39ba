//! Which Debian package ships a shared library, from the mirror's Contents
//! index (`dists/<suite>/main/Contents-<arch>.gz`, every file of every
//! package).
//!
//! `ImportError: libGL.so.1: cannot open shared object file` names a file,
//! not a package; a hand list of sonames would always be short. The index is
//! fetched once per suite and architecture, reduced to the shared libraries
//! (file name -> packages), and cached on the machine; later lookups read the
//! reduced file only.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::EnvError;

/// The reduced index: shared library file name -> the packages that ship it.
#[derive(Debug, Default)]
pub struct SharedLibraries {
    map: BTreeMap<String, Vec<String>>,
}

/// The Debian architecture of a `uname -m`.
pub fn debian_arch(uname_m: &str) -> &str {
    match uname_m {
        "x86_64" | "amd64" => "amd64",
        "aarch64" | "arm64" => "arm64",
        "armv7l" | "armhf" => "armhf",
        "i686" | "i386" => "i386",
        "ppc64le" | "ppc64el" => "ppc64el",
        "s390x" => "s390x",
        other => other,
    }
}

/// Whether a Contents path is a shared library worth indexing.
fn is_shared_library(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("lib")
        && (name.ends_with(".so") || name.contains(".so."))
        && path.contains("lib/")
        && !path.contains("/debug/")
}

impl SharedLibraries {
    /// Reduce a decompressed Contents index (`path   section/pkg,section/pkg`).
    pub fn from_contents(r: impl BufRead) -> Result<Self, std::io::Error> {
        // (package, transitional), in the order the index lists them.
        let mut seen: BTreeMap<String, Vec<(String, bool)>> = BTreeMap::new();
        for line in r.lines() {
            let line = line?;
            let Some((path, pkgs)) = line.rsplit_once(char::is_whitespace) else {
                continue;
            };
            let path = path.trim_end();
            if !is_shared_library(path) {
                continue;
            }
            let name = path.rsplit('/').next().unwrap_or(path).to_string();
            let entry = seen.entry(name).or_default();
            for p in pkgs.split(',') {
                let (section, pkg) = p.rsplit_once('/').unwrap_or(("", p));
                // Debian package names only: the name goes into an apt command.
                let valid = pkg.len() > 1
                    && pkg.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && pkg
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c));
                if valid && !entry.iter().any(|(e, _)| e == pkg) {
                    entry.push((pkg.to_string(), section.ends_with("oldlibs")));
                }
            }
        }
        let map = seen
            .into_iter()
            .map(|(k, mut v)| {
                // Transitional packages (section oldlibs) last; the sort is stable.
                v.sort_by_key(|(_, old)| *old);
                (k, v.into_iter().map(|(p, _)| p).collect())
            })
            .collect();
        Ok(Self { map })
    }

    /// The package to install for `file` (`libGL.so.1` -> `libgl1`). A name
    /// ending in `.so.*` takes any version of the library (`libGL.so.*`),
    /// the lowest listed first.
    pub fn package_for(&self, file: &str) -> Option<&str> {
        if let Some(stem) = file.strip_suffix('*') {
            return self
                .map
                .range::<str, _>((std::ops::Bound::Included(stem), std::ops::Bound::Unbounded))
                .take_while(|(k, _)| k.starts_with(stem))
                .find_map(|(_, v)| v.first())
                .map(String::as_str);
        }
        self.map
            .get(file)
            .and_then(|v| v.first())
            .map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn write(&self, path: &Path) -> Result<(), EnvError> {
        let mut s = String::with_capacity(self.map.len() * 40);
        for (k, v) in &self.map {
            s.push_str(k);
            s.push('\t');
            s.push_str(&v.join(","));
            s.push('\n');
        }
        if let Some(d) = path.parent() {
            fs_err::create_dir_all(d).map_err(|e| EnvError::io("cannot create", d, e))?;
        }
        belay_record::atomic_write(path, s.as_bytes())?;
        Ok(())
    }

    fn read(path: &Path) -> Option<Self> {
        // host-owned: belay's cache dir (`debian-contents`, outside the mounted package caches).
        let text = fs_err::read_to_string(path).ok()?;
        let map = text
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .map(|(k, v)| (k.to_string(), v.split(',').map(String::from).collect()))
            .collect::<BTreeMap<_, _>>();
        (!map.is_empty()).then_some(Self { map })
    }
}

/// Where the reduced index of a suite and architecture is cached.
pub fn cache_file(cache_dir: &Path, suite: &str, arch: &str) -> PathBuf {
    cache_dir
        .join("debian-contents")
        .join(format!("{suite}-{arch}.shlibs.tsv"))
}

/// The reduced index for `suite`/`arch`: the cached one, or fetched from
/// `mirror` (and cached).
pub async fn load(
    cache_dir: &Path,
    mirror: &str,
    suite: &str,
    arch: &str,
) -> Result<SharedLibraries, EnvError> {
    let file = cache_file(cache_dir, suite, arch);
    if let Some(idx) = SharedLibraries::read(&file) {
        return Ok(idx);
    }
    let url = format!(
        "{}/dists/{suite}/main/Contents-{arch}.gz",
        mirror.trim_end_matches('/')
    );
    belay_model::init_tls();
    let fail = |why: String| {
        EnvError::Plan(format!(
        "cannot fetch the Debian Contents index {url}: {why}; the shared-library repair needs it once per suite (cached under {})",
        file.display()
    ))
    };
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(20))
        .timeout(Duration::from_secs(300))
        .build()
        .map_err(|e| fail(e.to_string()))?;
    let resp = http
        .get(&url)
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .map_err(|e| fail(e.to_string()))?;
    let body = resp.bytes().await.map_err(|e| fail(e.to_string()))?;
    // About 12 MB compressed; decompressed (about 1 GB) it is streamed, a line at a time.
    let idx = tokio::task::spawn_blocking(move || {
        let gz = flate2::read::GzDecoder::new(&body[..]);
        SharedLibraries::from_contents(std::io::BufReader::new(gz))
    })
    .await
    .map_err(|e| fail(e.to_string()))?
    .map_err(|e| fail(format!("the index is not valid gzip: {e}")))?;
    if idx.is_empty() {
        return Err(fail("it lists no shared libraries".into()));
    }
    idx.write(&file)?;
    Ok(idx)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
usr/lib/x86_64-linux-gnu/libGL.so.1                     libs/libgl1
usr/lib/x86_64-linux-gnu/libGL.so.1.7.0                 libs/libgl1
usr/lib/x86_64-linux-gnu/libgobject-2.0.so.0            libs/libglib2.0-0
usr/lib/debug/.build-id/ab/cdef.debug                   debug/libgl1-dbgsym
usr/lib/x86_64-linux-gnu/libfoo.so.2                    oldlibs/libfoo2-transitional,libs/libfoo2
usr/share/doc/libgl1/copyright                          libs/libgl1
usr/bin/python3.11                                      python/python3.11-minimal
usr/lib/x86_64-linux-gnu/libevil.so.1                   libs/x;rm-rf,libs/libevil1
";

    #[test]
    fn shared_libraries_map_to_their_packages() {
        let idx = SharedLibraries::from_contents(SAMPLE.as_bytes()).unwrap();
        assert_eq!(idx.package_for("libGL.so.1"), Some("libgl1"));
        assert_eq!(idx.package_for("libgobject-2.0.so.0"), Some("libglib2.0-0"));
        // A transitional package is never the first choice.
        assert_eq!(idx.package_for("libfoo.so.2"), Some("libfoo2"));
        assert_eq!(idx.package_for("copyright"), None);
        // A name that is no Debian package name is dropped.
        assert_eq!(idx.package_for("libevil.so.1"), Some("libevil1"));
        assert_eq!(idx.len(), 5);
    }

    #[test]
    fn a_library_named_without_its_version_takes_any_version() {
        let sample = format!(
            "{SAMPLE}usr/lib/x86_64-linux-gnu/libsqlite3.so                libdevel/libsqlite3-dev\n"
        );
        let idx = SharedLibraries::from_contents(sample.as_bytes()).unwrap();
        // pyglet's `Library "GL" not found` is looked up as libGL.so.*.
        assert_eq!(idx.package_for("libGL.so.*"), Some("libgl1"));
        assert_eq!(idx.package_for("libG.so.*"), None);
        // The linker's -lsqlite3 needs the development link.
        assert_eq!(idx.package_for("libsqlite3.so"), Some("libsqlite3-dev"));
    }

    #[test]
    fn the_reduced_index_round_trips_through_its_cache_file() {
        let d = tempfile::tempdir().unwrap();
        let f = cache_file(d.path(), "bookworm", "amd64");
        let idx = SharedLibraries::from_contents(SAMPLE.as_bytes()).unwrap();
        idx.write(&f).unwrap();
        let back = SharedLibraries::read(&f).unwrap();
        assert_eq!(back.package_for("libfoo.so.2"), Some("libfoo2"));
        assert_eq!(back.len(), idx.len());
    }

    #[test]
    fn architectures_are_named_as_debian_names_them() {
        assert_eq!(debian_arch("x86_64"), "amd64");
        assert_eq!(debian_arch("aarch64"), "arm64");
    }
}

//! `belay env gc --registry`: remove old runs' checkpoints from the registry,
//! by the same labels and age rules as on the engine.
//!
//! The Engine API cannot list or delete a registry's tags, so this speaks the
//! distribution API itself: the catalog, each repository's tags, each tag's
//! manifest and image config (for its labels and creation time), then a
//! DELETE of each manifest none of whose tags is to be kept. Deleting a
//! manifest removes every tag on it, the cache keys' too; the registry's own
//! `garbage-collect` then frees the blobs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use belay_sandbox::labels;
use serde::Serialize;

use super::CACHE_REPO;
use crate::gc::{run_of_tag, GcOptions};
use crate::EnvError;

const MANIFEST_TYPES: &str = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json";

#[derive(Debug, Clone, Default, Serialize)]
pub struct RegistryGcReport {
    pub registry: String,
    /// `repo:tag` of every tag that went (with its manifest).
    pub removed_tags: Vec<String>,
    pub kept_final: Vec<String>,
    /// Manifests deleted.
    pub removed_manifests: usize,
    pub skipped: Vec<String>,
    pub dry_run: bool,
}

/// One tag and what its image says of itself.
#[derive(Debug, Clone)]
struct TagInfo {
    repo: String,
    tag: String,
    digest: String,
    run: Option<String>,
    is_final: bool,
    removable: bool,
    created: i64,
}

struct Api {
    base: String,
    http: reqwest::Client,
    auth: Option<(String, String)>,
    registry: String,
}

impl Api {
    fn new(registry: &str) -> Result<Self, EnvError> {
        belay_model::init_tls();
        let host = registry.split('/').next().unwrap_or(registry);
        let name = host.rsplit_once(':').map(|(h, _)| h).unwrap_or(host);
        // As the engine does: plain HTTP to loopback, TLS to anything else.
        let scheme = if name == "localhost" || name.starts_with("127.") {
            "http"
        } else {
            "https"
        };
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| fail(registry, "connect", e.to_string()))?;
        Ok(Self {
            base: format!("{scheme}://{host}/v2"),
            http,
            auth: belay_sandbox::registry::credentials_for(host),
            registry: registry.to_string(),
        })
    }

    fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, format!("{}/{path}", self.base));
        match &self.auth {
            Some((u, p)) => r.basic_auth(u, Some(p)),
            None => r,
        }
    }

    async fn json(
        &self,
        path: &str,
        accept: Option<&str>,
    ) -> Result<(serde_json::Value, Option<String>), EnvError> {
        let (v, digest, _) = self.page(path, accept).await?;
        Ok((v, digest))
    }

    /// Every page of a paginated list (`_catalog`, `tags/list`): the values
    /// of `field` across pages, following the `Link: <…>; rel="next"` header.
    async fn list(&self, path: &str, field: &str) -> Result<Vec<String>, EnvError> {
        let mut out = Vec::new();
        let mut next = Some(path.to_string());
        let mut pages = 0;
        while let Some(p) = next.take() {
            pages += 1;
            if pages > 10_000 {
                return Err(fail(
                    &self.registry,
                    "list",
                    format!("{path}: more than 10000 pages"),
                ));
            }
            let (v, _, link) = self.page(&p, None).await?;
            out.extend(
                v[field]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|t| t.as_str())
                    .map(String::from),
            );
            next = link
                .as_deref()
                .and_then(|l| l.split_once('<'))
                .and_then(|(_, rest)| rest.split_once('>'))
                .map(|(url, _)| url.trim_start_matches("/v2/").to_string());
        }
        Ok(out)
    }

    async fn page(
        &self,
        path: &str,
        accept: Option<&str>,
    ) -> Result<(serde_json::Value, Option<String>, Option<String>), EnvError> {
        let mut r = self.req(reqwest::Method::GET, path);
        if let Some(a) = accept {
            r = r.header(reqwest::header::ACCEPT, a);
        }
        let resp = r
            .send()
            .await
            .map_err(|e| fail(&self.registry, "read", format!("GET {path}: {e}")))?;
        let status = resp.status();
        if status == reqwest::StatusCode::UNAUTHORIZED {
            return Err(fail(
                &self.registry,
                "read",
                format!("GET {path}: 401; token authentication is not supported here, only `docker login` basic credentials"),
            ));
        }
        if !status.is_success() {
            return Err(fail(
                &self.registry,
                "read",
                format!("GET {path}: HTTP {status}"),
            ));
        }
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(String::from)
        };
        let digest = header("docker-content-digest");
        let link = header("link").filter(|l| l.contains("rel=\"next\""));
        let v = resp
            .json()
            .await
            .map_err(|e| fail(&self.registry, "read", format!("GET {path}: not JSON: {e}")))?;
        Ok((v, digest, link))
    }

    /// Repositories whose names a belay build makes: `<prefix>…` under the
    /// registry's path, the base images and the cache keys.
    async fn repositories(&self) -> Result<Vec<String>, EnvError> {
        let all = self.list("_catalog?n=1000", "repositories").await?;
        let sub = self.registry.split_once('/').map(|(_, p)| format!("{p}/"));
        Ok(all
            .into_iter()
            .filter(|r| sub.as_ref().is_none_or(|s| r.starts_with(s.as_str())))
            .collect())
    }

    async fn tag_info(&self, repo: &str, tag: &str) -> Result<TagInfo, EnvError> {
        let (m, digest) = self
            .json(&format!("{repo}/manifests/{tag}"), Some(MANIFEST_TYPES))
            .await?;
        let digest = digest.ok_or_else(|| {
            fail(
                &self.registry,
                "read",
                format!("{repo}:{tag}: no Docker-Content-Digest"),
            )
        })?;
        let config = m["config"]["digest"].as_str().unwrap_or_default();
        let (c, _) = self.json(&format!("{repo}/blobs/{config}"), None).await?;
        let lbl: BTreeMap<String, String> = c["config"]["Labels"]
            .as_object()
            .map(|o| {
                o.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        let created = c["created"]
            .as_str()
            .and_then(|s| s.parse::<jiff::Timestamp>().ok())
            .map(|t| t.as_second());
        let kind = lbl.get(labels::KIND).map(String::as_str);
        let label_run = lbl.get(labels::RUN).filter(|r| !r.is_empty()).cloned();
        let ours = lbl.get(labels::BELAY).map(String::as_str) == Some("true");
        // An image without a creation time has no age: it is never removed.
        let removable = ours
            && created.is_some()
            && (kind == Some("checkpoint") || (kind == Some("base") && label_run.is_some()));
        let created = created.unwrap_or(i64::MAX);
        let (run, is_final) = if tag.starts_with("key-") || tag.starts_with("alt-") {
            (label_run, false)
        } else {
            match run_of_tag(tag) {
                Some((r, f)) => (Some(r), f),
                None => (None, false),
            }
        };
        Ok(TagInfo {
            repo: repo.to_string(),
            tag: tag.to_string(),
            digest,
            run,
            is_final,
            removable,
            created,
        })
    }

    async fn delete(&self, repo: &str, digest: &str) -> Result<(), EnvError> {
        let resp = self
            .req(
                reqwest::Method::DELETE,
                &format!("{repo}/manifests/{digest}"),
            )
            .send()
            .await
            .map_err(|e| fail(&self.registry, "delete", e.to_string()))?;
        match resp.status().as_u16() {
            200..=299 | 404 => Ok(()),
            405 => Err(fail(
                &self.registry,
                "delete",
                "the registry does not allow deletes (HTTP 405): set storage.delete.enabled: true in its config".into(),
            )),
            s => Err(fail(&self.registry, "delete", format!("{repo}@{digest}: HTTP {s}"))),
        }
    }
}

fn fail(registry: &str, op: &'static str, message: String) -> EnvError {
    belay_sandbox::SandboxError::Registry {
        op,
        image: registry.to_string(),
        message,
    }
    .into()
}

/// Remove old runs' checkpoints from `registry` (checked by
/// `parse_registry`), by the rules of [`crate::gc::gc`].
pub async fn gc(registry: &str, opts: &GcOptions) -> Result<RegistryGcReport, EnvError> {
    let api = Api::new(registry)?;
    let mut report = RegistryGcReport {
        registry: registry.to_string(),
        dry_run: opts.dry_run,
        ..Default::default()
    };
    let mut infos = Vec::new();
    let mut foreign: Vec<String> = Vec::new();
    for repo in api.repositories().await? {
        let tags = api
            .list(&format!("{repo}/tags/list?n=1000"), "tags")
            .await?;
        for tag in tags.iter().map(String::as_str) {
            // Cache keys in the cache repository; runs' names elsewhere.
            let in_cache = repo == CACHE_REPO || repo.ends_with(&format!("/{CACHE_REPO}"));
            let ours = if in_cache {
                tag.starts_with("key-") || tag.starts_with("alt-")
            } else {
                run_of_tag(tag).is_some()
            };
            if !ours {
                // Not a name belay made, but its manifest must outlive
                // belay's names for it.
                match api
                    .json(&format!("{repo}/manifests/{tag}"), Some(MANIFEST_TYPES))
                    .await
                {
                    Ok((_, Some(d))) => foreign.push(d),
                    Ok((_, None)) => report.skipped.push(format!("{repo}:{tag}: no digest")),
                    Err(e) => report.skipped.push(format!("{repo}:{tag}: {e}")),
                }
                continue;
            }
            match api.tag_info(&repo, tag).await {
                Ok(i) => infos.push(i),
                Err(e) => report.skipped.push(format!("{repo}:{tag}: {e}")),
            }
        }
    }
    let now = jiff::Timestamp::now().as_second();
    let wanted = |run: &str| opts.runs.is_empty() || opts.runs.iter().any(|r| r == run);
    // A run's age is that of its newest image, as on the engine.
    let mut newest: HashMap<String, i64> = HashMap::new();
    for i in infos.iter().filter(|i| i.removable) {
        if let Some(r) = &i.run {
            let e = newest.entry(r.clone()).or_insert(i.created);
            *e = (*e).max(i.created);
        }
    }
    let goes = |i: &TagInfo| -> bool {
        let Some(run) = &i.run else { return false };
        let age = now - newest.get(run).copied().unwrap_or(i.created);
        i.removable
            && wanted(run)
            && Duration::from_secs(age.max(0) as u64) >= opts.older_than
            && (!i.is_final || opts.include_final)
    };
    // A manifest goes only when no kept name anywhere has its digest: a
    // final image is a tag on its last checkpoint's manifest, a cache hit's
    // run names the first run's manifests, and a cache key in the cache
    // repository stays while any run still names its image.
    if !report.skipped.is_empty() {
        // A tag that could not be read might name a manifest that would go.
        return Err(fail(
            registry,
            "gc",
            format!(
                "{} tag(s) could not be read, so nothing was removed: {}",
                report.skipped.len(),
                report.skipped.join("; ")
            ),
        ));
    }
    let mut kept: BTreeSet<String> = foreign.into_iter().collect();
    for i in &infos {
        if !goes(i) {
            kept.insert(i.digest.clone());
            if i.is_final && i.removable && i.run.as_deref().is_some_and(wanted) {
                report.kept_final.push(format!("{}:{}", i.repo, i.tag));
            }
        }
    }
    let mut doomed: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for i in infos.iter().filter(|i| goes(i)) {
        if !kept.contains(&i.digest) {
            doomed
                .entry((i.repo.clone(), i.digest.clone()))
                .or_default()
                .push(format!("{}:{}", i.repo, i.tag));
        }
    }
    for ((repo, digest), tags) in doomed {
        if !opts.dry_run {
            if let Err(e) = api.delete(&repo, &digest).await {
                report.skipped.push(format!("{repo}@{digest}: {e}"));
                continue;
            }
        }
        report.removed_manifests += 1;
        report.removed_tags.extend(tags);
    }
    Ok(report)
}

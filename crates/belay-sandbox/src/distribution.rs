//! Reads and tags straight against an OCI registry (the distribution API), for
//! the two things the engine cannot do without downloading an image: read a
//! checkpoint's labels before any pull, and give an image that is only in the
//! registry another tag there.
//!
//! Layers never move through this client: pushes and pulls stay with the
//! engine ([`crate::registry`]). It moves a manifest and an image config, a
//! few KiB, which is what lets a build whose every block is a cache hit in the
//! registry finish without pulling anything (as BuildKit's registry cache
//! does when its output goes back to the registry).
//!
//! Plain HTTP is spoken only to the hosts the caller names (loopback, and the
//! engine's insecure registries); everything else is HTTPS with the system's
//! roots. Credentials are the `auths` entry of the Docker client's config, as
//! for the engine (credential helpers are read by neither). Where a read
//! fails, the caller falls back to the engine's own lookups and pulls.
//!
//! Authentication follows the registry's challenge: a request goes out bare
//! (or with what an earlier challenge of the same scope earned), and a 401's
//! `WWW-Authenticate` says what to do: Basic credentials, or a Bearer token
//! from the realm it names, kept per scope for the next requests. A registry
//! that needs nothing costs one request per request. (The oci-client crate
//! probes `/v2/` before every request of an anonymous client, which doubles
//! the round trips of exactly the lookups this module is for; hence these
//! few requests on reqwest.)

use std::collections::{BTreeMap, HashMap};

use base64::Engine as _;
use futures_util::StreamExt;
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use sha2::Digest as _;
use tokio::sync::Mutex;

use crate::registry::{credentials_for, registry_host, LOOKUP_TIMEOUT};
use crate::SandboxError;

/// The manifests belay's checkpoints have: the engine pushes Docker's schema
/// 2; an OCI manifest is read the same way.
pub const MANIFEST_TYPES: &[&str] = &[
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
];

/// The largest manifest or image config read. Both are a few KiB; anything
/// near this is not a checkpoint's.
pub const MAX_META_BYTES: usize = 4 << 20;

/// An image as the registry has it, read without downloading a layer.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RemoteImage {
    /// The manifest's digest.
    pub digest: String,
    /// The config's digest: the id the engine gives the image once pulled.
    pub id: String,
    pub labels: BTreeMap<String, String>,
    /// The layers' (compressed) bytes, from the manifest.
    pub layer_bytes: u64,
    /// The manifest as the registry has it, and its media type: another
    /// tag of the image is this, put under that tag.
    pub manifest: bytes::Bytes,
    pub media_type: String,
    /// The config's and the layers' digests, for mounting into another
    /// repository.
    pub blobs: Vec<String>,
    /// The config's creation time (RFC 3339), when it has one.
    pub created: Option<String>,
}

#[derive(Deserialize)]
struct Descriptor {
    digest: String,
    #[serde(default)]
    size: u64,
}

#[derive(Deserialize)]
struct Manifest {
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    config: Descriptor,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

#[derive(Deserialize, Default)]
struct ImageConfig {
    #[serde(default)]
    config: Option<ContainerConfig>,
    #[serde(default)]
    created: Option<String>,
}

#[derive(Deserialize, Default)]
struct ContainerConfig {
    #[serde(rename = "Labels", default)]
    labels: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize, Default)]
struct ErrorBody {
    #[serde(default)]
    errors: Vec<ErrorEntry>,
}

#[derive(Deserialize)]
struct ErrorEntry {
    #[serde(default)]
    code: String,
}

#[derive(Deserialize)]
struct TokenBody {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
}

/// An image reference split for the API: `host[:port]`, repository, tag.
#[derive(Debug, Clone, PartialEq)]
struct Name {
    host: String,
    repo: String,
    tag: String,
}

fn parse(image_ref: &str) -> Result<Name, SandboxError> {
    let bad = |why: &str| err("read", image_ref, format!("not an image reference: {why}"));
    let host = registry_host(image_ref).ok_or_else(|| bad("it names no registry"))?;
    let rest = &image_ref[host.len() + 1..];
    let (repo, tag) = rest.rsplit_once(':').ok_or_else(|| bad("it has no tag"))?;
    if repo.is_empty()
        || repo.contains('@')
        || tag.is_empty()
        || tag.contains('/')
        || !repo
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/".contains(c))
        || !tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    {
        return Err(bad(
            "its repository or tag has characters a registry refuses",
        ));
    }
    Ok(Name {
        host: host.to_string(),
        repo: repo.to_string(),
        tag: tag.to_string(),
    })
}

fn err(op: &'static str, image_ref: &str, e: impl std::fmt::Display) -> SandboxError {
    SandboxError::Registry {
        op,
        image: image_ref.to_string(),
        message: e.to_string(),
    }
}

/// The parameters of a `WWW-Authenticate` challenge: its scheme and its
/// `key="value"` pairs.
fn parse_challenge(h: &str) -> Option<(String, HashMap<String, String>)> {
    let h = h.trim();
    let (scheme, rest) = h.split_once(' ').unwrap_or((h, ""));
    let mut params = HashMap::new();
    let mut rest = rest.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let after = after.trim_start();
        let (value, tail) = if let Some(q) = after.strip_prefix('"') {
            let end = q.find('"')?;
            (&q[..end], &q[end + 1..])
        } else {
            after.split_once(',').map_or((after, ""), |(v, t)| (v, t))
        };
        params.insert(key.trim().to_ascii_lowercase(), value.to_string());
        rest = tail.trim_start_matches([',', ' ']);
    }
    Some((scheme.to_ascii_lowercase(), params))
}

/// A client of one registry.
pub struct Distribution {
    http: reqwest::Client,
    base: String,
    host: String,
    /// The `Authorization` header each scope earned, and the registry's
    /// (a Basic registry needs no scope).
    auth: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for Distribution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Distribution")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

const ANY_SCOPE: &str = "";

impl Distribution {
    /// A client of the registry `host` (`name[:port]`), over plain HTTP when
    /// `plain_http`.
    pub fn new(host: &str, plain_http: bool) -> Result<Self, SandboxError> {
        // The TLS stack is built without a default provider; belay's other
        // TLS clients install the same one.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            // A registry this machine cannot reach directly is found out
            // fast: the engine then does the lookups.
            .connect_timeout(std::time::Duration::from_secs(5))
            .timeout(LOOKUP_TIMEOUT)
            .user_agent(concat!("belay/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| err("read", host, format!("no HTTP client: {e}")))?;
        let scheme = if plain_http { "http" } else { "https" };
        Ok(Self {
            http,
            base: format!("{scheme}://{host}/v2"),
            host: host.to_string(),
            auth: Mutex::new(HashMap::new()),
        })
    }

    /// A client of `registry` (`host[:port][/prefix]`), speaking plain HTTP
    /// to a loopback host only.
    pub fn for_registry(registry: &str) -> Result<Self, SandboxError> {
        let host = registry.split('/').next().unwrap_or(registry);
        Self::new(host, is_loopback_host(host))
    }

    /// Every repository in the registry's catalog.
    pub async fn catalog(&self) -> Result<Vec<String>, SandboxError> {
        self.list("_catalog?n=1000", "repositories", "registry:catalog:*")
            .await
    }

    /// Every tag of `repo`.
    pub async fn tags(&self, repo: &str) -> Result<Vec<String>, SandboxError> {
        self.list(
            &format!("{repo}/tags/list?n=1000"),
            "tags",
            &format!("repository:{repo}:pull"),
        )
        .await
    }

    /// Every page of a paginated list: the values of `field` across pages,
    /// following the `Link: <…>; rel="next"` header.
    async fn list(
        &self,
        path: &str,
        field: &str,
        scope: &str,
    ) -> Result<Vec<String>, SandboxError> {
        let what = format!("{}/{path}", self.host);
        let mut out = Vec::new();
        let mut next = Some(path.to_string());
        let mut pages = 0;
        while let Some(p) = next.take() {
            pages += 1;
            if pages > 10_000 {
                return Err(err("list", &what, "more than 10000 pages"));
            }
            let url = format!("{}/{p}", self.base);
            let res = self.send(&what, scope, || self.http.get(&url)).await?;
            let status = res.status();
            let link = res
                .headers()
                .get("link")
                .and_then(|v| v.to_str().ok())
                .and_then(next_link);
            let body = read_limited(res, &what).await?;
            // A repository in the catalog whose last tag went meanwhile.
            if status == StatusCode::NOT_FOUND && codes(&body).iter().any(|c| c == "NAME_UNKNOWN") {
                return Ok(out);
            }
            if !status.is_success() {
                return Err(err("list", &what, refusal(status, &body)));
            }
            let v: serde_json::Value = serde_json::from_slice(&body)
                .map_err(|e| err("list", &what, format!("not JSON: {e}")))?;
            out.extend(
                v[field]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|t| t.as_str())
                    .map(String::from),
            );
            next = link.map(|url| {
                let u = url.split_once("/v2/").map_or(url.as_str(), |(_, r)| r);
                u.to_string()
            });
            if next.as_deref() == Some(p.as_str()) {
                return Err(err(
                    "list",
                    &what,
                    "the registry's next page is the same page",
                ));
            }
            if out.len() > 1_000_000 {
                return Err(err("list", &what, "more than a million names"));
            }
        }
        Ok(out)
    }

    /// The digest of whatever manifest `repo:tag` names (an image, a list or
    /// an index), or `None` when there is no such tag.
    pub async fn digest(&self, repo: &str, tag: &str) -> Result<Option<String>, SandboxError> {
        let what = format!("{}/{repo}:{tag}", self.host);
        let url = self.url(repo, &format!("manifests/{tag}"));
        let accept = [
            MANIFEST_TYPES[0],
            MANIFEST_TYPES[1],
            "application/vnd.docker.distribution.manifest.list.v2+json",
            "application/vnd.oci.image.index.v1+json",
        ]
        .join(", ");
        let res = self
            .send(&what, &format!("repository:{repo}:pull"), || {
                self.http
                    .get(&url)
                    .header(reqwest::header::ACCEPT, accept.as_str())
            })
            .await?;
        let status = res.status();
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let body = read_limited(res, &what).await?;
        if !status.is_success() {
            return Err(err("read", &what, refusal(status, &body)));
        }
        Ok(Some(format!(
            "sha256:{}",
            hex::encode(sha2::Sha256::digest(&body))
        )))
    }

    /// Delete the manifest `digest` from `repo` (every tag on it goes).
    /// Already gone counts as done.
    pub async fn delete_manifest(&self, repo: &str, digest: &str) -> Result<(), SandboxError> {
        let what = format!("{}/{repo}@{digest}", self.host);
        let url = self.url(repo, &format!("manifests/{digest}"));
        let res = self
            .send(&what, &format!("repository:{repo}:delete"), || {
                self.http.delete(&url)
            })
            .await?;
        match res.status().as_u16() {
            200..=299 | 404 => Ok(()),
            405 => Err(err(
                "delete",
                &what,
                "the registry does not allow deletes (HTTP 405): set storage.delete.enabled: true in its config",
            )),
            s => Err(err("delete", &what, format!("HTTP {s}"))),
        }
    }

    /// Send a request for `scope`, answering one authentication challenge.
    async fn send(
        &self,
        image_ref: &str,
        scope: &str,
        make: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, SandboxError> {
        let known = {
            let a = self.auth.lock().await;
            a.get(scope).or_else(|| a.get(ANY_SCOPE)).cloned()
        };
        let with = |h: &Option<String>| match h {
            Some(h) => make().header(reqwest::header::AUTHORIZATION, h),
            None => make(),
        };
        let res = with(&known)
            .send()
            .await
            .map_err(|e| err("read", image_ref, e))?;
        if res.status() != StatusCode::UNAUTHORIZED {
            return Ok(res);
        }
        let challenge = res
            .headers()
            .get(reqwest::header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_challenge);
        let creds = credentials_for(&self.host);
        let (key, header) =
            match challenge {
                Some((s, _)) if s == "basic" => {
                    let (u, p) = creds.ok_or_else(|| {
                        err(
                            "read",
                            image_ref,
                            "the registry wants credentials: docker login to it",
                        )
                    })?;
                    let b = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
                    (ANY_SCOPE.to_string(), format!("Basic {b}"))
                }
                Some((s, params)) if s == "bearer" => {
                    let realm = params.get("realm").ok_or_else(|| {
                        err(
                            "read",
                            image_ref,
                            "the registry's Bearer challenge names no realm",
                        )
                    })?;
                    let mut q: Vec<(&str, &str)> = Vec::new();
                    if let Some(svc) = params.get("service") {
                        q.push(("service", svc));
                    }
                    // One `scope` parameter per scope, as the engine sends them.
                    for sc in scope.split(' ').filter(|s| !s.is_empty()) {
                        q.push(("scope", sc));
                    }
                    let url = reqwest::Url::parse_with_params(realm, &q).map_err(|e| {
                        err("read", image_ref, format!("the token realm {realm:?}: {e}"))
                    })?;
                    // Credentials go to a token service over TLS, or in the clear
                    // only to the very host and port of a plain-HTTP registry.
                    let same_origin =
                        url.host_str()
                            .zip(url.port_or_known_default())
                            .is_some_and(|(h, p)| {
                                let origin = match p {
                                    80 => h.to_string(),
                                    p => format!("{h}:{p}"),
                                };
                                origin == self.host || format!("{h}:{p}") == self.host
                            });
                    let realm_ok = url.scheme() == "https"
                        || (self.base.starts_with("http://") && same_origin);
                    let mut req = self.http.get(url);
                    if let (Some((u, p)), true) = (&creds, realm_ok) {
                        req = req.basic_auth(u, Some(p));
                    }
                    let r = req
                        .send()
                        .await
                        .map_err(|e| err("read", image_ref, format!("token from {realm}: {e}")))?;
                    if !r.status().is_success() {
                        return Err(err(
                            "read",
                            image_ref,
                            format!("{realm} gave no token ({})", r.status()),
                        ));
                    }
                    let body = read_limited(r, image_ref).await?;
                    let t: TokenBody = serde_json::from_slice(&body)
                        .map_err(|e| err("read", image_ref, format!("{realm}'s token: {e}")))?;
                    let token = t.token.or(t.access_token).ok_or_else(|| {
                        err(
                            "read",
                            image_ref,
                            format!("{realm} answered without a token"),
                        )
                    })?;
                    (scope.to_string(), format!("Bearer {token}"))
                }
                _ => return Err(err(
                    "read",
                    image_ref,
                    "the registry refused the request (401) without a challenge belay can answer",
                )),
            };
        self.auth.lock().await.insert(key, header.clone());
        with(&Some(header))
            .send()
            .await
            .map_err(|e| err("read", image_ref, e))
    }

    fn url(&self, repo: &str, tail: &str) -> String {
        format!("{}/{repo}/{tail}", self.base)
    }

    /// The manifest of `n`: its bytes, digest and parse, or `None`.
    async fn manifest(
        &self,
        n: &Name,
        image_ref: &str,
    ) -> Result<Option<(bytes::Bytes, String, Manifest)>, SandboxError> {
        let url = self.url(&n.repo, &format!("manifests/{}", n.tag));
        let scope = format!("repository:{}:pull", n.repo);
        let res = self
            .send(image_ref, &scope, || {
                self.http
                    .get(&url)
                    .header(reqwest::header::ACCEPT, MANIFEST_TYPES.join(", "))
            })
            .await?;
        let status = res.status();
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let header_digest = res
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = read_limited(res, image_ref).await?;
        if !status.is_success() {
            if codes(&body)
                .iter()
                .any(|c| c == "MANIFEST_UNKNOWN" || c == "NAME_UNKNOWN")
            {
                return Ok(None);
            }
            return Err(err("read", image_ref, refusal(status, &body)));
        }
        let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&body)));
        if let Some(h) = header_digest.filter(|h| h.starts_with("sha256:") && *h != digest) {
            return Err(err(
                "read",
                image_ref,
                format!("its manifest hashes to {digest}, not to the {h} the registry says"),
            ));
        }
        let m: Manifest = serde_json::from_slice(&body).map_err(|e| {
            err(
                "read",
                image_ref,
                format!("its manifest is not an image manifest: {e}"),
            )
        })?;
        Ok(Some((bytes::Bytes::from(body), digest, m)))
    }

    /// The image `image_ref` names in its registry, with its labels, or
    /// `None` when the registry has no such tag. Nothing but the manifest
    /// and the config is read.
    pub async fn image(&self, image_ref: &str) -> Result<Option<RemoteImage>, SandboxError> {
        let n = parse(image_ref)?;
        let Some((manifest, digest, m)) = self.manifest(&n, image_ref).await? else {
            return Ok(None);
        };
        if m.config.size > MAX_META_BYTES as u64 {
            return Err(err(
                "read",
                image_ref,
                format!(
                    "its config is {} bytes, more than the {MAX_META_BYTES} a checkpoint's can be",
                    m.config.size
                ),
            ));
        }
        let url = self.url(&n.repo, &format!("blobs/{}", m.config.digest));
        let scope = format!("repository:{}:pull", n.repo);
        let res = self.send(image_ref, &scope, || self.http.get(&url)).await?;
        let status = res.status();
        let body = read_limited(res, image_ref).await?;
        if !status.is_success() {
            return Err(err("read", image_ref, refusal(status, &body)));
        }
        let id = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&body)));
        if id != m.config.digest {
            return Err(err(
                "read",
                image_ref,
                format!(
                    "its config hashes to {id}, not to the {} its manifest names",
                    m.config.digest
                ),
            ));
        }
        let config: ImageConfig = serde_json::from_slice(&body)
            .map_err(|e| err("read", image_ref, format!("its config is not JSON: {e}")))?;
        Ok(Some(RemoteImage {
            digest,
            id,
            created: config.created,
            labels: config.config.and_then(|c| c.labels).unwrap_or_default(),
            layer_bytes: m.layers.iter().fold(0u64, |a, l| a.saturating_add(l.size)),
            media_type: m
                .media_type
                .clone()
                .unwrap_or_else(|| MANIFEST_TYPES[1].to_string()),
            blobs: std::iter::once(m.config.digest.clone())
                .chain(m.layers.iter().map(|l| l.digest.clone()))
                .collect(),
            manifest,
        }))
    }

    async fn put_manifest(
        &self,
        d: &Name,
        dst: &str,
        image: &RemoteImage,
    ) -> Result<Result<(), Vec<String>>, SandboxError> {
        let url = self.url(&d.repo, &format!("manifests/{}", d.tag));
        let scope = format!("repository:{}:pull,push", d.repo);
        let res = self
            .send(dst, &scope, || {
                self.http
                    .put(&url)
                    .header(reqwest::header::CONTENT_TYPE, &image.media_type)
                    .body(image.manifest.clone())
            })
            .await?;
        let status = res.status();
        if status.is_success() {
            return Ok(Ok(()));
        }
        let body = read_limited(res, dst).await?;
        let c = codes(&body);
        if c.iter()
            .any(|c| c == "MANIFEST_BLOB_UNKNOWN" || c == "BLOB_UNKNOWN")
        {
            return Ok(Err(c));
        }
        Err(err("tag", dst, refusal(status, &body)))
    }

    /// Give `image`, read from `src`, the name `dst` too, in the same
    /// registry, without downloading it: its manifest is put under `dst`'s
    /// tag. A registry that does not have the blobs in `dst`'s repository
    /// yet (it refuses the manifest) gets them mounted from `src`'s, and the
    /// manifest again. Returns the digest.
    pub async fn tag(
        &self,
        src: &str,
        image: &RemoteImage,
        dst: &str,
    ) -> Result<String, SandboxError> {
        let (s, d) = (parse(src)?, parse(dst)?);
        if s.host != d.host || d.host != self.host {
            return Err(err("tag", dst, format!("{src} is in another registry")));
        }
        if self.put_manifest(&d, dst, image).await?.is_ok() {
            return Ok(image.digest.clone());
        }
        if s.repo == d.repo {
            return Err(err("tag", dst, "the registry lacks this image's layers"));
        }
        let scope = format!("repository:{}:pull,push repository:{}:pull", d.repo, s.repo);
        let mut urls = Vec::new();
        for b in &image.blobs {
            let u = reqwest::Url::parse_with_params(
                &self.url(&d.repo, "blobs/uploads/"),
                &[("mount", b.as_str()), ("from", s.repo.as_str())],
            )
            .map_err(|e| err("tag", dst, e))?;
            urls.push((b, u));
        }
        let from = s.repo.as_str();
        let mounts = urls.into_iter().map(|(b, url)| {
            let scope = scope.clone();
            async move {
                let res = self
                    .send(dst, &scope, || self.http.request(Method::POST, url.clone()))
                    .await?;
                // 201: mounted. 202 would be an upload started instead.
                if res.status() == StatusCode::CREATED {
                    Ok(())
                } else {
                    Err(err(
                        "tag",
                        dst,
                        format!(
                            "the registry would not mount {b} from {from} ({})",
                            res.status()
                        ),
                    ))
                }
            }
        });
        for r in futures_util::future::join_all(mounts).await {
            r?;
        }
        match self.put_manifest(&d, dst, image).await? {
            Ok(()) => Ok(image.digest.clone()),
            Err(codes) => Err(err(
                "tag",
                dst,
                format!(
                    "the registry still refuses the manifest: {}",
                    codes.join(", ")
                ),
            )),
        }
    }
}

/// The URL of a `Link` header's `rel="next"` entry.
fn next_link(header: &str) -> Option<String> {
    header.split(',').find_map(|entry| {
        let (url, params) = entry.trim().split_once(';')?;
        let url = url.trim().strip_prefix('<')?.strip_suffix('>')?;
        params
            .split(';')
            .any(|p| p.trim().replace(' ', "") == "rel=\"next\"")
            .then(|| url.to_string())
    })
}

/// A response body, refusing more than [`MAX_META_BYTES`].
async fn read_limited(res: reqwest::Response, image_ref: &str) -> Result<Vec<u8>, SandboxError> {
    let mut body = Vec::new();
    let mut stream = res.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| err("read", image_ref, e))?;
        if body.len() + chunk.len() > MAX_META_BYTES {
            return Err(err(
                "read",
                image_ref,
                format!("the registry's answer is larger than {MAX_META_BYTES} bytes"),
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The error codes of a registry's error body.
fn codes(body: &[u8]) -> Vec<String> {
    serde_json::from_slice::<ErrorBody>(body)
        .unwrap_or_default()
        .errors
        .into_iter()
        .map(|e| e.code)
        .collect()
}

fn refusal(status: StatusCode, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(300)])
        .trim()
        .to_string();
    format!("the registry answered {status}: {text}")
}

/// Whether `host` (`name[:port]`) is a loopback address, which the engine
/// speaks plain HTTP to by default.
pub fn is_loopback_host(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((n, p)) if p.chars().all(|c| c.is_ascii_digit()) => n,
        _ => host,
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    name == "localhost"
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for h in [
            "127.0.0.1:5000",
            "localhost:5000",
            "localhost",
            "127.1.2.3",
            "[::1]:5000",
        ] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "reg.example:5000",
            "10.0.0.1:5000",
            "127.0.0.1.example:5000",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }

    #[test]
    fn names_and_challenges_parse() {
        assert_eq!(
            parse("127.0.0.1:5000/team/belay-cache:key-ab12").unwrap(),
            Name {
                host: "127.0.0.1:5000".into(),
                repo: "team/belay-cache".into(),
                tag: "key-ab12".into()
            }
        );
        for bad in [
            "belay:x",
            "127.0.0.1:5000/belay",
            "127.0.0.1:5000/Belay:x",
            "127.0.0.1:5000/b:x/y",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let (s, p) = parse_challenge(
            r#"Bearer realm="https://auth.example/token",service="reg.example",scope="repository:belay:pull""#,
        )
        .unwrap();
        assert_eq!(s, "bearer");
        assert_eq!(p["realm"], "https://auth.example/token");
        assert_eq!(p["service"], "reg.example");
        assert_eq!(p["scope"], "repository:belay:pull");
        let (s, p) = parse_challenge(r#"Basic realm="Registry Realm""#).unwrap();
        assert_eq!(
            (s.as_str(), p["realm"].as_str()),
            ("basic", "Registry Realm")
        );
        assert_eq!(
            codes(br#"{"errors":[{"code":"MANIFEST_BLOB_UNKNOWN","message":"x"}]}"#),
            ["MANIFEST_BLOB_UNKNOWN"]
        );
        assert!(codes(b"<html>").is_empty());
        assert_eq!(
            next_link(
                r#"</v2/_catalog?last=a&n=2>; rel="prev", </v2/_catalog?last=b&n=2>; rel="next""#
            )
            .as_deref(),
            Some("/v2/_catalog?last=b&n=2")
        );
        assert_eq!(next_link(r#"</v2/x>; rel="prev""#), None);
    }

    #[test]
    fn manifests_and_configs_parse() {
        let m: Manifest = serde_json::from_str(
            r#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json",
                "config":{"mediaType":"application/vnd.docker.container.image.v1+json","size":7,"digest":"sha256:c"},
                "layers":[{"size":10,"digest":"sha256:a"},{"size":5,"digest":"sha256:b"}]}"#,
        )
        .unwrap();
        assert_eq!(m.layers.iter().map(|l| l.size).sum::<u64>(), 15);
        assert_eq!(m.config.digest, "sha256:c");
        let c: ImageConfig =
            serde_json::from_str(r#"{"config":{"Labels":{"belay.block":"10-x"}},"rootfs":{}}"#)
                .unwrap();
        assert_eq!(
            c.config.and_then(|c| c.labels).unwrap()["belay.block"],
            "10-x"
        );
        let none: ImageConfig = serde_json::from_str(r#"{"config":{"Labels":null}}"#).unwrap();
        assert!(none.config.and_then(|c| c.labels).is_none());
    }
}

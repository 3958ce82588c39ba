use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::Value;

use crate::dialect::{self, StreamState};
use crate::error::ModelError;
use crate::keys::Secret;
use crate::sse::SseParser;
use crate::types::{Api, Request, Response};
use crate::usage::{CallRecord, UsageLedger};

/// How to reach a model.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub api: Api,
    /// `https://api.openai.com/v1`, `http://127.0.0.1:8081/v1`...
    pub base_url: String,
    pub model: String,
    pub key: Option<Secret>,
    /// Stream replies over SSE.
    pub stream: bool,
    /// Further attempts after the first (`--llm-retries`).
    pub retries: u32,
    /// The first backoff (`--llm-retry-delay`); doubled each retry, with jitter.
    pub retry_delay: Duration,
    /// Give up on a stream (or a reply body) that sends nothing for this long.
    pub idle_timeout: Duration,
    /// The whole call, retries included (`--llm-timeout`). None: no limit.
    pub timeout: Option<Duration>,
    /// A cap on output tokens for every request (`--llm-max-output-tokens`).
    pub max_output_tokens: Option<u32>,
}

impl ClientConfig {
    pub fn new(api: Api, base_url: &str, model: &str) -> Self {
        ClientConfig {
            api,
            base_url: base_url.to_string(),
            model: model.to_string(),
            key: None,
            stream: true,
            retries: 3,
            retry_delay: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(120),
            timeout: None,
            max_output_tokens: None,
        }
    }

    /// The public endpoint of a dialect.
    pub fn default_base_url(api: Api) -> &'static str {
        match api {
            Api::Anthropic => "https://api.anthropic.com",
            Api::Gemini => "https://generativelanguage.googleapis.com",
            Api::Responses | Api::ChatCompletions => "https://api.openai.com/v1",
        }
    }
}

/// The longest backoff, whatever `Retry-After` or doubling says.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// How much of an error body is kept in the error.
const ERROR_BODY_MAX: usize = 2048;
/// The largest whole (non-streamed) reply accepted.
const MAX_REPLY: u64 = 64 * 1024 * 1024;

/// Read at most `max` bytes of a body (the rest is dropped unread).
async fn read_capped(resp: reqwest::Response, max: usize) -> String {
    let mut out: Vec<u8> = Vec::new();
    let mut s = resp.bytes_stream();
    while let Some(Ok(c)) = s.next().await {
        let room = max.saturating_sub(out.len());
        out.extend_from_slice(&c[..c.len().min(room)]);
        if out.len() >= max {
            break;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `scheme://user:pass@host` -> `scheme://***@host`, anywhere in a text.
pub(crate) fn strip_url_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c == '/' || c.is_whitespace() || c == '"')
            .unwrap_or(tail.len());
        match tail[..end].rfind('@') {
            Some(at) => {
                out.push_str("***");
                rest = &tail[at..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    out
}

/// A model client: one dialect, one endpoint, shared usage ledger.
#[derive(Debug, Clone)]
pub struct ModelClient {
    cfg: ClientConfig,
    url: String,
    http: reqwest::Client,
    ledger: Arc<UsageLedger>,
}

fn is_loopback(url: &str) -> bool {
    let host = url
        .split_once("://")
        .map(|(_, r)| r)
        .unwrap_or(url)
        .split(['/', '?'])
        .next()
        .unwrap_or("");
    let host = host.rsplit_once('@').map(|(_, h)| h).unwrap_or(host);
    host.starts_with("127.") || host.starts_with("localhost") || host.starts_with("[::1]")
}

impl ModelClient {
    pub fn new(cfg: ClientConfig, ledger: Arc<UsageLedger>) -> Result<Self, ModelError> {
        crate::init_tls();
        if !cfg.base_url.starts_with("http://") && !cfg.base_url.starts_with("https://") {
            return Err(ModelError::Config(format!(
                "the model base URL `{}` must start with http:// or https://",
                cfg.base_url
            )));
        }
        let mut b = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .read_timeout(cfg.idle_timeout)
            .user_agent(concat!("belay/", env!("CARGO_PKG_VERSION")));
        if is_loopback(&cfg.base_url) {
            b = b.no_proxy();
        }
        let http = b
            .build()
            .map_err(|e| ModelError::Config(format!("cannot set up HTTP: {e}")))?;
        Ok(ModelClient {
            url: dialect::call_url(cfg.api, &cfg.base_url, &cfg.model, cfg.stream),
            cfg,
            http,
            ledger,
        })
    }

    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    pub fn ledger(&self) -> &Arc<UsageLedger> {
        &self.ledger
    }

    /// One model call, retried on 429, 5xx, connection errors and dropped or
    /// stalled streams. Every call (and its failure) goes into the ledger.
    pub async fn complete(&self, req: &Request, purpose: &str) -> Result<Response, ModelError> {
        let t0 = Instant::now();
        let mut attempts = 0u32;
        let work = async {
            loop {
                attempts += 1;
                match self.once(req).await {
                    Ok(r) => return Ok(r),
                    Err(e) if e.retryable() && attempts <= self.cfg.retries => {
                        let wait = self.backoff(attempts, e.retry_after());
                        tracing::warn!(
                            "model call failed ({e}); retry {attempts}/{} in {:.1}s",
                            self.cfg.retries,
                            wait.as_secs_f64()
                        );
                        tokio::time::sleep(wait).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let result = match self.cfg.timeout {
            Some(limit) => tokio::time::timeout(limit, work)
                .await
                .unwrap_or(Err(ModelError::Timeout(limit))),
            None => work.await,
        };
        let mut result = result;
        if let Ok(r) = &mut result {
            // Some local servers send no usage (llama.cpp when streaming):
            // estimate it (4 bytes a token) rather than count the call as free.
            if r.usage.input_tokens == 0 && r.usage.output_tokens == 0 {
                let sent = serde_json::to_string(&req.messages)
                    .map(|s| s.len())
                    .unwrap_or(0)
                    + req.instructions.as_ref().map(String::len).unwrap_or(0);
                let got = r.text.len()
                    + r.tool_calls
                        .iter()
                        .map(|c| c.arguments.len() + c.name.len())
                        .sum::<usize>();
                r.usage.input_tokens = (sent / 4) as u64;
                r.usage.output_tokens = (got / 4).max(1) as u64;
                r.usage_estimated = true;
            }
        }
        let (usage, error) = match &result {
            Ok(r) => (r.usage, None),
            Err(e) => (Default::default(), Some(self.scrub(&e.to_string()))),
        };
        let rec = CallRecord {
            at: belay_record::now_rfc3339(),
            purpose: purpose.to_string(),
            usage_estimated: result.as_ref().is_ok_and(|r| r.usage_estimated),
            ok: result.is_ok(),
            attempts,
            latency_ms: (t0.elapsed().as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0,
            usage,
            error,
        };
        if let Err(e) = self.ledger.record(rec) {
            tracing::warn!("cannot write the model usage file: {e}");
        }
        result
    }

    /// The wait before retry number `n` (1-based): `Retry-After` when the
    /// server sent one, else `retry_delay * 2^(n-1)` with ±25% jitter.
    pub fn backoff(&self, n: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(ra) = retry_after {
            return ra.min(MAX_BACKOFF);
        }
        let doubled =
            self.cfg.retry_delay.as_secs_f64() * f64::from(1u32 << n.saturating_sub(1).min(16));
        let jitter = 0.75 + fastrand::f64() * 0.5;
        let secs = (doubled * jitter).min(MAX_BACKOFF.as_secs_f64());
        Duration::try_from_secs_f64(secs).unwrap_or(MAX_BACKOFF)
    }

    /// The key and any URL credentials out of a text that may be recorded.
    fn scrub(&self, text: &str) -> String {
        let text = strip_url_credentials(text);
        match &self.cfg.key {
            Some(k) if k.expose().len() >= 4 => text.replace(k.expose(), "***"),
            _ => text,
        }
    }

    async fn once(&self, req: &Request) -> Result<Response, ModelError> {
        let rb = self.request_builder(req);
        let url = self.url.clone();
        let resp = rb.send().await.map_err(|e| ModelError::Connect {
            url: url.clone(),
            message: self.scrub(&error_chain(&e)),
        })?;
        let status = resp.status();
        if !status.is_success() {
            return Err(self.http_error(url, status, resp).await);
        }
        if !self.cfg.stream {
            return self.read_whole(url, resp).await;
        }
        self.read_stream(url, resp).await
    }

    /// The request for `req` in the dialect: capped output, the key, the
    /// stream header.
    fn request_builder(&self, req: &Request) -> reqwest::RequestBuilder {
        let capped;
        let req = match (req.max_output_tokens, self.cfg.max_output_tokens) {
            (_, None) => req,
            (Some(r), Some(c)) if r <= c => req,
            (_, Some(c)) => {
                capped = Request {
                    max_output_tokens: Some(c),
                    ..req.clone()
                };
                &capped
            }
        };
        let mut body = dialect::body(self.cfg.api, req, &self.cfg.model, self.cfg.stream);
        // OpenAI's own Chat Completions refuses `max_tokens` for reasoning
        // models; local servers know only `max_tokens`.
        if self.cfg.api == Api::ChatCompletions && self.cfg.base_url.contains("api.openai.com") {
            if let Some(o) = body.as_object_mut() {
                if let Some(v) = o.remove("max_tokens") {
                    o.insert("max_completion_tokens".into(), v);
                }
            }
        }
        let mut rb = self.http.post(&self.url).json(&body);
        match (self.cfg.api, &self.cfg.key) {
            (Api::Anthropic, key) => {
                rb = rb.header("anthropic-version", "2023-06-01");
                if let Some(k) = key {
                    rb = rb.header("x-api-key", k.expose());
                }
            }
            // In a header, never in the URL's `?key=`, where errors would show it.
            (Api::Gemini, Some(k)) => rb = rb.header("x-goog-api-key", k.expose()),
            (_, Some(k)) => rb = rb.bearer_auth(k.expose()),
            (_, None) => {}
        }
        if self.cfg.stream {
            rb = rb.header("accept", "text/event-stream");
        }
        rb
    }

    /// The error of a reply that is not a success: the server's message,
    /// scrubbed and cut, and its `Retry-After`.
    async fn http_error(
        &self,
        url: String,
        status: reqwest::StatusCode,
        resp: reqwest::Response,
    ) -> ModelError {
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .and_then(|s| Duration::try_from_secs_f64(s.min(MAX_BACKOFF.as_secs_f64())).ok());
        let text = read_capped(resp, ERROR_BODY_MAX * 8).await;
        let msg = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| dialect::error_message(&v))
            .unwrap_or(text);
        let mut msg = self.scrub(&msg);
        if msg.len() > ERROR_BODY_MAX {
            let mut cut = ERROR_BODY_MAX;
            while !msg.is_char_boundary(cut) {
                cut -= 1;
            }
            msg.truncate(cut);
        }
        ModelError::Http {
            url,
            status: status.as_u16(),
            body: msg,
            retry_after,
        }
    }

    /// A whole (not streamed) reply, at most `MAX_REPLY` bytes.
    async fn read_whole(
        &self,
        url: String,
        resp: reqwest::Response,
    ) -> Result<Response, ModelError> {
        if resp.content_length().is_some_and(|n| n > MAX_REPLY) {
            return Err(ModelError::Decode {
                url,
                message: format!("the reply is larger than {MAX_REPLY} bytes"),
            });
        }
        let bytes = resp.bytes().await.map_err(|e| {
            if e.is_timeout() {
                ModelError::Idle {
                    url: url.clone(),
                    idle: self.cfg.idle_timeout,
                }
            } else {
                ModelError::Stream {
                    url: url.clone(),
                    message: error_chain(&e),
                }
            }
        })?;
        if bytes.len() as u64 > MAX_REPLY {
            return Err(ModelError::Decode {
                url,
                message: format!("the reply is larger than {MAX_REPLY} bytes"),
            });
        }
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| ModelError::Decode {
            url: url.clone(),
            message: format!("the reply is not JSON ({e})"),
        })?;
        dialect::parse(self.cfg.api, &v).map_err(|e| ModelError::Decode { url, message: e.0 })
    }

    /// A streamed reply, event by event, each chunk within the idle timeout.
    async fn read_stream(
        &self,
        url: String,
        resp: reqwest::Response,
    ) -> Result<Response, ModelError> {
        let mut state = StreamState::new(self.cfg.api);
        let mut parser = SseParser::new();
        let mut events = Vec::new();
        let mut stream = resp.bytes_stream();
        loop {
            let next = tokio::time::timeout(self.cfg.idle_timeout, stream.next()).await;
            let chunk = match next {
                Err(_) => {
                    return Err(ModelError::Idle {
                        url,
                        idle: self.cfg.idle_timeout,
                    })
                }
                Ok(None) => break,
                Ok(Some(Err(e))) if e.is_timeout() => {
                    return Err(ModelError::Idle {
                        url,
                        idle: self.cfg.idle_timeout,
                    })
                }
                Ok(Some(Err(e))) => {
                    return Err(ModelError::Stream {
                        url,
                        message: error_chain(&e),
                    })
                }
                Ok(Some(Ok(c))) => c,
            };
            parser
                .feed(&chunk, &mut events)
                .map_err(|e| ModelError::Decode {
                    url: url.clone(),
                    message: e.to_string(),
                })?;
            for ev in events.drain(..) {
                match state.on_event(&ev) {
                    Ok(true) => return Ok(state.into_response()),
                    Ok(false) => {}
                    // An error event inside the stream (overloaded, rate
                    // limited, a server error) or a broken event: retried.
                    Err(message) => {
                        return Err(ModelError::Stream {
                            url,
                            message: self.scrub(&message.0),
                        })
                    }
                }
            }
        }
        let _ = parser.finish(&mut events);
        for ev in events.drain(..) {
            if let Ok(true) = state.on_event(&ev) {
                return Ok(state.into_response());
            }
        }
        if state.usable_without_end() {
            return Ok(state.into_response());
        }
        Err(ModelError::Stream {
            url,
            message: "the connection closed before the completion event".into(),
        })
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// Everything needed to make clients for a run: where, which model, prices.
/// The ledger (and so `llm-usage.json`) is made per run, where its path is known.
#[derive(Debug, Clone)]
pub struct ModelSetup {
    pub config: ClientConfig,
    pub prices: crate::PriceTable,
}

impl ModelSetup {
    /// A client whose usage goes to `usage_path` (None: memory only).
    pub fn client(
        &self,
        usage_path: Option<std::path::PathBuf>,
    ) -> Result<ModelClient, ModelError> {
        let ledger = Arc::new(UsageLedger::new(
            usage_path,
            self.config.api,
            &self.config.model,
            &self.config.base_url,
            &self.prices,
        ));
        ModelClient::new(self.config.clone(), ledger)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Gemini: the model and the method in the path, the key in
    /// `x-goog-api-key` (not a bearer token, not `?key=` in the URL).
    #[test]
    fn a_gemini_call_names_the_model_in_its_path_and_the_key_in_its_header() {
        for (stream, tail) in [
            (true, "gemini-2.5-pro:streamGenerateContent?alt=sse"),
            (false, "gemini-2.5-pro:generateContent"),
        ] {
            let mut cfg = ClientConfig::new(
                Api::Gemini,
                ClientConfig::default_base_url(Api::Gemini),
                "gemini-2.5-pro",
            );
            cfg.stream = stream;
            cfg.key = Some(Secret::new("g-key-123"));
            let ledger = Arc::new(UsageLedger::new(
                None,
                Api::Gemini,
                "gemini-2.5-pro",
                "x",
                &crate::PriceTable::default(),
            ));
            let c = ModelClient::new(cfg, ledger).unwrap();
            let r = c
                .request_builder(&Request {
                    messages: vec![crate::Message::user("hi")],
                    ..Default::default()
                })
                .build()
                .unwrap();
            assert_eq!(
                r.url().as_str(),
                format!("https://generativelanguage.googleapis.com/v1beta/models/{tail}")
            );
            assert_eq!(r.headers()["x-goog-api-key"], "g-key-123");
            assert!(r.headers().get("authorization").is_none());
            let body: Value =
                serde_json::from_slice(r.body().unwrap().as_bytes().unwrap()).unwrap();
            assert_eq!(body["contents"][0]["parts"][0]["text"], "hi");
        }
    }
}

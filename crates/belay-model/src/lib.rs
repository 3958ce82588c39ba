//! Model clients and the scripted model server.
//!
//! * [`ModelClient`]: one client for four wire dialects ([`Api`]): OpenAI
//!   Responses, OpenAI Chat Completions, Anthropic Messages and Google
//!   Gemini, streaming over SSE or not, with tool calling, retries (backoff,
//!   jitter, `Retry-After`), an idle-stream timeout and an optional overall
//!   timeout.
//! * [`UsageLedger`]: tokens, requests, retries, latency and cost, written to
//!   `llm-usage.json` after every call.
//! * [`keys`]: API keys from the environment or a local `.env`, never from files
//!   belay writes.
//! * [`replay`]: `belay model replay`, a server that answers all four dialects
//!   from a script, and logs every request it receives.

mod client;
pub mod dialect;
mod error;
pub mod keys;
pub mod provider;
pub mod replay;
pub mod resolve;
pub mod sse;
mod types;
mod usage;

pub use client::{ClientConfig, ModelClient, ModelSetup};
pub use error::ModelError;
pub use keys::Secret;
pub use types::{Api, Message, Request, Response, ToolCall, ToolSpec, Usage};
pub use usage::{CallRecord, PriceTable, Prices, UsageLedger, UsageReport};

/// Install the process-wide TLS crypto provider (ring). Idempotent; clients call
/// it before they build their HTTP stack.
pub fn init_tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

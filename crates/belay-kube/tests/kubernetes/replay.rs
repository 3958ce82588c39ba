//! A `tower::Service` that answers kube-rs from a file of API server
//! exchanges, in order, and checks that each request is the one expected.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::Value;

/// One request and the server's answer.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Exchange {
    pub method: String,
    pub path: String,
    /// `key=value` pairs the query must have (`watch=true`, `resourceVersion=12`).
    #[serde(default)]
    pub query: Vec<String>,
    /// JSON pointers into the request body and the values they must have.
    #[serde(default)]
    pub body: serde_json::Map<String, Value>,
    pub status: u16,
    /// A JSON answer.
    #[serde(default)]
    pub response: Option<Value>,
    /// A watch answer: one JSON event per line.
    #[serde(default)]
    pub events: Vec<Value>,
}

#[derive(Clone)]
pub struct Replay {
    pending: Arc<Mutex<std::collections::VecDeque<Exchange>>>,
    pub seen: Arc<Mutex<Vec<(String, String, Value)>>>,
    pub mismatches: Arc<Mutex<Vec<String>>>,
}

impl Replay {
    pub fn from_file(path: &str) -> Self {
        let text = std::fs::read_to_string(path).unwrap();
        let list: Vec<Exchange> = serde_json::from_str(&text).unwrap();
        Self {
            pending: Arc::new(Mutex::new(list.into())),
            seen: Arc::default(),
            mismatches: Arc::default(),
        }
    }

    pub fn left(&self) -> usize {
        self.pending.lock().unwrap().len()
    }

    pub fn client(&self, ns: &str) -> kube::Client {
        kube::Client::new(self.clone(), ns)
    }
}

type BoxFut = Pin<
    Box<dyn Future<Output = Result<http::Response<kube::client::Body>, std::io::Error>> + Send>,
>;

impl tower::Service<http::Request<kube::client::Body>> for Replay {
    type Response = http::Response<kube::client::Body>;
    type Error = std::io::Error;
    type Future = BoxFut;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let me = self.clone();
        Box::pin(async move {
            let method = req.method().to_string();
            let path = req.uri().path().to_string();
            let query = req.uri().query().unwrap_or("").to_string();
            let bytes = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            me.seen
                .lock()
                .unwrap()
                .push((method.clone(), format!("{path}?{query}"), body.clone()));
            let next = me.pending.lock().unwrap().pop_front();
            let Some(ex) = next else {
                me.mismatches
                    .lock()
                    .unwrap()
                    .push(format!("unexpected {method} {path}?{query}"));
                return Ok(http::Response::builder()
                    .status(500)
                    .body(kube::client::Body::from(Vec::new()))
                    .unwrap());
            };
            let mut wrong = Vec::new();
            if ex.method != method || ex.path != path {
                wrong.push(format!(
                    "expected {} {}, got {method} {path}",
                    ex.method, ex.path
                ));
            }
            // Whole `key=value` pairs, as sent (still percent-encoded).
            let pairs: Vec<&str> = query.split('&').collect();
            for q in &ex.query {
                if !pairs.contains(&q.as_str()) {
                    wrong.push(format!("{method} {path}: query {query:?} lacks {q:?}"));
                }
            }
            for (ptr, want) in &ex.body {
                let got = body.pointer(ptr);
                if got != Some(want) {
                    wrong.push(format!(
                        "{method} {path}: body {ptr} is {got:?}, expected {want}"
                    ));
                }
            }
            me.mismatches.lock().unwrap().extend(wrong);
            let payload: Vec<u8> = if ex.events.is_empty() {
                serde_json::to_vec(ex.response.as_ref().unwrap_or(&Value::Null)).unwrap()
            } else {
                let mut out = Vec::new();
                for e in &ex.events {
                    out.extend(serde_json::to_vec(e).unwrap());
                    out.push(b'\n');
                }
                out
            };
            Ok(http::Response::builder()
                .status(ex.status)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(Bytes::from(payload)))
                .unwrap())
        })
    }
}

//! A real Chromium, headless, driven over WebDriver (chromedriver), and the
//! `belay ui` server as a child process.

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use futures_util::FutureExt;
use serde_json::{json, Value};

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_port(port: u16, what: &str) {
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{what} did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A child killed (with its process group) when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.0.id() as i32) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn own_group(c: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    c.process_group(0)
}

/// `belay ui` on `port` (0: any), for the registry in `home`.
pub struct Ui {
    pub url: String,
    pub base: String,
    pub token: String,
    pub pid: u32,
    _proc: Proc,
}

impl Ui {
    pub fn start(home: &Path, port: u16, token: &str, extra: &[&str]) -> Ui {
        // The benchmark measures a release binary (BELAY_BIN).
        let bin = std::env::var_os("BELAY_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_belay")));
        let mut c = Command::new(bin);
        own_group(&mut c)
            .args(["ui", "--port", &port.to_string()])
            .args(extra)
            .env("BELAY_STATE_HOME", home)
            .env("BELAY_UI_TOKEN", token)
            .env("NO_COLOR", "1")
            .env_remove("OPENAI_API_KEY")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = c.spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line.trim().to_string();
        assert!(
            url.starts_with("http://127.0.0.1:"),
            "belay ui printed {url:?}"
        );
        let base = url.split("/?").next().unwrap().to_string();
        Ui {
            token: url.split("token=").nth(1).unwrap().to_string(),
            url,
            base,
            pid: child.id(),
            _proc: Proc(child),
        }
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        let auth = format!("Bearer {}", self.token);
        request(
            &self.base,
            "GET",
            path,
            &[("Authorization", &auth)],
            None,
            20,
        )
    }

    /// The server's resident set, in bytes.
    pub fn rss(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap();
        let kb: u64 = s
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap();
        kb * 1024
    }

    pub fn json(&self, path: &str) -> Value {
        let (code, body) = self.get(path);
        assert_eq!(code, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap()
    }
}

/// One HTTP/1.1 request on its own connection: the status and the body
/// (what came within `secs`, for a stream that does not end).
pub fn request(
    base: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
    secs: u64,
) -> (u16, String) {
    let (code, _, body) = exchange(base, method, path, headers, body, secs);
    (code, body)
}

/// The status, the head and the body of one request.
pub fn exchange(
    base: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
    secs: u64,
) -> (u16, String, String) {
    use std::io::{Read, Write};
    let host = base.trim_start_matches("http://").to_string();
    let mut s = std::net::TcpStream::connect(&host).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {host}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    req.push_str("\r\n");
    if let Some(b) = body {
        req.push_str(b);
    }
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let t = Instant::now();
    let mut buf = [0u8; 65536];
    while t.elapsed() < Duration::from_secs(secs) {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("{method} {path}: {e}"),
        }
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(raw.len());
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let rest = &raw[(split + 4).min(raw.len())..];
    let code: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    (code, head, String::from_utf8_lossy(&body).into_owned())
}

fn dechunk(mut s: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = s.windows(2).position(|w| w == b"\r\n") {
        let size = String::from_utf8_lossy(&s[..i]).trim().to_string();
        let Ok(n) = usize::from_str_radix(&size, 16) else {
            break;
        };
        let rest = &s[i + 2..];
        if n == 0 {
            break;
        }
        if rest.len() < n {
            out.extend_from_slice(rest);
            break;
        }
        out.extend_from_slice(&rest[..n]);
        s = rest[n..].strip_prefix(b"\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// chromedriver and one headless Chromium session.
pub struct Browser {
    pub c: Client,
    _driver: Proc,
}

impl Browser {
    pub async fn start() -> Browser {
        let port = free_port();
        let mut c = Command::new("chromedriver");
        own_group(&mut c)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let driver = Proc(c.spawn().expect(
            "these tests need chromedriver and chromium (Debian: chromium chromium-driver; .ci/run installs them)",
        ));
        wait_port(port, "chromedriver");
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1400,1000"],
            }
        });
        let caps = caps.as_object().unwrap().clone();
        let conn = hyper_util::client::legacy::connect::HttpConnector::new();
        let c = ClientBuilder::new(conn)
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .unwrap();
        Browser { c, _driver: driver }
    }

    /// Open `url` and wait until the run list is drawn; when it was.
    pub async fn open_list(&self, url: &str) -> f64 {
        self.c.goto(url).await.unwrap();
        self.until(
            "the run list",
            30,
            "return document.body.dataset.ready === 'list'",
        )
        .await;
        self.js("return window.__belay.listReadyMs")
            .await
            .as_f64()
            .unwrap_or(f64::NAN)
    }

    pub async fn js(&self, script: &str) -> Value {
        self.c.execute(script, vec![]).await.unwrap()
    }

    /// Wait until `script` returns something truthy; that value.
    pub async fn until(&self, what: &str, secs: u64, script: &str) -> Value {
        let t = Instant::now();
        loop {
            let v = self.c.execute(script, vec![]).await.unwrap_or(Value::Null);
            let truthy = match &v {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::String(s) => !s.is_empty(),
                Value::Array(a) => !a.is_empty(),
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::Object(_) => true,
            };
            if truthy {
                return v;
            }
            assert!(
                t.elapsed() < Duration::from_secs(secs),
                "timed out after {secs} s waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A real click on `css`. The page redraws live, so an element found
    /// may be replaced before the click lands: it is found again.
    pub async fn click(&self, css: &str) {
        let t = Instant::now();
        loop {
            let r = match self.c.find(Locator::Css(css)).await {
                Ok(e) => e.click().await.map(|_| ()),
                Err(e) => Err(e),
            };
            match r {
                Ok(()) => return,
                Err(e) if t.elapsed() < Duration::from_secs(10) => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("cannot click {css}: {e}"),
            }
        }
    }

    pub async fn html(&self) -> String {
        self.js("return document.documentElement.outerHTML")
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

pub fn screenshot_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots")
}

/// Run a browser test; on failure the page is saved as a PNG first.
pub async fn with_browser<F, Fut>(name: &str, f: F)
where
    F: FnOnce(Browser) -> Fut,
    Fut: Future<Output = Browser>,
{
    let b = Browser::start().await;
    let c = b.c.clone();
    let r = std::panic::AssertUnwindSafe(f(b)).catch_unwind().await;
    match r {
        Ok(b) => {
            let _ = b.c.close().await;
        }
        Err(panic) => {
            let dir = screenshot_dir();
            std::fs::create_dir_all(&dir).unwrap();
            let p = dir.join(format!("{name}.png"));
            if let Ok(png) = c.screenshot().await {
                std::fs::write(&p, png).unwrap();
                eprintln!("the page at the failure: {}", p.display());
            }
            let _ = c.close().await;
            std::panic::resume_unwind(panic);
        }
    }
}

/// Save the page as a PNG (for the docs).
pub async fn save_png(b: &Browser, path: &Path) {
    let png = b.c.screenshot().await.unwrap();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, png).unwrap();
}

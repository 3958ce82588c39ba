//! A real XMPP server for the tests (Debian's prosody, a private instance
//! per test on a free loopback port, accounts registered with prosodyctl)
//! and a real XMPP client (tokio-xmpp) for the people who talk to belay.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio_xmpp::connect::DnsConfig;
use tokio_xmpp::jid::{BareJid, Jid};
use tokio_xmpp::parsers::message::{Id, Lang, Message, MessageType};
use tokio_xmpp::parsers::presence::{Presence, Type as PresenceType};
use tokio_xmpp::xmlstream::Timeouts;
use tokio_xmpp::{Client, Event, Stanza};

pub const PASSWORD: &str = "pw-test-xmpp-4242";

pub struct Prosody {
    pub dir: PathBuf,
    pub port: u16,
    child: Option<Child>,
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Prosody {
    /// Start a server with the accounts `users` (all with [`PASSWORD`]).
    pub fn start(dir: &Path, users: &[&str]) -> Prosody {
        assert!(
            Path::new("/usr/bin/prosody").exists(),
            "these tests need Debian's prosody (./scripts/setup-host.sh --tests installs it)"
        );
        std::fs::create_dir_all(dir.join("data")).unwrap();
        std::fs::create_dir_all(dir.join("certs")).unwrap();
        let port = free_port();
        let cfg = format!(
            r#"run_as_root = true
pidfile = "{d}/prosody.pid"
data_path = "{d}/data"
certificates = "{d}/certs"
daemonize = false
log = {{ info = "{d}/prosody.log"; error = "{d}/prosody.err" }}
c2s_ports = {{ {port} }}
c2s_interfaces = {{ "127.0.0.1" }}
s2s_ports = {{ }}
c2s_require_encryption = false
allow_unencrypted_plain_auth = true
authentication = "internal_hashed"
storage = "internal"
modules_enabled = {{ "roster"; "saslauth"; "disco"; "carbons"; "ping"; "offline"; "smacks" }}
modules_disabled = {{ "s2s"; "http"; "posix" }}
VirtualHost "localhost"
"#,
            d = dir.display()
        );
        std::fs::write(dir.join("prosody.cfg.lua"), cfg).unwrap();
        for u in users {
            let ok = Command::new("prosodyctl")
                .arg("--config")
                .arg(dir.join("prosody.cfg.lua"))
                .args(["register", u, "localhost", PASSWORD])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .unwrap()
                .success();
            assert!(ok, "prosodyctl register {u}");
        }
        let mut p = Prosody {
            dir: dir.to_path_buf(),
            port,
            child: None,
        };
        p.spawn();
        p
    }

    fn spawn(&mut self) {
        let child = Command::new("prosody")
            .arg("--config")
            .arg(self.dir.join("prosody.cfg.lua"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let t = Instant::now();
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "prosody did not listen on {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kill the server and start it again on the same port.
    pub fn restart(&mut self) {
        self.restart_after(Duration::from_millis(300));
    }

    /// Kill the server, leave it down for `outage`, and start it again on
    /// the same port.
    pub fn restart_after(&mut self, outage: Duration) {
        self.stop();
        std::thread::sleep(outage);
        self.spawn();
    }
}

impl Drop for Prosody {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One person's chat client: what it received, and a way to send.
pub struct Chat {
    pub me: String,
    pub received: Arc<Mutex<Vec<(String, String)>>>,
    pub online: Arc<Mutex<u32>>,
    /// belay's log, shown when a wait fails.
    pub log: Option<PathBuf>,
    tx: tokio::sync::mpsc::UnboundedSender<(String, String, Option<String>)>,
}

impl Chat {
    pub fn connect(user: &str, port: u16, log: &Path) -> Chat {
        let me = format!("{user}@localhost");
        let received = Arc::new(Mutex::new(Vec::new()));
        let online = Arc::new(Mutex::new(0u32));
        let (tx, mut rx) =
            tokio::sync::mpsc::unbounded_channel::<(String, String, Option<String>)>();
        let (r, o, jid) = (received.clone(), online.clone(), me.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let jid: BareJid = jid.parse().unwrap();
                let mut client = Client::new_plaintext(
                    jid,
                    PASSWORD.to_string(),
                    DnsConfig::addr(&format!("127.0.0.1:{port}")),
                    Timeouts::default(),
                );
                loop {
                    tokio::select! {
                        ev = client.next() => match ev {
                            None => return,
                            Some(Event::Online { .. }) => {
                                let _ = client.send_stanza(Presence::new(PresenceType::None).into()).await;
                                *o.lock().unwrap() += 1;
                            }
                            Some(Event::Stanza(Stanza::Message(m))) => {
                                // The body's language is the stream's (`en`) or none.
                                let body = m.bodies.get(&Lang::default()).or_else(|| m.bodies.values().next());
                                if let (Some(from), Some(body)) = (m.from.as_ref(), body) {
                                    r.lock().unwrap().push((from.to_bare().to_string(), body.clone()));
                                }
                            }
                            Some(_) => {}
                        },
                        m = rx.recv() => match m {
                            None => return,
                            Some((to, body, id)) => {
                                let to: Jid = to.parse().unwrap();
                                let mut msg = Message::new_with_type(MessageType::Chat, Some(to)).with_body(Lang::default(), body);
                                msg.id = id.map(Id);
                                let _ = client.send_stanza(msg.into()).await;
                            }
                        },
                    }
                }
            });
        });
        let c = Chat {
            me,
            received,
            online,
            log: Some(log.to_path_buf()),
            tx,
        };
        c.wait_online(1);
        c
    }

    /// Wait until the client has been online `n` times (reconnects count).
    pub fn wait_online(&self, n: u32) {
        let t = Instant::now();
        while *self.online.lock().unwrap() < n {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "{} did not get online ({n})",
                self.me
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn send(&self, to: &str, body: &str) {
        self.tx
            .send((to.to_string(), body.to_string(), None))
            .unwrap();
    }

    pub fn send_with_id(&self, to: &str, body: &str, id: &str) {
        self.tx
            .send((to.to_string(), body.to_string(), Some(id.to_string())))
            .unwrap();
    }

    /// Wait for a message whose body contains `needle`; all text received.
    pub fn wait_for(&self, needle: &str, timeout: Duration) -> String {
        let t = Instant::now();
        loop {
            let all: String = self
                .received
                .lock()
                .unwrap()
                .iter()
                .map(|(_, b)| b.clone())
                .collect::<Vec<_>>()
                .join("\n---\n");
            if all.contains(needle) {
                return all;
            }
            if t.elapsed() > timeout {
                let log = self
                    .log
                    .as_ref()
                    .and_then(|p| std::fs::read_to_string(p).ok())
                    .unwrap_or_default();
                panic!("{} got no message with `{needle}` in {timeout:?}; got:\n{all}\nbelay's log:\n{log}", self.me);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Wait for the `n`th message (from 1) whose body contains `needle`;
    /// that message.
    pub fn wait_for_nth(&self, needle: &str, n: usize, timeout: Duration) -> String {
        let t = Instant::now();
        loop {
            let hits: Vec<String> = self
                .received
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, b)| b.contains(needle))
                .map(|(_, b)| b.clone())
                .collect();
            if hits.len() >= n {
                return hits[n - 1].clone();
            }
            if t.elapsed() > timeout {
                let log = self
                    .log
                    .as_ref()
                    .and_then(|p| std::fs::read_to_string(p).ok())
                    .unwrap_or_default();
                panic!(
                    "{} got {} of {n} messages with `{needle}` in {timeout:?}\nbelay's log:\n{log}",
                    self.me,
                    hits.len()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn count(&self, needle: &str) -> usize {
        self.received
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, b)| b.contains(needle))
            .count()
    }
}

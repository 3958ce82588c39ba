//! The XMPP front end (tokio-xmpp): TLS (STARTTLS) to the server, plain TCP
//! only to a loopback test server. Requests from the owners and the allow
//! list become jobs, messages within the batching window one job; commands
//! are answered at once; replies leave the outbox chunked and paced. The
//! client reconnects with back-off by itself; after every bind belay sends
//! its presence and enables carbons again, and a message seen before (by
//! its id) never makes a second job.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use sasl::common::ChannelBinding;
use tokio::time::Instant;
use tokio_xmpp::connect::{
    DnsConfig, ServerConnector, StartTlsServerConnector, TcpServerConnector,
};
use tokio_xmpp::jid::{BareJid, Jid};
use tokio_xmpp::parsers::carbons;
use tokio_xmpp::parsers::iq::Iq;
use tokio_xmpp::parsers::message::{Lang, Message, MessageType};
use tokio_xmpp::parsers::ping::Ping;
use tokio_xmpp::parsers::presence::{Presence, Show, Type as PresenceType};
use tokio_xmpp::xmlstream::{PendingFeaturesRecv, Timeouts};
use tokio_xmpp::{Client, Event, IqRequest, IqResponseToken, Stanza};

use crate::chat::{self, Command};
use crate::config::XmppConfig;
use crate::front::seen::Seen;
use crate::job::Job;
use crate::services::Services;
use crate::worker::Stop;
use crate::{gates, JobsError};

const CARBONS_NS: &str = "urn:xmpp:carbons:2";
/// A ping to the server this often: the connection's liveness.
const PING_EVERY: Duration = Duration::from_secs(10);
/// No bind and no answer to a ping for this long: the client is made anew
/// (a resumption the server refuses, after its restart, would otherwise
/// loop in the client for good).
const DEAD_AFTER: Duration = Duration::from_secs(25);
/// After a disconnection, how long the client's own reconnection has to
/// bind again before the client is made anew.
const RESUME_GRACE: Duration = Duration::from_secs(6);
/// The back-off of making the client anew.
const REBUILD_MAX: Duration = Duration::from_secs(60);

/// A connection within this long of the last one is paced.
const QUIET: Duration = Duration::from_secs(30);

/// When belay's account last connected and how long the next quick
/// reconnection waits.
#[derive(Debug, Default)]
struct PaceState {
    last: Option<std::time::Instant>,
    pause: Duration,
    /// Logins since the stream was last bound. A second one means the
    /// client is asking a restarted server to resume a session it forgot:
    /// the client is made anew at once (`stale`).
    unbound: u32,
    stale: bool,
    /// The client whose connections go ahead: a replaced client's own
    /// reconnection (its task outlives it for a while) is refused here, so
    /// that one client at a time logs in.
    generation: u64,
}

/// Every connection of belay's account goes through here. tokio-xmpp
/// reconnects by itself, at once, after a drop, and again after every
/// login that ends before its stream is bound (a restarted server that
/// refuses the stream's resumption): hundreds of logins a second, which a
/// real server rate-limits or bans. A connection within [`QUIET`] of the
/// last one waits 1 s, then 2, 4, … up to [`REBUILD_MAX`] (each with up to
/// a quarter more at random); after a quiet spell the next is at once.
#[derive(Clone, Debug)]
struct Paced<C> {
    inner: C,
    state: Arc<std::sync::Mutex<PaceState>>,
    generation: u64,
}

/// A replaced client's reconnection: it never connects and never
/// completes. (tokio-xmpp's reconnection task retries a failed connection
/// for good, logging each failure as an error, and stops only once a
/// connection succeeds; a pending one costs nothing and logs nothing.)
async fn replaced<T>() -> Result<T, tokio_xmpp::Error> {
    std::future::pending::<()>().await;
    Err(tokio_xmpp::Error::Io(std::io::Error::other(
        "this client was replaced by a new one",
    )))
}

impl<C: ServerConnector> ServerConnector for Paced<C> {
    type Stream = C::Stream;

    fn connect(
        &self,
        jid: &Jid,
        ns: &'static str,
        timeouts: Timeouts,
    ) -> impl std::future::Future<
        Output = Result<(PendingFeaturesRecv<Self::Stream>, ChannelBinding), tokio_xmpp::Error>,
    > + Send {
        let wait = {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if s.generation != self.generation {
                None
            } else {
                if s.unbound > 0 {
                    s.stale = true;
                }
                let now = std::time::Instant::now();
                let wait = match s.last {
                    Some(t) if now < t + QUIET => {
                        let w = s.pause.max(Duration::from_secs(1));
                        s.pause = (w * 2).min(REBUILD_MAX);
                        // Up to a quarter more, at random: belays that lost the
                        // same server do not all come back in the same second.
                        w + Duration::from_millis(fastrand::u64(0..=w.as_millis() as u64 / 4))
                    }
                    _ => {
                        s.pause = Duration::from_secs(1);
                        Duration::ZERO
                    }
                };
                s.last = Some(now + wait);
                Some(wait)
            }
        };
        let (inner, jid, state) = (self.inner.clone(), jid.clone(), self.state.clone());
        let generation = self.generation;
        async move {
            let Some(wait) = wait else {
                return replaced().await;
            };
            tokio::time::sleep(wait).await;
            if state.lock().unwrap_or_else(|p| p.into_inner()).generation != generation {
                return replaced().await;
            }
            tracing::info!("xmpp: connecting as {jid} (after a pause of {wait:?})");
            let r = inner.connect(&jid, ns, timeouts).await;
            tracing::debug!("xmpp: connection ready: {}", r.is_ok());
            if r.is_ok() {
                state.lock().unwrap_or_else(|p| p.into_inner()).unbound += 1;
            }
            r
        }
    }
}

/// Messages of one sender within the window.
struct Batch {
    texts: Vec<String>,
    ids: Vec<String>,
    first: Option<Instant>,
    deadline: Instant,
}

/// A reply being sent, chunk by chunk.
struct Sending {
    file: PathBuf,
    to: Jid,
    chunks: VecDeque<String>,
}

/// The outbox's next message: the oldest of the first recipient after
/// `last` (in the order of their oldest messages) that has one, so that
/// each conversation gets its turn and one person's many answers never
/// hold up another's; each recipient's own messages keep their order.
fn next_turn(
    pending: Vec<(PathBuf, crate::notify::Message)>,
    last: Option<&str>,
) -> Option<(PathBuf, crate::notify::Message)> {
    let mut order: Vec<&str> = Vec::new();
    for (_, m) in &pending {
        if !order.contains(&m.to.as_str()) {
            order.push(m.to.as_str());
        }
    }
    let pick = match last.and_then(|l| order.iter().position(|o| *o == l)) {
        Some(i) if order.len() > 1 => order[(i + 1) % order.len()].to_string(),
        _ => order
            .iter()
            .find(|o| Some(**o) != last)
            .or(order.first())?
            .to_string(),
    };
    pending.into_iter().find(|(_, m)| m.to == pick)
}

/// Split `text` into chunks of at most `n` characters, at line ends where
/// there is one.
pub fn chunks(text: &str, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut cur_len = 0;
    for line in text.split_inclusive('\n') {
        let len = line.chars().count();
        if cur_len + len > n && !cur.is_empty() {
            out.push(std::mem::take(&mut cur).trim_end().to_string());
            cur_len = 0;
        }
        if len > n {
            let chars: Vec<char> = line.chars().collect();
            for piece in chars.chunks(n) {
                out.push(piece.iter().collect::<String>().trim_end().to_string());
            }
            continue;
        }
        cur.push_str(line);
        cur_len += len;
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim_end().to_string());
    }
    out.retain(|c| !c.is_empty());
    out
}

fn client_for(
    x: &XmppConfig,
    jid: BareJid,
    password: String,
    pace: &Arc<std::sync::Mutex<PaceState>>,
) -> Result<Client, JobsError> {
    let timeouts = Timeouts::default();
    let generation = {
        let mut s = pace.lock().unwrap_or_else(|p| p.into_inner());
        s.generation += 1;
        s.generation
    };
    if x.insecure_plaintext_loopback {
        let server = x.server.clone().unwrap_or_default();
        return Ok(Client::new_with_connector(
            jid,
            password,
            Paced {
                inner: TcpServerConnector::from(DnsConfig::addr(&server)),
                state: pace.clone(),
                generation,
            },
            timeouts,
        ));
    }
    let dns = match &x.server {
        Some(s) => {
            let (host, port) = s
                .rsplit_once(':')
                .and_then(|(h, p)| p.parse::<u16>().ok().map(|p| (h.to_string(), p)))
                .ok_or_else(|| JobsError::Config(format!("[xmpp] server `{s}`: give host:port")))?;
            DnsConfig::no_srv(&host, port)
        }
        None => DnsConfig::srv_default_client(jid.domain().as_ref()),
    };
    Ok(Client::new_with_connector(
        jid,
        password,
        Paced {
            inner: StartTlsServerConnector::from(dns),
            state: pace.clone(),
            generation,
        },
        timeouts,
    ))
}

/// The account's password, its bare address, a client for it and the
/// server's address (each error as the config names it).
fn connect_parts(
    x: &XmppConfig,
    pace: &Arc<std::sync::Mutex<PaceState>>,
) -> Result<(String, BareJid, Client, Jid), JobsError> {
    let password = std::env::var(&x.password_env).map_err(|_| {
        JobsError::Config(format!(
            "[xmpp] password_env names {}, which is not set: export the account's password there",
            x.password_env
        ))
    })?;
    let me: BareJid = x
        .jid
        .parse()
        .map_err(|e| JobsError::Config(format!("[xmpp] jid `{}`: {e}", x.jid)))?;
    let client = client_for(x, me.clone(), password.clone(), pace)?;
    let server_jid: Jid = me
        .domain()
        .as_str()
        .parse()
        .map_err(|e| JobsError::Config(format!("[xmpp] jid `{}`: {e}", x.jid)))?;
    Ok((password, me, client, server_jid))
}

/// After a bind: say so, send belay's presence and enable carbons again.
async fn on_online(svc: &Services, client: &mut Client, bound_jid: &Jid, resumed: bool) {
    svc.tell(&crate::events::JobEvent::XmppOnline {
        jid: bound_jid.to_string(),
        resumed,
    });
    let mut p = Presence::new(PresenceType::None);
    p.show = Some(Show::Chat);
    let _ = client.send_stanza(p.into()).await;
    // Carbons, again after every bind: a message to the
    // bare address reaches belay whichever resource the
    // server picks.
    let iq = Iq::from_set(
        format!("carbons-{:08x}", fastrand::u32(..)),
        carbons::Enable,
    );
    let _ = client.send_stanza(iq.into()).await;
}

/// The batches waiting for their window, as the disk has them: a belay
/// killed inside a window loses no message (the server delivered it once).
const BATCHES_FILE: &str = "xmpp-batches.json";

/// Write the open batches (`from` → texts and ids) atomically.
fn save_batches(path: &std::path::Path, batches: &BTreeMap<String, Batch>) {
    let open: BTreeMap<&String, (&Vec<String>, &Vec<String>)> = batches
        .iter()
        .map(|(from, b)| (from, (&b.texts, &b.ids)))
        .collect();
    match serde_json::to_vec(&open) {
        Ok(bytes) => {
            if let Err(e) = belay_record::atomic_write(path, &bytes) {
                tracing::warn!(
                    "xmpp: cannot keep the open batches in {}: {e}",
                    path.display()
                );
            }
        }
        Err(e) => tracing::warn!("xmpp: cannot encode the open batches: {e}"),
    }
}

/// What a killed belay left in its batching window becomes jobs now (its
/// window is long over); a message already made into a job (its id seen)
/// is not made again.
fn recover_batches(
    svc: &Services,
    wake: &tokio::sync::Notify,
    seen: &mut Seen,
    path: &std::path::Path,
) {
    // host-owned: the queue directory, belay's own.
    let Ok(bytes) = std::fs::read(path) else {
        return;
    };
    let open: BTreeMap<String, (Vec<String>, Vec<String>)> =
        serde_json::from_slice(&bytes).unwrap_or_default();
    for (from, (texts, ids)) in open {
        if texts.is_empty() || ids.iter().any(|id| seen.contains(&from, id)) {
            continue;
        }
        tracing::info!("xmpp: a batch from {from} left by a stopped belay becomes a job");
        let b = Batch {
            texts,
            ids,
            first: None,
            deadline: Instant::now(),
        };
        flush(svc, wake, seen, &from, b);
    }
    save_batches(path, &BTreeMap::new());
}

/// Every batch whose window has closed becomes a job.
fn flush_due(
    svc: &Services,
    wake: &tokio::sync::Notify,
    batches: &mut BTreeMap<String, Batch>,
    seen: &mut Seen,
) {
    let now = Instant::now();
    let ready: Vec<String> = batches
        .iter()
        .filter(|(_, b)| b.deadline <= now)
        .map(|(k, _)| k.clone())
        .collect();
    for from in ready {
        if let Some(b) = batches.remove(&from) {
            flush(svc, wake, seen, &from, b);
        }
    }
}

/// The next chunk of the reply being sent (or of the outbox's next one),
/// paced by `next_send`.
async fn send_next(
    svc: &Services,
    client: &mut Client,
    x: &XmppConfig,
    sending: &mut Option<Sending>,
    next_send: &mut Instant,
    last_to: &mut Option<String>,
) {
    if Instant::now() < *next_send {
        return;
    }
    if sending.is_none() {
        if let Some((file, m)) = next_turn(svc.outbox.pending(), last_to.as_deref()) {
            *last_to = Some(m.to.clone());
            match m.to.parse::<Jid>() {
                Ok(to) => {
                    *sending = Some(Sending {
                        file,
                        to,
                        chunks: chunks(&m.text, x.chunk_chars).into(),
                    })
                }
                Err(_) => svc.outbox.done(&file),
            }
        }
    }
    if let Some(s) = sending.as_mut() {
        if let Some(c) = s.chunks.front().cloned() {
            let msg = Message::new_with_type(MessageType::Chat, Some(s.to.clone()))
                .with_body(Lang::default(), c);
            match tokio::time::timeout(Duration::from_secs(10), client.send_stanza(msg.into()))
                .await
            {
                Ok(Ok(_)) => {
                    s.chunks.pop_front();
                    *next_send = Instant::now() + x.chunk_pause;
                }
                _ => *next_send = Instant::now() + Duration::from_secs(1),
            }
        }
        if s.chunks.is_empty() {
            svc.outbox.done(&s.file);
            *sending = None;
        }
    }
}

/// Run the chat front end until `stop`.
pub async fn run(
    svc: Arc<Services>,
    wake: Arc<tokio::sync::Notify>,
    stop: Stop,
) -> Result<(), JobsError> {
    let Some(x) = svc.cfg.xmpp.clone() else {
        return Ok(());
    };
    let _ = tokio_xmpp::rustls::crypto::ring::default_provider().install_default();
    // One pace for every client this front end makes.
    let pace = Arc::new(std::sync::Mutex::new(PaceState::default()));
    let (password, me, mut client, server_jid) = connect_parts(&x, &pace)?;
    let mut alive_until = Instant::now() + DEAD_AFTER;
    let mut next_ping = Instant::now() + PING_EVERY;
    let mut ping: Option<std::pin::Pin<Box<IqResponseToken>>> = None;
    let mut rebuild_pause = Duration::from_secs(1);
    let mut seen = Seen::load(&svc.queue.sub("xmpp-seen.json"));
    let batches_file = svc.queue.sub(BATCHES_FILE);
    recover_batches(&svc, &wake, &mut seen, &batches_file);
    let mut batches: BTreeMap<String, Batch> = BTreeMap::new();
    let mut online = false;
    let mut sending: Option<Sending> = None;
    let mut next_send = Instant::now();
    let mut last_to: Option<String> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let far = Instant::now() + Duration::from_secs(86400 * 365);
    loop {
        let due = batches.values().map(|b| b.deadline).min().unwrap_or(far);
        tokio::select! {
            ev = client.next() => {
                let Some(ev) = ev else {
                    return Err(JobsError::Environment("the XMPP client stopped for good".into()));
                };
                match ev {
                    Event::Online { bound_jid, resumed, .. } => {
                        online = true;
                        reset_pace(&pace, false);
                        alive_until = Instant::now() + DEAD_AFTER;
                        rebuild_pause = Duration::from_secs(1);
                        // What came on the connection before is a job of its
                        // own: a batch never spans a reconnection.
                        if !resumed && !batches.is_empty() {
                            flush_all(&svc, &wake, &mut seen, &mut batches, &batches_file);
                        }
                        on_online(&svc, &mut client, &bound_jid, resumed).await;
                    }
                    Event::Disconnected(e) => {
                        if online {
                            svc.tell(&crate::events::JobEvent::XmppReconnecting {
                                reason: format!("disconnected ({e})"),
                            });
                        }
                        online = false;
                        // The client's own reconnection gets a short while
                        // to bind again; a server that came back without
                        // the session it would resume costs no longer.
                        alive_until = alive_until.min(Instant::now() + RESUME_GRACE);
                    }
                    Event::Stanza(Stanza::Message(m)) => {
                        if let Some((from, id, body)) = incoming(&me, m) {
                            on_message(&svc, &wake, &mut batches, &mut seen, &x, &from, id, &body).await;
                            save_batches(&batches_file, &batches);
                        }
                    }
                    Event::Stanza(_) => {}
                }
            }
            _ = tokio::time::sleep_until(due) => {
                flush_due(&svc, &wake, &mut batches, &mut seen);
                save_batches(&batches_file, &batches);
            }
            _ = tick.tick() => {
                if pace.lock().is_ok_and(|p| p.stale) {
                    // Connected again without binding (the client's own
                    // reconnection, which tokio-xmpp does without telling,
                    // asking a restarted server to resume a session it
                    // forgot): the client is made anew now, not when the
                    // watchdog gives up on it.
                    if alive_until > Instant::now() {
                        tracing::info!("xmpp: connected again without a bound stream: a new client");
                    }
                    alive_until = Instant::now();
                } else if online {
                    send_next(&svc, &mut client, &x, &mut sending, &mut next_send, &mut last_to).await;
                }
            }
            r = async {
                match ping.as_mut() {
                    Some(p) => p.await,
                    None => std::future::pending().await,
                }
            }, if ping.is_some() => {
                ping = None;
                // Any answer (a result or an error) is the server's.
                if r.is_ok() {
                    alive_until = Instant::now() + DEAD_AFTER;
                }
            }
            _ = tokio::time::sleep_until(next_ping.min(alive_until)) => {
                let now = Instant::now();
                if now >= alive_until {
                    if online {
                        svc.tell(&crate::events::JobEvent::XmppReconnecting {
                                reason: "the server stopped answering".into(),
                            });
                    }
                    online = false;
                    ping = None;
                    tokio::select! {
                        _ = tokio::time::sleep(rebuild_pause) => {}
                        _ = stop.wait() => break,
                    }
                    rebuild_pause = (rebuild_pause * 2).min(REBUILD_MAX);
                    // A fresh client (no stream to resume) may connect at once.
                    reset_pace(&pace, true);
                    let old = std::mem::replace(&mut client, client_for(&x, me.clone(), password.clone(), &pace)?);
                    let _ = tokio::time::timeout(Duration::from_secs(1), old.send_end()).await;
                    alive_until = Instant::now() + DEAD_AFTER + rebuild_pause;
                    next_ping = Instant::now() + PING_EVERY;
                    continue;
                }
                if now >= next_ping {
                    next_ping = now + PING_EVERY;
                    if online && ping.is_none() {
                        let sent = tokio::time::timeout(
                            Duration::from_secs(2),
                            client.send_iq(Some(server_jid.clone()), IqRequest::Get(Ping.into())),
                        )
                        .await;
                        if let Ok(token) = sent {
                            ping = Some(Box::pin(token));
                        }
                    }
                }
            }
            _ = stop.wait() => break,
        }
    }
    // What is batched becomes jobs before belay goes: nothing said is lost.
    flush_all(&svc, &wake, &mut seen, &mut batches, &batches_file);
    let _ = tokio::time::timeout(Duration::from_secs(2), client.send_end()).await;
    Ok(())
}

/// Every open batch becomes a job, and the kept batches file says so.
fn flush_all(
    svc: &Services,
    wake: &tokio::sync::Notify,
    seen: &mut Seen,
    batches: &mut BTreeMap<String, Batch>,
    file: &std::path::Path,
) {
    for (from, b) in std::mem::take(batches) {
        flush(svc, wake, seen, &from, b);
    }
    save_batches(file, batches);
}

/// A bound stream (or a new client): no login is unbound; a new client
/// (`fresh`) may also connect at once.
fn reset_pace(pace: &std::sync::Mutex<PaceState>, fresh: bool) {
    if let Ok(mut p) = pace.lock() {
        p.unbound = 0;
        p.stale = false;
        if fresh {
            p.last = None;
        }
    }
}

/// The sender, message id and body of a chat message for belay; a received
/// carbon counts (only from belay's own account), a sent one does not.
fn incoming(me: &BareJid, m: Message) -> Option<(String, Option<String>, String)> {
    if !matches!(m.type_, MessageType::Chat | MessageType::Normal) {
        return None;
    }
    let mut m = m;
    if let Some(p) = m.payloads.iter().find(|p| p.ns() == CARBONS_NS) {
        // A carbon comes from the account itself, its bare address exactly
        // (XEP-0280 §11); only a received one is a message for belay.
        if p.name() != "received" || m.from != Some(Jid::from(me.clone())) {
            return None;
        }
        let r = carbons::Received::try_from(p.clone()).ok()?;
        m = r.forwarded.message;
        if !matches!(m.type_, MessageType::Chat | MessageType::Normal) {
            return None;
        }
    }
    let from = m.from.as_ref()?.to_bare();
    // A person has a local part: a server or component address (`local`)
    // is nobody's, and never the command line's owner.
    if &from == me || from.node().is_none() {
        return None;
    }
    let body = m
        .bodies
        .get(&Lang::default())
        .cloned()
        .or_else(|| m.bodies.values().next().cloned())?;
    if body.trim().is_empty() {
        return None;
    }
    Some((from.to_string(), m.id.map(|i| i.0), body))
}

#[allow(clippy::too_many_arguments)]
async fn on_message(
    svc: &Arc<Services>,
    wake: &Arc<tokio::sync::Notify>,
    batches: &mut BTreeMap<String, Batch>,
    seen: &mut Seen,
    x: &XmppConfig,
    from: &str,
    id: Option<String>,
    body: &str,
) {
    if !svc.cfg.may_request(from) {
        // Logged without -v: the owner sees who was turned away.
        tracing::warn!(
            "xmpp: ignored a message from {from}, who is neither an owner nor on the allow list"
        );
        return;
    }
    if let Some(id) = &id {
        let batched = batches.get(from).is_some_and(|b| b.ids.contains(id));
        if batched || seen.contains(from, id) {
            tracing::info!("xmpp: message {id} from {from} seen before; no second job");
            return;
        }
    }
    match chat::parse(body) {
        Command::Request => {
            // A message that would make the batch larger than a request
            // starts a batch of its own: what came before is one job.
            let len = body.trim().chars().count();
            let over = batches.get(from).is_some_and(|b| {
                b.texts.iter().map(|t| t.chars().count() + 2).sum::<usize>() + len
                    > crate::job::MAX_BODY_CHARS
            });
            if over {
                if let Some(b) = batches.remove(from) {
                    flush(svc, wake, seen, from, b);
                }
            }
            let b = batches.entry(from.to_string()).or_insert_with(|| Batch {
                texts: vec![],
                ids: vec![],
                first: None,
                deadline: Instant::now(),
            });
            b.texts.push(body.trim().to_string());
            b.ids.extend(id);
            // The window moves with each message, up to ten windows from the
            // first; a batch past the size of a request goes at once.
            let first = b.first.get_or_insert_with(Instant::now);
            b.deadline = (Instant::now() + x.batch_window).min(*first + x.batch_window * 10);
        }
        cmd => {
            // What the sender said before the command is a job of its own.
            if let Some(b) = batches.remove(from) {
                flush(svc, wake, seen, from, b);
            }
            if let Some(id) = &id {
                seen.remember(from, id);
            }
            // A gate can take a while (an approval commits and pushes): it
            // runs beside the connection, and is not cut short with it.
            let (svc, from) = (svc.clone(), from.to_string());
            let wake = wake.clone();
            tokio::spawn(async move {
                if let Some(reply) = chat::handle(&svc, &from, &cmd).await {
                    let _ = svc.outbox.send(&from, &reply);
                }
                wake.notify_waiters();
            });
        }
    }
}

/// Make the batch a job; its message ids are remembered only now (a belay
/// killed inside the window has made no job, and takes the messages again
/// when the server delivers them again).
fn flush(svc: &Services, wake: &tokio::sync::Notify, seen: &mut Seen, from: &str, b: Batch) {
    for id in &b.ids {
        seen.remember(from, id);
    }
    let mut job = Job::new(from, &b.texts.join("\n\n"));
    job.source = Some("xmpp".into());
    job.source_ids = b.ids;
    let sent = job.clone();
    match gates::submit(svc, job) {
        Ok(s) => {
            // The sender hears at once that the request is a job, and where
            // it stands.
            let text = if s.waits_for_approval {
                format!("Your request (ID {}) waits for the owner's approval.", s.id)
            } else {
                format!(
                    "Got it: job {}; {}",
                    s.id,
                    gates::queued_note(svc.queue.ahead_of(&s.id))
                )
            };
            crate::worker::reply(svc, &sent, &text);
            wake.notify_waiters();
        }
        Err(e) => {
            let _ = svc
                .outbox
                .send(from, &format!("Your request was not queued: {}", e.reply()));
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn replies_are_chunked_at_line_ends_within_the_limit() {
        let text = format!(
            "{}\n{}\n{}",
            "a".repeat(150),
            "b".repeat(150),
            "c".repeat(450)
        );
        let c = super::chunks(&text, 200);
        assert!(c.iter().all(|x| x.chars().count() <= 200), "{c:?}");
        assert_eq!(c.concat().replace('\n', ""), text.replace('\n', ""));
        assert_eq!(c[0], "a".repeat(150));
        assert_eq!(super::chunks("short", 200), vec!["short".to_string()]);
    }

    #[test]
    fn conversations_take_turns_and_keep_their_order() {
        let m = |to: &str, n: u32| {
            (
                std::path::PathBuf::from(format!("{n}.json")),
                crate::notify::Message {
                    to: to.into(),
                    text: n.to_string(),
                    created_at: String::new(),
                },
            )
        };
        let pending = || {
            vec![
                m("a@x", 1),
                m("a@x", 2),
                m("a@x", 3),
                m("b@x", 4),
                m("c@x", 5),
            ]
        };
        let pick = |last: Option<&str>| super::next_turn(pending(), last).unwrap().1.text;
        assert_eq!(pick(None), "1");
        assert_eq!(pick(Some("a@x")), "4", "b's turn after a's");
        assert_eq!(pick(Some("b@x")), "5");
        assert_eq!(pick(Some("c@x")), "1", "back to a, its oldest first");
        assert_eq!(pick(Some("gone@x")), "1");
        assert_eq!(
            super::next_turn(vec![m("a@x", 7)], Some("a@x"))
                .unwrap()
                .1
                .text,
            "7"
        );
    }
}

//! A chat client for the jobs benchmark (bench/jobs/bench.py): it logs in
//! over plain TCP to a loopback test server, sends each line of stdin to the
//! builder as its own message (waiting for the builder's reply before the
//! next), and prints one JSON line per message: when it was sent and when the
//! reply came (Unix milliseconds).
//!
//! `xmpp_client PORT USER PASSWORD TO` (the server is 127.0.0.1:PORT, the
//! domain `localhost`).

use std::io::BufRead;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_xmpp::connect::DnsConfig;
use tokio_xmpp::jid::{BareJid, Jid};
use tokio_xmpp::parsers::message::{Lang, Message, MessageType};
use tokio_xmpp::parsers::presence::{Presence, Type as PresenceType};
use tokio_xmpp::xmlstream::Timeouts;
use tokio_xmpp::{Client, Event, Stanza};

fn now_ms() -> i64 {
    belay_record::unix_millis()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let [port, user, password, to] = a.as_slice() else {
        return Err("usage: xmpp_client PORT USER PASSWORD TO".into());
    };
    let lines: Vec<String> = std::io::stdin()
        .lock()
        .lines()
        .map_while(Result::ok)
        .filter(|l| !l.trim().is_empty())
        .collect();
    let jid: BareJid = format!("{user}@localhost")
        .parse()
        .map_err(|e| format!("{e}"))?;
    let to: Jid = to.parse().map_err(|e| format!("{e}"))?;
    let mut client = Client::new_plaintext(
        jid,
        password.clone(),
        DnsConfig::addr(&format!("127.0.0.1:{port}")),
        Timeouts::default(),
    );
    // Online first.
    loop {
        match client.next().await {
            Some(Event::Online { .. }) => break,
            Some(_) => {}
            None => return Err("the client stopped".into()),
        }
    }
    let _ = client
        .send_stanza(Presence::new(PresenceType::None).into())
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for body in lines {
        let sent = now_ms();
        let msg = Message::new_with_type(MessageType::Chat, Some(to.clone()))
            .with_body(Lang::default(), body.replace("\\n", "\n"));
        client
            .send_stanza(msg.into())
            .await
            .map_err(|e| e.to_string())?;
        let reply = tokio::time::timeout(Duration::from_secs(300), async {
            loop {
                match client.next().await {
                    Some(Event::Stanza(Stanza::Message(m))) if !m.bodies.is_empty() => {
                        return Some(now_ms())
                    }
                    Some(_) => {}
                    None => return None,
                }
            }
        })
        .await
        .ok()
        .flatten();
        println!(
            "{{\"sent_ms\": {sent}, \"reply_ms\": {}}}",
            reply
                .map(|r| r.to_string())
                .unwrap_or_else(|| "null".into())
        );
    }
    let _ = client.send_end().await;
    Ok(())
}

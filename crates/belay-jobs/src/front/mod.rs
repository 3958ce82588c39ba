//! Where jobs come from besides `belay jobs submit`: chat (XMPP), a drop
//! directory and a loopback HTTP endpoint. Each is a thin layer over the
//! gates: a request becomes a job through [`crate::gates::submit`], a
//! command through [`crate::chat`].

pub mod drop;
pub mod http;
mod seen;
pub mod xmpp;

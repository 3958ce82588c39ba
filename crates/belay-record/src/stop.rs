//! The one cancellation token. SIGINT and SIGTERM trip it for every command
//! ([`Stop::on_signals`]); a front end or a test trips it by hand
//! ([`Stop::trip`]). Engines wait on it ([`Stop::wait`]) or look at it between
//! steps ([`Stop::reason`]); the first reason wins.
//!
//! Two levels: the first signal asks for a clean stop; the second exits at
//! once with 130, unless an engine said it stops *now* by itself
//! ([`Stop::handles_now`], the round supervisor's "stop after the round",
//! then "kill the agent"): then the second signal trips [`Stop::wait_now`] and
//! only a third exits.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

/// A cancellation token: cheap to clone, every clone sees the same trip.
#[derive(Clone, Debug)]
pub struct Stop {
    tx: Arc<watch::Sender<Option<String>>>,
    rx: watch::Receiver<Option<String>>,
    now: Arc<watch::Sender<bool>>,
    handles_now: Arc<AtomicBool>,
}

impl Default for Stop {
    fn default() -> Self {
        Self::new()
    }
}

/// SIGINT or SIGTERM could not be watched.
#[derive(Debug, thiserror::Error)]
#[error("cannot watch {signal}: {source}")]
pub struct SignalError {
    pub signal: &'static str,
    #[source]
    pub source: std::io::Error,
}

impl crate::Classify for SignalError {
    fn exit_class(&self) -> crate::ExitClass {
        crate::ExitClass::Infra
    }
}

/// A run stopped by the token (exit 130, `BELAY-E130`); the text says why
/// and how to go on.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("interrupted: {0}")]
pub struct Stopped(pub String);

impl crate::Classify for Stopped {
    fn exit_class(&self) -> crate::ExitClass {
        crate::ExitClass::Interrupted
    }
}

impl Stop {
    /// A token nobody has tripped yet.
    pub fn new() -> Self {
        let (tx, rx) = watch::channel(None);
        Self {
            tx: Arc::new(tx),
            rx,
            now: Arc::new(watch::channel(false).0),
            handles_now: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Stop at once (the second level): also trips the first.
    pub fn trip_now(&self, reason: impl Into<String>) {
        self.trip(reason);
        self.now.send_replace(true);
    }

    pub fn is_now(&self) -> bool {
        *self.now.borrow()
    }

    /// Resolves when a stop *now* is asked for.
    pub async fn wait_now(&self) {
        let mut rx = self.now.subscribe();
        while !*rx.borrow_and_update() {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Say that the holder stops at once by itself on [`Stop::wait_now`]:
    /// a second signal then trips it instead of exiting the process.
    pub fn handles_now(&self) {
        self.handles_now.store(true, Ordering::SeqCst);
    }

    /// Ask everything holding a clone to stop; a later reason is ignored.
    pub fn trip(&self, reason: impl Into<String>) {
        let reason = reason.into();
        self.tx.send_if_modified(|cur| {
            if cur.is_some() {
                return false;
            }
            *cur = Some(reason);
            true
        });
    }

    /// Why the run must stop, once it must.
    pub fn reason(&self) -> Option<String> {
        self.rx.borrow().clone()
    }

    pub fn is_set(&self) -> bool {
        self.rx.borrow().is_some()
    }

    /// Resolves with the reason when the token is tripped (at once if it
    /// already is). Never resolves for a token that is never tripped.
    pub async fn wait(&self) -> String {
        let mut rx = self.rx.clone();
        loop {
            if let Some(why) = rx.borrow_and_update().clone() {
                return why;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Run `fut` unless the token trips first: `Err(Stopped(reason))` then,
    /// and `fut` is dropped (its `Drop`s run: containers owned by guards are
    /// removed).
    pub async fn race<T>(&self, fut: impl std::future::Future<Output = T>) -> Result<T, Stopped> {
        tokio::select! {
            biased;
            why = self.wait() => Err(Stopped(why)),
            v = fut => Ok(v),
        }
    }

    /// A receiver of the reason (for code that selects on a watch channel).
    pub fn subscribe(&self) -> watch::Receiver<Option<String>> {
        self.rx.clone()
    }

    /// A token that SIGINT and SIGTERM trip. The first signal asks for a
    /// clean stop (told to `say`, the binary's output); a second one exits
    /// at once with 130 (the next start's reaper removes what is left).
    /// Needs a runtime.
    pub fn on_signals(say: impl Fn(&str) + Send + Sync + 'static) -> Result<Self, SignalError> {
        use tokio::signal::unix::{signal, SignalKind};
        let watch = |k: SignalKind, name: &'static str| {
            signal(k).map_err(|source| SignalError {
                signal: name,
                source,
            })
        };
        let mut int = watch(SignalKind::interrupt(), "SIGINT")?;
        let mut term = watch(SignalKind::terminate(), "SIGTERM")?;
        let stop = Self::new();
        let tripped = stop.clone();
        tokio::spawn(async move {
            loop {
                let name = tokio::select! {
                    _ = int.recv() => "SIGINT",
                    _ = term.recv() => "SIGTERM",
                };
                if tripped.is_set() {
                    if tripped.handles_now.load(Ordering::SeqCst) && !tripped.is_now() {
                        say(&format!(
                            "{name} again: stopping now (again to exit at once)"
                        ));
                        tripped.trip_now(format!("{name} received"));
                        continue;
                    }
                    say(&format!("{name} again: exiting now"));
                    crate::run::end_open_runs_interrupted();
                    std::process::exit(130);
                }
                say(&format!("{name}: stopping cleanly (again to exit at once)"));
                SIGNALLED.store(true, Ordering::SeqCst);
                tripped.trip(format!("{name} received"));
            }
        });
        Ok(stop)
    }
}

/// Set once SIGINT or SIGTERM asked this process to stop.
static SIGNALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a signal asked this process to stop (a run it leaves without an
/// end is `interrupted`, not `failed`).
pub fn signalled() -> bool {
    SIGNALLED.load(Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_reason_wins_and_every_clone_sees_it() {
        let s = Stop::new();
        let c = s.clone();
        assert!(!c.is_set());
        s.trip("SIGINT received");
        s.trip("later");
        assert_eq!(c.reason().as_deref(), Some("SIGINT received"));
        assert_eq!(c.wait().await, "SIGINT received");
    }

    #[tokio::test]
    async fn race_drops_the_work_when_tripped() {
        let s = Stop::new();
        let t = s.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            t.trip("stop");
        });
        let r = s.race(std::future::pending::<()>()).await;
        assert_eq!(r, Err(Stopped("stop".to_string())));
        assert_eq!(Stop::new().race(async { 5 }).await, Ok(5));
    }

    #[tokio::test]
    async fn stopping_now_also_stops() {
        let s = Stop::new();
        assert!(!s.is_now());
        s.trip_now("kill");
        s.wait_now().await;
        assert_eq!(s.wait().await, "kill");
    }
}

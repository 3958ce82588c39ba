//! The labels belay puts on what it creates. `belay=true` marks every container
//! and image belay made; `gc` and the reaper never touch anything without it.

pub const BELAY: &str = "belay";
pub const RUN: &str = "belay.run";
pub const KIND: &str = "belay.kind";
pub const BLOCK: &str = "belay.block";
pub const OWNER_PID: &str = "belay.owner.pid";
pub const OWNER_START: &str = "belay.owner.start";
pub const OWNER_BOOT: &str = "belay.owner.boot";
pub const OWNER_MACHINE: &str = "belay.owner.machine";

/// Owner labels that are blanked on committed images, so that a container a user
/// starts from a belay image never looks owned by a (dead) belay process.
pub const OWNER_LABELS: [&str; 4] = [OWNER_PID, OWNER_START, OWNER_BOOT, OWNER_MACHINE];

/// This machine's stable id (`/etc/machine-id`, else the hostname).
pub fn machine_id() -> String {
    for p in [
        "/etc/machine-id",
        "/var/lib/dbus/machine-id",
        "/etc/hostname",
    ] {
        if let Ok(s) = fs_err::read_to_string(p) {
            let s = s.trim();
            if !s.is_empty() {
                return s.to_string();
            }
        }
    }
    "unknown-machine".to_string()
}

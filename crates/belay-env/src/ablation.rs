//! Ablation modes (FORMATS.md §1): which parts of progress control are on.

use std::fmt;
use std::str::FromStr;

use crate::manifest::ProgressControl;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ablation {
    /// Block forward, block recovery, local repair, checkpoint rollback,
    /// patch-back and final clean replay.
    #[default]
    Full,
    /// No local repair and no patch-back: the first failing block fails the build.
    WithoutLocalRepair,
    /// Repair, but in the live failed container: no restore of the block's checkpoint.
    WithoutCheckpointRollback,
    /// No final clean replay.
    WithoutFinalCleanReplay,
    /// Forward execution command by command; recovery stays block-level.
    SingleCommandForward,
    /// Block forward; recovery around the failed command in the live container.
    SingleCommandRecovery,
    /// The planned setup runs as one whole script.
    WholeScriptForward,
    /// Block forward; recovery replays the whole script up to the failed block.
    WholeScriptRecovery,
}

pub const ALL: [Ablation; 8] = [
    Ablation::Full,
    Ablation::WithoutLocalRepair,
    Ablation::WithoutCheckpointRollback,
    Ablation::WithoutFinalCleanReplay,
    Ablation::SingleCommandForward,
    Ablation::SingleCommandRecovery,
    Ablation::WholeScriptForward,
    Ablation::WholeScriptRecovery,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Granularity {
    Block,
    Command,
    WholeScript,
}

impl Granularity {
    fn as_str(&self) -> &'static str {
        match self {
            Granularity::Block => "block",
            Granularity::Command => "command",
            Granularity::WholeScript => "whole_script",
        }
    }
}

impl Ablation {
    pub fn as_str(&self) -> &'static str {
        match self {
            Ablation::Full => "full",
            Ablation::WithoutLocalRepair => "without-local-repair",
            Ablation::WithoutCheckpointRollback => "without-checkpoint-rollback",
            Ablation::WithoutFinalCleanReplay => "without-final-clean-replay",
            Ablation::SingleCommandForward => "single-command-forward",
            Ablation::SingleCommandRecovery => "single-command-recovery",
            Ablation::WholeScriptForward => "whole-script-forward",
            Ablation::WholeScriptRecovery => "whole-script-recovery",
        }
    }

    pub fn forward(&self) -> Granularity {
        match self {
            Ablation::SingleCommandForward => Granularity::Command,
            Ablation::WholeScriptForward => Granularity::WholeScript,
            _ => Granularity::Block,
        }
    }

    pub fn recovery(&self) -> Granularity {
        match self {
            Ablation::SingleCommandRecovery => Granularity::Command,
            Ablation::WholeScriptRecovery => Granularity::WholeScript,
            _ => Granularity::Block,
        }
    }

    pub fn local_repair(&self) -> bool {
        *self != Ablation::WithoutLocalRepair
    }

    pub fn checkpoint_rollback(&self) -> bool {
        !matches!(
            self,
            Ablation::WithoutCheckpointRollback | Ablation::SingleCommandRecovery
        )
    }

    pub fn final_clean_replay(&self) -> bool {
        *self != Ablation::WithoutFinalCleanReplay
    }

    pub fn progress_control(&self) -> ProgressControl {
        ProgressControl {
            forward_granularity: self.forward().as_str().into(),
            recovery_granularity: if self.local_repair() {
                self.recovery().as_str().into()
            } else {
                "none".into()
            },
            local_repair: self.local_repair(),
            patch_back: self.local_repair(),
            checkpoint_rollback: self.checkpoint_rollback(),
            final_clean_replay: self.final_clean_replay(),
        }
    }
}

impl fmt::Display for Ablation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Ablation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ALL.iter()
            .copied()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown ablation mode {s:?}; one of: {}",
                    ALL.iter()
                        .map(|a| a.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_controls() {
        for a in ALL {
            assert_eq!(a.as_str().parse::<Ablation>().unwrap(), a);
        }
        assert!(Ablation::Full.progress_control().final_clean_replay);
        let pc = Ablation::WithoutLocalRepair.progress_control();
        assert!(!pc.local_repair && !pc.patch_back && pc.recovery_granularity == "none");
        assert!(
            !Ablation::WithoutCheckpointRollback
                .progress_control()
                .checkpoint_rollback
        );
        assert_eq!(
            Ablation::SingleCommandForward
                .progress_control()
                .forward_granularity,
            "command"
        );
        assert_eq!(
            Ablation::SingleCommandRecovery
                .progress_control()
                .recovery_granularity,
            "command"
        );
        assert_eq!(
            Ablation::WholeScriptForward
                .progress_control()
                .forward_granularity,
            "whole_script"
        );
        assert_eq!(
            Ablation::WholeScriptRecovery
                .progress_control()
                .recovery_granularity,
            "whole_script"
        );
        assert!("nope".parse::<Ablation>().unwrap_err().contains("full"));
    }
}

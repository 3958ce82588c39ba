//! One module per command; this one only dispatches. Commands share what
//! they need through `context`, `exit` and `output`, never through each
//! other (the env builder's option flags, used by `build-projects` too, are
//! the one exception, read from `env`).

mod agent;
mod batch;
mod doctor;
pub mod env;
mod image;
mod jobs;
pub mod model;
mod plan;
mod relay;
mod rounds;
mod run;
mod runs;
mod ui;

use crate::cli::{AgentCommand, Cli, Command, EnvCommand, ImageCommand, ModelCommand};
use crate::exit::Failure;
use crate::output::Printer;

pub async fn run(cli: Cli, p: &Printer) -> Result<u8, Failure> {
    match cli.command {
        Command::Doctor(a) => doctor::doctor(p, a).await,
        Command::Image(ImageCommand::Bootstrap(a)) => image::bootstrap(p, a).await,
        Command::Image(ImageCommand::Worker(a)) => image::worker(p, a).await,
        Command::Env(EnvCommand::Plan(a)) => env::plan(p, a).await,
        Command::Env(EnvCommand::Build(a)) => env::build(p, *a).await,
        Command::Env(EnvCommand::Shell(a)) => env::shell(p, a).await,
        Command::Env(EnvCommand::BuildProjects(a)) => batch::build_projects(p, *a).await,
        Command::Env(EnvCommand::Gc(a)) => env::gc(p, a).await,
        Command::Env(EnvCommand::Worker(a)) => batch::worker(p, a).await,
        Command::Model(ModelCommand::Replay(a)) => model::replay(p, a).await,
        Command::Agent(AgentCommand::Run(a)) => agent::run(p, *a).await,
        Command::Run(a) => run::run(p, a).await,
        Command::Plan(c) => plan::plan(p, c).await,
        Command::Rounds(a) => rounds::rounds(p, a).await,
        Command::Jobs(a) => jobs::jobs(p, a).await,
        Command::Runs(c) => runs::runs(p, c).await,
        Command::Ui(a) => ui::ui(p, a).await,
        Command::Relay(a) => relay::relay(a).await,
    }
}

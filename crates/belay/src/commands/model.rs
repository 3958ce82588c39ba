//! `belay model …`: the scripted model server.

use belay_model::replay::{self, ReplayServer};

use crate::cli::ReplayArgs;
use crate::exit::{usage, Failure};
use crate::output::Printer;

pub async fn replay(p: &Printer, a: ReplayArgs) -> Result<u8, Failure> {
    let script = replay::load_script(&a.script).map_err(|e| usage(e.to_string()))?;
    let log = a.log.clone().unwrap_or_else(|| {
        let mut f = a.script.clone().into_os_string();
        f.push(".requests.jsonl");
        f.into()
    });
    let turns = script.turns.len();
    let server = ReplayServer::start(
        script,
        std::net::SocketAddr::new(a.host, a.port),
        Some(log.clone()),
    )
    .await
    .map_err(|e| usage(e.to_string()))?;
    // The first line is the address, for scripts and tests to read. One
    // write; a closed stdout does not stop the server.
    let banner = format!(
        "belay replay: listening on {} ({turns} turns; requests appended to {})\n  OpenAI base URL: {}   Anthropic base URL: {}\n",
        server.url(),
        log.display(),
        server.openai_base(),
        server.url()
    );
    p.raw(banner.as_bytes());
    let stop = crate::context::stop_on_signals()?;
    tokio::select! {
        _ = server.wait() => {}
        _ = stop.wait() => {}
    }
    Ok(0)
}

/// The model to plan and repair with, from the flags, the environment and
/// ./.env; `None` when the rules plan. Also the key, for the redactor.
/// A model setup, and the key's variable name and value (for the redactor).
pub type ModelChoice = (
    belay_model::ModelSetup,
    Option<(String, belay_model::Secret)>,
);

pub fn model_setup(a: &crate::cli::LlmArgs) -> Result<Option<ModelChoice>, Failure> {
    use crate::cli::Planner;
    match a.planner {
        Planner::Rules => Ok(None),
        Planner::Auto => resolve_model(&a.model, false, None),
        Planner::Llm => resolve_model(&a.model, true, None)
            .map_err(|f| usage(format!("--planner llm needs a model: {:#}", f.error))),
    }
}

/// The model from the flags, the environment and ./.env. `required`: no
/// endpoint is an error (else `None`).
pub fn resolve_model(
    a: &crate::cli::ModelArgs,
    required: bool,
    native: Option<belay_model::Api>,
) -> Result<Option<ModelChoice>, Failure> {
    let Some((mut setup, key)) =
        resolve_endpoint(&a.endpoint, a.model.as_deref(), required, native)?
    else {
        return Ok(None);
    };
    let config = &mut setup.config;
    config.stream = !a.llm_no_stream;
    config.retries = a.llm_retries;
    config.retry_delay = a.llm_retry_delay;
    config.timeout = a.llm_timeout;
    config.idle_timeout = a.llm_idle_timeout;
    config.max_output_tokens = a.llm_max_output_tokens;
    Ok(Some((setup, key)))
}

/// A resolved model as an agent's endpoint (its secrets go to the run's
/// redactor through `AgentEndpoint::add_secrets`).
pub fn agent_endpoint(choice: &ModelChoice) -> belay_model::resolve::AgentEndpoint {
    let (setup, key) = choice;
    belay_model::resolve::AgentEndpoint {
        base_url: setup.config.base_url.clone(),
        api: setup.config.api,
        key: key.clone(),
    }
}

/// The endpoint, its key and its prices (`model`: the model's name, if one
/// is asked for); `None` when nothing is configured and nothing is required.
/// `native`: the dialect of the agent it is for, taken when `--llm-api` is
/// not given.
pub fn resolve_endpoint(
    e: &crate::cli::EndpointArgs,
    model: Option<&str>,
    required: bool,
    native: Option<belay_model::Api>,
) -> Result<Option<ModelChoice>, Failure> {
    use belay_model::resolve::{resolve, ModelWanted};
    use belay_model::{Api, PriceTable};
    let settings = belay_model::keys::Settings::for_cwd();
    let api: Api = e
        .llm_api
        .map(Api::from)
        .or(native)
        .unwrap_or(Api::Responses);
    // The flag's default names OpenAI's variable; the Anthropic and Gemini
    // dialects' defaults are their own (ANTHROPIC_API_KEY, GEMINI_API_KEY).
    let key_env = (e.llm_key_env != "OPENAI_API_KEY"
        || !matches!(api, Api::Anthropic | Api::Gemini))
    .then_some(e.llm_key_env.as_str());
    let wanted = ModelWanted {
        api,
        model,
        base_url: e.openai_base_url.as_deref(),
        key_env,
        base_from_env: true,
        required,
    };
    let Some(mut r) = resolve(&wanted, &settings).map_err(|e| usage(e.to_string()))? else {
        return Ok(None);
    };
    if let Some(f) = &e.llm_prices {
        r.setup.prices = PriceTable::load(f).map_err(|e| usage(e.to_string()))?;
    }
    Ok(Some((r.setup, r.key)))
}

//! Which model, where, with which key: resolved here for every mode and flag.
//!
//! The key's variable is the one named (`--llm-key-env`, `llm.api_key_env`),
//! else `ANTHROPIC_API_KEY` for the Anthropic dialect, `GEMINI_API_KEY` for
//! Gemini and `OPENAI_API_KEY` otherwise. The base URL is the one given, else
//! (where the caller allows it) `OPENAI_BASE_URL` / `ANTHROPIC_BASE_URL` /
//! `GOOGLE_GEMINI_BASE_URL`, else the dialect's default. The
//! model is the one given, else `BELAY_MODEL`, else the dialect's default.
//! Settings come from the environment first, then `./.env` ([`Settings`]).

use crate::keys::{Secret, Settings};
use crate::{Api, ClientConfig, ModelError, ModelSetup, PriceTable};

/// What the caller knows.
#[derive(Debug, Clone, Default)]
pub struct ModelWanted<'a> {
    pub api: Api,
    pub model: Option<&'a str>,
    pub base_url: Option<&'a str>,
    /// The key's variable, when one is named.
    pub key_env: Option<&'a str>,
    /// Read the base URL from `OPENAI_BASE_URL` / `ANTHROPIC_BASE_URL` when
    /// none is given.
    pub base_from_env: bool,
    /// No key and no base URL is an error (else: no model).
    pub required: bool,
}

/// A model to use, and its key (its variable's name and value, for the
/// redactor).
#[derive(Debug, Clone)]
pub struct Resolved {
    pub setup: ModelSetup,
    pub key: Option<(String, Secret)>,
}

/// An agent's endpoint as a config or a flag names it: the base URL as
/// given, its dialect, and the variable its key is in (when one is named).
#[derive(Debug, Clone)]
pub struct EndpointWanted<'a> {
    pub base_url: &'a str,
    pub api: Api,
    pub key_env: Option<&'a str>,
}

/// An agent's endpoint, resolved: the key's variable name and value.
#[derive(Debug, Clone)]
pub struct AgentEndpoint {
    pub base_url: String,
    pub api: Api,
    pub key: Option<(String, Secret)>,
}

impl AgentEndpoint {
    /// The endpoint's secrets, for the run's redactor: the key, and any
    /// credentials in the URL (`https://user:pass@…`).
    pub fn add_secrets(&self, redactor: &mut belay_record::Redactor) {
        if let Some((name, k)) = &self.key {
            redactor.add(name.clone(), k.expose());
        }
        redactor.add_url_credentials("model_url", &self.base_url);
    }
}

/// The one function that resolves an agent's endpoint, for every mode: a
/// named key variable must be set (in the environment or `./.env`,
/// [`Settings::for_cwd`]); `ModelError::NoKey` names it otherwise.
pub fn agent_endpoint(
    w: &EndpointWanted<'_>,
    settings: &Settings,
) -> Result<AgentEndpoint, ModelError> {
    let key = match w.key_env {
        // Unnamed: the dialect's own variable when it is set (a CLI then
        // gets the key it reads), else none.
        None => {
            let var = default_key_env(w.api);
            settings.secret(var).map(|k| (var.to_string(), k))
        }
        Some(var) => match settings.secret(var) {
            Some(k) => Some((var.to_string(), k)),
            None => return Err(ModelError::NoKey { var: var.into() }),
        },
    };
    Ok(AgentEndpoint {
        base_url: w.base_url.to_string(),
        api: w.api,
        key,
    })
}

/// The key's variable for `api` when none is named.
pub fn default_key_env(api: Api) -> &'static str {
    match api {
        Api::Anthropic => "ANTHROPIC_API_KEY",
        Api::Gemini => "GEMINI_API_KEY",
        Api::Responses | Api::ChatCompletions => "OPENAI_API_KEY",
    }
}

/// Resolve what `w` asks for against `settings`. `Ok(None)`: no model is
/// configured and none is required.
pub fn resolve(w: &ModelWanted<'_>, settings: &Settings) -> Result<Option<Resolved>, ModelError> {
    let key_env = w
        .key_env
        .map(str::to_string)
        .unwrap_or_else(|| default_key_env(w.api).to_string());
    let key = settings.secret(&key_env);
    let base_env = match w.api {
        Api::Anthropic => "ANTHROPIC_BASE_URL",
        Api::Gemini => "GOOGLE_GEMINI_BASE_URL",
        Api::Responses | Api::ChatCompletions => "OPENAI_BASE_URL",
    };
    let base = w
        .base_url
        .map(str::to_string)
        .or_else(|| w.base_from_env.then(|| settings.var(base_env)).flatten());
    if key.is_none() && base.is_none() {
        if w.required {
            return Err(ModelError::NoKey { var: key_env });
        }
        return Ok(None);
    }
    let model = w
        .model
        .map(str::to_string)
        .or_else(|| settings.var("BELAY_MODEL"))
        .unwrap_or_else(|| {
            match w.api {
                Api::Anthropic => "claude-sonnet-4-5",
                Api::Gemini => "gemini-2.5-flash",
                Api::Responses | Api::ChatCompletions => "gpt-5-mini",
            }
            .to_string()
        });
    let base = base.unwrap_or_else(|| ClientConfig::default_base_url(w.api).to_string());
    let mut config = ClientConfig::new(w.api, &base, &model);
    config.key = key.clone();
    Ok(Some(Resolved {
        setup: ModelSetup {
            config,
            prices: PriceTable::builtin(),
        },
        key: key.map(|k| (key_env, k)),
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Every mode's agent endpoint: the key from the environment or the
    /// user's `.env`, a named but missing key refused by name, and the
    /// key and the URL's credentials in the redactor.
    #[test]
    fn an_agent_endpoint_takes_its_key_by_the_one_rule() {
        let s = settings("BELAY_TEST_EP_KEY=sk-from-dotenv-1234\n");
        let w = EndpointWanted {
            base_url: "https://bob:pw-in-url-99@models.example/v1",
            api: Api::Anthropic,
            key_env: Some("BELAY_TEST_EP_KEY"),
        };
        let e = agent_endpoint(&w, &s).unwrap();
        assert_eq!(e.key.as_ref().unwrap().1.expose(), "sk-from-dotenv-1234");
        let mut r = belay_record::Redactor::default();
        e.add_secrets(&mut r);
        let out = r.redact("key sk-from-dotenv-1234 url pw-in-url-99");
        assert!(
            !out.contains("sk-from-dotenv-1234") && !out.contains("pw-in-url-99"),
            "{out}"
        );
        let missing = EndpointWanted {
            key_env: Some("BELAY_TEST_EP_MISSING"),
            ..w.clone()
        };
        match agent_endpoint(&missing, &s) {
            Err(ModelError::NoKey { var }) => assert_eq!(var, "BELAY_TEST_EP_MISSING"),
            other => panic!("{other:?}"),
        }
        // Unnamed: the dialect's own variable, when it is set.
        let keyless = EndpointWanted { key_env: None, ..w };
        assert!(agent_endpoint(&keyless, &s)
            .unwrap()
            .key
            .is_none_or(|(v, _)| v == "ANTHROPIC_API_KEY"));
        let own = settings("ANTHROPIC_API_KEY=sk-ant-own-5678\n");
        let e = agent_endpoint(&keyless, &own).unwrap();
        assert_eq!(e.key.as_ref().unwrap().0, "ANTHROPIC_API_KEY");
    }

    fn settings(dotenv: &str) -> Settings {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(".env"), dotenv).unwrap();
        Settings::load(d.path())
    }

    #[test]
    fn keys_bases_and_models_resolve_one_way() {
        let s = settings("BELAY_TEST_KEY_1=k-123\nBELAY_MODEL=m-from-env\n");
        let r = resolve(
            &ModelWanted {
                api: Api::ChatCompletions,
                key_env: Some("BELAY_TEST_KEY_1"),
                ..Default::default()
            },
            &s,
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.setup.config.model, "m-from-env");
        assert_eq!(r.key.as_ref().unwrap().0, "BELAY_TEST_KEY_1");
        assert_eq!(r.key.unwrap().1.expose(), "k-123");
        // A base URL alone is enough (a server that needs no key).
        let r = resolve(
            &ModelWanted {
                api: Api::Anthropic,
                base_url: Some("http://127.0.0.1:9/v1"),
                key_env: Some("BELAY_TEST_KEY_NONE"),
                model: Some("x"),
                ..Default::default()
            },
            &Settings::env_only(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.setup.config.base_url, "http://127.0.0.1:9/v1");
        assert!(r.key.is_none());
        // Neither: nothing, or an error naming the variable when required.
        let none = ModelWanted {
            key_env: Some("BELAY_TEST_KEY_NONE"),
            ..Default::default()
        };
        assert!(resolve(&none, &Settings::env_only()).unwrap().is_none());
        let e = resolve(
            &ModelWanted {
                required: true,
                ..none
            },
            &Settings::env_only(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("BELAY_TEST_KEY_NONE"), "{e}");
        assert_eq!(default_key_env(Api::Anthropic), "ANTHROPIC_API_KEY");
        assert_eq!(default_key_env(Api::Gemini), "GEMINI_API_KEY");
    }
}

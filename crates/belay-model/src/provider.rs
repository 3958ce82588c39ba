//! Provider-prefixed model names (`openai/gpt-4o`, `anthropic/claude-…`), the
//! form LiteLLM-based tools (agentic-dev-loop, OpenHands) use: the prefix
//! names the wire dialect, and the rest is the model the endpoint is asked for.

use crate::Api;

/// A provider prefix and what belay makes of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Provider {
    /// The prefix without its slash, e.g. `openai`.
    pub prefix: &'static str,
    pub api: Api,
    /// Whether the provider has a default endpoint belay knows (the vendor's
    /// own); every other one needs `base_url`.
    pub has_default_endpoint: bool,
}

/// The prefixes belay understands. Each is an OpenAI-compatible Chat
/// Completions endpoint except `anthropic`.
const PROVIDERS: &[Provider] = &[
    Provider {
        prefix: "openai",
        api: Api::ChatCompletions,
        has_default_endpoint: true,
    },
    Provider {
        prefix: "anthropic",
        api: Api::Anthropic,
        has_default_endpoint: true,
    },
    p("deepseek"),
    p("openrouter"),
    p("groq"),
    p("together_ai"),
    p("mistral"),
    p("fireworks_ai"),
    p("xai"),
    p("hosted_vllm"),
    p("lm_studio"),
    p("ollama_chat"),
];

const fn p(prefix: &'static str) -> Provider {
    Provider {
        prefix,
        api: Api::ChatCompletions,
        has_default_endpoint: false,
    }
}

/// Split `provider/model` when the prefix is a known provider: (provider,
/// model name to send). `meta-llama/Llama-3` (an organisation, not a
/// provider) is left whole.
pub fn split(model: &str) -> Option<(Provider, &str)> {
    let (prefix, rest) = model.split_once('/')?;
    if rest.is_empty() {
        return None;
    }
    PROVIDERS
        .iter()
        .find(|p| p.prefix == prefix)
        .map(|p| (*p, rest))
}

/// The known prefixes, for messages.
pub fn known() -> Vec<&'static str> {
    PROVIDERS.iter().map(|p| p.prefix).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_prefix_names_the_dialect_and_is_not_sent() {
        let (p, m) = split("openai/deepseek-v4-pro").expect("known");
        assert_eq!((p.api, m), (Api::ChatCompletions, "deepseek-v4-pro"));
        let (p, m) = split("anthropic/claude-sonnet-4").expect("known");
        assert_eq!((p.api, m), (Api::Anthropic, "claude-sonnet-4"));
        // Only the first segment is the provider: openrouter's own names keep theirs.
        let (p, m) = split("openrouter/openai/gpt-4o").expect("known");
        assert_eq!((p.prefix, m), ("openrouter", "openai/gpt-4o"));
        assert!(!p.has_default_endpoint);
    }

    #[test]
    fn an_organisation_prefix_is_not_a_provider() {
        assert_eq!(split("meta-llama/Llama-3-8B"), None);
        assert_eq!(split("gpt-4o"), None);
        assert_eq!(split("openai/"), None);
    }
}

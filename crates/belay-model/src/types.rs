use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The wire dialect a model endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Api {
    /// OpenAI Responses, `POST {base}/responses`.
    #[default]
    Responses,
    /// OpenAI Chat Completions, `POST {base}/chat/completions`.
    ChatCompletions,
    /// Anthropic Messages, `POST {base}/v1/messages`.
    Anthropic,
    /// Google Gemini (Generative Language API),
    /// `POST {base}/v1beta/models/{model}:generateContent` (streamed:
    /// `:streamGenerateContent?alt=sse`).
    Gemini,
}

impl Api {
    pub fn as_str(self) -> &'static str {
        match self {
            Api::Responses => "responses",
            Api::ChatCompletions => "chat-completions",
            Api::Anthropic => "anthropic",
            Api::Gemini => "gemini",
        }
    }
}

impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Api {
    type Err = crate::ModelError;
    fn from_str(s: &str) -> Result<Self, crate::ModelError> {
        match s {
            "responses" => Ok(Api::Responses),
            "chat-completions" | "chat" => Ok(Api::ChatCompletions),
            "anthropic" | "messages" => Ok(Api::Anthropic),
            "gemini" | "google" => Ok(Api::Gemini),
            other => Err(crate::ModelError::UnknownApi {
                value: other.to_string(),
            }),
        }
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: serde_json::Value,
}

/// A tool call the model made. `arguments` is the JSON text the model wrote,
/// unparsed: the caller validates it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// One conversation item, dialect-neutral.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    User {
        content: String,
    },
    Assistant {
        content: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    /// The result of a tool call, sent back to the model.
    Tool {
        call_id: String,
        name: String,
        content: String,
    },
}

impl Message {
    pub fn user(text: impl Into<String>) -> Self {
        Message::User {
            content: text.into(),
        }
    }
}

/// A model call.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Request {
    /// The system prompt.
    pub instructions: Option<String>,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    /// Ask for a JSON object (where the dialect has a switch for it).
    pub json_output: bool,
    pub max_output_tokens: Option<u32>,
    pub temperature: Option<f32>,
}

/// Token counts of one call (or a sum of calls).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
}

impl Usage {
    pub fn add(&mut self, o: &Usage) {
        self.input_tokens += o.input_tokens;
        self.cached_tokens += o.cached_tokens;
        self.output_tokens += o.output_tokens;
        self.reasoning_tokens += o.reasoning_tokens;
    }
}

/// What the model answered.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Response {
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    /// Why generation stopped, as the server said it (`stop`, `tool_calls`, `end_turn`...).
    pub finish_reason: Option<String>,
    pub id: Option<String>,
    pub model: Option<String>,
    /// The server sent no token counts; `usage` is an estimate.
    #[serde(default)]
    pub usage_estimated: bool,
}

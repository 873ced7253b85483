//! The prompt: chat wrapping (spec 3.4) and tokenization with the checkpoint's tokenizer.json.

use anyhow::{anyhow, bail, Result};
use std::path::Path;

pub const MAX_TOKENS: usize = 4096;

/// The Qwen3.5 chat template for one user turn with the generation prompt and thinking on:
/// `<|im_start|>user\n{prompt|trim}<|im_end|>\n<|im_start|>assistant\n<think>\n`.
pub fn chat_wrap(prompt: &str) -> String {
    format!("<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n<think>\n", trim(prompt))
}

/// The prompt as the chat template takes it: Jinja's `trim` filter, Python's `str.strip()`,
/// which strips Unicode whitespace (what a picture records as its prompt).
pub fn trim(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

/// Token counts before the cut of the texts that `max_tokens` cut (None: not cut).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cut {
    pub prompt: Option<usize>,
    pub negative: Option<usize>,
}

pub struct PromptTokenizer {
    tok: tokenizers::Tokenizer,
}

/// Token ids of one prompt, and whether they were cut to the limit.
#[derive(Clone, Debug, PartialEq)]
pub struct Tokens {
    pub ids: Vec<u32>,
    /// Length before truncation, if it was truncated.
    pub truncated_from: Option<usize>,
}

impl PromptTokenizer {
    pub fn from_file(path: &Path) -> Result<Self> {
        if !path.is_file() {
            bail!("tokenizer not found: {}", path.display());
        }
        let bytes = crate::bounded::read_bounded(path, crate::bounded::MAX_TOKENIZER, "tokenizer")?;
        let tok = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| anyhow!("cannot load tokenizer {}: {e}", path.display()))?;
        Ok(PromptTokenizer { tok })
    }

    /// Wrap, tokenize (special tokens parsed, no BOS/EOS added) and keep the first
    /// `max_tokens` ids.
    pub fn encode(&self, prompt: &str, max_tokens: usize) -> Result<Tokens> {
        if !(1..=MAX_TOKENS).contains(&max_tokens) {
            bail!("--max-tokens must be in 1..={MAX_TOKENS}, got {max_tokens}");
        }
        let text = chat_wrap(prompt);
        let enc = self.tok.encode_fast(text.as_str(), true).map_err(|e| anyhow!("tokenizing the prompt failed: {e}"))?;
        let mut ids = enc.get_ids().to_vec();
        let mut truncated_from = None;
        if ids.len() > max_tokens {
            truncated_from = Some(ids.len());
            ids.truncate(max_tokens);
        }
        Ok(Tokens { ids, truncated_from })
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tok.token_to_id(token)
    }
}

/// Read a prompt file: it must be valid UTF-8.
pub fn read_prompt_file(path: &Path) -> Result<String> {
    crate::bounded::read_text_bounded(path, crate::bounded::MAX_PROMPT_FILE, "the prompt file")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_trims_outer_whitespace_and_keeps_inner_newlines() {
        assert_eq!(chat_wrap("  a\n b \n"), "<|im_start|>user\na\n b<|im_end|>\n<|im_start|>assistant\n<think>\n");
        assert_eq!(chat_wrap(""), "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n<think>\n");
    }
}

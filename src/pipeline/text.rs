//! The text stage: prompts to chat-wrapped token ids, ids to the encoder's hidden states as the
//! DiT is fed them (`generate`, batch mode, `moss encode` and the server all encode through here).

use super::Progress;
use crate::backend::ops::EncoderOps;
use crate::checkpoint::Checkpoint;
use crate::embeds::Encoded;
use crate::model::encoder::Encoder;
use crate::options::Precision;
use crate::prompt::{Cut, PromptTokenizer};
use crate::tensor::Tensor;
use anyhow::Result;

/// Encode `prompt` and `negative` with the checkpoint's encoder; hidden states as
/// [`stage_boundary`] keeps them at `precision`.
pub fn encode_prompts<B: EncoderOps>(
    b: &B,
    ck: &Checkpoint,
    texts: &[&str],
    max_tokens: usize,
    precision: Precision,
    progress: &mut dyn Progress,
) -> Result<(Vec<Encoded>, Cut)> {
    let (tokens, cut) = tokenize_prompts(ck, texts, max_tokens, progress)?;
    Ok((encode_ids(b, ck, texts, tokens, precision, progress)?, cut))
}

/// The chat-wrapped token ids of `texts` (the prompt first, then the negative), each cut at
/// `max_tokens` with a warning, and what was cut.
pub fn tokenize_prompts(ck: &Checkpoint, texts: &[&str], max_tokens: usize, progress: &mut dyn Progress) -> Result<(Vec<Vec<u32>>, Cut)> {
    let tok = PromptTokenizer::from_file(&ck.tokenizer_path())?;
    let mut tokens = vec![];
    let mut cut = Cut::default();
    for (i, t) in texts.iter().enumerate() {
        let tk = tok.encode(t, max_tokens)?;
        // An empty negative is the chat template's tokens alone: nobody gave it, so its cut
        // (recorded in the picture) is not worth a warning.
        let given = i == 0 || !crate::prompt::trim(t).is_empty();
        if let (Some(n), true) = (tk.truncated_from, given) {
            let what = if i == 0 { "prompt" } else { "negative prompt" };
            progress.warn(&format!("{what} has {n} tokens; keeping the first {max_tokens}"));
        }
        *(if i == 0 { &mut cut.prompt } else { &mut cut.negative }) = tk.truncated_from;
        tokens.push(tk.ids);
    }
    Ok((tokens, cut))
}

/// [`encode_prompts`] on ids already made by [`tokenize_prompts`] (one list per text).
pub fn encode_ids<B: EncoderOps>(
    b: &B,
    ck: &Checkpoint,
    texts: &[&str],
    tokens: Vec<Vec<u32>>,
    precision: Precision,
    progress: &mut dyn Progress,
) -> Result<Vec<Encoded>> {
    progress.stage("encode");
    let comp = ck.open_component("text_encoder")?;
    let enc = Encoder::load(b, &comp, &ck.encoder)?;
    let mut out = vec![];
    for (t, ids) in texts.iter().zip(tokens) {
        let hidden = hidden_states(b, &enc, &ids, precision)?;
        out.push(Encoded { text: t.to_string(), ids, hidden });
    }
    Ok(out)
}

/// The encoder's hidden states of one token list as the DiT is fed them ([`stage_boundary`]):
/// `generate`, batch mode and the server all encode through here.
pub fn hidden_states<B: EncoderOps>(b: &B, enc: &Encoder<B>, ids: &[u32], precision: Precision) -> Result<Tensor> {
    boundary(enc.forward(b, ids)?, precision)
}

/// [`hidden_states`] of each of a picture's prompts (the prompt, the negative), through the
/// encoder together ([`Encoder::hidden_all`]: a streamed layer moves once for both).
pub fn hidden_states_all<B: EncoderOps>(b: &B, enc: &Encoder<B>, prompts: &[Vec<u32>], precision: Precision) -> Result<Vec<Tensor>> {
    let ids: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    enc.hidden_all(b, &ids)?.iter().map(|h| boundary(b.download(h)?, precision)).collect()
}

/// Encoder output `h` as the DiT is fed it, checked finite.
fn boundary(h: Tensor, precision: Precision) -> Result<Tensor> {
    let h = stage_boundary(h, precision);
    crate::tensor::ensure_finite("the text encoder's hidden states", &h.data)?;
    Ok(h)
}

/// Hidden states between the encoder and the DiT: rounded to bf16 at `--precision bf16` (the
/// spec's summary, step 2: the pipeline keeps `last_hidden_state` in bf16) and at `fp8` and `int8`
/// (whose encoder is the bf16 one), left fp32 at `--precision fp32`, so that mode is fp32 end to end.
pub fn stage_boundary(h: Tensor, precision: Precision) -> Tensor {
    match precision {
        Precision::Bf16 | Precision::Fp8 | Precision::Int8 => h.round_bf16(),
        Precision::Fp32 => h,
    }
}

//! The Qwen3.5 text backbone (spec section 3): prompt ids → final-norm hidden states.
//!
//! Names follow the checkpoint (`language_model.` is the component's prefix). Every layer is
//! `x += mixer(input_layernorm(x)); x += mlp(post_attention_layernorm(x))`, the mixer being a
//! gated full attention (`self_attn`) or a Gated DeltaNet (`linear_attn`); then `norm`.

use super::stream::{self, Fetched, Streamer};
use crate::backend::ops::encoder::split_cols;
use crate::backend::ops::EncoderOps;
use crate::checkpoint::{
    config::{EncoderConfig, LayerType},
    Component,
};
use crate::tensor::Tensor;
use anyhow::{ensure, Result};
use std::slice::from_ref;

/// The token embedding table's name.
const EMBED: &str = "embed_tokens.weight";

/// Gated full attention (`self_attn.*`): its norms (its matrices are the layer's [`LayerMats`]).
struct Attention<B: EncoderOps> {
    q_norm: B::T,
    k_norm: B::T,
}

/// Gated DeltaNet (`linear_attn.*`): its vectors (its matrices are the layer's [`LayerMats`]).
struct DeltaNet<B: EncoderOps> {
    conv1d: B::T,
    dt_bias: B::T,
    a_log: B::T,
    norm: B::T,
}

enum Mixer<B: EncoderOps> {
    Full(Attention<B>),
    Linear(DeltaNet<B>),
}

/// A layer's vectors stay resident; its matrices are resident or fetched per forward.
struct Layer<B: EncoderOps> {
    input_layernorm: B::T,
    post_attention_layernorm: B::T,
    mixer: Mixer<B>,
    /// `None`: streamed (fetched from the checkpoint each time a forward reaches this layer).
    mats: Option<LayerMats<B>>,
}

/// The matrices of one layer: the bytes streaming moves. Linears that read one input are stacked
/// at load (their rows one under the other), so one [`EncoderOps::linear_cat`] gives their
/// products side by side.
pub struct LayerMats<B: EncoderOps> {
    /// Rows `[q_proj ; k_proj ; v_proj]` (full attention) or `[in_proj_qkv ; in_proj_z ;
    /// in_proj_a ; in_proj_b]` (DeltaNet).
    mixer_in: B::T,
    /// `o_proj` or `out_proj`.
    mixer_out: B::T,
    /// Rows `[gate_proj ; up_proj]`.
    mlp_in: B::T,
    down_proj: B::T,
}

/// The checkpoint tensors of layer `i`'s matrices ([`LayerMats`], what streaming moves), each a
/// dim-0 stack of these names: `mixer_in`, `mixer_out`, `mlp_in`, `down_proj`.
pub fn layer_matrix_names(cfg: &EncoderConfig, i: usize) -> Vec<Vec<String>> {
    let w = |n: &str| format!("layers.{i}.{n}.weight");
    let (mixer_in, mixer_out) = match cfg.layer_types[i] {
        LayerType::Full => (vec![w("self_attn.q_proj"), w("self_attn.k_proj"), w("self_attn.v_proj")], w("self_attn.o_proj")),
        LayerType::Linear => {
            (["in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b"].iter().map(|n| w(&format!("linear_attn.{n}"))).collect(), w("linear_attn.out_proj"))
        }
    };
    vec![mixer_in, vec![mixer_out], vec![w("mlp.gate_proj"), w("mlp.up_proj")], vec![w("mlp.down_proj")]]
}

impl<B: EncoderOps> LayerMats<B> {
    fn from_parts(m: Vec<B::T>) -> Result<Self> {
        let [mixer_in, mixer_out, mlp_in, down_proj] = stream::parts(m)?;
        Ok(LayerMats { mixer_in, mixer_out, mlp_in, down_proj })
    }
}

/// The token embedding table (`embed_tokens.weight`).
enum Embedding<B: EncoderOps> {
    Device(B::T),
    /// Left in the checkpoint (host memory) when the layers stream: each prompt's rows are
    /// gathered there and uploaded.
    Host,
}

pub struct Encoder<B: EncoderOps> {
    cfg: EncoderConfig,
    embed_tokens: Embedding<B>,
    layers: Vec<Layer<B>>,
    norm: B::T,
    /// Where the streamed layers come from (`None`: every layer is resident).
    stream: Option<Streamer<B>>,
}

impl<B: EncoderOps> Encoder<B> {
    /// Every weight, in one load batch.
    pub fn load(b: &B, c: &Component, cfg: &EncoderConfig) -> Result<Self> {
        b.load_batch(|b| Self::load_layers(b, c, cfg, usize::MAX))
    }

    /// The first `resident` layers' matrices resident, the rest's fetched from `c` (kept open, a
    /// file mapping) each time a forward reaches them ([`stream`]: fetched ahead into reused
    /// slots): the same values through the same kernels, so the hidden states are identical to
    /// [`Encoder::load`]'s.
    pub fn load_streamed(b: &B, c: Component, cfg: &EncoderConfig, resident: usize) -> Result<Self> {
        let mut enc = b.load_batch(|b| Self::load_layers(b, &c, cfg, resident))?;
        let names = (0..cfg.num_layers()).map(|i| (i >= resident).then(|| layer_matrix_names(cfg, i))).collect();
        enc.stream = Streamer::new(c, names);
        Ok(enc)
    }

    /// How many layers are resident (the rest stream).
    pub fn resident_layers(&self) -> usize {
        self.layers.iter().filter(|l| l.mats.is_some()).count()
    }

    /// Drop the layers fetched ahead for a next forward (the encoding is over: their slots'
    /// memory may go with the stage's).
    pub fn end_stream(&self) {
        if let Some(s) = &self.stream {
            s.cancel();
        }
    }

    fn load_layers(b: &B, c: &Component, cfg: &EncoderConfig, resident: usize) -> Result<Self> {
        let w = |n: &str| b.load(c, n);
        let layers = (0..cfg.num_layers()).map(|i| Self::load_layer(b, c, cfg, i, i < resident)).collect::<Result<_>>()?;
        let embed_tokens = if resident < cfg.num_layers() { Embedding::Host } else { Embedding::Device(w(EMBED)?) };
        Ok(Encoder { cfg: cfg.clone(), embed_tokens, layers, norm: w("norm.weight")?, stream: None })
    }

    /// Layer `i`'s vectors, and its matrices when `with_mats`.
    fn load_layer(b: &B, c: &Component, cfg: &EncoderConfig, i: usize, with_mats: bool) -> Result<Layer<B>> {
        let w = |n: &str| b.load(c, &format!("layers.{i}.{n}"));
        let mixer = match cfg.layer_types[i] {
            LayerType::Full => Mixer::Full(Attention { q_norm: w("self_attn.q_norm.weight")?, k_norm: w("self_attn.k_norm.weight")? }),
            LayerType::Linear => Mixer::Linear(DeltaNet {
                conv1d: w("linear_attn.conv1d.weight")?,
                dt_bias: w("linear_attn.dt_bias")?,
                a_log: w("linear_attn.A_log")?,
                norm: w("linear_attn.norm.weight")?,
            }),
        };
        let mats = if with_mats { Some(LayerMats::from_parts(crate::backend::load_groups(b, c, &layer_matrix_names(cfg, i))?)?) } else { None };
        Ok(Layer { input_layernorm: w("input_layernorm.weight")?, post_attention_layernorm: w("post_attention_layernorm.weight")?, mixer, mats })
    }

    /// The weight provider: layer `i`'s matrices, resident, or streamed ([`stream::weights`]).
    fn layer_weights(&self, b: &B, i: usize) -> Result<Fetched<'_, LayerMats<B>>> {
        stream::weights(b, self.stream.as_ref(), i, self.layers[i].mats.as_ref(), LayerMats::from_parts)
    }

    /// Hidden states `[L, hidden]` (f32) of one unpadded prompt, on the host.
    pub fn forward(&self, b: &B, ids: &[u32]) -> Result<Tensor> {
        b.download(&self.hidden(b, ids)?)
    }

    /// The final-norm hidden states `[L, hidden]` of one unpadded prompt, left on the backend.
    pub fn hidden(&self, b: &B, ids: &[u32]) -> Result<B::T> {
        Ok(self.hidden_all(b, &[ids])?.remove(0))
    }

    /// The final-norm hidden states of several prompts (a picture's prompt and negative), each
    /// exactly what [`Encoder::hidden`] gives it. With streamed layers the prompts go through the
    /// layers together: a streamed layer is fetched once for all of them. With every layer
    /// resident they run one after the other (fewer activations alive at once).
    pub fn hidden_all(&self, b: &B, prompts: &[&[u32]]) -> Result<Vec<B::T>> {
        if self.stream.is_none() && prompts.len() > 1 {
            return prompts.iter().map(|ids| self.hidden(b, ids)).collect();
        }
        // Per prompt, the residual stream x and its norm h that the next sublayer reads.
        let mut states = prompts.iter().map(|ids| self.begin(b, ids)).collect::<Result<Vec<_>>>()?;
        for (i, layer) in self.layers.iter().enumerate() {
            let mats = self.layer_weights(b, i)?;
            states = states.into_iter().map(|s| self.layer(b, layer, &mats, s, self.norm_before(i + 1))).collect::<Result<_>>()?;
            mats.done(b)?;
            if let Some(s) = &self.stream {
                s.prefetch(b, i + 1..self.layers.len())?;
            }
        }
        Ok(states.into_iter().map(|(_, h)| h).collect())
    }

    /// The norm the residual stream goes through before layer `i` (past the last: the final norm).
    fn norm_before(&self, i: usize) -> &B::T {
        self.layers.get(i).map_or(&self.norm, |l| &l.input_layernorm)
    }

    /// A prompt's residual stream `x` (its token embeddings) and the first layer's norm of it.
    fn begin(&self, b: &B, ids: &[u32]) -> Result<(B::T, B::T)> {
        ensure!(!ids.is_empty(), "the encoder needs at least one token");
        let x = match (&self.embed_tokens, &self.stream) {
            (Embedding::Device(table), _) => b.embed(table, ids)?,
            (Embedding::Host, Some(s)) => b.embed_from_host(s.source(), EMBED, ids)?,
            (Embedding::Host, None) => anyhow::bail!("the embedding table is on the host but no checkpoint is open"),
        };
        let h = b.rms_norm(&x, Some(self.norm_before(0)), self.cfg.rms_norm_eps, true)?;
        Ok((x, h))
    }

    /// One layer on the stream `x` and its input norm `h`: the new stream and its norm by `next`
    /// (the next layer's input_layernorm, or the final norm); each residual add is fused with the
    /// norm that follows it.
    fn layer(&self, b: &B, layer: &Layer<B>, mats: &LayerMats<B>, (x, h): (B::T, B::T), next: &B::T) -> Result<(B::T, B::T)> {
        let eps = self.cfg.rms_norm_eps;
        // the mixer's output before its projection
        let m = match &layer.mixer {
            Mixer::Full(a) => self.attention(b, a, &mats.mixer_in, &h)?,
            Mixer::Linear(d) => self.delta_net(b, d, &mats.mixer_in, &h)?,
        };
        drop(h);
        let (x, h) = b.linear_add_rms_norm(&m, &mats.mixer_out, &x, &layer.post_attention_layernorm, eps)?;
        drop(m);
        let ffn = b.dims(&mats.down_proj)[1];
        let y = b.linear_cat(&h, from_ref(&mats.mlp_in))?;
        drop(h);
        let [gate, up] = split_cols(&y, [ffn, ffn]);
        let f = b.silu_mul_cols(gate, up)?;
        drop(y);
        b.linear_add_rms_norm(&f, &mats.down_proj, &x, next, eps)
    }

    /// The gated attention's output before `o_proj`, `[L, H·hd]`. `q_proj` holds, per head,
    /// `head_dim` query values then `head_dim` gate values; `y` = `[q_proj | k_proj | v_proj]`
    /// products side by side, each op below reads its columns.
    fn attention(&self, b: &B, a: &Attention<B>, w_in: &B::T, x: &B::T) -> Result<B::T> {
        let c = &self.cfg;
        let hd = c.head_dim;
        let heads = (c.num_attention_heads, c.num_key_value_heads, hd);
        let y = b.linear_cat(x, from_ref(w_in))?;
        let (q, k, v) = b.attn_qkv_norm_rope(&y, heads, &a.q_norm, &a.k_norm, c.rms_norm_eps, c.rotary_dim(), c.rope_theta)?;
        b.causal_attention_gated_y(&q, &k, &v, &y, 1.0 / (hd as f64).sqrt())
    }

    /// The Gated DeltaNet's output before `out_proj`, `[L, Hv·dv]`.
    fn delta_net(&self, b: &B, d: &DeltaNet<B>, w_in: &B::T, x: &B::T) -> Result<B::T> {
        let c = &self.cfg;
        let l = b.dims(x)[0];
        let (nk, dk, nv, dv) = (c.linear_num_key_heads, c.linear_key_head_dim, c.linear_num_value_heads, c.linear_value_head_dim);
        // the joined projection: [q | k | v], z, a, b per token
        let vd = nv * dv;
        let y = b.linear_cat(x, from_ref(w_in))?;
        let [qkv, z, a, beta_in] = split_cols(&y, [2 * nk * dk + vd, vd, nv, nv]);
        // the conv output holds q, k, v side by side; the delta rule reads them in place
        let (qkv, g, beta) = b.conv_gates_cols(qkv, &d.conv1d, (a, beta_in), &d.a_log, &d.dt_bias)?;
        let o = b.gated_delta_rule_qkv(&qkv, (nk, dk, nv, dv), &g, &beta)?;
        let o = b.gated_rms_norm_cols(&o, z, &d.norm, c.rms_norm_eps)?;
        b.reshape(&o, &[l, vd])
    }
}

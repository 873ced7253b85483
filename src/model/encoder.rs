//! The Qwen3.5 text backbone (spec section 3): prompt ids → final-norm hidden states.
//!
//! Names follow the checkpoint (`language_model.` is the component's prefix). Every layer is
//! `x += mixer(input_layernorm(x)); x += mlp(post_attention_layernorm(x))`, the mixer being a
//! gated full attention (`self_attn`) or a Gated DeltaNet (`linear_attn`); then `norm`.

use crate::backend::ops::encoder::split_cols;
use crate::backend::ops::EncoderOps;
use crate::checkpoint::{
    config::{EncoderConfig, LayerType},
    Component,
};
use crate::tensor::Tensor;
use anyhow::{ensure, Result};

/// The token embedding table's name.
const EMBED: &str = "embed_tokens.weight";

/// Gated full attention (`self_attn.*`).
struct Attention<B: EncoderOps> {
    /// `q_proj`, `k_proj`, `v_proj` as [`EncoderOps::cat_weights`] made them.
    qkv: Vec<B::T>,
    o_proj: B::T,
    q_norm: B::T,
    k_norm: B::T,
}

/// Gated DeltaNet (`linear_attn.*`).
struct DeltaNet<B: EncoderOps> {
    /// `in_proj_qkv`, `in_proj_z`, `in_proj_a`, `in_proj_b` as [`EncoderOps::cat_weights`] made
    /// them: one input, their products side by side in that order.
    in_proj: Vec<B::T>,
    conv1d: B::T,
    dt_bias: B::T,
    a_log: B::T,
    norm: B::T,
    out_proj: B::T,
}

enum Mixer<B: EncoderOps> {
    Full(Attention<B>),
    Linear(DeltaNet<B>),
}

struct Layer<B: EncoderOps> {
    input_layernorm: B::T,
    post_attention_layernorm: B::T,
    mixer: Mixer<B>,
    /// `gate_proj`, `up_proj` as [`EncoderOps::cat_weights`] made them.
    mlp_in: Vec<B::T>,
    down_proj: B::T,
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
    /// `None`: streamed from `source` each forward.
    layers: Vec<Option<Layer<B>>>,
    norm: B::T,
    source: Option<Component>,
}

/// A layer as the weight provider hands it out: resident, or loaded for this use.
enum Fetched<'a, L> {
    Resident(&'a L),
    Streamed(L),
}

impl<L> std::ops::Deref for Fetched<'_, L> {
    type Target = L;
    fn deref(&self) -> &L {
        match self {
            Fetched::Resident(l) => l,
            Fetched::Streamed(l) => l,
        }
    }
}

impl<B: EncoderOps> Encoder<B> {
    /// Every weight, in one load batch.
    pub fn load(b: &B, c: &Component, cfg: &EncoderConfig) -> Result<Self> {
        b.load_batch(|b| Self::load_layers(b, c, cfg, usize::MAX))
    }

    /// The first `resident` layers resident, the rest loaded from `c` (kept open, a file mapping)
    /// each time a forward reaches them: the same values through the same kernels, so the hidden
    /// states are identical to [`Encoder::load`]'s.
    pub fn load_streamed(b: &B, c: Component, cfg: &EncoderConfig, resident: usize) -> Result<Self> {
        let mut enc = b.load_batch(|b| Self::load_layers(b, &c, cfg, resident))?;

        if resident < cfg.num_layers() {
            enc.source = Some(c);
        }
        Ok(enc)
    }

    /// How many layers are resident (the rest stream).
    pub fn resident_layers(&self) -> usize {
        self.layers.iter().filter(|l| l.is_some()).count()
    }

    fn load_layers(b: &B, c: &Component, cfg: &EncoderConfig, resident: usize) -> Result<Self> {
        let w = |n: &str| b.load(c, n);
        let layers = (0..cfg.layer_types.len())
            .map(|i| if i < resident { Self::load_layer(b, c, cfg, i).map(Some) } else { Ok(None) })
            .collect::<Result<_>>()?;
        let embed_tokens = if resident < cfg.layer_types.len() { Embedding::Host } else { Embedding::Device(w(EMBED)?) };
        Ok(Encoder { cfg: cfg.clone(), embed_tokens, layers, norm: w("norm.weight")?, source: None })
    }

    fn load_layer(b: &B, c: &Component, cfg: &EncoderConfig, i: usize) -> Result<Layer<B>> {
        let w = |n: &str| b.load(c, n);
        let p = format!("layers.{i}.");
        let mixer = match cfg.layer_types[i] {
            LayerType::Full => {
                let a = |n: &str| w(&format!("{p}self_attn.{n}"));
                Mixer::Full(Attention {
                    qkv: b.cat_weights("attn_in", vec![a("q_proj.weight")?, a("k_proj.weight")?, a("v_proj.weight")?])?,
                    o_proj: a("o_proj.weight")?,
                    q_norm: a("q_norm.weight")?,
                    k_norm: a("k_norm.weight")?,
                })
            }
            LayerType::Linear => {
                let a = |n: &str| w(&format!("{p}linear_attn.{n}"));
                Mixer::Linear(DeltaNet {
                    in_proj: b.cat_weights(
                        "delta_net_in",
                        vec![a("in_proj_qkv.weight")?, a("in_proj_z.weight")?, a("in_proj_a.weight")?, a("in_proj_b.weight")?],
                    )?,
                    conv1d: a("conv1d.weight")?,
                    dt_bias: a("dt_bias")?,
                    a_log: a("A_log")?,
                    norm: a("norm.weight")?,
                    out_proj: a("out_proj.weight")?,
                })
            }
        };
        Ok(Layer {
            input_layernorm: w(&format!("{p}input_layernorm.weight"))?,
            post_attention_layernorm: w(&format!("{p}post_attention_layernorm.weight"))?,
            mixer,
            mlp_in: b.cat_weights("mlp_in", vec![w(&format!("{p}mlp.gate_proj.weight"))?, w(&format!("{p}mlp.up_proj.weight"))?])?,
            down_proj: w(&format!("{p}mlp.down_proj.weight"))?,
        })
    }

    /// Layer `i`: resident, or loaded from the checkpoint now (one load batch).
    fn layer(&self, b: &B, i: usize) -> Result<Fetched<'_, Layer<B>>> {
        match (&self.layers[i], &self.source) {
            (Some(l), _) => Ok(Fetched::Resident(l)),
            (None, Some(c)) => Ok(Fetched::Streamed(b.load_batch(|b| Self::load_layer(b, c, &self.cfg, i))?)),
            (None, None) => anyhow::bail!("text-encoder layer {i} is neither resident nor streamed"),
        }
    }

    /// Hidden states `[L, hidden]` (f32) of one unpadded prompt, on the host.
    pub fn forward(&self, b: &B, ids: &[u32]) -> Result<Tensor> {
        b.download(&self.hidden(b, ids)?)
    }

    /// The final-norm hidden states `[L, hidden]` of one unpadded prompt, left on the backend.
    pub fn hidden(&self, b: &B, ids: &[u32]) -> Result<B::T> {
        ensure!(!ids.is_empty(), "the encoder needs at least one token");
        let eps = self.cfg.rms_norm_eps;
        let mut x = match (&self.embed_tokens, &self.source) {
            (Embedding::Device(table), _) => b.embed(table, ids)?,
            (Embedding::Host, Some(c)) => b.embed_from_host(c, EMBED, ids)?,
            (Embedding::Host, None) => anyhow::bail!("the embedding table is on the host but no checkpoint is open"),
        };
        // Each residual add is fused with the next layer's input norm, so a layer is fetched one
        // layer ahead (at most two layers held when streaming).
        let first_layer = if self.layers.is_empty() { None } else { Some(self.layer(b, 0)?) };
        let first = first_layer.as_ref().map_or(&self.norm, |l| &l.input_layernorm);
        // h: the norm of the residual stream x that the next sublayer reads; each residual add
        // is fused with that norm (the next layer's input_layernorm, or the final norm)
        let mut h = b.rms_norm(&x, Some(first), eps, true)?;
        let mut current = first_layer;
        for i in 0..self.layers.len() {
            let layer = match current.take() {
                Some(l) => l,
                None => self.layer(b, i)?,
            };
            // the mixer's output before its projection, and that projection
            let (m, w_out) = match &layer.mixer {
                Mixer::Full(a) => (self.attention(b, a, &h)?, &a.o_proj),
                Mixer::Linear(d) => (self.delta_net(b, d, &h)?, &d.out_proj),
            };
            (x, h) = b.linear_add_rms_norm(&m, w_out, &x, &layer.post_attention_layernorm, eps)?;
            let ffn = b.dims(&layer.down_proj)[1];
            let y = b.linear_cat(&h, &layer.mlp_in)?;
            let [gate, up] = split_cols(&y, [ffn, ffn]);
            let f = b.silu_mul_cols(gate, up)?;
            // The residual add is fused with the next layer's input norm: fetch that layer now.
            current = if i + 1 < self.layers.len() { Some(self.layer(b, i + 1)?) } else { None };
            let next = current.as_ref().map_or(&self.norm, |l| &l.input_layernorm);
            (x, h) = b.linear_add_rms_norm(&f, &layer.down_proj, &x, next, eps)?;
        }
        Ok(h)
    }

    /// The gated attention's output before `o_proj`, `[L, H·hd]`. `q_proj` holds, per head,
    /// `head_dim` query values then `head_dim` gate values; `y` = `[q_proj | k_proj | v_proj]`
    /// products side by side, each op below reads its columns.
    fn attention(&self, b: &B, a: &Attention<B>, x: &B::T) -> Result<B::T> {
        let c = &self.cfg;
        let hd = c.head_dim;
        let heads = (c.num_attention_heads, c.num_key_value_heads, hd);
        let y = b.linear_cat(x, &a.qkv)?;
        let (q, k, v) = b.attn_qkv_norm_rope(&y, heads, &a.q_norm, &a.k_norm, c.rms_norm_eps, c.rotary_dim(), c.rope_theta)?;
        b.causal_attention_gated_y(&q, &k, &v, &y, 1.0 / (hd as f64).sqrt())
    }

    /// The Gated DeltaNet's output before `out_proj`, `[L, Hv·dv]`.
    fn delta_net(&self, b: &B, d: &DeltaNet<B>, x: &B::T) -> Result<B::T> {
        let c = &self.cfg;
        let l = b.dims(x)[0];
        let (nk, dk, nv, dv) =
            (c.linear_num_key_heads, c.linear_key_head_dim, c.linear_num_value_heads, c.linear_value_head_dim);
        // the joined projection: [q | k | v], z, a, b per token
        let vd = nv * dv;
        let y = b.linear_cat(x, &d.in_proj)?;
        let [qkv, z, a, beta_in] = split_cols(&y, [2 * nk * dk + vd, vd, nv, nv]);
        // the conv output holds q, k, v side by side; the delta rule reads them in place
        let (qkv, g, beta) = b.conv_gates_cols(qkv, &d.conv1d, (a, beta_in), &d.a_log, &d.dt_bias)?;
        let o = b.gated_delta_rule_qkv(&qkv, (nk, dk, nv, dv), &g, &beta)?;
        let o = b.gated_rms_norm_cols(&o, z, &d.norm, c.rms_norm_eps)?;
        b.reshape(&o, &[l, vd])
    }
}

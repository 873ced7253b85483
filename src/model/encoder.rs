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

pub struct Encoder<B: EncoderOps> {
    cfg: EncoderConfig,
    embed_tokens: B::T,
    layers: Vec<Layer<B>>,
    norm: B::T,
}

impl<B: EncoderOps> Encoder<B> {
    pub fn load(b: &B, c: &Component, cfg: &EncoderConfig) -> Result<Self> {
        let w = |n: &str| b.load(c, n);
        let mut layers = vec![];
        for (i, t) in cfg.layer_types.iter().enumerate() {
            let p = format!("layers.{i}.");
            let mixer = match t {
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
            layers.push(Layer {
                input_layernorm: w(&format!("{p}input_layernorm.weight"))?,
                post_attention_layernorm: w(&format!("{p}post_attention_layernorm.weight"))?,
                mixer,
                mlp_in: b.cat_weights("mlp_in", vec![w(&format!("{p}mlp.gate_proj.weight"))?, w(&format!("{p}mlp.up_proj.weight"))?])?,
                down_proj: w(&format!("{p}mlp.down_proj.weight"))?,
            });
        }
        Ok(Encoder { cfg: cfg.clone(), embed_tokens: w("embed_tokens.weight")?, layers, norm: w("norm.weight")? })
    }

    /// Hidden states `[L, hidden]` (f32) of one unpadded prompt, on the host.
    pub fn forward(&self, b: &B, ids: &[u32]) -> Result<Tensor> {
        b.download(&self.hidden(b, ids)?)
    }

    /// The final-norm hidden states `[L, hidden]` of one unpadded prompt, left on the backend.
    pub fn hidden(&self, b: &B, ids: &[u32]) -> Result<B::T> {
        ensure!(!ids.is_empty(), "the encoder needs at least one token");
        let eps = self.cfg.rms_norm_eps;
        let mut x = b.embed(&self.embed_tokens, ids)?;
        let first = self.layers.first().map_or(&self.norm, |l| &l.input_layernorm);
        // h: the norm of the residual stream x that the next sublayer reads; each residual add
        // is fused with that norm (the next layer's input_layernorm, or the final norm)
        let mut h = b.rms_norm(&x, Some(first), eps, true)?;
        for (i, layer) in self.layers.iter().enumerate() {
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
            let next = self.layers.get(i + 1).map_or(&self.norm, |l| &l.input_layernorm);
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

//! Every tensor a component's config implies: name (without the component prefix), shape and
//! dtype. The checkpoint is checked against these lists before any compute.

use super::config::{DitConfig, EncoderConfig, LayerType, VaeConfig};
use super::tensors::Dtype;

#[derive(Clone, Debug, PartialEq)]
pub struct Expected {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: Dtype,
    /// It may instead be stored as float8 e4m3 with a scale tensor ([`super::scaled_fp8`]): the
    /// DiT's main-block matrices.
    pub scaled_fp8: bool,
}

struct List(Vec<Expected>, Dtype);

impl List {
    fn add(&mut self, name: impl Into<String>, shape: &[usize]) {
        self.0.push(Expected { name: name.into(), shape: shape.to_vec(), dtype: self.1, scaled_fp8: false });
    }
    /// [`List::add`] of a weight that may be stored as scaled float8.
    fn add_fp8(&mut self, name: impl Into<String>, shape: &[usize]) {
        self.add(name, shape);
        self.0.last_mut().expect("just added").scaled_fp8 = true;
    }
}

/// The Qwen3.5 text backbone (spec 3.2), names relative to `language_model.`.
pub fn encoder(c: &EncoderConfig) -> Vec<Expected> {
    let mut l = List(vec![], Dtype::BF16);
    let h = c.hidden_size;
    l.add("embed_tokens.weight", &[c.vocab_size, h]);
    l.add("norm.weight", &[h]);
    for (i, t) in c.layer_types.iter().enumerate() {
        let p = format!("layers.{i}.");
        l.add(format!("{p}input_layernorm.weight"), &[h]);
        l.add(format!("{p}post_attention_layernorm.weight"), &[h]);
        l.add(format!("{p}mlp.gate_proj.weight"), &[c.intermediate_size, h]);
        l.add(format!("{p}mlp.up_proj.weight"), &[c.intermediate_size, h]);
        l.add(format!("{p}mlp.down_proj.weight"), &[h, c.intermediate_size]);
        match t {
            LayerType::Linear => {
                let a = format!("{p}linear_attn.");
                let nv = c.linear_num_value_heads;
                l.add(format!("{a}in_proj_qkv.weight"), &[c.linear_conv_dim(), h]);
                l.add(format!("{a}in_proj_z.weight"), &[c.linear_value_dim(), h]);
                l.add(format!("{a}in_proj_b.weight"), &[nv, h]);
                l.add(format!("{a}in_proj_a.weight"), &[nv, h]);
                l.add(format!("{a}conv1d.weight"), &[c.linear_conv_dim(), 1, c.linear_conv_kernel_dim]);
                l.add(format!("{a}dt_bias"), &[nv]);
                l.add(format!("{a}A_log"), &[nv]);
                l.add(format!("{a}norm.weight"), &[c.linear_value_head_dim]);
                l.add(format!("{a}out_proj.weight"), &[h, c.linear_value_dim()]);
            }
            LayerType::Full => {
                let a = format!("{p}self_attn.");
                let hd = c.head_dim;
                l.add(format!("{a}q_proj.weight"), &[2 * c.num_attention_heads * hd, h]);
                l.add(format!("{a}k_proj.weight"), &[c.num_key_value_heads * hd, h]);
                l.add(format!("{a}v_proj.weight"), &[c.num_key_value_heads * hd, h]);
                l.add(format!("{a}o_proj.weight"), &[h, c.num_attention_heads * hd]);
                l.add(format!("{a}q_norm.weight"), &[hd]);
                l.add(format!("{a}k_norm.weight"), &[hd]);
            }
        }
    }
    l.0
}

/// The MOSS DiT (spec 4.2).
pub fn dit(c: &DitConfig) -> Vec<Expected> {
    let mut l = List(vec![], Dtype::BF16);
    let (d, f, hd) = (c.dim, c.ffn_dim, c.head_dim());
    l.add("video_embedder.weight", &[d, c.latent_channels]);
    l.add("video_embedder.bias", &[d]);
    l.add("text_embedder.proj.weight", &[d, c.text_dim]);
    l.add("text_embedder.proj.bias", &[d]);
    for b in 0..c.num_refiner_layers {
        let p = format!("text_embedder.blocks.{b}.");
        l.add(format!("{p}norm1.weight"), &[d]);
        l.add(format!("{p}norm2.weight"), &[d]);
        l.add(format!("{p}q_norm.weight"), &[hd]);
        l.add(format!("{p}k_norm.weight"), &[hd]);
        l.add(format!("{p}qkv.weight"), &[3 * d, d]);
        l.add(format!("{p}qkv.bias"), &[3 * d]);
        l.add(format!("{p}proj.weight"), &[d, d]);
        l.add(format!("{p}proj.bias"), &[d]);
        for n in ["ffn_gate", "ffn_up"] {
            l.add(format!("{p}{n}.weight"), &[f, d]);
            l.add(format!("{p}{n}.bias"), &[f]);
        }
        l.add(format!("{p}ffn_down.weight"), &[d, f]);
        l.add(format!("{p}ffn_down.bias"), &[d]);
    }
    l.add("time_embedding.0.weight", &[d, c.freq_dim]);
    l.add("time_embedding.0.bias", &[d]);
    l.add("time_embedding.2.weight", &[d, d]);
    l.add("time_embedding.2.bias", &[d]);
    l.add("shared_block_modulation.weight", &[6 * d, d]);
    l.add("shared_block_modulation.bias", &[6 * d]);
    for i in 0..c.num_layers {
        let p = format!("layers.{i}.");
        l.add(format!("{p}norm1.weight"), &[d]);
        l.add(format!("{p}norm2.weight"), &[d]);
        l.add(format!("{p}q_norm.weight"), &[hd]);
        l.add(format!("{p}k_norm.weight"), &[hd]);
        for n in ["q", "k", "v", "o"] {
            l.add_fp8(format!("{p}proj.{n}.weight"), &[d, d]);
        }
        l.add_fp8(format!("{p}proj.ffn_up_gate.weight"), &[2 * f, d]);
        l.add_fp8(format!("{p}proj.ffn_down.weight"), &[d, f]);
    }
    l.add("final_norm_video.weight", &[d]);
    l.add("final_linear_video.weight", &[c.latent_channels, d]);
    l.add("video_head_modulation.weight", &[2 * d, d]);
    l.add("video_head_modulation.bias", &[2 * d]);
    l.0
}

/// The FLUX.2 VAE, decoder side (spec 7.3).
pub fn vae(c: &VaeConfig) -> Vec<Expected> {
    let mut l = List(vec![], Dtype::F32);
    let zc = c.latent_channels;
    let packed = c.packed_channels();
    l.add("bn.running_mean", &[packed]);
    l.add("bn.running_var", &[packed]);
    if c.use_post_quant_conv {
        l.add("post_quant_conv.weight", &[zc, zc, 1, 1]);
        l.add("post_quant_conv.bias", &[zc]);
    }
    let rev: Vec<usize> = c.decoder_block_out_channels.iter().rev().copied().collect();
    let top = rev[0];
    let conv = |l: &mut List, p: &str, o: usize, i: usize, k: usize| {
        l.add(format!("{p}.weight"), &[o, i, k, k]);
        l.add(format!("{p}.bias"), &[o]);
    };
    let norm = |l: &mut List, p: &str, ch: usize| {
        l.add(format!("{p}.weight"), &[ch]);
        l.add(format!("{p}.bias"), &[ch]);
    };
    let resnet = |l: &mut List, p: &str, i: usize, o: usize| {
        norm(l, &format!("{p}.norm1"), i);
        conv(l, &format!("{p}.conv1"), o, i, 3);
        norm(l, &format!("{p}.norm2"), o);
        conv(l, &format!("{p}.conv2"), o, o, 3);
        if i != o {
            conv(l, &format!("{p}.conv_shortcut"), o, i, 1);
        }
    };
    conv(&mut l, "decoder.conv_in", top, zc, 3);
    resnet(&mut l, "decoder.mid_block.resnets.0", top, top);
    if c.mid_block_add_attention {
        let a = "decoder.mid_block.attentions.0";
        norm(&mut l, &format!("{a}.group_norm"), top);
        for n in ["to_q", "to_k", "to_v", "to_out.0"] {
            l.add(format!("{a}.{n}.weight"), &[top, top]);
            l.add(format!("{a}.{n}.bias"), &[top]);
        }
    }
    resnet(&mut l, "decoder.mid_block.resnets.1", top, top);
    let mut prev = top;
    for (b, &ch) in rev.iter().enumerate() {
        for r in 0..=c.layers_per_block {
            let i = if r == 0 { prev } else { ch };
            resnet(&mut l, &format!("decoder.up_blocks.{b}.resnets.{r}"), i, ch);
        }
        if b + 1 < rev.len() {
            conv(&mut l, &format!("decoder.up_blocks.{b}.upsamplers.0.conv"), ch, ch, 3);
        }
        prev = ch;
    }
    norm(&mut l, "decoder.conv_norm_out", prev);
    conv(&mut l, "decoder.conv_out", c.out_channels, prev, 3);
    l.0
}

/// The FLUX.2 VAE encoder (spec 7.4), for pictures in: `encoder.*` and `quant_conv.*`. Checked
/// when the encoder loads (`crate::model::vae::VaeEncoder`), not with the component: text to
/// image never reads these tensors.
pub fn vae_encoder(c: &VaeConfig) -> Vec<Expected> {
    let mut l = List(vec![], Dtype::F32);
    let conv = |l: &mut List, p: &str, o: usize, i: usize, k: usize| {
        l.add(format!("{p}.weight"), &[o, i, k, k]);
        l.add(format!("{p}.bias"), &[o]);
    };
    let norm = |l: &mut List, p: &str, ch: usize| {
        l.add(format!("{p}.weight"), &[ch]);
        l.add(format!("{p}.bias"), &[ch]);
    };
    let resnet = |l: &mut List, p: &str, i: usize, o: usize| {
        norm(l, &format!("{p}.norm1"), i);
        conv(l, &format!("{p}.conv1"), o, i, 3);
        norm(l, &format!("{p}.norm2"), o);
        conv(l, &format!("{p}.conv2"), o, o, 3);
        if i != o {
            conv(l, &format!("{p}.conv_shortcut"), o, i, 1);
        }
    };
    let widths = &c.block_out_channels;
    let Some(&top) = widths.last() else { return l.0 };
    conv(&mut l, "encoder.conv_in", widths[0], c.in_channels, 3);
    let mut prev = widths[0];
    for (b, &ch) in widths.iter().enumerate() {
        for r in 0..c.layers_per_block {
            resnet(&mut l, &format!("encoder.down_blocks.{b}.resnets.{r}"), if r == 0 { prev } else { ch }, ch);
        }
        if b + 1 < widths.len() {
            conv(&mut l, &format!("encoder.down_blocks.{b}.downsamplers.0.conv"), ch, ch, 3);
        }
        prev = ch;
    }
    resnet(&mut l, "encoder.mid_block.resnets.0", top, top);
    if c.mid_block_add_attention {
        let a = "encoder.mid_block.attentions.0";
        norm(&mut l, &format!("{a}.group_norm"), top);
        for n in ["to_q", "to_k", "to_v", "to_out.0"] {
            l.add(format!("{a}.{n}.weight"), &[top, top]);
            l.add(format!("{a}.{n}.bias"), &[top]);
        }
    }
    resnet(&mut l, "encoder.mid_block.resnets.1", top, top);
    norm(&mut l, "encoder.conv_norm_out", top);
    let zc = 2 * c.latent_channels;
    conv(&mut l, "encoder.conv_out", zc, top, 3);
    if c.use_quant_conv {
        conv(&mut l, "quant_conv", zc, zc, 1);
    }
    l.0
}

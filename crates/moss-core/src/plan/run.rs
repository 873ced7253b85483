//! One run's memory plan (`--max-vram`): the three networks' byte counts read from the
//! checkpoint (at the run's precision) and the run's sizes, placed by [`super`] under the cap
//! before any weights load. Decides what `generate` loads resident, what streams,
//! and whether the transformer may load while the text encoder runs.

use super::{Budget, MemoryOptions, Network, Placement, Plan, PREFETCH, RESERVE};
use crate::checkpoint::kept::{self, Layout};
use crate::checkpoint::{Checkpoint, Component, Dtype};
use crate::model::dit::mats::{self, Kind};
use crate::model::encoder::layer_matrix_names;
use anyhow::Result;

/// What a run loads and how.
#[derive(Clone, Debug)]
pub struct RunPlan {
    pub plan: Plan,
    /// Resident text-encoder layers and transformer blocks (the rest stream).
    pub encoder_resident: usize,
    pub dit_resident: usize,
    /// Whether the transformer's weights fit beside the text encoder's, so they load while it runs.
    pub overlap: bool,
    /// Device bytes the cap leaves the VAE decode's activations (its weights and the reserve
    /// taken off; `None`: no cap): whole or row strips is decided within this and free memory.
    pub vae_activations: Option<u64>,
    /// The cap was clamped to the device (the warning to print).
    pub warning: Option<String>,
}

/// Bytes a tensor takes loaded elementwise (a quantized one dequantized as it loads: on the CPU,
/// or on the GPU with a LoRA update merged into it).
fn loaded(dtype: Dtype, numel: usize, bf16_loaded: usize) -> u64 {
    let es = match dtype {
        Dtype::BF16 | Dtype::Ggml(_) | Dtype::I8 | Dtype::W4a8 { .. } => bf16_loaded,
        Dtype::F8E4M3 => 1,
        _ => 4,
    };
    (es * numel) as u64
}

/// One main-block matrix on the device ([`Kind`]): resident, in a streaming slot, and made from
/// the slot (or the host) while its block computes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatrixBytes {
    pub resident: u64,
    pub slot: u64,
    pub derived: u64,
}

/// [`MatrixBytes`] of a matrix of `numel` elements in `rows` rows, `stored` bytes as the backend
/// loads it, activations of `act` bytes: fp8 and int8 are 1 byte an element and an f32 scale a
/// row; stored int8 codes move with their scales in a streamed block's slot (the backend keeps them as
/// stored and multiplies by them in place).
pub fn matrix_bytes(kind: Kind, numel: u64, rows: u64, stored: u64, act: u64) -> MatrixBytes {
    let fp8 = numel + 4 * rows;
    match kind {
        Kind::Dense => MatrixBytes { resident: stored, slot: stored, derived: 0 },
        Kind::Quantized => MatrixBytes { resident: fp8, slot: stored, derived: fp8 },
        Kind::Codes => MatrixBytes { resident: fp8, slot: numel, derived: 0 },
        Kind::Int8Codes { .. } => MatrixBytes { resident: fp8, slot: fp8, derived: 0 },
        Kind::Host { quantize: false } => MatrixBytes { resident: numel * act, slot: 0, derived: numel * act },
        Kind::Host { quantize: true } => MatrixBytes { resident: fp8, slot: 0, derived: numel * act + fp8 },
    }
}

/// Block `i`'s matrices ([`mats::block_matrix_names`]) under `budget`, summed.
fn dit_block(c: &Component, i: usize, budget: &Budget) -> Result<MatrixBytes> {
    let mut sum = MatrixBytes::default();
    for g in mats::block_matrix_names(i) {
        let infos = g.iter().map(|n| c.info(n)).collect::<Result<Vec<_>>>()?;
        let numel = infos.iter().map(|t| t.numel() as u64).sum();
        let rows = infos.iter().map(|t| t.shape.first().copied().unwrap_or(1) as u64).sum();
        let stored = stack_bytes(c, &g, budget.bf16_loaded, budget.memory.is_some())?;
        let m = matrix_bytes(mats::kind(c, &g, budget.linears)?, numel, rows, stored, budget.act as u64);
        sum = MatrixBytes { resident: sum.resident + m.resident, slot: sum.slot + m.slot, derived: sum.derived + m.derived };
    }
    Ok(sum)
}

/// Device bytes of the dim-0 stack of `names` (inside `c`) as loaded; on the GPU (`gpu`) a stack
/// holding quantized matrices is kept as stored ([`Layout`]: the blocks, int8 codes and row scales).
pub fn stack_bytes(c: &Component, names: &[String], bf16_loaded: usize, gpu: bool) -> Result<u64> {
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    if gpu {
        if let Some(l) = Layout::of(c, &refs)? {
            return Ok(l.bytes as u64);
        }
    }
    let mut sum = 0;
    for n in names {
        let t = c.info(n)?;
        sum += loaded(t.dtype, t.numel(), bf16_loaded);
    }
    Ok(sum)
}

/// Bytes of `c`'s tensors under `prefix` (inside the component), as loaded (each on its own; the
/// scales of a kept int8 matrix are counted with it, `comfy_quant` descriptions not at all).
fn bytes_under(c: &Component, prefix: &str, bf16_loaded: usize, gpu: bool) -> Result<u64> {
    let full = c.full_name(prefix);
    let mut sum = 0;
    for (k, t) in c.store.tensors.iter().filter(|(k, _)| k.starts_with(&full)) {
        if gpu && kept::is_companion(c, k) {
            continue;
        }
        sum += match k.strip_prefix(&c.prefix) {
            Some(name) if gpu => stack_bytes(c, &[name.to_string()], bf16_loaded, gpu)?,
            _ => loaded(t.dtype, t.numel(), bf16_loaded),
        };
    }
    Ok(sum)
}

/// Bytes of the stacks `groups` names (inside `c`), as loaded.
fn bytes_of(c: &Component, groups: &[Vec<String>], bf16_loaded: usize, gpu: bool) -> Result<u64> {
    groups.iter().map(|g| stack_bytes(c, g, bf16_loaded, gpu)).sum()
}

/// The largest and the total bytes of the `blocks` streamable blocks `names(i)` lists.
fn block_bytes(c: &Component, blocks: usize, names: impl Fn(usize) -> Vec<Vec<String>>, bl: usize, gpu: bool) -> Result<(u64, u64)> {
    let each = (0..blocks).map(|i| bytes_of(c, &names(i), bl, gpu)).collect::<Result<Vec<_>>>()?;
    Ok((each.iter().copied().max().unwrap_or(0), each.iter().sum()))
}

/// The dequantized scratch of the largest matrix of `c` kept quantized on the GPU (`act` bytes an
/// element): each product of a kept matrix dequantizes it into a matrix of its own first. `stacks`:
/// the stacks the model loads (its blocks' matrices); the rest load on their own.
pub fn dequant_scratch(c: &Component, stacks: &[Vec<String>], act: usize) -> Result<u64> {
    let mut most = 0u64;
    for g in stacks {
        let refs: Vec<&str> = g.iter().map(String::as_str).collect();
        if let Some(l) = Layout::of(c, &refs)? {
            most = most.max((l.rows() * l.k * act) as u64);
        }
    }
    for t in c.store.tensors.iter().filter(|(k, t)| k.starts_with(&c.prefix) && t.dtype.is_block_or_int8() && t.shape.len() == 2).map(|(_, t)| t) {
        most = most.max((t.numel() * act) as u64);
    }
    Ok(most)
}

/// The DiT's activations over `tokens` joint tokens: one forward's peak, and (streamed, a guided
/// step's two passes go through the blocks together) the other pass's stream and modulated norm
/// (`[N, D]` each) beside it; with LoRAs, one tensor's merge scratch (streamed blocks merge at
/// every fetch, beside the activations).
pub fn dit_activations(ck: &Checkpoint, budget: &Budget, tokens: usize) -> u64 {
    budget.activations.dit(&ck.dit, tokens, budget.act) + (2 * tokens * ck.dit.dim * budget.act + ck.loras.scratch_bytes()) as u64
}

/// The three networks of `ck` for prompts of `tokens` tokens and a `w` x `h` picture.
pub fn networks(ck: &Checkpoint, budget: &Budget, tokens: usize, (w, h): (u32, u32)) -> Result<Vec<Network>> {
    let bl = budget.bf16_loaded;
    let enc = ck.open_component_for_plan("text_encoder")?;
    let dit = ck.open_component_for_plan("transformer")?;
    let vae = ck.open_component_for_plan("vae")?;
    let gpu = budget.memory.is_some();
    if gpu {
        // on the GPU, before anything loads: the quantized weights it cannot run
        if let Some(refusal) = crate::checkpoint::first_refused_on_gpu(&enc).or_else(|| crate::checkpoint::first_refused_on_gpu(&dit)) {
            anyhow::bail!("{refusal}");
        }
    }
    let enc_layers = ck.encoder.num_layers();
    // What streams is what the models fetch: each layer's (block's) matrices.
    let (enc_block, enc_all) = block_bytes(&enc, enc_layers, |i| layer_matrix_names(&ck.encoder, i), bl, gpu)?;
    // Kept quantized matrices dequantize into a scratch matrix before each product.
    let act = budget.act;
    let (enc_scratch, dit_scratch) = if gpu {
        let enc_stacks: Vec<Vec<String>> = (0..enc_layers).flat_map(|i| layer_matrix_names(&ck.encoder, i)).collect();
        let dit_stacks: Vec<Vec<String>> = (0..ck.dit.num_layers).flat_map(mats::block_matrix_names).collect();
        (dequant_scratch(&enc, &enc_stacks, act)?, dequant_scratch(&dit, &dit_stacks, act)?)
    } else {
        (0, 0)
    };
    let blocks = (0..ck.dit.num_layers).map(|i| dit_block(&dit, i, budget)).collect::<Result<Vec<_>>>()?;
    let most = |f: fn(&MatrixBytes) -> u64| blocks.iter().map(f).max().unwrap_or(0);
    let dit_all: u64 = blocks.iter().map(|b| b.resident).sum();
    // The stored matrices (and their scale tensors, read on the host) are replaced by what the blocks hold.
    let stored_blocks: u64 = (0..ck.dit.num_layers).map(|i| bytes_under(&dit, &format!("layers.{i}.proj."), bl, gpu)).sum::<Result<u64>>()?;
    let dit_weights = bytes_under(&dit, "", bl, gpu)? - stored_blocks + dit_all;
    let (lh, lw) = ((h / 16) as usize, (w / 16) as usize);
    let text = tokens.max(1);
    let vae_decode = budget.activations.vae_decode(&ck.vae, lh, lw);
    Ok(vec![
        Network {
            name: "text_encoder",
            weights: bytes_under(&enc, "", bl, gpu)?,
            blocks: enc_layers as u64,
            block_bytes: enc_block,
            all_blocks: enc_all,
            slot_bytes: enc_block,
            derived_bytes: 0,
            ahead: PREFETCH,
            // Streamed, the embedding table stays on the host (a prompt's rows are gathered there).
            host_only: bytes_under(&enc, "embed_tokens.", bl, gpu)?,
            // A picture's prompts go through the layers together: the other prompt's stream and
            // its norm ([L, hidden] each) live beside one forward's peak.
            activations: budget.activations.encoder(&ck.encoder, text, budget.act) + (2 * text * ck.encoder.hidden_size * budget.act) as u64 + enc_scratch,
            strip_activations: None,
        },
        Network {
            name: "transformer",
            weights: dit_weights,
            blocks: ck.dit.num_layers as u64,
            block_bytes: most(|b| b.resident),
            all_blocks: dit_all,
            slot_bytes: most(|b| b.slot),
            derived_bytes: most(|b| b.derived),
            ahead: PREFETCH,
            host_only: 0,
            activations: dit_activations(ck, budget, lh * lw + text) + dit_scratch,
            strip_activations: None,
        },
        Network {
            name: "vae",
            weights: bytes_under(&vae, "", 4, false)?,
            blocks: 0,
            block_bytes: 0,
            all_blocks: 0,
            slot_bytes: 0,
            derived_bytes: 0,
            ahead: 0,
            host_only: 0,
            activations: vae_decode.0,
            strip_activations: Some(vae_decode.1),
        },
    ])
}

/// The VAE stage of a run with a picture in (img2img, inpainting): the VAE then also encodes a
/// `w`×`h` picture, so its activations are the larger of the decode's and the encode's, whole
/// and in the least split.
pub fn with_vae_encode(nets: &mut [Network], ck: &Checkpoint, budget: &Budget, (w, h): (u32, u32)) {
    let (whole, least) = budget.activations.vae_encode(&ck.vae, h as usize, w as usize);
    for n in nets.iter_mut().filter(|n| n.name == "vae") {
        n.activations = n.activations.max(whole);
        n.strip_activations = n.strip_activations.map(|s| s.max(least));
    }
}

/// [`with_vae_encode`] where `spec` encodes a picture: its init image at its size, or the hires
/// fix's Lanczos upscale at the second pass's. (`networks` takes [`PictureSpec::out_size`]: the
/// hires fix's second pass is the larger.)
pub fn with_pictures_in(nets: &mut [Network], ck: &Checkpoint, budget: &Budget, spec: &crate::spec::PictureSpec) {
    if spec.init_image.is_some() {
        with_vae_encode(nets, ck, budget, (spec.width, spec.height));
    }
    if spec.hires.as_ref().is_some_and(|h| h.upscaler == crate::spec::Upscaler::Lanczos) {
        with_vae_encode(nets, ck, budget, spec.out_size());
    }
}

/// Place `nets` under the cap `opts` and `budget` give; refuses (naming the smallest cap that
/// works) before anything loads.
pub fn decide(nets: &[Network], budget: &Budget, opts: &MemoryOptions) -> Result<RunPlan> {
    let (cap, warning) = budget.cap(opts);
    let plan = super::plan_for_process(cap, budget.overhead, nets)?;
    let resident = |name: &str, all: u64| match plan.networks.iter().find(|n| n.name == name).map(|n| &n.placement) {
        Some(Placement::Streamed { resident, .. }) => *resident as usize,
        _ => all as usize,
    };
    let encoder_resident = resident("text_encoder", nets[0].blocks);
    let dit_resident = resident("transformer", nets[1].blocks);
    let both_resident = encoder_resident as u64 == nets[0].blocks && dit_resident as u64 == nets[1].blocks;
    let enc_peak = plan.networks[0].device_bytes;
    let overlap = both_resident && enc_peak.saturating_add(nets[1].weights).saturating_add(budget.overhead) <= cap;
    let vae_activations = (cap != u64::MAX).then(|| cap.saturating_sub(budget.overhead + nets[2].weights + RESERVE));
    Ok(RunPlan { plan, encoder_resident, dit_resident, overlap, vae_activations, warning })
}

impl RunPlan {
    /// The `-v` line.
    pub fn line(&self) -> String {
        let mut l = self.plan.line();
        if self.overlap {
            l.push_str("; the transformer loads while the text encoder runs");
        }
        l
    }

    /// The `--json` `plan` value.
    pub fn json(&self) -> serde_json::Value {
        let mut j = self.plan.json();
        j["overlap_loads"] = serde_json::json!(self.overlap);
        j
    }
}

#[cfg(test)]
#[path = "run_quant_tests.rs"]
mod quant_tests;

#[cfg(test)]
mod tests {
    use super::super::Activations;
    use super::*;
    use crate::checkpoint::config::{DitConfig, EncoderConfig, VaeConfig};
    use crate::model::dit::MainLinears;

    const GB: u64 = 1 << 30;

    /// Activations in proportion to tokens and pixels: these tests are about weights and caps.
    struct Flat;
    impl Activations for Flat {
        fn dit(&self, cfg: &DitConfig, tokens: usize, act: usize) -> u64 {
            (8 * tokens * cfg.dim * act) as u64
        }
        fn encoder(&self, cfg: &EncoderConfig, tokens: usize, act: usize) -> u64 {
            (8 * tokens * cfg.hidden_size * act) as u64
        }
        fn vae_decode(&self, _: &VaeConfig, lh: usize, lw: usize) -> (u64, u64) {
            (((lh * lw) as u64) << 12, ((lh * lw) as u64) << 10)
        }
        fn vae_encode(&self, _: &VaeConfig, h: usize, w: usize) -> (u64, u64) {
            (((h * w) as u64) << 6, ((h * w) as u64) << 4)
        }
    }

    fn net(name: &'static str, weights: u64, blocks: u64, activations: u64, strips: Option<u64>) -> Network {
        let block_bytes = if blocks > 0 { weights / (blocks + 1) } else { 0 };
        let (all_blocks, slot_bytes, derived_bytes) = (blocks * block_bytes, block_bytes, 0);
        Network { name, weights, blocks, block_bytes, all_blocks, slot_bytes, derived_bytes, ahead: 1, host_only: 0, activations, strip_activations: strips }
    }

    /// With LoRAs attached the transformer's activations hold one tensor's merge scratch, so the
    /// plan under a cap counts it: a cap that holds the transformer resident without it streams
    /// a block with it, and every planned peak stays under the cap.
    #[test]
    fn the_merge_scratch_is_planned() {
        let mut ck =
            crate::checkpoint::Checkpoint::open(crate::checkpoint::locate(concat!(env!("CARGO_MANIFEST_DIR"), "/../../golden/tiny-a")).unwrap()).unwrap();
        let budget = Budget { memory: None, overhead: 0, bf16_loaded: 2, act: 2, linears: MainLinears::Dense, activations: &Flat };
        let plain = networks(&ck, &budget, 16, (256, 256)).unwrap();
        let lora = concat!(env!("CARGO_MANIFEST_DIR"), "/../../golden/lora/kohya.safetensors");
        ck.attach_loras(&[crate::lora::LoraSpec { path: lora.into(), scale: 1.0 }]).unwrap();
        let scratch = ck.loras.scratch_bytes() as u64;
        assert!(scratch > 0);
        let with = networks(&ck, &budget, 16, (256, 256)).unwrap();
        assert_eq!(with[1].activations, plain[1].activations + scratch, "the transformer's activations");
        assert_eq!((with[0].activations, with[2].activations), (plain[0].activations, plain[2].activations), "only the transformer merges");
        // The least room that holds the transformer resident without the LoRA does not with it.
        let (p, w) = (&plain[1], &with[1]);
        let room = p.weights + p.activations + RESERVE;
        assert_eq!(p.place(room).unwrap().placement, Placement::Resident);
        let streamed = w.place(room).expect("the transformer streams in that room");
        assert!(matches!(streamed.placement, Placement::Streamed { .. }), "{streamed:?}");
        assert_eq!(w.place(room + scratch).unwrap().placement, Placement::Resident);
        for room in [room, room + scratch, room - 3 * w.block_bytes] {
            let Some(n) = w.place(room) else { continue };
            assert!(n.device_bytes <= room, "{room}: the transformer's peak {} over the room", n.device_bytes);
            assert!(n.device_bytes >= w.activations + RESERVE, "{room}: the peak leaves out the scratch");
        }
    }

    /// The VAE's whole-or-strips choice on the device (activations that fit the budget: whole)
    /// agrees with the plan at every cap: the budget handed to the decode holds the whole
    /// activations exactly when the plan keeps the VAE whole, and the least split when it plans
    /// strips; the context is taken off it too.
    #[test]
    fn the_vae_budget_follows_the_plan() {
        let (act, strips, weights) = (3 * GB, GB / 2, GB / 3);
        let nets = vec![net("text_encoder", 2 * GB, 4, GB / 4, None), net("transformer", 2 * GB, 4, GB / 4, None), net("vae", weights, 0, act, Some(strips))];
        let mut seen = (0, 0);
        for overhead in [0, 600 << 20] {
            let budget = Budget { memory: Some((100 * GB, 100 * GB)), overhead, bf16_loaded: 2, act: 2, linears: MainLinears::Dense, activations: &Flat };
            for tenth in 20..80 {
                let opts = MemoryOptions { max_vram_gib: Some(tenth as f64 / 10.0) };
                let Ok(p) = decide(&nets, &budget, &opts) else { continue };
                let room = p.vae_activations.expect("a cap gives the decode a budget");
                match p.plan.networks[2].placement {
                    Placement::Resident => {
                        seen.0 += 1;
                        assert!(room >= act, "{tenth}/10 GiB: whole planned, {room} < {act}")
                    }
                    Placement::Strips => {
                        seen.1 += 1;
                        assert!(room < act && room >= strips, "{tenth}/10 GiB: strips planned, budget {room}")
                    }
                    ref other => panic!("the VAE {other:?}"),
                }
            }
        }
        assert!(seen.0 > 0 && seen.1 > 0, "caps planned whole {} and strips {} times", seen.0, seen.1);
        let none = Budget { memory: None, overhead: 0, bf16_loaded: 4, act: 4, linears: MainLinears::Dense, activations: &Flat };
        assert_eq!(decide(&nets, &none, &MemoryOptions::default()).unwrap().vae_activations, None);
    }

    /// The full-size DiT (42 blocks of dim 3072, FFN 8192, ~0.33 B other parameters in bf16):
    /// resident at fp8 its matrices take 1 byte an element and an f32 scale a row, 5.04 GiB in
    /// all (the "resident DiT 5.1 GB"), against 9.5 GiB at bf16; streamed from a bf16
    /// checkpoint a block moves its bf16 bytes and holds its fp8 copy beside them while it computes.
    #[test]
    fn fp8_counts_a_byte_an_element_and_a_scale_a_row() {
        let (d, f) = (3072u64, 8192u64);
        let block = [(3 * d, d), (d, d), (2 * f, d), (d, f)]; // qkv, o, ffn_up_gate, ffn_down: [rows, cols]
        let other = 326_000_000 * 2;
        let total = |kind: Kind| -> (u64, MatrixBytes) {
            let mut sum = MatrixBytes::default();
            for (rows, cols) in block {
                let m = matrix_bytes(kind, rows * cols, rows, 2 * rows * cols, 2);
                sum = MatrixBytes { resident: sum.resident + m.resident, slot: sum.slot + m.slot, derived: sum.derived + m.derived };
            }
            (other + 42 * sum.resident, sum)
        };
        let gib = |b: u64| b as f64 / GB as f64;
        let (fp8, q) = total(Kind::Quantized);
        let (bf16, dense) = total(Kind::Dense);
        assert!((5.0..5.1).contains(&gib(fp8)), "resident fp8 DiT {:.2} GiB", gib(fp8));
        assert!((9.0..10.0).contains(&gib(bf16)), "resident bf16 DiT {:.2} GiB", gib(bf16));
        assert_eq!((q.slot, q.derived), (dense.slot, q.resident), "a streamed fp8 block: its bf16 slot and its fp8 copy");
        let (codes, c) = total(Kind::Codes);
        assert_eq!((codes, c.slot), (fp8, c.resident - 4 * (3 * d + d + 2 * f + d)), "a float8 checkpoint moves its codes");
        // int8 codes taken from a comfy_quant file: the same resident bytes, moved as stored (codes
        // and scales) into a streamed block's slot, multiplied by in place
        let (int8, i) = total(Kind::Int8Codes { convrot: Some(256) });
        assert_eq!((int8, i.slot, i.derived), (fp8, i.resident, 0), "an int8 file's codes");
        // The planner streams fewer fp8 blocks under the same cap.
        let net = |w: u64, b: MatrixBytes| Network {
            name: "transformer",
            weights: w,
            blocks: 42,
            block_bytes: b.resident,
            all_blocks: 42 * b.resident,
            slot_bytes: b.slot,
            derived_bytes: b.derived,
            ahead: PREFETCH,
            host_only: 0,
            activations: GB,
            strip_activations: None,
        };
        let resident = |n: &Network, cap| match n.place(cap).unwrap().placement {
            Placement::Streamed { resident, .. } => resident,
            Placement::Resident => 42,
            ref p => panic!("{p:?}"),
        };
        assert_eq!(resident(&net(fp8, q), 7 * GB), 42);
        let (r8, r16) = (resident(&net(fp8, q), 5 * GB), resident(&net(bf16, dense), 5 * GB));
        assert!(r8 >= 2 * r16 && r16 > 0, "under 5 GiB: {r8} fp8 blocks resident, {r16} bf16");
    }
}

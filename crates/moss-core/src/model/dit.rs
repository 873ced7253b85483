//! The MOSS single-stream DiT (spec section 4): latent + timestep + text → velocity.
//!
//! Names follow the checkpoint (spec 4.2). One forward:
//! image tokens `video_embedder(x)`, text tokens `text_embedder` (proj + 2 unmodulated refiner
//! blocks, once per prompt), the joint stream `[image ; text]` through the main blocks with the one
//! shared modulation of the timestep, then the head on the image tokens only.

use super::stream::{self, Fetched, Streamer};
use crate::backend::ops::DitOps;
use crate::backend::Behind;
use crate::checkpoint::{config::DitConfig, Component};
use crate::parallel::{ulysses, Transport};
use crate::tensor::Tensor;
use anyhow::{ensure, Result};
use std::ops::Range;
use std::sync::Mutex;

/// The 4-axis RoPE of spec 4.3: positions and the fp32 cos/sin table.
#[path = "dit_rope.rs"]
pub mod rope;

/// The main blocks' matrices: dense, or float8 with per-row scales.
#[path = "dit_mats.rs"]
pub mod mats;

/// Changing a loaded DiT's LoRA updates (the server's per-request LoRAs).
#[path = "dit_loras.rs"]
pub mod loras;

/// The forward with step caching (`crate::cache`).
#[path = "dit_cache.rs"]
mod cached;
pub use cached::PassCaches;

pub use mats::{block_matrix_names, MainLinears};
use mats::{Act, BlockMats, Source};

/// A linear layer: `weight [out, in]` and an optional `bias [out]`.
struct Linear<B: DitOps> {
    weight: B::T,
    bias: Option<B::T>,
}

impl<B: DitOps> Linear<B> {
    fn load(b: &B, c: &Component, prefix: &str, bias: bool) -> Result<Self> {
        Ok(Linear { weight: b.load(c, &format!("{prefix}.weight"))?, bias: if bias { Some(b.load(c, &format!("{prefix}.bias"))?) } else { None } })
    }
    fn forward(&self, b: &B, x: &B::T) -> Result<B::T> {
        b.linear(x, &self.weight, self.bias.as_ref())
    }
}

/// `text_embedder.blocks.N`: unmodulated, biased, attention over the text tokens only.
struct RefinerBlock<B: DitOps> {
    norm1: B::T,
    norm2: B::T,
    q_norm: B::T,
    k_norm: B::T,
    qkv: Linear<B>,
    proj: Linear<B>,
    /// `ffn_up` and `ffn_gate` stacked at load (rows `[up ; gate]`), for the packed SiTU-GLU.
    ffn_up_gate: Linear<B>,
    ffn_down: Linear<B>,
}

/// `layers.N`: modulated by the shared modulation, no biases, raw gates. The norms (vectors)
/// stay resident; the matrices are resident or fetched per forward (see [`Dit::block_weights`]).
struct Block<B: DitOps> {
    norm1: B::T,
    norm2: B::T,
    q_norm: B::T,
    k_norm: B::T,
    /// How each matrix is made from what is loaded (the run's [`MainLinears`], the stored dtypes).
    sources: Vec<Source<B>>,
    /// `None`: streamed (fetched from the checkpoint each time a forward reaches this block).
    mats: Option<BlockMats<B>>,
}

impl<B: DitOps> RefinerBlock<B> {
    /// `text_embedder.blocks.{i}`.
    fn load(b: &B, c: &Component, i: usize) -> Result<Self> {
        let p = format!("text_embedder.blocks.{i}.");
        let w = |n: &str| b.load(c, &format!("{p}{n}"));
        let rows = |what: &str| b.load_rows(c, &[&format!("{p}ffn_up.{what}"), &format!("{p}ffn_gate.{what}")]);
        Ok(RefinerBlock {
            norm1: w("norm1.weight")?,
            norm2: w("norm2.weight")?,
            q_norm: w("q_norm.weight")?,
            k_norm: w("k_norm.weight")?,
            qkv: Linear::load(b, c, &format!("{p}qkv"), true)?,
            proj: Linear::load(b, c, &format!("{p}proj"), true)?,
            ffn_up_gate: Linear { weight: rows("weight")?, bias: Some(rows("bias")?) },
            ffn_down: Linear::load(b, c, &format!("{p}ffn_down"), true)?,
        })
    }
}

impl<B: DitOps> Block<B> {
    /// `layers.{i}`: its matrices loaded now if `resident`, else left to the streamer.
    fn load(b: &B, c: &Component, i: usize, resident: bool, linears: MainLinears) -> Result<Self> {
        let w = |n: &str| b.load(c, &format!("layers.{i}.{n}"));
        let sources = mats::sources(b, c, i, linears)?;
        Ok(Block {
            norm1: w("norm1.weight")?,
            norm2: w("norm2.weight")?,
            q_norm: w("q_norm.weight")?,
            k_norm: w("k_norm.weight")?,
            mats: if resident { Some(BlockMats::load(b, c, i, &sources)?) } else { None },
            sources,
        })
    }
}

/// One pass through the main blocks: its modulation, RoPE table, the joint stream and the
/// modulated norm the next block reads, the blocks it runs, and the latent grid `(C, h, w)`.
/// Under sequence parallelism the stream, its norm and the table hold this rank's rows only.
struct PassRun<'a, B: DitOps> {
    m: Modulation<B>,
    cos: B::T,
    sin: B::T,
    xs: Option<B::T>,
    y: Option<Act<B>>,
    active: Vec<usize>,
    grid: (usize, usize, usize),
    seq: Option<Seq<'a, B>>,
}

/// The ranks a pass's joint stream is spread over ([`ulysses`]) and its whole length.
struct Seq<'a, B: DitOps> {
    comm: &'a dyn Transport<B>,
    tokens: usize,
}

impl<B: DitOps> Clone for Seq<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: DitOps> Copy for Seq<'_, B> {}

/// What the timestep gives every block (spec 4.3): `[D]` vectors.
pub struct Modulation<B: DitOps> {
    /// `time_embedding` output.
    pub time: B::T,
    pub shift_attn: B::T,
    pub scale_attn: B::T,
    pub gate_attn: B::T,
    pub shift_ffn: B::T,
    pub scale_ffn: B::T,
    pub gate_ffn: B::T,
    pub head_shift: B::T,
    pub head_scale: B::T,
}

/// A prompt's text tokens after the text embedder and refiner: computed once per prompt.
pub struct TextCond<B: DitOps> {
    /// `[L, dim]`
    pub tokens: B::T,
    /// Text length L (the t-axis RoPE value of the image tokens).
    pub len: usize,
}

pub struct Dit<B: DitOps> {
    cfg: DitConfig,
    video_embedder: Linear<B>,
    text_proj: Linear<B>,
    refiner: Vec<RefinerBlock<B>>,
    time_embedding_0: Linear<B>,
    time_embedding_2: Linear<B>,
    shared_block_modulation: Linear<B>,
    layers: Vec<Block<B>>,
    /// How the main blocks' matrices are held (so the form their inputs are made in).
    linears: MainLinears,
    final_norm_video: B::T,
    final_linear_video: B::T,
    video_head_modulation: Linear<B>,
    /// Where the streamed blocks come from (`None`: every block is resident).
    stream: Option<Streamer<B>>,
    /// RoPE tables of the joint stream by `(h, w, text_len)`, built on the host once and reused by
    /// every step (cond and uncond differ in `text_len`); the most recent [`ROPE_CACHE`] kept.
    rope_cache: Mutex<Vec<((usize, usize, usize), (B::T, B::T))>>,
}

/// How many joint-stream RoPE tables a [`Dit`] keeps (a guided step needs two).
const ROPE_CACHE: usize = 4;

impl<B: DitOps> Dit<B> {
    /// Every block resident, its matrices held as `linears` says.
    pub fn load(b: &B, c: &Component, cfg: &DitConfig, linears: MainLinears) -> Result<Self> {
        Self::load_blocks(b, c, cfg, usize::MAX, linears)
    }

    /// The first `resident` main blocks resident, the rest streamed from `c` (kept open, a file
    /// mapping) each time a forward reaches them ([`stream`]: fetched ahead into reused slots):
    /// the same values through the same kernels, so the output is identical to [`Dit::load`]'s.
    /// At fp8, a streamed bf16/f32 block is quantized after each fetch.
    pub fn load_streamed(b: &B, c: Component, cfg: &DitConfig, resident: usize, linears: MainLinears) -> Result<Self> {
        let mut dit = Self::load_blocks(b, &c, cfg, resident, linears)?;
        dit.stream = dit.streamer(c, resident);
        Ok(dit)
    }

    /// The provider of blocks `resident..`: each fetches the matrices its sources load.
    fn streamer(&self, c: Component, resident: usize) -> Option<Streamer<B>> {
        let names = self.layers.iter().enumerate().map(|(i, l)| (i >= resident).then(|| mats::fetched(i, &l.sources)));
        Streamer::new(c, names.collect())
    }

    /// [`Dit::load_streamed`] with the resident weights' copies still in flight: the compute
    /// waits for them at [`Behind::ready`] (the DiT loads while the text encoder runs).
    pub fn load_behind(b: &B, c: Component, cfg: &DitConfig, resident: usize, linears: MainLinears) -> Result<Behind<Self>> {
        let dit = b.load_behind(|b| Self::load_blocks_unbatched(b, &c, cfg, resident, linears))?;
        Ok(dit.map(|mut dit| {
            dit.stream = dit.streamer(c, resident);
            dit
        }))
    }

    /// How many main blocks are resident (the rest stream).
    pub fn resident_blocks(&self) -> usize {
        self.layers.iter().filter(|l| l.mats.is_some()).count()
    }

    /// Every resident weight in one load batch.
    fn load_blocks(b: &B, c: &Component, cfg: &DitConfig, resident: usize, linears: MainLinears) -> Result<Self> {
        b.load_batch(|b| Self::load_blocks_unbatched(b, c, cfg, resident, linears))
    }

    fn load_blocks_unbatched(b: &B, c: &Component, cfg: &DitConfig, resident: usize, linears: MainLinears) -> Result<Self> {
        let w = |n: &str| b.load(c, n);
        let lin = |n: &str, bias: bool| Linear::load(b, c, n, bias);
        let refiner = (0..cfg.num_refiner_layers).map(|i| RefinerBlock::load(b, c, i)).collect::<Result<Vec<_>>>()?;
        let layers = (0..cfg.num_layers).map(|i| Block::load(b, c, i, i < resident, linears)).collect::<Result<Vec<_>>>()?;
        Ok(Dit {
            cfg: cfg.clone(),
            video_embedder: lin("video_embedder", true)?,
            text_proj: lin("text_embedder.proj", true)?,
            refiner,
            time_embedding_0: lin("time_embedding.0", true)?,
            time_embedding_2: lin("time_embedding.2", true)?,
            shared_block_modulation: lin("shared_block_modulation", true)?,
            layers,
            linears,
            final_norm_video: w("final_norm_video.weight")?,
            final_linear_video: w("final_linear_video.weight")?,
            video_head_modulation: lin("video_head_modulation", true)?,
            stream: None,
            rope_cache: Mutex::new(Vec::new()),
        })
    }

    pub fn config(&self) -> &DitConfig {
        &self.cfg
    }

    /// The RoPE table `(cos, sin)` `[N, head_dim/2]` of `pos`, on the backend.
    fn rope(&self, b: &B, pos: &[[f32; rope::AXES]]) -> Result<(B::T, B::T)> {
        let (cos, sin) = rope::table(pos, self.cfg.rope_base, self.cfg.head_dim() / 2);
        Ok((b.upload(&cos)?, b.upload(&sin)?))
    }

    /// The joint stream's RoPE table for an `h×w` grid and `text_len` text tokens, from the cache
    /// (computing 2·N·hd/2 sines and cosines on the host every forward left the GPU idle).
    fn joint_rope(&self, b: &B, h: usize, w: usize, text_len: usize) -> Result<(B::T, B::T)> {
        let key = (h, w, text_len);
        let mut cache = self.rope_cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = cache.iter().position(|(k, _)| *k == key) {
            let hit = cache.remove(i);
            let t = hit.1.clone();
            cache.push(hit);
            return Ok(t);
        }
        let t = self.rope(b, &rope::joint_positions(h, w, text_len))?;
        if cache.len() == ROPE_CACHE {
            cache.remove(0);
        }
        cache.push((key, t.clone()));
        Ok(t)
    }

    /// The packed `[N, 3·D]` projection `[q | k | v]` → QK-norm and RoPE on q and k → attention
    /// → `[N, D]`.
    fn packed_attention(&self, b: &B, qkv: B::T, wq: &B::T, wk: &B::T, cos: &B::T, sin: &B::T) -> Result<B::T> {
        let qkv = b.qkv_norm_rope(qkv, self.cfg.num_heads, wq, wk, cos, sin, self.cfg.eps)?;
        self.normed_attention(b, &qkv)
    }

    /// Attention (softmax scale `1/√hd`) over a packed `[N, 3·D]` `[q | k | v]` whose q and k are
    /// normed and rotated → `[N, D]`.
    fn normed_attention(&self, b: &B, qkv: &B::T) -> Result<B::T> {
        b.attention_packed(qkv, self.cfg.num_heads, 1.0 / (self.cfg.head_dim() as f64).sqrt())
    }

    /// Run the text embedder and the refiner over `ctx` `[L, text_dim]`.
    pub fn refine_text(&self, b: &B, ctx: &Tensor) -> Result<TextCond<B>> {
        let eps = self.cfg.eps;
        ensure!(
            ctx.shape.len() == 2 && ctx.shape[1] == self.cfg.text_dim && ctx.shape[0] > 0,
            "text context {:?}, the transformer takes [L, {}]",
            ctx.shape,
            self.cfg.text_dim
        );
        let len = ctx.shape[0];
        let (cos, sin) = self.rope(b, &rope::text_positions(len))?;
        let mut txt = self.text_proj.forward(b, &b.upload(ctx)?)?;
        for blk in &self.refiner {
            let qkv = blk.qkv.forward(b, &b.rms_norm(&txt, Some(&blk.norm1), eps, false)?)?;
            let att = self.packed_attention(b, qkv, &blk.q_norm, &blk.k_norm, &cos, &sin)?;
            txt = b.add(&txt, &blk.proj.forward(b, &att)?)?;
            let y = blk.ffn_up_gate.forward(b, &b.rms_norm(&txt, Some(&blk.norm2), eps, false)?)?;
            txt = b.add(&txt, &blk.ffn_down.forward(b, &b.situ_glu(&y)?)?)?;
        }
        Ok(TextCond { tokens: txt, len })
    }

    /// The timestep's vectors: `time = time_embedding.2(silu(time_embedding.0(sinusoid(t))))`,
    /// `shared_block_modulation(time)` (no activation first) split in 6, and
    /// `video_head_modulation(time)` split in 2.
    pub fn modulation(&self, b: &B, t: f32) -> Result<Modulation<B>> {
        let d = self.cfg.dim;
        let e = b.reshape(&b.timestep_sinusoid(t, self.cfg.freq_dim)?, &[1, self.cfg.freq_dim])?;
        let time = self.time_embedding_2.forward(b, &b.silu(&self.time_embedding_0.forward(b, &e)?)?)?;
        let m = b.reshape(&self.shared_block_modulation.forward(b, &time)?, &[6, d])?;
        let hm = b.reshape(&self.video_head_modulation.forward(b, &time)?, &[2, d])?;
        let row = |x: &B::T, i: usize| b.reshape(&b.narrow(x, 0, i, 1)?, &[d]);
        Ok(Modulation {
            time: b.reshape(&time, &[d])?,
            shift_attn: row(&m, 0)?,
            scale_attn: row(&m, 1)?,
            gate_attn: row(&m, 2)?,
            shift_ffn: row(&m, 3)?,
            scale_ffn: row(&m, 4)?,
            gate_ffn: row(&m, 5)?,
            head_shift: row(&hm, 0)?,
            head_scale: row(&hm, 1)?,
        })
    }

    /// Velocity `[1, C, h, w]` (f32) for latent `x` `[1, C, h, w]` at timestep `t` (σ·1000),
    /// skipping the blocks listed in `skip` (indices past the last block skip nothing).
    pub fn forward(&self, b: &B, x: &Tensor, t: f32, text: &TextCond<B>, skip: &[usize]) -> Result<Tensor> {
        b.download(&self.velocity(b, &b.upload(x)?, t, text, skip)?)
    }

    /// [`Dit::forward`] on backend tensors.
    pub fn velocity(&self, b: &B, x: &B::T, t: f32, text: &TextCond<B>, skip: &[usize]) -> Result<B::T> {
        self.velocity_on(b, x, t, text, skip, None)
    }

    /// [`Dit::velocity`] with the joint stream's tokens spread over the ranks of `seq`
    /// ([`ulysses`]; every rank of the group calls it): the whole velocity on every rank.
    pub fn velocity_on(&self, b: &B, x: &B::T, t: f32, text: &TextCond<B>, skip: &[usize], seq: Option<&dyn Transport<B>>) -> Result<B::T> {
        let mut v = self.velocities_on(b, x, t, &[(text, skip)], seq)?;
        Ok(v.remove(0))
    }

    /// The velocities of several passes over the same latent `x` and timestep `t` (a guided
    /// step: the prompt's and the negative's, each `(text, skip)`), each exactly what
    /// [`Dit::velocity`] gives it. With streamed blocks the passes go through the blocks
    /// together: every pass that runs block `i` runs it on the one fetch of its weights, so a
    /// streamed block moves once per step, not once per pass. With every block resident the
    /// passes run one after the other (fewer activations alive at once).
    pub fn velocities(&self, b: &B, x: &B::T, t: f32, passes: &[(&TextCond<B>, &[usize])]) -> Result<Vec<B::T>> {
        self.velocities_on(b, x, t, passes, None)
    }

    /// [`Dit::velocities`] with each pass's tokens spread over the ranks of `seq` ([`ulysses`]).
    pub fn velocities_on(&self, b: &B, x: &B::T, t: f32, passes: &[(&TextCond<B>, &[usize])], seq: Option<&dyn Transport<B>>) -> Result<Vec<B::T>> {
        if self.stream.is_none() && passes.len() > 1 {
            return passes.iter().map(|&p| self.velocity_on(b, x, t, p.0, p.1, seq)).collect();
        }
        let mut runs = passes.iter().map(|&(text, skip)| self.begin_on(b, x, t, text, skip, seq)).collect::<Result<Vec<_>>>()?;
        // The blocks some pass runs, in order: each fetched (if streamed) once for all passes.
        let order: Vec<usize> = (0..self.layers.len()).filter(|i| runs.iter().any(|r| r.active.contains(i))).collect();
        for (j, &i) in order.iter().enumerate() {
            let mats = self.block_weights(b, i)?;
            for r in runs.iter_mut().filter(|r| r.active.contains(&i)) {
                self.advance(b, r, i, &mats)?;
            }
            mats.done(b)?;
            self.prefetch(b, order[j + 1..].iter().copied())?;
        }
        runs.into_iter().map(|r| self.head(b, r)).collect()
    }

    /// A pass up to the main blocks: the joint stream `[image ; text]` and the first running
    /// block's modulated norm.
    fn begin<'a>(&'a self, b: &B, x: &B::T, t: f32, text: &TextCond<B>, skip: &[usize]) -> Result<PassRun<'a, B>> {
        self.begin_on(b, x, t, text, skip, None)
    }

    /// [`Dit::begin`] of this rank's rows of the joint stream when `seq` spreads it.
    fn begin_on<'a>(&'a self, b: &B, x: &B::T, t: f32, text: &TextCond<B>, skip: &[usize], seq: Option<&'a dyn Transport<B>>) -> Result<PassRun<'a, B>> {
        let cfg = &self.cfg;
        let dims = b.dims(x);
        ensure!(dims.len() == 4 && dims[0] == 1 && dims[1] == cfg.latent_channels, "latent {dims:?}, the transformer takes [1, {}, h, w]", cfg.latent_channels);
        let (c, h, w) = (dims[1], dims[2], dims[3]);
        let tokens = h * w + text.len;
        let seq = seq.map(|comm| Seq { comm, tokens });
        let rows = match seq {
            Some(s) => {
                ensure!(tokens >= s.comm.ranks(), "{tokens} tokens over {} ranks", s.comm.ranks());
                ulysses::rows(tokens, s.comm.ranks(), s.comm.rank())
            }
            None => 0..tokens,
        };
        let m = self.modulation(b, t)?;
        let (cos, sin) = self.joint_rope(b, h, w, text.len)?;
        let (cos, sin) = match seq {
            Some(_) => (b.narrow(&cos, 0, rows.start, rows.len())?, b.narrow(&sin, 0, rows.start, rows.len())?),
            None => (cos, sin),
        };
        let xs = self.joint_stream(b, &b.permute(&b.reshape(x, &[c, h * w])?, &[1, 0])?, text, rows)?;
        // Each block's first norm is fused with the previous block's last gated residual, so
        // only the first block that runs starts from a plain norm.
        let active: Vec<usize> = (0..self.layers.len()).filter(|i| !skip.contains(i)).collect();
        let y = match active.first() {
            Some(&first) => Some(self.linears.rms_norm_modulate(b, &xs, &self.layers[first].norm1, &m.shift_attn, &m.scale_attn, cfg.eps)?),
            None => None,
        };
        Ok(PassRun { m, cos, sin, xs: Some(xs), y, active, grid: (c, h, w), seq })
    }

    /// Rows `rows` of the joint stream `[video_embedder(x) ; text]` (`x` as `[h·w, C]`), in the
    /// residual stream's dtype: the image rows embedded, the text rows taken.
    fn joint_stream(&self, b: &B, x: &B::T, text: &TextCond<B>, rows: Range<usize>) -> Result<B::T> {
        let hw = b.dims(x)[0];
        let some = |t: &B::T, r: Range<usize>, all: usize| match r.len() {
            n if n == all => Ok(Some(t.clone())),
            0 => Ok(None),
            n => b.narrow(t, 0, r.start, n).map(Some),
        };
        let img = match some(x, rows.start.min(hw)..rows.end.min(hw), hw)? {
            Some(x) => Some(self.video_embedder.forward(b, &x)?),
            None => None,
        };
        let txt = some(&text.tokens, rows.start.max(hw) - hw..rows.end.max(hw) - hw, text.len)?;
        let parts: Vec<&B::T> = img.iter().chain(txt.iter()).collect();
        b.residual_stream(&b.cat(&parts, 0)?)
    }

    /// Main block `i` (one the pass runs) on the pass's stream.
    fn advance(&self, b: &B, r: &mut PassRun<'_, B>, i: usize, mats: &BlockMats<B>) -> Result<()> {
        let j = r.active.iter().position(|&k| k == i).expect("the pass runs this block");
        let next = r.active.get(j + 1).map(|&n| &self.layers[n].norm1);
        let yin = r.y.take().expect("every block that runs gets its norm");
        let xs = r.xs.take().expect("the stream is there between blocks");
        let (xs, y) = self.block(b, &self.layers[i], mats, xs, yin, r, next)?;
        (r.xs, r.y) = (Some(xs), y);
        Ok(())
    }

    /// The head on the image tokens: the velocity `[1, C, h, w]`. Under sequence parallelism
    /// every rank's rows go through it (it works row by row) and the image rows are gathered.
    fn head(&self, b: &B, r: PassRun<'_, B>) -> Result<B::T> {
        let ((c, h, w), m) = (r.grid, &r.m);
        let xs = r.xs.expect("the stream is there after the blocks");
        let z = match r.seq {
            Some(_) => xs,
            None => b.narrow(&xs, 0, 0, h * w)?,
        };
        let z = b.rms_norm_modulate(&z, &self.final_norm_video, &m.head_shift, &m.head_scale, self.cfg.eps)?;
        let out = b.linear_f32(&z, &self.final_linear_video)?;
        let out = match r.seq {
            Some(s) => ulysses::gather_rows(b, s.comm, &out, s.tokens, h * w)?,
            None => out,
        };
        b.reshape(&b.permute(&out, &[1, 0])?, &[1, c, h, w])
    }

    /// The weight provider: block `i`'s matrices, resident, or streamed ([`stream::weights`]).
    fn block_weights(&self, b: &B, i: usize) -> Result<Fetched<'_, BlockMats<B>>> {
        let build = |raw| match &self.stream {
            Some(s) => BlockMats::from_loaded(b, s.source(), i, &self.layers[i].sources, raw),
            None => anyhow::bail!("block {i} is neither resident nor streamed"),
        };
        stream::weights(b, self.stream.as_ref(), i, self.layers[i].mats.as_ref(), build)
    }

    /// After a block's compute is queued: fetch the next streamed blocks (`rest` of this forward,
    /// then the next forward's first).
    fn prefetch(&self, b: &B, rest: impl Iterator<Item = usize>) -> Result<()> {
        self.stream.as_ref().map_or(Ok(()), |s| s.prefetch(b, rest))
    }

    /// Drop the blocks fetched ahead for a next forward (the denoising is over: their slots'
    /// memory may go with the stage's).
    pub fn end_stream(&self) {
        if let Some(s) = &self.stream {
            s.cancel();
        }
    }

    /// Attention over the pass's whole joint stream: on this rank's rows of it under sequence
    /// parallelism ([`ulysses::attention`]).
    fn pass_attention(&self, b: &B, qkv: &B::T, seq: Option<Seq<'_, B>>) -> Result<B::T> {
        match seq {
            None => self.normed_attention(b, qkv),
            Some(s) => ulysses::attention(b, s.comm, qkv, self.cfg.num_heads, s.tokens, 1.0 / (self.cfg.head_dim() as f64).sqrt()),
        }
    }

    /// One main block of the pass `r` (its modulation, RoPE table, ranks) on the stream `x` and
    /// its modulated norm `y` (norm1 of this block); returns the new stream and, when `next_norm`
    /// (the next running block's norm1 weight) is given, its modulated norm (the last gated
    /// residual fused with it). The matrices' inputs come in the form the main linears read
    /// ([`MainLinears`]: at fp8 quantized by their producer).
    #[allow(clippy::too_many_arguments)]
    fn block(
        &self,
        b: &B,
        blk: &Block<B>,
        mats: &BlockMats<B>,
        x: B::T,
        y: Act<B>,
        r: &PassRun<'_, B>,
        next_norm: Option<&B::T>,
    ) -> Result<(B::T, Option<Act<B>>)> {
        let (eps, l, m) = (self.cfg.eps, self.linears, &r.m);
        let qkv = mats.qkv.forward_qkv_norm_rope(b, &y, &blk.q_norm, &blk.k_norm, &r.cos, &r.sin, self.cfg.num_heads, eps)?;
        drop(y);
        let att = self.pass_attention(b, &qkv, r.seq)?;
        drop(qkv);
        let att = Act::Dense(att);
        let (x, y) = mats.o.forward_gated_residual_norm_modulate(b, &att, &x, &m.gate_attn, &blk.norm2, &m.shift_ffn, &m.scale_ffn, eps, l)?;
        drop(att);
        let s = mats.ffn_up_gate.forward_situ_glu(b, &y, l)?;
        drop(y);
        match next_norm {
            Some(w) => {
                let (x, y) = mats.ffn_down.forward_gated_residual_norm_modulate(b, &s, &x, &m.gate_ffn, w, &m.shift_attn, &m.scale_attn, eps, l)?;
                Ok((x, Some(y)))
            }
            None => Ok((mats.ffn_down.forward_gated_residual(b, &s, &x, &m.gate_ffn)?, None)),
        }
    }
}

//! The main blocks' matrices (`layers.N.proj.*`): dense in the backend's storage precision, or
//! float8 e4m3 with one scale per output row (`--precision fp8`, [`crate::fp8`]), made from a
//! bf16/f32 checkpoint (quantized after any LoRA merge) or from one stored as scaled float8
//! ([`crate::checkpoint::scaled_fp8`]), or int8 with one scale per output row (`--precision
//! int8`, [`crate::int8`]), made the same way or taken as stored from a comfy_quant int8 file
//! (with ConvRot: the codes of `W · H`, whose product turns the activation first). Everything
//! else in the DiT stays dense.

use crate::backend::ops::DitOps;
use crate::checkpoint::{comfy_quant, scaled_fp8, Component, Dtype};
use crate::options::Precision;
use crate::tensor::Tensor;
use anyhow::{bail, Result};

/// How the main blocks' matrices are held: the load option the run's precision gives the DiT
/// (the backend's ops stay precision-agnostic).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MainLinears {
    /// In the backend's storage precision; a float8 checkpoint is dequantized.
    #[default]
    Dense,
    /// float8 e4m3 codes with per-output-row scales, activations quantized per token.
    Fp8,
    /// int8 codes with per-output-row scales, activations quantized per token by the product
    /// (dense until then: the producers of the matrices' inputs are the dense ones).
    Int8,
}

impl MainLinears {
    /// What `--precision p` asks for.
    pub fn of(p: Precision) -> MainLinears {
        match p {
            Precision::Fp8 => MainLinears::Fp8,
            Precision::Int8 => MainLinears::Int8,
            Precision::Bf16 | Precision::Fp32 => MainLinears::Dense,
        }
    }
}

/// The input of a main-block matrix: dense, or (`--precision fp8`, float8 matrices) quantized
/// per row by the op that produced it (its output as [`crate::backend::Backend::quantize_rows`]
/// gives it, never held dense).
pub enum Act<B: DitOps> {
    Dense(B::T),
    /// `x ≈ diag(scale) · q`: codes `q [N, K]`, f32 `scale [N]`.
    Fp8 {
        q: B::T,
        scale: B::T,
    },
}

impl<B: DitOps> Act<B> {
    fn fp8((q, scale): (B::T, B::T)) -> Self {
        Act::Fp8 { q, scale }
    }
}

/// The producers of the main matrices' inputs, in the form `self` reads: dense, or at fp8 each
/// op's output quantized per row (the same values as quantizing the dense output; the CUDA
/// backend writes them so in the op's own kernel).
impl MainLinears {
    /// `rms_norm_modulate(x, w, shift, scale)`.
    pub fn rms_norm_modulate<B: DitOps>(self, b: &B, x: &B::T, w: &B::T, shift: &B::T, scale: &B::T, eps: f64) -> Result<Act<B>> {
        Ok(match self {
            MainLinears::Dense | MainLinears::Int8 => Act::Dense(b.rms_norm_modulate(x, w, shift, scale, eps)?),
            MainLinears::Fp8 => Act::fp8(b.rms_norm_modulate_fp8(x, w, shift, scale, eps)?),
        })
    }

    /// `(x', n) = gated_residual_norm_modulate(x, y, gate, w, shift, scale)`, `n` in this form.
    #[allow(clippy::too_many_arguments)]
    pub fn gated_residual_norm_modulate<B: DitOps>(
        self,
        b: &B,
        x: &B::T,
        y: &B::T,
        gate: &B::T,
        w: &B::T,
        shift: &B::T,
        scale: &B::T,
        eps: f64,
    ) -> Result<(B::T, Act<B>)> {
        Ok(match self {
            MainLinears::Dense | MainLinears::Int8 => {
                let (x, n) = b.gated_residual_norm_modulate(x, y, gate, w, shift, scale, eps)?;
                (x, Act::Dense(n))
            }
            MainLinears::Fp8 => {
                let (x, n) = b.gated_residual_norm_modulate_fp8(x, y, gate, w, shift, scale, eps)?;
                (x, Act::fp8(n))
            }
        })
    }

    /// `situ_glu(x)`.
    pub fn situ_glu<B: DitOps>(self, b: &B, x: &B::T) -> Result<Act<B>> {
        Ok(match self {
            MainLinears::Dense | MainLinears::Int8 => Act::Dense(b.situ_glu(x)?),
            MainLinears::Fp8 => Act::fp8(b.situ_glu_fp8(x)?),
        })
    }
}

/// A weight matrix `W [N, K]` (no bias) and `x · Wᵀ`.
pub enum Matrix<B: DitOps> {
    Dense(B::T),
    /// `W ≈ diag(scale) · q`: codes `q [N, K]`, f32 `scale [N]`.
    Fp8 {
        q: B::T,
        scale: B::T,
    },
    /// `W ≈ diag(scale) · q · H` (int8 codes `q [N, K]`, f32 `scale [N]`; `H` the ConvRot turn of
    /// groups of `convrot` columns, the identity without one).
    Int8 {
        q: B::T,
        scale: B::T,
        convrot: Option<usize>,
    },
}

impl<B: DitOps> Clone for Matrix<B> {
    fn clone(&self) -> Self {
        match self {
            Matrix::Dense(w) => Matrix::Dense(w.clone()),
            Matrix::Fp8 { q, scale } => Matrix::Fp8 { q: q.clone(), scale: scale.clone() },
            Matrix::Int8 { q, scale, convrot } => Matrix::Int8 { q: q.clone(), scale: scale.clone(), convrot: *convrot },
        }
    }
}

impl<B: DitOps> Matrix<B> {
    /// `x · Wᵀ` for a dense `x` (quantized per row first if `W` is float8 or int8; turned
    /// first if `W` is a ConvRot matrix).
    pub fn forward(&self, b: &B, x: &B::T) -> Result<B::T> {
        match self {
            Matrix::Dense(w) => b.linear(x, w, None),
            Matrix::Fp8 { q, scale } => b.linear_fp8(x, q, scale),
            Matrix::Int8 { q, scale, convrot } => b.linear_int8(x, q, scale, *convrot),
        }
    }

    /// `x · Wᵀ` for `x` in either form (a quantized `x` needs a float8 `W`).
    pub fn forward_act(&self, b: &B, x: &Act<B>) -> Result<B::T> {
        match (self, x) {
            (_, Act::Dense(x)) => self.forward(b, x),
            (Matrix::Fp8 { q, scale }, Act::Fp8 { q: xq, scale: xs }) => b.linear_fp8_quantized(xq, xs, q, scale),
            (Matrix::Dense(_) | Matrix::Int8 { .. }, Act::Fp8 { .. }) => {
                bail!("a dense or int8 matrix given a float8 activation (the main matrices are all float8 or none)")
            }
        }
    }

    /// `x + gate ⊙ (a · Wᵀ)` (the gated residual of the o and ffn_down products): the product,
    /// then the residual.
    pub fn forward_gated_residual(&self, b: &B, a: &Act<B>, x: &B::T, gate: &B::T) -> Result<B::T> {
        b.gated_residual(x, &self.forward_act(b, a)?, gate)
    }

    /// `(x', n)`: `x' = x + gate ⊙ (a · Wᵀ)` and `n` its modulated norm in the form `l` gives the
    /// next matrix: the product, then [`MainLinears::gated_residual_norm_modulate`] (one op: the
    /// residual, the norm and the modulation).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_gated_residual_norm_modulate(
        &self,
        b: &B,
        a: &Act<B>,
        x: &B::T,
        gate: &B::T,
        w: &B::T,
        shift: &B::T,
        scale: &B::T,
        eps: f64,
        l: MainLinears,
    ) -> Result<(B::T, Act<B>)> {
        l.gated_residual_norm_modulate(b, x, &self.forward_act(b, a)?, gate, w, shift, scale, eps)
    }

    /// `qkv_norm_rope(x · Wᵀ, ..)` (`W`'s rows `[q ; k ; v]`, [`DitOps::qkv_norm_rope`]): one op
    /// where dense ([`DitOps::linear_qkv_norm_rope`]) or float8 with a quantized `x`
    /// ([`DitOps::linear_qkv_norm_rope_fp8`]), else the product, then the norm.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_qkv_norm_rope(&self, b: &B, x: &Act<B>, wq: &B::T, wk: &B::T, cos: &B::T, sin: &B::T, heads: usize, eps: f64) -> Result<B::T> {
        match (self, x) {
            (Matrix::Dense(w), Act::Dense(x)) => b.linear_qkv_norm_rope(x, w, wq, wk, cos, sin, heads, eps),
            (Matrix::Fp8 { q, scale }, Act::Fp8 { q: xq, scale: xs }) => b.linear_qkv_norm_rope_fp8((xq, xs), (q, scale), wq, wk, cos, sin, heads, eps),
            _ => b.qkv_norm_rope(self.forward_act(b, x)?, heads, wq, wk, cos, sin, eps),
        }
    }

    /// SiTU-GLU of `x · Wᵀ` (`W`'s rows `[up ; gate]`) in the form `l` gives the next matrix: one
    /// fused op where dense ([`DitOps::linear_situ_glu`]), else the product, then
    /// [`MainLinears::situ_glu`].
    pub fn forward_situ_glu(&self, b: &B, x: &Act<B>, l: MainLinears) -> Result<Act<B>> {
        match (self, x, l) {
            (Matrix::Dense(w), Act::Dense(x), MainLinears::Dense) => Ok(Act::Dense(b.linear_situ_glu(x, w)?)),
            (Matrix::Fp8 { q, scale }, Act::Fp8 { q: xq, scale: xs }, MainLinears::Fp8) => Ok(Act::fp8(b.linear_situ_glu_fp8(xq, xs, q, scale)?)),
            _ => l.situ_glu(b, &self.forward_act(b, x)?),
        }
    }
}

/// How one of a block's matrices is made from the checkpoint (decided once, at load, from the
/// stored dtypes, the run's [`MainLinears`] and the LoRA updates).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The stored weights as the backend loads them ([`crate::backend::Backend::load_rows`] or a
    /// fetch; LoRA updates merged there).
    Dense,
    /// Loaded as [`Kind::Dense`], then quantized per row ([`crate::backend::Backend::quantize_rows`]).
    Quantized,
    /// Stored float8 codes loaded as they are, with their per-row scales (f32, resident).
    Codes,
    /// Stored float8 dequantized on the host (`W = q · scale`, LoRA updates merged there in fp32),
    /// uploaded (so rounded to the storage precision), then quantized per row if `quantize`.
    Host { quantize: bool },
    /// Stored int8 codes (comfy_quant int8, every tensor of the stack with one ConvRot group or
    /// none, no LoRA update), with their per-row scales (f32, resident): on a backend that keeps
    /// quantized matrices, loaded (and streamed) as the kept stack and its codes taken in place
    /// ([`crate::backend::Backend::kept_int8_codes`]); else read on the host as they are and
    /// uploaded ([`crate::backend::Backend::upload_int8`]).
    Int8Codes { convrot: Option<usize> },
}

/// A matrix's [`Kind`] under the run's [`MainLinears`], with the per-row scales of
/// [`Kind::Codes`] and [`Kind::Int8Codes`] on the backend.
pub struct Source<B: DitOps> {
    pub kind: Kind,
    linears: MainLinears,
    scale: Option<B::T>,
    /// [`Kind::Int8Codes`] fetched as the kept stack (the backend keeps quantized matrices).
    kept_codes: bool,
}

/// The matrices of one main block: the bytes that streaming moves.
pub struct BlockMats<B: DitOps> {
    /// `proj.q`, `proj.k`, `proj.v` stacked at load (rows `[q ; k ; v]`, `[3·D, D]`): one GEMM
    /// gives the packed `[N, 3·D]` projection the fused QK-norm/RoPE and attention read.
    pub qkv: Matrix<B>,
    pub o: Matrix<B>,
    /// rows `[up ; gate]`
    pub ffn_up_gate: Matrix<B>,
    pub ffn_down: Matrix<B>,
}

/// The checkpoint tensors of block `i`'s matrices ([`BlockMats`], what streaming moves), each a
/// dim-0 stack of these names: `qkv`, `o`, `ffn_up_gate`, `ffn_down`.
pub fn block_matrix_names(i: usize) -> Vec<Vec<String>> {
    let w = |n: &str| format!("layers.{i}.proj.{n}.weight");
    vec![vec![w("q"), w("k"), w("v")], vec![w("o")], vec![w("ffn_up_gate")], vec![w("ffn_down")]]
}

/// How the matrix stacking the checkpoint tensors `group` is made under `linears`: a stack is all
/// float8 or none; a float8 matrix with LoRA updates is dequantized, merged, and requantized at fp8.
/// At int8, a stack of int8 codes ([`int8_codes`]) without LoRA updates is taken as stored; any
/// other stack (GGUF, a stack mixing int8 with other storage or ConvRot groups, one with a LoRA
/// update) loads dense as at bf16 (dequantized, LoRA updates merged) and is quantized per row.
pub fn kind(c: &Component, group: &[String], linears: MainLinears) -> Result<Kind> {
    let stored = group.iter().map(|n| scaled_fp8::is_fp8(c, n, c.info(n)?)).collect::<Result<Vec<bool>>>()?;
    if stored.iter().any(|&s| s != stored[0]) {
        bail!("{} are stored partly as float8, partly not: one matrix needs one storage", group.join(", "));
    }
    let merged = group.iter().any(|n| !c.lora_terms(n).is_empty());
    if linears == MainLinears::Int8 && !merged {
        if let Some(convrot) = int8_codes(c, group)? {
            return Ok(Kind::Int8Codes { convrot });
        }
    }
    let quantized = linears != MainLinears::Dense;
    Ok(match (stored[0], quantized) {
        (false, false) => Kind::Dense,
        (false, true) => Kind::Quantized,
        (true, true) if !merged && linears == MainLinears::Fp8 => Kind::Codes,
        (true, quantize) => Kind::Host { quantize },
    })
}

/// `Some(convrot)` when every tensor of `group` is a comfy_quant int8 matrix with row scales, all
/// of one width and one ConvRot group (or none): the stack's codes are one int8 matrix.
pub fn int8_codes(c: &Component, group: &[String]) -> Result<Option<Option<usize>>> {
    let infos = group.iter().map(|n| c.info(n)).collect::<Result<Vec<_>>>()?;
    let convrot = |i: &crate::checkpoint::TensorInfo| i.row_scales.as_ref().map(|r| r.convrot);
    let first = infos[0];
    let same = infos
        .iter()
        .all(|i| i.dtype == Dtype::I8 && i.shape.len() == 2 && i.shape[1] == first.shape[1] && convrot(i).is_some() && convrot(i) == convrot(first));
    Ok(if same { convrot(first) } else { None })
}

/// The [`Source`] of each of block `i`'s matrices under `linears`.
pub fn sources<B: DitOps>(b: &B, c: &Component, i: usize, linears: MainLinears) -> Result<Vec<Source<B>>> {
    let mut out = vec![];
    for g in block_matrix_names(i) {
        let kind = kind(c, &g, linears)?;
        let scales = match kind {
            Kind::Codes => Some(g.iter().map(|n| scaled_fp8::row_scales(c, n)).collect::<Result<Vec<_>>>()?.concat()),
            Kind::Int8Codes { .. } => Some(g.iter().map(|n| comfy_quant::int8_row_scales(&c.store, c.info(n)?)).collect::<Result<Vec<_>>>()?.concat()),
            _ => None,
        };
        let scale = scales.map(|s| b.upload_f32(&Tensor::new(vec![s.len()], s)?)).transpose()?;
        out.push(Source { kind, linears, scale, kept_codes: b.keeps_quantized() });
    }
    Ok(out)
}

/// The groups of [`block_matrix_names`] that go through the backend's loads and fetches (all but
/// [`Kind::Host`] and, on a backend that does not keep quantized matrices, [`Kind::Int8Codes`]:
/// made on the host), in order.
pub fn fetched<B: DitOps>(i: usize, sources: &[Source<B>]) -> Vec<Vec<String>> {
    let host = |s: &Source<B>| matches!(s.kind, Kind::Host { .. }) || (matches!(s.kind, Kind::Int8Codes { .. }) && !s.kept_codes);
    block_matrix_names(i).into_iter().zip(sources).filter(|(_, s)| !host(s)).map(|(g, _)| g).collect()
}

impl<B: DitOps> BlockMats<B> {
    /// Block `i`'s matrices, loaded now.
    pub fn load(b: &B, c: &Component, i: usize, sources: &[Source<B>]) -> Result<Self> {
        Self::from_loaded(b, c, i, sources, crate::backend::load_groups(b, c, &fetched(i, sources))?)
    }

    /// Block `i`'s matrices from `raw`, the tensors of [`fetched`] as loaded (or fetched).
    pub fn from_loaded(b: &B, c: &Component, i: usize, sources: &[Source<B>], raw: Vec<B::T>) -> Result<Self> {
        let mut raw = raw.into_iter();
        let mut m = vec![];
        for (g, s) in block_matrix_names(i).iter().zip(sources) {
            let mut next = || raw.next().ok_or_else(|| anyhow::anyhow!("block {i}: fewer loaded tensors than matrices"));
            let quantize = |w: &B::T| -> Result<Matrix<B>> {
                if s.linears == MainLinears::Int8 {
                    let (q, scale) = b.quantize_rows_int8(w, None)?;
                    return Ok(Matrix::Int8 { q, scale, convrot: None });
                }
                let (q, scale) = b.quantize_rows(w)?;
                Ok(Matrix::Fp8 { q, scale })
            };
            m.push(match (s.kind, &s.scale) {
                (Kind::Dense, _) => Matrix::Dense(next()?),
                (Kind::Quantized, _) => quantize(&next()?)?,
                (Kind::Codes, Some(scale)) => Matrix::Fp8 { q: next()?, scale: scale.clone() },
                (Kind::Codes | Kind::Int8Codes { .. }, None) => bail!("block {i}: stored codes without their scales"),
                (Kind::Int8Codes { convrot }, Some(scale)) if s.kept_codes => Matrix::Int8 { q: b.kept_int8_codes(&next()?)?, scale: scale.clone(), convrot },
                (Kind::Int8Codes { convrot }, Some(scale)) => {
                    let infos = g.iter().map(|n| c.info(n)).collect::<Result<Vec<_>>>()?;
                    let shape = [infos.iter().map(|t| t.shape[0]).sum(), infos[0].shape[1]];
                    let codes: Vec<u8> = infos.iter().flat_map(|t| c.store.bytes(t).iter().copied()).collect();
                    Matrix::Int8 { q: b.upload_int8(&shape, &codes)?, scale: scale.clone(), convrot }
                }
                (Kind::Host { quantize: q }, _) => {
                    let parts = g.iter().map(|n| scaled_fp8::dequantized_merged(c, n)).collect::<Result<Vec<_>>>()?;
                    let mut shape = parts[0].shape.clone();
                    shape[0] = parts.iter().map(|p| p.shape[0]).sum();
                    let w = b.upload(&Tensor::new(shape, parts.into_iter().flat_map(|p| p.data).collect())?)?;
                    if q {
                        quantize(&w)?
                    } else {
                        Matrix::Dense(w)
                    }
                }
            });
        }
        anyhow::ensure!(raw.next().is_none(), "block {i}: more loaded tensors than matrices");
        let [qkv, o, ffn_up_gate, ffn_down]: [Matrix<B>; 4] =
            m.try_into().map_err(|m: Vec<Matrix<B>>| anyhow::anyhow!("block {i}: {} matrices, not 4", m.len()))?;
        Ok(BlockMats { qkv, o, ffn_up_gate, ffn_down })
    }
}

//! Quantized matrices as the GPU keeps them: the stored bytes (ggml blocks, int8 codes with one f32
//! scale a row), never dequantized in memory. A matrix the model stacks from several checkpoint
//! tensors (`[q ; k ; v]`, `[gate ; up]`) is one [`Layout`] of parts, each part a tensor's rows in
//! its own format (a GGUF file may store q, k and v in different block types, a comfy_quant file may
//! leave a small projection in bf16 beside int8 ones). Each product dequantizes the whole stack into
//! a scratch matrix right before the GEMM; [`Layout::dequantize`] is that step on the host (the CPU
//! twin of the GPU kernels, and the gates' reference).
//!
//! The packed bytes, each piece 16-byte aligned: every part's data (the blocks, the codes, or the
//! bf16 / f32 values), part after part, then every part's extras: for int8 and W4A8 its row scales
//! (`rows` f32, a per-tensor scale repeated per row), for W4A8 its group scales (as stored: float8
//! e4m3 or f32) and its levels (`2^bits` f32: the stored codebook, or the uniform levels). So the
//! codes of a stack of int8 parts are one `[rows, k]` int8 matrix at offset 0 ([`Layout::int8_codes`],
//! what `--precision int8` multiplies by).
//!
//! A stack is kept this way when one of its tensors is quantized, all are 2-D of one width and none
//! has a LoRA update ([`Layout::of`]); a quantized stack with a LoRA update is dequantized on the
//! host, merged there in f32 and uploaded in the activation dtype (the merged layers are bf16).

use super::ggml::{self, GgmlType};
use super::tensors::{decode_f32, Dtype, TensorInfo};
use super::{comfy_quant, Component};
use anyhow::{bail, ensure, Result};
use std::sync::LazyLock;

/// The largest ConvRot group the GPU turns back (the dequantize kernel's shared-memory tile).
pub const MAX_CONVROT_GROUP: usize = 4096;

/// Alignment of each part's data and scales in the packed bytes.
pub const ALIGN: usize = 16;

/// How one part of a kept matrix is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    BF16,
    F32,
    Ggml(GgmlType),
    /// int8 codes, one f32 scale a row; with ConvRot, the group size of the Hadamard rotation.
    Int8 {
        convrot: Option<usize>,
    },
    /// W4A8 ([`Dtype::W4a8`]): codes of `bits` in groups of `group`, group scales f32 when
    /// `f32_scales` (else float8 e4m3), ConvRot in groups of `convrot`; no correction.
    W4a8 {
        bits: u8,
        group: usize,
        convrot: usize,
        f32_scales: bool,
    },
}

impl Format {
    /// The format of a stored tensor, if the GPU keeps it (plain bf16/f32 only beside quantized parts).
    pub fn of(info: &TensorInfo) -> Option<Format> {
        Some(match info.dtype {
            Dtype::BF16 => Format::BF16,
            Dtype::F32 => Format::F32,
            Dtype::Ggml(t) => Format::Ggml(t),
            Dtype::I8 => Format::Int8 { convrot: info.row_scales.as_ref()?.convrot },
            Dtype::W4a8 { bits } => {
                let rs = info.row_scales.as_ref()?;
                let g = rs.groups.as_ref()?;
                Format::W4a8 { bits, group: g.group, convrot: rs.convrot?, f32_scales: g.s_rel.dtype == Dtype::F32 }
            }
            _ => return None,
        })
    }

    pub fn is_quantized(self) -> bool {
        matches!(self, Format::Ggml(_) | Format::Int8 { .. } | Format::W4a8 { .. })
    }

    /// Whether a part of this format carries `rows` f32 row scales after its data.
    pub fn has_row_scales(self) -> bool {
        matches!(self, Format::Int8 { .. } | Format::W4a8 { .. })
    }

    /// W4A8: bytes of `rows` rows' group scales.
    pub fn group_scale_bytes(self, rows: usize, k: usize) -> usize {
        match self {
            Format::W4a8 { group, f32_scales, .. } => rows * (k / group) * if f32_scales { 4 } else { 1 },
            _ => 0,
        }
    }

    /// Bytes of `rows` rows of `k` values, the scales apart.
    pub fn data_bytes(self, rows: usize, k: usize) -> usize {
        match self {
            Format::BF16 => 2 * rows * k,
            Format::F32 => 4 * rows * k,
            Format::Ggml(t) => rows * (k / t.block_values()) * t.block_bytes(),
            Format::Int8 { .. } => rows * k,
            Format::W4a8 { bits, .. } => rows * k * bits as usize / 8,
        }
    }

    pub fn name(self) -> String {
        match self {
            Format::BF16 => "bf16".into(),
            Format::F32 => "f32".into(),
            Format::Ggml(t) => t.name().into(),
            Format::Int8 { convrot: None } => "int8".into(),
            Format::Int8 { convrot: Some(g) } => format!("int8 + ConvRot {g}"),
            Format::W4a8 { bits, group, convrot, .. } => format!("w{bits}a8 g{group} + ConvRot {convrot}"),
        }
    }
}

/// One part: `rows` rows in `format`, its data at byte `data` of the packed bytes, (int8, W4A8) its
/// row scales at `scales`, (W4A8) its group scales at `group_scales` and its levels at `levels`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub rows: usize,
    pub format: Format,
    pub data: usize,
    pub scales: Option<usize>,
    pub group_scales: Option<usize>,
    pub levels: Option<usize>,
}

/// A kept matrix `[rows, k]`: its parts, top to bottom, and the packed bytes' length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub k: usize,
    pub parts: Vec<Part>,
    pub bytes: usize,
}

impl Layout {
    /// The packing of parts `(rows, format)` of width `k`.
    pub fn new(k: usize, parts: &[(usize, Format)]) -> Layout {
        let mut at = 0usize;
        let mut out = vec![];
        let mut put = |bytes: usize| {
            let s = at.next_multiple_of(ALIGN);
            at = s + bytes;
            s
        };
        let data: Vec<usize> = parts.iter().map(|&(rows, format)| put(format.data_bytes(rows, k))).collect();
        for (&(rows, format), data) in parts.iter().zip(data) {
            let scales = format.has_row_scales().then(|| put(4 * rows));
            let (group_scales, levels) = match format {
                Format::W4a8 { bits, .. } => (Some(put(format.group_scale_bytes(rows, k))), Some(put(4 << bits))),
                _ => (None, None),
            };
            out.push(Part { rows, format, data, scales, group_scales, levels });
        }
        Layout { k, parts: out, bytes: at }
    }

    pub fn rows(&self) -> usize {
        self.parts.iter().map(|p| p.rows).sum()
    }

    /// `Some(convrot)` when every part is int8 with one ConvRot group (or none) and the codes lie
    /// back to back from offset 0: the stack's codes are one `[rows, k]` int8 matrix there.
    pub fn int8_codes(&self) -> Option<Option<usize>> {
        let Format::Int8 { convrot } = self.parts.first()?.format else { return None };
        let mut at = 0;
        for p in &self.parts {
            if p.format != (Format::Int8 { convrot }) || p.data != at {
                return None;
            }
            at += p.rows * self.k;
        }
        Some(convrot)
    }

    /// The parts' formats, for reports (`Q4_K + bf16`).
    pub fn formats(&self) -> String {
        let mut names: Vec<String> = vec![];
        for p in &self.parts {
            let n = p.format.name();
            if !names.contains(&n) {
                names.push(n);
            }
        }
        names.join(" + ")
    }

    /// How the GPU keeps the dim-0 stack of `names` (inside `c`): `None` when the stack is loaded
    /// otherwise (no quantized tensor in it, a LoRA update on one, or tensors that are not 2-D
    /// matrices of one width). A ConvRot group the GPU cannot turn is refused in one line.
    pub fn of(c: &Component, names: &[&str]) -> Result<Option<Layout>> {
        let infos = names.iter().map(|n| c.info(n)).collect::<Result<Vec<_>>>()?;
        Layout::of_infos(c, names, &infos)
    }

    fn of_infos(c: &Component, names: &[&str], infos: &[&TensorInfo]) -> Result<Option<Layout>> {
        let formats: Vec<Option<Format>> = infos.iter().map(|i| Format::of(i)).collect();
        if !formats.iter().flatten().any(|f| f.is_quantized()) {
            return Ok(None);
        }
        let k = infos[0].shape.get(1).copied().unwrap_or(0);
        let matrices = infos.iter().all(|i| i.shape.len() == 2 && i.shape[1] == k);
        if !matrices || formats.iter().any(Option::is_none) || names.iter().any(|n| !c.lora_terms(n).is_empty()) {
            return Ok(None);
        }
        let mut parts = vec![];
        for ((n, i), f) in names.iter().zip(infos).zip(formats) {
            let f = f.expect("checked");
            if let Some(refusal) = gpu_refusal(&c.full_name(n), i) {
                bail!("{refusal}");
            }
            if let Format::Ggml(t) = f {
                ensure!(k % t.block_values() == 0, "`{}`: rows of {k} values are not whole {} blocks", c.full_name(n), t.name());
            }
            parts.push((i.shape[0], f));
        }
        Ok(Some(Layout::new(k, &parts)))
    }

    /// The values of the packed bytes `bytes` (`[rows, k]` row-major, f32): ggml blocks and int8
    /// codes dequantized exactly as the CPU backend loads them ([`ggml::dequantize`],
    /// [`comfy_quant::dequantize_rows`]).
    pub fn dequantize(&self, bytes: &[u8]) -> Result<Vec<f32>> {
        ensure!(bytes.len() >= self.bytes, "{} packed bytes for a layout of {}", bytes.len(), self.bytes);
        let k = self.k;
        let mut out = Vec::with_capacity(self.rows() * k);
        for p in &self.parts {
            let data = &bytes[p.data..p.data + p.format.data_bytes(p.rows, k)];
            match p.format {
                Format::BF16 => out.extend(decode_f32(Dtype::BF16, data).expect("bf16")),
                Format::F32 => out.extend(decode_f32(Dtype::F32, data).expect("f32")),
                Format::Ggml(t) => out.extend(ggml::dequantize(t, data)),
                Format::Int8 { convrot } => {
                    let at = p.scales.expect("int8 parts have scales");
                    let scales = decode_f32(Dtype::F32, &bytes[at..at + 4 * p.rows]).expect("f32");
                    out.extend(comfy_quant::dequantize_rows(data, &scales, k, convrot));
                }
                Format::W4a8 { bits, group, convrot, f32_scales } => {
                    let (s, g, l) = (p.scales.expect("row scales"), p.group_scales.expect("group scales"), p.levels.expect("levels"));
                    let scales = decode_f32(Dtype::F32, &bytes[s..s + 4 * p.rows]).expect("f32");
                    let s_rel = comfy_quant::w4a8_group_scales(&bytes[g..g + p.format.group_scale_bytes(p.rows, k)], f32_scales);
                    let levels = decode_f32(Dtype::F32, &bytes[l..l + (4 << bits)]).expect("f32");
                    let grid = comfy_quant::w4a8_grid(data, k, bits, group, &s_rel, &levels);
                    out.extend(comfy_quant::w4a8_values(&grid, &scales, k, group, convrot, None));
                }
            }
        }
        Ok(out)
    }

    /// The copies that fill the packed bytes from the checkpoint `c`: `(source bytes, offset)` for
    /// each part's data and scales (a per-tensor scale once a row), `infos` the stack's tensors.
    pub fn pieces<'a>(&self, c: &'a Component, infos: &[&TensorInfo]) -> Result<Vec<(&'a [u8], usize)>> {
        ensure!(infos.len() == self.parts.len(), "{} tensors for a layout of {} parts", infos.len(), self.parts.len());
        let mut out = vec![];
        for (p, i) in self.parts.iter().zip(infos) {
            out.push((c.store.bytes(i), p.data));
            if let (Some(at), Some(rs)) = (p.scales, &i.row_scales) {
                let s = c.store.bytes(&rs.scale);
                if let Some(bad) = decode_f32(Dtype::F32, s).expect("f32").iter().find(|v| !v.is_finite()) {
                    bail!("`{}` holds {bad}: a scale must be finite", rs.scale_name);
                }
                if s.len() == 4 * p.rows {
                    out.push((s, at));
                } else {
                    out.extend((0..p.rows).map(|r| (&s[..4], at + 4 * r)));
                }
            }
            if let (Format::W4a8 { bits, f32_scales, .. }, Some(gs)) = (p.format, i.row_scales.as_ref().and_then(|r| r.groups.as_ref())) {
                let s = c.store.bytes(&gs.s_rel);
                // the bytes' exponent bits, not their values: this runs over every group scale at load
                if super::tensors::first_non_finite(if f32_scales { Dtype::F32 } else { Dtype::F8E4M3 }, s).is_some() {
                    bail!("`{}` holds a NaN or infinity: a scale must be finite", gs.s_rel_name);
                }
                out.push((s, p.group_scales.expect("group scales")));
                // (a stored codebook's levels were checked finite at open)
                let levels = match &gs.codebook {
                    Some(book) => c.store.bytes(book),
                    None => uniform_levels(bits),
                };
                out.push((levels, p.levels.expect("levels")));
            }
        }
        Ok(out)
    }
}

/// The uniform levels of W4A8 codes without a codebook, as f32 bytes ([`comfy_quant::w4a8_levels`]).
fn uniform_levels(bits: u8) -> &'static [u8] {
    static FOUR: LazyLock<Vec<u8>> = LazyLock::new(|| comfy_quant::w4a8_levels(4, None).iter().flat_map(|v| v.to_le_bytes()).collect());
    static SIX: LazyLock<Vec<u8>> = LazyLock::new(|| comfy_quant::w4a8_levels(6, None).iter().flat_map(|v| v.to_le_bytes()).collect());
    if bits == 6 {
        &SIX
    } else {
        &FOUR
    }
}

/// The one-line refusal of a stored tensor the CUDA backend cannot run (`full`: its name), if it is one:
/// int8 or W4A8 with ConvRot in groups larger than [`MAX_CONVROT_GROUP`], W4A8 with a zero-point
/// correction (comfy-kitchen's asymmetric variant).
pub fn gpu_refusal(full: &str, info: &TensorInfo) -> Option<String> {
    let corrected = info.row_scales.as_ref().and_then(|r| r.groups.as_ref()).is_some_and(|g| g.correction.is_some());
    match Format::of(info)? {
        Format::Int8 { convrot: Some(g) } | Format::W4a8 { convrot: g, .. } if g > MAX_CONVROT_GROUP => Some(format!(
            "`{full}` is {} + ConvRot in groups of {g}: the CUDA backend turns groups of up to {MAX_CONVROT_GROUP} back (--device cpu runs it)",
            info.dtype.name()
        )),
        Format::W4a8 { .. } if corrected => Some(format!(
            "`{full}` is asymmetric {} (a zero-point correction per group): the CUDA backend does not run it (--device cpu does)",
            info.dtype.name()
        )),
        _ => None,
    }
}

/// Whether tensor `full` (a full name in `c`'s store) is the scales of an int8 weight kept with it
/// (counted in that weight's [`Layout`]) or a `comfy_quant` description (not loaded).
pub fn is_companion(c: &Component, full: &str) -> bool {
    if full.ends_with(".comfy_quant") {
        return true;
    }
    let Some(stem) = full.strip_suffix(".weight_scale") else { return false };
    c.store.get(&format!("{stem}.weight")).is_some_and(|w| w.dtype == Dtype::I8 && w.row_scales.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_pack_aligned_data_first_then_scales() {
        let l = Layout::new(256, &[(3, Format::Ggml(GgmlType::Q4_K)), (5, Format::Int8 { convrot: Some(256) }), (2, Format::BF16)]);
        let q4k = 3 * 144usize;
        let p = |i: usize| (l.parts[i].data, l.parts[i].scales);
        assert_eq!(l.parts[0], Part { rows: 3, format: Format::Ggml(GgmlType::Q4_K), data: 0, scales: None, group_scales: None, levels: None });
        let int8 = q4k.next_multiple_of(16);
        let bf16 = int8 + 5 * 256;
        assert_eq!((p(1), p(2)), ((int8, Some(bf16 + 2 * 2 * 256)), (bf16, None)));
        assert_eq!(l.bytes, bf16 + 2 * 2 * 256 + 20);
        assert_eq!(l.rows(), 10);
        assert_eq!(l.formats(), "Q4_K + int8 + ConvRot 256 + bf16");
        assert_eq!(l.int8_codes(), None);
        // q | k | v of int8: one matrix of codes at 0, the scales after
        let f = Format::Int8 { convrot: Some(256) };
        let qkv = Layout::new(3072, &[(3072, f), (3072, f), (3072, f)]);
        assert_eq!(qkv.int8_codes(), Some(Some(256)));
        assert_eq!(qkv.parts[2].scales, Some(3 * 3072 * 3072 + 2 * 4 * 3072));
        assert_eq!(Layout::new(3072, &[(3072, f), (3072, Format::Int8 { convrot: None })]).int8_codes(), None);
    }

    #[test]
    fn dequantize_reads_each_part_in_its_format() {
        let l = Layout::new(32, &[(1, Format::Ggml(GgmlType::Q8_0)), (2, Format::Int8 { convrot: None }), (1, Format::F32)]);
        let mut b = vec![0u8; l.bytes];
        b[..2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        b[2] = 4; // 4 · 0.5
        let p = &l.parts[1];
        b[p.data] = (-3i8) as u8;
        b[p.data + 32 + 1] = 7;
        let s = p.scales.unwrap();
        b[s..s + 4].copy_from_slice(&2.0f32.to_le_bytes());
        b[s + 4..s + 8].copy_from_slice(&0.25f32.to_le_bytes());
        let f = l.parts[2].data;
        b[f + 4..f + 8].copy_from_slice(&1.5f32.to_le_bytes());
        let v = l.dequantize(&b).unwrap();
        assert_eq!(v.len(), 4 * 32);
        assert_eq!((v[0], v[32], v[64 + 1], v[96 + 1]), (2.0, -6.0, 1.75, 1.5));
    }

    /// What the GPU cannot turn back is refused in one line naming the tensor and its type; the
    /// groups it can are not.
    #[test]
    fn convrot_groups_past_the_tile_are_refused() {
        let scaled = |g: usize| {
            let mut t = TensorInfo::new(Dtype::I8, vec![4, 8192], 0, 0, 4 * 8192);
            let scale = TensorInfo::new(Dtype::F32, vec![4], 0, 0, 16);
            t.row_scales = Some(Box::new(super::super::tensors::RowScales { scale, convrot: Some(g), scale_name: "w.weight_scale".into(), groups: None }));
            t
        };
        let e = gpu_refusal("layers.0.proj.o.weight", &scaled(8192)).expect("refused");
        assert_eq!(e, "`layers.0.proj.o.weight` is int8 + ConvRot in groups of 8192: the CUDA backend turns groups of up to 4096 back (--device cpu runs it)");
        assert_eq!(gpu_refusal("w", &scaled(4096)), None);
        assert_eq!(gpu_refusal("w", &TensorInfo::new(Dtype::Ggml(GgmlType::Q4_K), vec![4, 256], 0, 0, 4 * 144)), None);
    }
}

//! Memory-mapped safetensors: one file, or shards listed by a `*.safetensors.index.json`.

use super::ggml::GgmlType;
use anyhow::{bail, Context, Result};
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Element type of a stored tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    BF16,
    F16,
    F32,
    F64,
    I64,
    /// float8 e4m3 (`float8_e4m3fn`, safetensors `F8_E4M3`): the codes of [`crate::fp8`].
    F8E4M3,
    /// float8 e5m2 (`F8_E5M2`): recognised only to be refused by name.
    F8E5M2,
    /// int8 (`I8`): codes; a weight's values are its codes times per-row scales
    /// ([`TensorInfo::row_scales`], ComfyUI's `int8_tensorwise`).
    I8,
    /// ggml blocks of a GGUF file ([`super::ggml`]): `end - start` is the blocks' bytes, not
    /// elements times [`Dtype::size`].
    Ggml(GgmlType),
    /// ComfyUI's `asym_w4a8_int8` ([`super::comfy_quant`]): a row of `K` weights packed in
    /// `K · bits / 8` bytes (4 or 6 bits a code), shape `[rows, K]`; the group scales, row scales
    /// and codebook are [`RowScales::groups`].
    W4a8 {
        bits: u8,
    },
    Other,
}

impl Dtype {
    pub(crate) fn from_st(d: safetensors::Dtype) -> Dtype {
        match d {
            safetensors::Dtype::BF16 => Dtype::BF16,
            safetensors::Dtype::F16 => Dtype::F16,
            safetensors::Dtype::F32 => Dtype::F32,
            safetensors::Dtype::F64 => Dtype::F64,
            safetensors::Dtype::I64 => Dtype::I64,
            safetensors::Dtype::F8_E4M3 => Dtype::F8E4M3,
            safetensors::Dtype::F8_E5M2 => Dtype::F8E5M2,
            safetensors::Dtype::I8 => Dtype::I8,
            _ => Dtype::Other,
        }
    }
    pub fn size(self) -> usize {
        match self {
            Dtype::BF16 | Dtype::F16 => 2,
            Dtype::F32 => 4,
            Dtype::F64 | Dtype::I64 => 8,
            Dtype::F8E4M3 | Dtype::F8E5M2 | Dtype::I8 | Dtype::Other => 1,
            // bytes per element are fractional: see `Dtype::Ggml`, `Dtype::W4a8`
            Dtype::Ggml(_) | Dtype::W4a8 { .. } => 1,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Dtype::BF16 => "bf16",
            Dtype::F16 => "f16",
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
            Dtype::I64 => "i64",
            Dtype::F8E4M3 => "f8_e4m3",
            Dtype::F8E5M2 => "f8_e5m2",
            Dtype::I8 => "int8",
            Dtype::Ggml(t) => t.name(),
            Dtype::W4a8 { bits: 6 } => "w6a8",
            Dtype::W4a8 { .. } => "w4a8",
            Dtype::Other => "other",
        }
    }

    /// Whether the stored values are a quantized form moss dequantizes as it loads them (the
    /// formats of single-file checkpoints: ggml blocks, int8 with row scales, W4A8).
    pub fn is_block_or_int8(self) -> bool {
        matches!(self, Dtype::Ggml(_) | Dtype::I8 | Dtype::W4a8 { .. })
    }
}

/// The index of the first NaN or infinity among `bytes` read as `dtype` (little-endian): the
/// exponent bits all set. Integer dtypes hold none.
pub fn first_non_finite(dtype: Dtype, bytes: &[u8]) -> Option<usize> {
    match dtype {
        Dtype::BF16 => bytes.chunks_exact(2).position(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7f80 == 0x7f80),
        Dtype::F16 => bytes.chunks_exact(2).position(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7c00 == 0x7c00),
        Dtype::F32 => bytes.chunks_exact(4).position(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) & 0x7f80_0000 == 0x7f80_0000),
        Dtype::F64 => bytes.chunks_exact(8).position(|b| u64::from_le_bytes(b.try_into().unwrap()) & 0x7ff0_0000_0000_0000 == 0x7ff0_0000_0000_0000),
        // e4m3fn has no infinities; its NaN is S.1111.111. e5m2 is IEEE-like: exponent all ones.
        Dtype::F8E4M3 => bytes.iter().position(|b| b & 0x7f == 0x7f),
        Dtype::F8E5M2 => bytes.iter().position(|b| b & 0x7c == 0x7c),
        Dtype::Ggml(t) => super::ggml::first_bad_block(t, bytes).map(|b| b * t.block_values()),
        Dtype::I64 | Dtype::I8 | Dtype::W4a8 { .. } | Dtype::Other => None,
    }
}

/// Where one tensor lives.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Index into [`TensorStore::files`].
    pub file: usize,
    /// Absolute byte range in the file.
    pub start: usize,
    pub end: usize,
    /// An int8 weight's scales ([`Dtype::I8`]), one f32 a row.
    pub row_scales: Option<Box<RowScales>>,
}

/// The scales of an int8 weight `W[r, :] ≈ q[r, :] · scale[r]` (ComfyUI `int8_tensorwise`), and
/// with ConvRot the group size `g` of the Hadamard rotation the codes were taken in: each row's
/// groups of `g` values are `W_rot = W · Hᵀ` ([`super::comfy_quant`]).
#[derive(Clone, Debug)]
pub struct RowScales {
    /// f32 `[rows]` (stored `[rows]` or `[rows, 1]`).
    pub scale: TensorInfo,
    pub convrot: Option<usize>,
    /// The name of the scale tensor in the file (for messages).
    pub scale_name: String,
    /// W4A8 ([`Dtype::W4a8`]): the codes decode per group to the int8 grid ([`GroupScales`]);
    /// `scale` is then the row scale `s_channel`.
    pub groups: Option<Box<GroupScales>>,
}

/// The per-group half of a W4A8 weight (comfy-kitchen's `AsymW4A8Int8Layout`): code `c` of group
/// `j` of row `r` is the int8 value `clamp(round(level(c) · s_rel[r, j]), ±127)`, `level` the
/// stored codebook (16 levels), else uniform (`c − 8`, `c − 32` at 6 bits); the weight in the
/// ConvRot basis is that value times the row scale, plus `correction[j, r]` when stored.
#[derive(Clone, Debug)]
pub struct GroupScales {
    /// `s_rel` `[rows, K / group]`: float8 e4m3 (also stored as raw U8 bytes) or f32.
    pub s_rel: TensorInfo,
    /// Weights a group (16 by default).
    pub group: usize,
    /// f32 `[16]`.
    pub codebook: Option<TensorInfo>,
    /// `[K / group, rows_of_the_file]` in the file's float dtype, and the first of its columns this
    /// tensor's rows take (a row slice of the weight keeps the whole correction).
    pub correction: Option<(TensorInfo, usize)>,
    /// The name of `s_rel` in the file (for messages).
    pub s_rel_name: String,
}

impl TensorInfo {
    pub fn new(dtype: Dtype, shape: Vec<usize>, file: usize, start: usize, end: usize) -> TensorInfo {
        TensorInfo { dtype, shape, file, start, end, row_scales: None }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Rows `r0..r1` (dim 0) of this tensor: a byte range of its rows (and of its row scales). Every
    /// stored layout here keeps a row's bytes together (ggml blocks never cross a row).
    pub fn row_slice(&self, r0: usize, r1: usize) -> TensorInfo {
        let rows = self.shape.first().copied().unwrap_or(1).max(1);
        let per = (self.end - self.start) / rows;
        let mut t = self.clone();
        t.start = self.start + r0 * per;
        t.end = self.start + r1 * per;
        if let Some(s) = t.shape.first_mut() {
            *s = r1 - r0;
        }
        if let Some(rs) = &self.row_scales {
            let groups = rs.groups.as_ref().map(|g| {
                let correction = g.correction.as_ref().map(|(c, at)| (c.clone(), at + r0));
                Box::new(GroupScales { s_rel: g.s_rel.row_slice(r0, r1), correction, ..(**g).clone() })
            });
            t.row_scales = Some(Box::new(RowScales { scale: rs.scale.row_slice(r0, r1), groups, ..(**rs).clone() }));
        }
        t
    }
}

/// All tensors of one component folder (or one single-file checkpoint), memory-mapped.
pub struct TensorStore {
    pub dir: PathBuf,
    pub files: Vec<(PathBuf, Mmap)>,
    pub tensors: BTreeMap<String, TensorInfo>,
    /// The file format, for reports: `safetensors`, `GGUF (...)`, `comfy_quant safetensors`.
    pub format: String,
    /// One file given for the component ([`super::single_file`]): its tensors may be stored in
    /// any float dtype or a quantized form moss dequantizes, not only the folder's dtype.
    pub single_file: bool,
}

fn map_file(path: &Path) -> Result<Mmap> {
    let f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: the checkpoint is read-only input; a file changed underneath us while mapped is
    // outside what we guard against (as with every mmap-based loader).
    unsafe { Mmap::map(&f) }.with_context(|| format!("cannot map {}", path.display()))
}

impl TensorStore {
    /// Open the safetensors of `dir`: through the first `*.safetensors.index.json` if there is
    /// one, else every `*.safetensors` file in it.
    pub fn open(dir: &Path) -> Result<TensorStore> {
        let mut entries: Vec<PathBuf> =
            std::fs::read_dir(dir).with_context(|| format!("cannot read folder {}", dir.display()))?.filter_map(|e| e.ok().map(|e| e.path())).collect();
        entries.sort();
        let index = entries.iter().find(|p| p.to_string_lossy().ends_with(".safetensors.index.json")).cloned();
        let mut store = TensorStore::empty(dir, "safetensors");
        match index {
            Some(index) => {
                let v = super::config::read_json(&index)?;
                let map = v.get("weight_map").and_then(|m| m.as_object()).with_context(|| format!("{}: no `weight_map`", index.display()))?;
                let mut shards: Vec<String> = map.values().filter_map(|s| s.as_str().map(String::from)).collect();
                shards.sort();
                shards.dedup();
                for s in &shards {
                    store.add_file(&dir.join(s))?;
                }
                for (name, shard) in map {
                    let shard = shard.as_str().unwrap_or_default();
                    let info =
                        store.tensors.get(name).with_context(|| format!("{} lists `{name}` in {shard}, but that shard does not hold it", index.display()))?;
                    let actual = &store.files[info.file].0;
                    if actual.file_name().map(|f| f.to_string_lossy().into_owned()).as_deref() != Some(shard) {
                        bail!("{} lists `{name}` in {shard}, but it is in {}", index.display(), actual.display());
                    }
                }
            }
            None => {
                let files: Vec<&PathBuf> = entries.iter().filter(|p| p.extension().is_some_and(|e| e == "safetensors")).collect();
                if files.is_empty() {
                    bail!("no .safetensors file in {}", dir.display());
                }
                for f in files {
                    store.add_file(f)?;
                }
            }
        }
        Ok(store)
    }

    /// Open one safetensors file on its own.
    pub fn open_file(path: &Path) -> Result<TensorStore> {
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let mut store = TensorStore::empty(&dir, "safetensors");
        store.add_file(path)?;
        Ok(store)
    }

    pub fn empty(dir: &Path, format: &str) -> TensorStore {
        TensorStore { dir: dir.to_path_buf(), files: vec![], tensors: BTreeMap::new(), format: format.into(), single_file: false }
    }

    /// Map `path` as one more file of this store (its index in [`TensorStore::files`]).
    pub fn map(&mut self, path: &Path) -> Result<usize> {
        self.files.push((path.to_path_buf(), map_file(path)?));
        Ok(self.files.len() - 1)
    }

    fn add_file(&mut self, path: &Path) -> Result<()> {
        let map = map_file(path)?;
        let bad = |why: &str| format!("{} is not a complete safetensors file ({why})", path.display());
        if map.len() < 8 {
            bail!(bad("shorter than its header"));
        }
        let (n, meta) = safetensors::SafeTensors::read_metadata(&map[..]).map_err(|e| anyhow::anyhow!("{}", bad(&format!("{e:?}"))))?;
        let base = 8 + n;
        let file = self.files.len();
        for (name, info) in meta.tensors() {
            let (s, e) = info.data_offsets;
            if base + e > map.len() {
                bail!(bad(&format!("truncated: `{name}` ends past the end of the file")));
            }
            let dtype = Dtype::from_st(info.dtype);
            let numel: usize = info.shape.iter().product();
            if e - s != numel * dtype.size() {
                bail!(bad(&format!("`{name}` has {} bytes for shape {:?}", e - s, info.shape)));
            }
            if self.tensors.contains_key(&name) {
                bail!("`{name}` is stored twice ({} and another shard)", path.display());
            }
            self.tensors.insert(name.clone(), TensorInfo::new(dtype, info.shape.clone(), file, base + s, base + e));
        }
        self.files.push((path.to_path_buf(), map));
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    pub fn file_of(&self, info: &TensorInfo) -> &Path {
        &self.files[info.file].0
    }

    pub fn bytes(&self, info: &TensorInfo) -> &[u8] {
        &self.files[info.file].1[info.start..info.end]
    }

    /// The tensor converted to f32 (exact for bf16, f16 and f32).
    pub fn to_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let info = self.get(name).with_context(|| format!("tensor `{name}` is missing from {}", self.dir.display()))?;
        Ok((info.shape.clone(), self.values(info).with_context(|| format!("reading tensor `{name}`"))?))
    }

    /// The values of `info` as f32: stored floats exactly, ggml blocks and int8 codes dequantized
    /// ([`super::ggml`], [`super::comfy_quant`]).
    pub fn values(&self, info: &TensorInfo) -> Result<Vec<f32>> {
        let bytes = self.bytes(info);
        match info.dtype {
            Dtype::Ggml(t) => Ok(super::ggml::dequantize(t, bytes)),
            Dtype::I8 | Dtype::W4a8 { .. } => super::comfy_quant::dequantize(self, info),
            d => decode_f32(d, bytes).with_context(|| format!("moss does not read {} tensors", d.name())),
        }
    }
}

/// Little-endian stored values of `dtype` as f32 (exact for bf16, f16, f32 and float8 e4m3,
/// whose codes' values come out unscaled); `None` for a dtype moss does not read.
pub fn decode_f32(dtype: Dtype, b: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::BF16 => b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Dtype::F16 => b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Dtype::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::F64 => b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32).collect(),
        Dtype::I64 => b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f32).collect(),
        Dtype::F8E4M3 => b.iter().map(|&c| crate::fp8::e4m3_to_f32(c)).collect(),
        Dtype::I8 => b.iter().map(|&c| c as i8 as f32).collect(),
        Dtype::Ggml(t) => super::ggml::dequantize(t, b),
        Dtype::F8E5M2 | Dtype::W4a8 { .. } | Dtype::Other => return None,
    })
}

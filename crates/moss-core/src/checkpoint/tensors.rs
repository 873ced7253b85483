//! Memory-mapped safetensors: one file, or shards listed by a `*.safetensors.index.json`.

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
            _ => Dtype::Other,
        }
    }
    pub fn size(self) -> usize {
        match self {
            Dtype::BF16 | Dtype::F16 => 2,
            Dtype::F32 => 4,
            Dtype::F64 | Dtype::I64 => 8,
            Dtype::F8E4M3 | Dtype::F8E5M2 | Dtype::Other => 1,
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
            Dtype::Other => "other",
        }
    }
}

/// The index of the first NaN or infinity among `bytes` read as `dtype` (little-endian): the
/// exponent bits all set. Integer dtypes hold none.
pub fn first_non_finite(dtype: Dtype, bytes: &[u8]) -> Option<usize> {
    match dtype {
        Dtype::BF16 => bytes.chunks_exact(2).position(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7f80 == 0x7f80),
        Dtype::F16 => bytes.chunks_exact(2).position(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7c00 == 0x7c00),
        Dtype::F32 => bytes
            .chunks_exact(4)
            .position(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) & 0x7f80_0000 == 0x7f80_0000),
        Dtype::F64 => bytes.chunks_exact(8).position(|b| {
            u64::from_le_bytes(b.try_into().unwrap()) & 0x7ff0_0000_0000_0000 == 0x7ff0_0000_0000_0000
        }),
        // e4m3fn has no infinities; its NaN is S.1111.111. e5m2 is IEEE-like: exponent all ones.
        Dtype::F8E4M3 => bytes.iter().position(|b| b & 0x7f == 0x7f),
        Dtype::F8E5M2 => bytes.iter().position(|b| b & 0x7c == 0x7c),
        Dtype::I64 | Dtype::Other => None,
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
}

impl TensorInfo {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// All tensors of one component folder, memory-mapped.
pub struct TensorStore {
    pub dir: PathBuf,
    pub files: Vec<(PathBuf, Mmap)>,
    pub tensors: BTreeMap<String, TensorInfo>,
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
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read folder {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        let index = entries
            .iter()
            .find(|p| p.to_string_lossy().ends_with(".safetensors.index.json"))
            .cloned();
        let mut store =
            TensorStore { dir: dir.to_path_buf(), files: vec![], tensors: BTreeMap::new() };
        match index {
            Some(index) => {
                let v = super::config::read_json(&index)?;
                let map = v
                    .get("weight_map")
                    .and_then(|m| m.as_object())
                    .with_context(|| format!("{}: no `weight_map`", index.display()))?;
                let mut shards: Vec<String> =
                    map.values().filter_map(|s| s.as_str().map(String::from)).collect();
                shards.sort();
                shards.dedup();
                for s in &shards {
                    store.add_file(&dir.join(s))?;
                }
                for (name, shard) in map {
                    let shard = shard.as_str().unwrap_or_default();
                    let info = store.tensors.get(name).with_context(|| {
                        format!(
                            "{} lists `{name}` in {shard}, but that shard does not hold it",
                            index.display()
                        )
                    })?;
                    let actual = &store.files[info.file].0;
                    if actual.file_name().map(|f| f.to_string_lossy().into_owned()).as_deref()
                        != Some(shard)
                    {
                        bail!(
                            "{} lists `{name}` in {shard}, but it is in {}",
                            index.display(),
                            actual.display()
                        );
                    }
                }
            }
            None => {
                let files: Vec<&PathBuf> = entries
                    .iter()
                    .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
                    .collect();
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
        let mut store = TensorStore { dir, files: vec![], tensors: BTreeMap::new() };
        store.add_file(path)?;
        Ok(store)
    }

    fn add_file(&mut self, path: &Path) -> Result<()> {
        let map = map_file(path)?;
        let bad = |why: &str| format!("{} is not a complete safetensors file ({why})", path.display());
        if map.len() < 8 {
            bail!(bad("shorter than its header"));
        }
        let (n, meta) = safetensors::SafeTensors::read_metadata(&map[..])
            .map_err(|e| anyhow::anyhow!("{}", bad(&format!("{e:?}"))))?;
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
            self.tensors.insert(
                name.clone(),
                TensorInfo { dtype, shape: info.shape.clone(), file, start: base + s, end: base + e },
            );
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
        let info = self.get(name).with_context(|| {
            format!("tensor `{name}` is missing from {}", self.dir.display())
        })?;
        let data = decode_f32(info.dtype, self.bytes(info)).with_context(|| format!("tensor `{name}` has an unsupported dtype"))?;
        Ok((info.shape.clone(), data))
    }
}

/// Little-endian stored values of `dtype` as f32 (exact for bf16, f16, f32 and float8 e4m3,
/// whose codes' values come out unscaled); `None` for a dtype moss does not read.
pub fn decode_f32(dtype: Dtype, b: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::BF16 => b
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F16 => b
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F64 => b
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        Dtype::I64 => b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        Dtype::F8E4M3 => b.iter().map(|&c| crate::fp8::e4m3_to_f32(c)).collect(),
        Dtype::F8E5M2 | Dtype::Other => return None,
    })
}

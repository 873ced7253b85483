//! Content hashes pictures record, as AUTOMATIC1111 computes them, so that sites and tools that
//! link resources by hash (civitai's "AutoV2"/"AutoV3") find them:
//!
//! - `Model hash`: the first 10 hex digits of the sha256 of the transformer's weights file (A1111
//!   hashes a checkpoint's whole file). A transformer stored as several shards has no single file:
//!   its hash is the sha256 of the shards' sha256 digests (lowercase hex, each followed by a
//!   newline, in file-name order), which
//!   `sha256sum diffusion_pytorch_model-*.safetensors | cut -c1-64 | sha256sum | cut -c1-10`
//!   prints.
//! - a LoRA's hash: the first 12 hex digits of the sha256 of its safetensors file after the
//!   header (kohya's "addnet" hash, which A1111 writes in `Lora hashes`).
//!
//! A file's sha256 is read from its name where the Hugging Face cache gives it (LFS blobs are
//! named by their sha256), else computed once and remembered in `$XDG_CACHE_HOME/moss/sha256.json`
//! (`~/.cache/moss/sha256.json`) by canonical path, size and modification time.

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// Lowercase hex of a digest.
fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 of everything `r` yields.
fn sha256_of(mut r: impl Read) -> std::io::Result<String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 8 << 20];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            return Ok(hex(&h.finalize()));
        }
        h.update(&buf[..n]);
    }
}

/// The LoRA hash A1111 records (kohya's addnet hash): sha256 of a safetensors file's bytes after
/// its header, 12 hex digits. `bytes` is the whole file.
pub fn lora_hash(bytes: &[u8]) -> String {
    let n = bytes.get(..8).map_or(0, |h| u64::from_le_bytes(h.try_into().expect("8 bytes")));
    let start = (n as usize).saturating_add(8).min(bytes.len());
    hex(&Sha256::digest(&bytes[start..]))[..12].to_string()
}

/// [`lora_hash`] of the file at `path`.
pub fn lora_file_hash(path: &Path) -> Result<String> {
    let f = std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    // SAFETY: read-only input, as every adapter is mapped.
    let map = unsafe { memmap2::Mmap::map(&f) }.with_context(|| format!("cannot read {}", path.display()))?;
    Ok(lora_hash(&map))
}

fn cache_file() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("moss/sha256.json"))
}

/// The remembered digests: canonical path -> (size, mtime in ns, sha256).
type Remembered = BTreeMap<String, (u64, i128, String)>;

fn read_cache(at: &Path) -> Remembered {
    std::fs::read(at).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
}

/// Add one digest to the cache (best effort: a cache that cannot be written is not an error).
fn remember(key: String, entry: (u64, i128, String)) {
    let Some(at) = cache_file() else { return };
    let mut all = read_cache(&at);
    all.insert(key, entry);
    let Some(dir) = at.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = dir.join(format!(".sha256.json.{}", std::process::id()));
    if std::fs::write(&tmp, serde_json::to_vec(&all).unwrap_or_default()).is_ok() {
        let _ = std::fs::rename(&tmp, &at);
    }
    let _ = std::fs::remove_file(&tmp);
}

/// The sha256 (64 hex digits) of the file at `path`: from a Hugging Face blob's name, the cache,
/// or read in full.
pub fn file_sha256(path: &Path) -> Result<String> {
    let real = std::fs::canonicalize(path).with_context(|| format!("cannot read {}", path.display()))?;
    let name = real.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let in_blobs = real.parent().and_then(|p| p.file_name()).is_some_and(|p| p == "blobs");
    if in_blobs && name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(name.to_ascii_lowercase());
    }
    let m = std::fs::metadata(&real).with_context(|| format!("cannot read {}", path.display()))?;
    let stamp = (m.size(), m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128);
    let key = real.display().to_string();
    if let Some((size, mtime, digest)) = cache_file().map(|c| read_cache(&c)).and_then(|mut c| c.remove(&key)) {
        if (size, mtime) == stamp {
            return Ok(digest);
        }
    }
    let f = std::fs::File::open(&real).with_context(|| format!("cannot read {}", path.display()))?;
    let digest = sha256_of(f).with_context(|| format!("cannot read {}", path.display()))?;
    remember(key, (stamp.0, stamp.1, digest.clone()));
    Ok(digest)
}

/// The `Model hash` of a transformer stored in `files` (see the module docs), 10 hex digits.
pub fn model_hash(files: &[PathBuf]) -> Result<String> {
    let mut files: Vec<&PathBuf> = files.iter().collect();
    files.sort_by_key(|f| f.file_name().map(|n| n.to_os_string()));
    let full = match files.as_slice() {
        [one] => file_sha256(one)?,
        many => {
            let mut list = String::new();
            for f in many {
                list.push_str(&file_sha256(f)?);
                list.push('\n');
            }
            hex(&Sha256::digest(list.as_bytes()))
        }
    };
    Ok(full[..10].to_string())
}

/// A checkpoint's `Model hash`, computed at most once, on a thread of its own once
/// [`ModelHash::start`]ed (it may read every byte of the transformer: seconds for the full model,
/// beside the run's own work).
#[derive(Clone, Default)]
pub struct ModelHash(Arc<HashState>);

#[derive(Default)]
struct HashState {
    value: OnceLock<Option<String>>,
    thread: Mutex<Option<std::thread::JoinHandle<Option<String>>>>,
}

impl ModelHash {
    /// Start hashing `files` on a thread of its own (no-op once started or known).
    pub fn start(&self, files: Vec<PathBuf>) {
        let mut t = self.0.thread.lock().unwrap_or_else(|e| e.into_inner());
        if t.is_none() && self.0.value.get().is_none() {
            *t = Some(std::thread::spawn(move || model_hash(&files).ok()));
        }
    }

    /// Whether [`ModelHash::start`] ran (or the value is known).
    pub fn started(&self) -> bool {
        self.0.value.get().is_some() || self.0.thread.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// The hash (None when it could not be read, or was never started).
    pub fn get(&self) -> Option<&str> {
        self.0
            .value
            .get_or_init(|| {
                let t = self.0.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
                t.and_then(|t| t.join().ok()).flatten()
            })
            .as_deref()
    }
}

impl std::fmt::Debug for ModelHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModelHash({:?})", self.0.value.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// sha256("abc") from FIPS 180-2, appendix B.1.
    #[test]
    fn sha256_and_the_lora_hash_skip_the_header() {
        assert_eq!(sha256_of(&b"abc"[..]).unwrap(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        let mut file = 5u64.to_le_bytes().to_vec();
        file.extend(b"{...}abc");
        assert_eq!(lora_hash(&file), "ba7816bf8f01");
    }

    #[test]
    fn sharded_hash_is_over_the_digest_lines() {
        let d = std::env::temp_dir().join(format!("moss-hash-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::env::set_var("XDG_CACHE_HOME", d.join("cache"));
        let (a, b) = (d.join("m-00002.safetensors"), d.join("m-00001.safetensors"));
        std::fs::write(&a, b"abc").unwrap();
        std::fs::write(&b, b"").unwrap();
        // sha256("") then sha256("abc"), one a line, in file-name order.
        let lines = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n\
                     ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n";
        let want = hex(&Sha256::digest(lines.as_bytes()))[..10].to_string();
        assert_eq!(model_hash(&[a.clone(), b.clone()]).unwrap(), want);
        assert_eq!(model_hash(std::slice::from_ref(&a)).unwrap(), "ba7816bf8f");
        // Remembered by size and time: a changed file is hashed again.
        std::fs::write(&a, b"abcd").unwrap();
        assert_ne!(model_hash(&[a]).unwrap(), "ba7816bf8f");
        std::fs::remove_dir_all(&d).unwrap();
    }
}

//! Reading an input file with a bound: every kind of input has a sane largest size, and a file
//! beyond it is refused early, naming the file and the limit. A regular file is judged by its
//! length before a byte is read; a FIFO or a character device that never ends stops at the limit.

use anyhow::{bail, Context, Result};
use std::io::Read;
use std::path::Path;

const MIB: u64 = 1 << 20;

/// A config (`config.json`, `model_index.json`, `scheduler_config.json`, `adapter_config.json`)
/// or a sharded checkpoint's index (`*.safetensors.index.json`): kilobytes, a few hundred for an
/// index of every tensor.
pub const MAX_CONFIG: u64 = 16 * MIB;
/// `tokenizer.json` (the real one is 11 MB).
pub const MAX_TOKENIZER: u64 = 64 * MIB;
/// A `--prompt-file` (a prompt of 4096 tokens is some 20 KB).
pub const MAX_PROMPT_FILE: u64 = 4 * MIB;
/// A `--prompts` list (one line a picture: a million short lines).
pub const MAX_PROMPT_LIST: u64 = 256 * MIB;
/// An `--embeds` file: two prompts of at most 4096 tokens' hidden states (f32, 4096 wide: 128 MiB)
/// and their ids.
pub const MAX_EMBEDS: u64 = 512 * MIB;
/// A picture file read back (`moss info`, `generate --from`, pictures given as input).
pub const MAX_PICTURE: u64 = 256 * MIB;
/// A Hugging Face cache's `refs/main` (a 40-digit commit hash).
pub const MAX_REF: u64 = 4096;

/// A size for messages: `16 MiB`, `4096 bytes`.
pub fn size_text(n: u64) -> String {
    if n >= MIB && n.is_multiple_of(MIB) {
        format!("{} MiB", n / MIB)
    } else {
        format!("{n} bytes")
    }
}

/// The bytes of `path`, `what` it is (`the prompt file`, `config`), at most `limit` of them.
/// Errors name the file: one that cannot be opened, one longer than `limit`.
pub fn read_bounded(path: &Path, limit: u64, what: &str) -> Result<Vec<u8>> {
    let f = std::fs::File::open(path).with_context(|| format!("cannot read {what} {}", path.display()))?;
    let len = f.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
    if let Some(len) = len.filter(|&l| l > limit) {
        bail!("{what} {} is {} bytes, above the {} moss reads for it", path.display(), len, size_text(limit));
    }
    read_to_limit(f, len, limit).map_err(|e| match e {
        Bounded::TooLong => anyhow::anyhow!("{what} {} is longer than the {} moss reads for it", path.display(), size_text(limit)),
        Bounded::Io(e) => anyhow::anyhow!("cannot read {what} {}: {e}", path.display()),
    })
}

/// [`read_bounded`] as text (UTF-8, else an error naming the first bad byte's offset).
pub fn read_text_bounded(path: &Path, limit: u64, what: &str) -> Result<String> {
    let bytes = read_bounded(path, limit, what)?;
    String::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("{what} {} is not valid UTF-8 (first bad byte at offset {})", path.display(), e.utf8_error().valid_up_to()))
}

/// Standard input, at most `limit` bytes (`what` names it in errors).
pub fn read_stdin_bounded(limit: u64, what: &str) -> Result<Vec<u8>> {
    read_to_limit(std::io::stdin().lock(), None, limit).map_err(|e| match e {
        Bounded::TooLong => anyhow::anyhow!("{what} on stdin: more than the {} moss reads for it", size_text(limit)),
        Bounded::Io(e) => anyhow::anyhow!("cannot read {what} from stdin: {e}"),
    })
}

enum Bounded {
    TooLong,
    Io(std::io::Error),
}

/// Up to `limit` bytes of `r`; one more is an error. `hint`: the length, when known. The buffer
/// grows by doubling but never past `limit + 1` bytes, so memory stays within the limit.
fn read_to_limit(mut r: impl Read, hint: Option<u64>, limit: u64) -> Result<Vec<u8>, Bounded> {
    let cap = usize::try_from(limit.saturating_add(1)).unwrap_or(usize::MAX);
    let mut out = Vec::with_capacity(hint.map_or(0, |h| (h as usize).saturating_add(1)).min(cap));
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        let n = match r.read(&mut chunk) {
            Ok(0) => return Ok(out),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Bounded::Io(e)),
        };
        if out.len() + n > cap - 1 {
            return Err(Bounded::TooLong);
        }
        if out.capacity() - out.len() < n {
            let want = (out.capacity() * 2).max(out.len() + n).min(cap);
            out.reserve_exact(want - out.len());
        }
        out.extend_from_slice(&chunk[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_beyond_the_limit_are_refused_by_name() {
        let d = std::env::temp_dir().join(format!("moss-bounded-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("config.json");
        std::fs::write(&f, b"0123456789").unwrap();
        assert_eq!(read_bounded(&f, 10, "config").unwrap(), b"0123456789");
        let e = read_bounded(&f, 9, "config").unwrap_err().to_string();
        assert!(e.contains("config.json is 10 bytes, above the 9 bytes moss reads"), "{e}");
        let e = read_bounded(&d.join("none"), 9, "config").unwrap_err().to_string();
        assert!(e.starts_with("cannot read config ") && e.contains("none"), "{e}");
        // A character device that never ends stops at the limit.
        let e = read_bounded(Path::new("/dev/zero"), 1 << 20, "the prompt file").unwrap_err().to_string();
        assert!(e.contains("/dev/zero is longer than the 1 MiB moss reads"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}

//! Live previews of the denoising loop: the decoded x0 prediction of a step (`x − σ·v`, what
//! the picture would be if the loop ended there). `generate --preview PATH` replaces a file
//! every N steps ([`FilePreview`]); the server sends OpenAI's partial images
//! ([`partial_image_steps`]).

use super::Progress;
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// `--preview-every` when not given.
pub const DEFAULT_PREVIEW_EVERY: usize = 5;

/// `--preview PATH`: a file (not stdout), in a picture format, written every `every >= 1` steps.
pub fn check_preview(path: &Path, every: usize) -> Result<()> {
    if crate::output::is_stdout(path) {
        bail!("--preview needs a file: `-` (stdout) takes no series of pictures");
    }
    if every == 0 {
        bail!("--preview-every must be at least 1");
    }
    crate::output::check(path)?;
    crate::picture::check(path, None).map(|_| ())
}

/// The steps (1-based, before the last) after which `count` partial images of a `total`-step
/// loop are sent: spread evenly, `⌊j·total/(count + 1)⌋` for `j = 1..=count`. A loop of fewer
/// steps than `count + 1` sends fewer (OpenAI: the final image may come before all of them).
pub fn partial_image_steps(total: usize, count: usize) -> Vec<usize> {
    let mut s: Vec<usize> = (1..=count).map(|j| j * total / (count + 1)).filter(|&d| d >= 1 && d < total).collect();
    s.dedup();
    s
}

/// The picture file of a preview: `rgb` encoded in `path`'s format, saying which step it shows.
pub fn preview_bytes(path: &Path, rgb: &[u8], width: u32, height: u32, done: usize, total: usize) -> Result<Vec<u8>> {
    let mut m = crate::png::Metadata::default();
    m.push("moss:preview", format!("step {done} of {total}"));
    m.push("Software", crate::metadata::version());
    Ok(crate::picture::encode(path, None, rgb, width, height, &m)?.bytes)
}

/// [`Progress`] that also writes a preview to `path` (through a temporary file and a rename, so
/// a reader never sees half a picture) after every `every`-th step.
pub struct FilePreview<'a> {
    pub inner: &'a mut dyn Progress,
    pub path: PathBuf,
    pub every: usize,
}

impl Progress for FilePreview<'_> {
    fn stage(&mut self, name: &str) {
        self.inner.stage(name)
    }
    fn step(&mut self, done: usize, total: usize) {
        self.inner.step(done, total)
    }
    fn warn(&mut self, msg: &str) {
        self.inner.warn(msg)
    }
    fn plan(&mut self, line: &str) {
        self.inner.plan(line)
    }
    fn cancelled(&self) -> bool {
        self.inner.cancelled()
    }
    fn preview_wanted(&self, done: usize, _total: usize) -> bool {
        done.is_multiple_of(self.every)
    }
    fn preview(&mut self, done: usize, total: usize, rgb: &[u8], width: u32, height: u32) -> Result<()> {
        let bytes = preview_bytes(&self.path, rgb, width, height, done, total)?;
        crate::output::write(&self.path, &bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_images_spread_over_the_steps() {
        assert_eq!(partial_image_steps(50, 3), [12, 25, 37]);
        assert_eq!(partial_image_steps(50, 1), [25]);
        assert_eq!(partial_image_steps(50, 0), Vec::<usize>::new());
        assert_eq!(partial_image_steps(4, 3), [1, 2, 3]);
        assert_eq!(partial_image_steps(3, 3), [1, 2], "fewer steps than asked");
        assert_eq!(partial_image_steps(1, 2), Vec::<usize>::new());
    }
}

//! List items that start from a picture (`init_image`, `mask`, `strength`, `mask_blur`): the
//! files are named relative to the list's folder under the rules of outputs (no `..` out of it;
//! an absolute path with `--allow-absolute-out`), read when the batch is planned (each file once,
//! each size once), and recorded in the item's spec as `generate --init-image` records them, so an
//! item renders the bytes `generate` renders for the same settings.

use super::names::fold_dots;
use super::*;
use crate::pipeline::{Input, PicturesIn, Prepared};
use anyhow::{bail, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A list item's files: the init image and its mask.
type Files = (PathBuf, Option<PathBuf>);

/// A preparation's key: the files, the size, the mask blur and the strength's bits.
type PreparedKey = (PathBuf, Option<PathBuf>, u32, u32, u32, u64);

/// The pictures read so far, and their preparations at the sizes asked.
#[derive(Default)]
pub(super) struct Cache {
    read: HashMap<Files, Arc<PicturesIn>>,
    prepared: HashMap<PreparedKey, Arc<Prepared>>,
}

/// A list's path field as a file: relative to the list's folder `dir`, inside it.
fn input_path(dir: &Path, p: &str, field: &str, allow_absolute: bool) -> Result<PathBuf> {
    let path = Path::new(p);
    if path.is_absolute() {
        if !allow_absolute {
            bail!("`{field}` {p} is an absolute path (allowed with --allow-absolute-out)");
        }
        return Ok(path.to_path_buf());
    }
    match fold_dots(path) {
        Some(rel) => Ok(dir.join(rel)),
        None => bail!("`{field}` {p} leaves the list's folder"),
    }
}

impl Cache {
    /// The job's pictures read and prepared at its size, recorded in its spec (its size the
    /// picture's when its line gives none); nothing for an item from text, or one that came
    /// prepared (`generate --count` with `--init-image`).
    pub(super) fn attach(&mut self, j: &mut Job, list_dir: &Path, o: &BatchOptions) -> Result<()> {
        let Some(f) = j.item.pictures.clone() else { return Ok(()) };
        let image = input_path(list_dir, &f.image, "init_image", o.allow_absolute_out)?;
        let mask = f.mask.as_deref().map(|m| input_path(list_dir, m, "mask", o.allow_absolute_out)).transpose()?;
        let mut ins = vec![("the init image", image.as_path())];
        ins.extend(mask.as_deref().map(|m| ("the mask", m)));
        crate::output::check_distinct(&[("the output", &j.path)], &ins)?;
        let key = (image.clone(), mask.clone());
        let pics = match self.read.get(&key) {
            Some(p) => p.clone(),
            None => {
                let m = mask.as_deref().map(|m| Input::read(m, "mask")).transpose()?;
                let p = Arc::new(PicturesIn::new(Input::read(&image, "init_image")?, m)?);
                self.read.insert(key.clone(), p.clone());
                p
            }
        };
        let spec = &mut j.item.spec;
        let strength = f.strength.unwrap_or(o.strength);
        let blur = f.mask_blur.unwrap_or(o.mask_blur);
        spec.init_image = Some(pics.spec(strength, blur, None));
        if !f.sized {
            (spec.width, spec.height) = pics.natural_size(None)?;
        }
        spec.check().map_err(anyhow::Error::msg)?;
        let at = (key.0, key.1, spec.width, spec.height, blur, strength.to_bits());
        let prepared = match self.prepared.get(&at) {
            Some(p) => p.clone(),
            None => {
                let p = Arc::new(pics.prepare(spec)?);
                self.prepared.insert(at, p.clone());
                p
            }
        };
        j.item.init = Some(prepared);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_the_rules_of_outputs() {
        let d = Path::new("lists");
        assert_eq!(input_path(d, "a/b.png", "init_image", false).unwrap(), Path::new("lists/a/b.png"));
        assert_eq!(input_path(d, "a/../b.png", "init_image", false).unwrap(), Path::new("lists/b.png"));
        assert!(input_path(d, "../b.png", "mask", false).unwrap_err().to_string().contains("`mask` ../b.png leaves the list's folder"));
        assert!(input_path(d, "/etc/x.png", "init_image", false).unwrap_err().to_string().contains("--allow-absolute-out"));
        assert_eq!(input_path(d, "/etc/x.png", "init_image", true).unwrap(), Path::new("/etc/x.png"));
    }
}

//! Where outputs go, and the promise that a run never writes a wrong file.
//!
//! - A new path or an existing regular file is written through a temporary sibling
//!   (`.NAME.PID.partial`) and a rename, so a file that exists is complete.
//! - A symbolic link is followed: the file it points to is replaced (the link stays).
//! - `-` is standard output; an existing FIFO or character device (`/dev/null`, a terminal) is
//!   written straight through, never replaced.
//! - Anything else (a folder, a block device, a socket, a path ending in `/`) is refused, and every
//!   check runs before any heavy work ([`check`]), naming the path.
//! - An output may not be one of the run's inputs ([`check_distinct`]).
//! - Without leave to replace (`moss generate` without `--force`), an existing regular file is
//!   refused before any work ([`refuse_existing`]) and never replaced at the end ([`write_as`]:
//!   the finished file is linked into place, which fails if a file appeared meanwhile).

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The longest file name the usual file systems take (NAME_MAX).
const NAME_MAX: usize = 255;

/// Where an output path's bytes go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Standard output (`-`).
    Stdout,
    /// An existing FIFO or character device, opened and written in place.
    Stream(PathBuf),
    /// A regular file (new or replaced by rename), symbolic links resolved.
    File(PathBuf),
}

/// True for the path `-`.
pub fn is_stdout(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// Follow symbolic links (also dangling ones, whose target may not exist yet), at most 40 deep.
fn follow_links(path: &Path) -> Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = std::fs::read_link(&p).with_context(|| format!("cannot read link {}", p.display()))?;
                p = match p.parent() {
                    Some(dir) if to.is_relative() => dir.join(to),
                    _ => to,
                };
            }
            _ => return Ok(p),
        }
    }
    bail!("{}: too many levels of symbolic links", path.display())
}

/// Resolve `path` to where its bytes will go, refusing what may not be written.
pub fn target(path: &Path) -> Result<Target> {
    if is_stdout(path) {
        return Ok(Target::Stdout);
    }
    if path.as_os_str().is_empty() {
        bail!("output path is empty");
    }
    let s = path.as_os_str().as_encoded_bytes();
    if s.ends_with(b"/") || path.file_name().is_none() {
        bail!("output path {} names a folder, not a file", path.display());
    }
    let real = follow_links(path)?;
    match std::fs::metadata(&real) {
        Ok(m) => {
            let t = m.file_type();
            if t.is_file() {
                Ok(Target::File(real))
            } else if t.is_dir() {
                bail!("output path {} is a folder", path.display())
            } else if t.is_fifo() || t.is_char_device() {
                Ok(Target::Stream(real))
            } else {
                bail!("output path {} is not a regular file, a FIFO or a character device", path.display())
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Target::File(real)),
        Err(e) => Err(e).with_context(|| format!("cannot inspect output path {}", path.display())),
    }
}

/// The temporary sibling a regular-file output is written to before the rename.
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.partial", std::process::id()))
}

fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Check before any heavy work that `path` can be written as [`write`] will write it: its folder
/// exists and takes the temporary sibling (which also proves the name is not too long), or the
/// FIFO/device opens for writing. Stale temporaries of killed runs are removed.
pub fn check(path: &Path) -> Result<()> {
    match target(path)? {
        Target::Stdout | Target::Stream(_) => Ok(()),
        Target::File(real) => {
            let dir = folder_of(&real);
            if !dir.is_dir() {
                bail!("cannot write {}: folder {} does not exist", path.display(), dir.display());
            }
            let tmp = temp_path(&real);
            let tmp_name = tmp.file_name().map_or(0, |n| n.len());
            if tmp_name > NAME_MAX {
                bail!(
                    "cannot write {}: the file name is too long ({} bytes; at most {} leaves room for the temporary name)",
                    path.display(),
                    real.file_name().map_or(0, |n| n.len()),
                    NAME_MAX - (tmp_name - real.file_name().map_or(0, |n| n.len()))
                );
            }
            remove_stale_temporaries(&real);
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .with_context(|| format!("cannot write {}: folder {} is not writable", path.display(), dir.display()))?;
            let _ = std::fs::remove_file(&tmp);
            Ok(())
        }
    }
}

/// Remove `.NAME.PID.partial` siblings of `path` left by runs that are no longer alive.
pub fn remove_stale_temporaries(path: &Path) {
    let (Some(name), dir) = (path.file_name().and_then(|n| n.to_str()), folder_of(path)) else {
        return;
    };
    let prefix = format!(".{name}.");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in entries.flatten() {
        let f = e.file_name();
        let Some(f) = f.to_str() else { continue };
        let Some(pid) = f.strip_prefix(&prefix).and_then(|r| r.strip_suffix(".partial")) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Refuse an output that is an existing regular file (through links): FIFOs, devices, `-` and
/// new paths pass.
pub fn refuse_existing(path: &Path) -> Result<()> {
    if let Target::File(real) = target(path)? {
        if real.exists() {
            bail!("{} exists; moss does not replace it: pass --force (-y) to replace it, or give another -o", path.display());
        }
    }
    Ok(())
}

/// Write `bytes` to `path` as [`Target`] says: through a temporary file and a rename for regular
/// files, straight through for `-`, FIFOs and devices. Errors name the path.
pub fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    write_as(path, bytes, true)
}

/// [`write`]; with `replace` false an existing regular file is left as it is and the write fails
/// (the new file is hard-linked into place, which fails when one exists; on a file system
/// without hard links, the existence check and the rename follow each other).
pub fn write_as(path: &Path, bytes: &[u8], replace: bool) -> Result<()> {
    match target(path)? {
        Target::Stdout => {
            let mut out = std::io::stdout().lock();
            out.write_all(bytes).and_then(|_| out.flush()).context("cannot write the output to stdout")
        }
        Target::Stream(real) => {
            let mut f = std::fs::OpenOptions::new().write(true).open(&real).with_context(|| format!("cannot open {}", path.display()))?;
            f.write_all(bytes).with_context(|| format!("cannot write {}", path.display()))
        }
        Target::File(real) => {
            remove_stale_temporaries(&real);
            let tmp = temp_path(&real);
            let res = (|| -> Result<()> {
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&tmp)
                    .with_context(|| format!("cannot write {}: cannot create {}", path.display(), tmp.display()))?;
                f.write_all(bytes).with_context(|| format!("cannot write {}", path.display()))?;
                f.sync_all().with_context(|| format!("cannot write {}", path.display()))?;
                if !replace {
                    match std::fs::hard_link(&tmp, &real) {
                        Ok(()) => return Ok(()),
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                            bail!("{} appeared while moss was working; it was not replaced (--force replaces it)", path.display())
                        }
                        Err(_) if real.exists() => bail!("{} exists; it was not replaced (--force replaces it)", path.display()),
                        Err(_) => {}
                    }
                }
                std::fs::rename(&tmp, &real).with_context(|| format!("cannot write {}: cannot rename {} onto it", path.display(), tmp.display()))
            })();
            // The temporary is gone after a rename; after a link (or a failure) it is removed.
            let _ = std::fs::remove_file(&tmp);
            res
        }
    }
}

/// The identity of a file for comparing paths: (device, inode) when it exists, else the
/// canonical folder joined with the file name.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Identity {
    Inode(u64, u64),
    Path(PathBuf),
}

fn identity(path: &Path) -> Option<Identity> {
    let real = follow_links(path).ok()?;
    if let Ok(m) = std::fs::metadata(&real) {
        return Some(Identity::Inode(m.dev(), m.ino()));
    }
    let dir = std::fs::canonicalize(folder_of(&real)).ok()?;
    Some(Identity::Path(dir.join(real.file_name()?)))
}

/// The most folder entries [`files_below`] looks at.
pub const MAX_ENTRIES: usize = 10_000;

/// Every regular file below `root` (a checkpoint folder), for [`check_distinct`]. Links are
/// followed (a Hugging Face snapshot is links into its blobs), but each folder is entered once,
/// by its identity, so links that loop (`a -> .`) end; and the walk stops after [`MAX_ENTRIES`]
/// entries of any kind, so a huge folder cannot stall the check.
pub fn files_below(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![root.to_path_buf()];
    let mut entries_seen = 0;
    while let Some(d) = stack.pop() {
        match std::fs::metadata(&d) {
            Ok(m) if seen.insert((m.dev(), m.ino())) => {}
            _ => continue,
        }
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            entries_seen += 1;
            if entries_seen > MAX_ENTRIES {
                return out;
            }
            let p = e.path();
            match std::fs::metadata(&p) {
                Ok(m) if m.is_dir() => stack.push(p),
                Ok(m) if m.is_file() => out.push(p),
                _ => {}
            }
        }
    }
    out
}

/// The run's inputs, identified once (a batch checks every picture's path against them).
pub struct Inputs(Vec<(String, PathBuf, Identity)>);

impl Inputs {
    pub fn new(inputs: &[(&str, &Path)]) -> Inputs {
        Inputs(inputs.iter().filter_map(|(w, p)| Some((w.to_string(), p.to_path_buf(), identity(p)?))).collect())
    }
}

/// Refuse before any work when an output is one of the run's inputs or two outputs are the same
/// file. `outputs` and `inputs` are `(what, path)`, e.g. `("--out", ..)`, `("the prompts list", ..)`.
/// `-`, FIFOs and devices never clash (they are written through, nothing is replaced).
pub fn check_distinct(outputs: &[(&str, &Path)], inputs: &[(&str, &Path)]) -> Result<()> {
    check_against(outputs, &Inputs::new(inputs))
}

/// [`check_distinct`] against inputs identified beforehand.
pub fn check_against(outputs: &[(&str, &Path)], inputs: &Inputs) -> Result<()> {
    let ids: Vec<_> = outputs.iter().filter(|(_, p)| matches!(target(p), Ok(Target::File(_)))).map(|(w, p)| (*w, *p, identity(p))).collect();
    for (i, (w, p, id)) in ids.iter().enumerate() {
        let Some(id) = id else { continue };
        for (w2, p2, id2) in &ids[..i] {
            if id2.as_ref() == Some(id) {
                bail!("{w} {} and {w2} {} are the same file", p.display(), p2.display());
            }
        }
        for (what, q, qid) in &inputs.0 {
            if qid == id {
                bail!("{w} {} would overwrite {what} {}", p.display(), q.display());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("moss-output-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn targets() {
        let d = tmpdir("targets");
        assert_eq!(target(Path::new("-")).unwrap(), Target::Stdout);
        assert!(target(&d).unwrap_err().to_string().contains("is a folder"));
        assert!(target(Path::new("newdir/")).unwrap_err().to_string().contains("names a folder"));
        assert_eq!(target(Path::new("/dev/null")).unwrap(), Target::Stream("/dev/null".into()));
        let f = d.join("a.png");
        std::fs::write(&f, b"x").unwrap();
        let l = d.join("link.png");
        std::os::unix::fs::symlink("a.png", &l).unwrap();
        assert_eq!(target(&l).unwrap(), Target::File(d.join("a.png")));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn write_follows_links_and_cleans_stale_temporaries() {
        let d = tmpdir("write");
        let f = d.join("a.png");
        std::fs::write(&f, b"old").unwrap();
        let l = d.join("link.png");
        std::os::unix::fs::symlink(&f, &l).unwrap();
        // A temporary of a dead process (pid 0 never names a live user process here).
        let stale = d.join(".a.png.999999999.partial");
        std::fs::write(&stale, b"half").unwrap();
        write(&l, b"new").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"new");
        assert!(std::fs::symlink_metadata(&l).unwrap().file_type().is_symlink());
        assert!(!stale.exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn long_names_and_missing_folders_fail_the_check() {
        let d = tmpdir("check");
        let long = d.join(format!("{}.png", "x".repeat(240)));
        assert!(check(&long).unwrap_err().to_string().contains("too long"));
        assert!(check(&d.join("nope/a.png")).unwrap_err().to_string().contains("does not exist"));
        assert!(check(&d.join("fine.png")).is_ok());
        assert!(!d.join("fine.png").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn outputs_may_not_be_inputs() {
        let d = tmpdir("distinct");
        let input = d.join("prompt.txt");
        std::fs::write(&input, b"a cat").unwrap();
        let spelled = d.join("sub/../prompt.txt");
        std::fs::create_dir_all(d.join("sub")).unwrap();
        let e = check_distinct(&[("--out", &spelled)], &[("the prompt file", &input)]).unwrap_err();
        assert!(e.to_string().contains("would overwrite the prompt file"), "{e}");
        let a = d.join("x.png");
        let b = d.join("sub/../x.png");
        assert!(check_distinct(&[("--out", &a), ("--save-latents", &b)], &[]).is_err());
        assert!(check_distinct(&[("--out", &a), ("--save-latents", &d.join("z.bin"))], &[("p", &input)]).is_ok());
        assert!(check_distinct(&[("--out", Path::new("-")), ("--save-latents", Path::new("-"))], &[]).is_ok());
        std::fs::remove_dir_all(&d).unwrap();
    }
}

//! `--from PICTURE` and `moss info`: the settings a picture carries. A moss picture gives its
//! whole spec, its model (found by name) and its LoRAs (found by file name next to the picture or
//! in the current folder, checked by hash); an AUTOMATIC1111 or stable-diffusion.cpp picture gives
//! what its parameters text says that moss can reproduce, and what it cannot is named.

use super::args::GenerateArgs;
use moss::a1111::Foreign;
use moss::lora::LoraSpec;
use moss::metadata::{parse_lora, Params};
use moss::spec::PictureSpec;
use std::path::{Path, PathBuf};

/// What a picture records.
pub enum Settings {
    Moss(Params),
    Foreign(Foreign),
}

/// The settings of the picture at `pic`: the `moss` JSON, else an A1111-style `parameters` text.
pub fn read(pic: &Path) -> anyhow::Result<Settings> {
    use anyhow::Context;
    let meta = moss::picture_in::read_metadata(pic)?;
    if meta.get("moss").is_none() {
        if let Some(text) = meta.get("parameters") {
            return moss::a1111::parse(text).map(Settings::Foreign).with_context(|| pic.display().to_string());
        }
    }
    Params::from_png(&meta).map(Settings::Moss).with_context(|| pic.display().to_string())
}

/// `moss info`: the parameters text (or `--json`: the settings); for a foreign picture, what moss
/// would not reproduce on stderr.
pub fn info(pic: &Path, json: bool) -> anyhow::Result<()> {
    match read(pic)? {
        Settings::Moss(p) if json => println!("{}", serde_json::to_string(&p)?),
        Settings::Moss(p) => println!("{}", moss::metadata::printable(&p.a1111())),
        Settings::Foreign(f) => {
            if json {
                println!("{}", serde_json::to_string(&f.json())?);
            } else {
                println!("{}", moss::metadata::printable(&f.text));
            }
            eprintln!("moss: {}", moss::metadata::printable(&f.note(&f.with_model())));
        }
    }
    Ok(())
}

/// `--from PIC`: the picture's spec; its device, model and LoRAs where the flags give none.
pub fn apply(a: &mut GenerateArgs, pic: &Path, given: &dyn Fn(&str) -> bool) -> anyhow::Result<PictureSpec> {
    match read(pic)? {
        Settings::Moss(p) => {
            if !given("device") {
                a.model.device = p.device.parse().map_err(anyhow::Error::msg)?;
            }
            if !given("model") {
                a.model.model = find_model(pic, &p.model)?;
            }
            check_model_hash(pic, &a.model.model, &p.model, p.model_hash.as_deref(), a.quiet);
            a.lora = loras(pic, &p.loras, &a.lora, given("lora"), a.quiet)?;
            p.spec.check().map_err(|e| anyhow::anyhow!("{}: the recorded {e}", pic.display()))?;
            Ok(p.spec)
        }
        Settings::Foreign(f) => {
            let mut not = f.not_reproduced.clone();
            if let Some(m) = f.model_line() {
                // The same model only when the hashes say so.
                let ours = moss::pipeline::open_checkpoint(&a.model.model).ok().and_then(|ck| ck.model_hash().map(String::from));
                if ours.is_none() || ours != f.model_hash {
                    not.insert(0, m);
                }
            }
            if !a.quiet {
                eprintln!("moss: {}", f.note(&not));
            }
            Ok(f.spec)
        }
    }
}

/// The folder or repo id of the model a picture names: as recorded (a repo id in the Hugging Face
/// cache, a folder from here), else a folder of that name next to the picture.
fn find_model(pic: &Path, name: &str) -> anyhow::Result<String> {
    if moss::checkpoint::locate(name).is_ok() {
        return Ok(name.to_string());
    }
    let beside = pic.parent().unwrap_or(Path::new(".")).join(name);
    if !name.is_empty() && beside.is_dir() {
        return Ok(beside.display().to_string());
    }
    anyhow::bail!(
        "{} was made with model `{name}`, which is neither in the Hugging Face cache nor a folder here or next to the picture: pass --model DIR",
        pic.display()
    )
}

/// A warning when the model used is not the one the picture was made with (its hash differs).
fn check_model_hash(pic: &Path, model: &str, name: &str, recorded: Option<&str>, quiet: bool) {
    let Some(recorded) = recorded else { return };
    let Ok(ck) = moss::pipeline::open_checkpoint(model) else { return }; // the run says why
    match ck.model_hash() {
        Some(h) if h != recorded && !quiet => {
            eprintln!("moss: warning: {} was made with model {name} (hash {recorded}); {model} has hash {h}: the picture will differ", pic.display())
        }
        _ => {}
    }
}

/// The LoRAs to render `--from PIC` with: the `--lora` flags when given (with a warning when they
/// are not the recorded ones), else each recorded `FILE:SCALE:HASH` found by its file name next to
/// the picture or in the current folder and checked by its hash; one that is not found is an
/// error naming the file and the hash.
fn loras(pic: &Path, recorded: &[String], flags: &[LoraSpec], flags_given: bool, quiet: bool) -> anyhow::Result<Vec<LoraSpec>> {
    let mut want = vec![];
    for r in recorded {
        let (file, scale, hash) = parse_lora(r).ok_or_else(|| anyhow::anyhow!("{}: the recorded LoRA `{r}` is not FILE:SCALE:HASH", pic.display()))?;
        want.push((file, scale, hash));
    }
    if flags_given {
        let hashes: Vec<String> = flags.iter().map(|l| moss::checkpoint::hash::lora_file_hash(&l.path).unwrap_or_default()).collect();
        let same = want.len() == flags.len() && want.iter().zip(flags.iter().zip(&hashes)).all(|(w, (l, h))| w.2 == *h && w.1 == l.scale);
        if !same && !quiet {
            let names: Vec<String> = want.iter().map(|(f, s, h)| format!("{f}:{s} (hash {h})")).collect();
            let was = if names.is_empty() { "no LoRA".to_string() } else { names.join(", ") };
            eprintln!("moss: warning: {} was made with {was}; rendering with the --lora given", pic.display());
        }
        return Ok(flags.to_vec());
    }
    let dirs: Vec<PathBuf> = vec![pic.parent().map(Path::to_path_buf).unwrap_or_else(|| ".".into()), ".".into()];
    let mut out = vec![];
    for (file, scale, hash) in want {
        let mut seen = vec![];
        let mut found = None;
        for d in &dirs {
            let cand = if d.as_os_str().is_empty() { PathBuf::from(&file) } else { d.join(&file) };
            if !cand.is_file() || seen.iter().any(|(p, _): &(PathBuf, String)| same_file(p, &cand)) {
                continue;
            }
            let h = moss::checkpoint::hash::lora_file_hash(&cand)?;
            if h == hash {
                found = Some(cand);
                break;
            }
            seen.push((cand, h));
        }
        match found {
            Some(path) => out.push(LoraSpec { path, scale }),
            None => {
                let other: Vec<String> = seen.iter().map(|(p, h)| format!("{} has hash {h}", p.display())).collect();
                let other = if other.is_empty() { String::new() } else { format!(" ({})", other.join("; ")) };
                anyhow::bail!(
                    "{} was made with LoRA {file} (hash {hash}, scale {scale}), not found next to the picture or in the current folder{other}: pass --lora PATH:{scale}",
                    pic.display()
                );
            }
        }
    }
    Ok(out)
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

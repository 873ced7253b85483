//! `moss generate`: the flags mapped onto a [`PictureSpec`] (the one place that does), `--from`
//! (the picture's spec with the given flags laid over it), several seeds of one prompt, and batch
//! mode.

use super::args::{GenerateArgs, PromptArgs, Seed};
use super::bars::{Bars, BatchBars};
use moss::batch;
use moss::c2pa_manifest::ManifestSigner;
use moss::pipeline::{self, Input, PicturesIn};
use moss::spec::{HiresSpec, InitSpec, PictureSpec};
use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;

/// Batch mode over `items`, with `defaults` the flags' spec (its seed the base seed): exit 0 if
/// every item of this shard was written (or skipped), 1 if any failed, 128 + the signal if stopped.
fn run_batch(a: &GenerateArgs, items: batch::Items, defaults: PictureSpec, c2pa: Option<Arc<ManifestSigner>>) -> anyhow::Result<u8> {
    let o = batch::BatchOptions {
        items,
        loras: a.lora.clone(),
        defaults,
        out_dir: a.batch.out_dir.clone().unwrap_or_else(|| ".".into()),
        name: a.batch.name.clone().unwrap_or_else(|| batch::DEFAULT_NAME.to_string()),
        skip_existing: a.batch.skip_existing,
        replace: a.force,
        allow_absolute_out: a.batch.allow_absolute_out,
        shard: a.batch.shard.unwrap_or_default(),
        chunk: a.batch.chunk.map(|c| c.min(usize::MAX as u64) as usize),
        model: a.model.model.clone(),
        device: device_of(a),
        devices: a.devices.clone().unwrap_or_default(),
        quality: a.quality,
        c2pa,
        memory: pipeline::MemoryOptions { max_vram_gib: a.max_vram },
        strength: a.pictures.strength,
        mask_blur: a.pictures.mask_blur,
        other_inputs: [
            ("the --from picture", &a.from),
            ("the prompt file", &a.prompt.prompt_file),
            ("the init image", &a.pictures.init_image),
            ("the mask", &a.pictures.mask),
        ]
        .into_iter()
        .filter_map(|(w, p)| Some((w, p.clone()?)))
        .collect(),
    };
    batch::install_stop_handler();
    let terminal = std::io::stderr().is_terminal();
    let mut bars = BatchBars::new(a.quiet, a.json);
    let s = batch::run(&o, &mut bars)?;
    drop(bars);
    let mut parts = vec![format!("{} written", s.written)];
    if s.skipped > 0 {
        parts.push(format!("{} skipped (already there)", s.skipped));
    }
    if s.failed > 0 {
        parts.push(format!("{} failed", s.failed));
    }
    if s.elsewhere > 0 {
        parts.push(format!("{} in other shards", s.elsewhere));
    }
    if let Some(sig) = s.stopped_by {
        eprintln!("moss: stopped by signal {sig}: {}; rerun with --skip-existing to go on", parts.join(", "));
        return Ok(128 + sig.clamp(1, 127) as u8);
    }
    if s.failed > 0 {
        eprintln!("moss: error: {}", parts.join(", "));
        return Ok(1);
    }
    if s.written == 0 && !a.quiet {
        // Said even off a terminal: an empty list, or nothing left to do, is worth one line.
        let why = if s.skipped + s.elsewhere == 0 { "the list has no items".to_string() } else { parts[1..].join(", ") };
        eprintln!("moss: nothing rendered: {why}");
    } else if terminal && !a.quiet {
        eprintln!("moss: {}", parts.join(", "));
    }
    Ok(0)
}

pub fn prompt_text(p: &PromptArgs) -> anyhow::Result<Option<String>> {
    match (&p.prompt, &p.prompt_file) {
        (Some(t), _) => Ok(Some(t.clone())),
        (None, Some(f)) => Ok(Some(moss::prompt::read_prompt_file(f)?)),
        (None, None) => Ok(None),
    }
}

/// `--count N`, `--seeds A,B,..` or an `-o` name template (`fox-{seed}.png`): the pictures of one
/// spec as the items of a batch (one load, the same pictures batch mode gives); `-o` is the
/// batch's name template in its folder.
fn run_several(a: &GenerateArgs, spec: PictureSpec, init: Option<Arc<pipeline::Prepared>>, c2pa: Option<Arc<ManifestSigner>>) -> anyhow::Result<u8> {
    if spec.hires.is_some() {
        anyhow::bail!("--hires renders one picture at a time: not with --count, --seeds or a `{{...}}` name in -o");
    }
    if a.embeds.is_some() || a.save_latents.is_some() {
        anyhow::bail!("--count, --seeds and a `{{...}}` name in -o render through batch mode: not with --embeds or --save-latents");
    }
    if moss::output::is_stdout(&a.out) {
        anyhow::bail!("--count and --seeds write several files: give -o NAME (`-` writes one picture to stdout)");
    }
    moss::picture::check(&a.out, a.quality)?; // said of -o, not of the batch's --name
    let base = spec.seed;
    if a.seed == Seed::Random && !a.quiet {
        eprintln!("moss: seed {base} (random; picture i uses {base} + i)");
    }
    let seeds: Vec<u64> = match &a.seeds {
        Some(list) => list.clone(),
        None => (0..a.count.unwrap_or(1)).map(|i| base.wrapping_add(i)).collect(),
    };
    let items = seeds
        .iter()
        .enumerate()
        .map(|(i, &seed)| batch::Item { index: i, line: i + 1, spec: PictureSpec { seed, ..spec.clone() }, out: None, pictures: None, init: init.clone() })
        .collect();
    let name = a.out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let name = if name.contains('{') || seeds.len() < 2 {
        name
    } else {
        // Several pictures and no template: moss.png -> moss-{seed}.png.
        let p = std::path::Path::new(&name);
        let stem = p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        match p.extension() {
            Some(e) => format!("{stem}-{{seed}}.{}", e.to_string_lossy()),
            None => format!("{stem}-{{seed}}"),
        }
    };
    let mut b = a.clone();
    b.batch.out_dir = Some(match a.out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => ".".into(),
    });
    b.batch.name = Some(name);
    run_batch(&b, batch::Items::Given(items), spec, c2pa)
}

/// The spec the flags give (clap's defaults where a flag was not given), for `prompt` and `seed`
/// already resolved. The one place `generate`'s picture flags become library settings. (The
/// cache flags' own refusal is [`SamplingArgs::cache_config`]'s, said before this is called.)
///
/// [`SamplingArgs::cache_config`]: super::sampling_args::SamplingArgs::cache_config
pub fn spec_of_flags(a: &GenerateArgs, prompt: String, seed: u64) -> PictureSpec {
    PictureSpec {
        prompt,
        negative: a.prompt.negative.clone(),
        seed,
        steps: a.steps,
        guidance: a.guidance,
        width: a.width.unwrap_or(a.size.0),
        height: a.height.unwrap_or(a.size.1),
        uncond_skip: a.uncond_skip.0.clone(),
        skip_window: a.skip_window,
        max_tokens: a.prompt.max_tokens as usize,
        precision: a.precision,
        init_image: None,
        hires: a.pictures.hires.map(|scale| HiresSpec {
            scale,
            strength: a.pictures.hires_strength,
            steps: a.pictures.hires_steps.unwrap_or(a.steps),
            upscaler: a.pictures.hires_upscaler,
        }),
        sampler: a.sampling.sampler,
        schedule: a.sampling.schedule,
        cache: a.sampling.cache_config().ok().flatten(),
        guidance_window: a.sampling.guidance_window,
    }
}

/// The pictures `--init-image` and `--mask` name, each read once (the bytes hashed, the picture
/// decoded under the input limits).
pub fn read_pictures(a: &GenerateArgs) -> anyhow::Result<Option<PicturesIn>> {
    let Some(path) = &a.pictures.init_image else { return Ok(None) };
    let image = Input::read(path, "--init-image")?;
    let mask = a.pictures.mask.as_deref().map(|m| Input::read(m, "--mask")).transpose()?;
    Ok(Some(PicturesIn::new(image, mask)?))
}

/// The init flags onto `spec` for `pics`: the pictures' record (strength 1 by default when
/// outpainting), and the size from the picture unless `--size` was given.
pub fn init_of_flags(a: &GenerateArgs, spec: &mut PictureSpec, pics: &PicturesIn, given: &dyn Fn(&str) -> bool) -> anyhow::Result<()> {
    let p = &a.pictures;
    let strength = if p.outpaint.is_some() && !given("strength") { 1.0 } else { p.strength };
    spec.init_image = Some(pics.spec(strength, p.mask_blur, p.outpaint));
    if !given("size") {
        (spec.width, spec.height) = pics.natural_size(p.outpaint)?;
    }
    Ok(())
}

/// `--from PIC` of a picture made from an init image: the same picture must be given (its hash
/// checked), and the same mask; the other init flags given lay over the recorded ones.
fn lay_over_init(base: Option<InitSpec>, flags: Option<InitSpec>, given: &dyn Fn(&str) -> bool, pic: &Path) -> anyhow::Result<Option<InitSpec>> {
    let pic = pic.display();
    let (rec, f) = match (base, flags) {
        (None, f) => return Ok(f),
        (Some(r), None) => anyhow::bail!("{pic} was made from an init image (sha256 {}): give it with --init-image", r.sha256),
        (Some(r), Some(f)) => (r, f),
    };
    if f.sha256 != rec.sha256 {
        anyhow::bail!("--init-image is not the picture {pic} was made from (its sha256 is {}, the recorded one {})", f.sha256, rec.sha256);
    }
    match (&rec.mask_sha256, &f.mask_sha256) {
        (Some(m), None) => anyhow::bail!("{pic} was made with a mask (sha256 {m}): give it with --mask"),
        (Some(m), Some(g)) if m != g => anyhow::bail!("--mask is not the mask {pic} was made with (its sha256 is {g}, the recorded one {m})"),
        _ => {}
    }
    let mut out = InitSpec { mask_sha256: f.mask_sha256.clone(), ..rec };
    if given("strength") {
        out.strength = f.strength;
    }
    if given("outpaint") {
        out.outpaint = f.outpaint;
    }
    out.mask_blur = match (out.masked(), given("mask_blur")) {
        (false, _) => None,
        (true, true) => f.mask_blur,
        (true, false) => out.mask_blur.or(Some(moss::spec::DEFAULT_MASK_BLUR)),
    };
    Ok(Some(out))
}

/// `--from PIC`: the picture's spec with every flag given on the command line laid over it.
fn lay_over(mut base: PictureSpec, flags: PictureSpec, given: &dyn Fn(&str) -> bool) -> PictureSpec {
    if given("prompt") || given("prompt_file") {
        base.prompt = flags.prompt;
    }
    if given("negative") {
        base.negative = flags.negative;
    }
    if given("seed") {
        base.seed = flags.seed;
    }
    if given("steps") {
        base.steps = flags.steps;
    }
    if given("guidance") {
        base.guidance = flags.guidance;
    }
    if given("size") {
        (base.width, base.height) = (flags.width, flags.height);
    }
    if given("width") {
        base.width = flags.width;
    }
    if given("height") {
        base.height = flags.height;
    }
    if given("uncond_skip") {
        base.uncond_skip = flags.uncond_skip;
    }
    if given("skip_window") {
        base.skip_window = flags.skip_window;
    }
    if given("max_tokens") {
        base.max_tokens = flags.max_tokens;
    }
    if given("precision") {
        base.precision = flags.precision;
    }
    if given("sampler") {
        base.sampler = flags.sampler;
    }
    if given("schedule") {
        base.schedule = flags.schedule;
    }
    // The --cache-* parameters go with --cache (clap's `requires`): the flags' cache whole.
    if given("cache") {
        base.cache = flags.cache;
    }
    if given("guidance_window") {
        base.guidance_window = flags.guidance_window;
    }
    if given("hires") {
        base.hires = flags.hires;
    } else if let (Some(h), Some(f)) = (&mut base.hires, flags.hires) {
        if given("hires_strength") {
            h.strength = f.strength;
        }
        if given("hires_steps") {
            h.steps = f.steps;
        }
        if given("hires_upscaler") {
            h.upscaler = f.upscaler;
        }
    }
    base
}

/// `moss generate` without `--prompts`: one picture, or several seeds of one prompt.
pub fn generate(mut a: GenerateArgs, given: &dyn Fn(&str) -> bool) -> anyhow::Result<u8> {
    let several = a.count.is_some_and(|c| c > 1) || a.seeds.is_some() || a.out.to_string_lossy().contains('{');
    // --skip-existing also resumes several pictures of one prompt.
    if let Some(f) = a.batch.stray_flag().filter(|f| !(several && *f == "--skip-existing")) {
        anyhow::bail!("{f} applies to batch mode only: give --prompts FILE (not --prompt)");
    }
    a.sampling.cache_config()?;
    let c2pa = a.c2pa.signer()?;
    let from = match a.from.clone() {
        Some(pic) => Some(super::from::apply(&mut a, &pic, given)?),
        None => None,
    };
    if given("uncond_skip") {
        warn_skips_beyond(&a.uncond_skip.0, &a.model.model, a.quiet);
    }
    if a.embeds.is_some() && (a.prompt.prompt.is_some() || a.prompt.prompt_file.is_some() || given("negative")) {
        anyhow::bail!("--embeds brings its own prompt and negative: leave out --prompt, --prompt-file and --negative");
    }
    let prompt = prompt_text(&a.prompt)?;
    if prompt.is_none() && a.embeds.is_none() && from.is_none() {
        anyhow::bail!("give --prompt, --prompt-file, --embeds, --prompts or --from");
    }
    let seed = a.seed.resolve();
    if a.pictures.init_image.is_none() {
        if let Some(f) = a.pictures.stray_flag(given) {
            anyhow::bail!("{f} applies to a picture from a picture: give --init-image");
        }
    }
    let pictures = read_pictures(&a)?;
    let mut flags = spec_of_flags(&a, prompt.unwrap_or_default(), seed);
    if let Some(p) = &pictures {
        init_of_flags(&a, &mut flags, p, given)?;
    }
    let spec = match from {
        Some(base) => {
            let init = lay_over_init(base.init_image.clone(), flags.init_image.clone(), given, a.from.as_deref().unwrap_or(Path::new("")))?;
            PictureSpec { init_image: init, ..lay_over(base, flags, given) }
        }
        None => flags,
    };
    if spec.hires.is_none() {
        if let Some(f) = a.pictures.stray_hires_flag(given) {
            anyhow::bail!("{f} applies to the hires fix: give --hires SCALE");
        }
    }
    if a.embeds.is_none() {
        spec.check_prompt().map_err(|e| match &a.prompt.prompt_file {
            Some(f) if given("prompt_file") => anyhow::anyhow!("{}: {e}", f.display()),
            _ if given("prompt") => anyhow::anyhow!("--prompt: {e}"),
            _ => anyhow::anyhow!("{e}"),
        })?;
    }
    warn_ignored(&a, &spec, given);
    spec.check_pictures_in().map_err(anyhow::Error::msg)?;
    let init = match &pictures {
        Some(p) => Some(Arc::new(p.prepare(&spec)?)),
        None => None,
    };
    if several {
        if a.sampling.preview.is_some() {
            anyhow::bail!("--preview shows one picture's loop: not with --count, --seeds or a `{{...}}` name in -o");
        }
        return run_several(&a, spec, init, c2pa);
    }
    // The seed is said whenever it was not given (a drawn one, or the default); after the
    // run, beside the path, so a refusal stays one line.
    let say_seed = (a.seed == Seed::Random || (!given("seed") && a.from.is_none())) && !a.quiet;
    let seed_note = format!("moss: seed {seed}{}", if a.seed == Seed::Random { " (random)" } else { " (default)" });
    let req = pipeline::Request {
        save_latents: a.save_latents.clone(),
        embeds: a.embeds.clone(),
        prompt_file: a.prompt.prompt_file.clone(),
        from: a.from.clone(),
        quality: a.quality,
        c2pa,
        init,
        preview: a.sampling.preview.clone(),
        preview_every: a.sampling.preview_every(),
        replace: a.force,
        ..pipeline::Request::new(spec, a.out.clone(), device_of(&a))
    };
    let to_stdout = moss::output::is_stdout(&a.out) || a.save_latents.as_deref().is_some_and(moss::output::is_stdout);
    if to_stdout && a.json {
        anyhow::bail!("--json and an output on stdout (-) cannot share stdout");
    }
    let mut bars = Bars::new(a.quiet || a.json);
    bars.verbose = a.verbose;
    let mem = pipeline::MemoryOptions { max_vram_gib: a.max_vram };
    let devices = a.devices.clone().unwrap_or_else(|| vec![a.model.device]);
    let rep = pipeline::generate_devices(&req, &a.model.model, &a.lora, &devices, &mem, &mut bars)?;
    if a.verbose {
        bars.say(&rep.timing_line());
    }
    drop(bars);
    if say_seed && !a.json {
        eprintln!("{seed_note}");
    }
    if a.json {
        println!("{}", rep.json());
    } else if !a.quiet && !to_stdout {
        println!("{}", rep.path.display());
    }
    Ok(0)
}

/// The device that encodes, decodes and runs the first rank: `--devices`' first, or `--device`.
fn device_of(a: &GenerateArgs) -> moss::backend::Device {
    a.devices.as_ref().and_then(|d| d.first().copied()).unwrap_or(a.model.device)
}

/// Settings that change nothing in this run, said once each (not with `--quiet`).
fn warn_ignored(a: &GenerateArgs, spec: &PictureSpec, given: &dyn Fn(&str) -> bool) {
    if a.quiet {
        return;
    }
    if spec.guidance == 1.0 && !moss::prompt::trim(&spec.negative).is_empty() {
        let whose = if given("negative") { "--negative" } else { "the negative prompt" };
        eprintln!("moss: warning: {whose} is not used at --guidance 1 (no unconditional pass)");
    }
    if a.max_vram.is_some() && device_of(a) == moss::backend::Device::Cpu {
        eprintln!("moss: warning: --max-vram limits GPU memory; with --device cpu it only shapes the plan (what streams), the same picture");
    }
}

/// `moss generate --prompts FILE`.
pub fn batch(a: &GenerateArgs, given: &dyn Fn(&str) -> bool) -> anyhow::Result<u8> {
    a.sampling.cache_config()?;
    let c2pa = a.c2pa.signer()?;
    if a.sampling.preview.is_some() {
        anyhow::bail!("--preview shows one picture's loop: not with --prompts");
    }
    if given("uncond_skip") {
        warn_skips_beyond(&a.uncond_skip.0, &a.model.model, a.quiet);
    }
    warn_ignored(a, &spec_of_flags(a, String::new(), 0), given);
    let seed = a.seed.resolve();
    if a.seed == Seed::Random && !a.quiet {
        eprintln!("moss: seed {seed} (random; item i uses {seed} + i)");
    }
    if a.pictures.init_image.is_some() || a.pictures.mask.is_some() || a.pictures.outpaint.is_some() || a.pictures.hires.is_some() {
        anyhow::bail!("--init-image, --mask, --outpaint and --hires apply to single pictures; a list item sets `init_image` and `mask` itself");
    }
    let items = batch::Items::List(a.batch.prompts.clone().unwrap());
    run_batch(a, items, spec_of_flags(a, String::new(), seed), c2pa)
}

/// A warning for `--uncond-skip` indices the user gave past the model's last block (not for the
/// default 22, which a small checkpoint may not reach). A checkpoint that does not open is the
/// run's own error, said there.
pub fn warn_skips_beyond(skip: &[usize], model: &str, quiet: bool) {
    if quiet {
        return;
    }
    if let Some(w) = pipeline::open_checkpoint(model).ok().and_then(|ck| pipeline::skips_beyond(skip, &ck)) {
        eprintln!("moss: warning: {w}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::args::{Cli, Command};
    use clap::Parser;

    fn args(extra: &[&str]) -> GenerateArgs {
        let argv = [&["moss", "generate"], extra].concat();
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Generate(a) => a,
            _ => unreachable!(),
        }
    }

    /// clap's defaults are the library's: a command line that gives nothing asks for the
    /// model's default picture.
    #[test]
    fn flag_defaults_are_the_spec_defaults() {
        let a = args(&["--prompt", "x"]);
        assert_eq!(spec_of_flags(&a, "x".into(), a.seed.resolve()), PictureSpec { prompt: "x".into(), ..Default::default() });
    }

    /// `--from`: the picture's values stay where no flag is given; given flags win.
    #[test]
    fn given_flags_lay_over_the_picture() {
        let pic = PictureSpec { prompt: "fox".into(), negative: "dog".into(), seed: 7, steps: 9, width: 64, height: 32, ..Default::default() };
        let a = args(&["--steps", "4", "--size", "128x64"]);
        let flags = spec_of_flags(&a, String::new(), a.seed.resolve());
        let given = |id: &str| matches!(id, "steps" | "size");
        let s = lay_over(pic.clone(), flags, &given);
        assert_eq!(s, PictureSpec { steps: 4, width: 128, height: 64, ..pic.clone() });
        // -W alone changes the width only.
        let a = args(&["-W", "256"]);
        let flags = spec_of_flags(&a, String::new(), a.seed.resolve());
        let s = lay_over(pic.clone(), flags, &|id: &str| id == "width");
        assert_eq!((s.width, s.height), (256, 32));
    }

    /// `--from` of a picture from an init image: the same picture and mask must come again; the
    /// given init flags lay over the recorded ones.
    #[test]
    fn from_asks_for_the_same_pictures() {
        let rec = InitSpec { sha256: "a".repeat(64), strength: 0.6, mask_sha256: Some("b".repeat(64)), mask_blur: Some(8), outpaint: None };
        let pic = Path::new("p.png");
        let none = |_: &str| false;
        let e = lay_over_init(Some(rec.clone()), None, &none, pic).unwrap_err().to_string();
        assert!(e.contains("give it with --init-image") && e.contains(&rec.sha256), "{e}");
        let other = InitSpec { sha256: "c".repeat(64), ..rec.clone() };
        assert!(lay_over_init(Some(rec.clone()), Some(other), &none, pic).unwrap_err().to_string().contains("not the picture p.png was made from"));
        let no_mask = InitSpec { mask_sha256: None, mask_blur: None, strength: 0.75, ..rec.clone() };
        assert!(lay_over_init(Some(rec.clone()), Some(no_mask), &none, pic).unwrap_err().to_string().contains("--mask"));
        // The same pictures: the recorded strength and blur stay unless given.
        let same = InitSpec { strength: 0.75, mask_blur: Some(4), ..rec.clone() };
        assert_eq!(lay_over_init(Some(rec.clone()), Some(same.clone()), &none, pic).unwrap(), Some(rec.clone()));
        let strength = |id: &str| id == "strength";
        assert_eq!(lay_over_init(Some(rec.clone()), Some(same.clone()), &strength, pic).unwrap().unwrap().strength, 0.75);
        // A picture from text takes the init image given.
        assert_eq!(lay_over_init(None, Some(same.clone()), &none, pic).unwrap(), Some(same));
    }
}

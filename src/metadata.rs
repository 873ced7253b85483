//! What a picture records about how it was made, in the forms other tools read:
//!
//! - `parameters` (tEXt/iTXt): the A1111/Forge text that PNG Info panels, civitai and metadata
//!   readers parse: the prompt, a `Negative prompt:` line, then `Key: value` pairs
//!   (`Steps: 50, Sampler: Euler, CFG scale: 3, Seed: 42, Size: 1024x1024, Model: ..., Version: ...`).
//! - `moss` (iTXt): one JSON object with every setting, which `moss info` prints and
//!   `moss generate --from` renders again.
//! - `Software`: `moss VERSION`.
//!
//! No bare `prompt` chunk: ComfyUI reads a chunk of that name as its JSON graph.

use crate::checkpoint::Checkpoint;
use crate::pipeline::Request;
use crate::png::Metadata;
use crate::sampler::Kind as Sampler;
use crate::sigmas::Schedule;
use crate::spec::PictureSpec;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// Every setting that made a picture: its spec (the settings that decide its pixels, flattened
/// into the same JSON object) and the facts of the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    #[serde(flatten)]
    pub spec: PictureSpec,
    /// The prompt's token count before `max_tokens` cut it (absent: not cut).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_before_cut: Option<usize>,
    /// The same for the negative prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub negative_tokens_before_cut: Option<usize>,
    pub device: String,
    /// The model's name: its repo id or its folder's name, never a path.
    pub model: String,
    pub model_revision: String,
    /// A1111's `Model hash` of the transformer (10 hex digits, `moss_core::checkpoint::hash`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_hash: Option<String>,
    /// LoRAs merged into the weights: `FILE:SCALE:HASH` (a short hash of the file's bytes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loras: Vec<String>,
    /// What the denoising loop computed (absent from pictures made before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwards: Option<crate::pipeline::Forwards>,
    pub version: String,
}

/// The version string pictures and `--version` carry.
pub fn version() -> String {
    format!("moss {}", env!("CARGO_PKG_VERSION"))
}

impl Params {
    pub fn of(req: &Request, ck: &Checkpoint) -> Params {
        // The texts as the chat template encodes them (trimmed).
        Params {
            spec: req.spec.trimmed(),
            prompt_tokens_before_cut: req.cut.prompt,
            negative_tokens_before_cut: req.cut.negative,
            device: req.device.to_string(),
            model: ck.loc.name(),
            model_revision: ck.loc.revision.clone().unwrap_or_else(|| "local".into()),
            model_hash: ck.model_hash().map(String::from),
            loras: ck.loras.adapters().iter().map(|l| format!("{}:{}:{}", l.file_name(), l.spec.scale, l.hash)).collect(),
            forwards: req.forwards,
            version: version(),
        }
    }

    /// The A1111/Forge `parameters` text.
    pub fn a1111(&self) -> String {
        let mut s = self.spec.prompt.clone();
        if !self.spec.negative.is_empty() {
            s.push_str("\nNegative prompt: ");
            s.push_str(&self.spec.negative);
        }
        let skip = self.spec.uncond_skip.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",");
        let mut kv: Vec<(&str, String)> = vec![
            ("Steps", self.spec.steps.to_string()),
            ("Sampler", sampler_label(self.spec.sampler).into()),
            ("Schedule type", schedule_label(self.spec.schedule).into()),
            ("CFG scale", fmt_num(self.spec.guidance as f64)),
            ("Seed", self.spec.seed.to_string()),
            ("Size", format!("{}x{}", self.spec.width, self.spec.height)),
        ];
        if let Some(h) = &self.model_hash {
            kv.push(("Model hash", h.clone()));
        }
        kv.extend([
            ("Model", self.model.clone()),
            ("Model revision", self.model_revision.clone()),
            ("Skip layers", if skip.is_empty() { "none".into() } else { skip }),
            ("Skip window", format!("{}:{}", fmt_num(self.spec.skip_window.0), fmt_num(self.spec.skip_window.1))),
            ("Precision", self.spec.precision.to_string()),
            ("Device", self.device.clone()),
        ]);
        let (a, b) = self.spec.guidance_window;
        if (a, b) != (0.0, 1.0) {
            kv.push(("Guidance window", format!("{}:{}", fmt_num(a), fmt_num(b))));
        }
        if let Some(c) = &self.spec.cache {
            kv.push(("Cache", cache_label(c)));
        }
        if let Some(f) = self.forwards.filter(|f| f.cached + f.skipped > 0) {
            kv.push(("Forwards", f.line()));
        }
        let cut = [("prompt", self.prompt_tokens_before_cut), ("negative", self.negative_tokens_before_cut)];
        if self.spec.max_tokens != crate::prompt::MAX_TOKENS || cut.iter().any(|c| c.1.is_some()) {
            kv.push(("Max tokens", self.spec.max_tokens.to_string()));
        }
        let cut: Vec<String> = cut.iter().filter_map(|&(w, n)| n.map(|n| format!("{w} {} of {n} tokens", self.spec.max_tokens.min(n)))).collect();
        if !cut.is_empty() {
            // `;`, not `,`: readers that split the line at commas keep the value whole.
            kv.push(("Cut", cut.join("; ")));
        }
        if let Some(i) = &self.spec.init_image {
            kv.push(("Denoising strength", fmt_num(i.strength)));
            if let Some(b) = i.mask_blur {
                kv.push(("Mask blur", b.to_string()));
            }
            if let Some([l, t, r, b]) = i.outpaint {
                kv.push(("Outpaint", format!("{l},{t},{r},{b}")));
            }
        }
        if let Some(h) = &self.spec.hires {
            let (w, hh) = h.size(self.spec.width, self.spec.height);
            kv.push(("Denoising strength", fmt_num(h.strength)));
            kv.push(("Hires upscale", fmt_num(h.scale)));
            kv.push(("Hires resize", format!("{w}x{hh}")));
            kv.push(("Hires steps", h.steps.to_string()));
            kv.push(("Hires upscaler", h.upscaler.a1111().into()));
        }
        let loras: Vec<(String, String)> = self.loras.iter().filter_map(|l| parse_lora(l)).map(|(file, _, hash)| (stem(&file), hash)).collect();
        if !loras.is_empty() {
            kv.push(("Lora hashes", loras.iter().map(|(n, h)| format!("{n}: {h}")).collect::<Vec<_>>().join(", ")));
        }
        s.push('\n');
        let mut fields: Vec<String> = kv.iter().map(|(k, v)| format!("{k}: {}", quote(v))).collect();
        // Civitai's form of every resource's hash (its extension writes it; sd-parsers reads it):
        // a JSON object, unquoted, as A1111 writes a dict.
        let mut hashes: Vec<(String, &str)> = self.model_hash.iter().map(|h| ("model".to_string(), h.as_str())).collect();
        hashes.extend(loras.iter().map(|(n, h)| (format!("lora:{n}"), h.as_str())));
        if !hashes.is_empty() {
            let json = |v: &str| serde_json::to_string(v).unwrap_or_default();
            let pairs: Vec<String> = hashes.iter().map(|(k, v)| format!("{}:{}", json(k), json(v))).collect();
            fields.push(format!("Hashes: {{{}}}", pairs.join(",")));
        }
        fields.push(format!("Version: {}", quote(&self.version)));
        s.push_str(&fields.join(", "));
        s
    }

    /// The picture's text chunks.
    pub fn to_png(&self) -> Metadata {
        let mut m = Metadata::default();
        m.push("parameters", self.a1111());
        m.push("moss", serde_json::to_string(self).expect("settings serialize"));
        m.push("Software", &self.version);
        m
    }

    /// The settings a moss picture carries (its `moss` chunk).
    pub fn from_png(meta: &Metadata) -> Result<Params> {
        let Some(j) = meta.get("moss") else {
            if meta.get("parameters").is_some() {
                bail!("the picture has A1111-style parameters but no `moss` settings: it was not made by this moss");
            }
            bail!("the picture carries no moss settings");
        };
        serde_json::from_str(j).context("the picture's `moss` settings are not valid")
    }
}

/// The sampler as A1111 and ComfyUI users know it.
pub fn sampler_label(k: Sampler) -> &'static str {
    match k {
        Sampler::Euler => "Euler",
        Sampler::Heun => "Heun",
        Sampler::DpmPp2m => "DPM++ 2M",
        Sampler::DpmPp2mSde => "DPM++ 2M SDE",
        Sampler::UniPc => "UniPC",
        Sampler::Lcm => "LCM",
        Sampler::EulerAncestral => "Euler a",
    }
}

/// The schedule as A1111's `Schedule type` names it: the model's own is `Automatic` (A1111's
/// name for the model's and sampler's default), the others by their A1111/ComfyUI names.
pub fn schedule_label(s: Schedule) -> &'static str {
    match s {
        Schedule::Model => "Automatic",
        Schedule::Simple => "Simple",
        Schedule::Karras => "Karras",
        Schedule::Exponential => "Exponential",
        Schedule::Beta => "Beta",
        Schedule::SgmUniform => "SGM Uniform",
    }
}

/// The cache in one value: `dbcache F8B0 threshold 0.08 warmup 8` and its limits.
fn cache_label(c: &crate::cache::CacheConfig) -> String {
    let mut s = format!("{} F{}B{} threshold {} warmup {}", c.method, c.fn_blocks, c.bn_blocks, fmt_num(c.threshold), c.warmup);
    if let Some(m) = c.max_cached {
        s.push_str(&format!(" max cached {m}"));
    }
    if let Some(m) = c.max_continuous {
        s.push_str(&format!(" max continuous {m}"));
    }
    if c.taylor_order > 0 {
        s.push_str(&format!(" order {}", c.taylor_order));
    }
    s
}

/// The sampler a `Sampler` value names: A1111's display names ([`sampler_label`], any case),
/// moss's names, and stable-diffusion.cpp's `euler_a`.
pub fn sampler_of_label(v: &str) -> Option<Sampler> {
    let v = v.trim();
    let lower = v.to_ascii_lowercase();
    let named = Sampler::ALL.iter().map(|&(k, _)| k).find(|&k| sampler_label(k).eq_ignore_ascii_case(v) || k.name() == lower);
    named.or_else(|| (lower == "euler_a").then_some(Sampler::EulerAncestral))
}

/// The schedule a `Schedule type` value names ([`schedule_label`], or moss's name).
pub fn schedule_of_label(v: &str) -> Option<Schedule> {
    let v = v.trim();
    Schedule::ALL.iter().map(|&(s, _)| s).find(|&s| schedule_label(s) == v || s.name() == v)
}

/// The cache a `Cache` value ([`cache_label`]'s form) names, checked.
pub fn cache_of_label(v: &str) -> Option<crate::cache::CacheConfig> {
    let mut w = v.split_whitespace();
    let mut c = crate::cache::CacheConfig::defaults(w.next()?.parse().ok()?);
    let (f, b) = w.next()?.strip_prefix('F')?.split_once('B')?;
    (c.fn_blocks, c.bn_blocks) = (f.parse().ok()?, b.parse().ok()?);
    let rest: Vec<&str> = w.collect();
    let mut i = 0;
    while i < rest.len() {
        let (key, value) = match rest[i] {
            "max" => (rest.get(i + 1).copied()?, rest.get(i + 2).copied()?),
            k => (k, rest.get(i + 1).copied()?),
        };
        i += if rest[i] == "max" { 3 } else { 2 };
        match key {
            "threshold" => c.threshold = value.parse().ok()?,
            "warmup" => c.warmup = value.parse().ok()?,
            "cached" => c.max_cached = Some(value.parse().ok()?),
            "continuous" => c.max_continuous = Some(value.parse().ok()?),
            "order" => c.taylor_order = value.parse().ok()?,
            _ => return None,
        }
    }
    crate::spec::check_cache(&c).ok().map(|_| c)
}

/// A recorded LoRA `FILE:SCALE:HASH`, split (None: not of that form).
pub fn parse_lora(entry: &str) -> Option<(String, f32, String)> {
    let mut it = entry.rsplitn(3, ':');
    let (hash, scale, file) = (it.next()?, it.next()?, it.next()?);
    Some((file.to_string(), scale.parse().ok()?, hash.to_string()))
}

/// A file name without its extension (A1111's name for an adapter).
fn stem(file: &str) -> String {
    std::path::Path::new(file).file_stem().map_or_else(|| file.to_string(), |s| s.to_string_lossy().into_owned())
}

/// A number as A1111 prints it: integers without a fraction (`3`, not `3.0`).
fn fmt_num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

/// A1111's `quote`: a value holding `,`, `:` or a newline is written as a JSON string.
fn quote(v: &str) -> String {
    if v.contains([',', ':', '\n', '"']) {
        serde_json::to_string(v).unwrap_or_default()
    } else {
        v.to_string()
    }
}

/// `text` safe to print on a terminal: control characters other than newline and tab (an escape
/// sequence, a carriage return) are written as `\u{1b}`.
pub fn printable(text: &str) -> String {
    text.chars().map(|c| if c.is_control() && c != '\n' && c != '\t' { c.escape_unicode().to_string() } else { c.to_string() }).collect()
}

/// The picture's metadata (see the module docs).
pub fn for_request(req: &Request, ck: &Checkpoint) -> Metadata {
    Params::of(req, ck).to_png()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> Params {
        Params {
            spec: PictureSpec {
                prompt: "a fox, in snow".into(),
                negative: "blurry".into(),
                seed: 42,
                steps: 50,
                guidance: 3.0,
                width: 1024,
                height: 768,
                uncond_skip: vec![22],
                skip_window: (0.0, 1.0),
                max_tokens: 4096,
                precision: crate::options::Precision::Bf16,
                ..Default::default()
            },
            prompt_tokens_before_cut: None,
            negative_tokens_before_cut: None,
            device: "cuda:0".into(),
            model: "OpenMOSS-Team/MOSS-Image-SFT".into(),
            model_revision: "abc".into(),
            model_hash: None,
            loras: vec![],
            forwards: None,
            version: "moss 0.1.0".into(),
        }
    }

    #[test]
    fn a1111_text() {
        let t = p().a1111();
        assert_eq!(
            t,
            "a fox, in snow\nNegative prompt: blurry\nSteps: 50, Sampler: Euler, Schedule type: Automatic, CFG scale: 3, \
             Seed: 42, Size: 1024x768, Model: OpenMOSS-Team/MOSS-Image-SFT, Model revision: abc, Skip layers: 22, \
             Skip window: \"0:1\", Precision: bf16, Device: \"cuda:0\", Version: moss 0.1.0"
        );
        let mut q = p();
        q.spec.negative.clear();
        q.spec.guidance = 4.5;
        q.spec.uncond_skip = vec![3, 22];
        q.spec.max_tokens = 77;
        let t = q.a1111();
        assert!(!t.contains("Negative prompt"), "{t}");
        assert!(t.contains("CFG scale: 4.5,") && t.contains("Skip layers: \"3,22\"") && t.contains("Max tokens: 77"), "{t}");
        assert!(!t.contains("Cut"), "{t}");
        q.spec.max_tokens = 4096;
        q.prompt_tokens_before_cut = Some(5000);
        let t = q.a1111();
        assert!(t.contains("Max tokens: 4096, Cut: prompt 4096 of 5000 tokens, Version"), "{t}");
        q.negative_tokens_before_cut = Some(4100);
        assert!(q.a1111().contains("Cut: prompt 4096 of 5000 tokens; negative 4096 of 4100 tokens,"));
    }

    /// A picture from a picture says so as AUTOMATIC1111 does; the moss JSON keeps the hashes.
    #[test]
    fn pictures_in_are_recorded() {
        use crate::spec::{HiresSpec, InitSpec, Upscaler};
        let mut q = p();
        q.spec.init_image = Some(InitSpec { sha256: "a".repeat(64), strength: 0.6, mask_sha256: Some("b".repeat(64)), mask_blur: Some(4), outpaint: None });
        let t = q.a1111();
        assert!(t.contains("Denoising strength: 0.6, Mask blur: 4, Version"), "{t}");
        let j = serde_json::to_value(&q).unwrap();
        assert_eq!(j["init_image"]["sha256"], "a".repeat(64));
        assert_eq!(j["init_image"]["mask_sha256"], "b".repeat(64));
        assert_eq!(Params::from_png(&q.to_png()).unwrap(), q);
        let mut r = p();
        r.spec.hires = Some(HiresSpec { scale: 1.5, strength: 0.7, steps: 20, upscaler: Upscaler::Latent });
        let t = r.a1111();
        assert!(t.contains("Denoising strength: 0.7, Hires upscale: 1.5, Hires resize: 1536x1152, Hires steps: 20, Hires upscaler: Latent,"), "{t}");
        // A picture from text records neither.
        let j = serde_json::to_value(p()).unwrap();
        assert!(j.get("init_image").is_none() && j.get("hires").is_none(), "{j}");
    }

    /// The loop's settings in the A1111 text (display names) and in the JSON (names, and what
    /// the loop computed), which reads back whole.
    #[test]
    fn the_loop_is_recorded() {
        let mut q = p();
        q.spec.sampler = Sampler::DpmPp2mSde;
        q.spec.schedule = Schedule::Karras;
        q.spec.guidance_window = (0.0, 0.5);
        q.spec.cache = Some(crate::cache::CacheConfig { max_continuous: Some(1), ..crate::cache::CacheConfig::defaults(crate::cache::Method::DbCache) });
        q.forwards = Some(crate::pipeline::Forwards { calls: 50, computed: 60, cached: 15, skipped: 25, blocks_computed: 2400, blocks_skipped: 510 });
        let t = q.a1111();
        assert!(t.contains("Sampler: DPM++ 2M SDE, Schedule type: Karras,"), "{t}");
        assert!(t.contains("Guidance window: \"0:0.5\", Cache: dbcache F8B0 threshold 0.08 warmup 8 max continuous 1, Forwards: \"60 of 100 computed (15 cached, 25 left out)\""), "{t}");
        let m = q.to_png();
        let j: serde_json::Value = serde_json::from_str(m.get("moss").unwrap()).unwrap();
        assert_eq!((j["sampler"].as_str(), j["schedule"].as_str()), (Some("dpm++2m_sde"), Some("karras")));
        assert_eq!(j["cache"]["max_continuous_cached_steps"], 1);
        assert_eq!(j["forwards"]["cached"], 15);
        assert_eq!(Params::from_png(&m).unwrap(), q);
        for (k, want) in [(Sampler::Euler, "Euler"), (Sampler::EulerAncestral, "Euler a"), (Sampler::UniPc, "UniPC"), (Sampler::Lcm, "LCM")] {
            assert_eq!(sampler_label(k), want);
        }
        assert_eq!(schedule_label(Schedule::SgmUniform), "SGM Uniform");
        // Each label reads back.
        for (k, _) in Sampler::ALL {
            assert_eq!(sampler_of_label(sampler_label(k)), Some(k));
        }
        for (k, _) in Schedule::ALL {
            assert_eq!(schedule_of_label(schedule_label(k)), Some(k));
        }
        assert_eq!(
            (sampler_of_label("euler_a"), sampler_of_label("dpm++2m"), sampler_of_label("DDIM")),
            (Some(Sampler::EulerAncestral), Some(Sampler::DpmPp2m), None)
        );
        assert_eq!(cache_of_label(&cache_label(&q.spec.cache.unwrap())), q.spec.cache);
        let t = crate::cache::CacheConfig { max_cached: Some(4), threshold: 0.125, ..crate::cache::CacheConfig::defaults(crate::cache::Method::TaylorSeer) };
        assert_eq!(cache_of_label(&cache_label(&t)), Some(t));
        assert_eq!(cache_of_label("dbcache F8B0 threshold 7 warmup 8"), None, "checked");
    }

    /// A1111's `Model hash` after the size, `Lora hashes` as `"name: hash, ..."`, and civitai's
    /// `Hashes` object; the moss JSON keeps each LoRA's file, scale and hash.
    #[test]
    fn hashes_in_a1111_and_civitai_form() {
        let mut q = p();
        q.model_hash = Some("0123456789".into());
        q.loras = vec!["style.safetensors:0.7:aaaaaaaaaaaa".into(), "turbo.safetensors:1:bbbbbbbbbbbb".into()];
        let t = q.a1111();
        assert!(t.contains("Size: 1024x768, Model hash: 0123456789, Model: OpenMOSS-Team/MOSS-Image-SFT,"), "{t}");
        assert!(t.contains("Lora hashes: \"style: aaaaaaaaaaaa, turbo: bbbbbbbbbbbb\""), "{t}");
        assert!(t.ends_with(r#"Hashes: {"model":"0123456789","lora:style":"aaaaaaaaaaaa","lora:turbo":"bbbbbbbbbbbb"}, Version: moss 0.1.0"#), "{t}");
        assert_eq!(Params::from_png(&q.to_png()).unwrap(), q);
        assert_eq!(parse_lora("a:b.safetensors:0.5:abc"), Some(("a:b.safetensors".into(), 0.5, "abc".into())));
        assert_eq!(parse_lora("nope"), None);
    }

    #[test]
    fn printable_escapes_control_characters() {
        assert_eq!(printable("a\u{1b}]0;x\u{7}\rb\nc\td\u{9b}"), "a\\u{1b}]0;x\\u{7}\\u{d}b\nc\td\\u{9b}");
    }

    #[test]
    fn round_trip_through_the_chunks() {
        let m = p().to_png();
        assert!(m.get("prompt").is_none(), "no bare prompt chunk");
        assert_eq!(Params::from_png(&m).unwrap(), p());
        let mut other = Metadata::default();
        other.push("parameters", "x\nSteps: 20");
        assert!(Params::from_png(&other).unwrap_err().to_string().contains("not made by this moss"));
    }
}

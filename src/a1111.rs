//! Pictures of other tools: the `parameters` text AUTOMATIC1111 (and Forge, stable-diffusion.cpp,
//! which write the same form) stores, parsed as A1111's `parse_generation_parameters` does: the
//! prompt, a `Negative prompt:` line, then one line of `Key: value` pairs (a value in double quotes
//! is a JSON string). What moss can reproduce becomes a [`PictureSpec`] (prompt, negative, steps,
//! CFG scale, seed, size; moss's own keys when a moss text has no `moss` JSON); every other
//! setting is named in [`Foreign::not_reproduced`].

use crate::spec::PictureSpec;
use anyhow::{bail, Result};
use std::sync::OnceLock;

/// An A1111-style picture's settings as moss reads them.
#[derive(Clone, Debug, PartialEq)]
pub struct Foreign {
    /// The text as stored.
    pub text: String,
    /// What wrote it (`Version`), if it says.
    pub generator: Option<String>,
    /// The settings moss takes from it (moss's defaults for the rest).
    pub spec: PictureSpec,
    pub model: Option<String>,
    pub model_hash: Option<String>,
    /// `Key: value` of each setting moss does not reproduce.
    pub not_reproduced: Vec<String>,
}

/// A1111's `re_param`: a key, a colon, then a quoted JSON string or anything up to a comma.
fn re_param() -> &'static regex::Regex {
    static R: OnceLock<regex::Regex> = OnceLock::new();
    R.get_or_init(|| regex::Regex::new(r#"\s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)"#).expect("valid regex"))
}

/// Civitai's `Hashes: {...}` object (its JSON holds commas and colons).
fn re_hashes() -> &'static regex::Regex {
    static R: OnceLock<regex::Regex> = OnceLock::new();
    R.get_or_init(|| regex::Regex::new(r"(?:,\s*)?Hashes:\s*(\{[^}]*\})\s*").expect("valid regex"))
}

/// Keys that say nothing about the pixels.
const SILENT: [&str; 6] = ["Version", "Device", "Model revision", "Cut", "Hashes", "Forwards"];

/// Parse a `parameters` text.
pub fn parse(text: &str) -> Result<Foreign> {
    let mut lines: Vec<&str> = text.trim().split('\n').collect();
    let mut last = lines.pop().unwrap_or_default().to_string();
    if let Some(m) = re_hashes().find(&last) {
        last.replace_range(m.range(), "");
    }
    let pairs: Vec<(String, String)> = re_param()
        .captures_iter(&last)
        .map(|c| {
            let v = c[2].to_string();
            let v = if v.len() >= 2 && v.starts_with('"') && v.ends_with('"') { serde_json::from_str(&v).unwrap_or(v) } else { v };
            (c[1].trim().to_string(), v.trim().to_string())
        })
        .collect();
    if pairs.len() < 3 {
        bail!("the picture's parameters text has no settings line (A1111's `Steps: ..., Sampler: ..., ...`)");
    }
    let (mut prompt, mut negative, mut in_negative) = (String::new(), String::new(), false);
    for line in lines {
        let mut line = line.trim();
        if let Some(rest) = line.strip_prefix("Negative prompt:") {
            in_negative = true;
            line = rest.trim();
        }
        let to = if in_negative { &mut negative } else { &mut prompt };
        if !to.is_empty() {
            to.push('\n');
        }
        to.push_str(line);
    }
    let mut f = Foreign {
        text: text.to_string(),
        generator: None,
        spec: PictureSpec { prompt, negative, ..PictureSpec::default() },
        model: None,
        model_hash: None,
        not_reproduced: vec![],
    };
    if f.spec.prompt.contains("<lora:") {
        f.not_reproduced.push("the prompt's <lora:...> tags (moss reads no tags in prompts: pass --lora FILE)".into());
    }
    for (k, v) in pairs {
        if !take(&mut f, &k, &v) {
            f.not_reproduced.push(format!("{k}: {v}"));
        }
    }
    Ok(f)
}

/// Take the setting `k: v` into `f`; false when moss cannot reproduce it.
fn take(f: &mut Foreign, k: &str, v: &str) -> bool {
    let s = &mut f.spec;
    match k {
        "Steps" => v.parse().ok().filter(|n| crate::spec::check_steps(*n as u64).is_ok()).map(|n| s.steps = n).is_some(),
        "CFG scale" => v.parse::<f32>().ok().filter(|g| g.is_finite()).map(|g| s.guidance = g).is_some(),
        "Seed" => v.parse().map(|n| s.seed = n).is_ok(),
        "Size" => {
            let Ok((w, h)) = v.split_once('x').ok_or(()).and_then(|(w, h)| Ok((w.parse::<u32>().map_err(|_| ())?, h.parse::<u32>().map_err(|_| ())?))) else {
                return false;
            };
            // moss renders multiples of 16: the nearest, named when it differs.
            let snap = |x: u32| ((x + 8) / 16 * 16).clamp(16, crate::options::MAX_SIDE);
            (s.width, s.height) = (snap(w), snap(h));
            (s.width, s.height) == (w, h)
        }
        // A1111's names ("DPM++ 2M", "Euler a"), sd.cpp's and moss's ("dpm++2m", "euler_a").
        "Sampler" => crate::metadata::sampler_of_label(v).map(|k| s.sampler = k).is_some(),
        "Schedule type" => crate::metadata::schedule_of_label(v).map(|k| s.schedule = k).is_some(),
        "Model" => {
            f.model = Some(v.to_string());
            true
        }
        "Model hash" => {
            f.model_hash = Some(v.to_string());
            true
        }
        // moss's own keys (a moss text whose JSON was left out).
        "Skip layers" => {
            let list: Result<Vec<usize>, _> = if v == "none" { Ok(vec![]) } else { v.split(',').map(|b| b.trim().parse()).collect() };
            list.map(|l| s.uncond_skip = l).is_ok()
        }
        "Skip window" => v.split_once(':').and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?))).map(|w| s.skip_window = w).is_some(),
        "Precision" => v.parse().map(|p| s.precision = p).is_ok(),
        "Guidance window" => {
            let w = crate::spec::parse_window(v).ok().filter(|w| crate::spec::check_window("", *w).is_ok());
            w.map(|w| s.guidance_window = w).is_some()
        }
        "Cache" => crate::metadata::cache_of_label(v).map(|c| s.cache = Some(c)).is_some(),
        "Max tokens" => v.parse().map(|n| s.max_tokens = n).is_ok(),
        _ if SILENT.contains(&k) => {
            if k == "Version" {
                f.generator = Some(v.to_string());
            }
            true
        }
        _ => false,
    }
}

impl Foreign {
    /// `Model: NAME (hash H)`, when the picture names a model.
    pub fn model_line(&self) -> Option<String> {
        match (&self.model, &self.model_hash) {
            (None, None) => None,
            (m, h) => Some(format!("Model: {}{}", m.as_deref().unwrap_or("?"), h.as_ref().map(|h| format!(" (hash {h})")).unwrap_or_default())),
        }
    }

    /// The one line that says where the settings come from and what `not` names.
    pub fn note(&self, not: &[String]) -> String {
        let from = self.generator.as_deref().map(|g| format!(" ({g})")).unwrap_or_default();
        let not = if not.is_empty() { "nothing else".to_string() } else { not.join("; ") };
        format!("an A1111-style picture{from}: moss takes its prompt, negative prompt, steps, sampler, schedule type, CFG scale, seed and size; it does not reproduce: {not}")
    }

    /// `moss info --json`: the settings moss takes, and what it does not.
    pub fn json(&self) -> serde_json::Value {
        let mut j = serde_json::to_value(&self.spec).unwrap_or_default();
        j["source"] = self.generator.clone().unwrap_or_else(|| "A1111-style parameters".into()).into();
        j["model"] = self.model.clone().into();
        j["model_hash"] = self.model_hash.clone().into();
        j["not_reproduced"] = self.with_model().into();
        j
    }

    /// [`Foreign::not_reproduced`] with the picture's model first (moss renders with its own).
    pub fn with_model(&self) -> Vec<String> {
        self.model_line().into_iter().chain(self.not_reproduced.iter().cloned()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A text as A1111 1.10 writes it (`processing.create_infotext`).
    const A1111: &str = "a castle on a hill, (masterpiece:1.2)\nmultiple lines <lora:detail:0.6>\nNegative prompt: lowres, bad anatomy\n\
        Steps: 28, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 6.5, Seed: 1234567890, Size: 512x768, \
        Model hash: 6ce0161689, Model: v1-5-pruned-emaonly, Denoising strength: 0.7, Clip skip: 2, \
        Hires upscale: 2, Hires upscaler: Latent, Lora hashes: \"detail: 0123456789ab\", Version: v1.10.1";

    #[test]
    fn an_a1111_text_maps_what_moss_reproduces() {
        let f = parse(A1111).unwrap();
        assert_eq!(f.spec.prompt, "a castle on a hill, (masterpiece:1.2)\nmultiple lines <lora:detail:0.6>");
        assert_eq!(f.spec.negative, "lowres, bad anatomy");
        assert_eq!((f.spec.steps, f.spec.guidance, f.spec.seed, f.spec.width, f.spec.height), (28, 6.5, 1234567890, 512, 768));
        assert_eq!((f.spec.sampler, f.spec.schedule), (crate::sampler::Kind::DpmPp2m, crate::sigmas::Schedule::Karras));
        assert_eq!((f.model.as_deref(), f.model_hash.as_deref(), f.generator.as_deref()), (Some("v1-5-pruned-emaonly"), Some("6ce0161689"), Some("v1.10.1")));
        assert_eq!(
            f.not_reproduced,
            [
                "the prompt's <lora:...> tags (moss reads no tags in prompts: pass --lora FILE)",
                "Denoising strength: 0.7",
                "Clip skip: 2",
                "Hires upscale: 2",
                "Hires upscaler: Latent",
                "Lora hashes: detail: 0123456789ab",
            ]
        );
    }

    /// stable-diffusion.cpp's form: lower-case sampler names, its own keys.
    #[test]
    fn an_sd_cpp_text() {
        let t = "a lovely cat\nSteps: 20, CFG scale: 7, Guidance: 3.5, Eta: 0, Seed: 42, Size: 520x512, Model: sd-v1-4.ckpt, RNG: cuda, Sampler: euler, Version: stable-diffusion.cpp";
        let f = parse(t).unwrap();
        assert_eq!((f.spec.prompt.as_str(), f.spec.negative.as_str(), f.spec.steps, f.spec.guidance, f.spec.seed), ("a lovely cat", "", 20, 7.0, 42));
        assert_eq!((f.spec.width, f.spec.height), (528, 512), "snapped to 16");
        assert_eq!(f.not_reproduced, ["Guidance: 3.5", "Eta: 0", "Size: 520x512", "RNG: cuda"]);
        assert!(parse("just a prompt\nno settings").is_err());
    }

    /// moss's own text (what a JPEG keeps when its JSON had no room) gives its spec back.
    #[test]
    fn a_moss_text_gives_its_spec_back() {
        let p = crate::metadata::Params {
            spec: PictureSpec {
                prompt: "a fox, in snow".into(),
                negative: "blurry".into(),
                seed: 7,
                steps: 9,
                guidance: 2.5,
                width: 64,
                height: 48,
                uncond_skip: vec![3, 22],
                skip_window: (0.25, 1.0),
                max_tokens: 77,
                precision: crate::options::Precision::Fp32,
                sampler: crate::sampler::Kind::Heun,
                schedule: crate::sigmas::Schedule::Beta,
                cache: Some(crate::cache::CacheConfig { max_cached: Some(3), ..crate::cache::CacheConfig::defaults(crate::cache::Method::TaylorSeer) }),
                guidance_window: (0.0, 0.5),
                init_image: None,
                hires: None,
            },
            prompt_tokens_before_cut: Some(100),
            negative_tokens_before_cut: None,
            device: "cuda:0".into(),
            model: "tiny-a".into(),
            model_revision: "local".into(),
            model_hash: Some("0123456789".into()),
            loras: vec![],
            forwards: Some(crate::pipeline::Forwards { calls: 9, computed: 12, cached: 2, skipped: 4, blocks_computed: 1, blocks_skipped: 1 }),
            version: "moss 0.1.0".into(),
        };
        let f = parse(&p.a1111()).unwrap();
        assert_eq!(f.spec, p.spec);
        assert!(f.not_reproduced.is_empty(), "{:?}", f.not_reproduced);
        assert_eq!(f.model_hash.as_deref(), Some("0123456789"));
    }
}

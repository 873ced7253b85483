//! One picture's settings: what decides its pixels, nothing about where it is written or which
//! GPU runs it. The command line, batch list items and server requests each build one, and the
//! picture's metadata records it as it is (the `moss` JSON is this struct serialised, with the
//! facts of the run beside it), so `--from` reads back exactly what a run was given.

use crate::cache::CacheConfig;
use crate::options::{check_size, Precision};
use crate::prompt::{trim, MAX_TOKENS};
use crate::sampler::Kind as Sampler;
use crate::sigmas::Schedule;
use serde::{Deserialize, Serialize};

mod loop_settings;
pub use loop_settings::*;
mod pictures_in;
pub use pictures_in::*;

/// The model's defaults (spec 5): 50 Euler steps, CFG 3 with block 22 skipped in the
/// unconditional pass over the whole schedule, 1024x1024, bf16.
pub const DEFAULT_STEPS: u32 = 50;
pub const DEFAULT_GUIDANCE: f32 = 3.0;
pub const DEFAULT_SIZE: (u32, u32) = (1024, 1024);
pub const DEFAULT_UNCOND_SKIP: usize = 22;
pub const DEFAULT_SEED: u64 = 42;
/// Steps accepted: 1 up to the scheduler's training timesteps.
pub const MAX_STEPS: u32 = 1000;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PictureSpec {
    pub prompt: String,
    pub negative: String,
    pub seed: u64,
    pub steps: u32,
    pub guidance: f32,
    pub width: u32,
    pub height: u32,
    /// DiT blocks skipped in the unconditional pass.
    pub uncond_skip: Vec<usize>,
    /// The skip applies at step i when `a <= i/n < b`.
    pub skip_window: (f64, f64),
    /// Prompt token limit; longer texts are cut.
    pub max_tokens: usize,
    /// GPU compute precision (the CPU reference computes in fp32 either way).
    #[serde(with = "precision_name")]
    pub precision: Precision,
    /// The sampler (`euler`: the model's own). The loop's settings are absent from the metadata
    /// of pictures made before they existed: those read as the defaults, which is what made them.
    #[serde(default, with = "by_name")]
    pub sampler: Sampler,
    /// The sigma schedule (`model`: the checkpoint's own, spec 5.2).
    #[serde(default, with = "by_name")]
    pub schedule: Schedule,
    /// Step caching (None: off).
    #[serde(default, with = "cache_form")]
    pub cache: Option<CacheConfig>,
    /// Guidance applies at step i when `a <= i/n < b`; outside, the negative pass does not run.
    #[serde(default = "full_window")]
    pub guidance_window: (f64, f64),
    /// The picture the run starts from (img2img, inpainting, outpainting); `None`: from text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_image: Option<InitSpec>,
    /// The hires fix: this spec's size is the first pass's, the picture [`HiresSpec::size`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hires: Option<HiresSpec>,
}

impl Default for PictureSpec {
    fn default() -> Self {
        PictureSpec {
            prompt: String::new(),
            negative: String::new(),
            seed: DEFAULT_SEED,
            steps: DEFAULT_STEPS,
            guidance: DEFAULT_GUIDANCE,
            width: DEFAULT_SIZE.0,
            height: DEFAULT_SIZE.1,
            uncond_skip: vec![DEFAULT_UNCOND_SKIP],
            skip_window: (0.0, 1.0),
            max_tokens: MAX_TOKENS,
            precision: Precision::Bf16,
            sampler: Sampler::Euler,
            schedule: Schedule::Model,
            cache: None,
            guidance_window: full_window(),
            init_image: None,
            hires: None,
        }
    }
}

impl PictureSpec {
    /// The numbers' rules, one message naming the first one broken. (Prompt text rules are
    /// [`PictureSpec::check_prompt`]'s: a spec may come from `--embeds`, which has none.)
    pub fn check(&self) -> Result<(), String> {
        check_steps(self.steps as u64)?;
        check_guidance(self.guidance as f64)?;
        check_size(self.width, self.height)?;
        if !(1..=MAX_TOKENS).contains(&self.max_tokens) {
            return Err(format!("max tokens {} is not in 1..={MAX_TOKENS}", self.max_tokens));
        }
        let (a, b) = self.skip_window;
        if !(a.is_finite() && b.is_finite() && 0.0 <= a && a <= b && b <= 1.0) {
            return Err(format!("skip window {a}:{b} is not A:B with 0 <= A <= B <= 1"));
        }
        check_window("guidance window", self.guidance_window)?;
        if let Some(c) = &self.cache {
            check_cache(c)?;
        }
        self.check_pictures_in()
    }

    /// The rules of the init image and the hires fix.
    pub fn check_pictures_in(&self) -> Result<(), String> {
        if let Some(i) = &self.init_image {
            i.check(self.width, self.height)?;
            check_inpaint_sampler(self.sampler, i.masked())?;
        }
        if let Some(h) = &self.hires {
            if self.init_image.is_some() {
                return Err("the hires fix applies to pictures from text: not with an init image".into());
            }
            h.check(self.width, self.height)?;
        }
        Ok(())
    }

    /// The prompt must say something once trimmed (the chat template trims it).
    pub fn check_prompt(&self) -> Result<(), String> {
        if trim(&self.prompt).is_empty() {
            return Err("the prompt is empty (or only whitespace)".into());
        }
        Ok(())
    }

    /// The size of the picture written: the spec's, or the hires fix's second pass.
    pub fn out_size(&self) -> (u32, u32) {
        match &self.hires {
            Some(h) => h.size(self.width, self.height),
            None => (self.width, self.height),
        }
    }

    /// The texts as the chat template encodes them (surrounding whitespace trimmed): what a
    /// picture records.
    pub fn trimmed(&self) -> PictureSpec {
        PictureSpec { prompt: trim(&self.prompt).to_string(), negative: trim(&self.negative).to_string(), ..self.clone() }
    }
}

/// Inpainting (a mask, or an outpainting border) blends the kept region back after every step,
/// which every sampler but `heun` allows: its step makes two model calls, and diffusers' inpaint
/// loop blends after each of them, a recipe moss does not follow.
pub fn check_inpaint_sampler(sampler: Sampler, masked: bool) -> Result<(), String> {
    if masked && sampler == Sampler::Heun {
        return Err(
            "sampler heun does not inpaint or outpaint (its steps make two model calls, the kept region has no single blend point): choose another sampler"
                .into(),
        );
    }
    Ok(())
}

/// Steps in 1..=1000 (the training timesteps).
pub fn check_steps(steps: u64) -> Result<(), String> {
    if !(1..=MAX_STEPS as u64).contains(&steps) {
        return Err(format!("steps {steps} is not in 1..={MAX_STEPS} (the training timesteps)"));
    }
    Ok(())
}

/// A finite guidance (also as f32).
pub fn check_guidance(guidance: f64) -> Result<(), String> {
    if !guidance.is_finite() || !(guidance as f32).is_finite() {
        return Err(format!("guidance {guidance} is not a finite number"));
    }
    Ok(())
}

/// Precision as its name (`"bf16"`), as pictures have always recorded it.
mod precision_name {
    use super::Precision;
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(p: &Precision, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(p)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Precision, D::Error> {
        String::deserialize(d)?.parse().map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_pass_and_bad_numbers_are_named() {
        let d = PictureSpec::default();
        assert_eq!(d.check(), Ok(()));
        let bad = |f: fn(&mut PictureSpec), word: &str| {
            let mut s = PictureSpec::default();
            f(&mut s);
            let e = s.check().unwrap_err();
            assert!(e.contains(word), "{e}");
        };
        bad(|s| s.steps = 0, "steps 0");
        bad(|s| s.steps = 1001, "steps 1001");
        bad(|s| s.guidance = f32::NAN, "guidance");
        bad(|s| s.width = 1000, "width 1000");
        bad(|s| s.max_tokens = 0, "max tokens");
        bad(|s| s.skip_window = (0.5, 0.2), "skip window");
        bad(|s| s.guidance_window = (0.0, 1.5), "guidance window");
        let db = crate::cache::CacheConfig::defaults(crate::cache::Method::DbCache);
        bad(
            |s| s.cache = Some(crate::cache::CacheConfig { threshold: -0.1, ..crate::cache::CacheConfig::defaults(crate::cache::Method::DbCache) }),
            "threshold",
        );
        assert!(PictureSpec { cache: Some(db), ..Default::default() }.check().is_ok());
    }

    /// Metadata written before the loop's settings existed reads as the defaults; the settings
    /// are recorded by name.
    #[test]
    fn the_loop_settings_default_and_round_trip() {
        let mut j = serde_json::to_value(PictureSpec::default()).unwrap();
        for k in ["sampler", "schedule", "cache", "guidance_window"] {
            assert!(j.as_object_mut().unwrap().remove(k).is_some(), "{k} is recorded");
        }
        assert_eq!(serde_json::from_value::<PictureSpec>(j).unwrap(), PictureSpec::default());
        let s = PictureSpec {
            sampler: Sampler::DpmPp2mSde,
            schedule: Schedule::Karras,
            cache: Some(crate::cache::CacheConfig::defaults(crate::cache::Method::TaylorSeer)),
            guidance_window: (0.0, 0.5),
            ..Default::default()
        };
        let j = serde_json::to_value(&s).unwrap();
        assert_eq!((j["sampler"].as_str(), j["schedule"].as_str(), j["cache"]["method"].as_str()), (Some("dpm++2m_sde"), Some("karras"), Some("taylorseer")));
        assert_eq!(j["guidance_window"], serde_json::json!([0.0, 0.5]));
        assert_eq!(serde_json::from_value::<PictureSpec>(j).unwrap(), s);
        let mut j = serde_json::to_value(&s).unwrap();
        j["sampler"] = "dpmpp_2m".into();
        let e = serde_json::from_value::<PictureSpec>(j).unwrap_err().to_string();
        assert!(e.contains("dpmpp_2m") && e.contains("euler_ancestral"), "{e}");
    }

    #[test]
    fn blank_prompts_are_refused() {
        for p in ["", "   ", "\n\t "] {
            let s = PictureSpec { prompt: p.into(), ..Default::default() };
            assert!(s.check_prompt().is_err(), "{p:?}");
        }
        assert!(PictureSpec { prompt: " a cat ".into(), ..Default::default() }.check_prompt().is_ok());
    }

    #[test]
    fn precision_is_recorded_by_name() {
        let s = PictureSpec { precision: Precision::Fp8, ..Default::default() };
        let j = serde_json::to_value(&s).unwrap();
        assert_eq!(j["precision"], "fp8");
        assert_eq!(serde_json::from_value::<PictureSpec>(j).unwrap(), s);
        let mut j = serde_json::to_value(&s).unwrap();
        j["precision"] = "fp16".into();
        assert!(serde_json::from_value::<PictureSpec>(j).unwrap_err().to_string().contains("fp16"));
    }
}

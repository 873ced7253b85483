//! `generate`'s flags for the sampling loop: sampler, schedule, guidance window, step caching
//! (cache-dit's methods and parameters) and live previews.

use clap::Args;
use moss::cache::{CacheConfig, Method};
use moss::sampler::Kind as Sampler;
use moss::sigmas::Schedule;
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Fraction of the steps START:STOP with guidance (step i is guided if START <= i/n < STOP);
    /// outside it the negative pass does not run at all.
    #[arg(long, value_name = "A:B", default_value = "0:1", value_parser = super::args::parse_window)]
    pub guidance_window: (f64, f64),
    /// The sampler: euler (the model's own), heun, dpm++2m, dpm++2m_sde, unipc, lcm (few-step
    /// LoRAs), euler_ancestral.
    #[arg(long, value_name = "NAME", default_value = "euler", value_parser = parse_sampler)]
    pub sampler: Sampler,
    /// The sigma schedule: model (the checkpoint's own), simple, karras, exponential, beta,
    /// sgm_uniform.
    #[arg(long, value_name = "NAME", default_value = "model", value_parser = parse_schedule)]
    pub schedule: Schedule,
    /// Step caching (cache-dit's methods, each pass its own cache): off, dbcache (F8B0,
    /// threshold 0.08, warm-up 8), fbcache (F1B0), taylorseer (dbcache with a TaylorSeer
    /// forecast, order 1). The --cache-* flags change its parameters.
    #[arg(long, value_name = "NAME", default_value = "off", value_parser = parse_cache)]
    pub cache: CacheMethod,
    /// Fn_compute_blocks: the first blocks, always run; their residual decides.
    #[arg(long, value_name = "N", requires = "cache")]
    pub cache_fn: Option<usize>,
    /// Bn_compute_blocks: the last blocks, always run.
    #[arg(long, value_name = "N", requires = "cache")]
    pub cache_bn: Option<usize>,
    /// residual_diff_threshold, 0..1: a step is served from the cache when the first blocks'
    /// residual changed less than this (relative L1); 1 caches every step the limits allow.
    #[arg(long, value_name = "X", requires = "cache")]
    pub cache_threshold: Option<f64>,
    /// max_warmup_steps: the first model calls always run in full.
    #[arg(long, value_name = "N", requires = "cache")]
    pub cache_warmup: Option<usize>,
    /// max_cached_steps: most calls served from the cache, per pass (-1: no limit).
    #[arg(long, value_name = "N", requires = "cache", allow_negative_numbers = true, value_parser = parse_limit)]
    pub cache_max_cached: Option<Limit>,
    /// max_continuous_cached_steps: most calls in a row served from the cache (-1: no limit).
    #[arg(long, value_name = "N", requires = "cache", allow_negative_numbers = true, value_parser = parse_limit)]
    pub cache_max_continuous: Option<Limit>,
    /// taylorseer_order (1 or 2) of --cache taylorseer.
    #[arg(long, value_name = "K", requires = "cache")]
    pub cache_taylor_order: Option<usize>,
    /// Replace PATH (a .png, .jpg or .webp, atomically) with the decoded x0 prediction every
    /// --preview-every steps while the picture denoises.
    #[arg(long, value_name = "PATH")]
    pub preview: Option<PathBuf>,
    /// Steps between two previews [default: 5].
    #[arg(long, value_name = "N", requires = "preview", value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub preview_every: Option<u64>,
}

/// `--cache`: off, or a method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheMethod(pub Option<Method>);

/// `--cache-max-*`: a count, or none (-1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit(pub Option<usize>);

fn parse_sampler(s: &str) -> Result<Sampler, String> {
    s.parse()
}

fn parse_schedule(s: &str) -> Result<Schedule, String> {
    s.parse()
}

fn parse_cache(s: &str) -> Result<CacheMethod, String> {
    moss::spec::parse_cache_name(s).map(|c| CacheMethod(c.map(|c| c.method)))
}

fn parse_limit(s: &str) -> Result<Limit, String> {
    match s.trim().parse::<i64>() {
        Ok(-1) => Ok(Limit(None)),
        Ok(n) if n >= 0 => Ok(Limit(Some(n as usize))),
        _ => Err(format!("`{s}` is not a count of steps (0 or more) or -1 (no limit)")),
    }
}

impl SamplingArgs {
    /// The cache the flags give: the method's defaults (cache-dit's) with the given parameters
    /// over them; parameters with `--cache off` are refused. (Their ranges are the spec's check.)
    pub fn cache_config(&self) -> anyhow::Result<Option<CacheConfig>> {
        let given = [
            ("--cache-fn", self.cache_fn.is_some()),
            ("--cache-bn", self.cache_bn.is_some()),
            ("--cache-threshold", self.cache_threshold.is_some()),
            ("--cache-warmup", self.cache_warmup.is_some()),
            ("--cache-max-cached", self.cache_max_cached.is_some()),
            ("--cache-max-continuous", self.cache_max_continuous.is_some()),
            ("--cache-taylor-order", self.cache_taylor_order.is_some()),
        ];
        let Some(method) = self.cache.0 else {
            if let Some((flag, _)) = given.iter().find(|g| g.1) {
                anyhow::bail!("{flag} is a parameter of a step cache: give --cache {}", Method::names().replace(", ", "|"));
            }
            return Ok(None);
        };
        let mut c = CacheConfig::defaults(method);
        c.fn_blocks = self.cache_fn.unwrap_or(c.fn_blocks);
        c.bn_blocks = self.cache_bn.unwrap_or(c.bn_blocks);
        c.threshold = self.cache_threshold.unwrap_or(c.threshold);
        c.warmup = self.cache_warmup.unwrap_or(c.warmup);
        c.max_cached = self.cache_max_cached.map_or(c.max_cached, |l| l.0);
        c.max_continuous = self.cache_max_continuous.map_or(c.max_continuous, |l| l.0);
        c.taylor_order = self.cache_taylor_order.unwrap_or(c.taylor_order);
        Ok(Some(c))
    }

    /// `--preview-every`, or its default.
    pub fn preview_every(&self) -> usize {
        self.preview_every.map_or(moss::pipeline::DEFAULT_PREVIEW_EVERY, |n| n as usize)
    }
}

//! Step caching over the DiT's main blocks (issue 42), as cache-dit 1.5.3 defines it
//! (`caching/cache_contexts/cache_manager.py`, `cache_context.py`, `cache_blocks/pattern_base.py`,
//! `calibrators/taylorseer.py`):
//!
//! - **DBCache** (`dbcache`, "dual block cache", `F`/`B` compute blocks): every forward runs the first
//!   `F` blocks; their residual `R = X_F − X_0` (the joint stream after them minus before) is
//!   compared with the one of the last step that ran in full, `diff = mean|R_prev − R| /
//!   mean|R_prev|`. Past the warm-up, within the cached-step limits, `diff < threshold` serves the
//!   middle blocks from the cache, `X ← X_F + M` with `M` the middle blocks' residual of the last
//!   full step; otherwise they run and `R` and `M` are stored. The last `B` blocks always run.
//! - **FBCache** (`fbcache`, first-block cache): DBCache with `F = 1`, `B = 0`.
//! - **TaylorSeer** (`taylorseer`, order k): DBCache whose cached `M` is the order-k Taylor
//!   forecast from the middle residuals of the full steps (cache-dit's TaylorSeer calibrator).
//!
//! The conditional and unconditional passes each keep their own [`BlockCache`] (cache-dit's
//! `enable_separate_cfg`); both count steps by model call (cache-dit counts transformer calls:
//! Heun's two calls a step are two cache steps). The decisions are [`Branch`] (host state, exact
//! to cache-dit's rules); the tensors live on the backend ([`store`]). The DiT consults a
//! [`BlockCache`] in [`crate::model::dit::Dit::velocity_cached`].

use anyhow::{bail, Result};
use std::fmt;
use std::str::FromStr;

pub mod store;
mod taylor;

pub use store::BlockCache;

/// The caching method by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    DbCache,
    FbCache,
    TaylorSeer,
}

impl Method {
    pub const ALL: [(Method, &'static str); 3] = [(Method::DbCache, "dbcache"), (Method::FbCache, "fbcache"), (Method::TaylorSeer, "taylorseer")];

    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|(m, _)| *m == self).map(|(_, n)| *n).expect("every method is named")
    }

    pub fn names() -> String {
        Self::ALL.iter().map(|(_, n)| *n).collect::<Vec<_>>().join(", ")
    }
}

impl FromStr for Method {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL.iter().find(|(_, n)| *n == s).map(|(m, _)| *m).ok_or_else(|| format!("unknown cache `{s}`; the caches are off, {}", Self::names()))
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A cache's parameters, named as cache-dit's `DBCacheConfig` fields.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheConfig {
    pub method: Method,
    /// `Fn_compute_blocks`: the first blocks, always run (their residual decides).
    pub fn_blocks: usize,
    /// `Bn_compute_blocks`: the last blocks, always run.
    pub bn_blocks: usize,
    /// `residual_diff_threshold`: cache when the relative L1 difference is below it (≥ 1: always,
    /// past the warm-up; ≤ 0: never).
    pub threshold: f64,
    /// `max_warmup_steps`: the first steps always run in full.
    pub warmup: usize,
    /// `max_cached_steps` (None: no limit, cache-dit's −1), per pass.
    pub max_cached: Option<usize>,
    /// `max_continuous_cached_steps` (None: no limit), per pass.
    pub max_continuous: Option<usize>,
    /// TaylorSeer's order (`taylorseer_order`; 0 without TaylorSeer).
    pub taylor_order: usize,
}

impl CacheConfig {
    /// cache-dit's defaults for `method`: `DBCacheConfig()` (F8B0, threshold 0.08, warm-up 8, no
    /// limits), FBCache as F1B0, TaylorSeer with `TaylorSeerCalibratorConfig()` (order 1).
    pub fn defaults(method: Method) -> CacheConfig {
        let db = CacheConfig { method, fn_blocks: 8, bn_blocks: 0, threshold: 0.08, warmup: 8, max_cached: None, max_continuous: None, taylor_order: 0 };
        match method {
            Method::DbCache => db,
            Method::FbCache => CacheConfig { fn_blocks: 1, ..db },
            Method::TaylorSeer => CacheConfig { taylor_order: 1, ..db },
        }
    }

    /// Check the parameters against a transformer of `blocks` main blocks.
    pub fn check(&self, blocks: usize) -> Result<()> {
        if self.fn_blocks == 0 {
            bail!("the cache needs at least one first compute block (F >= 1)");
        }
        if self.fn_blocks + self.bn_blocks > blocks {
            bail!("F{}B{}: the transformer has only {blocks} blocks", self.fn_blocks, self.bn_blocks);
        }
        if !self.threshold.is_finite() {
            bail!("the residual-difference threshold must be a finite number");
        }
        if self.method == Method::FbCache && (self.fn_blocks, self.bn_blocks) != (1, 0) {
            bail!("fbcache is F1B0; use dbcache for other compute blocks");
        }
        if (self.method == Method::TaylorSeer) != (self.taylor_order > 0) {
            bail!("a TaylorSeer order (>= 1) goes with taylorseer and only with it");
        }
        Ok(())
    }
}

/// One pass's decision state (cache-dit's `CachedContext` for one CFG branch).
#[derive(Clone, Debug)]
pub struct Branch {
    cfg: CacheConfig,
    /// The steps served from the cache, in order.
    pub cached: Vec<usize>,
    continuous: usize,
    /// The residual difference measured at each step that measured one.
    pub diffs: Vec<(usize, f64)>,
}

impl Branch {
    pub fn new(cfg: CacheConfig) -> Self {
        Branch { cfg, cached: vec![], continuous: 0, diffs: vec![] }
    }

    /// `mark_step_begin`: the run of cached steps is broken unless the previous step was cached.
    pub fn begin(&mut self, step: usize) {
        if step == 0 || self.cached.last() != Some(&(step - 1)) {
            self.continuous = 0;
        }
    }

    /// `can_cache`: whether step `step` may be served from the cache. `have_prev`: a residual of
    /// a full step is stored; `diff` measures the difference against it (called only when
    /// needed, and recorded).
    pub fn can_cache(&mut self, step: usize, have_prev: bool, diff: impl FnOnce() -> Result<f64>) -> Result<bool> {
        let c = &self.cfg;
        if step < c.warmup {
            return Ok(false);
        }
        if c.max_cached.is_some_and(|m| self.cached.len() >= m) {
            return Ok(false);
        }
        let mut continuous = self.continuous;
        if self.cached.last() == Some(&step) {
            continuous -= 1;
        }
        if c.max_continuous.is_some_and(|m| continuous >= m) {
            return Ok(false);
        }
        if c.threshold <= 0.0 || !have_prev {
            return Ok(false);
        }
        if c.threshold >= 1.0 {
            self.diffs.push((step, -1.0));
            return Ok(true);
        }
        let d = diff()?;
        self.diffs.push((step, d));
        Ok(d < c.threshold)
    }

    /// `add_cached_step`
    pub fn mark_cached(&mut self, step: usize) {
        self.continuous += 1;
        self.cached.push(step);
    }
}

/// `mean|prev − cur| / mean|prev|` in f64 (cache-dit's `similarity`; NaN when `prev` is all zero).
pub fn rel_l1(prev: &[f32], cur: &[f32]) -> f64 {
    let (mut d, mut p) = (0.0f64, 0.0f64);
    for (&a, &b) in prev.iter().zip(cur) {
        d += (a as f64 - b as f64).abs();
        p += (a as f64).abs();
    }
    d / p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> CacheConfig {
        CacheConfig { warmup: 2, threshold: 0.5, ..CacheConfig::defaults(Method::FbCache) }
    }

    #[test]
    fn warmup_then_threshold() {
        let mut b = Branch::new(cfg());
        for step in 0..2 {
            b.begin(step);
            assert!(!b.can_cache(step, true, || panic!("no measure in the warm-up")).unwrap());
        }
        b.begin(2);
        assert!(!b.can_cache(2, false, || panic!("nothing to compare with")).unwrap());
        assert!(b.can_cache(2, true, || Ok(0.4)).unwrap());
        assert!(!b.can_cache(2, true, || Ok(0.5)).unwrap());
        assert_eq!(b.diffs, vec![(2, 0.4), (2, 0.5)]);
    }

    #[test]
    fn limits_count_cached_steps() {
        let mut b = Branch::new(CacheConfig { max_cached: Some(2), max_continuous: Some(1), ..cfg() });
        let mut served = vec![];
        for step in 2..10 {
            b.begin(step);
            if b.can_cache(step, true, || Ok(0.1)).unwrap() {
                b.mark_cached(step);
                served.push(step);
            }
        }
        assert_eq!(served, vec![2, 4], "one in a row, two in all");
    }

    #[test]
    fn thresholds_at_the_ends() {
        let mut b = Branch::new(CacheConfig { threshold: 1.0, ..cfg() });
        assert!(b.can_cache(3, true, || panic!("not measured at >= 1")).unwrap());
        let mut b = Branch::new(CacheConfig { threshold: 0.0, ..cfg() });
        assert!(!b.can_cache(3, true, || panic!("not measured at <= 0")).unwrap());
    }

    #[test]
    fn configs_are_checked() {
        assert!(CacheConfig::defaults(Method::DbCache).check(42).is_ok());
        assert!(CacheConfig::defaults(Method::DbCache).check(4).is_err());
        assert!(CacheConfig { fn_blocks: 0, ..cfg() }.check(4).is_err());
        assert!(CacheConfig { bn_blocks: 1, ..cfg() }.check(4).is_err());
        assert!(CacheConfig { taylor_order: 1, ..cfg() }.check(4).is_err());
        assert!("dbcache".parse::<Method>().is_ok());
        assert!("cache-dit".parse::<Method>().unwrap_err().contains("taylorseer"));
    }
}

//! The DiT forward with step caching ([`crate::cache`]): the main-block loop consults one pass's
//! [`BlockCache`] between the first `F` blocks and the middle ones.
//!
//! `X_0` the joint stream after the embedders; the first blocks give `X_F`, and
//! `R = X_F − X_0` goes to the cache. Served from the cache: `X ← X_F + M` (the cached middle
//! residual), the middle blocks do not run. Otherwise they run and `M = X_{N−B} − X_F` is kept.
//! The last `B` blocks and the head always run. Skipped layers (`skip`) are identities wherever
//! they fall. The blocks' norms fused across a block boundary are redone at the jump (the first
//! last-`B` block's norm1 from `X`).

use super::{Dit, PassRun, TextCond};
use crate::backend::ops::DitOps;
use crate::cache::{store::sub, BlockCache, CacheConfig};
use crate::sampling::Step;
use anyhow::Result;

/// One picture's caches: the prompt's pass and the negative's each keep their own.
pub struct PassCaches<B: DitOps> {
    pub cond: BlockCache<B>,
    pub uncond: BlockCache<B>,
}

impl<B: DitOps> PassCaches<B> {
    pub fn new(cfg: CacheConfig) -> Self {
        PassCaches { cond: BlockCache::new(cfg), uncond: BlockCache::new(cfg) }
    }
}

impl<B: DitOps> Dit<B> {
    /// [`Dit::velocity`] with `cache` (this pass's own) at cache step `step` (the model call's
    /// index: cache-dit counts transformer calls).
    #[allow(clippy::too_many_arguments)]
    pub fn velocity_cached(&self, b: &B, x: &B::T, t: f32, text: &super::TextCond<B>, skip: &[usize], cache: &mut BlockCache<B>, step: usize) -> Result<B::T> {
        let n = self.layers.len();
        cache.cfg.check(n)?;
        let (f, tail) = (cache.cfg.fn_blocks, n - cache.cfg.bn_blocks);
        let mut r = self.begin(b, x, t, text, skip)?;
        let active = r.active.clone();
        let x0 = r.xs.clone().expect("the stream is there before the blocks");
        self.run_blocks(b, &mut r, active.iter().copied().filter(|&i| i < f))?;
        let xf = r.xs.clone().expect("the stream is there after the first blocks");
        let middle: Vec<usize> = active.iter().copied().filter(|&i| i >= f && i < tail).collect();
        match cache.decide(b, step, sub(b, &xf, &x0)?)? {
            Some(m) => {
                let xs = b.add(&xf, &m)?;
                // The norm the last middle block would have fused: the next running block's.
                r.y = match active.iter().find(|&&i| i >= tail) {
                    Some(&k) => Some(self.linears.rms_norm_modulate(b, &xs, &self.layers[k].norm1, &r.m.shift_attn, &r.m.scale_attn, self.cfg.eps)?),
                    None => None,
                };
                r.xs = Some(xs);
                cache.blocks_skipped += middle.len();
            }
            None => {
                self.run_blocks(b, &mut r, middle.iter().copied())?;
                let xm = r.xs.as_ref().expect("the stream is there after the middle blocks");
                cache.computed_middle(b, sub(b, xm, &xf)?)?;
                cache.blocks_run += middle.len();
            }
        }
        let last = active.iter().filter(|&&i| i < f || i >= tail).count();
        cache.blocks_run += last;
        self.run_blocks(b, &mut r, active.iter().copied().filter(|&i| i >= tail))?;
        self.head(b, r)
    }

    /// A loop step's passes with their caches, the shape of the sampling loop's `velocities`:
    /// `v_c` from `cond`, and `v_u` from `uncond` when `step.guided`, at cache step `step.call`.
    pub fn velocities_cached(
        &self,
        b: &B,
        x: &B::T,
        step: &Step,
        cond: (&TextCond<B>, &[usize]),
        uncond: Option<(&TextCond<B>, &[usize])>,
        caches: &mut PassCaches<B>,
    ) -> Result<(B::T, Option<B::T>)> {
        let v_c = self.velocity_cached(b, x, step.t, cond.0, cond.1, &mut caches.cond, step.call)?;
        let v_u = match uncond.filter(|_| step.guided) {
            Some((text, skip)) => Some(self.velocity_cached(b, x, step.t, text, skip, &mut caches.uncond, step.call)?),
            None => None,
        };
        Ok((v_c, v_u))
    }

    /// Run `blocks` (ones the pass runs, in order) on the pass's stream.
    fn run_blocks(&self, b: &B, r: &mut PassRun<'_, B>, blocks: impl Iterator<Item = usize>) -> Result<()> {
        for i in blocks {
            let mats = self.block_weights(b, i)?;
            self.advance(b, r, i, &mats)?;
            mats.done(b)?;
        }
        Ok(())
    }
}

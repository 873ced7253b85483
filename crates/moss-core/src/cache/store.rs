//! A pass's cache on the backend: the decision state ([`Branch`]) with the tensors cache-dit keeps
//! (`Fn_residual` and `Bn_residual` buffers, or the TaylorSeer state). The stream arithmetic uses
//! the DiT's own `gated_residual` (`x + y·g`, `g` a `[D]` vector): `g = −1` subtracts, a constant
//! `g` scales; the residual difference is measured on the host ([`super::rel_l1`]; on a GPU this
//! downloads both residuals, a reduction kernel would not).

use super::taylor::Taylor;
use super::{rel_l1, Branch, CacheConfig};
use crate::backend::ops::DitOps;
use crate::tensor::Tensor;
use anyhow::Result;

/// One pass's cache (the prompt's or the negative's): give each its own.
pub struct BlockCache<B: DitOps> {
    pub cfg: CacheConfig,
    pub branch: Branch,
    /// The first blocks' residual of the last full step.
    fn_residual: Option<B::T>,
    /// The middle blocks' residual of the last full step (DBCache, FBCache).
    mn_residual: Option<B::T>,
    taylor: Option<Taylor<B>>,
    /// Forwards run in full and served from the cache, and main blocks run and skipped.
    pub computed: usize,
    pub served: usize,
    pub blocks_run: usize,
    pub blocks_skipped: usize,
}

impl<B: DitOps> BlockCache<B> {
    pub fn new(cfg: CacheConfig) -> Self {
        BlockCache {
            cfg,
            branch: Branch::new(cfg),
            fn_residual: None,
            mn_residual: None,
            taylor: (cfg.taylor_order > 0).then(|| Taylor::new(cfg.taylor_order)),
            computed: 0,
            served: 0,
            blocks_run: 0,
            blocks_skipped: 0,
        }
    }

    /// After the first blocks of step `step`: `r` their residual. Returns the middle blocks'
    /// cached residual when the step is served from the cache (and records it), else None (the
    /// caller runs the middle blocks, then [`BlockCache::computed_middle`]).
    pub fn decide(&mut self, b: &B, step: usize, r: B::T) -> Result<Option<B::T>> {
        self.branch.begin(step);
        if let Some(t) = &mut self.taylor {
            t.begin_step();
        }
        let prev = self.fn_residual.as_ref();
        let diff = || -> Result<f64> {
            let p = b.download(prev.expect("measured only with a stored residual"))?;
            Ok(rel_l1(&p.data, &b.download(&r)?.data))
        };
        if self.branch.can_cache(step, prev.is_some(), diff)? {
            self.branch.mark_cached(step);
            self.served += 1;
            let m = match &self.taylor {
                Some(t) => t.approximate(b)?,
                None => self.mn_residual.clone().expect("a full step stored the middle residual"),
            };
            return Ok(Some(m));
        }
        self.computed += 1;
        self.fn_residual = Some(r);
        Ok(None)
    }

    /// The middle blocks ran: `m` is their residual.
    pub fn computed_middle(&mut self, b: &B, m: B::T) -> Result<()> {
        match &mut self.taylor {
            Some(t) => t.update(b, m),
            None => {
                self.mn_residual = Some(m);
                Ok(())
            }
        }
    }
}

/// `x + y·c` with `c` a constant, through the DiT's gated residual (`x`, `y`: `[N, D]`).
pub(super) fn axpy<B: DitOps>(b: &B, x: &B::T, y: &B::T, c: f32) -> Result<B::T> {
    let d = *b.dims(x).last().expect("a stream has a width");
    b.gated_residual(x, y, &b.upload(&Tensor::new(vec![d], vec![c; d])?)?)
}

/// `x − y`
pub fn sub<B: DitOps>(b: &B, x: &B::T, y: &B::T) -> Result<B::T> {
    axpy(b, x, y, -1.0)
}

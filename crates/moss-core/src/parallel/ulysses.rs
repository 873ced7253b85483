//! Ulysses sequence parallelism (DeepSpeed-Ulysses, as xDiT and SGLang run it for DiTs): the
//! joint stream's `N` tokens are split into `P` contiguous slices, one a rank ([`rows`]). Every op
//! of a DiT block but attention works row by row, so it runs on the slice as it would on the whole.
//! Attention ([`attention`]) needs every token: an all-to-all sends each rank's rows of head group
//! `j` (heads `j·H/P ..`, their q, k and v columns) to rank `j`, which then holds whole sequences of
//! its `H/P` heads, runs attention on them, and a second all-to-all returns each rank its rows of
//! every head group. The head's output rows are gathered at the end ([`gather_rows`]).
//!
//! What changes numerically: the per-row and per-head arithmetic is the same, but every product
//! runs on `N/P` rows (and attention on `H/P` heads). The CPU backend computes each row and head
//! on its own, so its result is the one rank's to the bit; a GPU library may choose another
//! algorithm (or split of K) for a product with fewer rows, which changes its rounding (see
//! docs/DEVELOPERS.md, "One picture on several GPUs").

use super::Transport;
use crate::backend::ops::DitOps;
use anyhow::{ensure, Result};
use std::ops::Range;

/// The rows of `n` that rank `r` of `p` holds: an even split, the first `n % p` ranks one more.
pub fn rows(n: usize, p: usize, r: usize) -> Range<usize> {
    let (base, extra) = (n / p, n % p);
    let start = r * base + r.min(extra);
    start..start + base + usize::from(r < extra)
}

/// Attention over the whole sequence of `tokens` for this rank's slice `qkv [n_r, 3·H·hd]`
/// (packed `[q | k | v]`, q and k normed and rotated) → `[n_r, H·hd]`, the rows
/// [`crate::backend::ops::DitOps::attention_packed`] gives over all tokens.
pub fn attention<B: DitOps>(b: &B, seq: &dyn Transport<B>, qkv: &B::T, heads: usize, tokens: usize, scale: f64) -> Result<B::T> {
    let (p, me) = (seq.ranks(), seq.rank());
    let dims = b.dims(qkv);
    ensure!(dims.len() == 2 && dims[1] % 3 == 0, "Ulysses attention takes a packed [n, 3·D], got {dims:?}");
    ensure!(heads.is_multiple_of(p), "{heads} heads over {p} ranks");
    let (d, mine) = (dims[1] / 3, rows(tokens, p, me));
    ensure!(dims[0] == mine.len(), "rank {me} holds {} rows, its slice of {tokens} is {}", dims[0], mine.len());
    let dp = d / p;
    // Head group j of this rank's rows, packed as attention takes it: [q_j | k_j | v_j].
    let group = |j: usize| -> Result<B::T> {
        let part = |k: usize| b.narrow(qkv, 1, k * d + j * dp, dp);
        b.cat(&[&part(0)?, &part(1)?, &part(2)?], 1)
    };
    let parts = (0..p).map(group).collect::<Result<Vec<_>>>()?;
    let shapes: Vec<Vec<usize>> = (0..p).map(|r| vec![rows(tokens, p, r).len(), 3 * dp]).collect();
    let got = seq.all_to_all(b, parts, &shapes)?;
    let whole = b.cat(&got.iter().collect::<Vec<_>>(), 0)?;
    drop(got);
    let o = b.attention_packed(&whole, heads / p, scale)?;
    drop(whole);
    let back = (0..p).map(|r| rows(tokens, p, r)).map(|s| b.narrow(&o, 0, s.start, s.len())).collect::<Result<Vec<_>>>()?;
    drop(o);
    let mine = seq.all_to_all(b, back, &vec![vec![mine.len(), dp]; p])?;
    b.cat(&mine.iter().collect::<Vec<_>>(), 1)
}

/// Every rank's rows of a row-wise result `x [n_r, C]` (rank order: the joint stream's order),
/// the first `keep` of them: `[keep, C]`, the same on every rank.
pub fn gather_rows<B: DitOps>(b: &B, seq: &dyn Transport<B>, x: &B::T, tokens: usize, keep: usize) -> Result<B::T> {
    let p = seq.ranks();
    let c = *b.dims(x).last().unwrap_or(&1);
    let shapes: Vec<Vec<usize>> = (0..p).map(|r| vec![rows(tokens, p, r).len(), c]).collect();
    let all = seq.all_gather(b, x, &shapes)?;
    b.narrow(&b.cat(&all.iter().collect::<Vec<_>>(), 0)?, 0, 0, keep)
}

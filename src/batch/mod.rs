//! Batch rendering (`moss generate --prompts FILE`): many pictures from one invocation, each
//! network loaded once per chunk.
//!
//! **The list.** One item per non-blank line (blank lines are not items). A line whose first
//! non-blank character is `{` is a JSON object with any of `prompt` (required), `negative`,
//! `seed`, `size` ("WxH"), `steps`, `guidance` and `out`; any other line is a prompt, its outer
//! whitespace trimmed. A JSON `null` means "not set". The flags give the defaults; a line's
//! fields override them. A line that cannot be used (invalid JSON or UTF-8, an unknown field, a
//! bad size or number) is reported with its line number and skipped; it still takes its index,
//! so fixing it later changes no other item's seed or name.
//!
//! **Index and seed.** An item's index is its position among the items of the file, from 0.
//! Its seed is its line's `seed`, else `--seed + index` (wrapping at 2^64): it depends on the
//! file only, not on sharding, skipping or chunking, so a picture is the same however the list
//! is split, and the same as `moss generate --prompt ... --seed <that seed>` renders it.
//!
//! **Names.** `--out-dir DIR` joined with the item's `out` (else `--name`), a template over
//! `{index}`, `{line}` (1-based line number), `{seed}`, `{shard}` (index % N) and `{stem}` (the
//! prompt as a file-name-safe slug); `{index:05}` zero-pads a number to 5 digits, `{stem:20}`
//! keeps at most 20 characters (40 by default); `{{` and `}}` are literal braces. A list is
//! untrusted input: an item's `out` may not leave `--out-dir` (`..`), an absolute `out` needs
//! `--allow-absolute-out`, and no output may be the list or a checkpoint file. Two items that would
//! write the same file (however spelt): the later one fails.
//!
//! **Shards.** `--shard K/N` (0 <= K < N) renders the items with `index % N == K`; the N shards
//! together render every item exactly once with no coordination. Bad lines are reported (and
//! fail) only in the shard that owns their index.
//!
//! **Stages.** The items to render are cut into chunks; per chunk the encoder is loaded, every
//! distinct text of the chunk encoded, the encoder freed, then the DiT loaded and every item
//! denoised, the DiT freed, then the VAE loaded and every item decoded and written (atomically,
//! with the same PNG metadata as a single `moss generate`). On the CPU a chunk is one picture
//! (written as soon as it is decoded); on CUDA its size follows from free memory ([`chunk_budget_bytes`]); `--chunk N` caps it.
//!
//! **Stopping.** SIGINT (Ctrl-C) or SIGTERM stops the run after the current denoising step (or
//! between two prompts or pictures of the other stages); files already written stay, no partial
//! file is left, and moss exits with 128 + the signal number. A second signal kills at once.

mod list;
mod names;
mod plan;
mod run;
mod stages;
mod stop;
#[cfg(test)]
mod tests;

pub use crate::spec::PictureSpec;
pub use list::*;
pub use names::*;
pub use plan::*;
pub use run::*;
use stages::*;
pub use stop::*;

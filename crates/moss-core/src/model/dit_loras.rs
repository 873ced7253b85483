//! Changing the LoRA updates of a loaded DiT (`moss serve`'s per-request LoRAs): every weight some
//! adapter of the old set or the new one updates is loaded again from the checkpoint through the
//! same loaders [`Dit::load`] uses, now with the new set's updates merged in. The base weights are
//! restored by reading them again (never by subtracting a delta), so the weights after a change
//! are, bit for bit, those a fresh load with the new set gives, and a set dropped leaves the
//! checkpoint's own weights. Streamed blocks merge at each fetch: their streamer is made again
//! over the new component.

use super::{Block, Dit, Linear, RefinerBlock};
use crate::backend::ops::DitOps;
use crate::checkpoint::Component;
use anyhow::Result;
use std::collections::BTreeSet;

/// What a change loaded again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// Weights outside the main blocks (a linear with its bias, a refiner block, a norm).
    pub parts: usize,
    /// Resident main blocks (their norms and matrices).
    pub blocks: usize,
    /// Streamed main blocks (their norms now; their matrices merge at each fetch).
    pub streamed: usize,
}

impl<B: DitOps> Dit<B> {
    /// Give the weights `c`'s LoRA updates (`c`: the transformer, its plan the new set), where
    /// `touched` (full tensor names) holds every tensor the old set or the new one updates. On an
    /// error the DiT may hold neither set: load it again.
    pub fn set_loras(&mut self, b: &B, c: Component, touched: &BTreeSet<String>) -> Result<Reloaded> {
        let mut n = Reloaded::default();
        let resident = self.resident_blocks();
        b.load_batch(|b| self.reload(b, &c, touched, &mut n))?;
        if self.stream.is_some() {
            self.stream = None;
            self.stream = self.streamer(c, resident);
        }
        Ok(n)
    }

    fn reload(&mut self, b: &B, c: &Component, touched: &BTreeSet<String>, n: &mut Reloaded) -> Result<()> {
        let hit = |name: &str| touched.contains(name);
        let under = |prefix: &str| touched.range(prefix.to_string()..).next().is_some_and(|t| t.starts_with(prefix));
        let mut tensor = |t: &mut B::T, name: &str| -> Result<()> {
            if hit(name) {
                *t = b.load(c, name)?;
                n.parts += 1;
            }
            Ok(())
        };
        tensor(&mut self.final_norm_video, "final_norm_video.weight")?;
        tensor(&mut self.final_linear_video, "final_linear_video.weight")?;
        let linears = [
            (&mut self.video_embedder, "video_embedder"),
            (&mut self.text_proj, "text_embedder.proj"),
            (&mut self.time_embedding_0, "time_embedding.0"),
            (&mut self.time_embedding_2, "time_embedding.2"),
            (&mut self.shared_block_modulation, "shared_block_modulation"),
            (&mut self.video_head_modulation, "video_head_modulation"),
        ];
        for (l, p) in linears {
            if hit(&format!("{p}.weight")) || hit(&format!("{p}.bias")) {
                *l = Linear::load(b, c, p, l.bias.is_some())?;
                n.parts += 1;
            }
        }
        for (i, r) in self.refiner.iter_mut().enumerate() {
            if under(&format!("text_embedder.blocks.{i}.")) {
                *r = RefinerBlock::load(b, c, i)?;
                n.parts += 1;
            }
        }
        for (i, blk) in self.layers.iter_mut().enumerate() {
            if !under(&format!("layers.{i}.")) {
                continue;
            }
            let resident = blk.mats.is_some();
            // The old matrices go first: a resident block is never held twice.
            blk.mats = None;
            *blk = Block::load(b, c, i, resident, self.linears)?;
            if resident {
                n.blocks += 1;
            } else {
                n.streamed += 1;
            }
        }
        Ok(())
    }
}

//! Quantized matrices kept as stored on the GPU ([`moss_core::checkpoint::kept`]): loaded (and
//! streamed) as their bytes, one [`DType::Q`] tensor a stack, and dequantized by
//! `cuda/dit/dequant.cu` into a scratch matrix of the activation dtype right before each product
//! ([`Cuda::dense`]). The scratch is a stream-ordered allocation freed as soon as the product is
//! enqueued, so the pool holds one dequantized matrix at a time (the planner counts the largest,
//! `moss_core::plan::run::dequant_scratch`).

use super::mover::Piece;
use super::{Buf, Cuda, CudaTensor, DType};
use crate::kernels::{self, Dev, Elem, Family};
use crate::launch::DIT_DEQ_THREADS;
use anyhow::{ensure, Result};
use cudarc::driver::result as dr;
use moss_core::checkpoint::ggml::GgmlType;
use moss_core::checkpoint::kept::{Format, Layout, Part};
use moss_core::checkpoint::{Component, TensorInfo};
use std::borrow::Cow;
use std::sync::Arc;

/// The dequantize kernel family of a ggml block type.
pub fn ggml_family(t: GgmlType) -> &'static Family<fn(Dev, Dev, i64)> {
    match t {
        GgmlType::Q4_0 => &kernels::DEQUANT_Q4_0,
        GgmlType::Q4_1 => &kernels::DEQUANT_Q4_1,
        GgmlType::Q5_0 => &kernels::DEQUANT_Q5_0,
        GgmlType::Q5_1 => &kernels::DEQUANT_Q5_1,
        GgmlType::Q8_0 => &kernels::DEQUANT_Q8_0,
        GgmlType::Q4_K => &kernels::DEQUANT_Q4_K,
        GgmlType::Q5_K => &kernels::DEQUANT_Q5_K,
        GgmlType::Q6_K => &kernels::DEQUANT_Q6_K,
    }
}

impl CudaTensor {
    /// A kept quantized matrix's layout.
    pub fn layout(&self) -> Option<&Layout> {
        self.kept.as_deref()
    }
}

impl Cuda {
    /// The stack of `infos` (checkpoint tensors of `c`) kept as `layout` says: its bytes recorded
    /// into this view's load batch (or one of its own), placed in slot memory when fetched.
    pub(super) fn load_kept(&self, c: &Component, infos: &[&TensorInfo], layout: Layout) -> Result<CudaTensor> {
        let pieces = layout.pieces(c, infos)?;
        let own = self.batch.is_none();
        let view = if own { self.batch_view(None) } else { self.clone() };
        let out = {
            let mut g = view.batch.as_ref().unwrap().lock().unwrap_or_else(|e| e.into_inner());
            let (mem, ptr) = view.weight_mem(Some(&mut g), layout.bytes)?;
            for (src, at) in pieces {
                g.pieces.push(Piece { src: src.as_ptr(), len: src.len(), dst: ptr + at as u64 });
            }
            let shape = vec![layout.rows(), layout.k];
            CudaTensor { buf: Arc::new(Buf { mem, ptr, bytes: layout.bytes }), shape, dtype: DType::Q, kept: Some(Arc::new(layout)) }
        };
        if own {
            view.settle()?;
        }
        Ok(out)
    }

    /// A kept matrix from its packed bytes on the host (`moss check`'s gates).
    pub fn upload_kept(&self, layout: &Layout, bytes: &[u8]) -> Result<CudaTensor> {
        ensure!(bytes.len() == layout.bytes, "{} bytes for a layout of {}", bytes.len(), layout.bytes);
        let mut t = self.alloc(DType::Q, &[layout.bytes])?;
        self.write_bytes(t.ptr(), bytes)?;
        t.shape = vec![layout.rows(), layout.k];
        t.kept = Some(Arc::new(layout.clone()));
        Ok(t)
    }

    /// `w` as a dense matrix of the activation dtype: itself, or (kept quantized) dequantized
    /// into a new scratch matrix.
    pub fn dense<'a>(&self, w: &'a CudaTensor) -> Result<Cow<'a, CudaTensor>> {
        if w.kept.is_none() {
            return Ok(Cow::Borrowed(w));
        }
        let dt = self.act_dtype();
        Ok(Cow::Owned(self.prof("dequantize", || self.dequantize(w, dt))?))
    }

    /// The values of the kept matrix `w` as a `[rows, k]` matrix of `dtype` (bf16 or f32).
    pub fn dequantize(&self, w: &CudaTensor, dtype: DType) -> Result<CudaTensor> {
        let layout = w.layout().ok_or_else(|| anyhow::anyhow!("dequantize: {w:?} is not a quantized matrix"))?;
        ensure!(matches!(dtype, DType::BF16 | DType::F32), "dequantize into {}", dtype.name());
        self.settle()?;
        let out = self.alloc(dtype, &w.shape)?;
        let mut row0 = 0;
        for p in &layout.parts {
            self.dequantize_rows(w, p, 0, p.rows, Dev::new(out.ptr() + (row0 * layout.k * dtype.size()) as u64, dtype))?;
            row0 += p.rows;
        }
        Ok(out)
    }

    /// Rows `r0 .. r0 + rows` of part `p` of the kept matrix `w` into `out` (`rows · k` values).
    fn dequantize_rows(&self, w: &CudaTensor, p: &Part, r0: usize, rows: usize, out: Dev) -> Result<()> {
        let k = w.layout().expect("kept").k;
        let n = rows * k;
        if n == 0 {
            return Ok(());
        }
        let data = w.ptr() + (p.data + p.format.data_bytes(r0, k)) as u64;
        let scales = || Dev::new(w.ptr() + (p.scales.expect("int8 and W4A8 parts have scales") + 4 * r0) as u64, Elem::F32);
        // a group of g rotated values: one tile of the rotation kernels a step
        let rot = |g: usize| {
            let tiles = n.div_ceil(g.max(crate::launch::DIT_DEQ_ROT_TILE)) as u32;
            let cfg = (tiles.clamp(1, self.sm_count() as u32 * 8), DIT_DEQ_THREADS as u32, 0);
            (cfg, g.trailing_zeros().is_multiple_of(2) as i32, 1.0 / (g as f64).sqrt())
        };
        let blocks = |work: usize| self.grid_for(work);
        match p.format {
            Format::Ggml(t) => ggml_family(t).launch(self, (blocks(n / 8), DIT_DEQ_THREADS as u32, 0), out, Dev::new(data, Elem::U8), n as i64),
            Format::Int8 { convrot: None } => {
                kernels::DEQUANT_INT8.launch(self, (blocks(n), DIT_DEQ_THREADS as u32, 0), out, Dev::new(data, Elem::U8), scales(), rows as i64, k as i64)
            }
            Format::Int8 { convrot: Some(g) } => {
                let (cfg, radix4, norm) = rot(g);
                kernels::DEQUANT_INT8_ROT.launch(self, cfg, out, Dev::new(data, Elem::U8), scales(), rows as i64, k as i64, g as i32, radix4, norm)
            }
            Format::W4a8 { bits, group, convrot, f32_scales } => {
                let (cfg, radix4, norm) = rot(convrot);
                let s_rel = Dev::new(w.ptr() + (p.group_scales.expect("W4A8 parts have group scales") + p.format.group_scale_bytes(r0, k)) as u64, Elem::U8);
                let levels = Dev::new(w.ptr() + p.levels.expect("W4A8 parts have levels") as u64, Elem::F32);
                let (d, b, gr, f) = (Dev::new(data, Elem::U8), bits as i32, group as i32, f32_scales as i32);
                kernels::DEQUANT_W4A8.launch(self, cfg, out, d, scales(), s_rel, levels, rows as i64, k as i64, b, gr, f, convrot as i32, radix4, norm)
            }
            Format::BF16 | Format::F32 => {
                let from = if p.format == Format::BF16 { DType::BF16 } else { DType::F32 };
                if Elem::from(from) == out.elem {
                    let s = &self.inner.gpu.stream;
                    // SAFETY: both ranges lie inside their allocations (n values of one dtype), on the compute stream.
                    unsafe { dr::memcpy_dtod_async(out.ptr, data, n * from.size(), s.cu_stream()) }.map_err(|e| anyhow::anyhow!("CUDA copy: {e:?}"))
                } else {
                    kernels::CAST.launch(self, (self.grid_for(n / 8 + 1), 256, 0), out, Dev::new(data, from), n as i64)
                }
            }
        }
    }

    /// Rows `ids` of the kept table `table` (`embed` of a quantized embedding table), dequantized
    /// row by row into `[ids.len(), k]` of the activation dtype.
    pub(crate) fn embed_kept(&self, table: &CudaTensor, ids: &[u32]) -> Result<CudaTensor> {
        let layout = table.layout().expect("kept");
        let dt = self.act_dtype();
        self.settle()?;
        let out = self.alloc(dt, &[ids.len(), layout.k])?;
        for (j, &id) in ids.iter().enumerate() {
            let mut r = id as usize;
            ensure!(r < layout.rows(), "token id {id} is outside the embedding table of {}", layout.rows());
            let p = layout.parts.iter().find(|p| {
                let here = r < p.rows;
                if !here {
                    r -= p.rows;
                }
                here
            });
            let p = p.expect("a row below the table's rows is in a part");
            self.dequantize_rows(table, p, r, 1, Dev::new(out.ptr() + (j * layout.k * dt.size()) as u64, dt))?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    /// The kernel's shared-memory tile is the largest group moss-core lets the GPU keep.
    #[test]
    fn the_rotation_tile_holds_the_largest_kept_group() {
        assert_eq!(crate::launch::DIT_DEQ_ROT_TILE, moss_core::checkpoint::kept::MAX_CONVROT_GROUP);
    }
}

//! The generic tensor ops on `cuda/common/tensor_ops.cu` (casts, elementwise, RMSNorm, strided
//! copies for narrow / cat / permute) and cuBLASLt `linear`.

use super::{Cuda, CudaTensor, DType, PermArgs};
use crate::kernels::{self, Dev, Elem, Family};
use anyhow::{bail, ensure, Result};

/// The broadcast elementwise kernels' parameter list (`moss_add_*`, `moss_mul_*`).
pub(crate) type Binary = Family<fn(Dev, Dev, Dev, i64, i64, i32)>;

impl Cuda {
    /// `x` in `dtype` (shares the buffer when it already is).
    pub fn cast(&self, x: &CudaTensor, dtype: DType) -> Result<CudaTensor> {
        if x.dtype == dtype {
            return Ok(x.clone());
        }
        let out = self.alloc(dtype, &x.shape)?;
        let n = x.numel();
        kernels::CAST.launch(self, (self.grid_for(n / 8 + 1), 256, 0), &out, x, n as i64)?;
        Ok(out)
    }

    /// [`moss_core::backend::Backend::linear`]: `x · wᵀ (+ b)` in the weight's dtype (cuBLASLt).
    pub(crate) fn linear_dense(&self, x: &CudaTensor, w: &CudaTensor, b: Option<&CudaTensor>) -> Result<CudaTensor> {
        self.linear_dense_into(x, w, b, w.dtype)
    }

    /// [`Cuda::linear_dense`] with the product (and the bias) in `out_dtype`: the fp32 product
    /// rounded once into it (f32: not rounded to the weight's dtype).
    pub(crate) fn linear_dense_into(&self, x: &CudaTensor, w: &CudaTensor, b: Option<&CudaTensor>, out_dtype: DType) -> Result<CudaTensor> {
        ensure!(w.shape.len() == 2, "linear: weight must be 2-D, got {:?}", w.shape);
        self.settle()?;
        let (n, k) = (w.shape[0], w.shape[1]);
        ensure!(x.last_dim() == k, "linear: input {:?} does not match weight {:?}", x.shape, w.shape);
        if let Some(b) = b {
            ensure!(b.numel() == n, "linear: bias {:?} for {n} outputs", b.shape);
        }
        let dt = w.dtype;
        let x = self.cast(x, dt)?;
        let b = b.map(|b| self.cast(b, out_dtype)).transpose()?;
        let mut shape = x.shape.clone();
        *shape.last_mut().unwrap() = n;
        let out = self.alloc(out_dtype, &shape)?;
        let rows = x.rows();
        if rows > 0 && n > 0 {
            self.inner.blas.linear(&self.inner.gpu.stream, (dt, out_dtype), rows, n, k, x.ptr(), w.ptr(), b.as_ref().map(|b| b.ptr()), out.ptr())?;
        }
        Ok(out)
    }

    /// `a (op) b` with `b` broadcast over `a`'s leading dims: [`kernels::ADD`] or [`kernels::MUL`].
    pub(crate) fn binary(&self, kernel: &Binary, op: &str, a: &CudaTensor, b: &CudaTensor) -> Result<CudaTensor> {
        ensure!(a.shape.ends_with(&b.shape) && b.numel() > 0, "{op}: cannot broadcast {:?} onto {:?}", b.shape, a.shape);
        let out = self.alloc(a.dtype, &a.shape)?;
        let (n, nb) = (a.numel(), b.numel());
        let vec = n % 8 == 0 && nb % 8 == 0;
        let work = if vec { n / 8 } else { n };
        kernel.launch(self, (self.grid_for(work), 256, 0), &out, a, b, n as i64, nb as i64, vec as i32)?;
        Ok(out)
    }

    /// An elementwise function: [`kernels::SILU`] or [`kernels::SIGMOID`].
    pub(crate) fn unary(&self, kernel: &Family<fn(Dev, Dev, i64)>, x: &CudaTensor) -> Result<CudaTensor> {
        let out = self.alloc(x.dtype, &x.shape)?;
        let n = x.numel();
        kernel.launch(self, (self.grid_for(n / 8 + 1), 256, 0), &out, x, n as i64)?;
        Ok(out)
    }

    /// [`moss_core::backend::Backend::rms_norm`] (a warp a row, 8 rows a block).
    pub(crate) fn rms_norm_rows(&self, x: &CudaTensor, w: Option<&CudaTensor>, eps: f64, one_plus: bool) -> Result<CudaTensor> {
        let d = x.last_dim();
        if let Some(w) = w {
            ensure!(w.numel() == d, "rms_norm: weight {:?} for width {d}", w.shape);
        }
        ensure!(d > 0 && d < i32::MAX as usize, "rms_norm: width {d}");
        let out = self.alloc(x.dtype, &x.shape)?;
        let rows = x.rows();
        // without a weight: the variant of x's dtype, a null pointer
        let w = w.map_or(Dev::null(x.dtype), Dev::from);
        let warps = 8;
        let cfg = (rows.div_ceil(warps) as u32, (warps * 32) as u32, 0);
        kernels::RMS_NORM.launch(self, cfg, &out, x, w, rows as i64, d as i32, eps as f32, one_plus as i32)?;
        Ok(out)
    }

    /// Strided 2-D copy between tensors of one dtype, in elements (see `moss_copy2d_*`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn copy2d(
        &self,
        dst: &CudaTensor,
        src: &CudaTensor,
        rows: usize,
        width: usize,
        src_stride: usize,
        src_off: usize,
        dst_stride: usize,
        dst_off: usize,
    ) -> Result<()> {
        if rows == 0 || width == 0 {
            return Ok(());
        }
        let es = src.dtype.size();
        let all = [width, src_stride, src_off, dst_stride, dst_off].map(|v| v * es);
        let unit = [16usize, 8, 4, 2].into_iter().find(|u| all.iter().all(|v| v % u == 0)).unwrap_or(2);
        let [w, ss, so, ds, dof] = all.map(|v| (v / unit) as i64);
        let e = Elem::unit(unit)?;
        let cfg = (self.grid_for(rows * w as usize), 256, 0);
        kernels::COPY2D.launch(self, cfg, Dev::new(dst.ptr(), e), Dev::new(src.ptr(), e), rows as i64, w, ss, so, ds, dof)
    }

    /// [`moss_core::backend::Backend::cat`]: a strided copy per input.
    pub(crate) fn cat_copies(&self, xs: &[&CudaTensor], dim: usize) -> Result<CudaTensor> {
        let Some(first) = xs.first() else { bail!("cat of nothing") };
        let mut shape = first.shape.clone();
        ensure!(dim < shape.len(), "cat: dim {dim} of {:?}", shape);
        for x in &xs[1..] {
            ensure!(
                x.shape.len() == shape.len() && x.shape.iter().enumerate().all(|(i, &s)| i == dim || s == shape[i]),
                "cat: {:?} and {:?}",
                first.shape,
                x.shape
            );
            ensure!(x.dtype == first.dtype, "cat: {:?} and {:?} tensors", first.dtype, x.dtype);
        }
        shape[dim] = xs.iter().map(|x| x.shape[dim]).sum();
        let out = self.alloc(first.dtype, &shape)?;
        let outer: usize = shape[..dim].iter().product();
        let inner: usize = shape[dim + 1..].iter().product();
        let total = shape[dim] * inner;
        let mut off = 0;
        for x in xs {
            let w = x.shape[dim] * inner;
            self.copy2d(&out, x, outer, w, w, 0, total, off)?;
            off += w;
        }
        Ok(out)
    }

    /// [`moss_core::backend::Backend::permute`].
    pub(crate) fn permute_copy(&self, x: &CudaTensor, perm: &[usize]) -> Result<CudaTensor> {
        let nd = x.shape.len();
        ensure!(perm.len() == nd && (0..nd).all(|i| perm.contains(&i)), "permute {perm:?} of {:?}", x.shape);
        ensure!(nd <= 6, "permute: at most 6 dims, got {nd}");
        let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
        let out = self.alloc(x.dtype, &shape)?;
        if x.numel() == 0 {
            return Ok(out);
        }
        // Units: a last dim that stays last moves as whole 16/8/4-byte pieces where it can.
        let es = x.dtype.size();
        let mut dims = x.shape.clone();
        let mut unit = es;
        if nd > 0 && perm[nd - 1] == nd - 1 {
            let row = dims[nd - 1] * es;
            if let Some(u) = [16usize, 8, 4].into_iter().find(|u| row.is_multiple_of(*u) && *u >= es) {
                unit = u;
                dims[nd - 1] = row / u;
            }
        }
        let mut strides = vec![1i64; nd];
        for i in (0..nd.saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * dims[i + 1] as i64;
        }
        let mut p = PermArgs { out_dims: [1; 6], src_strides: [0; 6], nd: nd as i32 };
        for k in 0..nd {
            p.out_dims[k] = dims[perm[k]] as i64;
            p.src_strides[k] = strides[perm[k]];
        }
        let n: usize = dims.iter().product();
        let e = Elem::unit(unit)?;
        kernels::PERMUTE.launch(self, (self.grid_for(n), 256, 0), Dev::new(out.ptr(), e), Dev::new(x.ptr(), e), p, n as i64)?;
        Ok(out)
    }

    /// [`moss_core::backend::Backend::narrow`]: a strided copy.
    pub(crate) fn narrow_copy(&self, x: &CudaTensor, dim: usize, start: usize, len: usize) -> Result<CudaTensor> {
        ensure!(dim < x.shape.len() && start + len <= x.shape[dim], "narrow {dim}:{start}+{len} of {:?}", x.shape);
        let outer: usize = x.shape[..dim].iter().product();
        let inner: usize = x.shape[dim + 1..].iter().product();
        let mut shape = x.shape.clone();
        shape[dim] = len;
        let out = self.alloc(x.dtype, &shape)?;
        let w = len * inner;
        self.copy2d(&out, x, outer, w, x.shape[dim] * inner, start * inner, w, 0)?;
        Ok(out)
    }
}

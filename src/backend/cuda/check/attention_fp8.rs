//! Gates of the fp8 path's attention output ([`DitOps::attention_packed_quantized`], the o projection's
//! input at `--precision fp8`): on Hopper the flash kernel's amax parts (each output row's largest
//! |value| in each head, as stored) bit for bit against its own output's, and the codes and scales
//! quantized from them (`moss_quantize_fp8_parts`) bit for bit against `moss_quantize_fp8` of
//! `attention_packed`'s output; each with a planted control. Other GPUs run `quantize_rows` of the
//! output there (gated as `fp8 quantize`).

use super::fp8::{mismatches, parts_mismatch};
use super::gates::*;
use crate::backend::cuda::dit::FlashKernel;
use crate::backend::cuda::ops::{CudaTensor, DType};
use crate::backend::ops::DitOps;
use crate::backend::Backend;
use anyhow::Result;

/// The gate, in table order.
pub const GATES: &[(&str, GateFn)] = &[("dit attention_packed_quantized", gate_attention_fp8)];

fn gate_attention_fp8(cx: &mut Cx) -> Result<()> {
    use dit::*;
    if cx.dtype != DType::BF16 || !cx.cuda.has_sm90a() {
        return Ok(());
    }
    let (n, scale) = (TOKENS, 1.0 / (HEAD_DIM as f64).sqrt());
    let (_, qkv) = cx.input(&[n, 3 * DIM], 1.0)?;
    let cu = cx.cuda.clone();
    let spec = cu.flash_kernel();
    let s = format!("{n}x{HEADS}x{HEAD_DIM} (fused qkv)");
    let run = |name: &'static str| -> Result<(CudaTensor, CudaTensor)> {
        let out = cu.alloc(DType::BF16, &[n, DIM])?;
        let parts = cu.alloc(DType::F32, &[n, HEADS])?;
        let (p, ld, es) = (qkv.ptr(), 3 * DIM, 2u64);
        let k = FlashKernel { name, ..*spec };
        cu.flash_attention_raw(&k, (p, ld), (p + DIM as u64 * es, ld), (p + 2 * DIM as u64 * es, ld), (out.ptr(), DIM), n, HEADS, scale, Some(parts.ptr()))?;
        Ok((out, parts))
    };
    for (kind, name, what) in [
        (Kind::Gate, spec.name, "attention amax parts (bit-exact to its output)"),
        (Kind::Control, "moss_dit_flash_attention_ws_amax_control", "attention amax parts, the quad's reduction left out"),
    ] {
        let (error, note) = parts_mismatch(cx, &run(name), HEAD_DIM);
        cx.judge_value(what, &s, kind, EXACT, &note, error);
    }
    let want = cu.quantize_fp8_with(&cu.attention_packed(&qkv, HEADS, scale)?, "moss_quantize_fp8")?;
    cu.sync()?;
    let want = (cu.download(&want.0)?, cu.download(&want.1)?);
    for (kind, kernel, what) in [
        (Kind::Gate, "moss_quantize_fp8_parts", "attention_packed_quantized (codes + scales, bit-exact)"),
        (Kind::Control, "moss_ctl_quantize_fp8_parts_last", "attention_packed_quantized, the last head's amax ignored"),
    ] {
        let out = cu.attention_packed_quantized_with(&qkv, HEADS, scale, spec, kernel);
        let (error, note) = match mismatches(&cu, out, &want) {
            Ok((c, sc)) => ((c + sc) as f64 / (n * DIM + n) as f64, format!("{c} of {} codes, {sc} of {n} scales differ", n * DIM)),
            Err(e) => (f64::NAN, format!("[error: {e:#}]")),
        };
        cx.judge_value(what, &s, kind, EXACT, &note, error);
    }
    Ok(())
}

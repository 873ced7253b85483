//! Which kernel each op runs on this device: decided from the compute capability (through
//! whether the Hopper-only `cuda/*/sm90a` image is loaded), the precision and the shape, and
//! printed by `moss check --device cuda`.
//!
//! Two families: the Hopper kernels (`sm_90a` machine code: wgmma, TMA, thread-block clusters;
//! loaded only on compute capability 9.0) and the portable ones (mma.sync; every GPU from sm_80).
//! The one override, `MOSS_KERNELS`, forces the portable family on a Hopper GPU so that what an
//! A100 or an RTX card runs can be gated on an H200. It is read once per process; any value but
//! `portable` (or `auto`, the default) is an error.

use crate::launch::DIT_SITU_FP8_MAX_F;
use anyhow::{bail, Result};
use std::sync::OnceLock;

/// The kernel family the override asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// The fastest kernels this device has (Hopper ones on compute capability 9.0).
    Auto,
    /// The portable kernels only, whatever the device.
    Portable,
}

/// Parse a `MOSS_KERNELS` value (`None`: unset).
pub fn parse_family(v: Option<&str>) -> Result<Family> {
    match v {
        None | Some("") | Some("auto") => Ok(Family::Auto),
        Some("portable") => Ok(Family::Portable),
        Some(other) => bail!("MOSS_KERNELS={other}: expected `auto` or `portable`"),
    }
}

/// `MOSS_KERNELS`, read once per process.
pub fn family() -> Result<Family> {
    static F: OnceLock<std::result::Result<Family, String>> = OnceLock::new();
    F.get_or_init(|| parse_family(std::env::var("MOSS_KERNELS").ok().as_deref()).map_err(|e| e.to_string())).clone().map_err(|e| anyhow::anyhow!(e))
}

/// The FP8 product of `linear_fp8` (after `moss_quantize_fp8_*` quantized the activation rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Gemm {
    /// cuBLASLt applies s_w[n] · s_x[r] itself (outer-vector scaling of cuBLAS 12.9+: Hopper,
    /// Blackwell) and rounds once into bf16.
    OuterVec,
    /// cuBLASLt with unit scales into an fp32 scratch, then `moss_fp8_scale_rows_*` multiplies by
    /// s_x[r] · s_w[n] and rounds once (where cuBLASLt does not run outer-vector scales: Ada; and
    /// fp32 activations everywhere).
    UnitThenScale,
}

/// The oldest compute capability with FP8 tensor cores (Ada).
pub const FP8_MIN_CC: (i32, i32) = (8, 9);

/// Why a GPU of compute capability `cc` cannot run the fp8 linears (`None`: it can).
pub fn fp8_refusal(cc: (i32, i32)) -> Option<String> {
    (cc < FP8_MIN_CC).then(|| format!("fp8 needs compute capability 8.9 or newer; this GPU is {}.{}", cc.0, cc.1))
}

/// The oldest compute capability with int8 tensor cores that cuBLASLt's IMMA runs in plain
/// row/column-major layouts (Ampere).
pub const INT8_MIN_CC: (i32, i32) = (8, 0);

/// Why a GPU of compute capability `cc` cannot run the int8 linears (`None`: it can).
pub fn int8_refusal(cc: (i32, i32)) -> Option<String> {
    (cc < INT8_MIN_CC).then(|| format!("int8 needs compute capability 8.0 or newer; this GPU is {}.{}", cc.0, cc.1))
}

/// The FP8 product on a device of compute capability `cc`: outer-vector scales where cuBLASLt
/// runs them right (`outer_vec_runs`: a small probe product on the device, checked against its
/// exact result; asked only from 8.9 on), else unit scales and our scaling kernel; refused below 8.9.
pub fn pick_fp8_gemm(cc: (i32, i32), outer_vec_runs: impl FnOnce() -> bool) -> Result<Fp8Gemm> {
    if let Some(why) = fp8_refusal(cc) {
        bail!(why);
    }
    Ok(if outer_vec_runs() { Fp8Gemm::OuterVec } else { Fp8Gemm::UnitThenScale })
}

/// Whether `situ_glu_fp8` (the ffn's hidden quantized per row, `--precision fp8`) runs the fused
/// kernel at width `f` (`cuda/dit/situ_fp8.cu`: one block a row, held in registers: `f` a
/// multiple of 8 up to [`DIT_SITU_FP8_MAX_F`], the DiT's 8192); otherwise `situ_glu` then
/// `moss_quantize_fp8`.
pub fn situ_fp8_fused(f: usize) -> bool {
    f > 0 && f.is_multiple_of(8) && f <= DIT_SITU_FP8_MAX_F
}

/// One op and the kernel it runs here (and under which condition, when the shape decides).
pub struct Choice {
    pub op: &'static str,
    pub kernel: String,
}

/// The kernels each op uses on a device: `hopper` when the `cuda/*/sm90a` image is loaded (compute
/// capability 9.0, not forced portable), `smem_optin` the device's opt-in shared memory per block.
pub fn choices(hopper: bool, smem_optin: usize) -> Vec<Choice> {
    let c = |op, kernel: &str| Choice { op, kernel: kernel.to_string() };
    let fits = |bytes: usize| smem_optin >= bytes;
    let dit_flash = crate::dit::pick_flash(hopper);
    let situ = crate::dit::SITU_KERNEL;
    let mut v = vec![
        c("dit attention (bf16, head dim 128)", dit_flash.name),
        c("dit attention (fp32 / other head dims)", "cuBLASLt Q·Kᵀ, moss_softmax_*, cuBLASLt P·V"),
        c("dit situ_glu", "moss_situ_fast_bf16 (bf16), moss_situ_f32 (fp32)"),
        c(
            "dit ffn up/gate + situ_glu (bf16, K%64, F%128)",
            &if hopper {
                format!("{situ} (TMA + wgmma, SiTU in the epilogue, persistent; other shapes, fp32: cuBLASLt + situ_glu)")
            } else {
                "cuBLASLt linear, then moss_situ_fast_bf16 / moss_situ_f32".to_string()
            },
        ),
        c(
            "lora merge (at load)",
            "moss_lora_lowrank_*, moss_lora_loha_*, moss_lora_kron_* (fp32, the host merge's operation order); bf16 factors widened by moss_cast_bf16_f32",
        ),
        c("fp8 quantize (per row)", "moss_quantize_fp8_bf16 / _f32 (IEEE divisions, e4m3 round-to-nearest, saturating)"),
        c("fp8 activations of the dit's norms", "moss_rms_mod_fp8_*, moss_gres_mod_fp8_* (the norm and its quantization in one kernel)"),
        c("fp8 activation of the dit's situ_glu", "moss_situ_fast_fp8_bf16 / moss_situ_fp8_f32 (F % 8 = 0, F <= 8192; else moss_situ_* + moss_quantize_fp8_*)"),
    ];
    v.extend(crate::encoder::kernel_choices(hopper, smem_optin));
    v.extend(crate::vae::kernel_choices(fits));
    v
}

/// Print which kernel each op uses on `cuda` (`moss check --device cuda`).
pub fn print(cuda: &crate::ops::Cuda) {
    use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as OPTIN;
    let optin = cuda.gpu().ctx.attribute(OPTIN).map(|v| v as usize).unwrap_or(0);
    let forced = matches!(family(), Ok(Family::Portable));
    let (cc0, cc1) = cuda.gpu().compute_capability;
    println!(
        "kernels on sm_{cc0}{cc1} ({} kernels{}; {} KiB of shared memory a block):",
        if cuda.has_sm90a() { "Hopper sm_90a" } else { "portable" },
        if forced { ", forced by MOSS_KERNELS=portable" } else { "" },
        optin / 1024
    );
    for c in choices(cuda.has_sm90a(), optin) {
        println!("  {:<48} {}", c.op, c.kernel);
    }
    let fp8 = match cuda.fp8_gemm() {
        Ok(Fp8Gemm::OuterVec) => "cuBLASLt e4m3, outer-vector scales, bf16 out (fp32 activations: unit scales + moss_fp8_scale_rows_*)".to_string(),
        Ok(Fp8Gemm::UnitThenScale) => "cuBLASLt e4m3 with unit scales into fp32, moss_fp8_scale_rows_*".to_string(),
        Err(e) => format!("refused: {e:#}"),
    };
    println!("  {:<48} {fp8}", "linear_fp8 (e4m3 product, row-wise scales)");
    let int8 = match int8_refusal(cuda.gpu().compute_capability) {
        None => "moss_quantize_int8[_rot]_*, cuBLASLt IMMA (int32 out), moss_int8_scale_rows_* (the same on every family)".to_string(),
        Some(why) => format!("refused: {why}"),
    };
    println!("  {:<48} {int8}", "linear_int8 (int8 product, row-wise scales)");
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn fp8_paths_by_device() {
        let e = pick_fp8_gemm((8, 6), || panic!("no probe below 8.9")).unwrap_err().to_string();
        assert_eq!(e, "fp8 needs compute capability 8.9 or newer; this GPU is 8.6");
        assert!(pick_fp8_gemm((8, 0), || true).is_err());
        assert_eq!(pick_fp8_gemm((8, 9), || false).unwrap(), Fp8Gemm::UnitThenScale);
        assert_eq!(pick_fp8_gemm((9, 0), || true).unwrap(), Fp8Gemm::OuterVec);
        assert_eq!(pick_fp8_gemm((12, 0), || false).unwrap(), Fp8Gemm::UnitThenScale);
        assert!(fp8_refusal((8, 9)).is_none() && fp8_refusal((10, 0)).is_none());
        assert_eq!(int8_refusal((7, 5)).unwrap(), "int8 needs compute capability 8.0 or newer; this GPU is 7.5");
        assert!(int8_refusal((8, 0)).is_none() && int8_refusal((8, 6)).is_none() && int8_refusal((9, 0)).is_none());
    }

    #[test]
    fn situ_fp8_fuses_the_dits_width_only_where_a_block_holds_the_row() {
        assert!(situ_fp8_fused(8192) && situ_fp8_fused(8) && situ_fp8_fused(264));
        assert!(!situ_fp8_fused(8200) && !situ_fp8_fused(8196) && !situ_fp8_fused(100) && !situ_fp8_fused(0));
        assert_eq!(DIT_SITU_FP8_MAX_F, 8192);
    }

    #[test]
    fn override_values() {
        assert_eq!(parse_family(None).unwrap(), Family::Auto);
        assert_eq!(parse_family(Some("auto")).unwrap(), Family::Auto);
        assert_eq!(parse_family(Some("portable")).unwrap(), Family::Portable);
        assert!(parse_family(Some("v1")).is_err());
        assert!(parse_family(Some("Portable")).is_err());
    }
}

//! Which kernel each op runs on this device: decided from the compute capability (through
//! whether the Hopper-only `cuda/sm90a` image is loaded), the precision and the shape, and
//! printed by `moss check --device cuda`.
//!
//! Two families: the Hopper kernels (`sm_90a` machine code: wgmma, TMA, thread-block clusters;
//! loaded only on compute capability 9.0) and the portable ones (mma.sync; every GPU from sm_80).
//! The one override, `MOSS_KERNELS`, forces the portable family on a Hopper GPU so that what an
//! A100 or an RTX card runs can be gated on an H200. It is read once per process; any value but
//! `portable` (or `auto`, the default) is an error.

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
    F.get_or_init(|| parse_family(std::env::var("MOSS_KERNELS").ok().as_deref()).map_err(|e| e.to_string()))
        .clone()
        .map_err(|e| anyhow::anyhow!(e))
}

/// One op and the kernel it runs here (and under which condition, when the shape decides).
pub struct Choice {
    pub op: &'static str,
    pub kernel: String,
}

/// The kernels each op uses on a device: `hopper` when the `cuda/sm90a` image is loaded (compute
/// capability 9.0, not forced portable), `smem_optin` the device's opt-in shared memory per block.
pub fn choices(hopper: bool, smem_optin: usize) -> Vec<Choice> {
    let c = |op, kernel: &str| Choice { op, kernel: kernel.to_string() };
    let fits = |bytes: usize| smem_optin >= bytes;
    let dit_flash = crate::backend::cuda::dit::pick_flash(hopper);
    let mut v = vec![
        c("dit attention (bf16, head dim 128)", dit_flash.name),
        c("dit attention (fp32 / other head dims)", "cuBLASLt Q·Kᵀ, moss_softmax_*, cuBLASLt P·V"),
        c("dit situ_glu", "moss_situ_fast_bf16 (bf16), moss_situ_f32 (fp32)"),
        c("lora merge (at load)", "moss_lora_lowrank_*, moss_lora_loha_*, moss_lora_kron_* (fp32, the host merge's operation order); bf16 factors widened by moss_cast_bf16_f32"),
    ];
    v.extend(crate::backend::cuda::encoder::kernel_choices(hopper, smem_optin));
    v.extend(crate::backend::cuda::vae::kernel_choices(fits));
    v
}

/// Print which kernel each op uses on `cuda` (`moss check --device cuda`).
pub fn print(cuda: &crate::backend::cuda::ops::Cuda) {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn override_values() {
        assert_eq!(parse_family(None).unwrap(), Family::Auto);
        assert_eq!(parse_family(Some("auto")).unwrap(), Family::Auto);
        assert_eq!(parse_family(Some("portable")).unwrap(), Family::Portable);
        assert!(parse_family(Some("v1")).is_err());
        assert!(parse_family(Some("Portable")).is_err());
    }
}

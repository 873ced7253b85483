//! The kernel contract: for every kernel and every SM the fatbins target, the compiler's own
//! report (registers, spills, static shared memory; `-Xptxas -v`, parsed by build.rs into
//! `OUT_DIR/kernel_resources.tsv`), and the dynamic shared memory of the launch configurations
//! the selector uses, against each SM's limits. The test below runs wherever the kernels are
//! built (CI builds them with nvcc), so a kernel that cannot launch on a GPU the fatbin targets
//! is caught before a user meets it.

/// The compiler's report (empty in a build without kernels).
#[cfg(moss_kernels)]
pub const RESOURCES: &str = include_str!(concat!(env!("OUT_DIR"), "/kernel_resources.tsv"));
#[cfg(not(moss_kernels))]
pub const RESOURCES: &str = "";

/// One kernel on one SM, as the compiler reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub kernel: String,
    /// `80`, `86`, ..., `90a`.
    pub sm: String,
    pub registers: usize,
    pub spill_bytes: usize,
    pub static_smem: usize,
}

/// The records of [`RESOURCES`] (or of another report in its format).
pub fn records(tsv: &str) -> Vec<Record> {
    tsv.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let n = |i: usize| f.get(i).and_then(|v| v.parse::<usize>().ok());
            Some(Record { kernel: f.first()?.to_string(), sm: f.get(1)?.to_string(), registers: n(2)?, spill_bytes: n(4)? + n(5)?, static_smem: n(6)? })
        })
        .collect()
}

/// Shared memory a block may opt into on `sm` (bytes): 227 KiB on sm_90/100, 163 KiB on sm_80,
/// 99 KiB on sm_86/89/120/121.
pub fn smem_limit(sm: &str) -> usize {
    match sm.trim_end_matches('a') {
        "90" | "100" => 227 * 1024,
        "80" => 163 * 1024,
        _ => 99 * 1024,
    }
}

/// Where the selector may pick a launch configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Picked {
    /// On every GPU: it must fit every SM.
    Everywhere,
    /// Only with the Hopper image loaded (sm_90a).
    Hopper,
    /// Only where the device's opt-in shared memory holds its dynamic shared memory (a runtime
    /// check in the selector; it counts dynamic bytes only, so the kernel has no static ones).
    Checked,
}

/// The launch configurations with dynamic shared memory the selector uses: (kernel, bytes, where).
pub fn launch_configs() -> Vec<(String, usize, Picked)> {
    use super::{dit, encoder, launch, vae};
    let mut v: Vec<(String, usize, Picked)> =
        dit::FLASH_KERNELS.iter().map(|k| (k.name.to_string(), k.smem as usize, if k.sm90a { Picked::Hopper } else { Picked::Everywhere })).collect();
    v.push((dit::SITU_KERNEL.to_string(), launch::DIT_SITU_EPI_SMEM, Picked::Hopper));
    v.push((dit::SITU_FP8_KERNEL.to_string(), launch::DIT_SITU_EPI_SMEM, Picked::Hopper));
    v.push((dit::QKV_KERNEL.to_string(), launch::DIT_SITU_GEMM_SMEM, Picked::Hopper));
    v.push((dit::QKV_FP8_KERNEL.to_string(), launch::DIT_SITU_GEMM_SMEM, Picked::Hopper));
    v.push(("moss_enc_fattn_bf16".into(), encoder::FLASH_SMEM as usize, Picked::Everywhere));
    v.push(("moss_enc_fattn_wg_bf16".into(), encoder::FLASH_WG_SMEM as usize, Picked::Hopper));
    v.push(("moss_enc_gdr_tma_bf16".into(), encoder::delta_rule::GDR_TMA_BYTES as usize, Picked::Hopper));
    for tc in [true, false] {
        v.extend(encoder::delta_rule::gdr_portable_smem(tc).iter().map(|&(k, b)| (k.to_string(), b, Picked::Checked)));
        // what the selector takes where those do not fit: must fit every GPU (prep included)
        v.extend(encoder::delta_rule_compact::gdr_compact_smem(tc).iter().map(|&(k, b)| (k.to_string(), b, Picked::Everywhere)));
    }
    for bm in [96, 128] {
        for k in [1, 3] {
            v.push((format!("moss_vae_conv16_b{bm}_k{k}"), vae::conv::f16_smem_bytes(bm, k), Picked::Checked));
            v.push((format!("moss_vae_conv_halo_b{bm}_k{k}"), vae::conv::halo_smem_bytes(bm, k), Picked::Checked));
        }
    }
    // The split attention's products run the 1x1 halo kernel without a check: it fits everywhere.
    v.push(("moss_vae_conv_halo_b128_k1".into(), vae::conv::halo_smem_bytes(128, 1), Picked::Everywhere));
    v.push(("moss_vae_flash_d384".into(), vae::FLASH_SMEM_BYTES, Picked::Checked));
    v.push(("moss_vae_attn16_d384".into(), vae::attention_fp16::SMEM16_BYTES, Picked::Checked));
    v
}

/// What breaks the contract in `recs` for the launch configurations `configs` (empty: none).
pub fn violations(recs: &[Record], configs: &[(String, usize, Picked)]) -> Vec<String> {
    let mut bad = vec![];
    for r in recs {
        if r.registers > 255 || r.static_smem > 48 * 1024 || r.spill_bytes > 256 {
            bad.push(format!("{} on sm_{}: {} registers, {} bytes spilled, {} bytes static smem", r.kernel, r.sm, r.registers, r.spill_bytes, r.static_smem));
        }
    }
    for (k, dynamic, picked) in configs {
        let on: Vec<&Record> = recs.iter().filter(|r| &r.kernel == k).collect();
        if on.is_empty() {
            bad.push(format!("launch configuration of `{k}`: no such kernel in the report"));
        }
        for r in on {
            let total = r.static_smem + dynamic;
            let fits = total <= smem_limit(&r.sm);
            match picked {
                Picked::Everywhere | Picked::Hopper if !fits => {
                    bad.push(format!("{k} on sm_{}: {total} bytes of shared memory > {} ({picked:?})", r.sm, smem_limit(&r.sm)))
                }
                Picked::Hopper if r.sm != "90a" => bad.push(format!("{k} (Hopper only) compiled for sm_{}", r.sm)),
                Picked::Checked if r.static_smem > 0 => {
                    bad.push(format!("{k}: {} bytes of static smem, which the selector's dynamic-only check does not count", r.static_smem))
                }
                _ => {}
            }
        }
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_report_format() {
        let r = records("kernel\tsm\tregisters\tstack\tspill_stores\tspill_loads\tstatic_smem\nk\t86\t40\t8\t4\t4\t384\n");
        assert_eq!(r, vec![Record { kernel: "k".into(), sm: "86".into(), registers: 40, spill_bytes: 8, static_smem: 384 }]);
        assert_eq!(smem_limit("90a"), 232448);
        assert_eq!(smem_limit("120"), 101376);
    }

    /// Planted: the portable delta rule's 182 KiB state pass picked everywhere must be rejected
    /// on sm_86 (99 KiB) and sm_80 (163 KiB), accepted on sm_90; a Hopper kernel on sm_86 too.
    #[test]
    fn rejects_what_does_not_fit() {
        let rec = |k: &str, sm: &str, smem| Record { kernel: k.into(), sm: sm.into(), registers: 128, spill_bytes: 0, static_smem: smem };
        let recs = [rec("seq", "86", 0), rec("seq", "80", 0), rec("seq", "90", 0), rec("ws", "86", 0), rec("chk", "86", 16)];
        let configs = [("seq".to_string(), 186368, Picked::Everywhere), ("ws".to_string(), 1024, Picked::Hopper), ("chk".to_string(), 1024, Picked::Checked)];
        let bad = violations(&recs, &configs);
        assert_eq!(bad.len(), 4, "{bad:#?}");
        assert!(violations(&recs[2..3], &configs[..1]).is_empty());
        assert!(!violations(&[rec("big", "90", 64 * 1024)], &[]).is_empty(), "64 KiB of static smem");
    }

    /// Every kernel of every SM within the limits; every launch configuration fits where the
    /// selector may pick it (the report exists only in a build with the kernels: CI's).
    #[test]
    fn kernels_fit_every_sm() {
        if RESOURCES.is_empty() {
            eprintln!("kernel contract: built without kernels (no nvcc), nothing to check");
            return;
        }
        let recs = records(RESOURCES);
        assert!(!recs.is_empty(), "kernel_resources.tsv has no rows");
        let bad = violations(&recs, &launch_configs());
        assert!(bad.is_empty(), "kernel contract broken:\n  {}", bad.join("\n  "));
    }
}

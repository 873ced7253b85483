//! Which state pass + output the chunk-parallel delta rule runs after its prep off Hopper, and the
//! one that fits 96 KiB of shared memory a block (`cuda/encoder/delta_rule_compact.cuh`):
//! `gdr_seq_compact` + `gdr_out_compact`, what GPUs take whose opt-in shared memory a block does
//! not hold the wide `gdr_seq_tc` / `gdr_seq` (182 / 177 KiB) and `gdr_out_tc` / `gdr_out_f32`
//! (104 / 101 KiB): the RTX 30/40/50 cards (sm_86/89/120/121, 99 KiB) and the A100 (sm_80, 163
//! KiB). Both preps (`delta_rule_prep_bf16` 92.5 KiB, `gdr_prep_f32` 84 KiB) fit everywhere.

use super::delta_rule::{gdr_portable_smem, GDR_OUT_COLS, GDR_OUT_FLOATS, GDR_OUT_TC_FLOATS, GDR_SEQ_COLS, GDR_SEQ_FLOATS, GDR_SEQ_TC_FLOATS};
use crate::kernels::{self, Dev, Family};
use crate::ops::Cuda;

/// Shared memory a block every kernel of the compact path stays within (dynamic; they have no
/// static): 99 KiB GPUs with 3 KiB to spare.
pub const COMPACT_BUDGET: usize = 96 * 1024;
/// Value columns a block of `gdr_seq_compact` and `gdr_out_compact` (cuda/encoder/launch.h).
pub(super) const COMPACT_COLS: usize = crate::launch::ENC_GDR_COMPACT_COLS;
/// `gdr_seq_compact`: a ring of 3 quarter tiles [64][72] of Wk / Kd, S [128][40], U [64][40] (84 KiB).
pub(crate) const SEQ_COMPACT_FLOATS: usize = crate::launch::ENC_GDR_SEQ_COMPACT_FLOATS;
/// `gdr_out_compact`: Q̂ [64][132], S0 [128][40], Wqk [64][68], U [64][40], e^γ (80.25 KiB).
pub(crate) const OUT_COMPACT_FLOATS: usize = crate::launch::ENC_GDR_OUT_COMPACT_FLOATS;

/// The compact path's kernels (the prep, the state pass, the output) and their dynamic shared
/// memory in bytes, bf16 (`tc`) or fp32. The kernel contract records them as picked on every GPU.
pub(crate) fn gdr_compact_smem(tc: bool) -> [(&'static str, usize); 3] {
    let prep = gdr_portable_smem(tc)[0]; // the wide path's prep
    let (seq, out) =
        if tc { ("moss_enc_gdr_seq_compact_tc", "moss_enc_gdr_out_compact_tc_bf16") } else { ("moss_enc_gdr_seq_compact_f32", "moss_enc_gdr_out_compact_f32") };
    [prep, (seq, SEQ_COMPACT_FLOATS * 4), (out, OUT_COMPACT_FLOATS * 4)]
}

/// The state pass + output after the prep, where the Hopper kernel does not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StatePass {
    /// `gdr_seq_tc` + `gdr_out_tc_bf16` (bf16), `gdr_seq` + `gdr_out_f32` (fp32): 64 output
    /// columns a block, two chunks' tiles in flight (up to 182 KiB).
    Wide,
    /// `gdr_seq_compact_*` + `gdr_out_compact_*`: 32 output columns a block, quarter tiles (≤ 96 KiB).
    Compact,
}

/// The state pass a device offering `smem_optin` bytes a block takes: the wide kernels where they
/// fit (H100/H200 forced portable, B200), else the compact ones (A100, RTX 30/40/50); None where
/// neither fits (no GPU the fatbin targets: the sequential kernel is tried and says why it
/// cannot run).
pub(crate) fn pick_state_pass(tc: bool, smem_optin: usize) -> Option<StatePass> {
    let fits = |k: &[(&str, usize)]| k.iter().all(|&(_, b)| b <= smem_optin);
    if fits(&gdr_portable_smem(tc)) {
        Some(StatePass::Wide)
    } else if fits(&gdr_compact_smem(tc)) {
        Some(StatePass::Compact)
    } else {
        None
    }
}

/// The state pass's kernels' parameter list, and the output's.
pub(super) type SeqKernel = Family<fn(Dev, Dev, Dev, Dev, Dev, Dev, i32, i32, i32)>;
pub(super) type OutKernel = Family<fn(Dev, Dev, Dev, Dev, Dev, Dev, i32, i32, i32, i32, i32, i64, i64)>;

/// How a state pass is launched: its kernels, value columns a block, dynamic shared memory
/// (bytes).
pub(super) struct StateLaunch {
    pub seq: &'static SeqKernel,
    pub seq_cols: usize,
    pub seq_bytes: u32,
    pub out: &'static OutKernel,
    pub out_cols: usize,
    pub out_bytes: u32,
}

pub(super) fn state_launch(pass: StatePass, tc: bool) -> StateLaunch {
    let b = |floats: usize| (floats * 4) as u32;
    match pass {
        StatePass::Wide => StateLaunch {
            seq: if tc { &kernels::ENC_GDR_SEQ_TC } else { &kernels::ENC_GDR_SEQ },
            seq_cols: GDR_SEQ_COLS,
            seq_bytes: b(if tc { GDR_SEQ_TC_FLOATS } else { GDR_SEQ_FLOATS }),
            out: if tc { &kernels::ENC_GDR_OUT_TC } else { &kernels::ENC_GDR_OUT },
            out_cols: GDR_OUT_COLS,
            out_bytes: b(if tc { GDR_OUT_TC_FLOATS } else { GDR_OUT_FLOATS }),
        },
        StatePass::Compact => StateLaunch {
            seq: if tc { &kernels::ENC_GDR_SEQ_COMPACT_TC } else { &kernels::ENC_GDR_SEQ_COMPACT },
            seq_cols: COMPACT_COLS,
            seq_bytes: b(SEQ_COMPACT_FLOATS),
            out: if tc { &kernels::ENC_GDR_OUT_COMPACT_TC } else { &kernels::ENC_GDR_OUT_COMPACT },
            out_cols: COMPACT_COLS,
            out_bytes: b(OUT_COMPACT_FLOATS),
        },
    }
}

impl Cuda {
    /// The device's opt-in shared memory a block (bytes; 0 if the driver does not say).
    pub(crate) fn smem_optin(&self) -> usize {
        use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as OPTIN;
        self.gpu().ctx.attribute(OPTIN).map(|v| v as usize).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The opt-in shared memory a block of each GPU generation the fatbin targets.
    const SM80: usize = 163 * 1024;
    const SM86: usize = 99 * 1024;
    const SM90: usize = 227 * 1024;

    #[test]
    fn compact_kernels_stay_within_the_budget() {
        for tc in [true, false] {
            for (k, b) in gdr_compact_smem(tc) {
                assert!(b <= COMPACT_BUDGET, "{k}: {b} bytes > {COMPACT_BUDGET}");
            }
        }
        // the layouts of cuda/encoder/delta_rule_compact.cuh, counted by hand: 84 KiB and 80.25 KiB
        assert_eq!(SEQ_COMPACT_FLOATS * 4, 84 * 1024);
        assert_eq!(OUT_COMPACT_FLOATS * 4, 82176);
    }

    #[test]
    fn small_gpus_take_the_compact_pass() {
        for tc in [true, false] {
            assert_eq!(pick_state_pass(tc, SM86), Some(StatePass::Compact), "99 KiB, tc {tc}");
            assert_eq!(pick_state_pass(tc, SM80), Some(StatePass::Compact), "163 KiB, tc {tc}");
            assert_eq!(pick_state_pass(tc, SM90), Some(StatePass::Wide), "227 KiB, tc {tc}");
            assert_eq!(pick_state_pass(tc, 64 * 1024), None, "64 KiB, tc {tc}");
        }
    }

    /// The launches take the kernels whose shared memory the contract records
    /// ([`gdr_compact_smem`], `gdr_portable_smem`).
    #[test]
    fn launches_are_the_recorded_kernels() {
        use crate::kernels::Elem::{BF16, F32};
        let names = |l: &StateLaunch, tc: bool| {
            let t = if tc { BF16 } else { F32 };
            (l.seq.info.members[0].name, l.out.info.member(&[t, t, F32, F32, F32, F32]).unwrap())
        };
        for tc in [true, false] {
            let [_, seq, out] = gdr_compact_smem(tc);
            assert_eq!(names(&state_launch(StatePass::Compact, tc), tc), (seq.0, out.0));
            let [_, seq, out] = gdr_portable_smem(tc);
            assert_eq!(names(&state_launch(StatePass::Wide, tc), tc), (seq.0, out.0));
        }
        assert_eq!(state_launch(StatePass::Wide, false).out_cols, 64);
    }
}

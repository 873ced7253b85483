//! cuBLASLt algorithms pinned per product shape, where a device call measured one of the
//! heuristic's candidates clearly faster than its first choice (measured on the H200).
//!
//! A pin is looked up by compute capability and the product's shape in cuBLAS's column-major
//! terms (m = output features, n = rows, k), and names a whole [`AlgoConfig`]. The plan takes the
//! candidate with exactly that configuration when the heuristic offers it (so another cuBLAS
//! version or GPU falls back to the heuristic's first choice), never a timing: the choice, and so
//! the rounding, is the same in every run. The tuning mode that measured
//! the pins (timing every candidate) is in git history.

use super::DType;
use crate::blas::{AlgoConfig, Gemm};

/// One pinned product: bf16 A/B/D, W transposed (a `linear`), any leading dimensions.
pub struct Pin {
    pub cc: (i32, i32),
    pub m: u64,
    pub n: u64,
    pub k: u64,
    /// With the residual `C` in the epilogue (`Blas::gemm_acc`).
    pub accumulate: bool,
    pub config: AlgoConfig,
}

const fn cfg(tile: u32, custom: u32, cluster: u32) -> AlgoConfig {
    AlgoConfig { id: 66, tile, stages: 35, splitk: 1, reduction: 0, swizzle: 0, custom, inner: 0, cluster }
}

const H200: (i32, i32) = (9, 0);

/// The table: the text encoder's products at 4096 and 128 tokens on the H200 (cuBLASLt of CUDA
/// 13.0), where the tuning mode timed the candidate faster than the
/// heuristic's first choice in each of three processes (median of 5 round-robin rounds; git
/// history: d0c23f2; the fraction is the time against the first choice's).
pub const PINS: &[Pin] = &[
    // q|k|v at 4096 tokens: 0.943 (0.4454 against 0.4724 ms)
    Pin { cc: H200, m: 10240, n: 4096, k: 4096, accumulate: false, config: cfg(197, 2, 5) },
    // DeltaNet in_proj (qkvz|ba) at 4096 tokens: 0.980 (0.5127 against 0.5229 ms; one process even)
    Pin { cc: H200, m: 12352, n: 4096, k: 4096, accumulate: false, config: cfg(184, 2, 5) },
    // o_proj / out_proj + residual at 128 tokens: 0.854 (0.0134 against 0.0157 ms)
    Pin { cc: H200, m: 4096, n: 128, k: 4096, accumulate: true, config: cfg(27, 2, 7) },
    // gate|up at 128 tokens: 0.979 (0.0554 against 0.0566 ms)
    Pin { cc: H200, m: 24576, n: 128, k: 4096, accumulate: false, config: cfg(208, 3, 5) },
    // q|k|v at 128 tokens: 0.974 (0.0259 against 0.0266 ms)
    Pin { cc: H200, m: 10240, n: 128, k: 4096, accumulate: false, config: cfg(165, 0, 4) },
];

/// The pinned configuration for `g` on a device of compute capability `cc`, if any.
pub fn pin(cc: (i32, i32), g: &Gemm) -> Option<AlgoConfig> {
    find(PINS, cc, g)
}

fn find(table: &[Pin], cc: (i32, i32), g: &Gemm) -> Option<AlgoConfig> {
    let linear = g.ab == DType::BF16 && g.d == DType::BF16 && g.transa && !g.transb && g.batch <= 1 && !g.bias && !g.tf32;
    if !linear {
        return None;
    }
    table.iter().find(|p| p.cc == cc && (p.m, p.n, p.k) == (g.m, g.n, g.k) && p.accumulate == g.accumulate).map(|p| p.config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(tile: u32) -> AlgoConfig {
        super::cfg(tile, 0, 0)
    }

    #[test]
    fn a_pin_matches_only_its_device_shape_and_epilogue() {
        let table = [Pin { cc: (9, 0), m: 24576, n: 4096, k: 4096, accumulate: false, config: cfg(7) }];
        let g = Gemm::plain(DType::BF16, DType::BF16, true, false, 24576, 4096, 4096, 4096, 4096, 24576);
        assert_eq!(find(&table, (9, 0), &g), Some(cfg(7)));
        assert_eq!(find(&table, (8, 0), &g), None, "another GPU");
        assert_eq!(find(&table, (9, 0), &Gemm { n: 128, ..g }), None, "another row count");
        assert_eq!(find(&table, (9, 0), &Gemm { accumulate: true, ..g }), None, "the residual epilogue");
        assert_eq!(find(&table, (9, 0), &Gemm { d: DType::F32, ..g }), None, "fp32 out");
        assert_eq!(find(&table, (9, 0), &Gemm { bias: true, ..g }), None, "a bias");
    }

    #[test]
    fn the_table_has_one_entry_per_product() {
        for (i, a) in PINS.iter().enumerate() {
            for b in &PINS[i + 1..] {
                assert!((a.cc, a.m, a.n, a.k, a.accumulate) != (b.cc, b.m, b.n, b.k, b.accumulate), "two pins for one product");
            }
        }
    }
}

//! The kernels' launch constants (threads, rows a block, shared memory), written once in
//! `cuda/*/launch.h`: the kernels read the headers, build.rs turns them into these constants
//! for the host code that launches the kernels (docs/DEVELOPERS.md, "Launch constants").
#![allow(unused_parens, non_snake_case, clippy::identity_op)]

include!(concat!(env!("OUT_DIR"), "/launch.rs"));

#[cfg(test)]
mod tests {
    /// The halo channel stride, an arithmetic expression (launch.h has no conditionals), is the
    /// smallest stride ≥ the halo that is 8 or 24 mod 32.
    #[test]
    fn halo_stride_is_the_smallest_bank_spread() {
        for hn in 0..4096 {
            let want = (hn..).find(|c| c % 32 == 8 || c % 32 == 24).unwrap();
            assert_eq!(super::VAE_HALO_CS(hn), want, "halo of {hn}");
        }
    }
}

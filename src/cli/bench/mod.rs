//! The hidden benchmark commands (`moss bench-dit`, `bench-encode`, `bench-vae`,
//! `bench-vae-encode`): one stage alone, timed with CUDA events, for bench/'s scripts;
//! `bench-compare`: two pictures' PSNR and SSIM.

pub mod args;
pub mod compare;
pub mod dit;
pub mod encoder;
pub mod vae;
pub mod vae_encode;

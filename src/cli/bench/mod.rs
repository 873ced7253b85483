//! The hidden benchmark commands (`moss bench-dit`, `bench-encode`, `bench-vae`): one stage alone,
//! timed with CUDA events, for bench/'s scripts.

pub mod dit;
pub mod encoder;
pub mod vae;

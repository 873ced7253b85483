//! The fused ops of each network, beyond the generic [`super::Backend`] set. Each trait has a
//! CPU twin in `backend/cpu/` and (with the CUDA issues) a kernel in `cuda/`.

pub mod dit;
pub mod encoder;
pub mod vae;
pub mod vae_encode;

pub use dit::DitOps;
pub use encoder::EncoderOps;
pub use vae::VaeOps;
pub use vae_encode::VaeEncodeOps;

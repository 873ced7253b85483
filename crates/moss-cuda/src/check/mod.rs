//! `moss check --device cuda`: every kernel of the default paths (and the fallbacks they take)
//! against the CPU backend, each with a planted control (a twin with a bug, from the check image)
//! that the same comparison must reject.

pub mod dit;
pub mod dit_ops;
pub mod encoder;
pub mod encoder_attention;
pub mod encoder_rows;
pub mod encoder_strided;
pub mod fp8;
pub mod fp8_act;
pub mod gates;
pub mod linear_qkv_norm_rope;
pub mod linear_situ_glu;
pub mod linear_situ_glu_fp8;
pub mod lora;
pub mod tensor;
pub mod vae;
pub mod vae_encode;

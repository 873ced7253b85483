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
pub mod int8;
pub mod linear_qkv_norm_rope;
pub mod linear_situ_glu;
pub mod linear_situ_glu_fp8;
pub mod lora;
pub mod quant;
pub mod tensor;
pub mod vae;
pub mod vae_encode;

use crate::kernels::{Family, Image};
use crate::ops::Cuda;

impl gates::Cx {
    /// The backend launching the planted twin `to` in place of `from` (the check image's; the
    /// types make sure they take the same arguments).
    pub fn planted<S>(&self, from: &'static Family<S>, to: &'static Family<S>) -> Cuda {
        self.cuda.with_image(Image::production().swap(from, to))
    }

    /// The backend launching, for every production family whose stem `pick` takes, its planted
    /// twin of the same name (`moss_ctl_X` of `moss_X`).
    pub fn twins(&self, pick: impl Fn(&str) -> bool) -> Cuda {
        self.cuda.with_image(Image::production().twins(pick))
    }
}

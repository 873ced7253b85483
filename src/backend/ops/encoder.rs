//! Fused ops of the encoder (see `crate::model::encoder`).

use crate::backend::Backend;

/// Ops the encoder needs beyond the generic set.
pub trait EncoderOps: Backend {}

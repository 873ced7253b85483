//! Fused ops of the vae (see `crate::model::vae`).

use crate::backend::Backend;

/// Ops the vae needs beyond the generic set.
pub trait VaeOps: Backend {}
